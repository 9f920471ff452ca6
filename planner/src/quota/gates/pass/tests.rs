use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use serde_json::{Value, json};
use tessera_crds::gate::{GateState, GpuQuotaGate, IN_FORCE_FINALIZER};
use tessera_crds::quota::TenantGpuQuotaStatus;

use super::{GateInputs, GatePlan, marks_settled, plan_gates};
use crate::quota::gates::Holder;
use crate::quota::gates::open::OpenNamespaces;
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

/// The gate `plan` wants in `namespace`, as cached, owned by nothing.
fn ownerless_gate_of(plan: &GatePlan, namespace: &str) -> GpuQuotaGate {
    let spec = serde_json::to_value(&plan.gates[namespace].spec).unwrap();
    serde_json::from_value(json!({"metadata": {"name": "gpu", "namespace": namespace}, "spec": spec})).unwrap()
}

fn holder(name: &str, created: &str, n: i64, placed: bool) -> Holder {
    Holder { name: name.into(), created: created.into(), charges: [(KEY.to_string(), n)].into(), placed }
}

struct World {
    claimed: BTreeMap<String, String>,
    open: OpenNamespaces,
    pods: BTreeMap<String, Vec<Holder>>,
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
            claimed: &self.claimed,
            open: &self.open,
            rqs: &self.rqs,
            gates: &self.gates,
            namespaces: &self.namespaces,
            pods: &self.pods,
            claims: &none,
        })
    }
}

/// The quota plan's `apply`, its quotas claiming what they apply to; `open` the open list.
fn world(apply: Vec<Apply>, rqs: Vec<ResourceQuota>, namespaces: Vec<Namespace>) -> World {
    let claimed = apply.iter().map(|a| (a.namespace.clone(), a.quota.clone())).collect();
    World {
        claimed,
        open: OpenNamespaces::parse("free").unwrap(),
        pods: BTreeMap::new(),
        apply,
        delete: vec![],
        statuses: BTreeMap::new(),
        rqs,
        gates: vec![],
        namespaces,
    }
}

#[test]
fn an_unclaimed_namespace_is_open_only_on_the_open_list_and_a_claimed_one_goes_straight_to_joining() {
    let w = world(
        vec![apply("a", "team-a", 2)],
        vec![],
        vec![ns("a", Some("open"), false), ns("free", None, false), ns("made-by-a-tenant", None, false)],
    );
    let plan = w.plan();
    assert_eq!(plan.labels.get("free"), Some(&"open"));
    assert_eq!(plan.labels.get("made-by-a-tenant"), Some(&"closed"), "not on the open list: closed, not open");
    assert_eq!(plan.labels.get("a"), Some(&"joining"), "from open to joining in one write: never unlabelled");
    assert_eq!(plan.limits[&("a".to_string(), "tessera-team-a".to_string())][KEY], "2");
    // The same from no label and from closed.
    for from in [None, Some("closed")] {
        let w = world(vec![apply("a", "team-a", 2)], vec![], vec![ns("a", from, false)]);
        assert_eq!(w.plan().labels.get("a"), Some(&"joining"), "from {from:?}");
    }
}

#[test]
fn while_its_resource_quota_is_not_seen_a_namespace_s_gate_is_closed_and_owns_nothing() {
    // Pass 1 of a join (the ResourceQuota being made), or one deleted without our finalizer: a
    // gate left from before (its lists stale) or an Enforced one the garbage collector has not
    // taken yet is replaced by a Closed one that needs no ResourceQuota.
    let mut w = world(vec![apply("a", "team-a", 2)], vec![], vec![ns("a", Some("tenant"), false)]);
    w.pods.insert("a".into(), vec![holder("waiting", "2026-01-01T00:00:01Z", 1, false)]);
    let g = &w.plan().gates["a"];
    assert_eq!(g.owner, None);
    assert_eq!(g.spec.state, GateState::Closed);
    assert!(g.spec.reason.contains("its ResourceQuota tessera-team-a is not in force yet"), "{}", g.spec.reason);
    assert_eq!(g.spec.blocked_pods, vec!["waiting".to_string()]);
    assert_eq!(w.plan().limits[&("a".to_string(), "tessera-team-a".to_string())][KEY], "2", "the share is written");
    // Seen: Enforced, owned by it.
    w.rqs = vec![rq("a", "team-a", 2, true, false)];
    let g = &w.plan().gates["a"];
    assert_eq!((g.owner.as_deref(), g.spec.state), (Some("tessera-team-a"), GateState::Enforced));
}

#[test]
fn a_gate_written_before_the_namespace_is_seen_joining_binds_and_allocates_nothing() {
    // A pod made a moment before the label changed may not be in the cache yet: the first gate
    // blocks every binding; once the cached namespace shows `joining`, the gate names the pods.
    let mut w = world(
        vec![apply("a", "team-a", 1)],
        vec![rq("a", "team-a", 1, false, false)],
        vec![ns("a", Some("open"), false)],
    );
    w.pods.insert(
        "a".into(),
        vec![holder("p1", "2026-01-01T00:00:01Z", 1, false), holder("p2", "2026-01-01T00:00:02Z", 1, false)],
    );
    let gate = &w.plan().gates["a"].spec;
    assert!(gate.block_all_bindings && gate.block_all_allocations, "{gate:?}");
    assert!(gate.reason.contains("joining TenantGpuQuota team-a"), "{}", gate.reason);
    w.namespaces = vec![ns("a", Some("joining"), false)];
    let gate = &w.plan().gates["a"].spec;
    assert!(!gate.block_all_bindings && !gate.block_all_allocations);
    assert_eq!(gate.blocked_pods, vec!["p2".to_string()], "the first made fits the share of 1");
}

#[test]
fn a_namespace_is_labelled_tenant_only_from_joining_once_its_resource_quota_enforces_and_owns_the_current_gate() {
    let joining = || vec![ns("a", Some("joining"), false)];
    // Written but not in force: stays joining.
    let w = world(vec![apply("a", "team-a", 2)], vec![rq("a", "team-a", 2, false, false)], joining());
    assert!(w.plan().labels.is_empty(), "{:?}", w.plan().labels);
    // In force, but no gate yet: stays joining.
    let mut w = world(vec![apply("a", "team-a", 2)], vec![rq("a", "team-a", 2, true, false)], joining());
    assert!(w.plan().labels.is_empty());
    // The planned gate, owned by it: tenant.
    let plan = w.plan();
    w.gates = vec![gate_of(&plan, "a", "team-a")];
    assert_eq!(w.plan().labels.get("a"), Some(&"tenant"));
    // The same, but the namespace not yet seen joining (open): joining first, never straight to tenant.
    let mut from_open = world(
        vec![apply("a", "team-a", 2)],
        vec![rq("a", "team-a", 2, true, false)],
        vec![ns("a", Some("open"), false)],
    );
    from_open.gates = vec![gate_of(&from_open.plan(), "a", "team-a")];
    assert_eq!(from_open.plan().labels.get("a"), Some(&"joining"));
    // A stale gate (another spec) owned by it: stays joining.
    let mut stale = gate_of(&plan, "a", "team-a");
    stale.spec.limited = vec!["nvidia.com/mig-1g.10gb".into()];
    w.gates = vec![stale];
    assert!(w.plan().labels.is_empty());
    // Once tenant, a gate being rewritten keeps the label (the gate and ResourceQuota hold).
    w.namespaces = vec![ns("a", Some("tenant"), false)];
    assert!(w.plan().labels.is_empty());
}

#[test]
fn a_namespace_claimed_by_a_quota_that_writes_no_resource_quota_gets_an_ownerless_closed_gate_never_open() {
    // An invalid quota (or one whose ResourceQuota names are taken) plans no ResourceQuota.
    let mut w = world(vec![], vec![], vec![ns("a", Some("open"), false)]);
    w.claimed.insert("a".into(), "team-a".into());
    w.open = OpenNamespaces::parse("a").unwrap();
    w.pods.insert("a".into(), vec![holder("early", "2026-01-01T00:00:01Z", 1, false)]);
    let plan = w.plan();
    assert_eq!(plan.labels.get("a"), Some(&"joining"), "claimed: never open, even on the open list");
    let g = &plan.gates["a"];
    assert_eq!(g.owner, None);
    assert_eq!(g.spec.state, GateState::Closed);
    assert!(
        g.spec.reason.contains("TenantGpuQuota team-a names the namespace but writes no ResourceQuota"),
        "{}",
        g.spec.reason
    );
    assert!(plan.limits.is_empty());
    // Seen joining: the gate names the unbound GPU pod (CPU pods still bind).
    w.namespaces = vec![ns("a", Some("joining"), false)];
    let plan = w.plan();
    assert_eq!(plan.gates["a"].spec.blocked_pods, vec!["early".to_string()]);
    assert!(!plan.gates["a"].spec.block_all_bindings);
    // It stays joining: never tenant without a ResourceQuota.
    w.gates = vec![ownerless_gate_of(&plan, "a")];
    assert!(w.plan().labels.is_empty(), "{:?}", w.plan().labels);
    // Its old ResourceQuota (the quota was valid before), stale now, is let go once the Closed gate holds.
    w.rqs = vec![rq("a", "team-a", 2, true, false)];
    w.delete = vec![Delete { namespace: "a".into(), name: "tessera-team-a".into(), quota: "team-a".into() }];
    assert_eq!(w.plan().releases, vec![("a".to_string(), "tessera-team-a".to_string())]);
    w.gates = vec![];
    assert!(w.plan().releases.is_empty(), "not before the Closed gate is in force");
}

#[test]
fn a_gate_no_quota_wants_is_deleted_once_the_namespace_is_labelled_open_or_closed() {
    let mut w = world(vec![], vec![], vec![ns("a", Some("tenant"), false)]);
    let mut claimed = world(vec![], vec![], vec![ns("a", Some("tenant"), false)]);
    claimed.claimed.insert("a".into(), "team-a".into());
    w.gates = vec![ownerless_gate_of(&claimed.plan(), "a")];
    assert!(w.plan().stale_gates.is_empty(), "still labelled tenant");
    assert_eq!(w.plan().labels.get("a"), Some(&"closed"));
    w.namespaces = vec![ns("a", Some("closed"), false)];
    assert_eq!(w.plan().stale_gates, vec!["a".to_string()]);
    claimed.namespaces = vec![ns("a", Some("closed"), false)];
    assert!(claimed.plan().stale_gates.is_empty(), "a claimed namespace keeps its gate");
}

#[test]
fn a_renamed_quota_s_resource_quota_is_held_until_the_new_one_enforces_and_owns_the_gate() {
    // Quota a deleted, a2 made over the same namespace: a's ResourceQuota is being deleted
    // (garbage collector), held by our finalizer.
    let old = rq("a", "team-a", 2, true, true);
    let mut w = world(vec![apply("a", "team-a2", 2)], vec![old.clone()], vec![ns("a", Some("tenant"), false)]);
    assert!(w.plan().releases.is_empty(), "the new one is not written yet");
    // The new one not seen yet: the namespace's ownerless Closed gate, cached, lets nothing go.
    w.gates = vec![ownerless_gate_of(&w.plan(), "a")];
    assert!(w.plan().gates["a"].owner.is_none());
    assert!(w.plan().releases.is_empty(), "the new ResourceQuota is not in force: the old one holds");
    w.gates = vec![];
    w.rqs.push(rq("a", "team-a2", 2, true, false));
    assert!(w.plan().releases.is_empty(), "in force, but no gate of its own yet");
    let mut old_gate = gate_of(&w.plan(), "a", "team-a");
    old_gate.spec.quota = "team-a".into();
    w.gates = vec![old_gate];
    assert!(w.plan().releases.is_empty(), "in force, but the gate is still the old one's");
    let plan = w.plan();
    w.gates = vec![gate_of(&plan, "a", "team-a2")];
    assert_eq!(w.plan().releases, vec![("a".to_string(), "tessera-team-a".to_string())]);
}

#[test]
fn an_unclaimed_namespace_is_labelled_open_or_closed_before_its_resource_quota_is_let_go() {
    let old = rq("a", "team-a", 2, true, true);
    let mut w = world(vec![], vec![old], vec![ns("a", Some("tenant"), false)]);
    let plan = w.plan();
    assert_eq!(plan.labels.get("a"), Some(&"closed"));
    assert!(plan.releases.is_empty(), "still labelled tenant: its gate bindings read the gate it owns");
    w.namespaces = vec![ns("a", Some("closed"), false)];
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
fn the_planned_resource_quota_deleted_by_hand_closes_its_gate_before_it_is_let_go() {
    let mut w = world(
        vec![apply("a", "team-a", 2)],
        vec![rq("a", "team-a", 2, true, true)],
        vec![ns("a", Some("tenant"), false)],
    );
    // Its Enforced gate, cached: the gate goes Closed first, the ResourceQuota is kept.
    let enforced = {
        let mut live = world(
            vec![apply("a", "team-a", 2)],
            vec![rq("a", "team-a", 2, true, false)],
            vec![ns("a", Some("tenant"), false)],
        );
        live.gates = vec![];
        gate_of(&live.plan(), "a", "team-a")
    };
    assert_eq!(enforced.spec.state, GateState::Enforced);
    w.gates = vec![enforced];
    let plan = w.plan();
    assert_eq!(plan.gates["a"].spec.state, GateState::Closed);
    assert!(plan.gates["a"].spec.reason.contains("is being deleted"), "{}", plan.gates["a"].spec.reason);
    assert!(plan.releases.is_empty(), "its Enforced gate still admits: kept until the gate is Closed");
    // The Closed gate cached: let go (written anew once gone).
    w.gates = vec![gate_of(&plan, "a", "team-a")];
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
fn a_renamed_quota_s_resource_quota_is_let_go_while_the_new_gate_s_blocked_lists_churn() {
    let old = rq("a", "team-a", 2, true, true);
    let mut w = world(
        vec![apply("a", "team-a2", 2)],
        vec![old, rq("a", "team-a2", 2, true, false)],
        vec![ns("a", Some("tenant"), false)],
    );
    let mut churned = gate_of(&w.plan(), "a", "team-a2");
    churned.spec.blocked_pods = vec!["a-pod-since-deleted".into()];
    w.gates = vec![churned.clone()];
    assert_eq!(w.plan().releases.len(), 1, "the blocked list lags; the share and the resources are the planned ones");
    churned.spec.state = GateState::Closed;
    w.gates = vec![churned];
    assert!(w.plan().releases.is_empty(), "a gate saying something else about admission does not replace it");
}

#[test]
fn a_conflicting_quota_closes_its_namespaces_gate() {
    let mut w =
        world(vec![apply("a", "team-a", 2)], vec![rq("a", "team-a", 2, true, false)], vec![ns("a", None, false)]);
    let conflict: Value = json!({"conditions": [{"type": "Conflict", "status": "True", "reason": "NamespaceClaimedTwice",
        "message": "namespace a is claimed by team-b too", "lastTransitionTime": "2026-12-01T00:00:00Z"}]});
    w.statuses.insert("team-a".into(), serde_json::from_value(conflict).unwrap());
    let gate = &w.plan().gates["a"].spec;
    assert_eq!(gate.state, GateState::Closed);
    assert!(gate.reason.contains("claimed by team-b too"), "{}", gate.reason);
}

#[test]
fn the_marks_are_settled_once_every_namespace_carries_its_own_but_for_joining_to_tenant() {
    let unlabelled = world(vec![apply("a", "team-a", 2)], vec![], vec![ns("a", None, false), ns("free", None, false)]);
    let plan = unlabelled.plan();
    assert!(!marks_settled(&unlabelled.namespaces, &plan), "unlabelled namespaces: the gates hold nothing yet");
    let labelled = vec![ns("a", Some("joining"), false), ns("free", Some("open"), false)];
    let joining = world(vec![apply("a", "team-a", 2)], vec![rq("a", "team-a", 2, true, false)], labelled);
    let mut w = joining;
    let first = w.plan();
    w.gates = vec![gate_of(&first, "a", "team-a")];
    let plan = w.plan();
    assert_eq!(plan.labels.get("a"), Some(&"tenant"), "joining to tenant is still planned");
    assert!(marks_settled(&w.namespaces, &plan), "a joining namespace is held by its gate");
    // A namespace still open that a quota now claims: not settled (the gates do not hold it yet).
    let w = world(vec![apply("a", "team-a", 2)], vec![], vec![ns("a", Some("open"), false)]);
    assert!(!marks_settled(&w.namespaces, &w.plan()));
    // A claimed namespace labelled tenant that leaves its quota (to be closed): not settled.
    let w = world(vec![], vec![], vec![ns("gone", Some("tenant"), false)]);
    assert!(!marks_settled(&w.namespaces, &w.plan()));
}

#[test]
fn a_namespace_labelled_tenant_by_hand_is_settled_only_once_its_planned_gate_is_cached() {
    let mut w = world(
        vec![apply("a", "team-a", 2)],
        vec![rq("a", "team-a", 2, true, false)],
        vec![ns("a", Some("tenant"), false)],
    );
    let first = w.plan();
    assert!(first.labels.is_empty(), "the label already says tenant");
    assert!(!first.settled, "no gate cached yet: the first is written from this pass's look at the pods");
    w.gates = vec![gate_of(&first, "a", "team-a")];
    assert!(w.plan().settled, "the planned gate cached, owned by its ResourceQuota");
    // A gate cached with other blocked pods than planned: not settled.
    w.pods.insert("a".into(), vec![holder("late", "2026-12-01T00:00:00Z", 3, false)]);
    assert!(!w.plan().settled, "the pods changed since the cached gate");
}
