//! The layout decisions this operator wrote that the plan cache has not shown yet. A pass plans
//! from the cache: one that lags a decision write would show the plan without its new decision
//! (or with the old one), and the rollout would release a target just started (cordon,
//! uncordon, cordon again) or start one the new decision dropped. Like the node writes
//! (`expectations`), each write's resourceVersion is remembered; until the cached plan is that
//! new, the pass reads the decision as written. In memory: a restarted operator lists afresh.

use tessera_crds::GpuPartitionPlan;
use tessera_crds::plan::LayoutDecision;

use crate::resource_version::revision;

/// Per plan: the resourceVersion our last decision write returned, and the decision written
/// (`None`: removed).
#[derive(Debug, Default)]
pub struct DecisionWrites(crate::FastMap<String, (u64, Option<LayoutDecision>)>);

impl DecisionWrites {
    /// A decision write to `plan` succeeded and returned `resource_version`. A write whose outcome
    /// is unknown is not recorded: the pass that made it did not follow it either.
    pub fn wrote(&mut self, plan: &str, resource_version: Option<&str>, decision: Option<LayoutDecision>) {
        let Some(rv) = revision(resource_version) else { return };
        match self.0.get_mut(plan) {
            Some(old) if old.0 > rv => {} // an earlier write's answer arriving late
            Some(old) => *old = (rv, decision),
            None => {
                self.0.insert(plan.to_string(), (rv, decision));
            }
        }
    }

    /// Gives each cached plan older than our last decision write to it the decision written;
    /// forgets the writes the cache shows, and those of plans no longer cached.
    pub fn overlay(&mut self, plans: &mut [GpuPartitionPlan]) {
        if self.0.is_empty() {
            return;
        }
        let mut behind = crate::FastMap::default();
        for plan in plans.iter_mut() {
            let Some((name, (rv, decision))) = plan.metadata.name.as_deref().and_then(|n| self.0.remove_entry(n))
            else {
                continue;
            };
            // A cached version that is not a revision cannot be compared: read as it is.
            let cached = revision(plan.metadata.resource_version.as_deref());
            if cached.is_some_and(|c| c < rv) {
                plan.status.get_or_insert_with(Default::default).layout_decision = decision.clone();
                behind.insert(name, (rv, decision));
            }
        }
        self.0 = behind;
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tessera_crds::GpuNode;

    use super::*;
    use crate::automatic_layouts::{Ask, desired};

    fn plan(rv: &str, decision: Option<serde_json::Value>) -> GpuPartitionPlan {
        let mut v = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan",
            "metadata": {"name": "auto", "generation": 1, "resourceVersion": rv},
            "spec": {"layoutsFrom": {"quotaSelector": {}}}});
        if let Some(d) = decision {
            v["status"] = json!({"layoutDecision": d});
        }
        serde_json::from_value(v).unwrap()
    }

    fn targets(node: &str) -> serde_json::Value {
        json!({"planGeneration": 1,
            "targets": [{"node": node, "gpus": [{"index": 0, "migEnabled": true, "profiles": {"1g.10gb": 7}}]}]})
    }

    /// A node this plan just started: cordoned by us and draining.
    fn started(name: &str) -> GpuNode {
        serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
            "metadata": {"name": name}, "spec": {"gpus": []},
            "status": {"gpus": [], "rollout": {"phase": "Draining", "plan": "auto", "planGeneration": 1,
                                                "cordonedByUs": true}}}))
        .unwrap()
    }

    #[test]
    fn a_plan_cache_that_lags_the_decision_write_still_follows_the_decision() {
        let t = started("t");
        let decision: LayoutDecision = serde_json::from_value(targets("t")).unwrap();
        let mut writes = DecisionWrites::default();
        writes.wrote("auto", Some("7"), Some(decision.clone()));
        // The pass after the write, from a cache still at version 5 (no decision yet).
        let mut plans = vec![plan("5", None)];
        writes.overlay(&mut plans);
        assert!(matches!(desired(&plans[0], "t", &t), Ask::Target(_)), "the target just started is not released");
        // A cache at an older decision: the one written is followed, not the old one.
        let mut plans = vec![plan("6", Some(targets("old")))];
        writes.overlay(&mut plans);
        assert!(matches!(desired(&plans[0], "t", &t), Ask::Target(_)));
        assert_eq!(desired(&plans[0], "old", &started("old")), Ask::Release, "the old decision's target is dropped");
        // The cache shows the write: it is forgotten, and the cache is read as it is from then on.
        let mut plans = vec![plan("7", Some(targets("t")))];
        writes.overlay(&mut plans);
        assert!(writes.is_empty());
        let mut plans = vec![plan("9", Some(targets("later")))];
        writes.overlay(&mut plans);
        assert_eq!(desired(&plans[0], "t", &t), Ask::Release, "a later write (the cache past ours) wins");
    }

    #[test]
    fn a_removed_decision_and_plans_gone_are_followed_and_forgotten() {
        let mut writes = DecisionWrites::default();
        writes.wrote("auto", Some("7"), None);
        writes.wrote("gone", Some("8"), None);
        writes.wrote("opaque", Some("x"), None);
        let mut plans = vec![plan("5", Some(targets("t")))];
        writes.overlay(&mut plans);
        assert_eq!(plans[0].status.as_ref().and_then(|s| s.layout_decision.as_ref()), None, "removed as written");
        assert!(!writes.is_empty(), "still behind");
        let mut plans = vec![plan("7", None)];
        writes.overlay(&mut plans);
        assert!(writes.is_empty(), "caught up, and the deleted plan's write forgotten");
    }
}
