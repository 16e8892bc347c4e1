//! Fr NTTs on the device, equal to ark-poly's `Radix2EvaluationDomain<Fr>`:
//!
//! | [`NttKind`] | ark-poly | result (n = 2^L, ω = `Fr::get_root_of_unity(n)`, g = `Fr::GENERATOR` = 7) |
//! |---|---|---|
//! | `Forward` | `domain.fft_in_place` | X_k = Σ_i x_i ω^(ik) |
//! | `Inverse` | `domain.ifft_in_place` | x_i = n^-1 Σ_k X_k ω^(-ik) |
//! | `CosetForward` | `domain.get_coset(g).fft_in_place` | X_k = Σ_i (x_i g^i) ω^(ik) |
//! | `CosetInverse` | `domain.get_coset(g).ifft_in_place` | x_i = g^-i n^-1 Σ_k X_k ω^(-ik) |
//!
//! Input and output are in natural order, in place, enqueued on the caller's stream
//! (the call returns before the work is done; [`Gpu::sync`] waits and checks). Sizes
//! 2^1..=2^[`MAX_LOG_N`]. No global scratch: several transforms may run at once on
//! different streams. The root tables are uploaded once per [`Gpu`] (about 8 MiB) and
//! are read-only afterwards.
//!
//! Kernel structure (see `cuda/ntt.cuh`): ⌈L/10⌉ shared-memory passes of DIF stages
//! (four-step decomposition, twiddles between passes; inside a pass each thread runs
//! groups of up to two stages in registers), then one bit-reversal pass, in 16×16
//! tiles so that it reads and writes whole 512-byte runs, that also applies n^-1 and
//! the coset powers. [`ntt_with_scratch`] takes a caller's buffer of n scalars instead
//! and saves that pass: the first DIF pass writes the scratch and the last one writes
//! each output straight to its bit-reversed index in the caller's buffer (the
//! witness map's last transform does this with a buffer it no longer needs).

use std::sync::{Arc, OnceLock};

use ark_ff::{FftField, Field, One};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{result, CudaStream, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::context::{grid_1d, CudaError, DeviceBuffer, Gpu};
use super::layout::{fr_to_dev, DevFr};
use crate::sync::Mutex;
use crate::Fr;

/// The module built from `cuda/ntt.cu`.
pub const MODULE: &str = "ntt";
/// Kernel names in [`MODULE`].
pub mod kernel {
    pub const DIF_PASS: &str = "ntt_dif_pass";
    pub const DIF_PASS_COPY: &str = "ntt_dif_pass_copy";
    pub const DIF_PASS_BREV: &str = "ntt_dif_pass_brev";
    pub const BITREV_SCALE: &str = "ntt_bitrev_scale";
    pub const BITREV_TILED: &str = "ntt_bitrev_tiled";
    pub const QAP_DIVIDE: &str = "qap_divide";
}

/// Largest supported transform, log2 (must match `ntt::MAX_LOG_N` in ntt.cuh).
pub const MAX_LOG_N: u32 = 28;
/// Split of the two-level root tables (`ntt::TW_SPLIT`).
const TW_SPLIT: u32 = 14;
/// Order (log2) of the small-root table (`ntt::MAX_PASS_LOG`).
const MAX_PASS_LOG: u32 = 11;
/// Order (log2) of the one-read twiddle table (`ntt::DIRECT_LOG`).
const DIRECT_LOG: u32 = 16;
/// Most DIF stages per shared-memory pass; a block holds 2^TILE_LOG elements.
const STAGES_PER_PASS: u32 = 10;
const TILE_LOG: u32 = 10;
/// Rows one thread holds while it runs a group of stages (`ntt::MAX_GROUP`, log2).
const MAX_GROUP: u32 = 2;
/// Threads per DIF block: `ntt_dif_pass` is built with `__launch_bounds__(128, 5)`.
const MAX_BLOCK: u32 = 128;
const BITREV_BLOCK: u32 = 256;
/// Side (log2) of the tiles of `ntt_bitrev_tiled` (`ntt::BITREV_TILE_LOG`); it runs
/// sizes from 2^(2·BITREV_TILE_LOG) with `BITREV_TILED_THREADS` per block.
const BITREV_TILE_LOG: u32 = 4;
const BITREV_TILED_THREADS: u32 = 1 << (2 * BITREV_TILE_LOG);

/// Which transform of `Radix2EvaluationDomain<Fr>` to apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum NttKind {
    Forward,
    Inverse,
    CosetForward,
    CosetInverse,
}

impl NttKind {
    pub const ALL: [NttKind; 4] = [
        NttKind::Forward,
        NttKind::Inverse,
        NttKind::CosetForward,
        NttKind::CosetInverse,
    ];
}

/// Root tables on the device (values are arkworks' Montgomery limbs).
struct Tables {
    /// w_{2^11}^j, j < 2^10, and the inverses.
    small_fwd: DeviceBuffer<DevFr>,
    small_inv: DeviceBuffer<DevFr>,
    /// w_{2^16}^e, e < 2^16, and the inverses: four-step twiddles of passes over at
    /// most 2^16 points, one read each.
    direct_fwd: DeviceBuffer<DevFr>,
    direct_inv: DeviceBuffer<DevFr>,
    /// w_{2^28}^(a·2^14) and w_{2^28}^b, a, b < 2^14; and for w^-1.
    tw_fwd: [DeviceBuffer<DevFr>; 2],
    tw_inv: [DeviceBuffer<DevFr>; 2],
    /// g^(a·2^14), g^b; and for g^-1.
    coset: [DeviceBuffer<DevFr>; 2],
    coset_inv: [DeviceBuffer<DevFr>; 2],
}

/// The per-[`Gpu`] table cache: built on first use, once (the build runs under
/// `init`, so two first callers cannot both upload).
#[derive(Default)]
pub(crate) struct TwiddleCache {
    tables: OnceLock<Tables>,
    init: Mutex<()>,
}

/// `[x^0, x^1, …, x^(len-1)]`.
fn powers(x: Fr, len: usize) -> Vec<Fr> {
    let mut v = Vec::with_capacity(len);
    let mut acc = Fr::one();
    for _ in 0..len {
        v.push(acc);
        acc *= x;
    }
    v
}

/// The two-level table of `x`: hi[a] = x^(a·2^14), lo[b] = x^b.
fn split_table(x: Fr) -> [Vec<Fr>; 2] {
    let len = 1usize << TW_SPLIT;
    let hi_len = 1usize << (MAX_LOG_N - TW_SPLIT);
    [powers(x.pow([len as u64]), hi_len), powers(x, len)]
}

fn root(log: u32) -> Result<Fr, CudaError> {
    Fr::get_root_of_unity(1u64 << log)
        .ok_or_else(|| CudaError::InvalidInput(format!("no root of unity of order 2^{log}")))
}

fn upload_table(gpu: &Gpu, values: &[Fr]) -> Result<DeviceBuffer<DevFr>, CudaError> {
    let stream = gpu.default_stream();
    let mut buf = gpu.alloc_sync::<DevFr>(stream, values.len())?;
    let host: Vec<DevFr> = values.iter().map(fr_to_dev).collect();
    stream.memcpy_htod(&host, &mut buf)?;
    Ok(buf)
}

impl TwiddleCache {
    fn get(&self, gpu: &Gpu) -> Result<&Tables, CudaError> {
        if let Some(t) = self.tables.get() {
            return Ok(t);
        }
        let _guard = self.init.lock();
        if let Some(t) = self.tables.get() {
            return Ok(t);
        }
        let w = root(MAX_LOG_N)?;
        let w_inv = w
            .inverse()
            .ok_or_else(|| CudaError::InvalidInput("root is zero".into()))?;
        let ws = root(MAX_PASS_LOG)?;
        let ws_inv = ws
            .inverse()
            .ok_or_else(|| CudaError::InvalidInput("root is zero".into()))?;
        let wd = root(DIRECT_LOG)?;
        let wd_inv = wd
            .inverse()
            .ok_or_else(|| CudaError::InvalidInput("root is zero".into()))?;
        let g = Fr::GENERATOR;
        let g_inv = g
            .inverse()
            .ok_or_else(|| CudaError::InvalidInput("generator is zero".into()))?;
        let small = 1usize << (MAX_PASS_LOG - 1);
        let up = |v: &[Fr]| upload_table(gpu, v);
        let pair = |t: [Vec<Fr>; 2]| -> Result<[DeviceBuffer<DevFr>; 2], CudaError> {
            Ok([up(&t[0])?, up(&t[1])?])
        };
        let tables = Tables {
            small_fwd: up(&powers(ws, small))?,
            small_inv: up(&powers(ws_inv, small))?,
            direct_fwd: up(&powers(wd, 1 << DIRECT_LOG))?,
            direct_inv: up(&powers(wd_inv, 1 << DIRECT_LOG))?,
            tw_fwd: pair(split_table(w))?,
            tw_inv: pair(split_table(w_inv))?,
            coset: pair(split_table(g))?,
            coset_inv: pair(split_table(g_inv))?,
        };
        // The copies read pageable host memory: wait until they have landed before
        // any stream may read the tables.
        gpu.sync(gpu.default_stream(), "ntt twiddle upload")?;
        // Cannot already be set: every writer holds `init`.
        let _ = self.tables.set(tables);
        self.tables
            .get()
            .ok_or_else(|| CudaError::InvalidInput("twiddle cache".into()))
    }
}

/// One shared-memory pass: `k` stages, tile of 2^k rows × 2^log_t columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pass {
    done: u32,
    k: u32,
    log_t: u32,
}

/// Splits `log_n` stages into ⌈log_n / 10⌉ passes of near-equal size.
fn plan(log_n: u32) -> Vec<Pass> {
    let count = log_n.div_ceil(STAGES_PER_PASS).max(1);
    let (base, rem) = (log_n / count, log_n % count);
    let mut done = 0;
    (0..count)
        .map(|p| {
            let k = base + u32::from(p < rem);
            let c = log_n - done - k;
            let pass = Pass {
                done,
                k,
                log_t: c.min(TILE_LOG.saturating_sub(k)),
            };
            done += k;
            pass
        })
        .collect()
}

/// Launch shape of one DIF pass: one thread per 2^MAX_GROUP rows of a column (more
/// virtual threads than MAX_BLOCK loop), and tiles smaller than 2^TILE_LOG (the last
/// pass's sub-problems) several to a block, up to MAX_BLOCK threads and 2^TILE_LOG
/// elements of shared memory.
fn dif_launch(log_n: u32, pass: Pass) -> LaunchConfig {
    let tile_log = pass.k + pass.log_t;
    let threads = (1u32 << (tile_log - pass.k.min(MAX_GROUP))).min(MAX_BLOCK);
    let log_tiles_per_block = TILE_LOG
        .saturating_sub(tile_log)
        .min(log_n - tile_log)
        .min((MAX_BLOCK / threads).ilog2());
    LaunchConfig {
        grid_dim: (1u32 << (log_n - tile_log - log_tiles_per_block), 1, 1),
        block_dim: (threads, 1u32 << log_tiles_per_block, 1),
        shared_mem_bytes: (32u32 << tile_log) << log_tiles_per_block,
    }
}

/// Number of memory passes (DIF passes plus the bit reversal) of a 2^log_n transform.
pub fn memory_passes(log_n: u32) -> usize {
    plan(log_n).len() + 1
}

/// `log2(len)` if `len` is a supported power of two.
fn log_size(len: usize) -> Result<u32, CudaError> {
    if !len.is_power_of_two() || len.trailing_zeros() > MAX_LOG_N {
        return Err(CudaError::InvalidInput(format!(
            "NTT size {len} is not a power of two in 1..=2^{MAX_LOG_N}"
        )));
    }
    Ok(len.trailing_zeros())
}

/// Root direction and per-index factors of one transform.
#[derive(Clone, Copy)]
pub(crate) struct Steps {
    pub inverse: bool,
    /// Multiply coefficient i by g^i before the transform.
    pub coset_in: bool,
    /// Multiply output i by n^-1.
    pub scale_n_inv: bool,
    /// Multiply output i by g^i (`Some(false)`) or g^-i (`Some(true)`).
    pub coset_out: Option<bool>,
}

impl Steps {
    pub(crate) fn of_kind(kind: NttKind) -> Steps {
        match kind {
            NttKind::Forward => Steps {
                inverse: false,
                coset_in: false,
                scale_n_inv: false,
                coset_out: None,
            },
            NttKind::Inverse => Steps {
                inverse: true,
                coset_in: false,
                scale_n_inv: true,
                coset_out: None,
            },
            NttKind::CosetForward => Steps {
                inverse: false,
                coset_in: true,
                scale_n_inv: false,
                coset_out: None,
            },
            NttKind::CosetInverse => Steps {
                inverse: true,
                coset_in: false,
                scale_n_inv: true,
                coset_out: Some(true),
            },
        }
    }
}

/// Applies `kind` to `data` (natural order, in place) on `stream`. Returns once the
/// kernels are enqueued; synchronize (`Gpu::sync`) before reading the result.
pub fn ntt<B: DevicePtrMut<DevFr>>(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    data: &mut B,
    kind: NttKind,
) -> Result<(), CudaError> {
    let log_n = log_size(data.len())?;
    let (ptr, _record) = data.device_ptr_mut(stream);
    // SAFETY: `ptr` is a live device buffer of exactly 2^log_n values; `_record`
    // keeps cudarc's event tracking alive until every launch below is enqueued.
    unsafe { transform_raw(gpu, stream, ptr, log_n, Steps::of_kind(kind), None) }
}

/// [`ntt`] with a scratch buffer of at least `data.len()` scalars, which it
/// overwrites: the first pass writes the scratch and the last pass writes `data` in
/// natural order, so the bit reversal costs no memory pass of its own. The result is
/// the same as [`ntt`]'s; the price is the scratch's memory.
pub fn ntt_with_scratch<B: DevicePtrMut<DevFr>, S: DevicePtrMut<DevFr>>(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    data: &mut B,
    scratch: &mut S,
    kind: NttKind,
) -> Result<(), CudaError> {
    let log_n = log_size(data.len())?;
    if scratch.len() < data.len() {
        return Err(CudaError::InvalidInput(format!(
            "NTT scratch of {} scalars for a transform of {}",
            scratch.len(),
            data.len()
        )));
    }
    let (ptr, _record) = data.device_ptr_mut(stream);
    let (tmp, _tmp_record) = scratch.device_ptr_mut(stream);
    // SAFETY: two distinct live buffers (both borrowed mutably), `tmp` of at least
    // 2^log_n values; the records live until every launch is enqueued.
    unsafe { transform_raw(gpu, stream, ptr, log_n, Steps::of_kind(kind), Some(tmp)) }
}

/// Enqueues one transform on the raw buffer `ptr` of 2^log_n scalars. With a
/// `scratch` (and at least two passes) the passes run `ptr` → scratch → … → `ptr`, the
/// last one writing bit-reversed with the output factors; otherwise in place, then
/// the bit-reversal pass.
///
/// # Safety
/// `ptr` (and `scratch`, if any) must address 2^log_n `DevFr` that stay allocated until
/// the work completes, must not overlap, and no other stream may touch them meanwhile.
pub(crate) unsafe fn transform_raw(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    ptr: CUdeviceptr,
    log_n: u32,
    steps: Steps,
    scratch: Option<CUdeviceptr>,
) -> Result<(), CudaError> {
    if log_n == 0 {
        return Ok(()); // every variant is the identity on one point (g^0 = 1, 1/n = 1)
    }
    let tables = gpu.ntt_tables.get(gpu)?;
    let (small, direct, tw) = if steps.inverse {
        (&tables.small_inv, &tables.direct_inv, &tables.tw_inv)
    } else {
        (&tables.small_fwd, &tables.direct_fwd, &tables.tw_fwd)
    };
    let (small, direct) = (small.raw(), direct.raw());
    let (tw_hi, tw_lo) = (tw[0].raw(), tw[1].raw());
    let scale = Fr::from(1u64 << log_n)
        .inverse()
        .ok_or_else(|| CudaError::InvalidInput("n is zero in Fr".into()))?;
    let scale = steps.scale_n_inv.then_some(scale);
    let per_index = match steps.coset_out {
        None => None,
        Some(false) => Some(&tables.coset),
        Some(true) => Some(&tables.coset_inv),
    };
    let out = OutFactorArgs::new(scale, per_index);
    let passes = plan(log_n);
    let fused = scratch.filter(|_| passes.len() >= 2);
    let last = passes.len() - 1;
    for (p, pass) in passes.into_iter().enumerate() {
        let (coset_hi, coset_lo): (CUdeviceptr, CUdeviceptr) = if steps.coset_in && p == 0 {
            (tables.coset[0].raw(), tables.coset[1].raw())
        } else {
            (0, 0)
        };
        let cfg = dif_launch(log_n, pass);
        // In place on `ptr`; fused: ptr → scratch, scratch in place, scratch → ptr.
        let (name, src, dst) = match (fused, p) {
            (None, _) => (kernel::DIF_PASS, ptr, ptr),
            (Some(tmp), 0) => (kernel::DIF_PASS_COPY, ptr, tmp),
            (Some(tmp), p) if p == last => (kernel::DIF_PASS_BREV, tmp, ptr),
            (Some(tmp), _) => (kernel::DIF_PASS, tmp, tmp),
        };
        let f = gpu.function(MODULE, name)?;
        let mut args = stream.launch_builder(&f);
        if name == kernel::DIF_PASS {
            args.arg(&src);
        } else {
            args.arg(&src).arg(&dst);
        }
        args.arg(&log_n)
            .arg(&pass.done)
            .arg(&pass.k)
            .arg(&pass.log_t)
            .arg(&small)
            .arg(&direct)
            .arg(&tw_hi)
            .arg(&tw_lo)
            .arg(&coset_hi)
            .arg(&coset_lo);
        if name == kernel::DIF_PASS_BREV {
            out.push(&mut args);
        }
        // SAFETY: the arguments match `ntt_dif_pass(fr_t*, u32 x4, const fr_t* x6)`,
        // `ntt_dif_pass_copy(const fr_t*, fr_t*, u32 x4, const fr_t* x6)` and
        // `ntt_dif_pass_brev(…, u32, fr_t, const fr_t* x2)`; tables live as long as
        // `gpu`, the buffers per the caller's contract.
        unsafe { gpu.launch(name, &mut args, cfg) }?;
    }
    if fused.is_some() {
        return Ok(());
    }
    // SAFETY: forwarded contract.
    unsafe { bitrev_raw(gpu, stream, ptr, log_n, &out) }
}

/// The output factor's kernel arguments `(u32 has_scale, fr_t scale, const fr_t* hi,
/// const fr_t* lo)`, shared by the bit-reversal kernels and the fused last pass:
/// `scale · t^i` for output i, where the table pair holds the powers of t.
struct OutFactorArgs {
    has_scale: u32,
    scale: DevFr,
    hi: CUdeviceptr,
    lo: CUdeviceptr,
}

impl OutFactorArgs {
    fn new(scale: Option<Fr>, per_index: Option<&[DeviceBuffer<DevFr>; 2]>) -> Self {
        let (hi, lo) = per_index.map_or((0, 0), |t| (t[0].raw(), t[1].raw()));
        OutFactorArgs {
            has_scale: u32::from(scale.is_some()),
            scale: fr_to_dev(&scale.unwrap_or(Fr::one())),
            hi,
            lo,
        }
    }

    fn push<'a>(&'a self, args: &mut cudarc::driver::LaunchArgs<'a>) {
        args.arg(&self.has_scale)
            .arg(&self.scale)
            .arg(&self.hi)
            .arg(&self.lo);
    }
}

/// Enqueues the bit-reversal pass with the output factor `out`.
///
/// # Safety
/// As [`transform_raw`].
unsafe fn bitrev_raw(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    ptr: CUdeviceptr,
    log_n: u32,
    out: &OutFactorArgs,
) -> Result<(), CudaError> {
    // Tiled from 2^(2·BITREV_TILE_LOG) points (coalesced runs), one thread per index below.
    let tiled = log_n >= 2 * BITREV_TILE_LOG;
    let (name, cfg) = if tiled {
        let cfg = LaunchConfig {
            grid_dim: (1u32 << (log_n - 2 * BITREV_TILE_LOG), 1, 1),
            block_dim: (BITREV_TILED_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        (kernel::BITREV_TILED, cfg)
    } else {
        (
            kernel::BITREV_SCALE,
            grid_1d(1usize << log_n, BITREV_BLOCK)?,
        )
    };
    let f = gpu.function(MODULE, name)?;
    let mut args = stream.launch_builder(&f);
    args.arg(&ptr).arg(&log_n);
    out.push(&mut args);
    // SAFETY: both kernels are `(fr_t*, u32, u32, fr_t, const fr_t*, const fr_t*)`.
    unsafe { gpu.launch(name, &mut args, cfg) }
}

/// `ifft` followed by `coset fft` on the same buffer, with the inverse transform's
/// n^-1 and the coset powers g^i fused into one bit-reversal pass (the witness map's
/// first step for each of a, b, c).
///
/// # Safety
/// As [`transform_raw`].
pub(crate) unsafe fn ifft_then_coset_fft_raw(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    ptr: CUdeviceptr,
    log_n: u32,
) -> Result<(), CudaError> {
    let to_coeffs = Steps {
        inverse: true,
        coset_in: false,
        scale_n_inv: true,
        coset_out: Some(false),
    };
    // SAFETY: forwarded contract.
    unsafe {
        transform_raw(gpu, stream, ptr, log_n, to_coeffs, None)?;
        transform_raw(
            gpu,
            stream,
            ptr,
            log_n,
            Steps::of_kind(NttKind::Forward),
            None,
        )
    }
}

/// Runs `enqueue` between two timing events on `stream`; returns the device time in ms.
pub(crate) fn time_on_stream(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    enqueue: impl FnOnce() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    use cudarc::driver::sys::CUevent_flags;
    let ctx = gpu.context();
    let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    start.record(stream)?;
    enqueue()?;
    end.record(stream)?;
    let ms = start.elapsed_ms(&end)?;
    gpu.sync(stream, "timed work")?;
    Ok(f64::from(ms))
}

/// Median of `v` (sorted in place); 0 for an empty slice.
pub(crate) fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// Device timing of one NTT size, with the floors it is judged against.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct NttTiming {
    pub log_n: u32,
    pub kind: NttKind,
    /// Timed runs after the warm-up.
    pub runs: usize,
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    /// [`ntt_with_scratch`] (the bit reversal fused into the last pass), median over
    /// the same number of runs.
    pub scratch_median_ms: f64,
    /// Device-to-device copy of the same 2^log_n scalars (one read and one write of
    /// the array), median: the time of one memory pass.
    pub copy_ms: f64,
    /// Copy bandwidth from `copy_ms`, counting read and write, in GB/s.
    pub copy_gbps: f64,
    /// Memory passes of this transform (DIF passes plus the bit reversal).
    pub memory_passes: usize,
    /// `memory_passes · copy_ms`: what the transform's traffic alone costs.
    pub memory_floor_ms: f64,
    /// Measured device Fr multiplication rate (multiplications per second).
    pub fr_mul_per_s: f64,
    /// The n/2·log n butterfly multiplications at that rate.
    pub mul_floor_ms: f64,
}

/// Times the forward NTT at each size on a fresh stream: `runs` (at least 10) timed
/// launches after two warm-ups, CUDA events, median reported, for [`ntt`] (in place)
/// and [`ntt_with_scratch`], with the memory and multiplication floors (of [`ntt`])
/// measured on the same device.
pub fn bench_ntt(gpu: &Gpu, log_sizes: &[u32], runs: usize) -> Result<Vec<NttTiming>, CudaError> {
    let runs = runs.max(10);
    let stream = gpu.new_stream()?;
    let fr_mul_per_s = super::arith::fr_mul_rate(gpu, &stream, runs)?;
    let mut out = Vec::with_capacity(log_sizes.len());
    for &log_n in log_sizes {
        if log_n == 0 || log_n > MAX_LOG_N {
            return Err(CudaError::InvalidInput(format!(
                "bench size 2^{log_n} unsupported"
            )));
        }
        let n = 1usize << log_n;
        let mut data = gpu.alloc_async::<DevFr>(&stream, n)?;
        // The copy target, and ntt_with_scratch's scratch before the copies run.
        let mut copy = gpu.alloc_async::<DevFr>(&stream, n)?;
        // The uniform scalars `bench ntt` gives the sppark peer too: the time does not
        // depend on the values, but the two are compared on equal inputs.
        let host: Vec<DevFr> = super::msm::random_scalars(n, u64::from(log_n))
            .iter()
            .map(fr_to_dev)
            .collect();
        stream.memcpy_htod(&host, &mut data)?;
        // SAFETY: fills a live buffer on its stream (0x11 bytes: a reduced scalar).
        unsafe { result::memset_d8_async(copy.raw(), 0x11, n * 32, stream.cu_stream())? };
        let mut times = Vec::with_capacity(runs);
        for run in 0..runs + 2 {
            let ms = time_on_stream(gpu, &stream, || {
                ntt(gpu, &stream, &mut data, NttKind::Forward)
            })?;
            if run >= 2 {
                times.push(ms);
            }
        }
        let mut scratch_times = Vec::with_capacity(runs);
        for run in 0..runs + 2 {
            let ms = time_on_stream(gpu, &stream, || {
                ntt_with_scratch(gpu, &stream, &mut data, &mut copy, NttKind::Forward)
            })?;
            if run >= 2 {
                scratch_times.push(ms);
            }
        }
        let mut copies = Vec::with_capacity(runs);
        for run in 0..runs + 1 {
            let ms = time_on_stream(gpu, &stream, || {
                // SAFETY: both buffers hold n scalars and live on this stream.
                unsafe {
                    result::memcpy_dtod_async(copy.raw(), data.raw(), n * 32, stream.cu_stream())
                }
                .map_err(CudaError::from)
            })?;
            if run >= 1 {
                copies.push(ms);
            }
        }
        let median_ms = median(&mut times);
        let copy_ms = median(&mut copies);
        let passes = memory_passes(log_n);
        let muls = (n as f64 / 2.0) * f64::from(log_n);
        out.push(NttTiming {
            log_n,
            kind: NttKind::Forward,
            runs,
            median_ms,
            min_ms: times.first().copied().unwrap_or(0.0),
            max_ms: times.last().copied().unwrap_or(0.0),
            scratch_median_ms: median(&mut scratch_times),
            copy_ms,
            copy_gbps: if copy_ms > 0.0 {
                2.0 * (n * 32) as f64 / (copy_ms * 1e6)
            } else {
                0.0
            },
            memory_passes: passes,
            memory_floor_ms: passes as f64 * copy_ms,
            fr_mul_per_s,
            mul_floor_ms: if fr_mul_per_s > 0.0 {
                muls / fr_mul_per_s * 1e3
            } else {
                0.0
            },
        });
        data.free()?;
        copy.free()?;
        gpu.sync(&stream, "bench_ntt")?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ark_ff::Field;

    #[test]
    fn ntt_plan_covers_every_stage() {
        for log_n in 1..=MAX_LOG_N {
            let p = plan(log_n);
            assert_eq!(p.iter().map(|x| x.k).sum::<u32>(), log_n);
            let mut done = 0;
            for pass in &p {
                assert_eq!(pass.done, done);
                assert!(pass.k >= 1 && pass.k <= STAGES_PER_PASS && pass.k <= MAX_PASS_LOG);
                assert!(pass.k + pass.log_t <= TILE_LOG.max(pass.k));
                assert!(pass.log_t <= log_n - done - pass.k);
                done += pass.k;
            }
            assert_eq!(p.last().map(|x| x.log_t), Some(0));
        }
    }

    #[test]
    fn ntt_launches_fit_the_kernel_bounds() {
        for log_n in 1..=MAX_LOG_N {
            for pass in plan(log_n) {
                let cfg = dif_launch(log_n, pass);
                let (x, y, _) = cfg.block_dim;
                assert!(x * y <= MAX_BLOCK, "2^{log_n}: {x}x{y} threads");
                // Default dynamic shared memory limit, no opt-in attribute needed.
                assert!(cfg.shared_mem_bytes <= 48 << 10, "2^{log_n}");
                assert_eq!(cfg.shared_mem_bytes, (32 << (pass.k + pass.log_t)) * y);
                // The blocks' tiles cover the array exactly once.
                let tiles = u64::from(cfg.grid_dim.0) * u64::from(y);
                assert_eq!(tiles << (pass.k + pass.log_t), 1u64 << log_n, "2^{log_n}");
            }
        }
    }

    #[test]
    fn ntt_roots_are_consistent_with_arkworks() {
        // The kernels take w_{2^k} = w_{2^28}^(2^(28-k)); arkworks' domain of size 2^k
        // uses get_root_of_unity(2^k). They must agree for every k.
        let w = root(MAX_LOG_N).unwrap();
        for log in 0..=MAX_LOG_N {
            assert_eq!(
                w.pow([1u64 << (MAX_LOG_N - log)]),
                root(log).unwrap(),
                "2^{log}"
            );
        }
        let [hi, lo] = split_table(w);
        let t = 0x0ABC_DEF1u64 & ((1 << MAX_LOG_N) - 1);
        assert_eq!(
            hi[(t >> TW_SPLIT) as usize] * lo[(t & ((1 << TW_SPLIT) - 1)) as usize],
            w.pow([t])
        );
        assert_eq!(Fr::GENERATOR, Fr::from(7u64));
    }

    #[test]
    fn ntt_rejects_bad_sizes() {
        assert!(log_size(0).is_err());
        assert!(log_size(3).is_err());
        assert!(log_size(1 << 29).is_err());
        assert_eq!(log_size(1).unwrap(), 0);
        assert_eq!(log_size(1 << 26).unwrap(), 26);
    }

    #[test]
    fn ntt_median() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }
}
