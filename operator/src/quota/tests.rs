use serde_json::json;

use super::*;

fn quota(name: &str, spec: serde_json::Value) -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": name, "generation": 1, "uid": format!("uid-{name}")}, "spec": spec}))
    .unwrap()
}

fn gpunode(gpus: serde_json::Value) -> GpuNode {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "metadata": {"name": "n"},
        "spec": {}, "status": {"gpus": gpus}}))
    .unwrap()
}

fn h100(instances: &[&str]) -> serde_json::Value {
    let inst: Vec<_> =
        instances.iter().enumerate().map(|(i, p)| json!({"profile": p, "start": i, "size": 1})).collect();
    json!({"index": 0, "uuid": "u", "product": "NVIDIA H100 80GB HBM3", "memoryMib": 81559, "migEnabled": true, "instances": inst})
}

/// A ResourceQuota as Tessera writes it for `quota` in `ns`.
fn ours(quota: &str, ns: &str, used: &str) -> ResourceQuota {
    serde_json::from_value(json!({"metadata": {"name": resource_quota_name(quota), "namespace": ns,
        "labels": {"tessera.dev/quota": quota_label_value(quota)},
        "ownerReferences": [{"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "name": quota,
                             "uid": format!("uid-{quota}"), "controller": true}]},
        "spec": {"hard": {"requests.nvidia.com/mig-1g.10gb": "4"}},
        "status": {"used": {"requests.nvidia.com/mig-1g.10gb": used}}}))
    .unwrap()
}

fn ns(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn now() -> Time {
    Time("2026-06-01T00:00:00Z".parse().unwrap())
}

fn cond<'a>(st: &'a TenantGpuQuotaStatus, t: &str) -> &'a Condition {
    st.conditions.iter().find(|c| c.type_ == t).unwrap_or_else(|| panic!("no {t} in {:?}", st.conditions))
}

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

#[test]
fn even_split_gives_the_remainder_to_the_first_namespaces() {
    let q =
        quota("a", json!({"namespaces": ["x", "y", "z"], "hard": {"nvidia.com/mig-1g.10gb": 5, "nvidia.com/gpu": 1}}));
    let s = shares(&q.spec);
    assert_eq!(s["x"]["nvidia.com/mig-1g.10gb"], 2);
    assert_eq!(s["y"]["nvidia.com/mig-1g.10gb"], 2);
    assert_eq!(s["z"]["nvidia.com/mig-1g.10gb"], 1);
    assert_eq!((s["x"]["nvidia.com/gpu"], s["y"]["nvidia.com/gpu"], s["z"]["nvidia.com/gpu"]), (1, 0, 0));
    for r in ["nvidia.com/mig-1g.10gb", "nvidia.com/gpu"] {
        assert_eq!(s.values().map(|m| m[r]).sum::<i64>(), q.spec.hard[r], "shares add up to hard");
    }
}

#[test]
fn explicit_split_uses_namespace_hard_and_zero_elsewhere() {
    let q = quota(
        "a",
        json!({"namespaces": ["x", "y"], "hard": {"nvidia.com/mig-1g.10gb": 4}, "split": "Explicit",
                              "namespaceHard": {"x": {"nvidia.com/mig-1g.10gb": 3}}}),
    );
    let s = shares(&q.spec);
    assert_eq!((s["x"]["nvidia.com/mig-1g.10gb"], s["y"]["nvidia.com/mig-1g.10gb"]), (3, 0));
}

#[test]
fn resource_quotas_are_planned_per_namespace_with_requests_prefix() {
    let q = quota("team-a", json!({"namespaces": ["a1", "a2"], "hard": {"nvidia.com/mig-3g.40gb": 2}}));
    let p = plan_quotas(&[q], &ns(&["a1", "a2"]), &[], &[], now());
    assert_eq!(
        p.apply,
        vec![
            ("a1".into(), "team-a".into(), [("requests.nvidia.com/mig-3g.40gb".to_string(), "1".to_string())].into()),
            ("a2".into(), "team-a".into(), [("requests.nvidia.com/mig-3g.40gb".to_string(), "1".to_string())].into()),
        ]
    );
    assert_eq!(cond(&p.statuses["team-a"], READY).status, "True");
}

#[test]
fn capacity_names_the_shortfall_per_resource() {
    let a = quota("a", json!({"namespaces": ["a"], "hard": {"nvidia.com/mig-1g.10gb": 5}}));
    let b =
        quota("b", json!({"namespaces": ["b"], "hard": {"nvidia.com/mig-1g.10gb": 4, "nvidia.com/mig-3g.40gb": 1}}));
    let fleet = [gpunode(json!([h100(&["1g.10gb"; 7])]))];
    assert_eq!(fleet_supply(&fleet)["nvidia.com/mig-1g.10gb"], 7);
    let p = plan_quotas(&[a, b], &ns(&["a", "b"]), &[], &fleet, now());
    for q in ["a", "b"] {
        let c = cond(&p.statuses[q], CAPACITY_AVAILABLE);
        assert_eq!(c.status, "False");
        assert_eq!(
            c.message,
            "over-committed: nvidia.com/mig-1g.10gb: quotas 9, fleet 7, short 2; nvidia.com/mig-3g.40gb: quotas 1, fleet 0, short 1"
        );
    }
}

#[test]
fn a_namespace_claimed_twice_is_a_conflict_on_both_and_left_alone() {
    let a = quota("a", json!({"namespaces": ["shared", "a"], "hard": {"nvidia.com/gpu": 2}}));
    let b = quota("b", json!({"namespaces": ["shared"], "hard": {"nvidia.com/gpu": 1}}));
    let p = plan_quotas(&[a, b], &ns(&["shared", "a"]), &[], &[], now());
    assert!(p.apply.iter().all(|(n, _, _)| n != "shared"));
    assert!(p.apply.iter().any(|(n, q, _)| n == "a" && q == "a"));
    for q in ["a", "b"] {
        assert_eq!(cond(&p.statuses[q], CONFLICT).status, "True");
        assert!(cond(&p.statuses[q], CONFLICT).message.contains("shared (also claimed by"));
    }
}

#[test]
fn an_invalid_spec_is_reported_and_keeps_what_was_enforced() {
    let bad = quota(
        "a",
        json!({"namespaces": ["a"], "hard": {"nvidia.com/mig-1g.10gb": 4}, "split": "Explicit",
                                "namespaceHard": {"a": {"nvidia.com/mig-1g.10gb": 9}}}),
    );
    let existing = ours("a", "a", "0");
    let p = plan_quotas(&[bad], &ns(&["a"]), &[existing], &[], now());
    assert!(p.apply.is_empty() && p.delete.is_empty(), "{p:?}");
    let st = &p.statuses["a"];
    assert_eq!(cond(st, STALLED).reason, "InvalidSpec");
    assert!(cond(st, STALLED).message.contains("add up to 9, more than spec.hard allows (4)"));
}

#[test]
fn stale_resource_quotas_are_deleted_and_usage_is_summed() {
    let q = quota("a", json!({"namespaces": ["a1"], "hard": {"nvidia.com/mig-1g.10gb": 4}}));
    let rq = |ns: &str, used: &str| ours("a", ns, used);
    let p = plan_quotas(&[q], &ns(&["a1", "old"]), &[rq("a1", "3"), rq("old", "1")], &[], now());
    assert_eq!(p.delete, vec![("old".to_string(), "tessera-a".to_string())]);
    let st = &p.statuses["a"];
    assert_eq!(
        st.resources[0],
        ResourceUsage { name: "nvidia.com/mig-1g.10gb".into(), hard: 4, used: 3, remaining: 1 }
    );
}

#[test]
fn physical_limits_are_checked_and_reported() {
    assert_eq!(
        physical(&[("nvidia.com/mig-3g.40gb".to_string(), 2), ("nvidia.com/gpu".to_string(), 1)].into(), 80),
        (13, 160)
    );
    let q = quota(
        "a",
        json!({"namespaces": ["a"], "hard": {"nvidia.com/mig-3g.40gb": 3}, "physical": {"computeSlices": 6}}),
    );
    let mut rq = ours("a", "a", "0");
    rq.status.as_mut().unwrap().used = Some(
        [(
            "requests.nvidia.com/mig-3g.40gb".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()),
        )]
        .into(),
    );
    let p = plan_quotas(std::slice::from_ref(&q), &ns(&["a"]), std::slice::from_ref(&rq), &[], now());
    let ready = cond(&p.statuses["a"], READY);
    assert_eq!(ready.status, "True");
    assert!(
        ready.message.contains("per-profile limits allow 9 compute slices, more than the physical limit 6; usage is 3")
    );
    let mut over = rq;
    over.status.as_mut().unwrap().used.as_mut().unwrap().insert(
        "requests.nvidia.com/mig-3g.40gb".into(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("3".into()),
    );
    let p = plan_quotas(&[q], &ns(&["a"]), &[over], &[], now());
    let ready = cond(&p.statuses["a"], READY);
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "OverPhysicalLimit"));
}

#[test]
fn a_namespace_claimed_twice_keeps_the_limits_enforced_there() {
    let a = quota("a", json!({"namespaces": ["x"], "hard": {"nvidia.com/mig-1g.10gb": 4}}));
    let b = quota("b", json!({"namespaces": ["x", "y"], "hard": {"nvidia.com/mig-1g.10gb": 2}}));
    let p = plan_quotas(&[a, b], &ns(&["x", "y"]), &[ours("a", "x", "2")], &[], now());
    assert!(p.delete.is_empty(), "the enforced ResourceQuota stays: {:?}", p.delete);
    assert!(p.apply.iter().all(|(n, _, _)| n != "x"), "nothing new is applied in x: {:?}", p.apply);
    assert!(p.apply.iter().any(|(n, q, _)| n == "y" && q == "b"), "b's other namespace is still managed");
    for q in ["a", "b"] {
        let c = cond(&p.statuses[q], CONFLICT);
        assert!(c.message.contains("keep the limits enforced before"), "{}", c.message);
        assert_eq!(cond(&p.statuses[q], STALLED).reason, "Conflict");
    }
}

#[test]
fn long_quota_names_get_valid_distinct_names_and_labels() {
    let long = |end: &str| format!("{}{end}", "t".repeat(250));
    let (a, b) = (long("-aa"), long("-ab"));
    for name in [&a, &b] {
        assert!(resource_quota_name(name).len() <= 253 && quota_label_value(name).len() <= 63);
        assert!(quota_label_value(name).ends_with(|c: char| c.is_ascii_alphanumeric()));
    }
    assert_ne!(resource_quota_name(&a), resource_quota_name(&b));
    assert_ne!(quota_label_value(&a), quota_label_value(&b));
    assert_eq!(resource_quota_name("team-a"), "tessera-team-a", "short names are unchanged");
    assert_eq!(quota_label_value("team-a"), "team-a");
    let q = quota(&a, json!({"namespaces": ["x"], "hard": {"nvidia.com/mig-1g.10gb": 4}}));
    let p = plan_quotas(&[q], &ns(&["x"]), &[ours(&a, "x", "1")], &[], now());
    assert!(p.delete.is_empty(), "its own ResourceQuota is recognised: {:?}", p.delete);
    assert_eq!(p.statuses[&a].resources[0].used, 1);
}

#[test]
fn a_users_own_resource_quota_is_never_adopted_or_deleted() {
    let q = quota("a", json!({"namespaces": ["x"], "hard": {"nvidia.com/mig-1g.10gb": 4}}));
    // Same name as ours, and even our label, but no owner reference: the user's.
    let mine: ResourceQuota = serde_json::from_value(json!({"metadata": {"name": "tessera-a", "namespace": "x",
        "labels": {"tessera.dev/quota": "a"}}, "spec": {"hard": {"requests.nvidia.com/gpu": "1"}}}))
    .unwrap();
    let stale_looking: ResourceQuota = serde_json::from_value(json!({"metadata": {"name": "tessera-old",
        "namespace": "x", "labels": {"tessera.dev/quota": "old"}}}))
    .unwrap();
    let p = plan_quotas(&[q], &ns(&["x"]), &[mine, stale_looking], &[], now());
    assert!(p.apply.is_empty(), "not overwritten: {:?}", p.apply);
    assert!(p.delete.is_empty(), "not deleted: {:?}", p.delete);
    let st = &p.statuses["a"];
    assert_eq!(cond(st, STALLED).reason, "ResourceQuotaNameTaken");
    assert!(
        cond(st, READY)
            .message
            .contains("namespace x: a ResourceQuota named tessera-a exists that this quota does not own")
    );
}
