//! The two locks of a device, with bounded waits and holders a timeout can name.
//!
//! - **mem** guards the *staging slot*: the one partition being allocated and uploaded
//!   ahead of its compute turn. Its holder may only make calls that never wait on other
//!   streams' work (allocate, start an upload); never a free, a device synchronize or a
//!   pool trim (see `protocol::pre_stage`).
//! - **compute** guards the device's kernels and the working set in use: its holder
//!   launches, syncs its own streams and frees its working set, and the set is truly
//!   free before compute is released (see `protocol::compute`).
//!
//! Order: mem is only ever taken before compute (hand-over-hand), never after it, so
//! the two cannot deadlock. The CPU prep gate (`Shared::prep_gate`) is taken and
//! released before either, with no device lock held, so it adds no cycle.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::timeline::{Phase, Timeline};
use crate::audit::{Audit, LockKind};
use crate::device::WorkerId;
use crate::sync::{Arc, Condvar, Mutex};

/// The lock design a pipeline runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum LockMode {
    /// One GPU lock around allocation, upload and compute: the baseline.
    Single,
    /// mem for pre-staging and compute for kernels, overlapping the two.
    Two,
}

impl std::fmt::Display for LockMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Single => "single-lock",
            Self::Two => "two-lock",
        })
    }
}

/// A lock wait that ran out of time: the caller gets this, never a hang.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timeout {
    pub lock: LockKind,
    pub waited: Duration,
    pub holder: Option<WorkerId>,
    pub holders: String,
}

/// One lock: who holds it, and a condition variable for the waiters.
#[derive(Debug)]
pub struct TimedLock {
    kind: LockKind,
    holder: Mutex<Option<WorkerId>>,
    released: Condvar,
    audit: Option<Arc<Audit>>,
    timeout: Duration,
}

/// Proof of holding a [`TimedLock`]; dropping it releases the lock on every path.
pub struct Held<'a> {
    lock: &'a TimedLock,
    who: WorkerId,
    /// Device bytes the holder still has; the audit requires 0 when compute is released.
    outstanding: Option<&'a (dyn Fn() -> u64 + 'a)>,
    /// Where to record the hold when it ends: timeline, partition, phase, start.
    span: Option<(Arc<Timeline>, usize, Phase, u64)>,
}

impl Held<'_> {
    /// Records this hold as `phase` of `partition` on `timeline` when it ends.
    pub fn with_span(mut self, timeline: Arc<Timeline>, partition: usize, phase: Phase) -> Self {
        let start = timeline.now_us();
        self.span = Some((timeline, partition, phase, start));
        self
    }
}

impl TimedLock {
    pub fn new(kind: LockKind, audit: Option<Arc<Audit>>, timeout: Duration) -> Self {
        Self {
            kind,
            holder: Mutex::new(None),
            released: Condvar::new(),
            audit,
            timeout,
        }
    }

    /// Waits at most the lock's timeout for the lock.
    pub fn acquire<'a>(
        &'a self,
        who: WorkerId,
        outstanding: Option<&'a (dyn Fn() -> u64 + 'a)>,
    ) -> Result<Held<'a>, Timeout> {
        let start = Instant::now();
        let mut holder = self.holder.lock();
        while holder.is_some() {
            let waited = start.elapsed();
            if waited >= self.timeout {
                return Err(Timeout {
                    lock: self.kind,
                    waited,
                    holder: *holder,
                    holders: self.audit.as_ref().map(|a| a.holders()).unwrap_or_default(),
                });
            }
            holder = self.released.wait_timeout(holder, self.timeout - waited).0;
        }
        *holder = Some(who);
        drop(holder);
        if let Some(a) = &self.audit {
            a.acquired(self.kind, who);
        }
        Ok(Held {
            lock: self,
            who,
            outstanding,
            span: None,
        })
    }

    /// The current holder, if any.
    pub fn holder(&self) -> Option<WorkerId> {
        *self.holder.lock()
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // Report before releasing, so the audit never sees a holder that is gone.
        if let Some(a) = &self.lock.audit {
            let bytes = self.outstanding.map_or(0, |f| f());
            a.releasing(self.lock.kind, self.who, bytes);
        }
        *self.lock.holder.lock() = None;
        self.lock.released.notify_all();
        if let Some((t, partition, phase, start)) = self.span.take() {
            t.record(partition, self.who, phase, start);
        }
    }
}

/// The pair of locks of one device.
#[derive(Debug)]
pub struct Locks {
    pub mem: TimedLock,
    pub compute: TimedLock,
}

impl Locks {
    pub fn new(audit: Option<Arc<Audit>>, timeout: Duration) -> Self {
        Self {
            mem: TimedLock::new(LockKind::Mem, audit.clone(), timeout),
            compute: TimedLock::new(LockKind::Compute, audit, timeout),
        }
    }

    /// True when neither lock is held (after a batch, on every path).
    pub fn both_free(&self) -> bool {
        self.mem.holder().is_none() && self.compute.holder().is_none()
    }
}
