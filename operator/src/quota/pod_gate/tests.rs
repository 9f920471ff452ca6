use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ResourceQuota;
use serde_json::json;
use tessera_crds::TenantGpuQuota;

use super::PENDING;
use crate::quota::{Capacity, Dra, plan_quotas_dra, quota_label_value, resource_quota_name};

const GPU: &str = "requests.nvidia.com/gpu";

fn quota(name: &str, spec: serde_json::Value) -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": name, "generation": 1, "uid": format!("uid-{name}")}, "spec": spec}))
    .unwrap()
}

/// Our ResourceQuota of `q` in `ns` with `spec.hard` = `hard` and, when given, `status.hard`.
fn ours(q: &str, ns: &str, hard: i64, status: Option<i64>) -> ResourceQuota {
    let mut rq = json!({"metadata": {"name": resource_quota_name(q), "namespace": ns,
        "labels": {"tessera.dev/quota": quota_label_value(q)},
        "ownerReferences": [{"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "name": q,
                             "uid": format!("uid-{q}"), "controller": true}]},
        "spec": {"hard": {GPU: hard.to_string()}}});
    if let Some(s) = status {
        rq["status"] = json!({"hard": {GPU: s.to_string()}, "used": {GPU: "0"}});
    }
    serde_json::from_value(rq).unwrap()
}

fn pending(q: &TenantGpuQuota, nss: &[&str], rqs: &[ResourceQuota]) -> String {
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-06-01T00:00:00Z".parse().unwrap());
    let nss: BTreeSet<String> = nss.iter().map(|s| s.to_string()).collect();
    let plan = plan_quotas_dra(std::slice::from_ref(q), &nss, rqs, &Capacity::default(), &Dra::default(), now);
    plan.policy.get(PENDING).cloned().unwrap_or_else(|| panic!("no {PENDING} in {:?}", plan.policy))
}

/// Review gap: `team-a` lists `a` and `b`; `b` is created after the quota (or while the operator
/// is down). Before, nothing marked `b`: pods asking for `nvidia.com/gpu` were admitted there
/// (no ResourceQuota yet) until the controller manager synced the one the operator wrote. Now
/// `b` is pending until its ResourceQuota's `status.hard` holds the planned limit.
#[test]
fn a_tenant_namespace_is_pending_until_its_resource_quota_enforces_the_planned_limits() {
    let q = quota("team-a", json!({"namespaces": ["a", "b"], "hard": {"nvidia.com/gpu": 4}}));
    let a = ours("team-a", "a", 2, Some(2));
    let rows: Vec<(&str, Vec<&str>, Vec<ResourceQuota>, &str)> = vec![
        ("b does not exist yet", vec!["a"], vec![a.clone()], "b"),
        ("b created, no ResourceQuota", vec!["a", "b"], vec![a.clone()], "b"),
        ("written, status not synced", vec!["a", "b"], vec![a.clone(), ours("team-a", "b", 2, None)], "b"),
        ("status above planned", vec!["a", "b"], vec![a.clone(), ours("team-a", "b", 2, Some(5))], "b"),
        ("enforced", vec!["a", "b"], vec![a.clone(), ours("team-a", "b", 2, Some(2))], ""),
        ("a's status lost too", vec!["a", "b"], vec![ours("team-a", "a", 2, None)], "a b"),
    ];
    for (what, nss, rqs, want) in rows {
        assert_eq!(pending(&q, &nss, &rqs), want, "{what}");
    }
}

/// An invalid quota keeps what it enforced: its namespaces with a synced ResourceQuota of its
/// own stay open (they are limited as before); one where it never enforced anything is pending.
#[test]
fn an_invalid_quota_keeps_open_only_where_it_enforces() {
    let bad = quota("team-a", json!({"namespaces": ["a", "b"], "hard": {"nvidia.com/gpu": -1}}));
    let rqs = [ours("team-a", "a", 2, Some(2))];
    assert_eq!(pending(&bad, &["a", "b"], &rqs), "b");
}

/// Our ResourceQuota as the API server stores it: quantities in canonical form (`1000` is `1k`).
fn ours_canonical(q: &str, ns: &str, hard: &str) -> ResourceQuota {
    let mut rq = ours(q, ns, 0, Some(0));
    rq.spec
        .as_mut()
        .unwrap()
        .hard
        .as_mut()
        .unwrap()
        .insert(GPU.into(), k8s_openapi::apimachinery::pkg::api::resource::Quantity(hard.into()));
    let st = rq.status.as_mut().unwrap();
    st.hard.as_mut().unwrap().insert(GPU.into(), k8s_openapi::apimachinery::pkg::api::resource::Quantity(hard.into()));
    st.used.as_mut().unwrap().insert(GPU.into(), k8s_openapi::apimachinery::pkg::api::resource::Quantity("0".into()));
    rq
}

/// Review gap: `hard: nvidia.com/gpu: 1000` is stored and synced as `1k`; a plain integer parse
/// failed on it, so the namespace stayed pending forever (every GPU pod refused).
#[test]
fn a_limit_in_canonical_form_is_enforced() {
    let q = quota("team-a", json!({"namespaces": ["a"], "hard": {"nvidia.com/gpu": 1000}}));
    assert_eq!(pending(&q, &["a"], &[ours_canonical("team-a", "a", "1k")]), "");
    assert_eq!(pending(&q, &["a"], &[ours_canonical("team-a", "a", "1e3")]), "");
    assert_eq!(pending(&q, &["a"], &[ours_canonical("team-a", "a", "2k")]), "a");
}

/// Review gap: `hard: {}` (only physical limits) plans a ResourceQuota with no key, whose status
/// shows no `hard`: nothing is limited, so there is nothing to wait for.
#[test]
fn a_namespace_with_no_planned_limit_is_not_pending() {
    let q = quota("team-a", json!({"namespaces": ["a"], "hard": {}}));
    let mut rq = ours("team-a", "a", 0, None);
    rq.spec.as_mut().unwrap().hard = None;
    assert_eq!(pending(&q, &["a"], &[rq]), "");
    assert_eq!(pending(&q, &["a"], &[]), "");
}

/// `unlisted: Zero` quotas list the GPU resources their ResourceQuotas limit (for the pod
/// policy); `Unlimited` ones list none.
#[test]
fn a_zero_quota_lists_the_gpu_resources_its_resource_quotas_limit() {
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-06-01T00:00:00Z".parse().unwrap());
    let nss: BTreeSet<String> = ["a".to_string()].into();
    let zero = quota("team-a", json!({"namespaces": ["a"], "hard": {"nvidia.com/gpu": 2}, "unlisted": "Zero"}));
    let open = quota("team-b", json!({"namespaces": ["b"], "hard": {"nvidia.com/gpu": 2}}));
    let plan = plan_quotas_dra(&[zero, open], &nss, &[], &Capacity::default(), &Dra::default(), now);
    let listed: Vec<&str> = plan.policy["team-a.resources"].split(' ').collect();
    assert!(listed.contains(&"nvidia.com/gpu") && listed.contains(&"nvidia.com/mig-1g.10gb"), "{listed:?}");
    assert!(listed.iter().all(|r| crate::quota::is_gpu_resource(r)), "{listed:?}");
    assert!(!plan.policy.contains_key("team-b.resources"), "{:?}", plan.policy.keys());
}
