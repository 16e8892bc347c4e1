//! A model of one GPU's memory under the three allocation strategies, with CUDA's
//! semantics where they bite a two-lock prover: a stream-ordered free is not usable by
//! anyone until its stream is synchronized, and pooled bytes above the release
//! threshold stay cached until a trim. Pure bookkeeping: the caller serializes access.

use super::{AllocStrategy, DeviceError};

#[derive(Clone, Debug)]
pub struct Vram {
    pub capacity: u64,
    strategy: AllocStrategy,
    /// Pool: bytes kept cached after a completed free (0 = CUDA's default).
    release_threshold: u64,
    /// Resident keys, arena reservations and live working sets (not arena slots).
    used: u64,
    /// Per stream: bytes of live working sets (arena slots included).
    owned: Vec<u64>,
    /// Per stream: stream-ordered frees not yet completed by a sync of that stream.
    pending: Vec<u64>,
    /// Pool: completed frees cached by the pool (reusable by the pool, by nobody else).
    cached: u64,
    arena: Arena,
    /// The most bytes ever in use, for reports.
    pub peak: u64,
}

#[derive(Clone, Debug, Default)]
struct Arena {
    slot_bytes: u64,
    free_slots: usize,
    total_slots: usize,
}

impl Vram {
    pub fn new(capacity: u64, strategy: AllocStrategy, release_threshold: u64) -> Self {
        Self {
            capacity,
            strategy,
            release_threshold,
            used: 0,
            owned: Vec::new(),
            pending: Vec::new(),
            cached: 0,
            arena: Arena::default(),
            peak: 0,
        }
    }

    /// Bytes not held by anything: what a `cudaMalloc` outside the pool could get.
    pub fn free(&self) -> u64 {
        self.capacity.saturating_sub(self.in_use())
    }

    /// Everything the device has handed out, pooled and pending bytes included.
    pub fn in_use(&self) -> u64 {
        self.used + self.pending.iter().sum::<u64>() + self.cached
    }

    pub fn set_capacity(&mut self, capacity: u64) {
        self.capacity = capacity;
    }

    fn slot(v: &mut Vec<u64>, stream: usize) -> &mut u64 {
        if v.len() <= stream {
            v.resize(stream + 1, 0);
        }
        &mut v[stream]
    }

    /// Memory outside any working set (keys); may fail with Oom.
    pub fn reserve(&mut self, bytes: u64) -> Result<(), DeviceError> {
        if bytes > self.free() {
            return Err(DeviceError::Oom {
                requested: bytes,
                free: self.free(),
            });
        }
        self.used += bytes;
        self.peak = self.peak.max(self.in_use());
        Ok(())
    }

    pub fn unreserve(&mut self, bytes: u64) {
        self.used = self.used.saturating_sub(bytes);
    }

    /// Arena: reserves up to `slots` slots of `slot_bytes`; returns how many fit.
    pub fn reserve_arena(&mut self, slot_bytes: u64, slots: usize) -> usize {
        self.release_arena();
        let fit = self
            .free()
            .checked_div(slot_bytes)
            .map_or(slots, |n| (n as usize).min(slots));
        self.used += slot_bytes * fit as u64;
        self.arena = Arena {
            slot_bytes,
            free_slots: fit,
            total_slots: fit,
        };
        self.peak = self.peak.max(self.in_use());
        fit
    }

    pub fn release_arena(&mut self) {
        let a = std::mem::take(&mut self.arena);
        self.used = self
            .used
            .saturating_sub(a.slot_bytes * a.total_slots as u64);
    }

    /// Allocates a working set of `bytes` for `stream`.
    pub fn alloc(&mut self, stream: usize, bytes: u64) -> Result<(), DeviceError> {
        match self.strategy {
            AllocStrategy::Arena => {
                if bytes > self.arena.slot_bytes || self.arena.free_slots == 0 {
                    return Err(DeviceError::Oom {
                        requested: bytes,
                        free: if self.arena.free_slots > 0 {
                            self.arena.slot_bytes
                        } else {
                            0
                        },
                    });
                }
                self.arena.free_slots -= 1;
            }
            AllocStrategy::Sync => {
                if bytes > self.free() {
                    return Err(DeviceError::Oom {
                        requested: bytes,
                        free: self.free(),
                    });
                }
                self.used += bytes;
            }
            AllocStrategy::Pool => {
                // The pool serves from its cache first, then grows from the device.
                let from_cache = self.cached.min(bytes);
                if bytes - from_cache > self.free() {
                    return Err(DeviceError::Oom {
                        requested: bytes,
                        free: self.free() + self.cached,
                    });
                }
                self.cached -= from_cache;
                self.used += bytes;
            }
        }
        *Self::slot(&mut self.owned, stream) += bytes;
        self.peak = self.peak.max(self.in_use());
        Ok(())
    }

    /// Test-only flaw: allocation that ignores free memory, as a design that pre-stages
    /// regardless of what the compute holder uses would.
    pub fn alloc_unchecked(&mut self, stream: usize, bytes: u64) {
        self.used += bytes;
        *Self::slot(&mut self.owned, stream) += bytes;
        self.peak = self.peak.max(self.in_use());
    }

    /// Frees a working set. `Pool` frees are stream-ordered: pending until the stream
    /// syncs; the other strategies return the bytes at once.
    pub fn free_ws(&mut self, stream: usize, bytes: u64) {
        let owned = Self::slot(&mut self.owned, stream);
        *owned = owned.saturating_sub(bytes);
        match self.strategy {
            AllocStrategy::Arena if self.arena.free_slots < self.arena.total_slots => {
                self.arena.free_slots += 1
            }
            AllocStrategy::Arena => self.used = self.used.saturating_sub(bytes),
            AllocStrategy::Sync => self.used = self.used.saturating_sub(bytes),
            AllocStrategy::Pool => {
                self.used = self.used.saturating_sub(bytes);
                *Self::slot(&mut self.pending, stream) += bytes;
            }
        }
    }

    /// A sync of `stream` completes its stream-ordered frees; the pool keeps up to its
    /// release threshold cached and returns the rest to the device.
    pub fn stream_synced(&mut self, stream: usize) {
        let done = std::mem::take(Self::slot(&mut self.pending, stream));
        let keep = self.release_threshold.saturating_sub(self.cached).min(done);
        self.cached += keep;
    }

    /// `cudaMemPoolTrimTo(pool, 0)`: cached bytes go back to the device.
    pub fn trim(&mut self) {
        self.cached = 0;
    }

    /// A stream's live working-set bytes plus its uncompleted frees.
    pub fn outstanding(&self, stream: usize) -> u64 {
        self.owned.get(stream).copied().unwrap_or(0)
            + self.pending.get(stream).copied().unwrap_or(0)
    }

    /// Bytes held by live working sets and uncompleted frees of all streams.
    pub fn working_bytes(&self) -> u64 {
        self.owned.iter().sum::<u64>() + self.pending.iter().sum::<u64>()
    }

    /// True when more is in use than exists (only a flawed design can get here).
    pub fn over_committed(&self) -> bool {
        self.in_use() > self.capacity
    }
}

#[cfg(all(test, not(twolock_loom)))]
mod tests {
    use super::*;

    #[test]
    fn pool_free_is_unusable_until_the_stream_syncs() {
        let mut v = Vram::new(100, AllocStrategy::Pool, 0);
        v.alloc(0, 60).unwrap();
        v.free_ws(0, 60);
        assert!(
            v.alloc(1, 60).is_err(),
            "a pending free must not be reusable"
        );
        assert_eq!(v.outstanding(0), 60);
        v.stream_synced(0);
        assert_eq!(v.outstanding(0), 0);
        v.alloc(1, 60).unwrap();
    }

    #[test]
    fn pool_cache_above_zero_threshold_needs_trim_for_others() {
        let mut v = Vram::new(100, AllocStrategy::Pool, u64::MAX);
        v.alloc(0, 60).unwrap();
        v.free_ws(0, 60);
        v.stream_synced(0);
        assert_eq!(v.free(), 40, "cached bytes are not free to non-pool users");
        v.alloc(1, 60).unwrap(); // the pool itself can reuse them
        v.free_ws(1, 60);
        v.stream_synced(1);
        v.trim();
        assert_eq!(v.free(), 100);
    }

    #[test]
    fn arena_hands_out_preallocated_slots() {
        let mut v = Vram::new(100, AllocStrategy::Arena, 0);
        assert_eq!(v.reserve_arena(40, 3), 2);
        v.alloc(0, 40).unwrap();
        v.alloc(1, 30).unwrap();
        assert!(v.alloc(2, 10).is_err());
        v.free_ws(0, 40);
        v.alloc(2, 10).unwrap();
        v.release_arena();
    }

    #[test]
    fn sync_strategy_reports_oom_with_free_bytes() {
        let mut v = Vram::new(100, AllocStrategy::Sync, 0);
        v.reserve(30).unwrap();
        assert_eq!(
            v.alloc(0, 80),
            Err(DeviceError::Oom {
                requested: 80,
                free: 70
            })
        );
    }
}
