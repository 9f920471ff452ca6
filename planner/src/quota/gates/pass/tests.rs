use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use serde_json::{Value, json};
use tessera_crds::gate::{GateState, GpuQuotaGate, IN_FORCE_FINALIZER};
use tessera_crds::quota::TenantGpuQuotaStatus;

use super::{GateInputs, GatePlan, plan_gates};
use crate::quota::{Apply, Delete};

const KEY: &str = "requests.nvidia.com/gpu";

fn ns(name: &str, label: Option<&str>, terminating: bool) -> Namespace {
    let mut v = json!({"metadata": {"name": name}});
    if let Some(l) = label {
        v["metadata"]["labels"] = json!({"tessera.dev/gpu-gate": l});
    }
    if terminating {
        v["metadata"]["deletionTimestamp"] = json!("2026-12-01T00:00:00Z");
    }
    serde_json::from_value(v).unwrap()
}

fn apply(namespace: &str, quota: &str, hard: i64) -> Apply {
    Apply {
        namespace: namespace.into(),
        quota: quota.into(),
        name: format!("tessera-{quota}"),
        hard: [(KEY.to_string(), hard.to_string())].into(),
        in_force_since: None,
        in_force_keys: None,
    }
}

/// Tessera's ResourceQuota of `quota` in `ns`: `in_force` with `hard` in its status too.
fn rq(namespace: &str, quota: &str, hard: i64, in_force: bool, deleting: bool) -> ResourceQuota {
    let mut v = json!({"metadata": {"name": format!("tessera-{quota}"), "namespace": namespace,
            "uid": format!("uid-{namespace}-{quota}"), "finalizers": [IN_FORCE_FINALIZER],
            "labels": {"tessera.dev/quota": quota},
            "ownerReferences": [{"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "name": quota,
                "uid": format!("uid-{quota}"), "controller": true}]},
        "spec": {"hard": {KEY: hard.to_string()}}});
    if in_force {
        v["status"] = json!({"hard": {KEY: hard.to_string()}, "used": {KEY: "0"}});
    }
    if deleting {
        v["metadata"]["deletionTimestamp"] = json!("2026-12-01T00:00:00Z");
    }
    serde_json::from_value(v).unwrap()
}

/// The gate `plan` wants in `namespace`, as cached, owned by the ResourceQuota of `quota`.
fn gate_of(plan: &GatePlan, namespace: &str, quota: &str) -> GpuQuotaGate {
    let spec = serde_json::to_value(&plan.gates[namespace].spec).unwrap();
    serde_json::from_value(json!({"metadata": {"name": "gpu", "namespace": namespace,
            "ownerReferences": [{"apiVersion": "v1", "kind": "ResourceQuota", "name": format!("tessera-{quota}"),
                "uid": format!("uid-{namespace}-{quota}")}]},
        "spec": spec}))
    .unwrap()
}

struct World {
    apply: Vec<Apply>,
    delete: Vec<Delete>,
    statuses: BTreeMap<String, TenantGpuQuotaStatus>,
    rqs: Vec<ResourceQuota>,
    gates: Vec<GpuQuotaGate>,
    namespaces: Vec<Namespace>,
}

impl World {
    fn plan(&self) -> GatePlan {
        let none = BTreeMap::new();
        plan_gates(&GateInputs {
            apply: &self.apply,
            delete: &self.delete,
            statuses: &self.statuses,
            rqs: &self.rqs,
            gates: &self.gates,
            namespaces: &self.namespaces,
            pods: &none,
            claims: &none,
        })
    }
}

fn world(apply: Vec<Apply>, rqs: Vec<ResourceQuota>, namespaces: Vec<Namespace>) -> World {
    World { apply, delete: vec![], statuses: BTreeMap::new(), rqs, gates: vec![], namespaces }
}

#[test]
fn a_namespace_no_quota_claims_is_labelled_none_and_a_claimed_one_loses_none_first() {
    let w = world(vec![apply("a", "team-a", 2)], vec![], vec![ns("a", Some("none"), false), ns("free", None, false)]);
    let plan = w.plan();
    assert_eq!(plan.labels.get("free"), Some(&Some("none")));
    assert_eq!(plan.labels.get("a"), Some(&None), "GPU work waits until the limits are in force");
    assert_eq!(plan.gates["a"].spec.state, GateState::Enforced);
    assert_eq!(plan.limits[&("a".to_string(), "tessera-team-a".to_string())][KEY], "2");
}

#[test]
fn a_namespace_is_labelled_tenant_only_once_its_resource_quota_enforces_and_owns_the_current_gate() {
    // Written but not in force: no label.
    let w = world(vec![apply("a", "team-a", 2)], vec![rq("a", "team-a", 2, false, false)], vec![ns("a", None, false)]);
    assert!(w.plan().labels.is_empty(), "{:?}", w.plan().labels);
    // In force, but no gate yet: no label.
    let mut w =
        world(vec![apply("a", "team-a", 2)], vec![rq("a", "team-a", 2, true, false)], vec![ns("a", None, false)]);
    assert!(w.plan().labels.is_empty());
    // The planned gate, owned by it: tenant.
    let plan = w.plan();
    w.gates = vec![gate_of(&plan, "a", "team-a")];
    assert_eq!(w.plan().labels.get("a"), Some(&Some("tenant")));
    // A stale gate (another spec) owned by it: no label yet.
    let mut stale = gate_of(&plan, "a", "team-a");
    stale.spec.limited = vec!["nvidia.com/mig-1g.10gb".into()];
    w.gates = vec![stale];
    assert!(w.plan().labels.is_empty());
    // Once tenant, a gate being rewritten keeps the label (the gate and ResourceQuota hold).
    w.namespaces = vec![ns("a", Some("tenant"), false)];
    assert!(w.plan().labels.is_empty());
}

#[test]
fn a_renamed_quota_s_resource_quota_is_held_until_the_new_one_enforces_and_owns_the_gate() {
    // Quota a deleted, a2 made over the same namespace: a's ResourceQuota is being deleted
    // (garbage collector), held by our finalizer.
    let old = rq("a", "team-a", 2, true, true);
    let mut w = world(vec![apply("a", "team-a2", 2)], vec![old.clone()], vec![ns("a", Some("tenant"), false)]);
    assert!(w.plan().releases.is_empty(), "the new one is not written yet");
    w.rqs.push(rq("a", "team-a2", 2, true, false));
    assert!(w.plan().releases.is_empty(), "in force, but the gate is still the old one's");
    let plan = w.plan();
    w.gates = vec![gate_of(&plan, "a", "team-a2")];
    assert_eq!(w.plan().releases, vec![("a".to_string(), "tessera-team-a".to_string())]);
}

#[test]
fn an_unclaimed_namespace_is_labelled_none_before_its_resource_quota_is_let_go() {
    let old = rq("a", "team-a", 2, true, true);
    let mut w = world(vec![], vec![old], vec![ns("a", Some("tenant"), false)]);
    let plan = w.plan();
    assert_eq!(plan.labels.get("a"), Some(&Some("none")));
    assert!(plan.releases.is_empty(), "still labelled tenant: its gate bindings read the gate it owns");
    w.namespaces = vec![ns("a", Some("none"), false)];
    assert_eq!(w.plan().releases, vec![("a".to_string(), "tessera-team-a".to_string())]);
}

#[test]
fn a_terminating_namespace_lets_go_at_once_and_is_not_labelled() {
    let w = world(vec![], vec![rq("a", "team-a", 2, true, true)], vec![ns("a", Some("tenant"), true)]);
    let plan = w.plan();
    assert_eq!(plan.releases.len(), 1);
    assert!(plan.labels.is_empty());
}

#[test]
fn the_planned_resource_quota_deleted_by_hand_is_let_go_to_be_written_anew() {
    let w = world(
        vec![apply("a", "team-a", 2)],
        vec![rq("a", "team-a", 2, true, true)],
        vec![ns("a", Some("tenant"), false)],
    );
    assert_eq!(w.plan().releases, vec![("a".to_string(), "tessera-team-a".to_string())]);
    // Not being deleted: kept.
    let w = world(
        vec![apply("a", "team-a", 2)],
        vec![rq("a", "team-a", 2, true, false)],
        vec![ns("a", Some("tenant"), false)],
    );
    assert!(w.plan().releases.is_empty());
}

#[test]
fn a_conflicting_quota_closes_its_namespaces_gate() {
    let mut w = world(vec![apply("a", "team-a", 2)], vec![], vec![ns("a", None, false)]);
    let conflict: Value = json!({"conditions": [{"type": "Conflict", "status": "True", "reason": "NamespaceClaimedTwice",
        "message": "namespace a is claimed by team-b too", "lastTransitionTime": "2026-12-01T00:00:00Z"}]});
    w.statuses.insert("team-a".into(), serde_json::from_value(conflict).unwrap());
    let gate = &w.plan().gates["a"].spec;
    assert_eq!(gate.state, GateState::Closed);
    assert!(gate.reason.contains("claimed by team-b too"), "{}", gate.reason);
}
