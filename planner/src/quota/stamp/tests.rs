use std::collections::BTreeSet;

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::json;
use tessera_crds::TenantGpuQuota;

use super::*;
use crate::quota::{Capacity, DraInputs, QuotaPlan, plan_quotas_dra, quota_label_value, resource_quota_name};

mod keys;

const GPU_KEY: &str = "gpu.tessera.dev.deviceclass.resource.k8s.io/devices";
const GPU_REQ: &str = "requests.nvidia.com/gpu";
/// When the test ResourceQuotas are created; the controller manager's status write comes later.
const CREATED: &str = "2026-06-01T10:00:00Z";
const SYNCED: &str = "2026-06-01T10:00:02Z";
/// A stamp taken from the write at [`SYNCED`]: plus the margin ([`MARGIN_SECS`]).
const STAMPED: &str = "2026-06-01T10:00:07Z";

fn t(s: &str) -> Time {
    Time(s.parse().unwrap())
}

fn hard(pairs: &[(&str, i64)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Our ResourceQuota of `team-a` in `x`, created at [`CREATED`]: `spec.hard` = `spec`, and
/// `status.hard` = `status` where given; `writes` are its `managedFields` times.
fn rq(spec: &BTreeMap<String, String>, status: Option<&BTreeMap<String, String>>, writes: &[&str]) -> ResourceQuota {
    let fields: Vec<_> = writes.iter().map(|w| json!({"manager": "m", "operation": "Update", "time": w})).collect();
    let mut rq = json!({"metadata": {"name": resource_quota_name("team-a"), "namespace": "x",
        "creationTimestamp": CREATED, "managedFields": fields,
        "labels": {"tessera.dev/quota": quota_label_value("team-a")},
        "ownerReferences": [{"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "name": "team-a",
                             "uid": "uid-team-a", "controller": true}]},
        "spec": {"hard": spec}});
    if let Some(s) = status {
        let used: BTreeMap<&String, &str> = s.keys().map(|k| (k, "0")).collect();
        rq["status"] = json!({"hard": s, "used": used});
    }
    serde_json::from_value(rq).unwrap()
}

fn with_stamp(mut rq: ResourceQuota, stamp: &str) -> ResourceQuota {
    rq.metadata.annotations.get_or_insert_default().insert(IN_FORCE_SINCE.into(), stamp.into());
    rq
}

fn stored(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Every case of [`planned`]: carried, withheld, or new (from the writes, the clock, the stored
/// params), and the values that count as no stamp.
#[test]
fn the_planned_stamp_is_carried_withheld_or_taken_from_the_latest_write() {
    let want = hard(&[(GPU_KEY, 1), (GPU_REQ, 0)]);
    let above = hard(&[(GPU_KEY, 3), (GPU_REQ, 0)]);
    let writes = ["2026-06-01T10:00:00Z", SYNCED, "2026-06-01T10:00:01Z"];
    let synced = rq(&want, Some(&want), &writes);
    let now = t("2026-06-01T11:00:00.750Z");
    let none = BTreeMap::new();
    let upgrade = stored(&[("x.quota", "team-a"), ("x.since", CREATED)]);
    type Row<'a> = (&'a str, Option<ResourceQuota>, &'a BTreeMap<String, String>, Option<&'a str>);
    let rows: Vec<Row<'_>> = vec![
        ("not written yet", None, &none, None),
        ("written, status not synced", Some(rq(&want, None, &writes)), &none, None),
        ("status enforces more than planned (a lowering)", Some(rq(&want, Some(&above), &writes)), &none, None),
        ("a planned key not in status yet", Some(rq(&want, Some(&hard(&[(GPU_REQ, 0)])), &writes)), &none, None),
        ("in force: the latest write plus the margin", Some(synced.clone()), &none, Some(STAMPED)),
        (
            "in force, no managedFields: now plus the margin, to the second",
            Some(rq(&want, Some(&want), &[])),
            &none,
            Some("2026-06-01T11:00:05Z"),
        ),
        (
            "stamped: carried unchanged, in force or not",
            Some(with_stamp(rq(&want, Some(&above), &writes), "2026-06-01T10:00:05Z")),
            &none,
            Some("2026-06-01T10:00:05Z"),
        ),
        ("not RFC3339: stamped again", Some(with_stamp(synced.clone(), "yesterday")), &none, Some(STAMPED)),
        (
            "another offset: stamped again",
            Some(with_stamp(synced.clone(), "2026-06-01T10:00:05+00:00")),
            &none,
            Some(STAMPED),
        ),
        ("fractions: stamped again", Some(with_stamp(synced.clone(), "2026-06-01T10:00:05.5Z")), &none, Some(STAMPED)),
        (
            "before its creation: stamped again",
            Some(with_stamp(synced.clone(), "2026-06-01T09:00:00Z")),
            &none,
            Some(STAMPED),
        ),
        ("upgrade: the stored since, the old operator's creation time", Some(synced.clone()), &upgrade, Some(CREATED)),
    ];
    for (what, rq, stored, want_stamp) in rows {
        assert_eq!(planned(rq.as_ref(), &want, "team-a", stored, &now).as_deref(), want_stamp, "{what}");
    }
}

/// Upgrade: the stored `<ns>.since` is taken only where it can be this ResourceQuota's creation
/// time as the previous operator wrote it: naming this quota, readable, not before the creation.
#[test]
fn a_stored_since_is_taken_only_for_this_quota_and_not_before_the_creation() {
    let want = hard(&[(GPU_REQ, 0)]);
    let synced = rq(&want, Some(&want), &[SYNCED]);
    let now = t("2026-06-01T11:00:00Z");
    let rows = [
        ("another quota's", stored(&[("x.quota", "team-b"), ("x.since", CREATED)]), STAMPED),
        ("claimed by two", stored(&[("x.quota", "team-a team-b"), ("x.since", CREATED)]), STAMPED),
        ("no quota key", stored(&[("x.since", CREATED)]), STAMPED),
        ("an older ResourceQuota's", stored(&[("x.quota", "team-a"), ("x.since", "2026-06-01T09:59:59Z")]), STAMPED),
        ("unreadable", stored(&[("x.quota", "team-a"), ("x.since", "soon")]), STAMPED),
        ("another namespace's", stored(&[("y.quota", "team-a"), ("y.since", CREATED)]), STAMPED),
        ("a later one", stored(&[("x.quota", "team-a"), ("x.since", "2026-06-01T10:00:01Z")]), "2026-06-01T10:00:01Z"),
    ];
    for (what, params, want_stamp) in rows {
        assert_eq!(planned(Some(&synced), &want, "team-a", &params, &now).as_deref(), Some(want_stamp), "{what}");
    }
}

/// An operator clock behind the API server's: a stamp from it would come before the creation,
/// read as none and stamped again every pass. The creation time bounds it.
#[test]
fn a_stamp_is_never_before_the_creation() {
    let want = hard(&[(GPU_REQ, 0)]);
    let synced = rq(&want, Some(&want), &[]);
    let behind = t("2026-06-01T09:00:00Z");
    assert_eq!(planned(Some(&synced), &want, "team-a", &BTreeMap::new(), &behind).as_deref(), Some(CREATED));
}

/// The ResourceQuota cache keeps one `managedFields` entry, the latest time only, and drops
/// kubectl's last-applied copy.
#[test]
fn the_cache_keeps_only_the_latest_write_time() {
    let want = hard(&[(GPU_REQ, 0)]);
    let mut cached = rq(&want, Some(&want), &["2026-06-01T10:00:00Z", SYNCED, "2026-06-01T10:00:01Z"]);
    let last_applied = "kubectl.kubernetes.io/last-applied-configuration";
    cached.metadata.annotations.get_or_insert_default().insert(last_applied.into(), "{}".into());
    trim_managed_fields(&mut cached);
    let entries = cached.metadata.managed_fields.as_ref().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!((entries[0].time.as_ref(), entries[0].fields_v1.as_ref()), (Some(&t(SYNCED)), None));
    assert!(!cached.metadata.annotations.as_ref().unwrap().contains_key(last_applied));
    let mut bare = rq(&want, None, &[]);
    trim_managed_fields(&mut bare);
    assert_eq!(bare.metadata.managed_fields, None);
}

// The planner, pass by pass, for `team-a` (claims, 1 GPU) in `x`.

fn team_a() -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": "team-a", "generation": 1, "uid": "uid-team-a"},
        "spec": {"namespaces": ["x"], "hard": {"nvidia.com/gpu": 1}, "allocation": "ResourceClaims",
                 "unlisted": "Zero"}}))
    .unwrap()
}

fn claim(name: &str, created: &str) -> ResourceClaim {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "x", "creationTimestamp": created},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu.tessera.dev"}}]}}}))
    .unwrap()
}

fn pass(rqs: &[ResourceQuota], stored_params: BTreeMap<String, String>, claims: &[ResourceClaim]) -> QuotaPlan {
    let nss: BTreeSet<String> = ["x".to_string()].into();
    let dra = DraInputs { ours: crate::quota::unallocated::ours(claims), stored_params, ..Default::default() };
    plan_quotas_dra(&[team_a()], &nss, rqs, &Capacity::default(), &dra, t("2026-06-01T11:00:00Z"))
}

/// What the params say of `x`: (`x.since`, `x.allowed`, pending).
fn params(p: &QuotaPlan) -> (Option<&str>, &str, bool) {
    let pending = p.policy[crate::quota::pod_gate::PENDING].split(' ').any(|n| n == "x");
    (p.policy.get("x.since").map(String::as_str), p.policy["x.allowed"].as_str(), pending)
}

/// `<ns>.since` is not the ResourceQuota's creation: quota admission counts nothing until
/// `status.hard` syncs, and a claim made in between on an API server with stale params would be
/// admitted uncounted and, being after `since`, allocated. So
/// (a) written, not synced: no `since`, closed, pending; (b) synced: the apply stamps the latest
/// write, still closed; (c) stamped as cached: `since` is the stamp, classes open; (d) a claim made
/// between the creation and the stamp is listed as early (its allocation refused).
#[test]
fn since_is_the_stamp_and_classes_open_only_once_it_is_cached() {
    let first = pass(&[], BTreeMap::new(), &[]);
    let planned = first.apply[0].hard.clone();
    assert_eq!((first.apply[0].in_force_since.as_deref(), params(&first)), (None, (None, "", true)));

    // (a) Written, `status.hard` not synced yet.
    let written = rq(&planned, None, &[CREATED]);
    let p = pass(std::slice::from_ref(&written), BTreeMap::new(), &[]);
    assert_eq!(p.apply[0].in_force_since, None);
    assert_eq!(params(&p), (None, "", true), "no since, closed, pending");

    // (b) Synced by the controller manager at SYNCED: this pass stamps it, nothing opens yet.
    let synced = rq(&planned, Some(&planned), &[CREATED, SYNCED]);
    let p = pass(std::slice::from_ref(&synced), BTreeMap::new(), &[]);
    assert_eq!(p.apply[0].in_force_since.as_deref(), Some(STAMPED));
    assert_eq!(params(&p), (None, "", true), "still no since, closed, pending");

    // (c) The stamp as cached: since, open, not pending; the apply carries it.
    let stamped = with_stamp(synced, SYNCED);
    let p = pass(std::slice::from_ref(&stamped), BTreeMap::new(), &[]);
    assert_eq!(p.apply[0].in_force_since.as_deref(), Some(SYNCED));
    assert_eq!(params(&p), (Some(SYNCED), "_tessera", false));

    // (d) Made after the creation but before the stamp (in the window): early, listed; made after
    // the stamp: counted by quota admission, not listed.
    let claims = [claim("window", "2026-06-01T10:00:01Z"), claim("later", "2026-06-01T10:00:03Z")];
    let p = pass(std::slice::from_ref(&stamped), BTreeMap::new(), &claims);
    assert_eq!(p.policy.get("x.claims").map(String::as_str), Some("window:gpu.tessera.dev,early"));
}

/// (e) A stamp, once cached, goes with every later apply unchanged (server-side apply would drop
/// it): here a raise of `hard` not yet in force, and later writes to the object.
#[test]
fn every_later_apply_carries_the_cached_stamp_unchanged() {
    let planned = pass(&[], BTreeMap::new(), &[]).apply[0].hard.clone();
    let stamped = with_stamp(rq(&planned, Some(&planned), &[CREATED, SYNCED, "2026-06-01T10:30:00Z"]), SYNCED);
    let mut raised = team_a();
    raised.spec.hard.insert("nvidia.com/gpu".into(), 2);
    let nss: BTreeSet<String> = ["x".to_string()].into();
    let p = plan_quotas_dra(
        &[raised],
        &nss,
        &[stamped],
        &Capacity::default(),
        &DraInputs::default(),
        t("2026-06-01T11:00:00Z"),
    );
    assert_eq!(p.apply[0].hard[GPU_KEY], "2", "the raise is planned");
    assert_eq!(p.apply[0].in_force_since.as_deref(), Some(SYNCED));
}

/// (f) Upgrade: a ResourceQuota the previous operator wrote has no stamp, and the stored params
/// hold its creation as `x.since`: stamped with that, so claims it admitted then are not refused
/// at allocation now. Where the stored value cannot be its creation, the latest write is taken.
#[test]
fn an_upgraded_resource_quota_is_stamped_with_the_stored_since() {
    let planned = pass(&[], BTreeMap::new(), &[]).apply[0].hard.clone();
    let old = rq(&planned, Some(&planned), &[CREATED, SYNCED, "2026-06-01T10:30:00Z"]);
    let written_by_old = stored(&[("x.quota", "team-a"), ("x.since", CREATED)]);
    let p = pass(std::slice::from_ref(&old), written_by_old, &[]);
    assert_eq!(p.apply[0].in_force_since.as_deref(), Some(CREATED));
    assert_eq!(params(&p), (None, "", true), "closed for the one pass until the stamp is cached");
    let other = stored(&[("x.quota", "team-b"), ("x.since", CREATED)]);
    let p = pass(std::slice::from_ref(&old), other, &[]);
    assert_eq!(p.apply[0].in_force_since.as_deref(), Some("2026-06-01T10:30:05Z"), "the latest write plus the margin");
}

/// A scoped ResourceQuota of Tessera's (a scope added by someone else) enforces nothing, so
/// while scoped no stamp is planned (the apply removes both); once unscoped it is stamped anew,
/// at a write after the scope went. Stamps carried through the scope would leave claims and
/// pods made while it was scoped not early once it went.
#[test]
fn a_scoped_resource_quota_carries_no_stamp_and_is_stamped_anew_once_unscoped() {
    let want = hard(&[(GPU_KEY, 1), (GPU_REQ, 0)]);
    let unscoped_at = "2026-06-01T10:40:00Z";
    let mut scoped = with_stamp(rq(&want, Some(&want), &[CREATED, SYNCED]), SYNCED);
    let record = format!("{GPU_KEY}={SYNCED} {GPU_REQ}={SYNCED}");
    scoped.metadata.annotations.get_or_insert_default().insert(super::keys::IN_FORCE_KEYS.into(), record);
    let now = t("2026-06-01T11:00:00Z");
    let none = BTreeMap::new();
    assert_eq!(planned_both(Some(&scoped), &want, "team-a", &none, &now).0.as_deref(), Some(SYNCED));
    for field in ["scopes", "scopeSelector"] {
        let mut s = scoped.clone();
        let spec = s.spec.get_or_insert_default();
        if field == "scopes" {
            spec.scopes = Some(vec!["BestEffort".into()]);
        } else {
            spec.scope_selector = Some(Default::default());
        }
        assert_eq!(planned_both(Some(&s), &want, "team-a", &none, &now), (None, None), "{field}");
    }
    // The scope gone (the apply removed both stamps): stamped anew at the latest write.
    let unscoped = rq(&want, Some(&want), &[CREATED, SYNCED, unscoped_at]);
    let (since, keys) = planned_both(Some(&unscoped), &want, "team-a", &none, &now);
    let anew = "2026-06-01T10:40:05Z"; // plus the margin
    assert_eq!(since.as_deref(), Some(anew));
    assert_eq!(keys, Some(format!("{GPU_KEY}={anew} {GPU_REQ}={anew}")));
}

/// An API server whose ResourceQuota informer lags the status sync admits a claim
/// made a moment after it uncounted. The stamp is the latest write plus [`MARGIN_SECS`], and
/// nothing it gates opens (`since`, the classes, `_pending`) before the operator's clock reaches it.
#[test]
fn a_stamp_gates_nothing_open_before_the_operators_clock_reaches_it() {
    let planned = pass(&[], BTreeMap::new(), &[]).apply[0].hard.clone();
    let synced = rq(&planned, Some(&planned), &[CREATED, SYNCED]);
    assert_eq!(
        pass(std::slice::from_ref(&synced), BTreeMap::new(), &[]).apply[0].in_force_since.as_deref(),
        Some(STAMPED)
    );
    let stamped = with_stamp(synced, STAMPED);
    let nss: BTreeSet<String> = ["x".to_string()].into();
    let at = |now: &str| {
        let p = plan_quotas_dra(
            &[team_a()],
            &nss,
            std::slice::from_ref(&stamped),
            &Capacity::default(),
            &DraInputs::default(),
            t(now),
        );
        assert_eq!(p.apply[0].in_force_since.as_deref(), Some(STAMPED), "carried at {now}");
        let (since, allowed, pending) = params(&p);
        (since.map(str::to_string), allowed.to_string(), pending)
    };
    assert_eq!(at("2026-06-01T10:00:06Z"), (None, String::new(), true), "before the stamp: closed, pending");
    assert_eq!(at("2026-06-01T10:00:06.999Z"), (None, String::new(), true), "still before it");
    // Within the stamp's own second a claim made now would read as early (creation times count
    // to the second, `<=`): still closed; open from the next second.
    assert_eq!(at(STAMPED), (None, String::new(), true), "at the stamp: closed");
    assert_eq!(at("2026-06-01T10:00:07.999Z"), (None, String::new(), true), "within its second: closed");
    let open = (Some(STAMPED.to_string()), "_tessera".to_string(), false);
    assert_eq!(at("2026-06-01T10:00:08Z"), open, "the second after it: open");
    assert_eq!(at("2026-06-01T10:00:30Z"), open, "after it");
}
