//! Fault injection shared by the simulated and the CUDA device: fail the k-th
//! allocation (at a site or anywhere), fail the k-th kernel launch (of a stage or any),
//! or fail at random on a seeded schedule.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::{AllocSite, Stage};
use crate::sync::Mutex;

/// One rule of a fault plan.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// Fail the `nth` (0-based) allocation at `site`, or at any site when `None`.
    Alloc { site: Option<AllocSite>, nth: usize },
    /// Fail the `nth` (0-based) launch of `stage`, or of any stage when `None`.
    Kernel { stage: Option<Stage>, nth: usize },
    /// Fail each allocation and each launch with these probabilities (per mille).
    Random {
        seed: u64,
        alloc_per_mille: u32,
        kernel_per_mille: u32,
    },
}

#[derive(Debug, Default)]
struct Counters {
    allocs: Vec<(Option<AllocSite>, usize)>,
    launches: Vec<(Option<Stage>, usize)>,
    injected: usize,
    rng: Option<ChaCha8Rng>,
}

/// A set of fault rules with the counters that decide when each fires.
#[derive(Debug, Default)]
pub struct FaultPlan {
    rules: Vec<Fault>,
    counters: Mutex<Counters>,
}

impl FaultPlan {
    pub fn none() -> Self {
        Self::default()
    }

    pub fn new(rules: Vec<Fault>) -> Self {
        let rng = rules.iter().find_map(|r| match r {
            Fault::Random { seed, .. } => Some(ChaCha8Rng::seed_from_u64(*seed)),
            _ => None,
        });
        Self {
            rules,
            counters: Mutex::new(Counters {
                rng,
                ..Default::default()
            }),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Counts an allocation at `site`; true if it must fail.
    pub fn on_alloc(&self, site: AllocSite) -> bool {
        if self.rules.is_empty() {
            return false;
        }
        let mut c = self.counters.lock();
        let mut fire = false;
        for rule in &self.rules {
            match *rule {
                Fault::Alloc { site: want, nth } if want.is_none() || want == Some(site) => {
                    fire |= bump(&mut c.allocs, want) == nth;
                }
                Fault::Random {
                    alloc_per_mille, ..
                } => {
                    if let Some(rng) = c.rng.as_mut() {
                        fire |= rng.gen_range(0..1000) < alloc_per_mille;
                    }
                }
                _ => {}
            }
        }
        c.injected += fire as usize;
        fire
    }

    /// Counts a launch of `stage`; true if it must fail.
    pub fn on_launch(&self, stage: Stage) -> bool {
        if self.rules.is_empty() {
            return false;
        }
        let mut c = self.counters.lock();
        let mut fire = false;
        for rule in &self.rules {
            match *rule {
                Fault::Kernel { stage: want, nth } if want.is_none() || want == Some(stage) => {
                    fire |= bump(&mut c.launches, want) == nth;
                }
                Fault::Random {
                    kernel_per_mille, ..
                } => {
                    if let Some(rng) = c.rng.as_mut() {
                        fire |= rng.gen_range(0..1000) < kernel_per_mille;
                    }
                }
                _ => {}
            }
        }
        c.injected += fire as usize;
        fire
    }

    /// How many faults fired so far.
    pub fn injected(&self) -> usize {
        self.counters.lock().injected
    }
}

/// Returns the count before incrementing the counter for `key`.
fn bump<K: PartialEq + Copy>(counts: &mut Vec<(K, usize)>, key: K) -> usize {
    match counts.iter_mut().find(|(k, _)| *k == key) {
        Some((_, n)) => {
            *n += 1;
            *n - 1
        }
        None => {
            counts.push((key, 1));
            0
        }
    }
}

#[cfg(all(test, not(twolock_loom)))]
mod tests {
    use super::*;

    #[test]
    fn nth_alloc_at_site_fires_once() {
        let plan = FaultPlan::new(vec![Fault::Alloc {
            site: Some(AllocSite::Fallback),
            nth: 1,
        }]);
        let fired: Vec<bool> = (0..4).map(|_| plan.on_alloc(AllocSite::Fallback)).collect();
        assert_eq!(fired, [false, true, false, false]);
        assert!(!plan.on_alloc(AllocSite::PreStage));
        assert_eq!(plan.injected(), 1);
    }

    #[test]
    fn random_schedule_is_seeded() {
        let run = || {
            let plan = FaultPlan::new(vec![Fault::Random {
                seed: 3,
                alloc_per_mille: 300,
                kernel_per_mille: 300,
            }]);
            (0..50)
                .map(|_| plan.on_launch(Stage::MsmH))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
        assert!(run().iter().any(|&f| f));
    }
}
