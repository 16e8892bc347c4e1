//! `twolock bench prove`: single-lock against two-lock, W ∈ {1, 2, 3}, each allocation
//! strategy, on the same partitions in one run.

use std::time::Duration;

use serde::Serialize;

use crate::device::{AllocStrategy, Device};
use crate::prover::{LockMode, Pipeline, PipelineConfig, RsSource};
use crate::sync::Arc;
use crate::workload::Workload;
use crate::Error;

#[derive(Clone, Debug, Serialize)]
pub struct ProveRow {
    pub mode: LockMode,
    pub workers: usize,
    pub strategy: AllocStrategy,
    pub partitions: usize,
    pub wall_ms: f64,
    pub per_partition_ms: f64,
    pub throughput_per_s: f64,
    pub compute_busy: f64,
    pub mem_overlap: f64,
    pub fallbacks: usize,
    pub cpu_ms_per_partition: f64,
    pub errors: usize,
}

/// Runs the batch of `w` once per configuration on devices built by `make`.
pub fn prove_matrix<D: Device>(
    w: &Workload,
    configs: &[(LockMode, usize, AllocStrategy)],
    sim_cpu_prep: Duration,
    mut make: impl FnMut(AllocStrategy) -> Result<Vec<D>, Error>,
) -> Result<Vec<ProveRow>, Error> {
    let batch = w.batch(&RsSource::Seeded(7))?;
    let mut rows = Vec::new();
    for &(mode, workers, strategy) in configs {
        let pipeline = Pipeline::new(
            make(strategy)?,
            PipelineConfig {
                workers_per_device: workers,
                mode,
                sim_cpu_prep,
                ..Default::default()
            },
        );
        let run = pipeline.prove_batch(Arc::clone(&batch));
        let sum = run.timeline.summary(batch.partitions.len());
        let wall = run.wall.as_secs_f64();
        rows.push(ProveRow {
            mode,
            workers,
            strategy,
            partitions: batch.partitions.len(),
            wall_ms: wall * 1e3,
            per_partition_ms: wall * 1e3 / batch.partitions.len() as f64,
            throughput_per_s: batch.partitions.len() as f64 / wall,
            compute_busy: sum.compute_busy,
            mem_overlap: sum.mem_overlap,
            fallbacks: run.fallbacks,
            cpu_ms_per_partition: sum.cpu_ms_per_partition,
            errors: run.results.iter().filter(|r| r.is_err()).count(),
        });
    }
    Ok(rows)
}

/// ark-groth16 on all of the machine's cores on the same partitions and r, s.
#[derive(Clone, Debug, Serialize)]
pub struct ArkworksRow {
    pub threads: usize,
    /// Partitions actually proved (all of them up to 2^20 constraints, else one).
    pub measured: usize,
    pub ms_per_partition: f64,
    /// The batch time, extrapolated from `measured` partitions when fewer than all.
    pub batch_ms: f64,
    pub extrapolated: bool,
}

/// Proves the batch of `w` with ark-groth16 (multithreaded through rayon): every
/// partition up to 2^`full_log` constraints, one partition above, extrapolated.
pub fn arkworks_baseline(w: &Workload, full_log: u32) -> Result<ArkworksRow, Error> {
    let batch = w.batch(&RsSource::Seeded(7))?;
    let all = w.assignments.len();
    let measured = if w.spec.log_constraints <= full_log {
        all
    } else {
        all.min(1)
    };
    let start = std::time::Instant::now();
    for (i, z) in w.assignments.iter().take(measured).enumerate() {
        let (r, s) = batch.rs[i];
        crate::reference::proof(&w.key.pk, &w.matrices, z, r, s)?;
    }
    let ms = start.elapsed().as_secs_f64() * 1e3 / measured.max(1) as f64;
    Ok(ArkworksRow {
        threads: rayon::current_num_threads(),
        measured,
        ms_per_partition: ms,
        batch_ms: ms * all as f64,
        extrapolated: measured < all,
    })
}

pub fn prove_table(rows: &[ProveRow]) -> String {
    let base = rows
        .iter()
        .find(|r| r.mode == LockMode::Single && r.workers == 3)
        .map(|r| r.throughput_per_s);
    let mut s = format!(
        "{:<12} {:>2} {:<6} {:>10} {:>10} {:>8} {:>8} {:>8} {:>6} {:>8} {:>8}\n",
        "mode",
        "W",
        "alloc",
        "wall ms",
        "ms/part",
        "part/s",
        "busy",
        "overlap",
        "fallb",
        "cpu ms",
        "vs 1lock"
    );
    for r in rows {
        s += &format!(
            "{:<12} {:>2} {:<6} {:>10.1} {:>10.1} {:>8.2} {:>7.0}% {:>7.0}% {:>6} {:>8.1} {:>8}\n",
            r.mode.to_string(),
            r.workers,
            r.strategy.to_string(),
            r.wall_ms,
            r.per_partition_ms,
            r.throughput_per_s,
            r.compute_busy * 100.0,
            r.mem_overlap * 100.0,
            r.fallbacks,
            r.cpu_ms_per_partition,
            base.map(|b| format!("{:.2}x", r.throughput_per_s / b))
                .unwrap_or_default()
        );
    }
    s
}
