//! The Tessera operator: offline CLI checks, and the controllers that roll out
//! `GpuPartitionPlan`s (observe -> pure plan -> act).

pub mod alert_metrics;
pub mod auto;
pub mod cli;
pub mod controller;
pub mod coverage;
pub mod dra;
pub mod dra_slices;
pub mod drain;
pub mod error;
pub mod events;
pub mod expectations;
pub mod fleet;
pub mod gpu_use;
pub mod idle;
pub mod leader;
pub mod liveness;
pub mod metrics;
pub mod quota;
pub mod quota_controller;
pub mod rollout;
pub mod run;
pub mod selector;
pub mod server;
pub mod slim;
pub mod status;
pub mod wake;

pub use error::Error;

/// The node an action is about (shared by the controller and the planner's tests).
#[cfg(test)]
pub(crate) fn controller_node_of(a: &rollout::Action) -> &str {
    controller::node_of(a)
}

/// Hash maps of a planning pass: keyed by node and product names, looked up several times per
/// node per pass. foldhash (seeded per process) hashes such short keys several times faster than
/// the standard SipHash.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
