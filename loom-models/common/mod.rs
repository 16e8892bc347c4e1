//! What the loom models share: fixtures built once outside loom, one pipeline run inside
//! an execution, the safety checks every explored execution must pass, and [`explore`],
//! which runs a model under a stated preemption bound, times it, and on a failure prints
//! the failing interleaving and how to replay it.
//!
//! Inside `loom::model` every `crate::sync` type is loom's and may not outlive the
//! execution, so the audit, the device and the pipeline are built per execution; keys,
//! witnesses and reference proofs use no `crate::sync` type and are built once, here,
//! in `std` statics. The trace of device calls is a `std` thread-local: loom runs all of
//! a model's threads on the test's OS thread, and a `std` cell adds no interleavings.

#![allow(dead_code)] // each model file uses its own subset

use std::cell::{Cell, RefCell};
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use twolock::audit::{Audit, Violation};
use twolock::circuits::{CircuitSpec, ConstraintMatrices, Family};
use twolock::device::faults::Fault;
use twolock::device::sim::{SimConfig, SimDevice, SimKey, SimStream, SimWorkingSet};
use twolock::device::{
    AllocSite, AllocStrategy, Device, DeviceError, FaultPlan, Footprint, G1Results, MemInfo,
    PartitionInputs, Shape, Stage, WorkerId,
};
use twolock::prover::timeline::Timeline;
use twolock::prover::{
    prep, Batch, BatchRun, Flaw, LockMode, Pipeline, PipelineConfig, ProveError,
};
use twolock::sync::Arc; // loom's Arc under `--cfg twolock_loom`
use twolock::{Fr, Proof, ProvingKey};

/// Partitions a fixture holds; a model proves the first `Case::partitions` of them.
pub const MAX_PARTITIONS: usize = 4;
/// log2 of the QAP domain of the models' circuit: 2^2 constraints keeps each
/// execution's real MSMs and NTTs to a few milliseconds.
pub const LOG_CONSTRAINTS: u32 = 2;

/// A circuit, its real key, witnesses, r and s, and ark-groth16's proof of each
/// partition: everything an execution needs that no loom object may hold.
pub struct Fixture {
    pub pk: ProvingKey,
    pub matrices: ConstraintMatrices,
    pub assignments: Vec<Vec<Fr>>,
    pub rs: Vec<(Fr, Fr)>,
    /// The reference proof of each partition, computed outside loom.
    pub reference: Vec<Proof>,
}

/// The shared fixture (Boolean family, 2^[`LOG_CONSTRAINTS`], one public input, real
/// key from seed 1, witness seeds 100.., small fixed r and s). Built on first use,
/// outside any `loom::model` (the key comes from the on-disk key cache after a first run).
///
/// `twolock::workload::Workload::build` cannot be used here: a `Workload` holds
/// `crate::sync::Arc`s, which under loom may only be created inside an execution.
pub fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let spec = CircuitSpec::new(Family::Boolean, LOG_CONSTRAINTS, 1).expect("spec");
        let pk = twolock::keys::real_key(&spec, 1).expect("real key").pk;
        let matrices = spec.constraints().expect("matrices");
        let assignments: Vec<_> = (0..MAX_PARTITIONS as u64)
            .map(|i| spec.assignment(100 + i).expect("assignment"))
            .collect();
        // Small r and s, distinct per partition: the assembly's scalar multiplications
        // then cost a few group operations instead of ~255 doublings each.
        let rs: Vec<(Fr, Fr)> = (0..MAX_PARTITIONS as u64)
            .map(|i| (Fr::from(3 + 2 * i), Fr::from(4 + 2 * i)))
            .collect();
        let reference = assignments
            .iter()
            .zip(&rs)
            .map(|(z, &(r, s))| {
                twolock::reference::prove(&pk, &matrices, z, r, s)
                    .expect("reference proof")
                    .proof
            })
            .collect();
        Fixture {
            pk,
            matrices,
            assignments,
            rs,
            reference,
        }
    })
}

/// One configuration of the pipeline on one or more simulated devices.
#[derive(Clone, Debug)]
pub struct Case {
    /// Workers per device.
    pub workers: usize,
    pub partitions: usize,
    /// VRAM beyond the key, in full working sets (device 0).
    pub sets: u64,
    /// Further devices, each with its own pair of locks: their VRAM beyond the key, in
    /// full working sets. Empty: one device.
    pub more_devices: Vec<u64>,
    pub strategy: AllocStrategy,
    pub faults: Vec<Fault>,
    pub flaw: Option<Flaw>,
    pub mode: LockMode,
}

impl Case {
    pub fn new(workers: usize, partitions: usize, sets: u64, strategy: AllocStrategy) -> Self {
        assert!(
            partitions <= MAX_PARTITIONS,
            "the fixture has {MAX_PARTITIONS} partitions"
        );
        // loom runs at most 5 threads: the model's main thread and 4 workers.
        assert!((1..=4).contains(&workers), "loom models at most 4 workers");
        Self {
            workers,
            partitions,
            sets,
            more_devices: Vec::new(),
            strategy,
            faults: Vec::new(),
            flaw: None,
            mode: LockMode::Two,
        }
    }

    /// Adds devices after device 0 with room for `sets[d]` working sets each; faults
    /// stay on device 0.
    pub fn more_devices(mut self, sets: &[u64]) -> Self {
        self.more_devices = sets.to_vec();
        assert!(
            self.workers * self.devices() <= 4,
            "loom models at most 4 workers in all"
        );
        self
    }

    pub fn devices(&self) -> usize {
        1 + self.more_devices.len()
    }

    /// The fewest working sets any device has room for.
    fn min_sets(&self) -> u64 {
        self.more_devices.iter().fold(self.sets, |m, &s| m.min(s))
    }

    pub fn mode(mut self, mode: LockMode) -> Self {
        self.mode = mode;
        self
    }

    pub fn faults(mut self, faults: Vec<Fault>) -> Self {
        self.faults = faults;
        self
    }

    pub fn flaw(mut self, flaw: Flaw) -> Self {
        self.flaw = Some(flaw);
        self
    }

    fn has_alloc_fault(&self) -> bool {
        self.faults.iter().any(|f| matches!(f, Fault::Alloc { .. }))
    }

    fn has_only_kernel_faults(&self) -> bool {
        !self.faults.is_empty()
            && self
                .faults
                .iter()
                .all(|f| matches!(f, Fault::Kernel { .. }))
    }
}

/// What one execution produced.
#[derive(Debug)]
pub struct Outcome {
    pub run: BatchRun,
    pub violations: Vec<Violation>,
    /// Device bytes of working sets still held after the batch (a leak if not 0).
    pub working_bytes: u64,
    pub faults_injected: usize,
    /// Progress callbacks: one per partition the workers finished.
    pub finished: usize,
}

/// Runs `case` once; call it inside a loom execution. The audit, the device and the
/// pipeline are created here, per execution, and the timeline is disabled so that
/// instrumentation adds no interleavings.
pub fn run(case: &Case) -> Outcome {
    let f = fixture();
    let n = case.partitions;
    let audit = Arc::new(Audit::new());
    let cfg = SimConfig {
        capacity: 0,
        strategy: case.strategy,
        ..SimConfig::default()
    };
    // Capacity from the device's own working-set size: the key plus `sets` full sets.
    let shape = prep::shape(&f.matrices).expect("shape");
    let devices: Vec<SimDevice> = std::iter::once(case.sets)
        .chain(case.more_devices.iter().copied())
        .enumerate()
        .map(|(d, sets)| {
            let faults = if d == 0 {
                case.faults.clone()
            } else {
                Vec::new()
            };
            let device = SimDevice::build(cfg, FaultPlan::new(faults), Some(audit.clone()));
            let set = device.working_set_bytes(&shape, Footprint::Full);
            device.set_capacity(SimDevice::key_bytes(&f.pk) + sets * set);
            device
        })
        .collect();

    let pc = PipelineConfig {
        workers_per_device: case.workers,
        mode: case.mode,
        // Under loom waits are untimed; a wait that cannot end is loom's deadlock.
        lock_timeout: Duration::from_secs(600),
        flaw: case.flaw,
        ..PipelineConfig::default()
    };
    let finished = std::sync::Arc::new(StdAtomicUsize::new(0));
    let counter = finished.clone();
    let traced = devices.iter().map(|d| Traced(d.clone())).collect();
    let pipeline = Pipeline::new(traced, pc)
        .with_audit(audit.clone())
        .with_progress(move || {
            counter.fetch_add(1, StdOrdering::Relaxed);
        });
    let batch = Arc::new(Batch {
        pk: Arc::new(f.pk.clone()),
        matrices: Arc::new(f.matrices.clone()),
        partitions: f.assignments[..n].to_vec(),
        rs: f.rs[..n].to_vec(),
    });
    let run = pipeline.prove_batch_with(batch, Arc::new(Timeline::disabled()));
    Outcome {
        run,
        violations: audit.violations(),
        working_bytes: devices.iter().map(SimDevice::working_bytes).sum(),
        faults_injected: devices.iter().map(SimDevice::faults_injected).sum(),
        finished: finished.load(StdOrdering::Relaxed),
    }
}

/// The protocol's safety properties, checked on every explored execution. The audit's
/// verdict comes first, so a flawed design's panic names the violated property.
pub fn assert_safe(case: &Case, out: &Outcome) {
    let f = fixture();
    // VRAM never over-committed, no device-global call under mem while another worker
    // has kernels in flight, the working set truly free before compute is released.
    assert!(
        out.violations.is_empty(),
        "audit violations: {:?}",
        out.violations
    );
    // Locks free on every path, errors included.
    assert!(out.run.locks_released, "a lock stayed held after the batch");
    // Memory returned on every path.
    assert_eq!(out.working_bytes, 0, "device working-set bytes leaked");
    // Each partition completes exactly once...
    assert_eq!(
        out.finished, case.partitions,
        "partitions finished (want each exactly once)"
    );
    assert_eq!(out.run.results.len(), case.partitions);
    // ...with the right result. A failed launch fails its own partition, as a typed
    // error (never a silently wrong proof), and no other; a failed allocation costs at
    // most its own partition (an Oom at the pre-stage is a fallback, not an error).
    let mut errors = 0;
    for (i, result) in out.run.results.iter().enumerate() {
        match result {
            Ok(proof) => assert!(*proof == f.reference[i], "partition {i}: wrong proof"),
            Err(ProveError::Device { .. }) if !case.faults.is_empty() => errors += 1,
            Err(e) => panic!("partition {i}: unexpected error: {e}"),
        }
    }
    if case.has_only_kernel_faults() {
        // With several devices the faulty one (device 0) may get no partition at all.
        assert!(
            out.faults_injected > 0 || case.devices() > 1,
            "the injected launch fault never fired"
        );
        assert_eq!(
            errors, out.faults_injected,
            "failed partitions vs failed launches"
        );
    } else {
        assert!(
            errors <= out.faults_injected.min(1),
            "{errors} partitions failed after {} injected faults",
            out.faults_injected
        );
    }
    // Room for two working sets (on every device): the pre-stage always fits, no fallback.
    if case.min_sets() >= 2 && !case.has_alloc_fault() {
        assert_eq!(
            out.run.fallbacks, 0,
            "fallback taken with room for two working sets"
        );
    }
}

/// Runs `case` and asserts [`assert_safe`]: the body of every model.
pub fn safe_model(case: Case) -> impl Fn() + Sync + Send + 'static {
    move || {
        let out = run(&case);
        assert_safe(&case, &out);
    }
}

/// A protocol model: every execution of `case` with at most `bound` preemptions must
/// pass [`assert_safe`]. A failure prints the failing execution's device calls and how
/// to replay it (see [`explore`]) and fails the test.
pub fn verify(name: &str, bound: usize, case: Case) {
    if let Err(failure) = explore(name, bound, Expect::Pass, safe_model(case)) {
        panic!("loom model `{name}` failed: {}", failure.message);
    }
}

/// A bad-design model whose flaw a failed check catches (an audit violation, a wrong
/// result): some execution of the flawed `case` with at most `bound` preemptions must
/// fail [`assert_safe`], with a message that names `flagged_by` (a `Violation` variant).
/// The check fails on the model's main thread after every worker has finished, so the
/// panic unwinds cleanly and is caught in-process.
pub fn expect_flagged(name: &str, bound: usize, case: Case, flagged_by: &str) {
    match explore(name, bound, Expect::Flagged, safe_model(case)) {
        Ok(explored) => panic!(
            "`{name}`: the known-bad design passed all {} executions up to preemption \
             bound {bound}: the harness failed to flag it",
            explored.executions
        ),
        Err(failure) => assert!(
            failure.message.contains(flagged_by),
            "`{name}` was flagged, but not by {flagged_by}: {}",
            failure.message
        ),
    }
}

/// Set in the child process that [`expect_deadlock`] runs a model in.
const CHILD_ENV: &str = "TWOLOCK_LOOM_CHILD";

/// A bad-design model that must deadlock: some execution of the flawed `case` with at
/// most `bound` preemptions must end in loom's "deadlock" panic.
///
/// It runs in a child process (this test binary, filtered to `name`): when loom finds
/// the deadlock it panics in the scheduler and then drops the blocked threads, whose
/// lock guards (`locks::Held`) call into loom again while unwinding, and that second
/// panic aborts the process. `catch_unwind` cannot survive that, a child can.
pub fn expect_deadlock(name: &str, bound: usize, case: Case) {
    if std::env::var(CHILD_ENV).as_deref() == Ok(name) {
        if let Err(failure) = explore(name, bound, Expect::Flagged, safe_model(case)) {
            panic!("{}", failure.message); // the parent reads it
        }
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run the model in a child process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The child's report (its table line, trace and replay) goes into this test's output,
    // without the child's libtest chatter around it.
    let report = stdout.find("loom-model ").map_or("", |at| &stdout[at..]);
    let report = report.split("\nfailures:").next().unwrap_or("");
    println!(
        "{}",
        report.trim_end().trim_end_matches("FAILED").trim_end()
    );
    assert!(
        !out.status.success(),
        "`{name}`: the known-bad design passed every execution up to preemption bound \
         {bound}: the harness failed to flag it\n{stderr}"
    );
    assert!(
        stderr.contains("deadlock; threads") || stdout.contains("deadlock; threads"),
        "`{name}` failed ({}), but not by a deadlock:\n{stderr}",
        out.status
    );
}

// ---------------------------------------------------------------------------------
// Exploring a model.

/// What a model is expected to do; only changes how a panic is reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    Pass,
    Flagged,
}

/// The model running on this OS thread (loom runs all its threads on it).
struct Current {
    name: String,
    bound: usize,
    expect: Expect,
    checkpoint: Option<PathBuf>,
    start: Instant,
    reported: bool,
}

thread_local! {
    static CURRENT: RefCell<Option<Current>> = const { RefCell::new(None) };
    /// Device calls of the execution in progress (or of the one that failed).
    static TRACE: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    static EXECUTIONS: Cell<usize> = const { Cell::new(0) };
}

fn note(who: Option<WorkerId>, what: std::fmt::Arguments<'_>) {
    TRACE.with(|t| {
        if let Ok(mut t) = t.try_borrow_mut() {
            let who = who.map_or_else(|| "main".to_string(), |w| w.to_string());
            t.push(format!("{who:>9}  {what}"));
        }
    });
}

/// A model that passed.
#[derive(Debug)]
pub struct Explored {
    pub executions: usize,
    pub elapsed: Duration,
}

/// A model that panicked: a failed check, or loom's "deadlock".
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    /// Which execution failed (1-based).
    pub execution: usize,
}

fn checkpoint_file_name(name: &str) -> String {
    name.replace("::", "-")
}

/// The table line of `ci/loom.sh`.
fn table_line(c: &Current, verdict: &str) -> String {
    format!(
        "loom-model {} {} bound {} executions {} seconds {:.1} {verdict}",
        env!("CARGO_CRATE_NAME"),
        c.name,
        c.bound,
        EXECUTIONS.with(|e| e.get()),
        c.start.elapsed().as_secs_f64()
    )
}

/// Prints the table line, the failing execution's device calls and how to replay it.
/// Runs in the panic hook, before unwinding: a deadlock can abort the process while
/// unwinding (see [`expect_deadlock`]), and this must be on the record first.
fn report_panic(c: &Current, message: &str) {
    let verdict = match c.expect {
        Expect::Pass => "FAILED",
        Expect::Flagged => "flagged, as it must be,",
    };
    let mut s = format!(
        "{}\n\n=== loom model `{}` {verdict} in execution {} (preemption bound {}) ===\n\
         {message}\n--- device calls of that execution, in the order they returned ---\n",
        table_line(
            c,
            match c.expect {
                Expect::Pass => "FAILED",
                Expect::Flagged => "flagged",
            }
        ),
        c.name,
        EXECUTIONS.with(|e| e.get()),
        c.bound
    );
    TRACE.with(|t| {
        if let Ok(t) = t.try_borrow() {
            for line in t.iter() {
                s.push_str(line);
                s.push('\n');
            }
        }
    });
    let cmd = format!(
        "RUSTFLAGS=\"--cfg twolock_loom\" cargo test --release --target-dir target/loom \
         --test {} {} -- --exact --nocapture",
        env!("CARGO_CRATE_NAME"),
        c.name
    );
    s.push_str("--- replay ---\n");
    match &c.checkpoint {
        Some(path) => s.push_str(&format!(
            "loom wrote this interleaving to {p}; replay it alone, with loom's log:\n  \
             LOOM_CHECKPOINT_FILE={p} LOOM_LOG=trace LOOM_LOCATION=1 {cmd}\n",
            p = path.display()
        )),
        None => s.push_str(&format!(
            "record the interleaving (loom writes each execution's path before running \
             it), then replay it alone, with loom's log:\n  \
             TWOLOCK_LOOM_CHECKPOINT=target/loom/checkpoints {cmd}\n  \
             LOOM_CHECKPOINT_FILE=target/loom/checkpoints/{}.json LOOM_LOG=trace \
             LOOM_LOCATION=1 {cmd}\n",
            checkpoint_file_name(&c.name)
        )),
    }
    println!("{s}");
}

fn install_panic_hook() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let expected = CURRENT.with(|c| {
                let Ok(mut c) = c.try_borrow_mut() else {
                    return false;
                };
                let Some(c) = c.as_mut() else {
                    return false;
                };
                if !c.reported {
                    c.reported = true;
                    report_panic(c, &panic_message(info.payload()));
                }
                c.expect == Expect::Flagged
            });
            // A flagged bad design is the expected outcome: its report says it all.
            if !expected {
                default(info);
            }
        }));
    });
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(a panic without a message)".into())
}

/// Explores every interleaving of `body` with at most `bound` preemptions
/// (`LOOM_MAX_PREEMPTIONS` overrides it) and prints one line for `ci/loom.sh`'s table:
/// `loom-model <test binary> <name> bound <b> executions <n> seconds <s> <verdict>`,
/// the verdict being `ok`, `FAILED`, or `flagged` (a bad design caught, as it must be).
///
/// On a panic (a failed check, loom's "deadlock") a panic hook prints the failing
/// execution's device calls and how to replay it before anything unwinds.
///
/// With `TWOLOCK_LOOM_CHECKPOINT=<dir>`, loom writes each execution's path to
/// `<dir>/<name>.json` before running it, so after a failure the file holds the failing
/// interleaving; the file is removed when the model passes. Without it, loom's own
/// `LOOM_CHECKPOINT_FILE` applies (written every `LOOM_CHECKPOINT_INTERVAL` executions).
/// loom starts from an existing checkpoint file: that is how a replay works, and why
/// `ci/loom.sh` empties the directory first.
pub fn explore<F>(name: &str, bound: usize, expect: Expect, body: F) -> Result<Explored, Failure>
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    let bound = match builder.preemption_bound {
        Some(from_env) => from_env,
        None => {
            builder.preemption_bound = Some(bound);
            bound
        }
    };
    let ours = std::env::var_os("TWOLOCK_LOOM_CHECKPOINT").map(|dir| {
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir).expect("checkpoint directory");
        dir.join(format!("{}.json", checkpoint_file_name(name)))
    });
    if let Some(path) = &ours {
        builder.checkpoint_file(path.to_str().expect("a UTF-8 checkpoint path"));
        builder.checkpoint_interval = 1;
    }

    fixture(); // outside loom
    install_panic_hook();
    EXECUTIONS.with(|e| e.set(0));
    CURRENT.with(|c| {
        *c.borrow_mut() = Some(Current {
            name: name.to_string(),
            bound,
            expect,
            checkpoint: builder.checkpoint_file.clone(),
            start: Instant::now(),
            reported: false,
        })
    });
    let check = || {
        builder.check(move || {
            EXECUTIONS.with(|e| e.set(e.get() + 1));
            TRACE.with(|t| t.borrow_mut().clear());
            body();
        })
    };
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| match std::env::var_os("LOOM_LOG") {
        // loom logs each scheduling step through `tracing`, as `loom::model` sets up
        // (`LOOM_LOG` is a filter, e.g. `trace`; `1` means `trace`).
        Some(_) => {
            let subscriber = tracing_subscriber::fmt()
                .with_env_filter(match std::env::var("LOOM_LOG").as_deref() {
                    Ok("1") | Ok("true") => tracing_subscriber::EnvFilter::new("trace"),
                    _ => tracing_subscriber::EnvFilter::from_env("LOOM_LOG"),
                })
                .with_test_writer()
                .without_time()
                .finish();
            tracing::subscriber::with_default(subscriber, check)
        }
        None => check(),
    }));
    let current = CURRENT
        .with(|c| c.borrow_mut().take())
        .expect("the current model");
    let executions = EXECUTIONS.with(|e| e.get());
    match outcome {
        Ok(()) => {
            println!("{}", table_line(&current, "ok"));
            if let Some(path) = &ours {
                let _ = std::fs::remove_file(path);
            }
            Ok(Explored {
                executions,
                elapsed: current.start.elapsed(),
            })
        }
        Err(payload) => Err(Failure {
            message: panic_message(&*payload),
            execution: executions,
        }),
    }
}

// ---------------------------------------------------------------------------------
// A pass-through device that records each call of the execution in [`TRACE`].

/// [`SimDevice`] with every call noted in the trace; behaviour is SimDevice's own.
pub struct Traced(pub SimDevice);

/// A [`SimStream`] with the worker it belongs to (for the trace).
pub struct TracedStream {
    who: WorkerId,
    inner: SimStream,
}

fn verdict<T>(r: &Result<T, DeviceError>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => format!("ERR {e}"),
    }
}

impl Device for Traced {
    type Stream = TracedStream;
    type WorkingSet = SimWorkingSet;
    type Key = SimKey;

    fn describe(&self) -> String {
        self.0.describe()
    }
    fn strategy(&self) -> AllocStrategy {
        self.0.strategy()
    }
    fn memory(&self) -> Result<MemInfo, DeviceError> {
        self.0.memory()
    }
    fn create_stream(&self, owner: WorkerId) -> Result<TracedStream, DeviceError> {
        let inner = self.0.create_stream(owner)?;
        Ok(TracedStream { who: owner, inner })
    }
    fn load_key(&self, pk: &Arc<ProvingKey>) -> Result<SimKey, DeviceError> {
        let r = self.0.load_key(pk);
        note(None, format_args!("load_key -> {}", verdict(&r)));
        r
    }
    fn working_set_bytes(&self, shape: &Shape, footprint: Footprint) -> u64 {
        self.0.working_set_bytes(shape, footprint)
    }
    fn reserve_arena(&self, slot_bytes: u64, slots: usize) -> Result<usize, DeviceError> {
        let r = self.0.reserve_arena(slot_bytes, slots);
        note(None, format_args!("reserve_arena({slots} slots) -> {r:?}"));
        r
    }
    fn release_arena(&self) -> Result<(), DeviceError> {
        self.0.release_arena()
    }
    fn alloc(
        &self,
        s: &TracedStream,
        shape: &Shape,
        footprint: Footprint,
        site: AllocSite,
    ) -> Result<SimWorkingSet, DeviceError> {
        let r = self.0.alloc(&s.inner, shape, footprint, site);
        note(
            Some(s.who),
            format_args!("alloc {site:?} {footprint:?} -> {}", verdict(&r)),
        );
        r
    }
    fn free(&self, s: &TracedStream, ws: SimWorkingSet) -> Result<(), DeviceError> {
        let r = self.0.free(&s.inner, ws);
        note(Some(s.who), format_args!("free -> {}", verdict(&r)));
        r
    }
    fn upload(
        &self,
        s: &TracedStream,
        ws: &mut SimWorkingSet,
        inputs: &PartitionInputs,
    ) -> Result<(), DeviceError> {
        let r = self.0.upload(&s.inner, ws, inputs);
        note(Some(s.who), format_args!("upload -> {}", verdict(&r)));
        r
    }
    fn witness_map(&self, s: &TracedStream, ws: &mut SimWorkingSet) -> Result<(), DeviceError> {
        let r = self.0.witness_map(&s.inner, ws);
        note(Some(s.who), format_args!("witness_map -> {}", verdict(&r)));
        r
    }
    fn msm(
        &self,
        s: &TracedStream,
        ws: &mut SimWorkingSet,
        key: &SimKey,
        job: Stage,
    ) -> Result<(), DeviceError> {
        let r = self.0.msm(&s.inner, ws, key, job);
        note(
            Some(s.who),
            format_args!("{} -> {}", job.name(), verdict(&r)),
        );
        r
    }
    fn sync_stream(&self, s: &TracedStream) -> Result<(), DeviceError> {
        let r = self.0.sync_stream(&s.inner);
        note(Some(s.who), format_args!("sync_stream -> {}", verdict(&r)));
        r
    }
    fn results(&self, s: &TracedStream, ws: &SimWorkingSet) -> Result<G1Results, DeviceError> {
        self.0.results(&s.inner, ws)
    }
    fn sync_device(&self, s: &TracedStream) -> Result<(), DeviceError> {
        let r = self.0.sync_device(&s.inner);
        note(
            Some(s.who),
            format_args!("sync_device (device-global) -> {}", verdict(&r)),
        );
        r
    }
    fn trim_pool(&self, s: &TracedStream) -> Result<(), DeviceError> {
        let r = self.0.trim_pool(&s.inner);
        note(
            Some(s.who),
            format_args!("trim_pool (device-global) -> {}", verdict(&r)),
        );
        r
    }
    fn outstanding_bytes(&self, s: &TracedStream) -> u64 {
        // Only the compute release asks (for the audit): a good marker in the trace.
        let bytes = self.0.outstanding_bytes(&s.inner);
        note(
            Some(s.who),
            format_args!("releasing compute, {bytes} bytes outstanding"),
        );
        bytes
    }
    fn flawed_alloc_unchecked(
        &self,
        s: &TracedStream,
        shape: &Shape,
    ) -> Result<SimWorkingSet, DeviceError> {
        let r = self.0.flawed_alloc_unchecked(&s.inner, shape);
        note(
            Some(s.who),
            format_args!("FLAW alloc ignoring free memory -> {}", verdict(&r)),
        );
        r
    }
    fn flawed_free_unsynced(&self, s: &TracedStream, ws: SimWorkingSet) -> Result<(), DeviceError> {
        let r = self.0.flawed_free_unsynced(&s.inner, ws);
        note(
            Some(s.who),
            format_args!("FLAW stream-ordered free, no sync -> {}", verdict(&r)),
        );
        r
    }
}
