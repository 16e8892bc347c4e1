//! Sensitivity: each known-bad lock design of `src/prover/flaws.rs`, run as the real
//! pipeline with `PipelineConfig::flaw` set, must be FLAGGED by the same checks that
//! `protocol.rs` applies (`common::assert_safe`, loom's deadlock detection): some
//! explored execution must fail, and the failure must name the property that catches
//! the flaw. A harness that passes a bad design has failed.
//!
//! Each model stops at the first flagged execution (measured: the first execution for
//! the free and lock-leak flaws, ~80 for `IgnoreFreeMemory`, ~140 for
//! `GlobalSyncUnderMem`, ~540 for `OppositeLockOrder`). Every bound is 2, with W=2 and 2
//! or 3 partitions: configurations the sweep of `protocol.rs` explores at bound 2, so a
//! bug of the same shape in the real protocol would fail the sweep. The two deadlock
//! models run in a child process (see `common::expect_deadlock`).

#![cfg(twolock_loom)]

#[path = "common/mod.rs"]
mod common;

use common::{expect_deadlock, expect_flagged, Case};
use twolock::device::faults::Fault;
use twolock::device::{AllocStrategy, Stage};
use twolock::prover::Flaw;

/// The smoke model of this file: the correct design passes where the flawed ones below
/// are run (W=2, 2 partitions, ample VRAM). Bound 2.
#[test]
fn smoke() {
    common::verify("smoke", 2, Case::new(2, 2, 3, AllocStrategy::Pool));
}

/// Guards against the field's failure: `cudaDeviceSynchronize` / `cudaMemPoolTrimTo`
/// under mem, blocking behind the other worker's kernels. Needs one worker computing
/// while the other pre-stages: W=2, 2 partitions, two sets. Bound 2.
#[test]
fn global_sync_under_mem() {
    let case = Case::new(2, 2, 2, AllocStrategy::Pool).flaw(Flaw::GlobalSyncUnderMem);
    expect_flagged("global_sync_under_mem", 2, case, "GlobalCallUnderMem");
}

/// Guards against assuming a stream-ordered free (`cudaFreeAsync`) makes VRAM available
/// at unlock: compute released before the free completes. Pool allocator. Bound 2.
#[test]
fn async_free_before_release() {
    let case = Case::new(2, 2, 2, AllocStrategy::Pool).flaw(Flaw::AsyncFreeBeforeRelease);
    expect_flagged("async_free_before_release", 2, case, "NotFreeAtRelease");
}

/// Guards against an error path that leaks the compute lock (a kernel fault is injected):
/// the next worker waits forever, which loom reports as a deadlock. Bound 2.
#[test]
fn leak_lock_on_error() {
    let case = Case::new(2, 2, 2, AllocStrategy::Pool)
        .faults(vec![Fault::Kernel {
            stage: Some(Stage::MsmA),
            nth: 0,
        }])
        .flaw(Flaw::LeakLockOnError);
    expect_deadlock("leak_lock_on_error", 2, case);
}

/// Guards against taking mem under compute in the fallback (compute → mem against
/// mem → compute). Needs a fallback (room for one set, W=2) and a third partition, so
/// that the worker done first pre-stages again while the other holds compute. Bound 2.
#[test]
fn opposite_lock_order() {
    let case = Case::new(2, 3, 1, AllocStrategy::Sync).flaw(Flaw::OppositeLockOrder);
    expect_deadlock("opposite_lock_order", 2, case);
}

/// Guards against freeing the working set after compute is released. Bound 2.
#[test]
fn free_after_release() {
    let case = Case::new(2, 2, 2, AllocStrategy::Pool).flaw(Flaw::FreeAfterRelease);
    expect_flagged("free_after_release", 2, case, "NotFreeAtRelease");
}

/// Guards against two working sets that do not fit (12 GiB + 12 GiB on 16 GiB): a
/// pre-stage that ignores free memory while the compute holder's set is live. Room for
/// one set, W=2. Bound 2.
#[test]
fn ignore_free_memory() {
    let case = Case::new(2, 2, 1, AllocStrategy::Sync).flaw(Flaw::IgnoreFreeMemory);
    expect_flagged("ignore_free_memory", 2, case, "OverCommit");
}

/// Two devices, two workers each: the flaws (which every device's workers then have)
/// are still flagged where they bite (each device has its own locks; the audit keeps
/// the devices apart).
mod two_devices {
    use super::*;

    /// `ignore_free_memory` with device 0 squeezed to one set and device 1 roomy: device
    /// 0's second pre-stage over-commits it. Bound 1.
    #[test]
    fn ignore_free_memory_on_the_squeezed_device() {
        let case = Case::new(2, 3, 1, AllocStrategy::Sync)
            .more_devices(&[3])
            .flaw(Flaw::IgnoreFreeMemory);
        expect_flagged(
            "two_devices::ignore_free_memory_on_the_squeezed_device",
            1,
            case,
            "OverCommit",
        );
    }

    /// `global_sync_under_mem` with two devices. Bound 1.
    #[test]
    fn global_sync_under_mem() {
        let case = Case::new(2, 3, 2, AllocStrategy::Pool)
            .more_devices(&[2])
            .flaw(Flaw::GlobalSyncUnderMem);
        expect_flagged(
            "two_devices::global_sync_under_mem",
            1,
            case,
            "GlobalCallUnderMem",
        );
    }
}
