//! The finalizer on every plan: a deleted plan goes away only once none of its nodes is mid-change
//! or held cordoned by it, and releasing it touches no GPU (the nodes keep their layout).

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tessera_crds::GpuPartitionPlan;
use tessera_crds::gpunode::{NodePhase, NodeRollout};
use tracing::info;

use super::Context;
use super::slots::Slots;
use crate::Error;

/// Finalizer that releases a deleted plan's nodes (uncordon, forget) without touching their GPUs.
pub const FINALIZER: &str = "tessera.dev/release-nodes";

/// Whether a node's rollout record keeps a deleted plan's finalizer: the plan has the node mid-
/// change or holds its cordon. A record at rest (`Idle`, `Pending`, `Failed` and uncordoned)
/// holds nothing: a node now waiting under another plan keeps the old plan's name in its record
/// until its turn (waiting costs no write), and must not keep the old plan from going away.
pub fn holds_deletion(record: &NodeRollout, plan: &str) -> bool {
    record.plan.as_deref() == Some(plan)
        && (record.cordoned_by_us
            || matches!(record.phase, NodePhase::Draining | NodePhase::Applying | NodePhase::Uncordoning))
}

impl Context {
    /// Adds the finalizer where it is missing; returns the plans where that failed.
    pub(super) async fn ensure_finalizers(&self, plans: &[GpuPartitionPlan]) -> Vec<(String, Error)> {
        let mut failed = Vec::new();
        for p in plans
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && !p.finalizers().iter().any(|f| f == FINALIZER))
        {
            let mut finalizers = p.finalizers().to_vec();
            finalizers.push(FINALIZER.into());
            let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": p.resource_version()}});
            if let Err(e) = Api::<GpuPartitionPlan>::all(self.client.clone())
                .patch(&p.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                self.metrics.error("kube");
                failed.push((p.name_any(), e.into()));
            }
        }
        failed
    }

    /// A deleted plan: once no node is mid-rollout for it any more, drop the finalizer. GPUs keep
    /// their layout; the nodes' intent simply stops naming the plan.
    pub(super) async fn finish_deletion(&self, plan: &GpuPartitionPlan, slots: &Slots) -> Result<(), Error> {
        let name = plan.name_any();
        // The nodes of the pass: a GpuNode whose Node is gone cannot be released any more, and
        // must not hold the plan.
        let busy = slots
            .slots
            .iter()
            .filter_map(|s| s.gpunode.as_ref()?.status.as_ref()?.rollout.as_ref())
            .any(|r| holds_deletion(r, &name));
        if busy || !plan.finalizers().iter().any(|f| f == FINALIZER) {
            return Ok(());
        }
        let finalizers: Vec<&String> = plan.finalizers().iter().filter(|f| *f != FINALIZER).collect();
        let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": plan.resource_version()}});
        Api::<GpuPartitionPlan>::all(self.client.clone())
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        info!(plan = %name, "released; its nodes keep their MIG layout");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_node_mid_change_or_cordoned_holds_a_deleted_plan() {
        let record = |phase: NodePhase, plan: &str, cordoned_by_us: bool| NodeRollout {
            phase,
            plan: Some(plan.into()),
            cordoned_by_us,
            ..Default::default()
        };
        for phase in [NodePhase::Draining, NodePhase::Applying, NodePhase::Uncordoning] {
            assert!(holds_deletion(&record(phase, "a", false), "a"), "{phase:?}");
            assert!(!holds_deletion(&record(phase, "b", true), "a"), "another plan's record: {phase:?}");
        }
        for phase in [NodePhase::Idle, NodePhase::Pending, NodePhase::Failed] {
            assert!(!holds_deletion(&record(phase, "a", false), "a"), "at rest: {phase:?}");
            assert!(holds_deletion(&record(phase, "a", true), "a"), "our cordon still to undo: {phase:?}");
        }
    }
}
