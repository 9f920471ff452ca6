//! What a pass remembers of each node for the next one. Most nodes of a fleet are at rest in a
//! pass (updated, or waiting for a `maxUnavailable` slot), and planning them again read their
//! objects, matched every plan's selector and built their intent: at 5,000 nodes and a pass a
//! second, that walk was a third of the operator's CPU. A node whose cached objects, agent
//! health and plans are the same as when it was last planned gets the same verdict, so the pass
//! reuses it; only a waiting node that a free slot may start is planned again in full.
//! The cost left per unchanged node is a look-up by position and a comparison of versions.
//! Pure; `plan_fleet_with` keeps it, and a property test checks every pass against a fresh one.

use tessera_crds::GpuNode;
use tessera_crds::GpuPartitionPlan;

use crate::resource_version::revision;

/// The resourceVersions of a node's cached Node and `GpuNode` (`None`: no `GpuNode`). Every
/// write to an object gives it a new one, and a version is never reused, even by an object
/// deleted and created again under the same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Versions {
    pub node: u64,
    pub gpunode: Option<u64>,
}

impl Versions {
    /// `None` when a version is not an etcd revision: such a node is planned in full every pass.
    pub fn of(node: Option<&str>, gpunode: Option<&GpuNode>) -> Option<Self> {
        let gpunode = match gpunode {
            None => None,
            Some(g) => Some(revision(g.metadata.resource_version.as_deref())?),
        };
        Some(Versions { node: revision(node)?, gpunode })
    }
}

/// A node's verdict that holds while its inputs do. Only verdicts with no action and no part in
/// anyone's budget are kept: whatever acts, waits for the cache, or depends on the time is
/// planned every pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// No plan matches it and it carries no rollout record (or one `release` leaves alone).
    Unowned,
    /// Owned by the live plan at this index, at rest with the plan's layout, record in order.
    Updated(usize),
    /// Owned by the live plan at this index, to be changed, waiting for a slot (or a pause).
    Waiting(usize),
}

#[derive(Debug, Clone)]
struct Remembered {
    versions: Versions,
    verdict: Verdict,
}

/// What a pass's plans are, for the verdicts: any change to them forgets every verdict.
#[derive(Debug, Clone, PartialEq)]
struct PlanKey {
    name: Option<String>,
    generation: Option<i64>,
    spec: tessera_crds::plan::GpuPartitionPlanSpec,
    deleting: bool,
}

/// The verdicts of the last pass, by the node's position among the pass's nodes (the
/// controller keeps positions from pass to pass, except when nodes leave or after a re-list).
/// Checked against the versions, which name one write of one object: a node that took over
/// another's position is never mistaken for it.
#[derive(Debug, Default)]
pub struct KeptVerdicts {
    plans: Vec<PlanKey>,
    nodes: Vec<Option<Remembered>>,
    /// Nodes planned in full / reused in the last pass (for the metrics and the tests).
    pub planned: usize,
    pub reused: usize,
}

impl KeptVerdicts {
    /// Starts a pass over `plans`: verdicts of other plans are forgotten. Automatic plans keep
    /// none (their intent follows a decision in their status).
    pub(super) fn begin(&mut self, plans: &[GpuPartitionPlan], nodes: usize) {
        let keys: Vec<PlanKey> = plans
            .iter()
            .map(|p| PlanKey {
                name: p.metadata.name.clone(),
                generation: p.metadata.generation,
                spec: p.spec.clone(),
                deleting: p.metadata.deletion_timestamp.is_some(),
            })
            .collect();
        if keys != self.plans || plans.iter().any(|p| p.spec.layouts_from.is_some()) {
            self.nodes.clear();
            self.plans = keys;
        }
        self.nodes.resize(nodes, None);
        self.planned = 0;
        self.reused = 0;
    }

    /// The verdict kept for the node at `position`, if its inputs are those it was reached from.
    pub(super) fn verdict(&self, position: usize, node: &super::NodeInput<'_>) -> Option<Verdict> {
        let versions = node.versions.filter(|_| keepable(node))?;
        self.nodes.get(position)?.as_ref().filter(|r| r.versions == versions).map(|r| r.verdict)
    }

    /// The node at `position` was planned in full: counts it, and keeps (or forgets) its verdict.
    pub(super) fn remember(&mut self, position: usize, node: &super::NodeInput<'_>, verdict: Option<Verdict>) {
        self.planned += 1;
        let kept = match (node.versions, verdict) {
            (Some(versions), Some(verdict)) if keepable(node) => Some(Remembered { versions, verdict }),
            _ => None,
        };
        if let Some(slot) = self.nodes.get_mut(position) {
            *slot = kept;
        }
    }
}

/// Whether a node's verdict may be kept at all: its agent alive, its cache caught up, and no
/// Tessera cordon on it (whose orphan check reads the time). Versions aside, these are the
/// inputs that change without a write to the node's objects.
fn keepable(node: &super::NodeInput<'_>) -> bool {
    !node.cache_behind
        && node.agent == crate::liveness::AgentHealth::Alive
        && node.cordon_annotated.is_none()
        && node.dra_refused.is_none()
}
