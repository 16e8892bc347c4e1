//! `twolock`: prove a batch on the two-lock pipeline, stress it, benchmark it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
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
    version,
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
        #[arg(long)]
        json: bool,
    },
    /// CUDA NTT against floors and sppark (needs `--features cuda`).
    Ntt,
    /// CUDA G1 MSM against arkworks and sppark (needs `--features cuda`).
    Msm,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "twolock=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Prove(a) => prove(a),
        Command::Stress(a) => stress_cmd(a),
        Command::Bench(a) => bench(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
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
    };
    (0..p.devices.max(1)).map(|_| SimDevice::new(cfg)).collect()
}

/// Resolves `auto` and rejects `cuda` where it cannot run.
fn resolve(kind: DeviceKind) -> Result<DeviceKind, Error> {
    match kind {
        DeviceKind::Sim => Ok(DeviceKind::Sim),
        DeviceKind::Auto => Ok(DeviceKind::Sim),
        DeviceKind::Cuda => Err(Error::Usage(
            "the CUDA device is not part of the pipeline yet: use --device sim".into(),
        )),
    }
}

fn prove(a: ProveArgs) -> Result<ExitCode, Error> {
    let kind = resolve(a.pipeline.device)?;
    let w = build_workload(&a.workload)?;
    let devices = match kind {
        _ => sim_devices(&a.pipeline, a.pipeline.alloc),
    };
    run_prove(&a, &w, devices)
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
    let pipeline = Pipeline::new(
        devices,
        PipelineConfig {
            workers_per_device: a.pipeline.workers,
            mode: a.pipeline.mode,
            sim_cpu_prep: Duration::from_millis(a.pipeline.sim_cpu_ms),
            ..Default::default()
        },
    )
    .with_progress(move || tick.inc(1));
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
            "wall {:.1} ms, {:.1} ms/partition, compute busy {:.0}%, mem holds overlapping compute {:.0}%, fallbacks {}",
            summary.wall_ms,
            summary.per_partition_ms,
            summary.compute_busy * 100.0,
            summary.mem_overlap * 100.0,
            run.fallbacks
        );
        if let Some(p) = &a.trace {
            println!("trace written to {}", p.display());
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn stress_cmd(a: StressArgs) -> Result<ExitCode, Error> {
    let kind = resolve(a.device)?;
    let mut wa = a.workload.clone();
    wa.partitions = wa.partitions.min(16);
    let w = build_workload(&wa)?;
    let list = stress::scenarios(a.workload.partitions, a.soak, a.workload.seed);
    let outcomes = match kind {
        _ => run_stress::<SimDevice>(&a, &w, &list)?,
    };
    let report = json!({ "device": format!("{kind:?}"), "circuit": w.spec, "outcomes": outcomes });
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
        out.push(stress::run_scenario::<D>(
            w,
            s,
            a.workers,
            Duration::from_secs(a.lock_timeout_s),
        )?);
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
            let mut configs = Vec::new();
            for workers in [1, 2, 3] {
                for mode in [LockMode::Single, LockMode::Two] {
                    configs.push((mode, workers, AllocStrategy::Pool));
                }
            }
            for s in [AllocStrategy::Sync, AllocStrategy::Arena] {
                configs.push((LockMode::Two, 3, s));
            }
            let rows = twolock::bench::prove_matrix(
                &w,
                &configs,
                Duration::from_millis(pipeline.sim_cpu_ms),
                |s| Ok(sim_devices(&pipeline, s)),
            )?;
            if json {
                println!("{:#}", serde_json::to_value(&rows).unwrap_or_default());
            } else {
                println!(
                    "bench prove: {} x {} 2^{} on sim (upload {} ms, kernels {} ms, CPU prep +{} ms per partition)",
                    workload.partitions, workload.family, workload.log_constraints,
                    pipeline.sim_upload_ms, pipeline.sim_kernel_ms, pipeline.sim_cpu_ms
                );
                print!("{}", twolock::bench::prove_table(&rows));
            }
            Ok(ExitCode::SUCCESS)
        }
        BenchWhat::Ntt | BenchWhat::Msm => Err(Error::Usage(
            "bench ntt / bench msm need the CUDA kernels: not built yet".into(),
        )),
    }
}
