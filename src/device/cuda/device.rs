//! `CudaDevice`: the [`Device`] trait on a real GPU. The witness map, the four G1 MSMs
//! and B_G2 (beside B_G1, on the same scalars: its ones by batch addition, its others
//! by Pippenger on B_G1's sorted digits) run as kernels; the assembly stays on the CPU
//! (the pipeline's finish).
//!
//! Each worker owns one CUDA stream. Its pre-stage upload and its kernels are ordered
//! on that stream, so an upload made under mem overlaps the compute holder's kernels on
//! *its* stream, and the kernels wait for their own upload by stream order, no event or
//! device-wide sync needed. Calls made under mem (`alloc`, `upload`) never wait on other
//! streams: allocations are `cuMemAlloc`/`cuMemAllocAsync` or an arena slot, and
//! uploads are async copies. Frees happen only under compute (see `Device::free`): a
//! synchronous working set that would not fit is refused before its first piece, so no
//! partial allocation is freed under mem (`CudaDevice::alloc_buffers` says how).

use std::time::Instant;

use ark_bls12_381::G1Projective;
use cudarc::driver::{sys, CudaStream};

use super::context::{AllocKind, CudaError, DeviceBuffer, Gpu};
use super::g2::{DeviceG2Bases, G2Scratch};
use super::layout::{fr_as_dev, DevFr};
use super::msm::{self, DeviceBases, DeviceScalars, MsmResults, MsmWorkspace, ScalarsRef};
use super::staging::LentPinned;
use super::witness_map::witness_map;
use crate::audit::Audit;
use crate::device::{
    AllocSite, AllocStrategy, Device, DeviceBG2, DeviceError, FaultPlan, Footprint, G1Results,
    HostVec, MemInfo, PartitionInputs, ScalarClasses, Shape, Stage, WorkerId,
};
use crate::sync::{Arc, Mutex};
use crate::ProvingKey;

const FR_BYTES: u64 = 32;
const RESULTS: usize = 4;

impl From<CudaError> for DeviceError {
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::Oom { requested, free } => DeviceError::Oom { requested, free },
            CudaError::InvalidInput(m) => DeviceError::InvalidInput(m),
            CudaError::NoDriver | CudaError::NoDevice { .. } => {
                DeviceError::NoDevice(e.to_string())
            }
            other => DeviceError::Driver(other.to_string()),
        }
    }
}

fn kernel_err(stage: Stage) -> impl Fn(CudaError) -> DeviceError {
    move |e| match e {
        CudaError::Oom { requested, free } => DeviceError::Oom { requested, free },
        other => DeviceError::Kernel {
            stage,
            reason: other.to_string(),
        },
    }
}

/// Per-stream bookkeeping: who owns it, kernels not yet observed by a sync, and bytes
/// held (live sets, and stream-ordered frees not yet completed).
#[derive(Debug, Default)]
struct Book {
    owner: Option<WorkerId>,
    kernels_in_flight: usize,
    owned: u64,
    pending: u64,
}

/// One preallocated arena slot.
struct Slot {
    bufs: Buffers,
}

struct Buffers {
    a: DeviceBuffer<DevFr>,
    b: DeviceBuffer<DevFr>,
    c: DeviceBuffer<DevFr>,
    msm: MsmWorkspace,
    out: MsmResults,
    /// B_G2 beside B_G1: its ones' batch addition on B_G1's bitmap, and its others'
    /// point stages on B_G1's sorted digits.
    g2: G2Scratch,
}

impl Buffers {
    fn alloc(
        gpu: &Gpu,
        s: &Arc<CudaStream>,
        shape: &Shape,
        fp: Footprint,
        kind: AllocKind,
    ) -> Result<Self, CudaError> {
        Self::alloc_or_partial(gpu, s, shape, fp, kind).map_err(|(e, _)| e)
    }

    /// [`Buffers::alloc`]; an error also says whether pieces were already allocated
    /// (and freed again on the way out).
    fn alloc_or_partial(
        gpu: &Gpu,
        s: &Arc<CudaStream>,
        shape: &Shape,
        fp: Footprint,
        kind: AllocKind,
    ) -> Result<Self, (CudaError, bool)> {
        let n = shape.domain_size;
        let alloc = |len| gpu.alloc::<DevFr>(s, len, kind);
        let partial = |e| (e, true);
        let a = alloc(n).map_err(|e| (e, false))?;
        let (b, c) = (alloc(n).map_err(partial)?, alloc(n).map_err(partial)?);
        let max = n.max(shape.num_scalars);
        let msm = MsmWorkspace::with_windows_per_pass(gpu, s, max, windows_per_pass(fp), kind)
            .map_err(partial)?;
        let out = MsmResults::alloc(gpu, s, RESULTS, kind).map_err(partial)?;
        let g2 = G2Scratch::alloc_beside(gpu, s, shape.num_scalars, &msm, kind).map_err(partial)?;
        Ok(Buffers {
            a,
            b,
            c,
            msm,
            out,
            g2,
        })
    }

    fn free(self) -> Result<(), CudaError> {
        [
            self.a.free(),
            self.b.free(),
            self.c.free(),
            self.msm.free(),
            self.out.free(),
            self.g2.free(),
        ]
        .into_iter()
        .collect()
    }
}

fn windows_per_pass(fp: Footprint) -> Option<u32> {
    match fp {
        Footprint::Full => None,
        // The small-card footprint: one window's digits, sort and buckets at a time.
        Footprint::Chunked => Some(1),
    }
}

/// A worker's stream on a [`CudaDevice`].
pub struct CudaWorkerStream {
    id: usize,
    owner: WorkerId,
    stream: Arc<CudaStream>,
}

/// A working set: device buffers plus the prep's split of the scalars (host side).
pub struct CudaWorkingSet {
    bufs: Buffers,
    bytes: u64,
    arena: bool,
    split_all: Option<Arc<ScalarClasses>>,
    split_aux: Option<Arc<ScalarClasses>>,
    ran: [bool; RESULTS],
}

/// A proving key's G1 bases, and B_G2's G2 bases, resident on the device.
pub struct CudaKey {
    h: DeviceBases,
    l: DeviceBases,
    a: DeviceBases,
    b_g1: DeviceBases,
    /// b_g2_query[1..], aligned with the scalars (like B_G1's bases after the first).
    b_g2: DeviceG2Bases,
}

impl CudaKey {
    pub fn free(self) -> Result<(), CudaError> {
        [
            self.h.free(),
            self.l.free(),
            self.a.free(),
            self.b_g1.free(),
            self.b_g2.free(),
        ]
        .into_iter()
        .collect()
    }
}

/// The squeeze's unit: the ballast's allocation page.
const SQUEEZE_PAGE: u64 = 2 << 20;

/// One GPU as a pipeline device.
pub struct CudaDevice {
    gpu: Arc<Gpu>,
    strategy: AllocStrategy,
    faults: FaultPlan,
    audit: Option<Arc<Audit>>,
    books: Mutex<Vec<Book>>,
    arena: Mutex<Vec<Slot>>,
    /// VRAM held on purpose to squeeze the device (stress), freed on drop.
    ballast: Mutex<Vec<DeviceBuffer<u8>>>,
    /// Free VRAM after [`CudaDevice::mark_baseline`], for the leak check.
    baseline_free: Mutex<Option<u64>>,
    /// What the last [`CudaDevice::squeeze_for`] measured and left, for the report.
    squeeze: Mutex<Option<SqueezeLevel>>,
}

/// A squeeze as it happened: the footprints it was computed from, the free VRAM it
/// asked to leave, how far it had to raise that, the free VRAM it left, and what was
/// found to fit beside the key there (allocated, not predicted).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SqueezeLevel {
    pub measured: MeasuredFootprint,
    pub sets: f64,
    pub asked_free: u64,
    /// Bytes added to `asked_free` until the sets the squeeze promises fitted.
    pub raised: u64,
    pub free_after: u64,
    /// Whether one chunked set (the smallest fallback) fitted.
    pub chunked_fits: bool,
    /// Whether one full set more than the squeeze promises fitted (it should not).
    pub next_fits: bool,
}

/// What a key, 1, 2 and 3 full working sets held at once, and one chunked set really
/// take on a device: the drops in free memory when they are allocated, so allocation
/// granularity and pool rounding count. The pool maps memory in steps (32 MiB on the
/// H200), so one set's drop times k is not what k sets take: each k is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MeasuredFootprint {
    pub key: u64,
    /// `sets[i]`: the drop with i + 1 sets allocated at once.
    pub sets: [u64; 3],
    /// The drop with one chunked (fallback) set alone.
    pub chunked: u64,
}

impl MeasuredFootprint {
    /// The free memory `k` working sets need: the measured drop for whole k ≤ 3,
    /// linear between two measured counts, and the last step's growth beyond 3.
    pub fn sets_bytes(&self, k: f64) -> u64 {
        let k = k.max(0.0);
        let at = |i: usize| if i == 0 { 0 } else { self.sets[i - 1] };
        let lo = (k.floor() as usize).min(2);
        let step = at(lo + 1).saturating_sub(at(lo)) as f64;
        (at(lo) as f64 + (k - lo as f64) * step) as u64
    }
}

impl CudaDevice {
    pub fn new(ordinal: usize, strategy: AllocStrategy) -> Result<Self, DeviceError> {
        Self::build(ordinal, strategy, FaultPlan::none(), None)
    }

    pub fn build(
        ordinal: usize,
        strategy: AllocStrategy,
        faults: FaultPlan,
        audit: Option<Arc<Audit>>,
    ) -> Result<Self, DeviceError> {
        let d = Self {
            gpu: Arc::new(Gpu::new(ordinal)?),
            strategy,
            faults,
            audit,
            books: Mutex::new(Vec::new()),
            arena: Mutex::new(Vec::new()),
            ballast: Mutex::new(Vec::new()),
            baseline_free: Mutex::new(None),
            squeeze: Mutex::new(None),
        };
        // Module loads are device-global (resident kernels, a stack-limit raise that
        // waits for the device): here, before any worker runs, never inside a batch.
        d.warm_up()?;
        Ok(d)
    }

    /// Loads every kernel module and the NTT twiddle tables now, so that these
    /// per-context caches are not allocated later inside a squeezed region.
    pub fn warm_up(&self) -> Result<(), DeviceError> {
        for (name, _) in super::kernels::FATBINS {
            self.gpu.module(name)?;
        }
        let s = self.gpu.new_stream()?;
        let mut tiny = self.gpu.alloc_sync::<DevFr>(&s, 2)?;
        self.gpu.poison(&s, &mut tiny)?;
        super::ntt::ntt(&self.gpu, &s, &mut tiny, super::ntt::NttKind::Forward)?;
        self.gpu.sync(&s, "warm-up")?;
        tiny.free()?;
        Ok(())
    }

    /// Synchronizes the device and trims the default pool to zero, so `mem_info`
    /// shows what is really held. Not a worker's call: used between batches only.
    pub fn settle(&self) -> Result<(), DeviceError> {
        self.gpu.context().synchronize().map_err(CudaError::from)?;
        self.trim_default_pool()
    }

    /// Measures the real VRAM use of the key, of 1, 2 and 3 full working sets held at
    /// once and of one chunked set for `shape` (after a [`CudaDevice::warm_up`], or the
    /// caches it fills count as the key's).
    pub fn measure(
        &self,
        pk: &Arc<ProvingKey>,
        shape: &Shape,
    ) -> Result<MeasuredFootprint, DeviceError> {
        let before = self.settled_free()?;
        let key = self.load_key(pk)?;
        let measured = self.settled_free().and_then(|with_key| {
            let full = self.drops(shape, Footprint::Full, 3)?;
            Ok(MeasuredFootprint {
                key: before.saturating_sub(with_key),
                sets: [full[0], full[1], full[2]],
                chunked: self.drops(shape, Footprint::Chunked, 1)?[0],
            })
        });
        // The key goes whatever the sets' measure returned.
        let freed = key.free();
        let measured = measured?;
        freed?;
        self.settle()?;
        Ok(measured)
    }

    /// The drops in free VRAM with 1..=count sets of `footprint` held at once, all
    /// freed before it returns (even after a failure).
    fn drops(
        &self,
        shape: &Shape,
        footprint: Footprint,
        count: usize,
    ) -> Result<Vec<u64>, DeviceError> {
        let start = self.settled_free()?;
        let s = self.gpu.new_stream()?;
        let mut held = Vec::new();
        let mut drops = Vec::new();
        let mut fill = || -> Result<(), DeviceError> {
            for _ in 0..count {
                held.push(Buffers::alloc(
                    &self.gpu,
                    &s,
                    shape,
                    footprint,
                    self.alloc_kind(),
                )?);
                self.gpu.sync(&s, "measure")?;
                drops.push(start.saturating_sub(self.gpu.mem_info()?.0));
            }
            Ok(())
        };
        let filled = fill();
        let mut freed = Ok(());
        for b in held {
            if let (Err(e), Ok(())) = (b.free(), &freed) {
                freed = Err(e);
            }
        }
        filled?;
        freed?;
        Ok(drops)
    }

    /// Free VRAM after a settle (see [`CudaDevice::settle`]).
    fn settled_free(&self) -> Result<u64, DeviceError> {
        self.settle()?;
        Ok(self.gpu.mem_info()?.0)
    }

    /// Records the current free VRAM (after a settle) as the level a batch must
    /// return to. Take it after the device's caches exist (warm-up or a first batch).
    pub fn mark_baseline(&self) -> Result<(), DeviceError> {
        *self.baseline_free.lock() = Some(self.settled_free()?);
        Ok(())
    }

    /// Bytes of VRAM missing against the baseline after a settle (0 without one).
    pub fn vram_leaked(&self) -> Result<u64, DeviceError> {
        let Some(baseline) = *self.baseline_free.lock() else {
            return Ok(0);
        };
        Ok(baseline.saturating_sub(self.settled_free()?))
    }

    fn trim_default_pool(&self) -> Result<(), DeviceError> {
        self.gpu
            .context()
            .bind_to_thread()
            .map_err(CudaError::from)?;
        let mut pool = std::ptr::null_mut();
        // SAFETY: queries the default pool of this context's device, then trims it.
        unsafe {
            sys::cuDeviceGetDefaultMemPool(&mut pool, self.gpu.ordinal() as i32)
                .result()
                .map_err(CudaError::from)?;
            sys::cuMemPoolTrimTo(pool, 0)
                .result()
                .map_err(CudaError::from)?;
        }
        Ok(())
    }

    /// Whether a CUDA driver and at least one device are present (never panics).
    pub fn count() -> usize {
        // SAFETY: only tries to dlopen the driver library.
        if !unsafe { sys::is_culib_present() } {
            return 0;
        }
        cudarc::driver::CudaContext::device_count().map_or(0, |n| n.max(0) as usize)
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Squeezes the device to `sets` working sets beside the key, and records the
    /// result for the report. The free VRAM it leaves starts from the measure (see
    /// [`MeasuredFootprint::sets_bytes`]) and is then proved by allocation: the pool
    /// cannot map its last step when free memory is only just above it (seen on the
    /// H200: a 32 MiB step failed with 33 MiB free), so the level is raised a page at a
    /// time until the key, the `workers`' streams and the promised sets fit: ⌊sets⌋
    /// full sets, or below one set the chunked fallback where the measure says it
    /// fits, or else none (the key and streams alone).
    pub fn squeeze_for(
        &self,
        pk: &Arc<ProvingKey>,
        shape: &Shape,
        measured: MeasuredFootprint,
        sets: f64,
        workers: usize,
    ) -> Result<SqueezeLevel, DeviceError> {
        /// At most this much above the measure (a pool step is 32 MiB).
        const MAX_RAISE: u64 = 16 << 20;
        let whole = sets.max(0.0).floor() as usize;
        let (footprint, count) = if whole > 0 {
            (Footprint::Full, whole)
        } else if measured.sets_bytes(sets) >= measured.chunked {
            (Footprint::Chunked, 1)
        } else {
            (Footprint::Chunked, 0)
        };
        let asked_free = measured.key + measured.sets_bytes(sets);
        let mut raised = 0;
        let free_after = loop {
            let free_after = self.squeeze_to(Some(asked_free + raised))?;
            if self.holds(pk, workers, shape, footprint, count)? || raised >= MAX_RAISE {
                break free_after;
            }
            raised += SQUEEZE_PAGE;
        };
        let level = SqueezeLevel {
            measured,
            sets,
            asked_free,
            raised,
            free_after,
            chunked_fits: self.holds(pk, workers, shape, Footprint::Chunked, 1)?,
            next_fits: self.holds(pk, workers, shape, Footprint::Full, whole + 1)?,
        };
        tracing::debug!(?level, "squeezed");
        *self.squeeze.lock() = Some(level);
        Ok(level)
    }

    /// Whether the key, `streams` streams and `count` sets of `footprint` fit at once
    /// now: made, then all freed and the device settled (out of memory answers false).
    /// The streams are the workers' own: each takes driver memory on the device.
    fn holds(
        &self,
        pk: &Arc<ProvingKey>,
        streams: usize,
        shape: &Shape,
        footprint: Footprint,
        count: usize,
    ) -> Result<bool, DeviceError> {
        let held = self.load_key(pk).and_then(|key| {
            let sets = (0..streams)
                .map(|_| self.gpu.new_stream())
                .collect::<Result<Vec<_>, _>>()
                .map_err(DeviceError::from)
                .and_then(|_streams| self.drops(shape, footprint, count));
            key.free()?;
            sets
        });
        self.settle()?;
        match held {
            Ok(_) => Ok(true),
            Err(e) if e.is_oom() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The last squeeze of this device, if any.
    pub fn squeeze_level(&self) -> Option<SqueezeLevel> {
        *self.squeeze.lock()
    }

    /// Holds VRAM so that about `leave` bytes stay free (a squeeze); `None` releases
    /// it. Returns the free VRAM it leaves. The ballast is taken in pieces of at most
    /// 4 GiB, halving a piece that does not fit: one allocation of nearly all free
    /// memory fails even when `mem_info` says it fits. What stays free is `leave`
    /// rounded up to the 2 MiB page.
    pub fn squeeze_to(&self, leave: Option<u64>) -> Result<u64, DeviceError> {
        const PAGE: u64 = SQUEEZE_PAGE;
        const PIECE: u64 = 4 << 30;
        let mut ballast = self.ballast.lock();
        for b in ballast.drain(..) {
            b.free()?;
        }
        let free_now = || -> Result<u64, DeviceError> { Ok(self.gpu.mem_info()?.0) };
        let Some(leave) = leave else {
            return free_now();
        };
        let mut piece = PIECE;
        loop {
            let free = free_now()?;
            let want = (free.saturating_sub(leave) / PAGE * PAGE).min(piece);
            if want < PAGE {
                return Ok(free);
            }
            match self
                .gpu
                .alloc_sync::<u8>(self.gpu.default_stream(), want as usize)
            {
                Ok(b) => ballast.push(b),
                Err(CudaError::Oom { .. }) if want > PAGE => piece = want / 2,
                Err(CudaError::Oom { .. }) => return free_now(),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Faults injected so far.
    pub fn faults_injected(&self) -> usize {
        self.faults.injected()
    }

    /// Bytes still held by working sets and uncompleted frees, over all streams.
    pub fn working_bytes(&self) -> u64 {
        self.books.lock().iter().map(|b| b.owned + b.pending).sum()
    }

    fn alloc_kind(&self) -> AllocKind {
        match self.strategy {
            AllocStrategy::Pool => AllocKind::StreamOrdered,
            AllocStrategy::Sync | AllocStrategy::Arena => AllocKind::Sync,
        }
    }

    fn launch(&self, s: &CudaWorkerStream, stage: Stage) -> Result<(), DeviceError> {
        if self.faults.on_launch(stage) {
            return Err(DeviceError::Kernel {
                stage,
                reason: "injected fault".into(),
            });
        }
        if stage != Stage::Upload {
            self.books.lock()[s.id].kernels_in_flight += 1;
        }
        Ok(())
    }

    /// A working set's buffers. A synchronous allocation that fails partway frees the
    /// pieces it already has with `cuMemFree`, which synchronizes the device: under mem
    /// that would wait for the compute holder's kernels. So a synchronous set that does
    /// not fit in free VRAM (with a margin for the 2 MiB granularity of each of its ~20
    /// pieces) is refused before its first piece; and if one still fails partway (another
    /// process took VRAM in between), the frees are reported to the audit as the
    /// device-global call they are.
    fn alloc_buffers(
        &self,
        stream: &CudaWorkerStream,
        shape: &Shape,
        footprint: Footprint,
        kind: AllocKind,
        bytes: u64,
    ) -> Result<Buffers, DeviceError> {
        const MARGIN: u64 = 64 << 20;
        if kind == AllocKind::Sync {
            let (free, _) = self.gpu.mem_info()?;
            if free < bytes.saturating_add(MARGIN) {
                return Err(DeviceError::Oom {
                    requested: bytes,
                    free,
                });
            }
        }
        Buffers::alloc_or_partial(&self.gpu, &stream.stream, shape, footprint, kind).map_err(
            |(e, partial)| {
                if partial && kind == AllocKind::Sync {
                    self.global(stream, "cuMemFree (a partly allocated working set)");
                }
                DeviceError::from(e)
            },
        )
    }

    /// Audits a device-global call by `caller`.
    fn global(&self, caller: &CudaWorkerStream, what: &'static str) {
        if let Some(audit) = &self.audit {
            let busy = self
                .books
                .lock()
                .iter()
                .enumerate()
                .filter(|(i, b)| *i != caller.id && b.kernels_in_flight > 0)
                .filter_map(|(_, b)| b.owner)
                .collect();
            audit.global_call(caller.owner, what, busy);
        }
    }

    fn stream_synced(&self, s: &CudaWorkerStream) {
        let mut books = self.books.lock();
        books[s.id].kernels_in_flight = 0;
        books[s.id].pending = 0;
    }

    fn release(
        &self,
        s: &CudaWorkerStream,
        ws: CudaWorkingSet,
        synced: bool,
    ) -> Result<(), DeviceError> {
        let bytes = ws.bytes;
        let freed = if ws.arena {
            self.arena.lock().push(Slot { bufs: ws.bufs });
            Ok(())
        } else {
            if self.strategy == AllocStrategy::Sync {
                // cuMemFree synchronizes the device.
                self.global(s, "cuMemFree");
            }
            ws.bufs.free()
        };
        {
            let mut books = self.books.lock();
            let b = &mut books[s.id];
            b.owned = b.owned.saturating_sub(bytes);
            if self.strategy == AllocStrategy::Pool && !ws.arena {
                b.pending += bytes;
            }
        }
        freed?;
        if synced && self.strategy == AllocStrategy::Pool {
            // The stream-ordered frees complete, and (release threshold 0) return to the
            // device, at this sync of the worker's own stream.
            self.sync_stream(s)?;
        }
        Ok(())
    }
}

impl Device for CudaDevice {
    type Stream = CudaWorkerStream;
    type WorkingSet = CudaWorkingSet;
    type Key = CudaKey;

    fn describe(&self) -> String {
        format!(
            "{} #{} ({:.0} GiB, {})",
            self.gpu.name(),
            self.gpu.ordinal(),
            self.gpu.total_mem() as f64 / (1u64 << 30) as f64,
            self.strategy
        )
    }

    fn strategy(&self) -> AllocStrategy {
        self.strategy
    }

    fn memory(&self) -> Result<MemInfo, DeviceError> {
        let (free, total) = self.gpu.mem_info()?;
        Ok(MemInfo { free, total })
    }

    fn create_stream(&self, owner: WorkerId) -> Result<CudaWorkerStream, DeviceError> {
        let stream = self.gpu.new_stream()?;
        let mut books = self.books.lock();
        books.push(Book {
            owner: Some(owner),
            ..Default::default()
        });
        Ok(CudaWorkerStream {
            id: books.len() - 1,
            owner,
            stream,
        })
    }

    fn load_key(&self, pk: &Arc<ProvingKey>) -> Result<CudaKey, DeviceError> {
        // The key fixes the domain (h has one point fewer). Page-locked staging for one
        // domain-sized vector (the split MSMs' scalars; a, b, c come from lent memory,
        // see `lend_host`) is pinned here, before a batch, not on its ramp-up.
        let t0 = std::time::Instant::now();
        let vector = (pk.h_query.len() as u64 + 1) * FR_BYTES;
        let added = self.gpu.reserve_staging(vector)?;
        tracing::debug!(
            buffers = added,
            ms = t0.elapsed().as_secs_f64() * 1e3,
            "page-locked staging reserved for {} MiB",
            vector >> 20
        );
        let s = self.gpu.default_stream();
        let up = |pts| DeviceBases::upload(&self.gpu, s, pts, AllocKind::Sync);
        let b_g2 = pk.b_g2_query.get(1..).unwrap_or(&[]);
        Ok(CudaKey {
            h: up(&pk.h_query)?,
            l: up(&pk.l_query)?,
            a: up(&pk.a_query)?,
            b_g1: up(&pk.b_g1_query)?,
            b_g2: DeviceG2Bases::upload(&self.gpu, s, b_g2, AllocKind::Sync)?,
        })
    }

    fn lend_host(&self, len: usize) -> Result<Option<HostVec>, DeviceError> {
        let t0 = std::time::Instant::now();
        match self.gpu.lend_pinned(len) {
            Ok(lent) => {
                tracing::debug!(
                    mib = (len as u64 * FR_BYTES) >> 20,
                    ms = t0.elapsed().as_secs_f64() * 1e3,
                    "page-locked memory lent to the prep"
                );
                Ok(Some(HostVec::lent(Box::new(lent))))
            }
            Err(CudaError::Driver(e)) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                tracing::warn!(
                    error = %e,
                    "no page-locked memory to lend: a, b, c go through staging"
                );
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn working_set_bytes(&self, shape: &Shape, footprint: Footprint) -> u64 {
        let n = shape.domain_size as u64;
        let max = shape.domain_size.max(shape.num_scalars);
        3 * n * FR_BYTES
            + MsmWorkspace::bytes_needed_with(max, windows_per_pass(footprint))
            + MsmResults::bytes_needed(RESULTS)
            + G2Scratch::bytes_needed_beside(shape.num_scalars, max, windows_per_pass(footprint))
    }

    fn reserve_arena(&self, _slot_bytes: u64, _slots: usize) -> Result<usize, DeviceError> {
        // The arena needs the shape, not just bytes: `alloc` makes a slot on first use
        // and `free` keeps it until `release_arena`.
        Ok(0)
    }

    fn release_arena(&self) -> Result<(), DeviceError> {
        let slots = std::mem::take(&mut *self.arena.lock());
        // Free every slot even if one fails; report the first failure.
        let mut first = Ok(());
        for slot in slots {
            if let (Err(e), Ok(())) = (slot.bufs.free(), &first) {
                first = Err(e.into());
            }
        }
        first
    }

    fn alloc(
        &self,
        stream: &CudaWorkerStream,
        shape: &Shape,
        footprint: Footprint,
        site: AllocSite,
    ) -> Result<CudaWorkingSet, DeviceError> {
        let bytes = self.working_set_bytes(shape, footprint);
        let total = self.gpu.total_mem();
        if bytes > total {
            return Err(DeviceError::TooLarge {
                needed: bytes,
                total,
            });
        }
        if self.faults.on_alloc(site) {
            let free = self.gpu.mem_info().map(|(f, _)| f).unwrap_or(0);
            return Err(DeviceError::Oom {
                requested: bytes,
                free,
            });
        }
        let (bufs, arena) = match self.strategy {
            AllocStrategy::Arena => {
                let slot = self.arena.lock().pop();
                match slot {
                    Some(slot) => (slot.bufs, true),
                    // First use: the arena grows one slot at a time up to its need.
                    None => (
                        self.alloc_buffers(stream, shape, footprint, AllocKind::Sync, bytes)?,
                        true,
                    ),
                }
            }
            _ => (
                self.alloc_buffers(stream, shape, footprint, self.alloc_kind(), bytes)?,
                false,
            ),
        };
        self.books.lock()[stream.id].owned += bytes;
        Ok(CudaWorkingSet {
            bufs,
            bytes,
            arena,
            split_all: None,
            split_aux: None,
            ran: [false; RESULTS],
        })
    }

    fn free(&self, stream: &CudaWorkerStream, ws: CudaWorkingSet) -> Result<(), DeviceError> {
        self.release(stream, ws, true)
    }

    fn upload(
        &self,
        stream: &CudaWorkerStream,
        ws: &mut CudaWorkingSet,
        inputs: &PartitionInputs,
    ) -> Result<(), DeviceError> {
        self.launch(stream, Stage::Upload)?;
        let n = ws.bufs.a.len();
        if inputs.a.len() != n || inputs.b.len() != n || inputs.c.len() != n {
            return Err(DeviceError::InvalidInput(format!(
                "a, b, c have {}, {}, {} values for a domain of {n}",
                inputs.a.len(),
                inputs.b.len(),
                inputs.c.len()
            )));
        }
        let s = &stream.stream;
        // Async copies, ordered before this worker's kernels by its stream: straight
        // from memory this device lent (its writes and free wait for the copy), else
        // through page-locked staging (the input is free when the call returns).
        let g = &self.gpu;
        let t0 = std::time::Instant::now();
        for (dst, src) in [
            (&mut ws.bufs.a, &inputs.a),
            (&mut ws.bufs.b, &inputs.b),
            (&mut ws.bufs.c, &inputs.c),
        ] {
            match src.lent_as::<LentPinned>() {
                Some(lent) => g.upload_lent(s, dst, lent)?,
                None => g.upload_to(s, dst, fr_as_dev(src))?,
            }
        }
        ws.bufs.out.poison(&self.gpu, s)?;
        ws.bufs.g2.poison(&self.gpu, s)?;
        // The MSMs upload the split (it is the prep's, ready to copy).
        ws.split_all = Some(inputs.classes.clone());
        ws.split_aux = Some(inputs.aux_classes.clone());
        ws.ran = [false; RESULTS];
        // Where an upload's host time goes (the first one is on a batch's ramp-up), and
        // whether copies found no staging buffer free (pageable: they block the thread).
        let sent = self.gpu.staging_counts();
        tracing::debug!(
            owner = %stream.owner,
            abc_ms = t0.elapsed().as_secs_f64() * 1e3,
            staged_mib_so_far = sent.staged >> 20,
            pageable_mib_so_far = sent.pageable >> 20,
            lent_mib_so_far = sent.lent >> 20,
            "upload's host side"
        );
        Ok(())
    }

    fn witness_map(
        &self,
        stream: &CudaWorkerStream,
        ws: &mut CudaWorkingSet,
    ) -> Result<(), DeviceError> {
        if ws.split_all.is_none() {
            return Err(DeviceError::InvalidInput(
                "witness map before upload".into(),
            ));
        }
        self.launch(stream, Stage::WitnessMap)?;
        let b = &mut ws.bufs;
        witness_map(&self.gpu, &stream.stream, &mut b.a, &mut b.b, &mut b.c)
            .map_err(kernel_err(Stage::WitnessMap))
    }

    fn msm(
        &self,
        stream: &CudaWorkerStream,
        ws: &mut CudaWorkingSet,
        key: &CudaKey,
        job: Stage,
    ) -> Result<(), DeviceError> {
        let (Some(all), Some(aux)) = (&ws.split_all, &ws.split_aux) else {
            return Err(DeviceError::InvalidInput("MSM before upload".into()));
        };
        self.launch(stream, job)?;
        let (g, s, b) = (&*self.gpu, &stream.stream, &mut ws.bufs);
        let e = kernel_err(job);
        let slot = match job {
            Stage::MsmH => {
                let n = b.a.len().min(key.h.len());
                let h = DeviceScalars::new(&b.a, 0..n).map_err(&e)?;
                msm::msm_enqueue(
                    g,
                    s,
                    &mut b.msm,
                    key.h.view(),
                    ScalarsRef::Device(h),
                    &mut b.out,
                    0,
                )
                .map_err(&e)?;
                0
            }
            Stage::MsmL => {
                msm::msm_split_enqueue(g, s, &mut b.msm, key.l.view(), aux, &mut b.out, 1)
                    .map_err(&e)?;
                1
            }
            Stage::MsmA | Stage::MsmBG1 => {
                let (bases, slot) = if job == Stage::MsmA {
                    (&key.a, 2)
                } else {
                    (&key.b_g1, 3)
                };
                let view = bases.slice(1..bases.len().max(1)).map_err(&e)?;
                if job == Stage::MsmBG1 {
                    // B_G2 on the same scalars, beside B_G1 (G2Scratch::enqueue_with_g1).
                    let (ws, out) = (&mut b.msm, &mut b.out);
                    b.g2.enqueue_with_g1(g, s, ws, view, &key.b_g2, all, out, slot)
                } else {
                    msm::msm_split_enqueue(g, s, &mut b.msm, view, all, &mut b.out, slot)
                }
                .map_err(&e)?;
                slot
            }
            other => {
                return Err(DeviceError::InvalidInput(format!(
                    "{other:?} is not an MSM job"
                )))
            }
        };
        ws.ran[slot] = true;
        Ok(())
    }

    fn sync_stream(&self, stream: &CudaWorkerStream) -> Result<(), DeviceError> {
        let r = self.gpu.sync(&stream.stream, "worker stream");
        self.stream_synced(stream);
        r.map_err(|e| DeviceError::Kernel {
            stage: Stage::WitnessMap,
            reason: format!("asynchronous error on the worker's stream: {e}"),
        })
    }

    fn results(
        &self,
        stream: &CudaWorkerStream,
        ws: &CudaWorkingSet,
    ) -> Result<G1Results, DeviceError> {
        if let Some(i) = ws.ran.iter().position(|r| !r) {
            return Err(DeviceError::InvalidInput(format!(
                "{} was never run",
                Stage::MSMS[i].name()
            )));
        }
        let p: Vec<G1Projective> = msm::read_points(&self.gpu, &stream.stream, &ws.bufs.out)?;
        let (g2, s) = (&ws.bufs.g2, &stream.stream);
        let ones = g2.read_sum(&self.gpu, s)?;
        let b_g2 = match g2.read_others(&self.gpu, s)? {
            Some(others) => DeviceBG2::Whole(ones + others),
            None => DeviceBG2::Ones(ones),
        };
        Ok(G1Results {
            b_g2,
            h: p[0],
            l: p[1],
            a: p[2],
            b_g1: p[3],
        })
    }

    fn sync_device(&self, caller: &CudaWorkerStream) -> Result<(), DeviceError> {
        self.global(caller, "cuCtxSynchronize");
        self.gpu.context().synchronize().map_err(CudaError::from)?;
        let mut books = self.books.lock();
        for b in books.iter_mut() {
            b.kernels_in_flight = 0;
            b.pending = 0;
        }
        Ok(())
    }

    fn trim_pool(&self, caller: &CudaWorkerStream) -> Result<(), DeviceError> {
        self.global(caller, "cuMemPoolTrimTo");
        let started = Instant::now();
        self.trim_default_pool()?;
        tracing::trace!(
            elapsed_us = started.elapsed().as_micros() as u64,
            "pool trimmed"
        );
        Ok(())
    }

    fn outstanding_bytes(&self, stream: &CudaWorkerStream) -> u64 {
        let books = self.books.lock();
        books[stream.id].owned + books[stream.id].pending
    }

    #[cfg(any(twolock_loom, feature = "bad-designs"))]
    fn flawed_free_unsynced(
        &self,
        stream: &CudaWorkerStream,
        ws: CudaWorkingSet,
    ) -> Result<(), DeviceError> {
        self.release(stream, ws, false)
    }
}

#[cfg(test)]
mod tests {
    use super::MeasuredFootprint;

    const MIB: u64 = 1 << 20;

    /// Whole counts give the measured drops; a fraction lies between two counts; past
    /// three sets the last step repeats.
    #[test]
    fn sets_bytes_follows_the_measured_counts() {
        let m = MeasuredFootprint {
            key: 10 * MIB,
            sets: [96 * MIB, 160 * MIB, 256 * MIB],
            chunked: 32 * MIB,
        };
        assert_eq!(m.sets_bytes(0.0), 0);
        assert_eq!(m.sets_bytes(0.5), 48 * MIB);
        assert_eq!(m.sets_bytes(1.0), 96 * MIB);
        assert_eq!(m.sets_bytes(1.5), 128 * MIB);
        assert_eq!(m.sets_bytes(2.0), 160 * MIB);
        assert_eq!(m.sets_bytes(3.0), 256 * MIB);
        assert_eq!(m.sets_bytes(4.0), 352 * MIB);
        assert_eq!(m.sets_bytes(-1.0), 0);
    }
}
