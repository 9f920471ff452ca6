use serde_json::json;
use tessera_crds::conditions::{CONFLICT, READY, STALLED, find};

use super::*;
use crate::quota::claims::{ClassView, devices_key};
use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::quota::{Capacity, DraInputs, plan_quotas_dra, resource_quota_name};

fn quota(name: &str, spec: serde_json::Value) -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": name, "generation": 1, "uid": format!("uid-{name}")}, "spec": spec}))
    .unwrap()
}

/// A ResourceQuota `quota` wrote in `ns` with `hard` (and the same in `status.hard`, nothing used).
fn ours(quota: &str, ns: &str, hard: &[(&str, &str)]) -> ResourceQuota {
    let hard: BTreeMap<&str, &str> = hard.iter().copied().collect();
    let used: BTreeMap<&str, &str> = hard.keys().map(|k| (*k, "0")).collect();
    serde_json::from_value(json!({"metadata": {"name": resource_quota_name(quota), "namespace": ns,
        "labels": {"tessera.dev/quota": quota},
        "ownerReferences": [{"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "name": quota,
                             "uid": format!("uid-{quota}"), "controller": true}]},
        "spec": {"hard": hard}, "status": {"hard": hard, "used": used}}))
    .map(crate::quota::stamp::stamped) // synced: a pass stamped it
    .unwrap()
}

fn namespaces(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn now() -> Time {
    Time("2026-06-01T00:00:00Z".parse().unwrap())
}

/// A cluster with NVIDIA's `mig.nvidia.com` class and a KEP-5004 class serving `example.com/gpu`.
fn dra() -> DraInputs {
    let classes = ClassView {
        reaching: ["mig.nvidia.com".to_string(), "gpu.example.com".to_string()].into(),
        extended: ["example.com/gpu".to_string()].into(),
        ..Default::default()
    };
    DraInputs { classes, ..Default::default() }
}

fn plan(quotas: &[TenantGpuQuota], ns: &[&str], rqs: &[ResourceQuota]) -> crate::quota::QuotaPlan {
    plan_quotas_dra(quotas, &namespaces(ns), rqs, &Capacity::default(), &dra(), now())
}

/// What the API server enforces in `ns` after the plan is applied: per key, the least of every
/// ResourceQuota there (each one planned, and each one kept as it is).
fn effective(p: &crate::quota::QuotaPlan, rqs: &[ResourceQuota], ns: &str) -> BTreeMap<String, i64> {
    let applied: BTreeSet<&str> = p.apply.iter().filter(|a| a.namespace == ns).map(|a| a.name.as_str()).collect();
    let deleted: BTreeSet<&str> = p.delete.iter().filter(|d| d.namespace == ns).map(|d| d.name.as_str()).collect();
    let kept = rqs
        .iter()
        .filter(|rq| rq.metadata.namespace.as_deref() == Some(ns))
        .filter(|rq| !applied.contains(rq.metadata.name.as_deref().unwrap_or_default()))
        .filter(|rq| !deleted.contains(rq.metadata.name.as_deref().unwrap_or_default()))
        .map(|rq| {
            let hard = rq.spec.as_ref().and_then(|s| s.hard.clone()).unwrap_or_default();
            hard.into_iter().map(|(k, v)| (k, v.0)).collect::<BTreeMap<_, _>>()
        });
    let planned = p.apply.iter().filter(|a| a.namespace == ns).map(|a| a.hard.clone());
    let mut out: BTreeMap<String, i64> = BTreeMap::new();
    for hard in planned.chain(kept) {
        for (k, v) in hard {
            let n: i64 = v.parse().unwrap();
            out.entry(k).and_modify(|m| *m = (*m).min(n)).or_insert(n);
        }
    }
    out
}

/// Every GPU key a tenant could allocate through: both paths of every resource of the catalog,
/// the other GPU-reaching classes and their extended resources.
fn gpu_keys() -> Vec<String> {
    let mut keys = vec![
        "requests.nvidia.com/gpu".to_string(),
        "requests.nvidia.com/mig-1g.10gb".to_string(),
        "requests.nvidia.com/mig-3g.40gb".to_string(),
        "requests.nvidia.com/mig-1g.10gb.me".to_string(),
        "requests.example.com/gpu".to_string(),
    ];
    for c in ["mig.nvidia.com", "gpu.example.com", "gpu.tessera.dev", "mig-1g.10gb.tessera.dev"] {
        keys.push(devices_key(c));
    }
    keys
}

/// A namespace newly listed by an invalid quota still gets a ResourceQuota, or extended-resource
/// pods would not be limited there: every GPU key is 0 there (where the quota enforces nothing
/// yet); where it enforced a share before, that share is kept as it was.
#[test]
fn an_invalid_quota_holds_every_gpu_key_at_0_where_it_enforced_nothing_yet() {
    let bad = quota(
        "a",
        json!({"namespaces": ["x", "y", "gone"], "hard": {"nvidia.com/mig-1g.10gb": -1},
                                "allocation": "ResourceClaims"}),
    );
    let before = ours("a", "x", &[("requests.nvidia.com/mig-1g.10gb", "4")]);
    let rqs = [before];
    let p = plan(std::slice::from_ref(&bad), &["x", "y"], &rqs);
    assert!(p.delete.is_empty(), "nothing enforced is dropped: {:?}", p.delete);
    assert!(p.apply.iter().all(|a| a.namespace != "x"), "x keeps what it enforced: {:?}", p.apply);
    assert!(p.apply.iter().all(|a| a.namespace != "gone"), "no write to a namespace that does not exist");
    let y: Vec<_> = p.apply.iter().filter(|a| a.namespace == "y").collect();
    assert_eq!(y.len(), 1, "{:?}", p.apply);
    assert_eq!((y[0].quota.as_str(), y[0].name.as_str()), ("a", "tessera-a"));
    for k in gpu_keys() {
        assert_eq!(y[0].hard.get(&k).map(String::as_str), Some("0"), "{k} in {:?}", y[0].hard);
    }
    assert!(y[0].hard.values().all(|v| v == "0"), "{:?}", y[0].hard);
    assert_eq!(effective(&p, &rqs, "x")["requests.nvidia.com/mig-1g.10gb"], 4);
    let st = &p.statuses["a"];
    let stalled = find(&st.conditions, STALLED).expect("stalled");
    assert_eq!(stalled.reason, "InvalidSpec");
    assert!(stalled.message.contains("spec.hard"), "{}", stalled.message);
    assert!(stalled.message.contains("held at 0 in namespace(s) y"), "{}", stalled.message);
    assert!(find(&st.conditions, READY).unwrap().message.contains("held at 0 in namespace(s) y"));
}

/// The placeholder an invalid quota wrote is its own: kept current while the quota stays
/// invalid (still named in its status), and replaced by the share once the spec is fixed.
#[test]
fn an_invalid_quotas_zeros_are_kept_and_replaced_by_the_share_once_fixed() {
    let bad = quota("a", json!({"namespaces": ["y"], "hard": {"nvidia.com/mig-1g.10gb": -1}}));
    let first = plan(std::slice::from_ref(&bad), &["y"], &[]);
    let zeros: Vec<(String, String)> = first.apply[0].hard.clone().into_iter().collect();
    let zeros: Vec<(&str, &str)> = zeros.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let written = [ours("a", "y", &zeros)];
    let again = plan(std::slice::from_ref(&bad), &["y"], &written);
    assert!(again.delete.is_empty(), "{:?}", again.delete);
    assert_eq!(first.apply[0].in_force_since, None, "nothing written: nothing in force");
    assert_eq!(again.apply[0].hard, first.apply[0].hard, "the same 0s (the controller skips a current one)");
    assert_eq!(again.apply[0].in_force_since.as_deref(), Some("2026-05-01T00:00:00Z"), "its stamp carried");
    let stalled = find(&again.statuses["a"].conditions, STALLED).unwrap();
    assert!(stalled.message.contains("held at 0 in namespace(s) y"), "still said: {}", stalled.message);
    // A GPU-reaching class made since gets its 0 in the placeholder.
    let mut more = dra();
    more.classes.reaching.insert("new.example.com".into());
    let p =
        plan_quotas_dra(std::slice::from_ref(&bad), &namespaces(&["y"]), &written, &Capacity::default(), &more, now());
    assert_eq!(p.apply[0].hard.get(&devices_key("new.example.com")).map(String::as_str), Some("0"));
    let fixed = quota("a", json!({"namespaces": ["y"], "hard": {"nvidia.com/mig-1g.10gb": 2}}));
    let p = plan(std::slice::from_ref(&fixed), &["y"], &written);
    assert_eq!(p.apply[0].hard["requests.nvidia.com/mig-1g.10gb"], "2");
    assert!(p.delete.is_empty());
}

/// A namespace newly claimed by two quotas is not left without a ResourceQuota: each quota
/// writes its own there; the API server checks every ResourceQuota of a namespace, so
/// per key the stricter holds.
#[test]
fn a_namespace_newly_claimed_twice_gets_the_stricter_limit_per_key() {
    let a = quota("a", json!({"namespaces": ["x"], "hard": {"nvidia.com/mig-1g.10gb": 4, "nvidia.com/gpu": 1}}));
    let b = quota(
        "b",
        json!({"namespaces": ["x", "y"], "hard": {"nvidia.com/mig-1g.10gb": 2,
                              "nvidia.com/mig-3g.40gb": 6}}),
    );
    let p = plan(&[a, b], &["x", "y"], &[]);
    let e = effective(&p, &[], "x");
    assert_eq!(e["requests.nvidia.com/mig-1g.10gb"], 1, "min(4, b's 1): {e:?}");
    assert_eq!(e["requests.nvidia.com/mig-3g.40gb"], 3, "only b limits it: {e:?}");
    assert_eq!(e["requests.nvidia.com/gpu"], 1, "only a limits it: {e:?}");
    assert_eq!(e[&devices_key("mig.nvidia.com")], 0);
    for q in ["a", "b"] {
        let c = find(&p.statuses[q].conditions, CONFLICT).expect("conflict");
        assert!(c.message.contains("stricter"), "{}", c.message);
    }
}

/// Per key, what a namespace claimed by two quotas enforces is the least of the two shares (a
/// key only one lists is limited by that one), whichever quota is the typo, and whether or not
/// a quota's ResourceQuota was there before (`a`'s, enforcing 4).
#[test]
fn in_a_conflict_each_quota_enforces_its_own_share_so_no_typo_lifts_a_limit() {
    let before = ours("a", "x", &[("requests.nvidia.com/mig-1g.10gb", "4")]);
    type Row = (&'static str, serde_json::Value, serde_json::Value, &'static str, i64);
    let rows: Vec<Row> = vec![
        (
            "b raises nothing",
            json!({"nvidia.com/mig-1g.10gb": 4}),
            json!({"nvidia.com/mig-1g.10gb": 9}),
            "requests.nvidia.com/mig-1g.10gb",
            4,
        ),
        (
            "a's own cut applies",
            json!({"nvidia.com/mig-1g.10gb": 3}),
            json!({"nvidia.com/mig-1g.10gb": 9}),
            "requests.nvidia.com/mig-1g.10gb",
            3,
        ),
        (
            "b is stricter",
            json!({"nvidia.com/mig-1g.10gb": 4}),
            json!({"nvidia.com/mig-1g.10gb": 1}),
            "requests.nvidia.com/mig-1g.10gb",
            1,
        ),
        (
            "only b lists it",
            json!({"nvidia.com/mig-1g.10gb": 4}),
            json!({"nvidia.com/gpu": 2}),
            "requests.nvidia.com/gpu",
            2,
        ),
        (
            "a says Zero",
            json!({"nvidia.com/mig-1g.10gb": 4}),
            json!({"nvidia.com/gpu": 2}),
            "requests.nvidia.com/mig-3g.40gb",
            0,
        ),
    ];
    for (what, a_hard, b_hard, key, want) in rows {
        let unlisted = if what == "a says Zero" { "Zero" } else { "Unlimited" };
        let a = quota("a", json!({"namespaces": ["x"], "hard": a_hard, "unlisted": unlisted}));
        let b = quota("b", json!({"namespaces": ["x"], "hard": b_hard}));
        for rqs in [vec![], vec![before.clone()]] {
            let p = plan(&[a.clone(), b.clone()], &["x"], &rqs);
            assert!(p.delete.is_empty(), "{what}: {:?}", p.delete);
            let names: BTreeSet<&str> = p.apply.iter().map(|x| x.name.as_str()).collect();
            assert_eq!(names, ["tessera-a", "tessera-b"].into(), "{what}: each its own");
            assert_eq!(effective(&p, &rqs, "x").get(key), Some(&want), "{what} ({} before)", rqs.len());
        }
    }
}

/// An invalid quota and a valid one claim a namespace where nothing is enforced: the invalid
/// one's share cannot be computed, so its 0s hold (fail closed) until one lets go.
#[test]
fn a_namespace_claimed_by_an_invalid_and_a_valid_quota_is_held_at_0() {
    let bad = quota("a", json!({"namespaces": ["x"], "hard": {"nvidia.com/gpu": -2}}));
    let b = quota(
        "b",
        json!({"namespaces": ["x"], "hard": {"nvidia.com/mig-1g.10gb": 5},
                              "allocation": "ResourceClaims"}),
    );
    let p = plan(&[bad, b], &["x"], &[]);
    let e = effective(&p, &[], "x");
    for k in gpu_keys() {
        assert_eq!(e.get(&k), Some(&0), "{k} in {e:?}");
    }
    assert_eq!(p.policy["x.allowed"], "", "no class opens in a conflicted namespace");
}
