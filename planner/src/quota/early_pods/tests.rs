use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::*;

const SINCE: &str = "2026-06-01T10:00:00Z";

/// A pod in `ns` made at `created`, with `spec` and `status` as given.
fn pod(ns: &str, name: &str, created: &str, spec: Value, status: Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns, "creationTimestamp": created},
        "spec": spec, "status": status}))
    .unwrap()
}

/// One container asking for `resources` (`{"requests": ...}` or `{"limits": ...}`).
fn asking(resources: Value) -> Value {
    json!({"containers": [{"name": "c", "image": "i", "resources": resources}]})
}

fn gpu() -> Value {
    asking(json!({"requests": {"nvidia.com/mig-1g.10gb": "1"}}))
}

/// Params of tenant `x` (quota `a`, ResourceQuota since [`SINCE`], enforced) and `p` (pending,
/// no `.since` yet); `c` is conflicted (enforced; `.since` the later quota's stamp); `other`
/// is no tenant.
fn policy() -> BTreeMap<String, String> {
    [("x.quota", "a"), ("x.since", SINCE), ("p.quota", "b"), ("c.quota", "a b"), ("c.since", SINCE), ("_pending", "p")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn planned(pods: &[Pod]) -> BTreeMap<String, String> {
    let pending: Vec<PendingPod> = pods.iter().filter_map(unbound_gpu_pod).collect();
    policy_pods(&pending, &policy(), &Later::new(), usize::MAX)
}

#[test]
fn only_unbound_unfinished_gpu_pods_made_by_since_in_tenant_namespaces_are_listed() {
    let before = "2026-06-01T09:00:00Z";
    let after = "2026-06-01T10:00:01Z";
    let running = json!({"phase": "Running"});
    let none = json!({});
    let mut bound = gpu();
    bound["nodeName"] = json!("n1");
    let init = json!({"containers": [{"name": "c", "image": "i"}],
        "initContainers": [{"name": "i", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]});
    for (p, listed) in [
        (pod("x", "early", before, gpu(), json!({"phase": "Pending"})), true),
        (pod("x", "same-second", SINCE, gpu(), none.clone()), true),
        (
            pod("x", "limits-only", before, asking(json!({"limits": {"nvidia.com/gpu.shared": "1"}})), none.clone()),
            true,
        ),
        (pod("x", "init", before, init, none.clone()), true),
        (pod("x", "after", after, gpu(), none.clone()), false),
        (pod("x", "bound", before, bound, running), false),
        (pod("x", "cpu", before, asking(json!({"requests": {"cpu": "1"}})), none.clone()), false),
        (pod("x", "hostdev", before, asking(json!({"requests": {"nvidia.com/hostdev": "1"}})), none.clone()), false),
        (pod("x", "failed", before, gpu(), json!({"phase": "Failed"})), false),
        (pod("x", "done", before, gpu(), json!({"phase": "Succeeded"})), false),
        (pod("other", "not-a-tenant", before, gpu(), none.clone()), false),
        (pod("p", "pending-ns", after, gpu(), none.clone()), true),
        (pod("c", "conflicted", before, gpu(), none.clone()), true),
        (pod("c", "conflicted-after", after, gpu(), none.clone()), false),
    ] {
        let name = p.metadata.name.clone().unwrap();
        let ns = p.metadata.namespace.clone().unwrap();
        let got = planned(std::slice::from_ref(&p));
        let want = listed.then(|| name.clone());
        assert_eq!(got.get(&pods_key(&ns)).cloned(), want, "{ns}/{name}");
    }
}

#[test]
fn a_pod_of_unknown_creation_time_made_in_a_tenant_namespace_is_listed() {
    let mut p = pod("x", "unknown", SINCE, gpu(), json!({}));
    p.metadata.creation_timestamp = None;
    assert_eq!(planned(&[p]).get("x.pods").map(String::as_str), Some("unknown"));
}

#[test]
fn names_are_sorted_and_joined_per_namespace() {
    let pods = [
        pod("x", "b", "2026-06-01T09:00:00Z", gpu(), json!({})),
        pod("x", "a", "2026-06-01T09:00:00Z", gpu(), json!({})),
        pod("p", "z", "2026-06-01T09:00:00Z", gpu(), json!({})),
    ];
    let got = planned(&pods);
    assert_eq!(
        got,
        BTreeMap::from([("p.pods".to_string(), "z".to_string()), ("x.pods".to_string(), "a b".to_string())])
    );
}

#[test]
fn past_the_cap_or_the_budget_a_namespace_says_all() {
    let early = |ns: &str, n: usize, len: usize| -> Vec<PendingPod> {
        (0..n)
            .map(|i| PendingPod {
                namespace: ns.into(),
                name: format!("{i:0len$}"),
                created: None,
                resources: Default::default(),
            })
            .collect()
    };
    // 4096 characters fit the cap exactly (64 names of 63 characters, 63 spaces: 4095); 65 do not.
    let fits = policy_pods(&early("x", 64, 63), &policy(), &Later::new(), usize::MAX);
    assert_eq!(fits["x.pods"].len(), 64 * 64 - 1);
    assert_eq!(policy_pods(&early("x", 65, 63), &policy(), &Later::new(), usize::MAX)["x.pods"], ALL_PODS);
    // The budget is spent in name order: `p` (10 characters) fits 10, `x` does not.
    let both = [early("p", 1, 10), early("x", 1, 10)].concat();
    let got = policy_pods(&both, &policy(), &Later::new(), 10);
    assert_eq!(got["p.pods"], "0000000000");
    assert_eq!(got["x.pods"], ALL_PODS);
}

/// Through the whole pass: quota `team-a` (extended resources) over `x`, whose ResourceQuota was
/// made at [`SINCE`]. The pod made before it is listed in `x.pods`, the one made after is not;
/// `<ns>.since` is the ResourceQuota's in-force stamp, as for claims.
#[test]
fn the_pass_lists_the_gpu_pods_made_before_the_namespace_s_resource_quota() {
    use crate::quota::{Capacity, DraInputs, plan_quotas_dra, quota_label_value, resource_quota_name};
    let q: tessera_crds::TenantGpuQuota = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1",
        "kind": "TenantGpuQuota", "metadata": {"name": "team-a", "generation": 1, "uid": "uid-team-a"},
        "spec": {"namespaces": ["x"], "hard": {"nvidia.com/mig-1g.10gb": 1}}}))
    .unwrap();
    let hard = json!({"requests.nvidia.com/mig-1g.10gb": "1"});
    let rq: k8s_openapi::api::core::v1::ResourceQuota = serde_json::from_value(json!({"metadata": {
            "name": resource_quota_name("team-a"), "namespace": "x", "creationTimestamp": SINCE,
            "labels": {"tessera.dev/quota": quota_label_value("team-a")},
            "ownerReferences": [{"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "name": "team-a",
                                 "uid": "uid-team-a", "controller": true}]},
        "spec": {"hard": hard}, "status": {"hard": hard, "used": {"requests.nvidia.com/mig-1g.10gb": "1"}}}))
    .unwrap();
    let pods = [
        pod("x", "hoard", "2026-06-01T09:00:00Z", gpu(), json!({"phase": "Pending"})),
        pod("x", "later", "2026-06-01T10:00:01Z", gpu(), json!({"phase": "Pending"})),
    ];
    let dra = DraInputs { pods: pods.iter().filter_map(unbound_gpu_pod).collect(), ..Default::default() };
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-06-01T11:00:00Z".parse().unwrap());
    let nss = ["x".to_string()].into_iter().collect();
    // Stamped at its creation: `<ns>.since` is the in-force stamp.
    let rq = crate::quota::stamp::stamped(rq);
    let p = plan_quotas_dra(std::slice::from_ref(&q), &nss, &[rq], &Capacity::default(), &dra, now);
    assert_eq!(p.policy.get("x.since").map(String::as_str), Some(SINCE));
    assert_eq!(p.policy.get("x.pods").map(String::as_str), Some("hoard"));
}
