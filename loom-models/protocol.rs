//! The two-lock protocol (`src/prover/protocol.rs`) on `SimDevice`, model-checked with
//! loom: the real pipeline code, with every `Mutex`, `Condvar`, `Arc`, atomic and thread
//! of the pipeline and of the device swapped for loom's by `--cfg twolock_loom`.
//!
//! Every explored execution must hold (`common::assert_safe`): no deadlock (loom);
//! VRAM never over-committed, no device-global call under mem while another worker has
//! kernels in flight, the working set truly free before compute is released (the
//! audit); both locks free and no device memory held after the batch, on error paths
//! too; each partition finished exactly once, with the reference prover's proof; no
//! fallback when two working sets fit.
//!
//! Preemption bounds: each preemption allowed multiplies the executions by about ten,
//! and each execution proves its partitions for real (~2-3 ms). Bound 3 for `smoke`,
//! 2 for the sweep's two-worker and three-way-fallback configurations and the fault
//! models, 1 for the rest (the table at `sweep_grid!` says why). `ci/loom.sh` records
//! each model's bound, executions and time; the whole suite must stay under 10 minutes
//! on 2 cores.

#![cfg(twolock_loom)]

#[path = "common/mod.rs"]
mod common;

use common::{verify, Case};
use twolock::device::faults::Fault;
use twolock::device::{AllocSite, AllocStrategy, Stage};
use twolock::prover::LockMode;

/// W=2, 2 partitions, ample VRAM (3 working sets), pool allocator. Bound 3.
#[test]
fn smoke() {
    verify("smoke", 3, Case::new(2, 2, 3, AllocStrategy::Pool));
}

/// The sweep: W ∈ {2, 3} × 2..=4 partitions, for one allocation strategy and VRAM for
/// `$sets` working sets. One test per configuration, named `sweep::<strategy>::<sets>::
/// w<W>_p<P>`, so that a failure can be replayed alone. Preemption bounds, with the
/// executions measured for the pool allocator and room for one set:
///
/// | W | P | bound | executions | why this bound |
/// |---|---|-------|------------|----------------|
/// | 2 | 2 | 2     | ~600       | cheap |
/// | 2 | 3 | 2     | ~1,800     | cheap; a worker comes back for a third partition |
/// | 2 | 4 | 2     | ~3,800     | ~10 s |
/// | 3 | 2 | 1     | ~180       | the third worker finds no partition: little new |
/// | 3 | 3 | 2 with one set, else 1 | ~18,800 / ~300 | three-way contention (one computes, one holds mem waiting for compute, one waits for mem); with one set that is the fallback under both locks, worth the ~60 s |
/// | 3 | 4 | 1     | ~400       | bound 2 would take minutes |
///
/// Each preemption allowed multiplies the executions by about ten, and every execution
/// proves its partitions for real (~2-3 ms each).
macro_rules! sweep_grid {
    ($strategy:ident, $sets:literal, w3_p3 bound $w3_p3:literal) => {
        use crate::{verify, AllocStrategy, Case};

        fn model(workers: usize, partitions: usize, bound: usize) {
            let name = format!(
                "{}::w{workers}_p{partitions}",
                module_path!().trim_start_matches("loom_protocol::")
            );
            let case = Case::new(workers, partitions, $sets, AllocStrategy::$strategy);
            verify(&name, bound, case);
        }

        #[test]
        fn w2_p2() {
            model(2, 2, 2);
        }
        #[test]
        fn w2_p3() {
            model(2, 3, 2);
        }
        #[test]
        fn w2_p4() {
            model(2, 4, 2);
        }
        #[test]
        fn w3_p2() {
            model(3, 2, 1);
        }
        #[test]
        fn w3_p3() {
            model(3, 3, $w3_p3);
        }
        #[test]
        fn w3_p4() {
            model(3, 4, 1);
        }
    };
}

mod sweep {
    /// `cudaMalloc` / `cudaFree` (free is device-synchronizing).
    mod sync {
        /// Room for one working set: every pre-stage that finds a live set falls back.
        mod one_set {
            sweep_grid!(Sync, 1, w3_p3 bound 2);
        }
        /// Room for two: the pre-stage always fits, no fallback.
        mod two_sets {
            sweep_grid!(Sync, 2, w3_p3 bound 1);
        }
        mod three_sets {
            sweep_grid!(Sync, 3, w3_p3 bound 1);
        }
    }
    /// `cudaMallocAsync` / `cudaFreeAsync` on a pool (frees complete at a stream sync).
    mod pool {
        mod one_set {
            sweep_grid!(Pool, 1, w3_p3 bound 2);
        }
        mod two_sets {
            sweep_grid!(Pool, 2, w3_p3 bound 1);
        }
        mod three_sets {
            sweep_grid!(Pool, 3, w3_p3 bound 1);
        }
    }
    /// Slots preallocated per batch.
    mod arena {
        mod one_set {
            sweep_grid!(Arena, 1, w3_p3 bound 2);
        }
        mod two_sets {
            sweep_grid!(Arena, 2, w3_p3 bound 1);
        }
        mod three_sets {
            sweep_grid!(Arena, 3, w3_p3 bound 1);
        }
    }
}

/// One test per allocation strategy, named `<model>::<strategy>`: `$case` builds the
/// case from `strategy`.
macro_rules! per_strategy {
    ($(#[$doc:meta])* $model:ident, bound $bound:literal, |$strategy:ident| $case:expr) => {
        $(#[$doc])*
        mod $model {
            use super::*;

            fn model($strategy: AllocStrategy) {
                let name = format!(
                    "{}::{}",
                    module_path!().trim_start_matches("loom_protocol::"),
                    $strategy
                );
                verify(&name, $bound, $case);
            }

            #[test]
            fn sync() {
                model(AllocStrategy::Sync);
            }
            #[test]
            fn pool() {
                model(AllocStrategy::Pool);
            }
            #[test]
            fn arena() {
                model(AllocStrategy::Arena);
            }
        }
    };
}

per_strategy! {
    /// A kernel fails under compute (the batch's first MSM L launch): that partition is a
    /// typed error, the others are right, locks and memory are released. W=2, P=3, room
    /// for two sets. Bound 2.
    kernel_fault_releases_locks_and_memory, bound 2, |strategy| {
        Case::new(2, 3, 2, strategy).faults(vec![Fault::Kernel {
            stage: Some(Stage::MsmL),
            nth: 0,
        }])
    }
}

per_strategy! {
    /// The same with three workers (a third waits on mem while the faulting worker holds
    /// compute and the second holds mem): the first witness map fails. W=3, P=3. Bound 1.
    kernel_fault_with_three_workers, bound 1, |strategy| {
        Case::new(3, 3, 2, strategy).faults(vec![Fault::Kernel {
            stage: Some(Stage::WitnessMap),
            nth: 0,
        }])
    }
}

per_strategy! {
    /// The second upload fails; with room for one set it is a pre-stage upload under mem or
    /// a fallback upload under both locks, depending on the interleaving. W=2, P=3. Bound 2.
    upload_fault_releases_locks_and_memory, bound 2, |strategy| {
        Case::new(2, 3, 1, strategy).faults(vec![Fault::Kernel {
            stage: Some(Stage::Upload),
            nth: 1,
        }])
    }
}

per_strategy! {
    /// A pre-stage allocation fails (Oom) with room for two sets: the worker falls back
    /// under compute, and the batch is still right and clean. W=2, P=3. Bound 2.
    prestage_alloc_fault_falls_back, bound 2, |strategy| {
        Case::new(2, 3, 2, strategy).faults(vec![Fault::Alloc {
            site: Some(AllocSite::PreStage),
            nth: 0,
        }])
    }
}

per_strategy! {
    /// Both fallback allocations of one partition fail while it holds mem and compute: a
    /// typed Oom for it, both locks released, the others right. W=2, P=3, one set. Bound 2.
    fallback_alloc_fault_releases_both_locks, bound 2, |strategy| {
        Case::new(2, 3, 1, strategy).faults(vec![
            Fault::Alloc {
                site: Some(AllocSite::Fallback),
                nth: 0,
            },
            Fault::Alloc {
                site: Some(AllocSite::FallbackChunked),
                nth: 0,
            },
        ])
    }
}

per_strategy! {
    /// The single-lock baseline (one lock around alloc, upload and compute) is safe too.
    /// W=2, P=3, room for one set. Bound 2.
    single_lock_baseline, bound 2, |strategy| {
        Case::new(2, 3, 1, strategy).mode(LockMode::Single)
    }
}

/// Several devices, one pair of locks and W workers each, sharing one partition queue
/// (the multi-GPU pipeline): every execution must pass the same checks, across devices.
/// A device's locks are its own, so a model with one worker per device explores only the
/// queue and the shared audit; two workers per device add the locks. Pool allocation.
mod multi_device {
    use super::*;

    /// Two devices × one worker, three partitions, room for two sets each: a worker
    /// comes back to the shared queue while the other device computes. Bound 2.
    #[test]
    fn d2_w1_p3() {
        let case = Case::new(1, 3, 2, AllocStrategy::Pool).more_devices(&[2]);
        verify("multi_device::d2_w1_p3", 2, case);
    }

    /// Two devices × two workers, four partitions; device 0 has room for one set (its
    /// workers fall back under both of its locks) while device 1 has three. Bound 1.
    #[test]
    fn d2_w2_p4_one_squeezed() {
        let case = Case::new(2, 4, 1, AllocStrategy::Pool).more_devices(&[3]);
        verify("multi_device::d2_w2_p4_one_squeezed", 1, case);
    }

    /// A launch fault on device 0 with two devices × two workers: where device 0 gets a
    /// partition, that partition is a typed error (and only that one), the other device
    /// is unaffected, everything is released. Bound 1.
    #[test]
    fn d2_w2_p3_kernel_fault() {
        let case = Case::new(2, 3, 2, AllocStrategy::Pool)
            .more_devices(&[2])
            .faults(vec![Fault::Kernel {
                stage: Some(Stage::MsmL),
                nth: 0,
            }]);
        verify("multi_device::d2_w2_p3_kernel_fault", 1, case);
    }

    /// Four devices × one worker, four partitions. Bound 1.
    #[test]
    fn d4_w1_p4() {
        let case = Case::new(1, 4, 2, AllocStrategy::Pool).more_devices(&[2, 2, 2]);
        verify("multi_device::d4_w1_p4", 1, case);
    }
}
