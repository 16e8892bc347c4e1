//! `SimDevice`: a functional model of one GPU on the CPU, the embedded default wherever
//! there is no GPU.
//!
//! - VRAM is accounted per allocation with CUDA's semantics ([`Vram`]).
//! - Launches are asynchronous: a stage's simulated duration is queued on the stream's
//!   lane and `sync_stream` waits it out; device-global calls wait for every stream.
//! - Kernels compute on the CPU through arkworks, so its proofs are real.
//! - Faults can be injected at every allocation site and launch ([`FaultPlan`]).

use std::time::{Duration, Instant};

use super::host::{HostVec, LentMemory};
use super::split::{msm_ones, msm_split};
use super::vram::Vram;
use super::{
    AllocSite, AllocStrategy, Device, DeviceBG2, DeviceError, FaultPlan, Footprint, G1Results,
    MemInfo, PartitionInputs, ScalarClasses, Shape, Stage, WorkerId,
};
use crate::audit::Audit;
use crate::sync::{Arc, Mutex};
use crate::{Fr, ProvingKey};

pub use super::faults;
type G1 = ark_bls12_381::G1Projective;

/// Bytes per field element and per affine G1 point on the modelled device.
const FR_BYTES: u64 = 32;
const G1_AFFINE_BYTES: u64 = 96;
const G2_AFFINE_BYTES: u64 = 192;

/// Simulated durations of the GPU stages of one partition (zero: as fast as the CPU).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimTiming {
    pub upload: Duration,
    pub witness_map: Duration,
    /// Per MSM job (four per partition).
    pub msm: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimConfig {
    pub capacity: u64,
    pub strategy: AllocStrategy,
    /// Pool: bytes kept cached after completed frees (CUDA's default is 0).
    pub release_threshold: u64,
    pub timing: SimTiming,
    /// Streams the device gives before `create_stream` answers out of memory (a real
    /// driver's streams take device memory too); `None`: no limit.
    pub stream_limit: Option<usize>,
}

impl Default for SimConfig {
    /// An 80 GiB card with a stream-ordered pool and no simulated durations.
    fn default() -> Self {
        Self {
            capacity: 80 << 30,
            strategy: AllocStrategy::Pool,
            release_threshold: 0,
            timing: SimTiming::default(),
            stream_limit: None,
        }
    }
}

#[derive(Debug, Default)]
struct StreamState {
    owner: Option<WorkerId>,
    busy_until: Option<Instant>,
    /// Kernels launched and not yet observed by a sync.
    kernels_in_flight: usize,
}

#[derive(Debug)]
struct State {
    vram: Vram,
    streams: Vec<StreamState>,
    kernel_lane_free: Option<Instant>,
    copy_lane_free: Option<Instant>,
    /// Uploads so far, and how many of them read a, b, c from lent memory.
    uploads: usize,
    lent_uploads: usize,
}

#[derive(Debug)]
struct Inner {
    cfg: SimConfig,
    state: Mutex<State>,
    faults: FaultPlan,
    audit: Option<Arc<Audit>>,
}

/// Memory a [`SimDevice`] lends (see its `lend_host`).
struct SimLent(Vec<Fr>);

impl LentMemory for SimLent {
    fn frs(&self) -> &[Fr] {
        &self.0
    }
    fn frs_mut(&mut self) -> Result<&mut [Fr], DeviceError> {
        Ok(&mut self.0)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A simulated GPU. Cheap to clone (shared state).
#[derive(Clone, Debug)]
pub struct SimDevice {
    inner: Arc<Inner>,
}

/// A worker's stream on a [`SimDevice`].
#[derive(Debug)]
pub struct SimStream {
    id: usize,
    owner: WorkerId,
}

#[derive(Debug, Default)]
struct Data {
    a: Vec<Fr>,
    b: Vec<Fr>,
    c: Vec<Fr>,
    h: Vec<Fr>,
    classes: Arc<ScalarClasses>,
    aux_classes: Arc<ScalarClasses>,
    results: [Option<G1>; 4],
    b_g2: DeviceBG2,
}

/// A working set on a [`SimDevice`]: its accounted bytes and its modelled contents.
#[derive(Debug)]
pub struct SimWorkingSet {
    bytes: u64,
    uploaded: bool,
    data: Data,
}

/// A proving key resident on a [`SimDevice`]; its bytes are released on drop.
#[derive(Debug)]
pub struct SimKey {
    pk: Arc<ProvingKey>,
    bytes: u64,
    device: Arc<Inner>,
}

impl Drop for SimKey {
    fn drop(&mut self) {
        self.device.state.lock().vram.unreserve(self.bytes);
    }
}

impl SimDevice {
    pub fn new(cfg: SimConfig) -> Self {
        Self::build(cfg, FaultPlan::none(), None)
    }

    /// A device whose faults and audit are shared with the harness.
    pub fn build(cfg: SimConfig, faults: FaultPlan, audit: Option<Arc<Audit>>) -> Self {
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    vram: Vram::new(cfg.capacity, cfg.strategy, cfg.release_threshold),
                    streams: Vec::new(),
                    kernel_lane_free: None,
                    copy_lane_free: None,
                    uploads: 0,
                    lent_uploads: 0,
                }),
                cfg,
                faults,
                audit,
            }),
        }
    }

    pub fn config(&self) -> SimConfig {
        self.inner.cfg
    }

    /// Changes the modelled capacity (a squeeze, or another process taking VRAM).
    pub fn set_capacity(&self, capacity: u64) {
        self.inner.state.lock().vram.set_capacity(capacity);
    }

    /// Uploads so far, and how many read a, b, c from memory this device lent.
    pub fn uploads(&self) -> (usize, usize) {
        let st = self.inner.state.lock();
        (st.uploads, st.lent_uploads)
    }

    /// How many faults the device injected so far.
    pub fn faults_injected(&self) -> usize {
        self.inner.faults.injected()
    }

    /// The most bytes ever in use.
    pub fn peak_bytes(&self) -> u64 {
        self.inner.state.lock().vram.peak
    }

    /// Bytes still held by working sets (should be 0 after a batch: a leak otherwise).
    pub fn working_bytes(&self) -> u64 {
        self.inner.state.lock().vram.working_bytes()
    }

    /// Bytes a key's G1 bases take on the device.
    pub fn key_bytes(pk: &ProvingKey) -> u64 {
        let points = pk.h_query.len() + pk.l_query.len() + pk.a_query.len() + pk.b_g1_query.len();
        // B_G2's bases without the first (the device sums its ones).
        let g2 = pk.b_g2_query.len().saturating_sub(1) as u64;
        points as u64 * G1_AFFINE_BYTES + g2 * G2_AFFINE_BYTES
    }

    /// Queues `dur` of work on a lane of `stream`; returns at once (launches are async).
    fn queue(&self, stream: &SimStream, dur: Duration, copy_lane: bool, kernel: bool) {
        let mut st = self.inner.state.lock();
        if dur > Duration::ZERO {
            let now = Instant::now();
            let lane = if copy_lane {
                st.copy_lane_free
            } else {
                st.kernel_lane_free
            };
            let s = &st.streams[stream.id];
            let start = [Some(now), s.busy_until, lane]
                .into_iter()
                .flatten()
                .max()
                .unwrap_or(now);
            let end = start + dur;
            st.streams[stream.id].busy_until = Some(end);
            if copy_lane {
                st.copy_lane_free = Some(end);
            } else {
                st.kernel_lane_free = Some(end);
            }
        }
        if kernel {
            st.streams[stream.id].kernels_in_flight += 1;
        }
    }

    /// A device-global blocking call: audited, then waits for every stream's work.
    fn global_wait(&self, caller: &SimStream, what: &'static str) {
        let until = {
            let st = self.inner.state.lock();
            if let Some(audit) = &self.inner.audit {
                let busy = st
                    .streams
                    .iter()
                    .enumerate()
                    .filter(|(i, s)| *i != caller.id && s.kernels_in_flight > 0)
                    .filter_map(|(_, s)| s.owner)
                    .collect();
                audit.global_call(caller.owner, what, busy);
            }
            st.streams.iter().filter_map(|s| s.busy_until).max()
        };
        sleep_until(until);
        let mut st = self.inner.state.lock();
        for id in 0..st.streams.len() {
            st.streams[id].kernels_in_flight = 0;
            st.vram.stream_synced(id);
        }
    }

    fn launch(&self, stream: &SimStream, stage: Stage) -> Result<(), DeviceError> {
        if self.inner.faults.on_launch(stage) {
            return Err(DeviceError::Kernel {
                stage,
                reason: "injected fault".into(),
            });
        }
        let t = self.inner.cfg.timing;
        let (dur, copy) = match stage {
            Stage::Upload => (t.upload, true),
            Stage::WitnessMap => (t.witness_map, false),
            _ => (t.msm, false),
        };
        self.queue(stream, dur, copy, stage != Stage::Upload);
        Ok(())
    }
}

fn sleep_until(t: Option<Instant>) {
    if let Some(t) = t {
        let now = Instant::now();
        if t > now {
            crate::sync::sleep(t - now);
        }
    }
}

impl Device for SimDevice {
    type Stream = SimStream;
    type WorkingSet = SimWorkingSet;
    type Key = SimKey;

    fn describe(&self) -> String {
        let c = &self.inner.cfg;
        format!(
            "sim ({:.1} GiB, {})",
            c.capacity as f64 / (1u64 << 30) as f64,
            c.strategy
        )
    }

    fn strategy(&self) -> AllocStrategy {
        self.inner.cfg.strategy
    }

    fn memory(&self) -> Result<MemInfo, DeviceError> {
        let st = self.inner.state.lock();
        Ok(MemInfo {
            free: st.vram.free(),
            total: st.vram.capacity,
        })
    }

    fn create_stream(&self, owner: WorkerId) -> Result<SimStream, DeviceError> {
        let mut st = self.inner.state.lock();
        if self
            .inner
            .cfg
            .stream_limit
            .is_some_and(|limit| st.streams.len() >= limit)
        {
            return Err(DeviceError::Oom {
                requested: 0,
                free: st.vram.free(),
            });
        }
        st.streams.push(StreamState {
            owner: Some(owner),
            ..Default::default()
        });
        Ok(SimStream {
            id: st.streams.len() - 1,
            owner,
        })
    }

    fn load_key(&self, pk: &Arc<ProvingKey>) -> Result<SimKey, DeviceError> {
        let bytes = Self::key_bytes(pk);
        self.inner.state.lock().vram.reserve(bytes)?;
        Ok(SimKey {
            pk: pk.clone(),
            bytes,
            device: self.inner.clone(),
        })
    }

    /// Heap memory standing in for the CUDA device's page-locked memory, so that the
    /// prover's lent path (the spare buffers carried across partitions) runs here too.
    fn lend_host(&self, len: usize) -> Result<Option<HostVec>, DeviceError> {
        Ok(Some(HostVec::lent(Box::new(SimLent(vec![
            Fr::from(0u64);
            len
        ])))))
    }

    fn working_set_bytes(&self, shape: &Shape, footprint: Footprint) -> u64 {
        let n = shape.domain_size as u64;
        let s = shape.num_scalars as u64;
        match footprint {
            // a, b, c (h in place of a), the scalars, and Pippenger scratch per scalar.
            Footprint::Full => (3 * n + 2 * s.max(n)) * FR_BYTES,
            // Two transform buffers (the witness map can run a·b first, then c) and MSM
            // scalars plus scratch for one chunk of an eighth of the scalars.
            Footprint::Chunked => (2 * n + 2 * (s.max(n) / 8).max(1)) * FR_BYTES,
        }
    }

    fn reserve_arena(&self, slot_bytes: u64, slots: usize) -> Result<usize, DeviceError> {
        if self.inner.cfg.strategy != AllocStrategy::Arena {
            return Ok(0);
        }
        Ok(self
            .inner
            .state
            .lock()
            .vram
            .reserve_arena(slot_bytes, slots))
    }

    fn release_arena(&self) -> Result<(), DeviceError> {
        self.inner.state.lock().vram.release_arena();
        Ok(())
    }

    fn alloc(
        &self,
        stream: &SimStream,
        shape: &Shape,
        footprint: Footprint,
        site: AllocSite,
    ) -> Result<SimWorkingSet, DeviceError> {
        let bytes = self.working_set_bytes(shape, footprint);
        let mut st = self.inner.state.lock();
        if bytes > st.vram.capacity {
            return Err(DeviceError::TooLarge {
                needed: bytes,
                total: st.vram.capacity,
            });
        }
        if self.inner.faults.on_alloc(site) {
            return Err(DeviceError::Oom {
                requested: bytes,
                free: st.vram.free(),
            });
        }
        st.vram.alloc(stream.id, bytes)?;
        if let Some(a) = &self.inner.audit {
            a.memory(st.vram.in_use(), st.vram.capacity);
        }
        Ok(SimWorkingSet {
            bytes,
            uploaded: false,
            data: Data::default(),
        })
    }

    fn free(&self, stream: &SimStream, ws: SimWorkingSet) -> Result<(), DeviceError> {
        match self.inner.cfg.strategy {
            // cudaFree synchronizes the device before it returns the memory.
            AllocStrategy::Sync => {
                self.global_wait(stream, "cudaFree");
                self.inner.state.lock().vram.free_ws(stream.id, ws.bytes);
            }
            // cudaFreeAsync, then a sync of this stream alone completes the free.
            AllocStrategy::Pool => {
                self.inner.state.lock().vram.free_ws(stream.id, ws.bytes);
                self.sync_stream(stream)?;
            }
            AllocStrategy::Arena => self.inner.state.lock().vram.free_ws(stream.id, ws.bytes),
        }
        Ok(())
    }

    fn upload(
        &self,
        stream: &SimStream,
        ws: &mut SimWorkingSet,
        inputs: &PartitionInputs,
    ) -> Result<(), DeviceError> {
        self.launch(stream, Stage::Upload)?;
        {
            let mut st = self.inner.state.lock();
            st.uploads += 1;
            let ours = |v: &HostVec| v.lent_as::<SimLent>().is_some();
            if ours(&inputs.a) && ours(&inputs.b) && ours(&inputs.c) {
                st.lent_uploads += 1;
            }
        }
        ws.data = Data {
            a: inputs.a.to_vec(),
            b: inputs.b.to_vec(),
            c: inputs.c.to_vec(),
            h: Vec::new(),
            classes: inputs.classes.clone(),
            aux_classes: inputs.aux_classes.clone(),
            results: [None; 4],
            b_g2: DeviceBG2::None,
        };
        ws.uploaded = true;
        Ok(())
    }

    fn witness_map(&self, stream: &SimStream, ws: &mut SimWorkingSet) -> Result<(), DeviceError> {
        if !ws.uploaded {
            return Err(DeviceError::InvalidInput(
                "witness map on a working set that was never uploaded".into(),
            ));
        }
        self.launch(stream, Stage::WitnessMap)?;
        let d = &mut ws.data;
        let (a, b, c) = (
            std::mem::take(&mut d.a),
            std::mem::take(&mut d.b),
            std::mem::take(&mut d.c),
        );
        d.h = crate::reference::witness_map_from_evaluations(a, b, c);
        Ok(())
    }

    fn msm(
        &self,
        stream: &SimStream,
        ws: &mut SimWorkingSet,
        key: &SimKey,
        job: Stage,
    ) -> Result<(), DeviceError> {
        let slot = Stage::MSMS
            .iter()
            .position(|&s| s == job)
            .ok_or_else(|| DeviceError::InvalidInput(format!("{job:?} is not an MSM job")))?;
        if !ws.uploaded {
            return Err(DeviceError::InvalidInput(
                "MSM on a working set that was never uploaded".into(),
            ));
        }
        self.launch(stream, job)?;
        let (pk, d) = (&key.pk, &mut ws.data);
        let skip_first = |q: &[ark_bls12_381::G1Affine]| q.get(1..).unwrap_or(&[]).to_vec();
        let result = match job {
            Stage::MsmH => {
                let big: Vec<_> =
                    d.h.iter()
                        .map(|x| ark_ff::PrimeField::into_bigint(*x))
                        .collect();
                <G1 as ark_ec::VariableBaseMSM>::msm_bigint(&pk.h_query, &big)
            }
            Stage::MsmL => msm_split::<G1>(&pk.l_query, &d.aux_classes),
            Stage::MsmA => msm_split::<G1>(&skip_first(&pk.a_query), &d.classes),
            _ => {
                // B_G2's ones beside B_G1 (same scalars), the CPU finish adding the
                // others: the GPU computes all of it, so the simulated device keeps
                // the finish's other path under test.
                let b_g2 = pk.b_g2_query.get(1..).unwrap_or(&[]);
                d.b_g2 = DeviceBG2::Ones(msm_ones(b_g2, &d.classes));
                msm_split::<G1>(&skip_first(&pk.b_g1_query), &d.classes)
            }
        };
        d.results[slot] = Some(result);
        Ok(())
    }

    fn sync_stream(&self, stream: &SimStream) -> Result<(), DeviceError> {
        let until = self.inner.state.lock().streams[stream.id].busy_until;
        sleep_until(until);
        let mut st = self.inner.state.lock();
        st.streams[stream.id].kernels_in_flight = 0;
        st.vram.stream_synced(stream.id);
        Ok(())
    }

    fn results(&self, _stream: &SimStream, ws: &SimWorkingSet) -> Result<G1Results, DeviceError> {
        let r = &ws.data.results;
        let get = |i: usize| {
            r[i].ok_or_else(|| {
                DeviceError::InvalidInput(format!("{} was never run", Stage::MSMS[i].name()))
            })
        };
        Ok(G1Results {
            b_g2: ws.data.b_g2,
            h: get(0)?,
            l: get(1)?,
            a: get(2)?,
            b_g1: get(3)?,
        })
    }

    fn sync_device(&self, caller: &SimStream) -> Result<(), DeviceError> {
        self.global_wait(caller, "cudaDeviceSynchronize");
        Ok(())
    }

    fn trim_pool(&self, caller: &SimStream) -> Result<(), DeviceError> {
        self.global_wait(caller, "cudaMemPoolTrimTo");
        self.inner.state.lock().vram.trim();
        Ok(())
    }

    fn outstanding_bytes(&self, stream: &SimStream) -> u64 {
        self.inner.state.lock().vram.outstanding(stream.id)
    }

    #[cfg(any(twolock_loom, feature = "bad-designs"))]
    fn flawed_alloc_unchecked(
        &self,
        stream: &SimStream,
        shape: &Shape,
    ) -> Result<SimWorkingSet, DeviceError> {
        let bytes = self.working_set_bytes(shape, Footprint::Full);
        let mut st = self.inner.state.lock();
        st.vram.alloc_unchecked(stream.id, bytes);
        if let Some(a) = &self.inner.audit {
            a.memory(st.vram.in_use(), st.vram.capacity);
        }
        Ok(SimWorkingSet {
            bytes,
            uploaded: false,
            data: Data::default(),
        })
    }

    #[cfg(any(twolock_loom, feature = "bad-designs"))]
    fn flawed_free_unsynced(
        &self,
        stream: &SimStream,
        ws: SimWorkingSet,
    ) -> Result<(), DeviceError> {
        self.inner.state.lock().vram.free_ws(stream.id, ws.bytes);
        Ok(())
    }
}
