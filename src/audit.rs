//! The audit: a shared record that the pipeline (lock holds) and a device (device-global
//! calls, memory) report to, which checks the protocol's safety properties as they
//! happen. The loom models and the stress runner assert that it saw no violation.

use serde::Serialize;

use crate::device::WorkerId;
use crate::sync::Mutex;

/// A safety property broken during a run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Violation {
    /// A device-global blocking call (`what`) made while holding mem, with other
    /// workers' kernels in flight: the field's failure, which serializes the two locks.
    GlobalCallUnderMem {
        caller: WorkerId,
        what: &'static str,
        busy: Vec<WorkerId>,
    },
    /// More bytes in use than the device has.
    OverCommit { used: u64, capacity: u64 },
    /// Compute was released while the worker still held device memory (a live or a
    /// stream-ordered, not yet completed, free).
    NotFreeAtRelease { worker: WorkerId, bytes: u64 },
}

#[derive(Debug, Default)]
struct State {
    mem: Vec<(usize, WorkerId)>,
    compute: Vec<(usize, WorkerId)>,
    violations: Vec<Violation>,
}

/// Lock holders per device, and the violations seen so far.
#[derive(Debug, Default)]
pub struct Audit {
    state: Mutex<State>,
}

/// Which of the two locks an event concerns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LockKind {
    Mem,
    Compute,
}

impl Audit {
    pub fn new() -> Self {
        Self::default()
    }

    /// Reported right after `who` acquired `lock` (so the audit's view of holders is
    /// never larger than the truth).
    pub fn acquired(&self, lock: LockKind, who: WorkerId) {
        let mut s = self.state.lock();
        let holders = match lock {
            LockKind::Mem => &mut s.mem,
            LockKind::Compute => &mut s.compute,
        };
        holders.push((who.device, who));
    }

    /// Reported right before `who` releases `lock`. `outstanding` is the device memory
    /// the worker still holds; for compute it must be zero.
    pub fn releasing(&self, lock: LockKind, who: WorkerId, outstanding: u64) {
        let mut s = self.state.lock();
        let holders = match lock {
            LockKind::Mem => &mut s.mem,
            LockKind::Compute => &mut s.compute,
        };
        holders.retain(|&(_, w)| w != who);
        if lock == LockKind::Compute && outstanding > 0 {
            s.violations.push(Violation::NotFreeAtRelease {
                worker: who,
                bytes: outstanding,
            });
        }
    }

    /// Reported by a device when `caller` makes a device-global blocking call while
    /// the workers in `busy` have kernels in flight on the same device.
    pub fn global_call(&self, caller: WorkerId, what: &'static str, busy: Vec<WorkerId>) {
        let mut s = self.state.lock();
        let holds_mem = s.mem.iter().any(|&(_, w)| w == caller);
        if holds_mem && !busy.is_empty() {
            s.violations
                .push(Violation::GlobalCallUnderMem { caller, what, busy });
        }
    }

    /// Reported by a device after every allocation.
    pub fn memory(&self, used: u64, capacity: u64) {
        if used > capacity {
            self.state
                .lock()
                .violations
                .push(Violation::OverCommit { used, capacity });
        }
    }

    pub fn violations(&self) -> Vec<Violation> {
        self.state.lock().violations.clone()
    }

    /// Who holds which lock right now, for a timeout's dump.
    pub fn holders(&self) -> String {
        let s = self.state.lock();
        let list = |v: &[(usize, WorkerId)]| {
            v.iter()
                .map(|(_, w)| w.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        format!(
            "mem held by [{}], compute held by [{}]",
            list(&s.mem),
            list(&s.compute)
        )
    }
}
