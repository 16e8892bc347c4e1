//! `twolock`: prove a batch on the two-lock pipeline, stress it, benchmark it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use twolock::circuits::{CircuitSpec, Family};
use twolock::device::sim::{SimConfig, SimDevice, SimTiming};
use twolock::device::{AllocStrategy, Device};
use twolock::prover::{LockMode, Pipeline, PipelineConfig, RsSource};
use twolock::stress::{self, StressDevice};
use twolock::workload::{Check, KeyChoice, Workload};
use twolock::Error;

#[derive(Parser)]
#[command(
    name = "twolock",
    version = concat!(env!("CARGO_PKG_VERSION"), " (kernels ", env!("TWOLOCK_KERNELS"), ")"),
    about = "Correctness-first harness around a two-lock GPU Groth16 prover (BLS12-381)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Prove a batch of partitions on the pipeline and check every proof.
    Prove(ProveArgs),
    /// Run the stress scenarios (squeeze, faults, soak) and report.
    Stress(StressArgs),
    /// Benchmarks: `prove` (pipeline), `ntt` and `msm` (CUDA kernels).
    Bench(BenchArgs),
    /// Allocates and frees VRAM in a loop until killed (the stress runner's external
    /// pressure process).
    #[command(hide = true)]
    Pressure(PressureArgs),
}

#[derive(Args)]
struct PressureArgs {
    #[arg(long, default_value_t = 0)]
    ordinal: usize,
    /// Bytes per allocation (MiB).
    #[arg(long, default_value_t = 1024)]
    chunk_mib: usize,
    /// Allocations held at the peak of each cycle.
    #[arg(long, default_value_t = 4)]
    chunks: usize,
    /// Pause between steps (ms).
    #[arg(long, default_value_t = 5)]
    period_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum DeviceKind {
    /// CUDA if a GPU is present and the crate was built with `cuda`, else sim.
    Auto,
    Sim,
    Cuda,
}

#[derive(Args, Clone)]
struct WorkloadArgs {
    #[arg(long, value_enum, default_value_t = Family::Boolean)]
    family: Family,
    /// log2 of the number of constraints (the QAP domain size).
    #[arg(long = "log", default_value_t = 12)]
    log_constraints: u32,
    #[arg(long, default_value_t = 10)]
    partitions: usize,
    /// Public inputs per partition (at least 1).
    #[arg(long, default_value_t = 1)]
    inputs: usize,
    /// Seed of the witnesses (partition i uses seed + i) and of the key.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Use a synthetic key even where a real one is affordable (sizes > 2^16 always do).
    #[arg(long)]
    synthetic: bool,
    /// Prove under the key in this file (as written by --save-key); it is validated:
    /// lengths against the circuit, every point on the curve and in the subgroup.
    #[arg(long, conflicts_with = "synthetic")]
    key: Option<PathBuf>,
    /// Write the key used to this file.
    #[arg(long)]
    save_key: Option<PathBuf>,
}

#[derive(Args, Clone)]
struct PipelineArgs {
    #[arg(long, value_enum, default_value_t = DeviceKind::Auto)]
    device: DeviceKind,
    /// Number of devices (sim: that many simulated GPUs; cuda: the first N GPUs).
    #[arg(long, default_value_t = 1)]
    devices: usize,
    #[arg(long, default_value_t = 3)]
    workers: usize,
    #[arg(long, value_enum, default_value_t = LockMode::Two)]
    mode: LockMode,
    #[arg(long, value_enum, default_value_t = AllocStrategy::Pool)]
    alloc: AllocStrategy,
    /// Sim: VRAM capacity in GiB.
    #[arg(long, default_value_t = 80.0)]
    sim_vram_gib: f64,
    /// Sim: simulated upload time per partition (ms).
    #[arg(long, default_value_t = 0)]
    sim_upload_ms: u64,
    /// Sim: simulated kernel time per partition (ms), split over the witness map and
    /// the four MSMs.
    #[arg(long, default_value_t = 0)]
    sim_kernel_ms: u64,
    /// Sim: extra simulated CPU prep time per partition (ms).
    #[arg(long, default_value_t = 0)]
    sim_cpu_ms: u64,
    /// Page-locked host memory (MiB) the workers may borrow for a, b, c, over all
    /// devices; workers past it upload through staging. Default: a quarter of the RAM.
    #[arg(long)]
    max_lent_mib: Option<u64>,
}

impl PipelineArgs {
    /// The pipeline's settings these flags give (mode and workers included).
    fn config(&self) -> PipelineConfig {
        let default = PipelineConfig::default();
        PipelineConfig {
            workers_per_device: self.workers,
            mode: self.mode,
            sim_cpu_prep: Duration::from_millis(self.sim_cpu_ms),
            max_lent_host_bytes: self
                .max_lent_mib
                .map_or(default.max_lent_host_bytes, |mib| {
                    mib.saturating_mul(1 << 20)
                }),
            ..default
        }
    }
}

#[derive(Args)]
struct ProveArgs {
    #[command(flatten)]
    workload: WorkloadArgs,
    #[command(flatten)]
    pipeline: PipelineArgs,
    /// Write a Chrome trace-event JSON timeline (opens in Perfetto / chrome://tracing).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Write a Gantt picture (SVG): one lane per worker, lock holds coloured.
    #[arg(long)]
    gantt: Option<PathBuf>,
    /// Machine-readable output on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct StressArgs {
    #[command(flatten)]
    workload: WorkloadArgs,
    #[arg(long, value_enum, default_value_t = DeviceKind::Sim)]
    device: DeviceKind,
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// Devices, each with its own pair of locks and `--workers` workers. Device 0 takes
    /// each scenario's squeeze and faults (and, on CUDA, the external pressure); the
    /// others keep their whole memory.
    #[arg(long, default_value_t = 1)]
    devices: usize,
    /// Partitions in the random-fault soak.
    #[arg(long, default_value_t = 200)]
    soak: usize,
    /// Lock wait bound in seconds (a timeout counts as a deadlock).
    #[arg(long, default_value_t = 60)]
    lock_timeout_s: u64,
    /// Write the JSON report here.
    #[arg(long)]
    report: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct BenchArgs {
    #[command(subcommand)]
    what: BenchWhat,
}

#[derive(Subcommand)]
enum BenchWhat {
    /// Single- against two-lock, W ∈ {1,2,3}, each allocation strategy.
    Prove {
        #[command(flatten)]
        workload: WorkloadArgs,
        #[command(flatten)]
        pipeline: PipelineArgs,
        /// Run only these configurations, MODE:W:ALLOC (e.g. `two:3:pool`), instead of
        /// the whole matrix (single and two, W = 1..3, pool; two-lock W = 3 sync, arena).
        #[arg(long = "config", value_parser = parse_bench_config)]
        configs: Vec<(LockMode, usize, AllocStrategy)>,
        /// Write a Gantt picture (SVG) of the last configuration's timeline.
        #[arg(long)]
        gantt: Option<PathBuf>,
        /// Partitions ark-groth16 proves for the comparison (the rest of the batch is
        /// extrapolated, and labelled so); 0 skips it. Default: the whole batch up to
        /// 2^20 constraints, one partition above.
        #[arg(long)]
        ark_partitions: Option<usize>,
        #[arg(long)]
        json: bool,
    },
    /// CUDA NTT against its floors and sppark (needs `--features cuda`).
    Ntt(KernelBenchArgs),
    /// CUDA G1 MSM against arkworks and sppark (needs `--features cuda`).
    Msm(KernelBenchArgs),
}

#[derive(Args, Clone)]
struct KernelBenchArgs {
    /// Smallest log2 size.
    #[arg(long, default_value_t = 16)]
    log_min: u32,
    /// Largest log2 size.
    #[arg(long, default_value_t = 26)]
    log_max: u32,
    /// Timed runs per size (after warm-up).
    #[arg(long, default_value_t = 10)]
    runs: usize,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    ordinal: usize,
    /// Skip the arkworks CPU comparison (MSM) above this log2 size.
    #[arg(long, default_value_t = 26)]
    cpu_log_max: u32,
    /// MSM only: force c-bit windows instead of the planner's choice (for tuning it).
    #[arg(long)]
    window_bits: Option<u32>,
    /// MSM only: batch-affine rounds before the XYZZ accumulation, one run of every
    /// size per value (comma-separated; 0 = off). Default: the library's (AffineRounds::DEFAULT).
    #[arg(long, value_delimiter = ',')]
    affine_rounds: Vec<u32>,
    /// MSM only: log2 of the sorted entries per batch-affine sub-pass (its scratch is
    /// about 100 bytes an entry). Default: the library's.
    #[arg(long)]
    affine_entries_log: Option<u32>,
    /// MSM only: pairs per inversion in the batch-affine rounds, one run of every
    /// size per value and round count (comma-separated). Default: the library's.
    #[arg(long, value_delimiter = ',')]
    affine_batch: Vec<usize>,
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "twolock=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // Whether `stress` was given --log (its CUDA default differs, see stress_cmd).
    let log_given = matches
        .subcommand_matches("stress")
        .is_some_and(|m| m.value_source("log_constraints") == Some(ValueSource::CommandLine));
    let result = match cli.command {
        Command::Prove(a) => prove(a),
        Command::Stress(a) => stress_cmd(a, log_given),
        Command::Bench(a) => bench(a),
        Command::Pressure(a) => pressure(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `MODE:W:ALLOC`, e.g. `two:3:pool`.
fn parse_bench_config(v: &str) -> Result<(LockMode, usize, AllocStrategy), String> {
    let parts: Vec<&str> = v.split(':').collect();
    let [mode, workers, alloc] = parts[..] else {
        return Err(format!("`{v}`: expected MODE:W:ALLOC, e.g. two:3:pool"));
    };
    let mode = LockMode::from_str(mode, true).map_err(|e| format!("`{v}`: mode: {e}"))?;
    let workers = workers
        .parse::<usize>()
        .ok()
        .filter(|&w| w > 0)
        .ok_or_else(|| format!("`{v}`: W must be a positive integer"))?;
    let alloc = AllocStrategy::from_str(alloc, true).map_err(|e| format!("`{v}`: alloc: {e}"))?;
    Ok((mode, workers, alloc))
}

fn spinner(msg: &str) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

fn build_workload(a: &WorkloadArgs) -> Result<Workload, Error> {
    let spec = CircuitSpec::new(a.family, a.log_constraints, a.inputs)?;
    let key = if a.synthetic {
        KeyChoice::Synthetic { seed: a.seed }
    } else {
        KeyChoice::auto(&spec, a.seed)
    };
    let what = match (&a.key, key) {
        (Some(_), _) => "loaded",
        (None, KeyChoice::Real { .. }) => "real (cached)",
        (None, KeyChoice::Synthetic { .. }) => "synthetic",
    };
    let pb = spinner(&format!(
        "building {} circuit 2^{} and its {what} key",
        a.family, a.log_constraints
    ));
    let w = match &a.key {
        Some(path) => twolock::workload::key_from_file(path, &spec)
            .and_then(|k| Workload::with_key(spec, k, a.partitions, a.seed)),
        None => Workload::build(spec, key, a.partitions, a.seed),
    };
    pb.finish_and_clear();
    let w = w?;
    if let Some(path) = &a.save_key {
        let bytes = twolock::keys::save_key(&w.key.pk);
        std::fs::write(path, bytes).map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        })?;
    }
    Ok(w)
}

fn sim_devices(p: &PipelineArgs, strategy: AllocStrategy) -> Vec<SimDevice> {
    let ms = Duration::from_millis;
    let cfg = SimConfig {
        capacity: (p.sim_vram_gib * (1u64 << 30) as f64) as u64,
        strategy,
        release_threshold: 0,
        timing: SimTiming {
            upload: ms(p.sim_upload_ms),
            witness_map: ms(p.sim_kernel_ms) / 5,
            msm: ms(p.sim_kernel_ms) / 5,
        },
        stream_limit: None,
    };
    (0..p.devices.max(1)).map(|_| SimDevice::new(cfg)).collect()
}

/// GPUs usable by the CUDA device: 0 without the `cuda` feature or without a driver.
fn gpu_count() -> usize {
    #[cfg(feature = "cuda")]
    {
        twolock::device::cuda::CudaDevice::count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

/// Resolves `auto` (cuda where a GPU is usable, else sim) and rejects `cuda` where it
/// cannot run, saying why.
fn resolve(kind: DeviceKind) -> Result<DeviceKind, Error> {
    let usable = gpu_count() > 0;
    match kind {
        DeviceKind::Sim => Ok(DeviceKind::Sim),
        DeviceKind::Auto if usable => Ok(DeviceKind::Cuda),
        DeviceKind::Auto => {
            tracing::info!("no usable GPU (or built without `cuda`): using the simulated device");
            Ok(DeviceKind::Sim)
        }
        DeviceKind::Cuda if usable => Ok(DeviceKind::Cuda),
        DeviceKind::Cuda if cfg!(feature = "cuda") => Err(Error::Usage(
            "--device cuda: no CUDA driver or no GPU on this machine (use --device sim)".into(),
        )),
        DeviceKind::Cuda => Err(Error::Usage(
            "--device cuda: this binary was built without CUDA support \
             (rebuild with the `cuda` feature: cargo run --release --features cuda -- ...)"
                .into(),
        )),
    }
}

/// The first `p.devices` GPUs, each with `strategy`.
#[cfg(feature = "cuda")]
fn cuda_devices(
    p: &PipelineArgs,
    strategy: AllocStrategy,
) -> Result<Vec<twolock::device::cuda::CudaDevice>, Error> {
    let available = gpu_count();
    if p.devices > available {
        return Err(Error::Usage(format!(
            "--devices {}: only {available} GPU(s) present",
            p.devices
        )));
    }
    (0..p.devices.max(1))
        .map(|i| twolock::device::cuda::CudaDevice::new(i, strategy).map_err(Error::from))
        .collect()
}

fn prove(a: ProveArgs) -> Result<ExitCode, Error> {
    let kind = resolve(a.pipeline.device)?;
    let w = build_workload(&a.workload)?;
    match kind {
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => run_prove(&a, &w, cuda_devices(&a.pipeline, a.pipeline.alloc)?),
        _ => run_prove(&a, &w, sim_devices(&a.pipeline, a.pipeline.alloc)),
    }
}

fn run_prove<D: Device>(a: &ProveArgs, w: &Workload, devices: Vec<D>) -> Result<ExitCode, Error> {
    let names: Vec<String> = devices.iter().map(|d| d.describe()).collect();
    let bar = ProgressBar::new(w.assignments.len() as u64).with_style(
        ProgressStyle::with_template(
            "{spinner} proving [{bar:30}] {pos}/{len} partitions {elapsed}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let tick = bar.clone();
    let pipeline = Pipeline::new(devices, a.pipeline.config()).with_progress(move || tick.inc(1));
    let batch = w.batch(&RsSource::Seeded(a.workload.seed))?;
    let run = pipeline.prove_batch(batch.clone());
    bar.finish_and_clear();
    let pb = spinner("checking proofs against the reference prover and the verifier");
    let mut rows = Vec::new();
    for (i, r) in run.results.iter().enumerate() {
        let verdict = match r {
            Ok(p) => match w.check(&batch, i, p)? {
                Check::Verified => "verified".to_string(),
                Check::MatchesReference => "matches reference (synthetic key)".to_string(),
                Check::Wrong => "WRONG".to_string(),
            },
            Err(e) => format!("error: {e}"),
        };
        rows.push((i, verdict));
    }
    pb.finish_and_clear();
    let summary = run.timeline.summary(w.assignments.len());
    if let Some(path) = &a.trace {
        let text = serde_json::to_string(&run.timeline.chrome_trace())
            .map_err(|e| Error::Usage(e.to_string()))?;
        std::fs::write(path, text).map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        })?;
    }
    if let Some(path) = &a.gantt {
        let title = format!(
            "{} x {} 2^{}, {}, {} workers/device on {}",
            rows.len(),
            w.spec.family,
            w.spec.log_constraints,
            a.pipeline.mode,
            a.pipeline.workers,
            names.join(", ")
        );
        let svg = twolock::prover::gantt::svg(&run.timeline.spans(), &title);
        std::fs::write(path, svg).map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        })?;
    }
    let ok = rows
        .iter()
        .all(|(_, v)| v == "verified" || v.starts_with("matches"));
    if a.json {
        let out = json!({
            "devices": names,
            "circuit": w.spec,
            "key": w.key.provenance,
            "mode": a.pipeline.mode,
            "workers": a.pipeline.workers,
            "proofs": rows.iter().map(|(i, v)| json!({"partition": i, "result": v})).collect::<Vec<_>>(),
            "summary": summary,
            "ok": ok,
        });
        println!("{out:#}");
    } else {
        println!(
            "twolock prove: {} partitions of {} 2^{} ({} key) on {} — {}, {} workers/device",
            rows.len(),
            w.spec.family,
            w.spec.log_constraints,
            w.key.provenance,
            names.join(", "),
            a.pipeline.mode,
            a.pipeline.workers
        );
        println!("{:>9}  result", "partition");
        for (i, v) in &rows {
            println!("{i:>9}  {v}");
        }
        println!(
            "wall {:.1} ms, {:.1} ms/partition, compute busy {:.0}% (idle {:.1} ms ramp-up, {:.1} between holds, {:.1} at the end), mem holds overlapping compute {:.0}%, fallbacks {}",
            summary.wall_ms,
            summary.per_partition_ms,
            summary.compute_busy * 100.0,
            summary.idle_ramp_ms,
            summary.idle_gaps_ms,
            summary.idle_tail_ms,
            summary.mem_overlap * 100.0,
            run.fallbacks
        );
        if let Some(p) = &a.trace {
            println!("trace written to {}", p.display());
        }
        if let Some(p) = &a.gantt {
            println!("Gantt picture written to {}", p.display());
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn stress_cmd(mut a: StressArgs, log_given: bool) -> Result<ExitCode, Error> {
    let kind = resolve(a.device)?;
    if a.devices == 0 {
        return Err(Error::Usage("--devices must be at least 1".into()));
    }
    if kind == DeviceKind::Cuda && !log_given {
        // The CUDA pool maps memory in 32 MiB steps, about one working set at 2^14: at
        // 2^16 a set spans a few steps, so half a set still holds a chunked fallback
        // and the k < 1 rows exercise it (each k is measured, see `measure`).
        a.workload.log_constraints = 16;
    }
    let mut wa = a.workload.clone();
    wa.partitions = wa.partitions.min(16);
    let w = build_workload(&wa)?;
    #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
    let mut list = stress::scenarios(a.workload.partitions, a.soak, a.workload.seed);
    let outcomes = match kind {
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => {
            let available = gpu_count();
            if a.devices > available {
                return Err(Error::Usage(format!(
                    "--devices {}: only {available} GPU(s) present",
                    a.devices
                )));
            }
            let exe = std::env::current_exe().map_err(|source| Error::Io {
                path: "current executable".into(),
                source,
            })?;
            list.push(stress::pressure_scenario(a.workload.partitions, exe));
            run_stress::<twolock::device::cuda::CudaDevice>(&a, &w, &list)?
        }
        _ => run_stress::<SimDevice>(&a, &w, &list)?,
    };
    let report = json!({
        "device": format!("{kind:?}"),
        "devices": a.devices,
        "circuit": w.spec,
        "outcomes": outcomes,
    });
    if let Some(p) = &a.report {
        std::fs::write(p, format!("{report:#}")).map_err(|source| Error::Io {
            path: p.display().to_string(),
            source,
        })?;
    }
    if a.json {
        println!("{report:#}");
    } else {
        print!("{}", stress::table(&outcomes));
    }
    Ok(if outcomes.iter().all(|o| o.passed()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn run_stress<D: StressDevice>(
    a: &StressArgs,
    w: &Workload,
    list: &[stress::Scenario],
) -> Result<Vec<stress::Outcome>, Error> {
    let bar = ProgressBar::new(list.len() as u64).with_style(
        ProgressStyle::with_template("{spinner} stress [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut out = Vec::new();
    for s in list {
        bar.set_message(s.name.clone());
        let start = std::time::Instant::now();
        tracing::info!(scenario = %s.name, "stress: scenario starts");
        let o = stress::run_scenario_on::<D>(
            w,
            s,
            a.workers,
            a.devices,
            Duration::from_secs(a.lock_timeout_s),
        )?;
        // In logs (where the bar is not drawn) a slow or stuck row is then named.
        tracing::info!(
            scenario = %s.name,
            elapsed_ms = start.elapsed().as_millis() as u64,
            ok = o.passed(),
            "stress: scenario done"
        );
        out.push(o);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(out)
}

fn bench(a: BenchArgs) -> Result<ExitCode, Error> {
    match a.what {
        BenchWhat::Prove {
            workload,
            mut pipeline,
            configs,
            gantt,
            ark_partitions,
            json,
        } => {
            let kind = resolve(pipeline.device)?;
            if kind == DeviceKind::Sim && pipeline.sim_kernel_ms == 0 {
                // GPU time per partition about equal to CPU time per partition.
                pipeline.sim_upload_ms = 40;
                pipeline.sim_kernel_ms = 60;
                pipeline.sim_cpu_ms = 100;
            }
            let w = build_workload(&workload)?;
            let configs = if configs.is_empty() {
                let mut all = Vec::new();
                for workers in [1, 2, 3] {
                    for mode in [LockMode::Single, LockMode::Two] {
                        all.push((mode, workers, AllocStrategy::Pool));
                    }
                }
                for s in [AllocStrategy::Sync, AllocStrategy::Arena] {
                    all.push((LockMode::Two, 3, s));
                }
                all
            } else {
                configs
            };
            let base = pipeline.config();
            let bench = match kind {
                #[cfg(feature = "cuda")]
                DeviceKind::Cuda => {
                    twolock::bench::prove_matrix(&w, &configs, &base, gantt.as_deref(), |s| {
                        cuda_devices(&pipeline, s)
                    })?
                }
                _ => twolock::bench::prove_matrix(&w, &configs, &base, gantt.as_deref(), |s| {
                    Ok(sim_devices(&pipeline, s))
                })?,
            };
            let rows = &bench.rows;
            let pb = spinner("ark-groth16 on the same partitions");
            let ark_partitions = ark_partitions.unwrap_or(if workload.log_constraints <= 20 {
                workload.partitions
            } else {
                1
            });
            let ark = twolock::bench::arkworks_baseline(&w, ark_partitions, &bench.proofs)?;
            pb.finish_and_clear();
            let mismatched =
                rows.iter().any(|r| !r.agrees || r.errors > 0) || ark.equal_proofs < ark.measured;
            if json {
                println!(
                    "{:#}",
                    json!({ "configs": rows, "working_set": bench.working_set, "arkworks": ark })
                );
            } else {
                let on = if kind == DeviceKind::Sim {
                    format!(
                        "sim (upload {} ms, kernels {} ms per partition)",
                        pipeline.sim_upload_ms, pipeline.sim_kernel_ms
                    )
                } else {
                    "cuda".to_string()
                };
                println!(
                    "bench prove: {} x {} 2^{} on {on}, CPU prep +{} ms per partition",
                    workload.partitions,
                    workload.family,
                    workload.log_constraints,
                    pipeline.sim_cpu_ms
                );
                print!("{}", twolock::bench::prove_table(rows));
                let best = rows.iter().map(|r| r.throughput_per_s).fold(0.0, f64::max);
                if ark.measured == 0 {
                    println!("ark-groth16: skipped (--ark-partitions 0)");
                } else {
                    println!(
                        "ark-groth16 on {} threads: {:.1} ms/partition ({}); best configuration {:.1}x its throughput; \
                         {}/{} of its proofs equal the first configuration's",
                        ark.threads,
                        ark.ms_per_partition,
                        if ark.extrapolated {
                            format!(
                                "{} of {} partitions, the batch extrapolated",
                                ark.measured,
                                w.assignments.len()
                            )
                        } else {
                            format!("all {} partitions", ark.measured)
                        },
                        best * ark.ms_per_partition / 1e3,
                        ark.equal_proofs,
                        ark.measured
                    );
                }
                let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
                println!(
                    "working set per partition: {:.1} MiB full, {:.1} MiB chunked (fallback); \
                     a worker falls back when the full set does not fit in free VRAM",
                    mib(bench.working_set.full),
                    mib(bench.working_set.chunked)
                );
                if let Some(g) = &gantt {
                    println!("gantt of the last configuration: {}", g.display());
                }
            }
            Ok(if mismatched {
                eprintln!("error: a configuration returned errors or proofs that differ from ark-groth16's");
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        #[cfg(feature = "cuda")]
        BenchWhat::Ntt(k) => kernels::bench_ntt(&k),
        #[cfg(feature = "cuda")]
        BenchWhat::Msm(k) => kernels::bench_msm(&k),
        #[cfg(not(feature = "cuda"))]
        BenchWhat::Ntt(_) | BenchWhat::Msm(_) => Err(Error::Usage(
            "bench ntt / bench msm run the CUDA kernels: build with --features cuda \
             (and --features peer-sppark for the sppark comparison)"
                .into(),
        )),
    }
}

#[cfg(feature = "cuda")]
fn pressure(a: PressureArgs) -> Result<ExitCode, Error> {
    use twolock::device::cuda::Gpu;
    let gpu = Gpu::new(a.ordinal).map_err(twolock::device::DeviceError::from)?;
    let s = gpu
        .new_stream()
        .map_err(twolock::device::DeviceError::from)?;
    let bytes = a.chunk_mib << 20;
    let pause = Duration::from_millis(a.period_ms);
    let mut first = true;
    loop {
        let mut held = Vec::new();
        for _ in 0..a.chunks {
            // An allocation that fails is pressure too: the prover took the memory.
            if let Ok(b) = gpu.alloc_sync::<u8>(&s, bytes) {
                held.push(b);
            }
            if first {
                println!("ready");
                first = false;
            }
            std::thread::sleep(pause);
        }
        for b in held {
            let _ = b.free();
            std::thread::sleep(pause);
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn pressure(_: PressureArgs) -> Result<ExitCode, Error> {
    Err(Error::Usage(
        "pressure needs a GPU: build with --features cuda".into(),
    ))
}

/// `bench ntt` and `bench msm`: our kernels against their floors, arkworks on every
/// core, and sppark (with `--features peer-sppark`) on the same inputs in one run.
#[cfg(feature = "cuda")]
mod kernels {
    use std::process::ExitCode;
    use std::time::Instant;

    use ark_bls12_381::{G1Affine, G1Projective};
    use ark_ec::VariableBaseMSM;
    use serde_json::json;
    use twolock::device::cuda::{msm, Gpu};
    use twolock::device::DeviceError;
    use twolock::Error;

    use super::KernelBenchArgs;

    /// The digest of the `cuda/` sources these kernels were built from (build.rs).
    const KERNELS: &str = env!("TWOLOCK_KERNELS");

    fn sizes(k: &KernelBenchArgs) -> Result<Vec<u32>, Error> {
        if k.log_min == 0 || k.log_min > k.log_max || k.log_max > 26 {
            return Err(Error::Usage(format!(
                "sizes 2^{}..2^{}: need 1 <= log-min <= log-max <= 26",
                k.log_min, k.log_max
            )));
        }
        Ok((k.log_min..=k.log_max).collect())
    }

    fn gpu(k: &KernelBenchArgs) -> Result<Gpu, Error> {
        Gpu::new(k.ordinal).map_err(|e| Error::Device(DeviceError::from(e)))
    }

    fn dev(e: twolock::device::cuda::CudaError) -> Error {
        Error::Device(DeviceError::from(e))
    }

    /// `v` to `prec` decimals followed by `unit`, or "—" where there is no value (a
    /// peer that did not run, a ratio without its peer).
    fn or_dash(v: Option<f64>, prec: usize, unit: &str) -> String {
        v.map_or_else(|| "—".to_string(), |v| format!("{v:.prec$}{unit}"))
    }

    pub fn bench_ntt(k: &KernelBenchArgs) -> Result<ExitCode, Error> {
        let logs = sizes(k)?;
        let gpu = gpu(k)?;
        eprintln!(
            "bench ntt: 2^{}..2^{} on {}, {} runs each (kernels {KERNELS})",
            k.log_min,
            k.log_max,
            gpu.name(),
            k.runs
        );
        let ours = twolock::device::cuda::bench_ntt(&gpu, &logs, k.runs).map_err(dev)?;
        let mut rows = Vec::new();
        for t in &ours {
            let peer = peer_ntt(t.log_n, k.runs)?;
            let ratio = peer.map(|p| t.median_ms / p);
            eprintln!(
                "  2^{}: {:.3} ms, with scratch {:.3} ms (sppark {})",
                t.log_n,
                t.median_ms,
                t.scratch_median_ms,
                or_dash(peer, 3, " ms")
            );
            rows.push(json!({
                "log_n": t.log_n,
                "ours": t,
                "sppark_ms": peer,
                "ours_over_sppark": ratio,
                "scratch_over_sppark": peer.map(|p| t.scratch_median_ms / p),
            }));
        }
        let out = json!({ "gpu": gpu.name(), "kernels": KERNELS, "runs": k.runs, "rows": rows });
        if k.json {
            println!("{out:#}");
        } else {
            println!(
                "bench ntt on {} (forward, natural order, median of {} runs)",
                gpu.name(),
                k.runs.max(10)
            );
            println!(
                "{:>5} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8}",
                "log n",
                "ours ms",
                "scratch ms",
                "mem floor",
                "mul floor",
                "copy GB/s",
                "sppark ms",
                "ratio",
                "scr/spk"
            );
            for t in &ours {
                let p = rows
                    .iter()
                    .find(|r| r["log_n"] == t.log_n)
                    .and_then(|r| r["sppark_ms"].as_f64());
                println!(
                    "{:>5} {:>10.3} {:>10.3} {:>10.3} {:>10.3} {:>10.0} {:>10} {:>8} {:>8}",
                    t.log_n,
                    t.median_ms,
                    t.scratch_median_ms,
                    t.memory_floor_ms,
                    t.mul_floor_ms,
                    t.copy_gbps,
                    or_dash(p, 3, ""),
                    or_dash(p.map(|p| t.median_ms / p), 2, ""),
                    or_dash(p.map(|p| t.scratch_median_ms / p), 2, ""),
                );
            }
        }
        Ok(ExitCode::SUCCESS)
    }

    #[cfg(feature = "peer-sppark")]
    fn peer_ntt(log_n: u32, runs: usize) -> Result<Option<f64>, Error> {
        let v = msm::random_scalars(1 << log_n, u64::from(log_n));
        twolock::peer::sppark_ntt_forward(&v, runs.max(10))
            .map(|t| Some(t.median_ms))
            .map_err(|e| Error::Usage(format!("sppark NTT 2^{log_n}: {e}")))
    }

    #[cfg(not(feature = "peer-sppark"))]
    fn peer_ntt(_: u32, _: usize) -> Result<Option<f64>, Error> {
        Ok(None)
    }

    #[cfg(feature = "peer-sppark")]
    fn peer_msm(
        bases: &[G1Affine],
        scalars: &[ark_bls12_381::Fr],
        runs: usize,
    ) -> Result<Option<(f64, G1Projective)>, Error> {
        twolock::peer::sppark_msm_g1(bases, scalars, runs)
            .map(|t| Some((t.median_ms, t.value)))
            .map_err(|e| Error::Usage(format!("sppark MSM: {e}")))
    }

    #[cfg(not(feature = "peer-sppark"))]
    fn peer_msm(
        _: &[G1Affine],
        _: &[ark_bls12_381::Fr],
        _: usize,
    ) -> Result<Option<(f64, G1Projective)>, Error> {
        Ok(None)
    }

    pub fn bench_msm(k: &KernelBenchArgs) -> Result<ExitCode, Error> {
        let logs = sizes(k)?;
        let gpu = gpu(k)?;
        eprintln!(
            "bench msm: 2^{}..2^{} on {}, {} runs each (kernels {KERNELS})",
            k.log_min,
            k.log_max,
            gpu.name(),
            k.runs
        );
        let d = msm::AffineRounds::DEFAULT;
        fn or_default<T: Copy>(v: &[T], x: T) -> Vec<T> {
            if v.is_empty() {
                vec![x]
            } else {
                v.to_vec()
            }
        }
        let all_rounds = or_default(&k.affine_rounds, d.rounds);
        let batches = or_default(&k.affine_batch, d.batch);
        let entries_log = k.affine_entries_log.unwrap_or(d.entries.ilog2());
        if entries_log > 31 || batches.contains(&0) {
            return Err(Error::Usage(format!(
                "--affine-entries-log {entries_log} (at most 31), --affine-batch values ≥ 1"
            )));
        }
        // Off once; on for every (rounds, batch) pair.
        let settings = all_rounds.iter().flat_map(|&rounds| {
            let batches: &[usize] = if rounds == 0 { &[0] } else { &batches };
            batches.iter().map(move |&batch| {
                (rounds > 0).then_some(msm::AffineRounds {
                    rounds,
                    entries: 1 << entries_log,
                    batch,
                })
            })
        });
        let mut ours = Vec::new();
        for affine in settings {
            ours.extend(
                msm::bench_msm_with(&gpu, &logs, k.runs, k.window_bits, affine).map_err(dev)?,
            );
        }
        // The same bases and scalars bench_msm used.
        let bases = msm::walk_bases(1 << k.log_max, 1);
        let threads = rayon_threads();
        let mut rows = Vec::new();
        let mut ok = true;
        // The peers run once per size, whatever the number of affine settings.
        let mut peers = std::collections::BTreeMap::new();
        for t in &ours {
            let n = 1usize << t.log_n;
            if let std::collections::btree_map::Entry::Vacant(slot) = peers.entry(t.log_n) {
                let scalars = msm::random_scalars(n, u64::from(t.log_n));
                let cpu = if t.log_n <= k.cpu_log_max {
                    let start = Instant::now();
                    let p = G1Projective::msm(&bases[..n], &scalars)
                        .map_err(|_| Error::Usage("arkworks MSM: length mismatch".into()))?;
                    Some((start.elapsed().as_secs_f64() * 1e3, p))
                } else {
                    None
                };
                slot.insert((cpu, peer_msm(&bases[..n], &scalars, k.runs)?));
            }
            let (cpu, peer) = peers[&t.log_n];
            let agree_cpu = cpu.map(|(_, p)| Some(p) == t.result);
            let agree_peer = peer.map(|(_, p)| Some(p) == t.result);
            ok &= t.consistent && agree_cpu != Some(false) && agree_peer != Some(false);
            eprintln!(
                "  2^{} ({} affine rounds, batch {}): {:.2} ms (arkworks {}, sppark {})",
                t.log_n,
                t.affine_rounds,
                t.affine.map_or(0, |a| a.batch),
                t.median_ms,
                or_dash(cpu.map(|c| c.0), 1, " ms"),
                or_dash(peer.map(|p| p.0), 2, " ms")
            );
            rows.push(json!({
                "log_n": t.log_n,
                "ours": t,
                "arkworks_ms": cpu.map(|c| c.0),
                "arkworks_threads": threads,
                "sppark_ms": peer.map(|p| p.0),
                "equal_to_arkworks": agree_cpu,
                "equal_to_sppark": agree_peer,
                "ours_over_sppark": peer.map(|p| t.median_ms / p.0),
                "speedup_over_arkworks": cpu.map(|c| c.0 / t.median_ms),
            }));
        }
        let out = json!({ "gpu": gpu.name(), "kernels": KERNELS, "runs": k.runs, "rows": rows, "ok": ok });
        if k.json {
            println!("{out:#}");
        } else {
            println!("bench msm on {} (G1, resident bases, scalars from pinned host memory; device time plus the host's finish, median of {} runs); arkworks on {threads} threads", gpu.name(), k.runs.max(3));
            println!(
                "{:>5} {:>10} {:>10} {:>12} {:>10} {:>10} {:>9} {:>6}",
                "log n",
                "affine R/b",
                "ours ms",
                "arkworks ms",
                "speedup",
                "sppark ms",
                "ratio",
                "equal"
            );
            for r in &rows {
                let f = |key: &str, prec: usize| or_dash(r[key].as_f64(), prec, "");
                let equal = r["equal_to_arkworks"] != false
                    && r["equal_to_sppark"] != false
                    && r["ours"]["consistent"] == true;
                println!(
                    "{:>5} {:>10} {:>10} {:>12} {:>10} {:>10} {:>9} {:>6}",
                    r["log_n"],
                    (r["ours"]["affine"]["batch"].as_u64()).map_or("off".into(), |b| format!(
                        "{}/{b}",
                        r["ours"]["affine_rounds"]
                    )),
                    or_dash(r["ours"]["median_ms"].as_f64(), 2, ""),
                    f("arkworks_ms", 1),
                    f("speedup_over_arkworks", 1),
                    f("sppark_ms", 2),
                    f("ours_over_sppark", 2),
                    if equal { "yes" } else { "NO" }
                );
            }
        }
        Ok(if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        })
    }

    fn rayon_threads() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}
