//! The catalogue of known-bad lock designs. Each is a variant of the real protocol code
//! in `protocol.rs`, switched on at one marked spot. Only test builds can select one:
//! the config field exists only under the `bad-designs` feature or loom.
//!
//! | flaw | what the variant does | what catches it |
//! |---|---|---|
//! | `GlobalSyncUnderMem` | device synchronize + pool trim under mem (the field's failure) | audit `GlobalCallUnderMem`; on a timeline, mem holds stop overlapping compute |
//! | `AsyncFreeBeforeRelease` | stream-ordered free, compute released before it completes | audit `NotFreeAtRelease`; fallback with room for two sets |
//! | `LeakLockOnError` | forgets the compute guard on an error path | deadlock (loom), lock timeout naming the holder (std) |
//! | `OppositeLockOrder` | fallback re-takes mem under compute (compute → mem vs mem → compute) | deadlock (loom) |
//! | `FreeAfterRelease` | frees the working set after compute is released | audit `NotFreeAtRelease` |
//! | `IgnoreFreeMemory` | pre-stages without looking at free memory | audit `OverCommit` |

use serde::Serialize;

use super::Worker;
use crate::device::Device;

/// A known-bad lock design.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Flaw {
    GlobalSyncUnderMem,
    AsyncFreeBeforeRelease,
    LeakLockOnError,
    OppositeLockOrder,
    FreeAfterRelease,
    IgnoreFreeMemory,
}

impl Flaw {
    pub const ALL: [Flaw; 6] = [
        Flaw::GlobalSyncUnderMem,
        Flaw::AsyncFreeBeforeRelease,
        Flaw::LeakLockOnError,
        Flaw::OppositeLockOrder,
        Flaw::FreeAfterRelease,
        Flaw::IgnoreFreeMemory,
    ];
}

/// Whether worker `w` runs with `flaw`. Always false in production builds.
#[inline]
pub(super) fn flawed<D: Device>(w: &Worker<D>, flaw: Flaw) -> bool {
    #[cfg(any(twolock_loom, feature = "bad-designs"))]
    {
        w.shared.cfg.flaw == Some(flaw)
    }
    #[cfg(not(any(twolock_loom, feature = "bad-designs")))]
    {
        let _ = (w, flaw);
        false
    }
}
