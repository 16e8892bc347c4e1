//! The device abstraction the prover pipeline runs on.
//!
//! A [`Device`] is one GPU: memory under a chosen [`AllocStrategy`], per-worker
//! [`Device::Stream`]s, the prover's stages as launches on a stream, and the two
//! device-global operations whose misuse under the mem lock sank the field's two-lock
//! attempt. [`sim::SimDevice`] models a GPU on the CPU; `cuda::CudaDevice` (feature
//! `cuda`) is the real one. The pipeline in `crate::prover` is written only against
//! this trait, so the loom models check the same protocol code that drives the H200.

pub mod faults;
pub use faults::FaultPlan;
pub mod host;
pub use host::HostVec;
pub mod sim;
pub mod split;
pub mod vram;

#[cfg(feature = "cuda")]
pub mod cuda;

use serde::Serialize;
use thiserror::Error;

use crate::sync::Arc;
use crate::ProvingKey;
pub use split::ScalarClasses;

type G1 = ark_bls12_381::G1Projective;

/// How a device obtains the VRAM of a working set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum AllocStrategy {
    /// `cudaMalloc` / `cudaFree`: memory is back at the device when free returns,
    /// but free is device-synchronizing.
    Sync,
    /// `cudaMallocAsync` / `cudaFreeAsync` on a memory pool: a free completes in stream
    /// order and its bytes return to the device only at a sync of that stream (release
    /// threshold 0) or a pool trim.
    Pool,
    /// Slots preallocated once per batch; alloc and free take and return a slot.
    Arena,
}

impl std::fmt::Display for AllocStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Sync => "sync",
            Self::Pool => "pool",
            Self::Arena => "arena",
        })
    }
}

/// Free and total device memory, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct MemInfo {
    pub free: u64,
    pub total: u64,
}

/// The protocol's allocation sites; fault injection names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AllocSite {
    /// Pre-stage, under the mem lock.
    PreStage,
    /// Fallback, under the compute lock, full footprint.
    Fallback,
    /// Fallback, under the compute lock, chunked footprint.
    FallbackChunked,
}

/// The prover's GPU stages (fault injection and the timeline name them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    Upload,
    WitnessMap,
    MsmH,
    MsmL,
    MsmA,
    MsmBG1,
}

impl Stage {
    /// The four G1 MSM jobs, in launch order.
    pub const MSMS: [Stage; 4] = [Stage::MsmH, Stage::MsmL, Stage::MsmA, Stage::MsmBG1];
    pub fn name(self) -> &'static str {
        match self {
            Stage::Upload => "upload",
            Stage::WitnessMap => "witness_map",
            Stage::MsmH => "msm_h",
            Stage::MsmL => "msm_l",
            Stage::MsmA => "msm_a",
            Stage::MsmBG1 => "msm_b_g1",
        }
    }
}

/// How much of a partition's data a working set holds at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Footprint {
    /// a, b, c, all MSM scalars and the MSM scratch together.
    Full,
    /// a, b, c and scratch for one MSM chunk: the fallback for a small card.
    Chunked,
}

/// The sizes of one partition, which fix its working set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Shape {
    /// QAP domain size n (a, b, c and h have n entries).
    pub domain_size: usize,
    /// Number of MSM scalars for the A and B queries: z without its leading one.
    pub num_scalars: usize,
    /// Number of aux (witness) scalars, the L query's length.
    pub num_aux: usize,
}

/// Which worker a stream or a lock hold belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct WorkerId {
    pub device: usize,
    pub worker: usize,
}

impl std::fmt::Display for WorkerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "dev{}/w{}", self.device, self.worker)
    }
}

/// What the CPU prep hands to the device for one partition.
#[derive(Clone, Debug, Default)]
pub struct PartitionInputs {
    /// A·z, B·z, C·z over the domain (in memory the device lent, where it did).
    pub a: HostVec,
    pub b: HostVec,
    pub c: HostVec,
    /// 0 / 1 / other classification of z without its leading one, inputs then aux (the
    /// A and B queries' scalars), made by the CPU prep in the form the device uploads.
    pub classes: Arc<ScalarClasses>,
    /// The same of the aux part alone (the L query's scalars).
    pub aux_classes: Arc<ScalarClasses>,
}

/// What the device computed of B_G2 = Σ_i b_i·b_g2_query[1 + i], alongside B_G1 (same
/// scalars); the CPU finish computes the rest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceBG2 {
    /// Nothing: the CPU runs B_G2's whole split MSM.
    #[default]
    None,
    /// The sum over the scalars equal to one (a batch addition on B_G1's ones); the CPU
    /// adds the others' MSM.
    Ones(ark_bls12_381::G2Projective),
    /// All of B_G2: the ones, plus the others' Pippenger on B_G1's sorted digits.
    Whole(ark_bls12_381::G2Projective),
}

/// The four G1 MSM results the device returns, plus what it computed of B_G2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct G1Results {
    pub b_g2: DeviceBG2,
    pub h: G1,
    pub l: G1,
    pub a: G1,
    pub b_g1: G1,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DeviceError {
    #[error("out of device memory: requested {requested} bytes, {free} free")]
    Oom { requested: u64, free: u64 },
    #[error("kernel {stage:?} failed: {reason}")]
    Kernel { stage: Stage, reason: String },
    #[error("driver error: {0}")]
    Driver(String),
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("no such device: {0}")]
    NoDevice(String),
    #[error(
        "working set too large for this device: needs {needed} bytes, device has {total} in all"
    )]
    TooLarge { needed: u64, total: u64 },
}

impl DeviceError {
    /// Whether a failed allocation may succeed later or with a smaller footprint.
    pub fn is_oom(&self) -> bool {
        matches!(self, DeviceError::Oom { .. })
    }
}

/// One GPU, as the pipeline sees it. Call-order contract, per partition and stream:
/// `alloc` → `upload` → `witness_map` → `msm` ×4 → `sync_stream` → `results` → `free`.
/// Every method returns errors as values; none panics on bad input.
pub trait Device: Send + Sync + 'static {
    /// A worker's queue(s) of device work (compute and upload lanes).
    type Stream: Send + 'static;
    /// Device memory for one partition.
    type WorkingSet: Send + 'static;
    /// A proving key's bases, resident on the device.
    type Key: Send + Sync + 'static;

    /// Human-readable name, e.g. "sim (80 GiB, pool)" or "NVIDIA H200".
    fn describe(&self) -> String;
    fn strategy(&self) -> AllocStrategy;
    fn memory(&self) -> Result<MemInfo, DeviceError>;
    fn create_stream(&self, owner: WorkerId) -> Result<Self::Stream, DeviceError>;
    /// Uploads a key's G1 bases once; all partitions of a batch share it.
    fn load_key(&self, pk: &Arc<ProvingKey>) -> Result<Self::Key, DeviceError>;
    /// Host memory for `len` elements of a partition's a, b or c that this device
    /// uploads without a host copy (page-locked), lent before a batch; None where it
    /// has none to lend, and the prep writes the heap.
    fn lend_host(&self, _len: usize) -> Result<Option<HostVec>, DeviceError> {
        Ok(None)
    }
    /// Bytes a working set of `shape` needs under `footprint`.
    fn working_set_bytes(&self, shape: &Shape, footprint: Footprint) -> u64;
    /// Arena strategy only: preallocates up to `slots` slots of `slot_bytes`; returns
    /// how many fit. Other strategies return 0 and allocate on demand.
    fn reserve_arena(&self, slot_bytes: u64, slots: usize) -> Result<usize, DeviceError>;
    /// Releases the arena's slots (end of batch).
    fn release_arena(&self) -> Result<(), DeviceError>;

    /// Never blocks on other streams' work.
    fn alloc(
        &self,
        stream: &Self::Stream,
        shape: &Shape,
        footprint: Footprint,
        site: AllocSite,
    ) -> Result<Self::WorkingSet, DeviceError>;
    /// Frees a working set so its bytes are available to the next `alloc` when this
    /// returns (for `Pool`: stream-ordered free, then a sync of this stream only).
    /// For `Sync`, this is `cudaFree`, which is device-synchronizing: call it only where
    /// no other worker can be starved by it (under compute).
    fn free(&self, stream: &Self::Stream, ws: Self::WorkingSet) -> Result<(), DeviceError>;
    /// Starts the upload of a, b, c and the scalars on the stream's upload lane.
    fn upload(
        &self,
        stream: &Self::Stream,
        ws: &mut Self::WorkingSet,
        inputs: &PartitionInputs,
    ) -> Result<(), DeviceError>;
    /// h from a, b, c (the seven transforms and the pointwise steps), in place.
    fn witness_map(
        &self,
        stream: &Self::Stream,
        ws: &mut Self::WorkingSet,
    ) -> Result<(), DeviceError>;
    /// One G1 MSM job (batch addition for ones, Pippenger for the rest). The B_G1 job
    /// may also compute B_G2, or its ones (see [`DeviceBG2`]).
    fn msm(
        &self,
        stream: &Self::Stream,
        ws: &mut Self::WorkingSet,
        key: &Self::Key,
        job: Stage,
    ) -> Result<(), DeviceError>;
    /// Waits for this stream's own work only.
    fn sync_stream(&self, stream: &Self::Stream) -> Result<(), DeviceError>;
    /// Downloads the MSM results (after `sync_stream`).
    fn results(
        &self,
        stream: &Self::Stream,
        ws: &Self::WorkingSet,
    ) -> Result<G1Results, DeviceError>;
    /// Device-global: waits for every stream's work (`cudaDeviceSynchronize`).
    /// `caller` attributes the call for the audit.
    fn sync_device(&self, caller: &Self::Stream) -> Result<(), DeviceError>;
    /// Device-global: returns pool-cached bytes to the device (`cudaMemPoolTrimTo`).
    fn trim_pool(&self, caller: &Self::Stream) -> Result<(), DeviceError>;
    /// Bytes this stream still holds: live working sets plus frees not yet completed.
    fn outstanding_bytes(&self, stream: &Self::Stream) -> u64;

    /// Test-only flaw hook: a pre-stage allocation that ignores free memory. Production
    /// code never calls it (see `prover::flaws`); devices without the flaw allocate.
    #[doc(hidden)]
    fn flawed_alloc_unchecked(
        &self,
        stream: &Self::Stream,
        shape: &Shape,
    ) -> Result<Self::WorkingSet, DeviceError> {
        self.alloc(stream, shape, Footprint::Full, AllocSite::PreStage)
    }
    /// Test-only flaw hook: a stream-ordered free without the sync that completes it.
    #[doc(hidden)]
    fn flawed_free_unsynced(
        &self,
        stream: &Self::Stream,
        ws: Self::WorkingSet,
    ) -> Result<(), DeviceError> {
        self.free(stream, ws)
    }
}
