//! Per-key stamps ([`keys`]) pass by pass: a resource that was unlimited (`unlisted: Unlimited`)
//! and is then listed counts claims and pods only from its own stamp on.

use std::collections::BTreeSet;

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::json;
use tessera_crds::TenantGpuQuota;

use super::super::keys::{IN_FORCE_KEYS, Record, record};
use super::super::*;
use crate::quota::early_pods::PendingPod;
use crate::quota::{Capacity, DraInputs, QuotaPlan, plan_quotas_dra, quota_label_value, resource_quota_name};

const CREATED: &str = "2026-06-01T10:00:00Z";
const SYNCED: &str = "2026-06-01T10:00:02Z";
/// When the admin's added `nvidia.com/gpu` key was synced into `status.hard`.
const ADDED: &str = "2026-06-01T10:45:00Z";
/// The key's stamp taken from the write at [`ADDED`]: plus the margin ([`MARGIN_SECS`]).
const ADDED_STAMP: &str = "2026-06-01T10:45:05Z";
const MIG_DEV: &str = "mig-1g.10gb.tessera.dev.deviceclass.resource.k8s.io/devices";
const MIG_REQ: &str = "requests.nvidia.com/mig-1g.10gb";
const GPU_DEV: &str = "gpu.tessera.dev.deviceclass.resource.k8s.io/devices";
const GPU_REQ: &str = "requests.nvidia.com/gpu";

/// `team-a` in `x`: `unlisted: Unlimited`, `hard` = 2 `mig-1g.10gb` and `gpus` whole GPUs where given.
fn team_a(allocation: &str, gpus: Option<i64>) -> TenantGpuQuota {
    let mut hard = json!({"nvidia.com/mig-1g.10gb": 2});
    if let Some(g) = gpus {
        hard["nvidia.com/gpu"] = json!(g);
    }
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": "team-a", "generation": 1, "uid": "uid-team-a"},
        "spec": {"namespaces": ["x"], "hard": hard, "allocation": allocation, "unlisted": "Unlimited"}}))
    .unwrap()
}

/// Our ResourceQuota in `x` enforcing `hard` (spec and status), written at `writes`, with
/// `annotations`.
fn rq(hard: &BTreeMap<String, String>, writes: &[&str], annotations: &[(&str, &str)]) -> ResourceQuota {
    let fields: Vec<_> = writes.iter().map(|w| json!({"manager": "m", "operation": "Update", "time": w})).collect();
    let used: BTreeMap<&String, &str> = hard.keys().map(|k| (k, "0")).collect();
    let annotations: BTreeMap<&str, &str> = annotations.iter().copied().collect();
    serde_json::from_value(json!({"metadata": {"name": resource_quota_name("team-a"), "namespace": "x",
        "creationTimestamp": CREATED, "managedFields": fields, "annotations": annotations,
        "labels": {"tessera.dev/quota": quota_label_value("team-a")},
        "ownerReferences": [{"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "name": "team-a",
                             "uid": "uid-team-a", "controller": true}]},
        "spec": {"hard": hard}, "status": {"hard": hard, "used": used}}))
    .unwrap()
}

fn claim(name: &str, class: &str, created: &str) -> ResourceClaim {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "x", "creationTimestamp": created},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": class, "allocationMode": "All"}}]}}}))
    .unwrap()
}

fn pass(q: TenantGpuQuota, rqs: &[ResourceQuota], claims: &[ResourceClaim], pods: Vec<PendingPod>) -> QuotaPlan {
    let nss: BTreeSet<String> = ["x".to_string()].into();
    let dra = DraInputs { ours: crate::quota::unallocated::ours(claims), pods, ..Default::default() };
    plan_quotas_dra(&[q], &nss, rqs, &Capacity::default(), &dra, Time("2026-06-01T11:00:00Z".parse().unwrap()))
}

/// The record as written: pairs sorted by key.
fn record_of(pairs: &[(&str, &str)]) -> String {
    let sorted: BTreeMap<&str, &str> = pairs.iter().copied().collect();
    sorted.iter().map(|(k, t)| format!("{k}={t}")).collect::<Vec<_>>().join(" ")
}

/// Whether `x.allowed` opens `class` (`_tessera`: all of Tessera's).
fn opens(p: &QuotaPlan, class: &str) -> bool {
    let allowed = match p.policy["x.allowed"].as_str() {
        "_tessera" => &p.policy["_tessera"],
        some => some,
    };
    allowed.split(' ').any(|c| c == class)
}

/// 10 claims of `gpu.tessera.dev` (`allocationMode: All`) made while nothing limited
/// `nvidia.com/gpu` must not escape once the admin lists it, though `<ns>.since` does not move:
/// the key's own stamp (the pass that first sees it in force) gives `x.since.gpu.tessera.dev`;
/// the class opens only once that stamp is cached, and the claims made before it are listed early.
#[test]
fn a_claim_made_while_its_resource_was_unlimited_is_early_once_the_key_is_in_force() {
    let claims_quota = |g| team_a("ResourceClaims", g);
    let first = pass(claims_quota(None), &[], &[], vec![]).apply[0].hard.clone();
    let mig = record_of(&[(MIG_DEV, SYNCED), (MIG_REQ, SYNCED)]);
    let limited = rq(&first, &[CREATED, SYNCED], &[(IN_FORCE_SINCE, SYNCED), (IN_FORCE_KEYS, &mig)]);
    assert_eq!(
        pass(claims_quota(None), std::slice::from_ref(&limited), &[], vec![]).apply[0].in_force_keys,
        Some(mig.clone())
    );

    // The admin lists nvidia.com/gpu: planned, then in force (synced at ADDED), stamped this pass.
    let added = pass(claims_quota(Some(1)), std::slice::from_ref(&limited), &[], vec![]).apply[0].hard.clone();
    assert!(added.contains_key(GPU_DEV), "{added:?}");
    let synced = rq(&added, &[CREATED, SYNCED, ADDED], &[(IN_FORCE_SINCE, SYNCED), (IN_FORCE_KEYS, &mig)]);
    let p = pass(claims_quota(Some(1)), std::slice::from_ref(&synced), &[], vec![]);
    let both = record_of(&[(GPU_DEV, ADDED_STAMP), (GPU_REQ, ADDED_STAMP), (MIG_DEV, SYNCED), (MIG_REQ, SYNCED)]);
    assert_eq!(p.apply[0].in_force_keys, Some(both.clone()));
    assert_eq!(p.apply[0].in_force_since.as_deref(), Some(SYNCED), "the single stamp does not move");
    assert!(!opens(&p, "gpu.tessera.dev") && opens(&p, "mig-1g.10gb.tessera.dev"), "{:?}", p.policy);

    // Its stamp cached: the class opens, with its own since; the claim made while it was
    // unlimited is early, one made after is not, nor one of the class limited all along.
    let cached = rq(&added, &[CREATED, SYNCED, ADDED], &[(IN_FORCE_SINCE, SYNCED), (IN_FORCE_KEYS, &both)]);
    let claims = [
        claim("unlimited-then", "gpu.tessera.dev", "2026-06-01T10:30:00Z"),
        claim("after", "gpu.tessera.dev", "2026-06-01T10:45:06Z"),
        claim("mig", "mig-1g.10gb.tessera.dev", "2026-06-01T10:30:00Z"),
    ];
    let p = pass(claims_quota(Some(1)), std::slice::from_ref(&cached), &claims, vec![]);
    assert!(opens(&p, "gpu.tessera.dev"), "{:?}", p.policy);
    assert_eq!(p.policy.get("x.since").map(String::as_str), Some(SYNCED));
    assert_eq!(p.policy.get("x.since.gpu.tessera.dev").map(String::as_str), Some(ADDED_STAMP));
    assert_eq!(p.policy.get("x.since.mig-1g.10gb.tessera.dev"), None, "not later than x.since: no key");
    assert_eq!(p.policy.get("x.claims").map(String::as_str), Some("unlimited-then:gpu.tessera.dev,early"));
}

/// The same for gated pods asking for `nvidia.com/gpu` made while it was unlimited: listed in
/// `x.pods` once `requests.nvidia.com/gpu` is stamped later than `x.since` (the binding refused).
#[test]
fn a_pod_made_while_its_resource_was_unlimited_is_early_once_the_key_is_in_force() {
    let q = |g| team_a("ExtendedResources", g);
    let added = pass(q(Some(1)), &[], &[], vec![]).apply[0].hard.clone();
    let mut before = added.clone();
    before.retain(|k, _| !k.contains("gpu"));
    let mig = pass(q(None), &[rq(&before, &[CREATED, SYNCED], &[(IN_FORCE_SINCE, SYNCED)])], &[], vec![]);
    let mig = mig.apply[0].in_force_keys.clone().unwrap();
    let both = record_of(&[(GPU_DEV, ADDED_STAMP), (GPU_REQ, ADDED_STAMP), (MIG_DEV, SYNCED), (MIG_REQ, SYNCED)]);
    let synced = rq(&added, &[CREATED, SYNCED, ADDED], &[(IN_FORCE_SINCE, SYNCED), (IN_FORCE_KEYS, &mig)]);
    assert_eq!(pass(q(Some(1)), &[synced], &[], vec![]).apply[0].in_force_keys, Some(both.clone()));
    let cached = rq(&added, &[CREATED, SYNCED, ADDED], &[(IN_FORCE_SINCE, SYNCED), (IN_FORCE_KEYS, &both)]);
    let pod = |name: &str, resource: &str| PendingPod {
        namespace: "x".into(),
        name: name.into(),
        created: Some("2026-06-01T10:30:00Z".parse().unwrap()),
        resources: [resource.to_string()].into(),
    };
    let pods = vec![pod("gated-gpu", "nvidia.com/gpu"), pod("gated-mig", "nvidia.com/mig-1g.10gb")];
    let p = pass(q(Some(1)), &[cached], &[], pods);
    assert_eq!(p.policy.get("x.pods").map(String::as_str), Some("gated-gpu"));
}

/// A recorded key keeps its stamp across passes and limit changes (a raise, a lowering not yet
/// in force); one no longer planned is dropped, and listed again it is stamped anew.
#[test]
fn key_stamps_are_kept_across_limit_changes_and_renewed_after_a_removal() {
    let q = |g| team_a("ResourceClaims", g);
    let one = pass(q(Some(1)), &[], &[], vec![]).apply[0].hard.clone();
    let both = record_of(&[(GPU_DEV, ADDED_STAMP), (GPU_REQ, ADDED_STAMP), (MIG_DEV, SYNCED), (MIG_REQ, SYNCED)]);
    let later = "2026-06-01T10:50:00Z";
    let cached = rq(&one, &[CREATED, SYNCED, ADDED, later], &[(IN_FORCE_SINCE, SYNCED), (IN_FORCE_KEYS, &both)]);
    for (what, gpus) in [("unchanged", Some(1)), ("raised", Some(3)), ("lowered, not in force", Some(0))] {
        let p = pass(q(gpus), std::slice::from_ref(&cached), &[], vec![]);
        assert_eq!(p.apply[0].in_force_keys.as_deref(), Some(both.as_str()), "{what}");
    }
    // Removed from `hard` (unlimited again): dropped from the record.
    let p = pass(q(None), std::slice::from_ref(&cached), &[], vec![]);
    let mig = record_of(&[(MIG_DEV, SYNCED), (MIG_REQ, SYNCED)]);
    assert_eq!(p.apply[0].in_force_keys.as_deref(), Some(mig.as_str()));
    // Listed again and in force: stamped at the latest write (plus the margin), not at its old stamp.
    let again = rq(&one, &[CREATED, SYNCED, ADDED, later], &[(IN_FORCE_SINCE, SYNCED), (IN_FORCE_KEYS, &mig)]);
    let p = pass(q(Some(1)), &[again], &[], vec![]);
    let renewed = record_of(&[
        (GPU_DEV, "2026-06-01T10:50:05Z"),
        (GPU_REQ, "2026-06-01T10:50:05Z"),
        (MIG_DEV, SYNCED),
        (MIG_REQ, SYNCED),
    ]);
    assert_eq!(p.apply[0].in_force_keys, Some(renewed));
}

/// An unreadable record counts as none: no class it limits opens on it, and every key in force is stamped
/// again at the latest write (later than any it had: claims made before are early, fails closed).
#[test]
fn an_unreadable_record_closes_and_restamps_every_key() {
    let q = || team_a("ResourceClaims", Some(1));
    let hard = pass(q(), &[], &[], vec![]).apply[0].hard.clone();
    let ok = format!("{MIG_DEV}={SYNCED}");
    let bad = [
        "garbage".to_string(),
        format!("{ok} {MIG_REQ}"),
        format!("{ok} {MIG_REQ}=yesterday"),
        format!("{ok} {MIG_REQ}=2026-06-01T10:00:02.5Z"),
        format!("{ok} {MIG_REQ}=2026-06-01T09:00:00Z"),
        format!("{ok} count/pods={SYNCED}"),
        format!("{ok} {ok}"),
    ];
    let restamped =
        record_of(&[(GPU_DEV, ADDED_STAMP), (GPU_REQ, ADDED_STAMP), (MIG_DEV, ADDED_STAMP), (MIG_REQ, ADDED_STAMP)]);
    for raw in &bad {
        let cached = rq(&hard, &[CREATED, SYNCED, ADDED], &[(IN_FORCE_SINCE, SYNCED), (IN_FORCE_KEYS, raw)]);
        assert_eq!(record(&cached), Record::Unreadable, "{raw}");
        let p = pass(q(), std::slice::from_ref(&cached), &[], vec![]);
        assert_eq!(p.apply[0].in_force_keys.as_deref(), Some(restamped.as_str()), "{raw}");
        let limited = ["gpu.tessera.dev", "mig-1g.10gb.tessera.dev"];
        assert!(!limited.iter().any(|c| opens(&p, c)), "{raw}: no limited class opens");
    }
    let empty = rq(&hard, &[CREATED], &[(IN_FORCE_KEYS, "")]);
    assert_eq!(record(&empty), Record::Keys(BTreeMap::new()), "an empty record is readable");
}

/// Upgrade: a ResourceQuota with only the single stamp: each planned key in force takes it
/// (claims made after it are not refused now), and its classes stay open meanwhile.
#[test]
fn an_upgraded_resource_quota_stamps_each_key_with_the_single_stamp() {
    let q = || team_a("ResourceClaims", Some(1));
    let hard = pass(q(), &[], &[], vec![]).apply[0].hard.clone();
    let old = rq(&hard, &[CREATED, SYNCED, ADDED], &[(IN_FORCE_SINCE, SYNCED)]);
    let p = pass(q(), std::slice::from_ref(&old), &[], vec![]);
    let all = record_of(&[(GPU_DEV, SYNCED), (GPU_REQ, SYNCED), (MIG_DEV, SYNCED), (MIG_REQ, SYNCED)]);
    assert_eq!(p.apply[0].in_force_keys, Some(all));
    assert!(opens(&p, "gpu.tessera.dev") && opens(&p, "mig-1g.10gb.tessera.dev"), "{:?}", p.policy);
    assert!(!p.policy.keys().any(|k| k.starts_with("x.since.")), "{:?}", p.policy);
}

/// `team-a` in `x` with `hard` as given (JSON), `unlisted: Unlimited`.
fn team_a_hard(allocation: &str, hard: serde_json::Value) -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": "team-a", "generation": 1, "uid": "uid-team-a"},
        "spec": {"namespaces": ["x"], "hard": hard, "allocation": allocation, "unlisted": "Unlimited"}}))
    .unwrap()
}

/// A quota planning no GPU key (`hard: {}`, `unlisted: Unlimited`) gets the record with the
/// single stamp, empty, so a key added later is stamped at its own time. With no record, that
/// key would take the single stamp (the upgrade path) and the pods made while it was unlimited
/// would not be early.
#[test]
fn a_quota_with_no_gpu_key_gets_an_empty_record_and_a_key_added_later_is_stamped_then() {
    for allocation in ["ExtendedResources", "ResourceClaims"] {
        let q = |hard| team_a_hard(allocation, hard);
        let none = pass(q(json!({})), &[], &[], vec![]).apply[0].hard.clone();
        assert!(!none.keys().any(|k| keys::is_gpu_key(k)), "{none:?}");
        let fresh = rq(&none, &[CREATED, SYNCED], &[]);
        let p = pass(q(json!({})), std::slice::from_ref(&fresh), &[], vec![]);
        assert!(p.apply[0].in_force_since.is_some(), "{allocation}");
        assert_eq!(p.apply[0].in_force_keys.as_deref(), Some(""), "{allocation}: written with the single stamp");
        let since = p.apply[0].in_force_since.clone().unwrap();

        let added = pass(q(json!({"nvidia.com/gpu": 1})), &[], &[], vec![]).apply[0].hard.clone();
        let synced = rq(&added, &[CREATED, SYNCED, ADDED], &[(IN_FORCE_SINCE, &since), (IN_FORCE_KEYS, "")]);
        let p = pass(q(json!({"nvidia.com/gpu": 1})), std::slice::from_ref(&synced), &[], vec![]);
        let rec = p.apply[0].in_force_keys.clone().unwrap();
        let Record::Keys(stamps) = record(&rq(&added, &[CREATED], &[(IN_FORCE_KEYS, &rec)])) else { panic!("{rec}") };
        let at: Timestamp = ADDED.parse().unwrap();
        assert!(!stamps.is_empty() && stamps.values().all(|t| *t >= at), "{allocation}: {rec}");

        let cached = rq(&added, &[CREATED, SYNCED, ADDED], &[(IN_FORCE_SINCE, &since), (IN_FORCE_KEYS, &rec)]);
        let pod = PendingPod {
            namespace: "x".into(),
            name: "gated-gpu".into(),
            created: Some("2026-06-01T10:30:00Z".parse().unwrap()),
            resources: ["nvidia.com/gpu".to_string()].into(),
        };
        let claims = [claim("unlimited-then", "gpu.tessera.dev", "2026-06-01T10:30:00Z")];
        let p = pass(q(json!({"nvidia.com/gpu": 1})), &[cached], &claims, vec![pod]);
        if allocation == "ExtendedResources" {
            assert_eq!(p.policy.get("x.pods").map(String::as_str), Some("gated-gpu"), "{:?}", p.policy);
        } else {
            let early = "unlimited-then:gpu.tessera.dev,early";
            assert_eq!(p.policy.get("x.claims").map(String::as_str), Some(early), "{:?}", p.policy);
        }
    }
}

/// In a namespace claimed by two quotas `<ns>.quota` holds both names; the per-key stamps still
/// hold there: each claiming quota's ResourceQuotas count against the namespace's `since`.
#[test]
fn later_keys_count_every_quota_claiming_the_namespace() {
    let a = team_a("ExtendedResources", Some(1));
    let mut b = team_a("ExtendedResources", None);
    b.metadata.name = Some("team-b".into());
    b.metadata.uid = Some("uid-team-b".into());
    let hard = pass(a.clone(), &[], &[], vec![]).apply[0].hard.clone();
    let rec = record_of(&[(GPU_REQ, ADDED), (MIG_REQ, SYNCED)]);
    let ours = rq(&hard, &[CREATED, SYNCED, ADDED], &[(IN_FORCE_SINCE, SYNCED), (IN_FORCE_KEYS, &rec)]);
    let want: BTreeMap<String, BTreeMap<String, Timestamp>> =
        [("x".to_string(), [(GPU_REQ.to_string(), ADDED.parse().unwrap())].into())].into();
    for names in ["team-a", "team-a team-b", "team-b team-a"] {
        let policy: BTreeMap<String, String> =
            [("x.since".to_string(), SYNCED.to_string()), ("x.quota".to_string(), names.to_string())].into();
        let later = keys::later_keys(&policy, &[&a, &b], std::slice::from_ref(&ours));
        assert_eq!(later, want, "{names}");
    }
}

/// A key's stamp (the write plus the margin) opens its class only from the second after it on the
/// operator's clock; the keys stamped before stay open.
#[test]
fn a_key_s_class_opens_only_once_the_clock_reaches_its_stamp() {
    let q = team_a("ResourceClaims", Some(1));
    let added = pass(q.clone(), &[], &[], vec![]).apply[0].hard.clone();
    let both = record_of(&[(GPU_DEV, ADDED_STAMP), (GPU_REQ, ADDED_STAMP), (MIG_DEV, SYNCED), (MIG_REQ, SYNCED)]);
    let cached = rq(&added, &[CREATED, SYNCED, ADDED], &[(IN_FORCE_SINCE, SYNCED), (IN_FORCE_KEYS, &both)]);
    let nss: BTreeSet<String> = ["x".to_string()].into();
    let at = |now: &str| {
        let now = Time(now.parse().unwrap());
        plan_quotas_dra(
            std::slice::from_ref(&q),
            &nss,
            std::slice::from_ref(&cached),
            &Capacity::default(),
            &DraInputs::default(),
            now,
        )
    };
    let before = at("2026-06-01T10:45:04Z");
    assert!(!opens(&before, "gpu.tessera.dev") && opens(&before, "mig-1g.10gb.tessera.dev"), "{:?}", before.policy);
    assert_eq!(before.apply[0].in_force_keys.as_deref(), Some(both.as_str()), "carried meanwhile");
    // Within the stamp's own second (a claim made then reads as early): still closed.
    let within = at(ADDED_STAMP);
    assert!(!opens(&within, "gpu.tessera.dev"), "{:?}", within.policy);
    let then = at("2026-06-01T10:45:06Z");
    assert!(opens(&then, "gpu.tessera.dev") && opens(&then, "mig-1g.10gb.tessera.dev"), "{:?}", then.policy);
}
