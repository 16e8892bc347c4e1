//! The one synchronisation facade: std primitives normally, loom's under `--cfg twolock_loom`.
//!
//! Every module of the pipeline and of the device models imports its `Arc`, `Mutex`,
//! `Condvar`, atomics and `thread` from here and never from `std::sync`, so the loom
//! models in `loom-models/` check exactly the code that production runs. Both halves
//! expose the same paths and a poison-free `lock()`: a panicking worker is a bug the
//! harness reports, not a reason to wedge every other worker.

#[cfg(not(twolock_loom))]
mod imp {
    pub use std::sync::atomic;
    pub use std::sync::{Arc, MutexGuard};
    pub use std::thread;
    use std::time::Duration;

    /// A mutex whose `lock` never reports poisoning.
    #[derive(Debug, Default)]
    pub struct Mutex<T>(std::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub fn new(value: T) -> Self {
            Self(std::sync::Mutex::new(value))
        }
        pub fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|poison| poison.into_inner())
        }
    }

    /// A condition variable whose waits never report poisoning.
    #[derive(Debug, Default)]
    pub struct Condvar(std::sync::Condvar);

    impl Condvar {
        pub fn new() -> Self {
            Self(std::sync::Condvar::new())
        }
        pub fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(guard).unwrap_or_else(|p| p.into_inner())
        }
        /// Waits at most `dur`; returns the guard and whether the wait timed out.
        pub fn wait_timeout<'a, T>(
            &self,
            guard: MutexGuard<'a, T>,
            dur: Duration,
        ) -> (MutexGuard<'a, T>, bool) {
            let (g, r) = self
                .0
                .wait_timeout(guard, dur)
                .unwrap_or_else(|p| p.into_inner());
            (g, r.timed_out())
        }
        pub fn notify_all(&self) {
            self.0.notify_all()
        }
    }

    /// Sleeps for a simulated duration (a no-op under loom, which has no clock).
    pub fn sleep(dur: Duration) {
        if !dur.is_zero() {
            std::thread::sleep(dur)
        }
    }

    /// True when running under the loom model checker.
    pub const LOOM: bool = false;
}

#[cfg(twolock_loom)]
mod imp {
    pub use loom::sync::atomic;
    pub use loom::sync::{Arc, MutexGuard};
    pub use loom::thread;
    use std::time::Duration;

    /// loom's mutex behind the same poison-free `lock()`.
    #[derive(Debug)]
    pub struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }
        pub fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|poison| poison.into_inner())
        }
    }

    impl<T: Default> Default for Mutex<T> {
        fn default() -> Self {
            Self::new(T::default())
        }
    }

    /// loom's condition variable; loom has no clock, so timed waits wait until notified
    /// and loom itself reports a wait that can never end as a deadlock.
    #[derive(Debug, Default)]
    pub struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub fn new() -> Self {
            Self(loom::sync::Condvar::new())
        }
        pub fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(guard).unwrap_or_else(|p| p.into_inner())
        }
        pub fn wait_timeout<'a, T>(
            &self,
            guard: MutexGuard<'a, T>,
            _dur: Duration,
        ) -> (MutexGuard<'a, T>, bool) {
            (self.wait(guard), false)
        }
        pub fn notify_all(&self) {
            self.0.notify_all()
        }
    }

    /// Simulated durations are meaningless under loom: time is not modelled.
    pub fn sleep(_dur: Duration) {}

    /// True when running under the loom model checker.
    pub const LOOM: bool = true;
}

pub use imp::*;
