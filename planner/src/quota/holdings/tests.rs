use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::api::resource::v1::DeviceClass;
use proptest::prelude::*;
use serde_json::json;
use tessera_crds::TenantGpuQuota;

use super::*;
use crate::quota::claims::{ClassView, managed_class};
use crate::quota::{
    Capacity, DraInputs, QuotaPlan, fallback_resource_quota_name, plan_quotas_dra, quota_label_value,
    resource_quota_name,
};

const MIG: &str = "nvidia.com/mig-1g.10gb";
const KEY: &str = "mig-1g.10gb.tessera.dev.deviceclass.resource.k8s.io/devices";
const REQ: &str = "requests.nvidia.com/mig-1g.10gb";

fn part(share: i64, used: Option<i64>) -> Part {
    Part { share, used }
}

/// The invariant: whatever each namespace holds (`used`: the truth, also for parts whose usage
/// the pass did not know), no admission takes the tenant past `hard` (the sum of the shares):
/// the sum of max(used, limit) is at most max(hard, sum of `held`) (`held`: `used`, or for a
/// namespace left as it was what its old limit lets it reach).
fn within_hard(parts: &[Part], limits: &[(i64, Cut)], used: &[i64], held: &[i64]) -> bool {
    let hard: i64 = parts.iter().map(|p| p.share).sum();
    let reach: i64 = used.iter().zip(limits).map(|(u, (l, _))| (*u).max(*l)).sum();
    reach <= hard.max(held.iter().sum())
}

#[test]
fn an_overshoot_comes_off_the_last_listed_namespaces_headroom_first() {
    type Row<'a> = (&'a [Part], &'a [(i64, Cut)]);
    let table: &[Row<'_>] = &[
        // Nothing held above a share: the shares.
        (&[part(2, Some(1)), part(2, Some(0))], &[(2, Cut::None), (2, Cut::None)]),
        // `a` held 3 of a former share of 4, `b` just got half: b waits for what a holds above 2.
        (&[part(2, Some(3)), part(2, Some(0))], &[(2, Cut::None), (1, Cut::Overshoot(1))]),
        // The last listed first, then the one before it.
        (
            &[part(1, Some(0)), part(1, Some(3)), part(1, Some(0)), part(1, Some(0))],
            &[(1, Cut::None), (1, Cut::None), (0, Cut::Overshoot(2)), (0, Cut::Overshoot(2))],
        ),
        (
            &[part(2, Some(0)), part(0, Some(3)), part(2, Some(1))],
            &[(0, Cut::Overshoot(3)), (0, Cut::None), (1, Cut::Overshoot(3))],
        ),
        // More above the shares than all headroom (hard lowered): everyone at its usage.
        (&[part(1, Some(5)), part(2, Some(1))], &[(1, Cut::None), (1, Cut::Overshoot(4))]),
        // One namespace's usage unknown: nothing new anywhere, the unknown one at 0.
        (&[part(2, Some(1)), part(2, None)], &[(1, Cut::HeldAtUsage), (0, Cut::Unknown)]),
        (&[part(2, Some(3)), part(2, None)], &[(2, Cut::None), (0, Cut::Unknown)]),
        // None known (the quota's first pass): the shares.
        (&[part(2, None), part(2, None)], &[(2, Cut::None), (2, Cut::None)]),
        // One namespace alone keeps its share whatever it holds.
        (&[part(3, Some(7))], &[(3, Cut::None)]),
    ];
    for (parts, want) in table {
        assert_eq!(spread(parts), want.to_vec(), "{parts:?}");
    }
}

proptest! {
    /// Whatever the shares and usages, known or not, the limits never let the tenant be admitted
    /// past `hard`; the one exception is the first pass (no usage known at all) over namespaces
    /// that already hold more than their shares (see `spread`). And a limit is never above its
    /// share.
    ///
    /// A namespace left as it was (`kept`: an old limit this pass cannot lower, see
    /// [`Kept`]) enters as a part holding what that limit lets it reach ([`kept_reach`]): its
    /// real limit replaces the one computed, and it counts as held.
    #[test]
    fn no_admission_takes_the_tenant_past_hard(
        rows in prop::collection::vec((0i64..8, 0i64..12, any::<bool>(), prop::option::of(0i64..12)), 1..6),
    ) {
        let held: Vec<i64> = rows.iter().map(|(_, u, _, kept)| (*u).max(kept.unwrap_or(0))).collect();
        let parts: Vec<Part> =
            rows.iter().zip(&held).map(|((s, _, known, _), h)| part(*s, known.then_some(*h))).collect();
        let used: Vec<i64> = rows.iter().map(|(_, u, _, _)| *u).collect();
        let limits = spread(&parts);
        prop_assert_eq!(limits.len(), parts.len());
        for (p, (l, _)) in parts.iter().zip(&limits) {
            prop_assert!(*l >= 0 && *l <= p.share, "{:?} -> {:?}", parts, limits);
        }
        let real: Vec<(i64, Cut)> =
            rows.iter().zip(&limits).map(|((_, _, _, kept), l)| kept.map_or(*l, |k| (k, Cut::None))).collect();
        let first_pass_over = parts.iter().all(|p| p.used.is_none()) && rows.iter().zip(&held).any(|(r, h)| *h > r.0);
        if !first_pass_over {
            prop_assert!(within_hard(&parts, &real, &used, &held), "{:?} used {:?} -> {:?}", rows, used, real);
        }
    }
}

pub(in crate::quota) fn quota(name: &str, spec: serde_json::Value) -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": name, "generation": 1, "uid": format!("uid-{name}")}, "spec": spec}))
    .unwrap()
}

/// Our ResourceQuota of `q` in `ns`, synced: `hard` in spec and status, `used` per key.
pub(in crate::quota) fn synced(q: &str, ns: &str, hard: &[(&str, i64)], used: &[(&str, i64)]) -> ResourceQuota {
    let m = |p: &[(&str, i64)]| {
        p.iter().map(|(k, v)| (k.to_string(), json!(v.to_string()))).collect::<serde_json::Map<_, _>>()
    };
    let rq = serde_json::from_value(json!({"metadata": {"name": resource_quota_name(q), "namespace": ns,
        "labels": {"tessera.dev/quota": quota_label_value(q)},
        "ownerReferences": [{"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "name": q,
                             "uid": format!("uid-{q}"), "controller": true}]},
        "spec": {"hard": m(hard)}, "status": {"hard": m(hard), "used": m(used)}}))
    .unwrap();
    crate::quota::stamp::stamped(rq) // synced: a pass stamped it
}

fn class(name: &str, expr: &str) -> DeviceClass {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expr}}]}}))
        .unwrap()
}

fn plan(quotas: &[TenantGpuQuota], nss: &[&str], rqs: &[ResourceQuota], held: Held) -> QuotaPlan {
    let drivers = GpuDrivers::default();
    let ours = managed_class(MIG, &drivers).unwrap();
    let classes = [class("mig.nvidia.com", "device.driver == 'gpu.nvidia.com'"), class(&ours.name, &ours.expression)];
    let dra = DraInputs { classes: ClassView::of(&classes, &drivers), drivers, held, ..Default::default() };
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-06-01T00:00:00Z".parse().unwrap());
    let nss: BTreeSet<String> = nss.iter().map(|s| s.to_string()).collect();
    plan_quotas_dra(quotas, &nss, rqs, &Capacity::default(), &dra, now)
}

fn limit(p: &QuotaPlan, ns: &str, key: &str) -> String {
    let a = p.apply.iter().find(|a| a.namespace == ns).unwrap_or_else(|| panic!("no ResourceQuota in {ns}"));
    a.hard.get(key).cloned().unwrap_or_else(|| panic!("no {key} in {:?}", a.hard))
}

fn ready_message(p: &QuotaPlan, q: &str) -> String {
    p.statuses[q].conditions.iter().find(|c| c.type_ == "Ready").unwrap().message.clone()
}

/// `team-a` had 4 in `a` alone and holds 3 there; `b` joins an `Even` split (2 each). `b` gets 0
/// until its ResourceQuota's status shows its usage (a new namespace may hold anything), then 2
/// less what `a` holds above its share, then all of it once `a` frees it: given 2 at once, the
/// tenant could hold 5 of 4 (an admitted claim is reused by later pods).
#[test]
fn a_share_moved_to_a_new_namespace_waits_for_what_the_old_one_holds_above_its_new_share() {
    for (mode, active, other) in [("ResourceClaims", KEY, REQ), ("ExtendedResources", REQ, KEY)] {
        let q = quota("team-a", json!({"namespaces": ["a", "b"], "hard": {MIG: 4}, "allocation": mode}));
        let a = |used: i64| synced("team-a", "a", &[(active, 4), (other, 0)], &[(active, used), (other, 0)]);
        let b = |used: i64| synced("team-a", "b", &[(active, 2), (other, 0)], &[(active, used), (other, 0)]);

        let joined = plan(std::slice::from_ref(&q), &["a", "b"], &[a(3)], Held::new());
        assert_eq!((limit(&joined, "a", active), limit(&joined, "b", active)), ("2".into(), "0".into()), "{mode}");
        let msg = ready_message(&joined, "team-a");
        assert!(
            msg.contains("namespace b: nvidia.com/mig-1g.10gb: share 2 held at 0 until its ResourceQuota"),
            "{msg}"
        );

        let synced_b = plan(std::slice::from_ref(&q), &["a", "b"], &[a(3), b(0)], Held::new());
        assert_eq!((limit(&synced_b, "a", active), limit(&synced_b, "b", active)), ("2".into(), "1".into()), "{mode}");
        let msg = ready_message(&synced_b, "team-a");
        assert!(
            msg.contains("share 2 cut to 1 while the tenant's other namespaces hold 1 above their shares"),
            "{msg}"
        );

        let freed = plan(std::slice::from_ref(&q), &["a", "b"], &[a(2), b(1)], Held::new());
        assert_eq!((limit(&freed, "a", active), limit(&freed, "b", active)), ("2".into(), "2".into()), "{mode}");
    }
}

/// `hard` lowered from 6 to 2 (1 each) while `a` holds 3: nothing new in `b` (1 there would let
/// the tenant reach 4); `namespaceHard` moved from `a` to `b` while `a` still holds it:
/// `b` waits.
#[test]
fn a_lowered_hard_or_edited_namespace_hard_admits_nothing_past_it() {
    let lowered = quota("team-a", json!({"namespaces": ["a", "b"], "hard": {MIG: 2}, "allocation": "ResourceClaims"}));
    let rqs = [
        synced("team-a", "a", &[(KEY, 3), (REQ, 0)], &[(KEY, 3), (REQ, 0)]),
        synced("team-a", "b", &[(KEY, 3), (REQ, 0)], &[(KEY, 0), (REQ, 0)]),
    ];
    let p = plan(&[lowered], &["a", "b"], &rqs, Held::new());
    assert_eq!((limit(&p, "a", KEY), limit(&p, "b", KEY)), ("1".into(), "0".into()));

    let moved = quota(
        "team-a",
        json!({"namespaces": ["a", "b"], "hard": {MIG: 3}, "allocation": "ResourceClaims", "split": "Explicit",
               "namespaceHard": {"a": {MIG: 1}, "b": {MIG: 2}}}),
    );
    let rqs = [
        synced("team-a", "a", &[(KEY, 3), (REQ, 0)], &[(KEY, 3), (REQ, 0)]),
        synced("team-a", "b", &[(KEY, 0), (REQ, 0)], &[(KEY, 0), (REQ, 0)]),
    ];
    let p = plan(&[moved], &["a", "b"], &rqs, Held::new());
    assert_eq!((limit(&p, "a", KEY), limit(&p, "b", KEY)), ("1".into(), "0".into()));
}

/// In `b` both ResourceQuota names are taken by objects not the quota's, so this pass applies
/// nothing there; the quota's earlier ResourceQuota (written under another name, e.g. by an older
/// operator) stays in force, letting `b` reach 4 of an `Even` share of 2. What it lets `b` hold
/// (its usage or its limit, whichever is more) comes off `a`'s headroom, and `a` waits while that
/// is unknown: `a` given its full 2, the tenant could reach 6 of 4.
#[test]
fn a_namespace_left_as_it_was_counts_what_its_old_resource_quota_lets_it_hold() {
    let q = quota("team-a", json!({"namespaces": ["a", "b"], "hard": {MIG: 4}, "allocation": "ResourceClaims"}));
    let foreign = |name: String| -> ResourceQuota {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "b"}, "spec": {"hard": {"pods": "9"}}}))
            .unwrap()
    };
    let old = |limit: i64, used: i64, status: bool| {
        let mut rq = synced("team-a", "b", &[(KEY, limit), (REQ, 0)], &[(KEY, used), (REQ, 0)]);
        rq.metadata.name = Some("tessera-team-a-v0".into());
        if !status {
            rq.status = None;
        }
        rq
    };
    let a = synced("team-a", "a", &[(KEY, 2), (REQ, 0)], &[(KEY, 0), (REQ, 0)]);
    let taken = [foreign(resource_quota_name("team-a")), foreign(fallback_resource_quota_name("team-a", "uid-team-a"))];
    let run = |kept: Option<ResourceQuota>| {
        let rqs: Vec<ResourceQuota> = [a.clone()].into_iter().chain(taken.clone()).chain(kept).collect();
        let p = plan(std::slice::from_ref(&q), &["a", "b"], &rqs, Held::new());
        assert!(p.apply.iter().all(|x| x.namespace == "a"), "nothing applied in b: {:?}", p.apply);
        limit(&p, "a", KEY)
    };
    assert_eq!(run(Some(old(4, 3, true))), "0", "b may reach 4: 2 above its share");
    assert_eq!(run(Some(old(3, 1, true))), "1", "b may reach 3");
    assert_eq!(run(Some(old(1, 3, true))), "1", "b holds 3 over a limit of 1");
    assert_eq!(run(Some(old(2, 0, true))), "2", "within its share");
    assert_eq!(run(Some(old(4, 3, false))), "0", "unknown usage: a held at its usage");
    // No ResourceQuota of the quota in `b`: what `b` holds is unknown, not nothing, so `a` is
    // held at its usage rather than given its full share.
    assert_eq!(run(None), "0", "no ResourceQuota of the quota in b: its holdings are unknown");
}

/// [`kept_reach`] per key: usage or limit, whichever is more, under the strictest ResourceQuota;
/// a key none limits (or no status) is unknown, never 0.
#[test]
fn what_a_kept_namespace_may_hold_is_read_from_its_strictest_resource_quota() {
    let keys = [KEY.to_string(), REQ.to_string()];
    let loose = synced("team-a", "b", &[(KEY, 4), (REQ, 1)], &[(KEY, 1), (REQ, 0)]);
    let strict = synced("team-a", "b", &[(KEY, 2), (REQ, 0)], &[(KEY, 1), (REQ, 0)]);
    assert_eq!(kept_reach(&[&loose], &keys), Some(5));
    assert_eq!(kept_reach(&[&loose, &strict], &keys), Some(2));
    let unlimited = synced("team-a", "b", &[(KEY, 4)], &[(KEY, 1)]);
    assert_eq!(kept_reach(&[&unlimited], &keys), None, "requests key unlimited");
    let mut unsynced = loose.clone();
    unsynced.status = None;
    assert_eq!(kept_reach(&[&unsynced], &keys), None, "no status");
    assert_eq!(kept_reach(&[], &keys), None);
}

fn held(pairs: &[(&str, Option<&str>, i64)]) -> Held {
    let mut h = Held::new();
    for (ns, res, n) in pairs {
        h.entry(ns.to_string()).or_default().insert(res.map(str::to_string), *n);
    }
    h
}

/// A namespace joins holding 2 MIG devices through `mig.nvidia.com` (claimed before it was a
/// tenant's; its key is 0 now, but allocated claims stay). They count in both: the share of
/// Tessera's class is less what they hold, status counts them, and a device whose profile is
/// unknown counts against every resource of the share.
#[test]
fn devices_held_through_other_gpu_classes_count_against_the_share_and_in_status() {
    let q = quota(
        "team-a",
        json!({"namespaces": ["a"], "hard": {MIG: 3, "nvidia.com/gpu": 1},
        "allocation": "ResourceClaims"}),
    );
    let gpu_key = "gpu.tessera.dev.deviceclass.resource.k8s.io/devices";
    let rq = synced(
        "team-a",
        "a",
        &[(KEY, 3), (REQ, 0), (gpu_key, 1), ("requests.nvidia.com/gpu", 0)],
        &[(KEY, 0), (REQ, 0), (gpu_key, 0), ("requests.nvidia.com/gpu", 0)],
    );
    let rqs = std::slice::from_ref(&rq);
    let before = plan(std::slice::from_ref(&q), &["a"], rqs, held(&[("a", Some(MIG), 2), ("x", Some(MIG), 5)]));
    assert_eq!((limit(&before, "a", KEY), limit(&before, "a", gpu_key)), ("1".into(), "1".into()));
    let st = &before.statuses["team-a"];
    assert_eq!(st.namespaces[0].used.get(MIG), Some(&2), "{:?}", st.namespaces);
    assert_eq!(st.resources.iter().find(|r| r.name == MIG).map(|r| r.used), Some(2));
    assert!(
        ready_message(&before, "team-a")
            .contains("2 device(s) allocated (or claimed, not yet allocated) through GPU classes")
    );

    let unknown = plan(std::slice::from_ref(&q), &["a"], rqs, held(&[("a", None, 1)]));
    assert_eq!((limit(&unknown, "a", KEY), limit(&unknown, "a", gpu_key)), ("2".into(), "0".into()));
    let none = plan(&[q], &["a"], rqs, Held::new());
    assert_eq!((limit(&none, "a", KEY), limit(&none, "a", gpu_key)), ("3".into(), "1".into()));
}

fn claim(ns: &str, requests: serde_json::Value, results: serde_json::Value) -> ResourceClaim {
    serde_json::from_value(json!({"metadata": {"name": "c", "namespace": ns},
        "spec": {"devices": {"requests": requests}},
        "status": {"allocation": {"devices": {"results": results}}}}))
    .unwrap()
}

fn slice() -> ResourceSlice {
    serde_json::from_value(json!({"metadata": {"name": "s"}, "spec": {"driver": "gpu.nvidia.com", "nodeName": "n1",
        "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
        "devices": [
            {"name": "gpu-0-mig-19-0-1", "attributes": {"type": {"string": "mig"}, "profile": {"string": "1g.10gb"}}},
            {"name": "gpu-1", "attributes": {"type": {"string": "gpu"}}}]}}))
    .unwrap()
}

#[test]
fn devices_allocated_through_classes_other_than_ours_are_counted_by_what_they_are() {
    let result =
        |req: &str, dev: &str| json!({"request": req, "driver": "gpu.nvidia.com", "pool": "n1", "device": dev});
    let claims = [
        claim(
            "a",
            json!([{"name": "r", "exactly": {"deviceClassName": "mig.nvidia.com"}},
                   {"name": "f", "firstAvailable": [{"name": "x", "deviceClassName": "mig-1g.10gb.tessera.dev"},
                                                    {"name": "y", "deviceClassName": "gpu.nvidia.com"}]}]),
            json!([result("r", "gpu-0-mig-19-0-1"), result("f/y", "gpu-1"), result("r", "gpu-9-mig-19-0-1")]),
        ),
        // Through our class (the ResourceQuota counts it), admin access, another driver: not held.
        claim(
            "a",
            json!([{"name": "r", "exactly": {"deviceClassName": "mig-1g.10gb.tessera.dev"}},
                   {"name": "m", "exactly": {"deviceClassName": "mig.nvidia.com"}}]),
            json!([result("r", "gpu-0-mig-19-0-1"),
                   {"request": "m", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-1", "adminAccess": true},
                   {"request": "m", "driver": "fpga.example.com", "pool": "n1", "device": "f0"}]),
        ),
        // A class that cannot be read (no such request): counted.
        claim("b", json!([]), json!([result("gone", "gpu-0-mig-19-0-1")])),
    ];
    let h = held_elsewhere(&claims, &[slice()], &GpuDrivers::default());
    assert_eq!(h, held(&[("a", Some(MIG), 1), ("a", Some("nvidia.com/gpu"), 1), ("a", None, 1), ("b", Some(MIG), 1)]));
}

/// Right after a switch of `allocation` the old path's key is still enforced above 0 in `a`
/// (`status.hard` not synced yet): it may still grow there, so `a`'s usage is not known yet and
/// nothing new is admitted in `b` either (before this, `b` got its whole share).
#[test]
fn a_namespace_whose_old_path_is_still_enforced_counts_as_unknown() {
    let q = quota("team-a", json!({"namespaces": ["a", "b"], "hard": {MIG: 4}, "allocation": "ResourceClaims"}));
    let rqs = [
        synced("team-a", "a", &[(KEY, 0), (REQ, 2)], &[(KEY, 0), (REQ, 1)]),
        synced("team-a", "b", &[(KEY, 2), (REQ, 0)], &[(KEY, 1), (REQ, 0)]),
    ];
    let p = plan(&[q], &["a", "b"], &rqs, Held::new());
    assert_eq!((limit(&p, "a", KEY), limit(&p, "b", KEY)), ("0".into(), "1".into()));
}
