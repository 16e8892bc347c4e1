//! The two-lock prover pipeline: W workers per device over N devices, pulling
//! partitions from one queue, each running the lock protocol of `protocol`.

pub mod flaws;
pub mod gantt;
pub mod locks;
pub mod prep;
mod protocol;
pub mod timeline;

use std::time::Duration;

use ark_std::UniformRand;
use rand::SeedableRng;
use thiserror::Error;

use crate::audit::{Audit, LockKind};
use crate::circuits::{CircuitError, ConstraintMatrices};
use crate::device::{Device, DeviceError, PartitionInputs, Shape, WorkerId};
use crate::reference::ReferenceError;
use crate::sync::atomic::{AtomicUsize, Ordering};
use crate::sync::{thread, Arc, Mutex};
use crate::{Fr, Proof, ProvingKey};
pub use flaws::Flaw;
pub use locks::{LockMode, Locks};
use timeline::{Phase, Timeline};

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ProveError {
    #[error("device {device}: {source}")]
    Device {
        device: usize,
        #[source]
        source: DeviceError,
    },
    #[error(
        "timed out after {waited:?} waiting for the {lock:?} lock held by {holder:?} ({holders})"
    )]
    LockTimeout {
        lock: LockKind,
        waited: Duration,
        holder: Option<WorkerId>,
        holders: String,
    },
    #[error("the witness does not satisfy constraint {constraint}")]
    Unsatisfied { constraint: usize },
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("{0}")]
    Reference(String),
    #[error("no device could load the key: {0}")]
    NoDevice(String),
    #[error("worker for partition {partition} stopped before finishing it")]
    Abandoned { partition: usize },
}

impl From<DeviceError> for ProveError {
    fn from(source: DeviceError) -> Self {
        // The device index is filled in by the worker (see `Worker::tag`).
        ProveError::Device {
            device: usize::MAX,
            source,
        }
    }
}

impl From<locks::Timeout> for ProveError {
    fn from(t: locks::Timeout) -> Self {
        ProveError::LockTimeout {
            lock: t.lock,
            waited: t.waited,
            holder: t.holder,
            holders: t.holders,
        }
    }
}

impl From<ReferenceError> for ProveError {
    fn from(e: ReferenceError) -> Self {
        match e {
            ReferenceError::WitnessLength { expected, got } => ProveError::InvalidInput(format!(
                "witness has {got} values, the circuit needs {expected}"
            )),
            other => ProveError::Reference(other.to_string()),
        }
    }
}

impl From<CircuitError> for ProveError {
    fn from(e: CircuitError) -> Self {
        ProveError::InvalidInput(e.to_string())
    }
}

/// How the pipeline runs.
#[derive(Clone, Debug)]
pub struct PipelineConfig {
    pub workers_per_device: usize,
    pub mode: LockMode,
    /// Bound on every lock wait; a timeout is an error that names the holders.
    pub lock_timeout: Duration,
    /// Simulation knob for benchmarks on SimDevice: extra CPU time added to each
    /// partition's prep, to model a production-sized CPU critical path. Zero by default.
    pub sim_cpu_prep: Duration,
    /// Page-locked host memory the batch may borrow from its devices for the workers'
    /// a, b, c (3 · domain · 32 bytes a worker, over all devices). A worker past it
    /// prepares on the heap and uploads through staging, one copy slower, so that a
    /// big domain cannot lock most of the host's RAM. Default: a quarter of the RAM.
    pub max_lent_host_bytes: u64,
    /// Test builds only: run a known-bad lock design.
    #[cfg(any(twolock_loom, feature = "bad-designs"))]
    pub flaw: Option<Flaw>,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            workers_per_device: 3,
            mode: LockMode::Two,
            lock_timeout: Duration::from_secs(600),
            sim_cpu_prep: Duration::ZERO,
            max_lent_host_bytes: host_ram_bytes().map_or(u64::MAX, |ram| ram / 4),
            #[cfg(any(twolock_loom, feature = "bad-designs"))]
            flaw: None,
        }
    }
}

/// The host's RAM (Linux: `MemTotal` in /proc/meminfo); None where it cannot be read.
/// Read once: every `PipelineConfig::default()` asks (a loom model, once an iteration).
fn host_ram_bytes() -> Option<u64> {
    static RAM: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *RAM.get_or_init(|| {
        let info = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    })
}

/// Partitions that share one proving key and constraint system, with their r and s.
#[derive(Debug)]
pub struct Batch {
    pub pk: Arc<ProvingKey>,
    pub matrices: Arc<ConstraintMatrices>,
    /// Full assignments [1, inputs…, aux…], one per partition.
    pub partitions: Vec<Vec<Fr>>,
    pub rs: Vec<(Fr, Fr)>,
}

/// Where each partition's blinding r and s come from.
#[derive(Clone, Debug)]
pub enum RsSource {
    /// Drawn from a ChaCha RNG with this seed, in partition order.
    Seeded(u64),
    /// Given explicitly, one pair per partition.
    Fixed(Vec<(Fr, Fr)>),
}

impl RsSource {
    pub fn draw(&self, n: usize) -> Result<Vec<(Fr, Fr)>, ProveError> {
        match self {
            RsSource::Seeded(seed) => {
                let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(*seed);
                Ok((0..n)
                    .map(|_| (Fr::rand(&mut rng), Fr::rand(&mut rng)))
                    .collect())
            }
            RsSource::Fixed(v) if v.len() == n => Ok(v.clone()),
            RsSource::Fixed(v) => Err(ProveError::InvalidInput(format!(
                "{} (r, s) pairs for {n} partitions",
                v.len()
            ))),
        }
    }
}

impl Batch {
    pub fn new(
        pk: Arc<ProvingKey>,
        matrices: Arc<ConstraintMatrices>,
        partitions: Vec<Vec<Fr>>,
        rs: &RsSource,
    ) -> Result<Self, ProveError> {
        let rs = rs.draw(partitions.len())?;
        Ok(Self {
            pk,
            matrices,
            partitions,
            rs,
        })
    }
}

/// What a batch produced.
#[derive(Debug)]
pub struct BatchRun {
    /// One result per partition, in partition order.
    pub results: Vec<Result<Proof, ProveError>>,
    pub fallbacks: usize,
    pub timeline: Arc<Timeline>,
    pub wall: Duration,
    /// Whether both locks of every device were free once the workers were done.
    pub locks_released: bool,
}

// Boxed inside the Arc: loom's Arc cannot unsize-coerce to a trait object.
type Progress = Arc<Box<dyn Fn() + Send + Sync>>;

/// A device's context and the handles of its worker threads.
type StartedDevice<D> = (Arc<DeviceCtx<D>>, Vec<thread::JoinHandle<()>>);

/// State all workers share for one batch.
struct Shared {
    batch: Arc<Batch>,
    cfg: PipelineConfig,
    next: AtomicUsize,
    results: Mutex<Vec<Option<Result<Proof, ProveError>>>>,
    fallbacks: AtomicUsize,
    timeline: Arc<Timeline>,
    progress: Option<Progress>,
    /// One CPU prep at a time, each on every core (see `protocol::prove_partition`).
    prep_gate: Mutex<()>,
    /// Each worker's host buffers once it is done, freed only after every worker is:
    /// freeing page-locked memory stalled another worker's upload by 36–83 ms (H100).
    spares: Mutex<Vec<PartitionInputs>>,
}

impl Shared {
    fn count_fallback(&self) {
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
    }
}

/// One device's share: its locks, the key resident on it, the working-set shape.
struct DeviceCtx<D: Device> {
    index: usize,
    device: Arc<D>,
    locks: Locks,
    key: D::Key,
    shape: Shape,
}

/// A worker thread's context.
struct Worker<D: Device> {
    who: WorkerId,
    stream: D::Stream,
    dev: Arc<DeviceCtx<D>>,
    shared: Arc<Shared>,
    /// Host buffers for the first prep: a, b, c in memory the device lent, if it did.
    lent: Option<PartitionInputs>,
}

impl<D: Device> Worker<D> {
    /// Takes one of this device's locks, recording the wait and (on drop) the hold.
    fn lock<'a>(
        &'a self,
        i: usize,
        kind: LockKind,
        outstanding: Option<&'a (dyn Fn() -> u64 + 'a)>,
    ) -> Result<locks::Held<'a>, ProveError> {
        let t = &self.shared.timeline;
        let lock = match kind {
            LockKind::Mem => &self.dev.locks.mem,
            LockKind::Compute => &self.dev.locks.compute,
        };
        let start = t.now_us();
        let held = lock.acquire(self.who, outstanding);
        let (wait, hold) = match kind {
            LockKind::Mem => (Phase::MemWait, Phase::MemHold),
            LockKind::Compute => (Phase::ComputeWait, Phase::ComputeHold),
        };
        t.record(i, self.who, wait, start);
        Ok(held?.with_span(t.clone(), i, hold))
    }

    fn run(mut self) {
        let n = self.shared.batch.partitions.len();
        let mut spare = self.lent.take();
        loop {
            // Each index is handed out exactly once.
            let i = self.shared.next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                break;
            }
            let result = protocol::prove_partition(&self, i, &mut spare).map_err(|e| self.tag(e));
            if let Err(e) = &result {
                tracing::warn!(partition = i, worker = %self.who, "partition failed: {e}");
            }
            self.shared.results.lock()[i] = Some(result);
            if let Some(p) = &self.shared.progress {
                p();
            }
        }
        self.shared.spares.lock().extend(spare);
    }

    fn tag(&self, e: ProveError) -> ProveError {
        match e {
            ProveError::Device { source, .. } => ProveError::Device {
                device: self.dev.index,
                source,
            },
            other => other,
        }
    }
}

/// The pipeline over a set of devices.
pub struct Pipeline<D: Device> {
    devices: Vec<Arc<D>>,
    cfg: PipelineConfig,
    audit: Option<Arc<Audit>>,
    progress: Option<Progress>,
}

impl<D: Device> Pipeline<D> {
    pub fn new(devices: Vec<D>, cfg: PipelineConfig) -> Self {
        Self {
            devices: devices.into_iter().map(Arc::new).collect(),
            cfg,
            audit: None,
            progress: None,
        }
    }

    /// Reports lock holds to `audit` (share it with the devices).
    pub fn with_audit(mut self, audit: Arc<Audit>) -> Self {
        self.audit = Some(audit);
        self
    }

    /// Calls `f` once per finished partition (progress bars).
    pub fn with_progress(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.progress = Some(Arc::new(Box::new(f)));
        self
    }

    pub fn devices(&self) -> &[Arc<D>] {
        &self.devices
    }

    /// Proves every partition of `batch`; every result is a proof or a typed error.
    pub fn prove_batch(&self, batch: Arc<Batch>) -> BatchRun {
        self.prove_batch_with(batch, Arc::new(Timeline::new()))
    }

    /// As [`Self::prove_batch`], recording into `timeline` (a disabled one records nothing).
    pub fn prove_batch_with(&self, batch: Arc<Batch>, timeline: Arc<Timeline>) -> BatchRun {
        let start = std::time::Instant::now();
        let n = batch.partitions.len();
        let shared = Arc::new(Shared {
            batch: batch.clone(),
            cfg: self.cfg.clone(),
            next: AtomicUsize::new(0),
            results: Mutex::new((0..n).map(|_| None).collect()),
            fallbacks: AtomicUsize::new(0),
            timeline: timeline.clone(),
            progress: self.progress.clone(),
            prep_gate: Mutex::new(()),
            spares: Mutex::new(Vec::new()),
        });
        let mut handles = Vec::new();
        let mut contexts = Vec::new();
        let mut load_errors = Vec::new();
        let mut lend_budget = self.cfg.max_lent_host_bytes;
        for (index, device) in self.devices.iter().enumerate() {
            match self.start_device(index, device, &shared, &mut lend_budget) {
                Ok((ctx, mut h)) => {
                    contexts.push(ctx);
                    handles.append(&mut h);
                }
                // A device error here still carries the placeholder index: name it once.
                Err(ProveError::Device { source, .. }) => {
                    load_errors.push(format!("device {index}: {source}"))
                }
                Err(e) => load_errors.push(format!("device {index}: {e}")),
            }
        }
        for h in handles {
            let _ = h.join();
        }
        drop(std::mem::take(&mut *shared.spares.lock()));
        let locks_released = contexts.iter().all(|c| c.locks.both_free());
        drop(contexts);
        for device in &self.devices {
            let _ = device.release_arena();
        }
        let results = shared
            .results
            .lock()
            .iter_mut()
            .enumerate()
            .map(|(partition, r)| {
                r.take().unwrap_or_else(|| {
                    Err(if load_errors.len() == self.devices.len() {
                        ProveError::NoDevice(load_errors.join("; "))
                    } else {
                        ProveError::Abandoned { partition }
                    })
                })
            })
            .collect();
        BatchRun {
            results,
            fallbacks: shared.fallbacks.load(Ordering::Relaxed),
            timeline,
            wall: start.elapsed(),
            locks_released,
        }
    }

    fn start_device(
        &self,
        index: usize,
        device: &Arc<D>,
        shared: &Arc<Shared>,
        lend_budget: &mut u64,
    ) -> Result<StartedDevice<D>, ProveError> {
        let shape = prep::shape(&shared.batch.matrices)?;
        let key = device.load_key(&shared.batch.pk)?;
        let slot = device.working_set_bytes(&shape, crate::device::Footprint::Full);
        device.reserve_arena(slot, self.cfg.workers_per_device)?;
        let dev = Arc::new(DeviceCtx {
            index,
            device: device.clone(),
            locks: Locks::new(self.audit.clone(), self.cfg.lock_timeout),
            key,
            shape,
        });
        // Every worker's stream before any worker starts: a device that cannot give one
        // fails whole, with no worker left running on it past the batch (holding its key).
        let streams = (0..self.cfg.workers_per_device.max(1))
            .map(|worker| {
                let who = WorkerId {
                    device: index,
                    worker,
                };
                device.create_stream(who).map(|stream| (who, stream))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Each worker's a, b, c in memory the device lends (page-locked: uploaded with
        // no host copy), made here so that the batch's ramp-up does not pin it; as many
        // workers as the lending budget covers.
        let per_worker = (3 * shape.domain_size * std::mem::size_of::<Fr>()) as u64;
        let mut lent = Vec::with_capacity(streams.len());
        for (who, _) in &streams {
            if *lend_budget < per_worker {
                tracing::info!(
                    worker = %who,
                    bytes = per_worker,
                    budget_left = *lend_budget,
                    "page-locked lending budget spent: this worker's a, b, c go through staging"
                );
                lent.push(None);
                continue;
            }
            let abc = [(); 3].map(|_| device.lend_host(shape.domain_size));
            lent.push(match abc {
                [Ok(Some(a)), Ok(Some(b)), Ok(Some(c))] => {
                    *lend_budget -= per_worker;
                    Some(PartitionInputs {
                        a,
                        b,
                        c,
                        ..PartitionInputs::default()
                    })
                }
                abc => {
                    // One that failed fails the device, as a stream would; none to lend
                    // leaves the heap.
                    for r in abc {
                        r?;
                    }
                    None
                }
            });
        }
        let handles = streams
            .into_iter()
            .zip(lent)
            .map(|((who, stream), lent)| {
                let w = Worker {
                    who,
                    stream,
                    dev: dev.clone(),
                    shared: shared.clone(),
                    lent,
                };
                thread::spawn(move || w.run())
            })
            .collect();
        Ok((dev, handles))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn the_lending_budget_defaults_to_a_quarter_of_the_ram() {
        let ram = host_ram_bytes().expect("/proc/meminfo has MemTotal");
        assert!(ram >= 256 << 20, "MemTotal read as {ram} bytes");
        assert_eq!(PipelineConfig::default().max_lent_host_bytes, ram / 4);
    }
}
