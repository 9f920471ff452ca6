//! Tessera's runtime: the caches and watches, the controllers' passes (observe, call the planner,
//! act), every write to the API server, leader election, metrics and the health server. What to
//! do is decided in `tessera-planner`; this crate observes the cluster into the planner's inputs
//! and carries out what it returns.

pub mod alert_metrics;
pub mod cache;
mod control_loop;
pub mod controller;
pub mod error;
pub mod expectations;
pub mod leader;
pub mod metrics;
pub mod pass_wakes;
pub mod quota_controller;
pub mod run;
pub mod server;
pub mod writer;

pub use error::Error;

/// Locks `mutex`, ignoring poisoning. Each critical section of the runtime writes whole values
/// (a cache entry, a counter, a memo) and a panic elsewhere in the process does not leave one
/// half-written, so the data behind a poisoned lock is still the last consistent value.
pub fn locked<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
