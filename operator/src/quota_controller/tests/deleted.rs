//! The ResourceQuota watch lagging the controller's own delete. `x` leaves quota `team-a` (its
//! ResourceQuota deleted) and comes back before the watch delivers the deletion: the cached,
//! stamped object looks enforced and current, and taken as such nothing would be applied, `x`
//! would not be pending, and GPU pods would be admitted there with no ResourceQuota.

use k8s_openapi::api::core::v1::Namespace;
use serde_json::json;

use super::super::*;
use super::stamp::{in_force, team_a};
use crate::quota_controller::test_support::store_of;

const PATH: &str = "/api/v1/namespaces/x/resourcequotas/tessera-team-a";

#[tokio::test]
async fn a_resource_quota_deleted_here_counts_as_absent_until_the_cache_drops_it() {
    let mut elsewhere = team_a(1);
    elsewhere.spec.namespaces = vec!["y".into()];
    let mut r = in_force(Some("2026-06-01T10:00:02Z"));
    r.metadata.uid = Some("uid-r".into());
    let namespaces: Vec<Namespace> = ["x", "y"]
        .iter()
        .map(|n| serde_json::from_value(json!({"metadata": {"name": n, "uid": format!("uid-{n}")}})).unwrap())
        .collect();
    let (client, requests) = crate::quota_controller::test_support::api_refusing_writes_in_locked();
    let mut c =
        QuotaController::from_stores(client, store_of(vec![elsewhere]), store_of(vec![r]), store_of(namespaces));
    let asked = |method: &str| requests.lock().unwrap().iter().any(|(m, p, _)| m == method && p == PATH);

    let _ = c.reconcile().await;
    assert!(asked("DELETE"), "x left team-a: its ResourceQuota is deleted");
    assert_eq!(c.deleted.len(), 1);

    // `x` added back; the cache still shows the deleted object (same UID).
    c.quotas = store_of(vec![team_a(1)]);
    requests.lock().unwrap().clear();
    let _ = c.reconcile().await;
    assert!(asked("PATCH"), "applied again: the cached one is gone from the cluster");
    let requests_now = requests.lock().unwrap().clone();
    let params = "/api/v1/namespaces/tessera-system/configmaps/tessera-claim-classes";
    let (_, _, body) = requests_now.iter().find(|(m, p, _)| m == "PATCH" && p == params).expect("params written");
    assert_eq!(body["data"]["_pending"], "x", "x is pending until its new ResourceQuota is in force: {body}");
    assert_eq!(c.deleted.len(), 1, "still cached: still remembered");

    // The watch delivers the deletion: the memory is cleared.
    c.rqs = store_of(vec![]);
    let _ = c.reconcile().await;
    assert_eq!(c.deleted.len(), 0);
}
