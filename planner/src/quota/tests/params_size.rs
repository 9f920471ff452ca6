//! The params ConfigMap (1 MiB at most) sized through the full pass with every key
//! at its worst, not a plan without UIDs, reasons, `.limited` or `.claims`.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ResourceQuota;
use serde_json::json;
use tessera_crds::TenantGpuQuota;

use super::super::unallocated::{CLAIMS_BUDGET, Pending};
use super::super::{Capacity, DraInputs, fallback_resource_quota_name, plan_quotas_dra, resource_quota_name};

/// How many tenant namespaces the worst case below fits (README, "Tenant GPU quotas"): about
/// 1.7 KiB each beside the 256 KiB of claims and early pods (`<ns>.pods` shares the budget).
const WORST_CASE_NAMESPACES: usize = 440;

/// How many the usual case fits (about 460 bytes each beside the claims): 20-character names,
/// one quota per namespace, nothing taken, every namespace pending (its hint at its longest).
const USUAL_NAMESPACES: usize = 1500;

fn quota(name: &str, nss: &[String], unlisted: &str) -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": name, "generation": 1, "uid": format!("uid-{name}")},
        "spec": {"namespaces": nss, "hard": {"nvidia.com/gpu": 8, "nvidia.com/mig-1g.10gb": 8}, "unlisted": unlisted}}))
    .unwrap()
}

/// Someone else's ResourceQuota `name` in `ns` (takes the name).
fn foreign(name: String, ns: &str) -> ResourceQuota {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns}, "spec": {"hard": {"pods": "9"}}}))
        .unwrap()
}

/// The params of `n` namespaces of 63 characters (the most a name has), each claimed by two
/// quotas of 63-character names (a conflict, one `unlisted: Zero`: `<ns>.quota` holds both,
/// `<ns>.limited` is written) whose ResourceQuota names are all taken (`<ns>.pending` holds both
/// reasons, every namespace is in `_pending`), with a UID and leftover claims filling
/// `<ns>.claims` up to its cap until the budget is spent, and an early pod (`<ns>.pods`).
/// With `worst` false: names of 20 characters, one `Zero` quota per namespace, no name taken
/// (every namespace still pending, with its UID and claims).
fn params(n: usize, worst: bool) -> BTreeMap<String, String> {
    let nss: Vec<String> =
        (0..n).map(|i| if worst { format!("t{i:062}") } else { format!("tenant-ns-{i:010}") }).collect();
    let mut quotas = Vec::new();
    for (i, chunk) in nss.chunks(50).enumerate() {
        if worst {
            quotas.push(quota(&format!("z{i:062}"), chunk, "Zero"));
            quotas.push(quota(&format!("u{i:062}"), chunk, "Unlimited"));
        } else {
            quotas.push(quota(&format!("team-{i:015}"), chunk, "Zero"));
        }
    }
    let mut rqs = Vec::new();
    for q in quotas.iter().filter(|_| worst) {
        let name = q.metadata.name.clone().unwrap();
        for ns in &q.spec.namespaces {
            rqs.push(foreign(resource_quota_name(&name), ns));
            rqs.push(foreign(fallback_resource_quota_name(&name, &format!("uid-{name}")), ns));
        }
    }
    // Claims of 63-character names: 12 of `<name>:gpu.nvidia.com` make the 1 KiB cap.
    let pending = nss
        .iter()
        .flat_map(|ns| {
            (0..12).map(move |j| Pending {
                namespace: ns.clone(),
                name: format!("c{j:062}"),
                class: "gpu.nvidia.com".into(),
                resource: None,
                count: 32,
            })
        })
        .collect();
    let namespace_uids =
        nss.iter().map(|ns| (ns.clone(), "0b6f3b1e-6f0e-4c4e-9d2a-6f1c2b3a4d5e".to_string())).collect();
    // And a pod made before each namespace joined, unbound: `<ns>.pods` (the budget is shared).
    let pods = nss
        .iter()
        .map(|ns| super::super::early_pods::PendingPod {
            namespace: ns.clone(),
            name: format!("p{:062}", 0),
            created: None,
            resources: Default::default(),
        })
        .collect();
    let dra = DraInputs { pending, namespace_uids, pods, ..Default::default() };
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-06-01T00:00:00Z".parse().unwrap());
    let existing: BTreeSet<String> = nss.iter().cloned().collect();
    plan_quotas_dra(&quotas, &existing, &rqs, &Capacity::default(), &dra, now).policy
}

fn size(params: &BTreeMap<String, String>) -> usize {
    params.iter().map(|(k, v)| k.len() + v.len()).sum()
}

#[test]
fn the_params_fit_a_config_map_with_every_key_at_its_worst() {
    let p = params(WORST_CASE_NAMESPACES, true);
    let ns = format!("t{:062}", 0);
    // Every per-namespace key is there, at its worst.
    for key in ["quota", "allowed", "hint", "uid", "pending", "limited", "claims", "pods"] {
        assert!(p.contains_key(&format!("{ns}.{key}")), "no {ns}.{key} in the worst case");
    }
    assert!(p[&format!("{ns}.pending")].contains("; "), "both quotas' reasons");
    assert_eq!(p["_pending"].split(' ').count(), WORST_CASE_NAMESPACES);
    let claims: usize =
        p.iter().filter(|(k, _)| k.ends_with(".claims") || k.ends_with(".pods")).map(|(_, v)| v.len()).sum();
    assert!(claims <= CLAIMS_BUDGET + 2 * 4 * WORST_CASE_NAMESPACES, "{claims}");
    let last = format!("t{:062}", WORST_CASE_NAMESPACES - 1);
    assert_eq!(p[&format!("{last}.pods")], "_all", "the claims spent the shared budget");
    assert!(p.values().any(|v| v == "_all"), "the claims budget is spent");
    let total = size(&p);
    assert!(total < 1024 * 1024, "{total} bytes for {WORST_CASE_NAMESPACES} namespaces");
    // What each namespace costs beyond the claims budget, for the README's count.
    let per_ns = (total - claims) / WORST_CASE_NAMESPACES;
    assert!(per_ns < 1800, "{per_ns} bytes per namespace beside the claims");
}

#[test]
fn the_params_of_1500_usual_tenant_namespaces_fit_a_config_map() {
    let p = params(USUAL_NAMESPACES, false);
    let ns = format!("tenant-ns-{:010}", 0);
    for key in ["quota", "allowed", "hint", "uid", "claims"] {
        assert!(p.contains_key(&format!("{ns}.{key}")), "no {ns}.{key}");
    }
    assert_eq!(p["_pending"].split(' ').count(), USUAL_NAMESPACES);
    assert!(p.values().any(|v| v == "_all"), "the claims budget is spent");
    let total = size(&p);
    assert!(total < 1024 * 1024, "{total} bytes for {USUAL_NAMESPACES} namespaces");
}
