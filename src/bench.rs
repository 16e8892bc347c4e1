//! `twolock bench prove`: single-lock against two-lock, W ∈ {1, 2, 3}, each allocation
//! strategy, on the same partitions in one run.

use std::path::Path;

use serde::Serialize;

use crate::device::{AllocStrategy, Device, Footprint};
use crate::prover::{prep, LockMode, Pipeline, PipelineConfig, RsSource};
use crate::sync::Arc;
use crate::workload::Workload;
use crate::{Error, Proof};

#[derive(Clone, Debug, Serialize)]
pub struct ProveRow {
    pub mode: LockMode,
    pub workers: usize,
    pub strategy: AllocStrategy,
    pub partitions: usize,
    /// The batch: from the first partition's first step to the last one's end. The
    /// per-partition time and the throughput divide this.
    pub wall_ms: f64,
    /// Outside the batch: loading the key, the host memory the device lends, starting
    /// and joining the workers (once per key in a long-running prover).
    pub setup_ms: f64,
    pub per_partition_ms: f64,
    pub throughput_per_s: f64,
    pub compute_busy: f64,
    pub mem_overlap: f64,
    pub fallbacks: usize,
    pub cpu_ms_per_partition: f64,
    pub prep_ms_per_partition: f64,
    pub bg2_ms_per_partition: f64,
    pub compute_hold_ms_per_partition: f64,
    /// Compute lock free before the first hold, between holds, after the last (ms).
    pub idle_ramp_ms: f64,
    pub idle_gaps_ms: f64,
    pub idle_tail_ms: f64,
    pub errors: usize,
    /// Every proof of this configuration equals the first configuration's (same r, s).
    pub agrees: bool,
}

/// Bytes of one partition's working set on the benchmarked device.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct WorkingSetBytes {
    pub full: u64,
    /// The fallback footprint (one MSM chunk of scratch).
    pub chunked: u64,
}

/// The whole matrix of one `bench prove` run.
#[derive(Clone, Debug, Serialize)]
pub struct ProveBench {
    pub rows: Vec<ProveRow>,
    pub working_set: WorkingSetBytes,
    /// The first configuration's proofs (the ones compared with ark-groth16).
    #[serde(skip)]
    pub proofs: Vec<Option<Proof>>,
}

/// Runs the batch of `w` once per configuration on devices built by `make`, each with
/// `base`'s settings but the configuration's mode and workers; writes the last
/// configuration's Gantt picture to `gantt`.
pub fn prove_matrix<D: Device>(
    w: &Workload,
    configs: &[(LockMode, usize, AllocStrategy)],
    base: &PipelineConfig,
    gantt: Option<&Path>,
    mut make: impl FnMut(AllocStrategy) -> Result<Vec<D>, Error>,
) -> Result<ProveBench, Error> {
    let batch = w.batch(&RsSource::Seeded(7))?;
    let shape = prep::shape(&batch.matrices)?;
    let mut rows = Vec::new();
    let mut working_set = None;
    let mut first: Option<Vec<Option<Proof>>> = None;
    for (i, &(mode, workers, strategy)) in configs.iter().enumerate() {
        let devices = make(strategy)?;
        if let Some(d) = devices.first() {
            working_set.get_or_insert(WorkingSetBytes {
                full: d.working_set_bytes(&shape, Footprint::Full),
                chunked: d.working_set_bytes(&shape, Footprint::Chunked),
            });
        }
        let pipeline = Pipeline::new(
            devices,
            PipelineConfig {
                workers_per_device: workers,
                mode,
                ..base.clone()
            },
        );
        let run = pipeline.prove_batch(Arc::clone(&batch));
        let sum = run.timeline.summary(batch.partitions.len());
        // The timeline's span, or the whole run where nothing was recorded.
        let total = run.wall.as_secs_f64();
        let wall = if sum.wall_ms > 0.0 {
            sum.wall_ms / 1e3
        } else {
            total
        };
        let proofs: Vec<Option<Proof>> = run.results.iter().map(|r| r.clone().ok()).collect();
        let agrees = first.as_ref().is_none_or(|f| *f == proofs);
        first.get_or_insert(proofs);
        rows.push(ProveRow {
            mode,
            workers,
            strategy,
            partitions: batch.partitions.len(),
            wall_ms: wall * 1e3,
            setup_ms: (total - wall).max(0.0) * 1e3,
            per_partition_ms: wall * 1e3 / batch.partitions.len() as f64,
            throughput_per_s: batch.partitions.len() as f64 / wall,
            compute_busy: sum.compute_busy,
            mem_overlap: sum.mem_overlap,
            fallbacks: run.fallbacks,
            cpu_ms_per_partition: sum.cpu_ms_per_partition,
            prep_ms_per_partition: sum.prep_ms_per_partition,
            bg2_ms_per_partition: sum.bg2_ms_per_partition,
            compute_hold_ms_per_partition: sum.compute_hold_ms_per_partition,
            idle_ramp_ms: sum.idle_ramp_ms,
            idle_gaps_ms: sum.idle_gaps_ms,
            idle_tail_ms: sum.idle_tail_ms,
            errors: run.results.iter().filter(|r| r.is_err()).count(),
            agrees,
        });
        if let (Some(path), true) = (gantt, i + 1 == configs.len()) {
            let title = format!(
                "{} partitions, {mode}, W={workers}, {strategy}: {:.1} s",
                batch.partitions.len(),
                wall
            );
            let svg = crate::prover::gantt::svg(&run.timeline.spans(), &title);
            std::fs::write(path, svg).map_err(|source| Error::Io {
                path: path.display().to_string(),
                source,
            })?;
        }
        tracing::info!(
            "bench prove: config {}/{} ({mode}, W={workers}, {strategy}) in {:.1} s",
            i + 1,
            configs.len(),
            wall
        );
    }
    Ok(ProveBench {
        rows,
        working_set: working_set.unwrap_or(WorkingSetBytes {
            full: 0,
            chunked: 0,
        }),
        proofs: first.unwrap_or_default(),
    })
}

/// ark-groth16 on all of the machine's cores on the same partitions and r, s.
#[derive(Clone, Debug, Serialize)]
pub struct ArkworksRow {
    pub threads: usize,
    /// Partitions actually proved (0: the comparison was skipped).
    pub measured: usize,
    pub ms_per_partition: f64,
    /// The batch time, extrapolated from `measured` partitions when fewer than all.
    pub batch_ms: f64,
    pub extrapolated: bool,
    /// ark-groth16's proofs (same r, s) that equal the benchmarked pipeline's.
    pub equal_proofs: usize,
}

/// Proves the first `partitions` of the batch of `w` with ark-groth16 (multithreaded
/// through rayon); the batch time is extrapolated from them when they are fewer than
/// all, and none (0) skips the comparison. Each proof is compared with
/// `pipeline_proofs[i]` (the same r, s).
pub fn arkworks_baseline(
    w: &Workload,
    partitions: usize,
    pipeline_proofs: &[Option<Proof>],
) -> Result<ArkworksRow, Error> {
    let all = w.assignments.len();
    let measured = partitions.min(all);
    if measured == 0 {
        // Skipped: nothing measured, nothing extrapolated (and no batch built).
        return Ok(ArkworksRow {
            threads: rayon::current_num_threads(),
            measured: 0,
            ms_per_partition: 0.0,
            batch_ms: 0.0,
            extrapolated: false,
            equal_proofs: 0,
        });
    }
    let batch = w.batch(&RsSource::Seeded(7))?;
    let mut proofs = Vec::with_capacity(measured);
    let start = std::time::Instant::now();
    for (i, z) in w.assignments.iter().take(measured).enumerate() {
        let (r, s) = batch.rs[i];
        proofs.push(crate::reference::proof(&w.key.pk, &w.matrices, z, r, s)?);
    }
    let ms = start.elapsed().as_secs_f64() * 1e3 / measured as f64;
    let equal_proofs = proofs
        .iter()
        .zip(pipeline_proofs)
        .filter(|(ark, ours)| ours.as_ref() == Some(*ark))
        .count();
    Ok(ArkworksRow {
        threads: rayon::current_num_threads(),
        measured,
        ms_per_partition: ms,
        batch_ms: ms * all as f64,
        extrapolated: measured < all,
        equal_proofs,
    })
}

/// The table `bench prove` prints; "vs 1lock" is the throughput over single-lock's
/// with the same W and allocation strategy, where that configuration ran.
pub fn prove_table(rows: &[ProveRow]) -> String {
    let base = |r: &ProveRow| {
        rows.iter()
            .find(|b| {
                b.mode == LockMode::Single && b.workers == r.workers && b.strategy == r.strategy
            })
            .map(|b| b.throughput_per_s)
    };
    let mut s = format!(
        "{:<12} {:>2} {:<6} {:>10} {:>9} {:>9} {:>7} {:>5} {:>17} {:>7} {:>5} {:>9} {:>8} {:>8} {:>8} {:>4} {:>8}\n",
        "mode",
        "W",
        "alloc",
        "batch ms",
        "setup ms",
        "ms/part",
        "part/s",
        "busy",
        "idle ramp/gap/end",
        "overlap",
        "fallb",
        "hold ms",
        "prep ms",
        "B_G2 ms",
        "errors",
        "same",
        "vs 1lock"
    );
    for r in rows {
        s += &format!(
            "{:<12} {:>2} {:<6} {:>10.1} {:>9.1} {:>9.1} {:>7.2} {:>4.0}% {:>17} {:>6.0}% {:>5} {:>9.1} {:>8.1} {:>8.1} {:>8} {:>4} {:>8}\n",
            r.mode.to_string(),
            r.workers,
            r.strategy.to_string(),
            r.wall_ms,
            r.setup_ms,
            r.per_partition_ms,
            r.throughput_per_s,
            r.compute_busy * 100.0,
            format!(
                "{:.0}/{:.0}/{:.0}",
                r.idle_ramp_ms, r.idle_gaps_ms, r.idle_tail_ms
            ),
            r.mem_overlap * 100.0,
            r.fallbacks,
            r.compute_hold_ms_per_partition,
            r.prep_ms_per_partition,
            r.bg2_ms_per_partition,
            r.errors,
            if r.agrees { "yes" } else { "NO" },
            base(r)
                .map(|b| format!("{:.2}x", r.throughput_per_s / b))
                .unwrap_or_default()
        );
    }
    s
}
