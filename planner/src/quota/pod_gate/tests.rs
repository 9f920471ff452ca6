use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ResourceQuota;
use serde_json::json;
use tessera_crds::TenantGpuQuota;

use super::PENDING;
use crate::quota::{Capacity, DraInputs, plan_quotas_dra, quota_label_value, resource_quota_name};

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
    let Some(s) = status else { return serde_json::from_value(rq).unwrap() };
    rq["status"] = json!({"hard": {GPU: s.to_string()}, "used": {GPU: "0"}});
    // Synced: a pass stamped it (`quota::stamp`).
    crate::quota::stamp::stamped(serde_json::from_value(rq).unwrap())
}

fn pending(q: &TenantGpuQuota, nss: &[&str], rqs: &[ResourceQuota]) -> String {
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-06-01T00:01:00Z".parse().unwrap());
    let nss: BTreeSet<String> = nss.iter().map(|s| s.to_string()).collect();
    let plan = plan_quotas_dra(std::slice::from_ref(q), &nss, rqs, &Capacity::default(), &DraInputs::default(), now);
    plan.policy.get(PENDING).cloned().unwrap_or_else(|| panic!("no {PENDING} in {:?}", plan.policy))
}

/// `team-a` lists `a` and `b`; `b` is created after the quota (or while the operator is down).
/// `b` is pending until its ResourceQuota's `status.hard` holds the planned limit: unmarked, it
/// would admit pods asking for `nvidia.com/gpu` (no ResourceQuota yet) until the controller
/// manager synced the one the operator wrote.
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

/// `hard: nvidia.com/gpu: 1000` is stored and synced as `1k`, so limits compare as quantities: a
/// plain integer parse fails on it and would keep the namespace pending forever (every GPU pod
/// refused).
#[test]
fn a_limit_in_canonical_form_is_enforced() {
    let q = quota("team-a", json!({"namespaces": ["a"], "hard": {"nvidia.com/gpu": 1000}}));
    assert_eq!(pending(&q, &["a"], &[ours_canonical("team-a", "a", "1k")]), "");
    assert_eq!(pending(&q, &["a"], &[ours_canonical("team-a", "a", "1e3")]), "");
    assert_eq!(pending(&q, &["a"], &[ours_canonical("team-a", "a", "2k")]), "a");
}

/// `hard: {}` (only physical limits) plans a ResourceQuota with no key, whose status
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
    let plan = plan_quotas_dra(&[zero, open], &nss, &[], &Capacity::default(), &DraInputs::default(), now);
    let listed: Vec<&str> = plan.policy["team-a.resources"].split(' ').collect();
    assert!(listed.contains(&"nvidia.com/gpu") && listed.contains(&"nvidia.com/mig-1g.10gb"), "{listed:?}");
    assert!(listed.iter().all(|r| crate::quota::is_gpu_resource(r)), "{listed:?}");
    assert!(!plan.policy.contains_key("team-b.resources"), "{:?}", plan.policy.keys());
}

fn plan_with(
    quotas: &[TenantGpuQuota],
    nss: &[&str],
    rqs: &[ResourceQuota],
    dra: &DraInputs,
) -> crate::quota::QuotaPlan {
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-06-01T00:00:00Z".parse().unwrap());
    let nss: BTreeSet<String> = nss.iter().map(|s| s.to_string()).collect();
    plan_quotas_dra(quotas, &nss, rqs, &Capacity::default(), dra, now)
}

/// A tenant namespace may be deleted and created again while the operator is down, so the
/// params carry each existing tenant namespace's UID (`<ns>.uid`), which both policies
/// compare with the namespace's; one that does not exist has none (it is pending anyway).
#[test]
fn each_existing_tenant_namespace_has_its_uid_in_the_params() {
    let q = quota("team-a", json!({"namespaces": ["a", "b"], "hard": {"nvidia.com/gpu": 4}}));
    let uids = [("a", "uid-a"), ("other", "uid-other")].map(|(n, u)| (n.to_string(), u.to_string()));
    let dra = DraInputs { namespace_uids: uids.into(), ..Default::default() };
    let plan = plan_with(&[q], &["a", "other"], &[ours("team-a", "a", 2, Some(2))], &dra);
    assert_eq!(plan.policy.get("a.uid").map(String::as_str), Some("uid-a"), "{:?}", plan.policy);
    assert!(!plan.policy.contains_key("b.uid") && !plan.policy.contains_key("other.uid"), "{:?}", plan.policy);
    assert_eq!(plan.policy[PENDING], "b");
}

/// A ResourceQuota of someone else's under `name` in `ns`.
fn foreign(name: &str, ns: &str) -> ResourceQuota {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns}, "spec": {"hard": {GPU: "9"}}})).unwrap()
}

/// With both ResourceQuota names taken the namespace is pending for good, so the pod policy
/// must not say "retry in a few seconds": `<ns>.pending` names the taken names and the quota.
#[test]
fn a_namespace_whose_resource_quota_names_are_taken_says_so_in_the_params() {
    let q = quota("team-a", json!({"namespaces": ["a"], "hard": {"nvidia.com/gpu": 4}}));
    let fallback = crate::quota::fallback_resource_quota_name("team-a", "uid-team-a");
    let rqs = [foreign(&resource_quota_name("team-a"), "a"), foreign(&fallback, "a")];
    let plan = plan_with(std::slice::from_ref(&q), &["a"], &rqs, &DraInputs::default());
    assert_eq!(plan.policy[PENDING], "a");
    let why = plan.policy.get("a.pending").unwrap_or_else(|| panic!("no reason in {:?}", plan.policy));
    assert!(
        why.contains(&format!("ResourceQuotas tessera-team-a and {fallback} there are not TenantGpuQuota team-a's"))
            && why.contains("see TenantGpuQuota team-a status"),
        "{why}"
    );
    let one_taken = plan_with(std::slice::from_ref(&q), &["a"], &rqs[..1], &DraInputs::default());
    assert!(!one_taken.policy.contains_key("a.pending"), "the fallback name serves: {:?}", one_taken.policy);
}

/// Two quotas claim `x`, one `unlisted: Zero`; or a Zero quota turns invalid. `<quota>.resources`
/// read through `<ns>.quota` finds nothing then (two names: no key; an invalid quota: dropped),
/// so `<ns>.limited` lists, per such namespace, the GPU resources some ResourceQuota there limits
/// (planned or kept); the pod policy admits no GPU resource it does not list.
#[test]
fn a_conflicted_or_invalid_namespace_lists_what_its_resource_quotas_limit() {
    let zero = quota("team-b", json!({"namespaces": ["x"], "hard": {"nvidia.com/gpu": 2}, "unlisted": "Zero"}));
    let open = quota("team-c", json!({"namespaces": ["x", "y"], "hard": {"nvidia.com/gpu": 2}}));
    let plan = plan_with(&[zero.clone(), open.clone()], &["x", "y"], &[], &DraInputs::default());
    let limited = plan.policy.get("x.limited").unwrap_or_else(|| panic!("no x.limited in {:?}", plan.policy));
    let limited: Vec<&str> = limited.split(' ').collect();
    assert!(limited.contains(&"nvidia.com/gpu"), "{limited:?}");
    assert!(!limited.contains(&"nvidia.com/gpu.shared"), "{limited:?}");
    assert!(!plan.policy.contains_key("y.limited"), "one Unlimited quota: {:?}", plan.policy);
    let alone = plan_with(&[open], &["x", "y"], &[], &DraInputs::default());
    assert!(!alone.policy.contains_key("x.limited"), "{:?}", alone.policy);
    // Invalid: what it kept (its synced ResourceQuota) is what is limited.
    let bad = quota("team-a", json!({"namespaces": ["a"], "hard": {"nvidia.com/gpu": -1}, "unlisted": "Zero"}));
    let plan = plan_with(&[bad], &["a"], &[ours("team-a", "a", 2, Some(2))], &DraInputs::default());
    assert_eq!(plan.policy.get("a.limited").map(String::as_str), Some("nvidia.com/gpu"), "{:?}", plan.policy);
    assert!(!plan.policy.contains_key("team-a.resources"));
}

/// A quota deleted and created again while the operator is down must not find its namespaces
/// described as enforced, so the params list the quotas the operator last saw
/// (`_quotas`, valid or not) for the policy `tessera-quota-names`; a deleted one is dropped.
#[test]
fn the_params_list_the_live_quotas() {
    let a = quota("team-a", json!({"namespaces": ["a"], "hard": {"nvidia.com/gpu": 4}}));
    let bad = quota("team-b", json!({"namespaces": ["b"], "hard": {"nvidia.com/gpu": -1}}));
    let mut gone = quota("team-c", json!({"namespaces": ["c"], "hard": {"nvidia.com/gpu": 1}}));
    gone.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-06-01T00:00:00Z".parse().unwrap()));
    let plan = plan_with(&[a, bad, gone], &["a", "b", "c"], &[], &DraInputs::default());
    assert_eq!(plan.policy.get("_quotas").map(String::as_str), Some("team-a team-b"), "{:?}", plan.policy);
    let none = plan_with(&[], &["a"], &[], &DraInputs::default());
    assert_eq!(none.policy.get("_quotas").map(String::as_str), Some(""));
}

fn namespace(name: &str, uid: &str, created: &str, terminating: bool) -> k8s_openapi::api::core::v1::Namespace {
    let mut m = json!({"name": name, "uid": uid, "creationTimestamp": created});
    if terminating {
        m["deletionTimestamp"] = json!("2026-06-01T00:00:00Z");
    }
    serde_json::from_value(json!({"metadata": m})).unwrap()
}

/// `a` starts terminating while its ResourceQuota is still cached: its old UID stays written.
/// Dropping `a.uid` (the ResourceQuota still enforcing, `a` not in `_pending`) would leave an `a`
/// re-created while the operator is down neither checked nor pending.
#[test]
fn a_terminating_namespace_keeps_its_uid_in_the_params() {
    let q = quota("team-a", json!({"namespaces": ["a"], "hard": {"nvidia.com/gpu": 4}}));
    let nss = [namespace("a", "old-uid", "2026-01-01T00:00:00Z", true)];
    let (uids, _) = super::namespace_facts(&nss);
    let dra = DraInputs { namespace_uids: uids, ..Default::default() };
    // Terminating: not an existing namespace for the plan, but its key is there.
    let plan = plan_with(&[q], &[], &[ours("team-a", "a", 2, Some(2))], &dra);
    assert_eq!(plan.policy.get("a.uid").map(String::as_str), Some("old-uid"), "{:?}", plan.policy);
}

/// `a` re-created while the ResourceQuota watch lags: the old namespace's ResourceQuota (created
/// before the new `a`) is not taken as enforcing, which would leave `a` out of `_pending` and
/// skip its write. It is dropped: `a` is pending until its own ResourceQuota syncs.
#[test]
fn a_resource_quota_older_than_its_namespace_is_not_enforced() {
    let q = quota("team-a", json!({"namespaces": ["a", "b"], "hard": {"nvidia.com/gpu": 4}}));
    let nss = [
        namespace("a", "new-uid", "2026-06-01T00:00:10Z", false),
        namespace("b", "uid-b", "2026-01-01T00:00:00Z", false),
    ];
    let (_, created) = super::namespace_facts(&nss);
    let at = |mut rq: ResourceQuota, t: &str| {
        rq.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t.parse().unwrap()));
        crate::quota::stamp::stamped(rq) // stamped again, at its creation
    };
    let stale = at(ours("team-a", "a", 2, Some(2)), "2026-06-01T00:00:09Z");
    let b = at(ours("team-a", "b", 2, Some(2)), "2026-01-01T00:00:00Z");
    let same_second = at(ours("team-a", "a", 2, Some(2)), "2026-06-01T00:00:10Z");
    let kept = super::of_current_namespaces(vec![stale.clone(), b.clone()], &created);
    assert_eq!(kept, vec![b.clone()]);
    assert_eq!(pending(&q, &["a", "b"], &kept), "a");
    assert_eq!(pending(&q, &["a", "b"], &[stale, b.clone()]), "", "the stale one read as enforced");
    let fresh = super::of_current_namespaces(vec![same_second.clone(), b], &created);
    assert_eq!(fresh.len(), 2, "written in the namespace's second: its own");
    // Unknown namespace (not cached yet): nothing to compare, kept.
    assert_eq!(super::of_current_namespaces(vec![same_second], &Default::default()).len(), 1);
}

/// `t` deleted; the Namespace watch delivers the deletion before the ResourceQuota watch. A
/// ResourceQuota of a namespace the cache does not show enforces nothing, and `t.uid` stays a
/// tombstone no new namespace matches, until a pass sees the namespace (then its real UID).
/// Otherwise a pass writing no `t.uid` and counting the cached ResourceQuota as enforcing, then
/// the operator stopping and `t` made again, admits GPU pods with no ResourceQuota.
#[test]
fn a_namespace_gone_from_the_cache_is_pending_and_keeps_a_tombstone_uid() {
    let q = quota("team-a", json!({"namespaces": ["a", "t"], "hard": {"nvidia.com/gpu": 4}}));
    let (a, t) = (ours("team-a", "a", 2, Some(2)), ours("team-a", "t", 2, Some(2)));
    let map = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    // (what, namespaces in the cache with their UIDs, params' last `<ns>.uid`, cached RQs, t.uid, _pending)
    type Row<'a> =
        (&'a str, Vec<(&'a str, &'a str)>, Vec<(&'a str, &'a str)>, Vec<ResourceQuota>, Option<&'a str>, &'a str);
    let rows: Vec<Row> = vec![
        (
            "gone, its RQ cached, uid in the params",
            vec![("a", "uid-a")],
            vec![("t", "old")],
            vec![a.clone(), t.clone()],
            Some("old"),
            "t",
        ),
        (
            "gone, its RQ cached, params of an older operator",
            vec![("a", "uid-a")],
            vec![],
            vec![a.clone(), t.clone()],
            Some("absent"),
            "t",
        ),
        (
            "gone, RQ watch caught up: the tombstone stays",
            vec![("a", "uid-a")],
            vec![("t", "old")],
            vec![a.clone()],
            Some("old"),
            "t",
        ),
        ("never seen", vec![("a", "uid-a")], vec![], vec![a.clone()], None, "t"),
        (
            "created again, seen by a pass",
            vec![("a", "uid-a"), ("t", "new")],
            vec![("t", "old")],
            vec![a.clone()],
            Some("new"),
            "t",
        ),
        (
            "terminating, still cached",
            vec![("a", "uid-a"), ("t", "old")],
            vec![("t", "old")],
            vec![a.clone(), t.clone()],
            Some("old"),
            "",
        ),
    ];
    for (what, cache, params, rqs, uid, pending) in rows {
        let dra = DraInputs { namespace_uids: map(&cache), params_uids: map(&params), ..Default::default() };
        // The plan's existing namespaces: the cached ones not terminating (`t` in the last row).
        let existing: Vec<&str> =
            cache.iter().map(|(n, _)| *n).filter(|n| !(what.starts_with("terminating") && *n == "t")).collect();
        let plan = plan_with(std::slice::from_ref(&q), &existing, &rqs, &dra);
        assert_eq!(plan.policy.get("t.uid").map(String::as_str), uid, "{what}: {:?}", plan.policy);
        assert_eq!(plan.policy[PENDING], pending, "{what}");
        assert_eq!(plan.policy.get("a.uid").map(String::as_str), Some("uid-a"), "{what}");
    }
}

/// A quota that plans nothing in `t` (invalid) does not keep `t` open on a cached ResourceQuota
/// alone: one in a namespace gone from the cache does not count.
#[test]
fn an_invalid_quota_does_not_count_a_resource_quota_of_a_namespace_gone_from_the_cache() {
    let bad = quota("team-a", json!({"namespaces": ["a", "t"], "hard": {"nvidia.com/gpu": -1}}));
    let rqs = [ours("team-a", "a", 2, Some(2)), ours("team-a", "t", 2, Some(2))];
    let dra = DraInputs { namespace_uids: [("a".to_string(), "uid-a".to_string())].into(), ..Default::default() };
    let plan = plan_with(&[bad], &["a"], &rqs, &dra);
    assert_eq!(plan.policy[PENDING], "t");
    assert_eq!(plan.policy.get("t.uid").map(String::as_str), Some("absent"));
}

/// Tessera applies only `spec.hard`; a webhook or another field manager adding `spec.scopes` or
/// `spec.scopeSelector` makes the ResourceQuota count only pods in the scope and no claim, so the
/// namespace is not enforced: such a ResourceQuota of Tessera's enforces nothing (pending,
/// classes closed) and `Ready` names it and the field.
#[test]
fn a_scoped_resource_quota_of_tesseras_does_not_enforce_and_the_status_says_so() {
    // `Zero`: every class's key planned, so a scoped ResourceQuota leaves none open.
    let q = quota(
        "team-a",
        json!({"namespaces": ["a"], "hard": {"nvidia.com/gpu": 2},
        "allocation": "ResourceClaims", "unlisted": "Zero"}),
    );
    let with = |spec: serde_json::Value| {
        let mut rq = serde_json::to_value(ours("team-a", "a", 2, Some(2))).unwrap();
        for (k, v) in spec.as_object().unwrap() {
            rq["spec"][k] = v.clone();
        }
        let mut rq: ResourceQuota = serde_json::from_value(rq).unwrap();
        // Every planned key in force: the claim keys too, so only the scope can hold it back.
        let plan = plan_with(std::slice::from_ref(&q), &["a"], &[], &DraInputs::default());
        let hard: std::collections::BTreeMap<_, _> = plan.apply[0]
            .hard
            .iter()
            .map(|(k, v)| (k.clone(), k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.clone())))
            .collect();
        rq.spec.as_mut().unwrap().hard = Some(hard.clone());
        rq.status.as_mut().unwrap().hard = Some(hard);
        rq
    };
    let selector = json!({"scopeSelector": {"matchExpressions": [{"operator": "In", "scopeName": "PriorityClass",
        "values": ["high"]}]}});
    let rows = [
        ("no scope", json!({}), None),
        ("empty scopes", json!({"scopes": []}), None),
        ("scopes", json!({"scopes": ["BestEffort"]}), Some("spec.scopes")),
        ("scopeSelector", selector, Some("spec.scopeSelector")),
    ];
    for (what, spec, field) in rows {
        let plan = plan_with(std::slice::from_ref(&q), &["a"], &[with(spec)], &DraInputs::default());
        let ready = plan.statuses["team-a"].conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        let Some(field) = field else {
            assert_eq!(plan.policy[PENDING], "", "{what}");
            assert_eq!(plan.policy["a.allowed"], "_tessera", "{what}");
            assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("True", "Enforced"), "{what}");
            continue;
        };
        assert_eq!(plan.policy[PENDING], "a", "{what}");
        assert_eq!(plan.policy["a.allowed"], "", "{what}");
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "ResourceQuotaScoped"), "{what}");
        assert_eq!(
            ready.message,
            format!(
                "namespace a: ResourceQuota tessera-team-a has {field} set (not by Tessera): it counts only pods \
                 in its scope and no ResourceClaim, so its limits are not in force; GPU pods and Tessera's classes \
                 stay refused there until {field} is removed"
            ),
            "{what}"
        );
    }
}
