//! What the rollout's passes keep between them (see [`PassMemory`]).

use tessera_planner::liveness::Liveness;
use tessera_planner::rollout;

use super::fleet_cache::FleetCache;
use super::layouts;
use crate::expectations::Expectations;

/// What one pass leaves for the next, in memory only: a restarted or new leader starts from
/// empty and converges from the caches.
#[derive(Default)]
pub(crate) struct PassMemory {
    /// Agents' heartbeats as observed pass after pass.
    pub(super) liveness: std::sync::Mutex<Liveness>,
    /// The agents each pass judged not responding, for the idle report (`idle::stale`).
    pub(crate) not_reporting: tessera_planner::idle::gate::Verdicts,
    /// Each node's verdict of the last pass, reused while its inputs stay the same.
    pub(super) kept: std::sync::Mutex<rollout::KeptVerdicts>,
    /// Per draining node, the evictions of pods that came back to it (in memory only).
    pub(super) returns: std::sync::Mutex<tessera_planner::drain::Returns>,
    /// Pods whose eviction the server asked to retry later (Retry-After; in memory only).
    pub(super) not_before: std::sync::Mutex<tessera_planner::drain::NotBefore>,
    /// The fleet as the last pass read it, and the nodes the watches saw change since.
    pub(super) fleet: std::sync::Mutex<FleetCache>,
    /// Our writes the caches have not shown yet: their nodes wait a pass.
    pub(super) expectations: std::sync::Mutex<Expectations>,
    /// Automatic plans: since when their demand and fleet have held still.
    pub(super) stability: std::sync::Mutex<layouts::Stability>,
    /// Decision writes the plan cache has not shown yet.
    pub(super) decision_writes: std::sync::Mutex<tessera_planner::automatic_layouts::written::DecisionWrites>,
    /// Stranded slices per (board, layout, demanded profiles), and per GpuNode version.
    pub(super) stranded_memo: std::sync::Mutex<layouts::StrandedMemo>,
}
