//! Stress scenarios for the pipeline: capacity squeeze, a fault at every allocation
//! site and launch one at a time, and a seeded random soak. Every proof must equal the
//! reference or be a typed error; memory must come back; no lock may stay held.

use std::time::Duration;

use serde::Serialize;

use crate::audit::Audit;
use crate::device::faults::Fault;
use crate::device::{AllocSite, Device, FaultPlan, Footprint, Stage};
use crate::prover::timeline::{Phase, Span};
use crate::prover::{prep, Pipeline, PipelineConfig, ProveError, RsSource};
use crate::sync::Arc;
use crate::workload::{Check, Workload};
use crate::Error;

/// A device the stress runner can squeeze, fault and inspect for leaks.
pub trait StressDevice: Device + Sized {
    /// A fresh device (the `ordinal`-th of the run) whose free memory after loading the
    /// key is `sets` working sets (`None`: the whole device), with `faults` injected and
    /// reporting to `audit`, warmed up for a batch of `workers` workers before its leak
    /// baseline is taken.
    fn for_scenario(
        ordinal: usize,
        sets: Option<f64>,
        faults: FaultPlan,
        audit: Arc<Audit>,
        w: &Workload,
        workers: usize,
    ) -> Result<Self, Error>;
    /// Device bytes still held by working sets after a batch (after a trim).
    fn leaked_bytes(&self) -> u64;
    /// Faults the device injected.
    fn faults_injected(&self) -> usize;
    /// For the report: the footprints a squeeze was computed from and the free memory
    /// it left (None: not squeezed, or the device has nothing to add).
    fn squeeze_note(&self) -> Option<String> {
        None
    }
    /// Whether the chunked fallback fits in what the squeeze left, as measured on the
    /// device (None: judge from the computed footprints).
    fn fallback_fits(&self) -> Option<bool> {
        None
    }
    /// Gives back what a squeeze holds (no-op where nothing is held).
    fn release_squeeze(&self) -> Result<(), Error> {
        Ok(())
    }
}

/// One scenario to run.
#[derive(Clone, Debug, Serialize)]
pub struct Scenario {
    pub name: String,
    /// Free memory in working sets, or None for the whole device.
    pub sets: Option<f64>,
    pub faults: Vec<Fault>,
    pub partitions: usize,
    /// Whether a fallback is expected (Some) or forbidden (Some(false)); None: either.
    pub expect_fallback: Option<bool>,
    /// Whether every partition is expected to fail with Oom (too small for the fallback).
    pub expect_oom: bool,
    /// A second process that allocates and frees VRAM in a loop during the batch:
    /// the program to run (`twolock`, which has a hidden `pressure` command).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_pressure: Option<std::path::PathBuf>,
}

/// The external-pressure scenario: the whole device, no faults, while `program
/// pressure` allocates and frees VRAM in another process.
pub fn pressure_scenario(partitions: usize, program: std::path::PathBuf) -> Scenario {
    Scenario {
        name: "external pressure".into(),
        sets: None,
        faults: vec![],
        partitions,
        expect_fallback: None,
        expect_oom: false,
        external_pressure: Some(program),
    }
}

/// A running pressure process; killed and reaped on drop.
struct Pressure(std::process::Child);

impl Pressure {
    /// Starts `program pressure` and waits for its first allocation.
    fn start(program: &std::path::Path) -> Result<Self, Error> {
        use std::io::BufRead;
        let io = |source| Error::Io {
            path: program.display().to_string(),
            source,
        };
        let mut child = std::process::Command::new(program)
            .arg("pressure")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .map_err(io)?;
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            std::io::BufReader::new(out)
                .read_line(&mut line)
                .map_err(io)?;
        }
        if !line.starts_with("ready") {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Error::Usage(format!(
                "the pressure process did not start: {line:?}"
            )));
        }
        Ok(Pressure(child))
    }
}

impl Drop for Pressure {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One row of the report.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Outcome {
    pub scenario: String,
    pub partitions: usize,
    pub correct: usize,
    pub wrong: usize,
    pub typed_errors: usize,
    pub fallbacks: usize,
    pub faults_injected: usize,
    pub leaked_bytes: u64,
    pub deadlocks: usize,
    pub violations: usize,
    pub expectation_met: bool,
    pub wall_ms: f64,
    /// Device 0's squeeze as measured and left (see [`StressDevice::squeeze_note`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub squeeze: Option<String>,
    /// The first typed error of the batch, as displayed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.wrong == 0
            && self.leaked_bytes == 0
            && self.deadlocks == 0
            && self.violations == 0
            && self.expectation_met
    }
}

/// The standard scenario list: squeeze at k ∈ {0.5, 1, 1.5, 2, 3} sets (and one far too
/// small), a fault at every allocation site and stage, and a soak of `soak` partitions.
pub fn scenarios(partitions: usize, soak: usize, seed: u64) -> Vec<Scenario> {
    let mut v = Vec::new();
    for (sets, fallback) in [
        (3.0, Some(false)),
        (2.0, Some(false)),
        (1.5, Some(true)),
        (1.0, Some(true)),
        (0.5, Some(true)),
    ] {
        v.push(Scenario {
            name: format!("squeeze {sets} sets"),
            sets: Some(sets),
            faults: vec![],
            partitions,
            expect_fallback: fallback,
            expect_oom: false,
            external_pressure: None,
        });
    }
    v.push(Scenario {
        name: "squeeze 0.05 sets".into(),
        sets: Some(0.05),
        faults: vec![],
        partitions: partitions.min(3),
        expect_fallback: None,
        expect_oom: true,
        external_pressure: None,
    });
    for site in [
        AllocSite::PreStage,
        AllocSite::Fallback,
        AllocSite::FallbackChunked,
    ] {
        v.push(Scenario {
            name: format!("alloc fault {site:?}"),
            sets: Some(1.5),
            faults: vec![Fault::Alloc {
                site: Some(site),
                nth: 1,
            }],
            partitions,
            expect_fallback: None,
            expect_oom: false,
            external_pressure: None,
        });
    }
    for stage in [
        Stage::Upload,
        Stage::WitnessMap,
        Stage::MsmH,
        Stage::MsmL,
        Stage::MsmA,
        Stage::MsmBG1,
    ] {
        v.push(Scenario {
            name: format!("launch fault {}", stage.name()),
            sets: None,
            faults: vec![Fault::Kernel {
                stage: Some(stage),
                nth: 1,
            }],
            partitions,
            expect_fallback: None,
            expect_oom: false,
            external_pressure: None,
        });
    }
    v.push(Scenario {
        name: format!("soak seed {seed}"),
        sets: Some(1.5),
        faults: vec![Fault::Random {
            seed,
            alloc_per_mille: 50,
            kernel_per_mille: 20,
        }],
        partitions: soak,
        expect_fallback: None,
        expect_oom: false,
        external_pressure: None,
    });
    v
}

/// Runs one scenario on a fresh device of type `D`.
pub fn run_scenario<D: StressDevice>(
    w: &Workload,
    s: &Scenario,
    workers: usize,
    lock_timeout: Duration,
) -> Result<Outcome, Error> {
    run_scenario_on::<D>(w, s, workers, 1, lock_timeout)
}

/// [`run_scenario`] on `devices` devices, each with its own pair of locks and `workers`
/// workers. Device 0 takes the scenario's squeeze and faults; the others have their
/// whole memory and no faults. With several devices, the other devices must never fall
/// back and every error must come from device 0 (which partitions land where is up to
/// the scheduling, so device 0 may also get none).
pub fn run_scenario_on<D: StressDevice>(
    w: &Workload,
    s: &Scenario,
    workers: usize,
    devices: usize,
    lock_timeout: Duration,
) -> Result<Outcome, Error> {
    if w.assignments.is_empty() {
        return Err(Error::Usage("a workload without partitions".into()));
    }
    if devices == 0 {
        return Err(Error::Usage(
            "a stress run needs at least one device".into(),
        ));
    }
    let audit = Arc::new(Audit::new());
    let faults = FaultPlan::new(s.faults.clone());
    let mut list = vec![D::for_scenario(
        0,
        s.sets,
        faults,
        audit.clone(),
        w,
        workers,
    )?];
    for d in 1..devices {
        list.push(D::for_scenario(
            d,
            None,
            FaultPlan::none(),
            audit.clone(),
            w,
            workers,
        )?);
    }
    let pipeline = Pipeline::new(
        list,
        PipelineConfig {
            workers_per_device: workers,
            lock_timeout,
            ..Default::default()
        },
    )
    .with_audit(audit.clone());
    // Partitions beyond the workload's reuse its witnesses (fresh r and s each).
    let w_all = w.cycled(s.partitions);
    let batch = w_all.batch(&RsSource::Seeded(s.partitions as u64))?;
    let pressure = match &s.external_pressure {
        Some(program) => Some(Pressure::start(program)?),
        None => None,
    };
    let run = pipeline.prove_batch(batch.clone());
    // Gone before the leak check, which compares free VRAM with the baseline.
    drop(pressure);
    let mut o = Outcome {
        scenario: s.name.clone(),
        partitions: s.partitions,
        correct: 0,
        wrong: 0,
        typed_errors: 0,
        fallbacks: run.fallbacks,
        faults_injected: pipeline.devices().iter().map(|d| d.faults_injected()).sum(),
        leaked_bytes: pipeline
            .devices()
            .iter()
            .map(|d| d.leaked_bytes())
            .fold(0, u64::saturating_add),
        deadlocks: 0,
        violations: audit.violations().len() + usize::from(!run.locks_released),
        expectation_met: true,
        wall_ms: run.wall.as_secs_f64() * 1e3,
        squeeze: pipeline.devices()[0].squeeze_note(),
        first_error: None,
    };
    // With one device every partition must be an Oom where the fallback cannot fit;
    // with more, every error must be an Oom (the other devices may prove partitions).
    let mut errors_all_oom = true;
    let mut errors_on_device_0 = true;
    for (i, r) in run.results.iter().enumerate() {
        match r {
            Ok(p) => match w_all.check(&batch, i, p)? {
                Check::Wrong => o.wrong += 1,
                _ => o.correct += 1,
            },
            Err(ProveError::LockTimeout { .. }) => o.deadlocks += 1,
            Err(e) => {
                o.first_error.get_or_insert_with(|| e.to_string());
                errors_all_oom &= matches!(e, ProveError::Device { source, .. } if source.is_oom());
                errors_on_device_0 &= matches!(e, ProveError::Device { device: 0, .. });
                o.typed_errors += 1
            }
        }
    }
    let all_oom = errors_all_oom && (devices > 1 || (o.correct == 0 && o.wrong == 0));
    let fallbacks_on = |d: usize| run.timeline.count_on(d, Phase::Fallback);
    let squeezed_fallbacks = if devices > 1 {
        fallbacks_on(0)
    } else {
        o.fallbacks
    };
    if devices > 1 {
        // Only device 0 is squeezed or faulted: every error is its own, the others never
        // fall back, and the timeline accounts for every fallback the batch counted.
        o.expectation_met &= errors_on_device_0;
        o.expectation_met &= (1..devices).all(|d| fallbacks_on(d) == 0);
        o.expectation_met &= (0..devices).map(fallbacks_on).sum::<usize>() == o.fallbacks;
    }

    // Below one set, whether the chunked fallback fits depends on the device's
    // footprints: where it cannot, every partition must be a typed Oom instead.
    let shape = prep::shape(&w.matrices)?;
    let (full, chunked) = (
        pipeline.devices()[0].working_set_bytes(&shape, Footprint::Full),
        pipeline.devices()[0].working_set_bytes(&shape, Footprint::Chunked),
    );
    let fallback_fits = pipeline.devices()[0]
        .fallback_fits()
        .unwrap_or_else(|| s.sets.is_none_or(|k| k * full as f64 >= chunked as f64));
    // With several devices, scheduling decides whether two of device 0's partitions
    // ever want a working set at once (preps pass one at a time, so its two workers may
    // run one after the other): a squeeze expects a fallback only where they did.
    let wanted_two_sets = devices == 1 || overlapping_partitions(&run.timeline.spans(), 0);
    if let Some(f) = s.expect_fallback {
        o.expectation_met &=
            (squeezed_fallbacks > 0) == f || !fallback_fits || (f && !wanted_two_sets);
    }
    if s.expect_oom || (s.faults.is_empty() && !fallback_fits) {
        o.expectation_met &= all_oom;
    } else if s.faults.is_empty() {
        o.expectation_met &= o.typed_errors == 0;
    }
    // The squeeze goes with its scenario, before the next one builds its devices.
    for d in pipeline.devices() {
        d.release_squeeze()?;
    }
    Ok(o)
}

/// Whether two partitions on `device` were in flight at once, from each one's first
/// wait for the mem lock to its last step on the device: the span in which its working
/// set is wanted or held.
fn overlapping_partitions(spans: &[Span], device: usize) -> bool {
    let mut life = std::collections::BTreeMap::<usize, (u64, u64)>::new();
    let on_device = |sp: &&Span| {
        sp.worker.device == device
            && !matches!(
                sp.phase,
                Phase::PrepWait | Phase::Prep | Phase::BG2 | Phase::Assemble
            )
    };
    for sp in spans.iter().filter(on_device) {
        let e = life.entry(sp.partition).or_insert((sp.start_us, sp.end_us));
        *e = (e.0.min(sp.start_us), e.1.max(sp.end_us));
    }
    let mut lives: Vec<_> = life.into_values().collect();
    lives.sort_unstable();
    lives.windows(2).any(|w| w[1].0 < w[0].1)
}

/// Proves one partition per worker of `w` on `device` through a pipeline of `workers`
/// workers (no checks), so that whatever the device and its driver allocate on first
/// use exists before a baseline of free memory is taken: per-context caches, and the
/// resources of `workers` concurrent streams, which a single-stream run does not grow.
/// A leak check then compares later batches of the same shape with that baseline.
pub fn prime<D: Device>(device: D, w: &Workload, workers: usize) -> Result<(), Error> {
    if w.assignments.is_empty() {
        return Err(Error::Usage("a workload without partitions".into()));
    }
    let pipeline = Pipeline::new(
        vec![device],
        PipelineConfig {
            workers_per_device: workers,
            ..Default::default()
        },
    );
    let run = pipeline.prove_batch(w.cycled(workers.max(1)).batch(&RsSource::Seeded(0))?);
    match run.results.into_iter().find_map(Result::err) {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// Bytes of one full working set for `w` on `device`.
pub fn working_set_bytes<D: Device>(device: &D, w: &Workload) -> Result<u64, Error> {
    let shape = prep::shape(&w.matrices)?;
    Ok(device.working_set_bytes(&shape, Footprint::Full))
}

/// A plain-text table of outcomes.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut s = format!(
        "{:<26} {:>5} {:>7} {:>5} {:>6} {:>9} {:>7} {:>9} {:>6} {:>4}\n",
        "scenario",
        "parts",
        "correct",
        "wrong",
        "errors",
        "fallbacks",
        "leaked",
        "deadlocks",
        "audit",
        "ok"
    );
    for o in outcomes {
        s += &format!(
            "{:<26} {:>5} {:>7} {:>5} {:>6} {:>9} {:>7} {:>9} {:>6} {:>4}\n",
            o.scenario,
            o.partitions,
            o.correct,
            o.wrong,
            o.typed_errors,
            o.fallbacks,
            o.leaked_bytes,
            o.deadlocks,
            o.violations,
            if o.passed() { "yes" } else { "NO" }
        );
    }
    // What a reviewer needs to read a failed row: the squeeze as it happened and the
    // first error.
    for o in outcomes.iter().filter(|o| !o.passed()) {
        s += &format!(
            "{}: squeeze {}; first error {}\n",
            o.scenario,
            o.squeeze.as_deref().unwrap_or("none"),
            o.first_error.as_deref().unwrap_or("none"),
        );
    }
    s
}

impl StressDevice for crate::device::sim::SimDevice {
    fn for_scenario(
        _ordinal: usize,
        sets: Option<f64>,
        faults: FaultPlan,
        audit: Arc<Audit>,
        w: &Workload,
        _workers: usize,
    ) -> Result<Self, Error> {
        use crate::device::sim::{SimConfig, SimDevice};
        let mut cfg = SimConfig::default();
        if let Some(k) = sets {
            let ws = working_set_bytes(&SimDevice::new(cfg), w)?;
            cfg.capacity = SimDevice::key_bytes(&w.key.pk) + (ws as f64 * k) as u64;
        }
        Ok(SimDevice::build(cfg, faults, Some(audit)))
    }

    fn leaked_bytes(&self) -> u64 {
        self.working_bytes()
    }

    fn faults_injected(&self) -> usize {
        crate::device::sim::SimDevice::faults_injected(self)
    }
}

#[cfg(feature = "cuda")]
impl StressDevice for crate::device::cuda::CudaDevice {
    /// GPU `ordinal` with the pool strategy. A squeeze holds VRAM in a ballast allocation so
    /// that what stays free is the key plus `sets` working sets, as measured on this
    /// device (granularity included) and proved by allocating them (see
    /// [`CudaDevice::squeeze_for`](crate::device::cuda::CudaDevice::squeeze_for)).
    fn for_scenario(
        ordinal: usize,
        sets: Option<f64>,
        faults: FaultPlan,
        audit: Arc<Audit>,
        w: &Workload,
        workers: usize,
    ) -> Result<Self, Error> {
        use crate::device::{cuda::CudaDevice, AllocStrategy};
        let d = CudaDevice::build(ordinal, AllocStrategy::Pool, faults, Some(audit))?;
        // A fault-free twin on the same (primary) context, which `d` keeps alive, runs a
        // warm batch with the same workers: the context's first-use resources then
        // exist before the baseline, and the scenario's faults are not spent on it.
        prime(CudaDevice::new(ordinal, AllocStrategy::Pool)?, w, workers)?;
        // `build` warmed the device's own caches (modules, twiddles) before any squeeze.
        if let Some(k) = sets {
            let shape = prep::shape(&w.matrices)?;
            let pk = Arc::new(w.key.pk.clone());
            let m = d.measure(&pk, &shape)?;
            d.squeeze_for(&pk, &shape, m, k, workers)?;
        }
        d.mark_baseline()?;
        Ok(d)
    }

    /// Working-set bytes still booked, plus VRAM missing against the baseline after a
    /// device sync and a pool trim (an unmeasurable device counts as all leaked).
    fn leaked_bytes(&self) -> u64 {
        self.working_bytes()
            .saturating_add(self.vram_leaked().unwrap_or(u64::MAX))
    }

    fn faults_injected(&self) -> usize {
        crate::device::cuda::CudaDevice::faults_injected(self)
    }

    fn release_squeeze(&self) -> Result<(), Error> {
        self.squeeze_to(None)?;
        Ok(())
    }

    fn fallback_fits(&self) -> Option<bool> {
        self.squeeze_level().map(|l| l.chunked_fits)
    }

    fn squeeze_note(&self) -> Option<String> {
        const MIB: f64 = (1u64 << 20) as f64;
        let mib = |b: u64| b as f64 / MIB;
        self.squeeze_level().map(|l| {
            let m = l.measured;
            format!(
                "key {:.1} MiB, 1/2/3 sets {:.1}/{:.1}/{:.1} MiB, chunked set {:.1} MiB measured; \
                 {} sets: {:.1} MiB free asked, raised {:.1} MiB, {:.1} MiB left; \
                 chunked set fits: {}, one set more fits: {}",
                mib(m.key),
                mib(m.sets[0]),
                mib(m.sets[1]),
                mib(m.sets[2]),
                mib(m.chunked),
                l.sets,
                mib(l.asked_free),
                mib(l.raised),
                mib(l.free_after),
                l.chunked_fits,
                l.next_fits,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::WorkerId;

    fn span(partition: usize, device: usize, phase: Phase, start_us: u64, end_us: u64) -> Span {
        let worker = WorkerId { device, worker: 0 };
        Span {
            partition,
            worker,
            phase,
            start_us,
            end_us,
        }
    }

    #[test]
    fn overlap_counts_only_the_device_side_on_one_device() {
        // Partition 0 on the device 10..20, partition 1 preps during it and reaches the
        // device at 20: no overlap, whatever the CPU phases do.
        let mut spans = vec![
            span(0, 0, Phase::MemWait, 10, 12),
            span(0, 0, Phase::ComputeHold, 12, 20),
            span(1, 0, Phase::Prep, 5, 19),
            span(1, 0, Phase::MemWait, 20, 21),
            span(1, 1, Phase::ComputeHold, 0, 30),
        ];
        assert!(!overlapping_partitions(&spans, 0));
        spans.push(span(2, 0, Phase::MemHold, 15, 16));
        assert!(overlapping_partitions(&spans, 0));
        assert!(!overlapping_partitions(&spans, 1));
    }
}
