//! The timeline: every phase of every partition with its start and end, written as
//! Chrome trace-event JSON (Perfetto, chrome://tracing) and summarized.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::device::WorkerId;
use crate::sync::Mutex;

/// A phase of one partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Waiting for the prep gate (one CPU prep at a time).
    PrepWait,
    Prep,
    MemWait,
    MemHold,
    ComputeWait,
    ComputeHold,
    Fallback,
    Upload,
    WitnessMap,
    MsmH,
    MsmL,
    MsmA,
    MsmBG1,
    Sync,
    Free,
    BG2,
    Assemble,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::PrepWait => "prep wait",
            Phase::Prep => "prep",
            Phase::MemWait => "mem wait",
            Phase::MemHold => "mem hold",
            Phase::ComputeWait => "compute wait",
            Phase::ComputeHold => "compute hold",
            Phase::Fallback => "fallback",
            Phase::Upload => "upload",
            Phase::WitnessMap => "witness map",
            Phase::MsmH => "msm H",
            Phase::MsmL => "msm L",
            Phase::MsmA => "msm A",
            Phase::MsmBG1 => "msm B_G1",
            Phase::Sync => "sync",
            Phase::Free => "free",
            Phase::BG2 => "B_G2 (cpu)",
            Phase::Assemble => "assemble",
        }
    }
}

/// One recorded interval.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Span {
    pub partition: usize,
    pub worker: WorkerId,
    pub phase: Phase,
    pub start_us: u64,
    pub end_us: u64,
}

/// A shared recorder. Disabled timelines record nothing (the loom models use one, so
/// instrumentation adds no interleavings).
#[derive(Debug)]
pub struct Timeline {
    origin: Instant,
    spans: Option<Mutex<Vec<Span>>>,
}

impl Timeline {
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            spans: Some(Mutex::new(Vec::new())),
        }
    }

    pub fn disabled() -> Self {
        Self {
            origin: Instant::now(),
            spans: None,
        }
    }

    pub fn now_us(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64
    }

    pub fn record(&self, partition: usize, worker: WorkerId, phase: Phase, start_us: u64) {
        if let Some(spans) = &self.spans {
            let end_us = self.now_us();
            spans.lock().push(Span {
                partition,
                worker,
                phase,
                start_us,
                end_us,
            });
        }
    }

    pub fn spans(&self) -> Vec<Span> {
        self.spans
            .as_ref()
            .map(|s| s.lock().clone())
            .unwrap_or_default()
    }

    /// Spans of `phase` recorded by the workers of device `device`.
    pub fn count_on(&self, device: usize, phase: Phase) -> usize {
        self.spans.as_ref().map_or(0, |s| {
            s.lock()
                .iter()
                .filter(|sp| sp.phase == phase && sp.worker.device == device)
                .count()
        })
    }

    /// Chrome trace-event JSON: one process per device, one thread lane per worker.
    pub fn chrome_trace(&self) -> serde_json::Value {
        let events: Vec<_> = self
            .spans()
            .iter()
            .map(|s| {
                serde_json::json!({
                    "name": s.phase.name(),
                    "cat": if matches!(s.phase, Phase::MemHold | Phase::ComputeHold) { "lock" } else { "phase" },
                    "ph": "X",
                    "ts": s.start_us,
                    "dur": s.end_us.saturating_sub(s.start_us),
                    "pid": s.worker.device,
                    "tid": s.worker.worker,
                    "args": { "partition": s.partition },
                })
            })
            .collect();
        serde_json::json!({ "traceEvents": events, "displayTimeUnit": "ms" })
    }

    pub fn summary(&self, partitions: usize) -> Summary {
        Summary::of(&self.spans(), partitions)
    }
}

impl Default for Timeline {
    fn default() -> Self {
        Self::new()
    }
}

/// What the timeline says about a batch.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Summary {
    pub wall_ms: f64,
    pub per_partition_ms: f64,
    /// Fraction of the wall time some worker held compute (per device, averaged).
    pub compute_busy: f64,
    /// Fraction of mem-hold time that overlapped another worker's compute hold.
    pub mem_overlap: f64,
    pub fallbacks: usize,
    /// Sum of CPU prep and B_G2 per partition, averaged (the CPU critical path).
    pub cpu_ms_per_partition: f64,
    /// CPU prep (witness, a/b/c, scalar classification) per partition, averaged.
    pub prep_ms_per_partition: f64,
    /// B_G2 on the CPU per partition, averaged.
    pub bg2_ms_per_partition: f64,
    /// Compute-lock hold per partition, averaged.
    pub compute_hold_ms_per_partition: f64,
    /// Where each device's compute lock was free (ms, averaged over devices): before its
    /// first hold (the batch's ramp-up: the first prep and upload), between holds, and
    /// after its last hold (the last partition's CPU finish). Together with the holds
    /// they make up the wall time, so `compute_busy` = holds / (holds + idle).
    pub idle_ramp_ms: f64,
    pub idle_gaps_ms: f64,
    pub idle_tail_ms: f64,
}

impl Summary {
    pub fn of(spans: &[Span], partitions: usize) -> Self {
        if spans.is_empty() {
            return Self::default();
        }
        let start = spans.iter().map(|s| s.start_us).min().unwrap_or(0);
        let end = spans.iter().map(|s| s.end_us).max().unwrap_or(0);
        let wall = end.saturating_sub(start).max(1) as f64;
        let of = |p: Phase| spans.iter().filter(move |s| s.phase == p);
        let devices = spans.iter().map(|s| s.worker.device).max().unwrap_or(0) + 1;
        let compute: u64 = of(Phase::ComputeHold).map(|s| s.end_us - s.start_us).sum();
        let mem: Vec<_> = of(Phase::MemHold).collect();
        let mem_total: u64 = mem.iter().map(|s| s.end_us - s.start_us).sum();
        let overlapped: u64 = mem
            .iter()
            .map(|m| {
                of(Phase::ComputeHold)
                    .filter(|c| c.worker != m.worker && c.worker.device == m.worker.device)
                    .map(|c| {
                        m.end_us
                            .min(c.end_us)
                            .saturating_sub(m.start_us.max(c.start_us))
                    })
                    .sum::<u64>()
                    .min(m.end_us - m.start_us)
            })
            .sum();
        let total = |p: Phase| of(p).map(|s| s.end_us - s.start_us).sum::<u64>();
        let (prep, bg2) = (total(Phase::Prep), total(Phase::BG2));
        let n = partitions.max(1) as f64;
        let per_partition_ms = |us: u64| us as f64 / 1e3 / n;
        let [ramp, gaps, tail] = (0..devices).fold([0u64; 3], |acc, d| {
            let idle = idle_of(
                of(Phase::ComputeHold).filter(|s| s.worker.device == d),
                start,
                end,
            );
            [acc[0] + idle[0], acc[1] + idle[1], acc[2] + idle[2]]
        });
        let per_device_ms = |us: u64| us as f64 / 1e3 / devices as f64;
        Self {
            wall_ms: wall / 1e3,
            per_partition_ms: wall / 1e3 / n,
            compute_busy: compute as f64 / wall / devices as f64,
            mem_overlap: if mem_total == 0 {
                0.0
            } else {
                overlapped as f64 / mem_total as f64
            },
            fallbacks: of(Phase::Fallback).count(),
            cpu_ms_per_partition: per_partition_ms(prep + bg2),
            prep_ms_per_partition: per_partition_ms(prep),
            bg2_ms_per_partition: per_partition_ms(bg2),
            compute_hold_ms_per_partition: per_partition_ms(compute),
            idle_ramp_ms: per_device_ms(ramp),
            idle_gaps_ms: per_device_ms(gaps),
            idle_tail_ms: per_device_ms(tail),
        }
    }
}

/// A device's idle time within [start, end) around its compute holds (which never
/// overlap: one compute lock per device): before the first, between, after the last.
/// A device that never held compute was idle throughout, counted as ramp-up.
fn idle_of<'a>(holds: impl Iterator<Item = &'a Span>, start: u64, end: u64) -> [u64; 3] {
    let mut holds: Vec<(u64, u64)> = holds.map(|s| (s.start_us, s.end_us)).collect();
    holds.sort_unstable();
    let (Some(first), Some(last)) = (holds.first(), holds.last()) else {
        return [end.saturating_sub(start), 0, 0];
    };
    let gaps = holds
        .windows(2)
        .map(|w| w[1].0.saturating_sub(w[0].1))
        .sum();
    [
        first.0.saturating_sub(start),
        gaps,
        end.saturating_sub(last.1),
    ]
}

/// Times `f` as `phase` of `partition`.
pub fn timed<T>(
    t: &Timeline,
    partition: usize,
    worker: WorkerId,
    phase: Phase,
    f: impl FnOnce() -> T,
) -> T {
    let start = t.now_us();
    let out = f();
    t.record(partition, worker, phase, start);
    out
}

/// Wall time as a Duration, for reports.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A span of worker `worker` on device 0 (partition = worker), for unit tests.
#[cfg(test)]
pub(crate) fn test_span(worker: usize, phase: Phase, start_us: u64, end_us: u64) -> Span {
    Span {
        partition: worker,
        worker: WorkerId { device: 0, worker },
        phase,
        start_us,
        end_us,
    }
}

#[cfg(test)]
mod tests {
    use super::test_span as span;
    use super::*;

    #[test]
    fn summary_splits_the_cpu_path_and_measures_overlap() {
        // Worker 0 computes in [100, 300) while worker 1 holds mem in [200, 400).
        let spans = [
            span(0, Phase::Prep, 0, 100),
            span(0, Phase::ComputeHold, 100, 300),
            span(0, Phase::BG2, 300, 340),
            span(1, Phase::Prep, 0, 200),
            span(1, Phase::MemHold, 200, 400),
            span(1, Phase::ComputeHold, 400, 500),
            span(1, Phase::BG2, 500, 520),
        ];
        let s = Summary::of(&spans, 2);
        assert_eq!(s.wall_ms, 0.52);
        assert!((s.compute_busy - 300.0 / 520.0).abs() < 1e-12);
        assert_eq!(s.mem_overlap, 0.5);
        assert!((s.prep_ms_per_partition - 0.15).abs() < 1e-12);
        assert!((s.bg2_ms_per_partition - 0.03).abs() < 1e-12);
        assert!((s.cpu_ms_per_partition - 0.18).abs() < 1e-12);
        assert!((s.compute_hold_ms_per_partition - 0.15).abs() < 1e-12);
        // Compute was free in [0, 100) and [300, 400) and after 500.
        assert_eq!(
            (s.idle_ramp_ms, s.idle_gaps_ms, s.idle_tail_ms),
            (0.1, 0.1, 0.02)
        );
        assert_eq!(Summary::of(&[], 3), Summary::default());
    }

    #[test]
    fn idle_time_adds_up_per_device() {
        let on = |device: usize, worker: usize, phase: Phase, start_us: u64, end_us: u64| Span {
            partition: worker,
            worker: WorkerId { device, worker },
            phase,
            start_us,
            end_us,
        };
        // Device 0 holds compute in [50, 100) and [100, 150) (no gap); device 1 in
        // [20, 40) and [90, 180), then nothing: the batch ends at 200.
        let spans = [
            on(0, 0, Phase::Prep, 0, 50),
            on(0, 1, Phase::ComputeHold, 100, 150),
            on(0, 0, Phase::ComputeHold, 50, 100),
            on(1, 0, Phase::ComputeHold, 20, 40),
            on(1, 1, Phase::ComputeHold, 90, 180),
            on(1, 1, Phase::Assemble, 180, 200),
        ];
        let s = Summary::of(&spans, 4);
        let ms = |us: f64| us / 1e3;
        assert!((s.idle_ramp_ms - ms((50.0 + 20.0) / 2.0)).abs() < 1e-12);
        assert!((s.idle_gaps_ms - ms(50.0 / 2.0)).abs() < 1e-12);
        assert!((s.idle_tail_ms - ms((50.0 + 20.0) / 2.0)).abs() < 1e-12);
        // Holds plus idle is the wall on each device, so busy = holds / (holds + idle).
        let idle = s.idle_ramp_ms + s.idle_gaps_ms + s.idle_tail_ms;
        assert!((s.compute_busy - (1.0 - idle / s.wall_ms)).abs() < 1e-12);
        // A device that never computes idles the whole batch, as ramp-up.
        assert_eq!(idle_of(std::iter::empty(), 10, 70), [60, 0, 0]);
    }
}
