//! The finalizer on every plan: a deleted plan goes away only once none of its nodes is mid-change
//! or held cordoned by it, and releasing it touches no GPU (the nodes keep their layout).

use kube::ResourceExt;
use kube::api::Api;
use serde_json::json;
use tessera_crds::GpuPartitionPlan;
use tessera_crds::gpunode::{NodePhase, NodeRollout};
use tracing::info;

use super::Context;
use super::fleet_cache::FleetCache;
use crate::Error;
use crate::writer::{Write, Writer};

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
    /// [`Error::NotLeader`], nothing more sent, once the lease may have passed.
    pub(super) async fn ensure_finalizers(&self, plans: &[GpuPartitionPlan]) -> Result<Vec<(String, Error)>, Error> {
        add_finalizers(&self.writer(), plans).await
    }

    /// A deleted plan: once no node is mid-rollout for it any more, drop the finalizer. GPUs keep
    /// their layout; the nodes' intent simply stops naming the plan.
    pub(super) async fn finish_deletion(&self, plan: &GpuPartitionPlan, fleet: &FleetCache) -> Result<(), Error> {
        let name = plan.name_any();
        // The nodes of the pass: a GpuNode whose Node is gone cannot be released any more, and
        // must not hold the plan.
        let busy = fleet
            .nodes
            .iter()
            .filter_map(|s| s.gpunode.as_ref()?.status.as_ref()?.rollout.as_ref())
            .any(|r| holds_deletion(r, &name));
        if busy || !plan.finalizers().iter().any(|f| f == FINALIZER) {
            return Ok(());
        }
        remove_finalizer(&self.writer(), plan).await?;
        info!(plan = %name, "released; its nodes keep their MIG layout");
        Ok(())
    }
}

/// Adds the finalizer to each live plan missing it; a failed write is counted and returned with
/// its plan. [`Error::NotLeader`] before any write once the tenure may have ended.
async fn add_finalizers(writer: &Writer<'_>, plans: &[GpuPartitionPlan]) -> Result<Vec<(String, Error)>, Error> {
    let mut failed = Vec::new();
    for p in plans
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && !p.finalizers().iter().any(|f| f == FINALIZER))
    {
        let mut finalizers = p.finalizers().to_vec();
        finalizers.push(FINALIZER.into());
        let patch = finalizers_patch(p, &finalizers);
        if let Err(e) = writer.send_counted(&plan_api(writer), &p.name_any(), Write::merge(&patch)).await? {
            failed.push((p.name_any(), e.into()));
        }
    }
    Ok(failed)
}

/// Drops the finalizer from `plan` (the caller checked that nothing holds it); a failure is
/// returned for the pass to count.
async fn remove_finalizer(writer: &Writer<'_>, plan: &GpuPartitionPlan) -> Result<(), Error> {
    let finalizers: Vec<String> = plan.finalizers().iter().filter(|f| *f != FINALIZER).cloned().collect();
    let patch = finalizers_patch(plan, &finalizers);
    writer.send(&plan_api(writer), &plan.name_any(), Write::merge(&patch)).await.map(|_| ())
}

/// The merge patch that makes `plan`'s finalizers `finalizers`, only if the plan is still at the
/// version read (a finalizer another controller added meanwhile is not lost).
fn finalizers_patch(plan: &GpuPartitionPlan, finalizers: &[String]) -> serde_json::Value {
    json!({"metadata": {"finalizers": finalizers, "resourceVersion": plan.resource_version()}})
}

/// The plans, through the writer's client.
fn plan_api(writer: &Writer<'_>) -> Api<GpuPartitionPlan> {
    Api::all(writer.client().clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leader::Tenure;
    use crate::metrics::Metrics;
    use crate::quota_controller::test_support::{Requests, recording_api};
    use crate::writer::Writer;

    /// A plan `name` holding `finalizers`, deleted if `deleted`, at resourceVersion 7.
    fn plan(name: &str, finalizers: &[&str], deleted: bool) -> GpuPartitionPlan {
        let mut metadata = json!({"name": name, "resourceVersion": "7", "finalizers": finalizers});
        if deleted {
            metadata["deletionTimestamp"] = json!("2026-06-01T00:00:00Z");
        }
        serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan",
            "metadata": metadata, "spec": {"layouts": []}}))
        .unwrap()
    }

    /// A fake API server answering each plan patch with a plan, recording each request.
    fn api() -> (kube::Client, Requests) {
        recording_api(|_, path, _| {
            let name = path.rsplit('/').next().unwrap_or_default();
            Some((200, serde_json::to_value(plan(name, &[FINALIZER], false)).unwrap()))
        })
    }

    #[tokio::test]
    async fn a_deposed_leader_neither_adds_nor_removes_a_plans_finalizer() {
        let (client, requests) = api();
        let (metrics, tenure) = (Metrics::default(), Tenure::default());
        tenure.set(None); // the lease may have passed: no renewal of ours seen
        let writer = Writer::new(&client, Some(&tenure), &metrics);

        let added = add_finalizers(&writer, &[plan("new", &[], false)]).await;
        assert!(matches!(added, Err(Error::NotLeader)), "{added:?}");
        let removed = remove_finalizer(&writer, &plan("gone", &[FINALIZER], true)).await;
        assert!(matches!(removed, Err(Error::NotLeader)), "{removed:?}");
        assert_eq!(requests.lock().unwrap().len(), 0, "a deposed leader sends no write");
    }

    #[tokio::test]
    async fn a_leader_adds_a_missing_finalizer_and_removes_a_released_plans() {
        let (client, requests) = api();
        let (metrics, tenure) = (Metrics::default(), Tenure::default());
        tenure.set(Some(std::time::SystemTime::now() + std::time::Duration::from_secs(60)));
        let writer = Writer::new(&client, Some(&tenure), &metrics);

        let plans = [plan("new", &["other"], false), plan("has", &[FINALIZER], false)];
        assert!(add_finalizers(&writer, &plans).await.unwrap().is_empty());
        remove_finalizer(&writer, &plan("gone", &["other", FINALIZER], true)).await.unwrap();
        let requests = requests.lock().unwrap();
        let sent: Vec<(&str, &str, &serde_json::Value)> =
            requests.iter().map(|(m, p, b)| (m.as_str(), p.as_str(), b)).collect();
        let plans = "/apis/tessera.dev/v1alpha1/gpupartitionplans";
        assert_eq!(
            sent,
            vec![
                (
                    "PATCH",
                    &*format!("{plans}/new"),
                    &json!({"metadata": {"finalizers": ["other", FINALIZER], "resourceVersion": "7"}})
                ),
                (
                    "PATCH",
                    &*format!("{plans}/gone"),
                    &json!({"metadata": {"finalizers": ["other"], "resourceVersion": "7"}})
                ),
            ]
        );
    }

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
