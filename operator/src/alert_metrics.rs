//! What the alerts in `config/observability/alerts.yaml` need and no counter can tell: which
//! plans are stalled since when, and which nodes Tessera holds cordoned since when and for how
//! long their plan allows. Pure: read from the objects of one pass, exported by the controller.

use std::collections::BTreeMap;

use tessera_crds::GpuPartitionPlan;
use tessera_crds::conditions::STALLED;
use tessera_crds::plan::{GpuPartitionPlanSpec, RolloutPolicy};

use crate::metrics::{CordonedNode, StalledPlan};
use tessera_planner::rollout::{DRA_WAIT_SECS, DraSlices, NodeInput};

/// Each plan whose `Stalled` condition is true (from the status about to be written, or the
/// stored one), with the condition's lastTransitionTime in Unix seconds.
pub fn stalled_plans<'a>(
    statuses: impl IntoIterator<Item = (&'a str, &'a tessera_crds::plan::GpuPartitionPlanStatus)>,
) -> BTreeMap<StalledPlan, i64> {
    statuses
        .into_iter()
        .filter_map(|(plan, status)| {
            let c = status.conditions.iter().find(|c| c.type_ == STALLED && c.status == "True")?;
            Some((
                StalledPlan { plan: plan.to_string(), reason: c.reason.clone() },
                c.last_transition_time.0.as_second(),
            ))
        })
        .collect()
}

/// The nodes Tessera cordoned that are still cordoned: since when (its cordon annotation, else
/// the drain's start in the rollout record) and, where the plan sets an apply timeout, the plan's
/// drain + apply timeouts (plus the bounded wait for its GPU DRA driver's slices, when it has
/// any: `rollout::DRA_WAIT_SECS`). A node whose record names no plan, or a plan that is gone, is held to
/// the default timeouts: such a cordon should have been undone already.
pub fn cordons(
    nodes: &[NodeInput<'_>],
    plans: &[GpuPartitionPlan],
) -> (BTreeMap<CordonedNode, i64>, BTreeMap<CordonedNode, i64>) {
    let specs: BTreeMap<&str, &GpuPartitionPlanSpec> =
        plans.iter().filter_map(|p| Some((p.metadata.name.as_deref()?, &p.spec))).collect();
    let default_policy = RolloutPolicy::default();
    let (mut since, mut limit) = (BTreeMap::new(), BTreeMap::new());
    for n in nodes.iter().filter(|n| n.unschedulable) {
        let rollout = n.gpunode.as_ref().and_then(|g| g.status.as_ref()?.rollout.as_ref());
        let ours = n.cordon_annotated.is_some() || rollout.is_some_and(|r| r.cordoned_by_us);
        let started = n.cordon_annotated.or_else(|| Some(rollout?.drain_started_at.as_ref()?.0));
        let (true, Some(started)) = (ours, started) else { continue };
        let plan = rollout.and_then(|r| r.plan.clone()).unwrap_or_default();
        let policy = specs.get(plan.as_str()).map(|s| &s.rollout).unwrap_or(&default_policy);
        let key = CordonedNode { node: n.name.to_string(), plan };
        if policy.apply_timeout_seconds > 0 {
            let slices = if n.dra_slices == DraSlices::None { 0 } else { DRA_WAIT_SECS };
            let allowed = policy.drain_timeout_seconds.saturating_add(policy.apply_timeout_seconds);
            limit.insert(key.clone(), allowed.saturating_add(slices));
        }
        since.insert(key, started.as_second());
    }
    (since, limit)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;
    use tessera_crds::GpuNode;

    use super::*;
    use tessera_planner::liveness::AgentHealth;

    static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn node(
        name: &str,
        unschedulable: bool,
        annotated: Option<i64>,
        rollout: Option<serde_json::Value>,
    ) -> NodeInput<'static> {
        let gpunode = rollout.map(|r| {
            serde_json::from_value::<GpuNode>(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
                "metadata": {"name": name}, "spec": {}, "status": {"rollout": r}}))
            .unwrap()
            .into()
        });
        NodeInput {
            name: name.to_string().leak(),
            labels: &NO_LABELS,
            unschedulable,
            gpunode,
            pods: Ok(vec![]),
            daemonsets: BTreeSet::new(),
            claims: Default::default(),
            returns: Default::default(),
            agent: AgentHealth::NotResponding { since: None },
            cordon_annotated: annotated.map(ts),
            cache_behind: false,
            versions: None,
            dra_refused: None,
            dra_slices: Default::default(),
        }
    }

    fn plan(name: &str, drain: i64, apply: i64) -> GpuPartitionPlan {
        serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan",
            "metadata": {"name": name},
            "spec": {"layouts": [], "rollout": {"drainTimeoutSeconds": drain, "applyTimeoutSeconds": apply}}}))
        .unwrap()
    }

    fn key(node: &str, plan: &str) -> CordonedNode {
        CordonedNode { node: node.into(), plan: plan.into() }
    }

    #[test]
    fn only_nodes_tessera_holds_cordoned_count_with_their_plans_timeouts() {
        let draining = json!({"phase": "Draining", "plan": "p", "cordonedByUs": true});
        let nodes = [
            node("ours", true, Some(1000), Some(draining.clone())),
            // Cordoned by an admin, not by us: neither the annotation nor the record says ours.
            node("admins", true, None, Some(json!({"phase": "Idle"}))),
            // Uncordoned by hand while our annotation is still there: not cordoned any more.
            node("uncordoned", false, Some(1000), Some(draining)),
            // Ours by the record alone (no annotation): since the drain started.
            node(
                "record-only",
                true,
                None,
                Some(json!({"phase": "Applying", "plan": "no-apply-timeout", "cordonedByUs": true,
                            "drainStartedAt": "1970-01-01T00:33:20Z"})),
            ),
            // An orphaned cordon: the annotation, no record.
            node("orphan", true, Some(3000), None),
        ];
        let plans = [plan("p", 100, 200), plan("no-apply-timeout", 100, 0)];
        let (since, limit) = cordons(&nodes, &plans);
        assert_eq!(
            since,
            [(key("ours", "p"), 1000), (key("record-only", "no-apply-timeout"), 2000), (key("orphan", ""), 3000)]
                .into()
        );
        let defaults = RolloutPolicy::default();
        assert_eq!(
            limit,
            [
                (key("ours", "p"), 300),
                (key("orphan", ""), defaults.drain_timeout_seconds + defaults.apply_timeout_seconds)
            ]
            .into(),
            "applyTimeoutSeconds 0 disables the timeout, so no limit"
        );
    }

    #[test]
    fn a_node_whose_gpu_driver_publishes_slices_may_stay_cordoned_for_the_slices_wait_too() {
        let applying = json!({"phase": "Applying", "plan": "p", "cordonedByUs": true});
        let mut n = node("n1", true, Some(1000), Some(applying));
        n.dra_slices = DraSlices::Stale("lists gpu-0-mig-9-0-4".into());
        let (_, limit) = cordons(&[n], &[plan("p", 100, 200)]);
        assert_eq!(limit, [(key("n1", "p"), 300 + DRA_WAIT_SECS)].into());
    }

    #[test]
    fn a_plan_counts_as_stalled_only_while_its_condition_is_true() {
        let status = |stalled: &str| -> tessera_crds::plan::GpuPartitionPlanStatus {
            serde_json::from_value(json!({"conditions": [
                {"type": "Ready", "status": "False", "reason": "X", "message": "", "lastTransitionTime": "1970-01-01T00:00:10Z"},
                {"type": "Stalled", "status": stalled, "reason": "DrainTimeout", "message": "m",
                 "lastTransitionTime": "1970-01-01T00:16:40Z"}]}))
            .unwrap()
        };
        let (yes, no) = (status("True"), status("False"));
        let got = stalled_plans([("a", &yes), ("b", &no)]);
        assert_eq!(got, [(StalledPlan { plan: "a".into(), reason: "DrainTimeout".into() }, 1000)].into());
    }
}
