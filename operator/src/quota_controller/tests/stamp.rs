//! The stamp `tessera.dev/limits-in-force-since` through a whole pass, against a fake API
//! server: written once the limits are in force, carried by every later apply, skipped when current.

use k8s_openapi::api::core::v1::Namespace;
use serde_json::{Value, json};

use super::super::*;
use crate::quota_controller::test_support::{Requests, store_of};

const PATH: &str = "/api/v1/namespaces/x/resourcequotas/tessera-team-a";
const SYNCED: &str = "2026-06-01T10:00:02Z";
/// The per-key record of [`in_force`]'s limits, each stamped at [`SYNCED`].
const KEYS: &str = "gpu.tessera.dev.deviceclass.resource.k8s.io/devices=2026-06-01T10:00:02Z \
                    requests.nvidia.com/gpu=2026-06-01T10:00:02Z";

pub(super) fn team_a(gpus: i64) -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": "team-a", "uid": "uid-team-a", "generation": 1},
        "spec": {"namespaces": ["x"], "hard": {"nvidia.com/gpu": gpus}}}))
    .unwrap()
}

/// `team-a`'s ResourceQuota in `x` with its planned limits (1 GPU) in spec and status, synced by
/// the controller manager at [`SYNCED`], carrying `stamp` where given.
pub(super) fn in_force(stamp: Option<&str>) -> ResourceQuota {
    in_force_keyed(stamp, None)
}

/// [`in_force`] with the per-key record `keys` where given.
fn in_force_keyed(stamp: Option<&str>, keys: Option<&str>) -> ResourceQuota {
    let nss: BTreeSet<String> = ["x".to_string()].into();
    let now = Time("2026-06-01T11:00:00Z".parse().unwrap());
    let hard = tessera_planner::quota::plan_quotas(&[team_a(1)], &nss, &[], &[], now).apply[0].hard.clone();
    let used: BTreeMap<&String, &str> = hard.keys().map(|k| (k, "0")).collect();
    let mut annotations = json!({QUOTA_NAME_ANNOTATION: "team-a"});
    if let Some(s) = stamp {
        annotations[IN_FORCE_SINCE] = json!(s);
    }
    if let Some(k) = keys {
        annotations[IN_FORCE_KEYS] = json!(k);
    }
    let mut rq: ResourceQuota = serde_json::from_value(json!({"metadata": {"name": "tessera-team-a",
        "namespace": "x", "creationTimestamp": "2026-06-01T10:00:00Z", "annotations": annotations,
        "labels": {QUOTA_LABEL: "team-a"},
        "ownerReferences": [{"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "name": "team-a",
                             "uid": "uid-team-a", "controller": true}],
        "managedFields": [{"manager": "tessera", "operation": "Apply", "time": "2026-06-01T10:00:00Z"},
                          {"manager": "kube-controller-manager", "operation": "Update", "time": SYNCED}]},
        "spec": {"hard": hard}, "status": {"hard": hard, "used": used}}))
    .unwrap();
    tessera_planner::quota::stamp::trim_managed_fields(&mut rq); // as the cache holds it
    rq
}

fn controller(client: Client, quota: TenantGpuQuota, rq: ResourceQuota) -> QuotaController {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "x", "uid": "uid-x"}})).unwrap();
    QuotaController::from_stores(client, store_of(vec![quota]), store_of(vec![rq]), store_of(vec![ns]))
}

/// The bodies of the pass's applies of `team-a`'s ResourceQuota.
fn applies(requests: &Requests) -> Vec<Value> {
    let requests = requests.lock().unwrap();
    requests.iter().filter(|(m, p, _)| m == "PATCH" && p == PATH).map(|(_, _, b)| b.clone()).collect()
}

/// The pass that first sees the limits in force writes the stamp
/// (the latest write the API server recorded: the status sync); one that finds it cached and
/// the limits unchanged writes nothing; a changed limit is applied with the stamp unchanged
/// (server-side apply would otherwise drop the annotation).
#[tokio::test]
async fn the_stamp_is_written_once_and_carried_by_every_later_apply() {
    let (client, requests) = crate::quota_controller::test_support::recording_api(|_, _, _| None);
    let _ = controller(client, team_a(1), in_force(None)).reconcile().await;
    let written = applies(&requests);
    assert_eq!(written.len(), 1, "the stamp is written: {written:?}");
    // The sync plus the margin (`stamp::MARGIN_SECS`).
    let stamped = "2026-06-01T10:00:07Z";
    assert_eq!(written[0]["metadata"]["annotations"][IN_FORCE_SINCE], json!(stamped));
    assert_eq!(
        written[0]["metadata"]["annotations"][IN_FORCE_KEYS],
        json!(KEYS.replace(SYNCED, stamped)),
        "each key stamped too"
    );

    // Upgrade: the single stamp cached, no per-key record: each key in force takes the stamp.
    let (client, requests) = crate::quota_controller::test_support::recording_api(|_, _, _| None);
    let _ = controller(client, team_a(1), in_force(Some(SYNCED))).reconcile().await;
    let written = applies(&requests);
    assert_eq!(written.len(), 1, "the record is written: {written:?}");
    assert_eq!(written[0]["metadata"]["annotations"][IN_FORCE_KEYS], json!(KEYS));

    let (client, requests) = crate::quota_controller::test_support::recording_api(|_, _, _| None);
    let _ = controller(client, team_a(1), in_force_keyed(Some(SYNCED), Some(KEYS))).reconcile().await;
    assert_eq!(applies(&requests), Vec::<Value>::new(), "current, stamps and all: nothing written");

    let (client, requests) = crate::quota_controller::test_support::recording_api(|_, _, _| None);
    let _ = controller(client, team_a(2), in_force_keyed(Some(SYNCED), Some(KEYS))).reconcile().await;
    let written = applies(&requests);
    assert_eq!(written.len(), 1, "the raise is written: {written:?}");
    assert_eq!(written[0]["metadata"]["annotations"][IN_FORCE_SINCE], json!(SYNCED), "carried unchanged");
    assert_eq!(written[0]["metadata"]["annotations"][IN_FORCE_KEYS], json!(KEYS), "carried unchanged");
    assert_eq!(written[0]["metadata"]["annotations"][QUOTA_NAME_ANNOTATION], json!("team-a"));
}

/// Upgrade: the previous operator's params (the cached ConfigMap) hold `x.since`, its
/// ResourceQuota's creation; the pass stamps that, not the later status sync.
#[tokio::test]
async fn an_upgrade_stamps_the_stored_since() {
    let (client, requests) = crate::quota_controller::test_support::recording_api(|_, _, _| None);
    let params: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "tessera-claim-classes",
        "namespace": "tessera-system"}, "data": {"x.quota": "team-a", "x.since": "2026-06-01T10:00:00Z"}}))
    .unwrap();
    let c = controller(client, team_a(1), in_force(None))
        .with_dra(kube::runtime::reflector::store().0, store_of(vec![params]));
    let _ = c.reconcile().await;
    let written = applies(&requests);
    assert_eq!(written.len(), 1, "{written:?}");
    assert_eq!(written[0]["metadata"]["annotations"][IN_FORCE_SINCE], json!("2026-06-01T10:00:00Z"));
}
