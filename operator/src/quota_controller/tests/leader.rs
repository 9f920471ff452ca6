//! The leader check through a whole quota pass, against a fake API server: a replica whose lease
//! may have passed to another writes nothing (a deposed leader's stale caches could raise a share
//! the new leader lowered), and one whose tenure holds writes every kind of object.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Namespace;
use serde_json::json;

use super::super::QuotaController;
use super::super::test_support::{Requests, deleted, ours, quota, recording_api, store_of};
use crate::Error;
use crate::leader::Tenure;

/// Whether the fake API server was asked to change something.
fn is_write(method: &str) -> bool {
    matches!(method, "PATCH" | "POST" | "PUT" | "DELETE")
}

/// A tenure that ends (or ended) `secs` seconds from now.
fn tenure_until(secs: i64) -> Arc<Tenure> {
    let now = SystemTime::now();
    let until = match secs {
        s if s >= 0 => now + Duration::from_secs(s.unsigned_abs()),
        s => now - Duration::from_secs(s.unsigned_abs()),
    };
    let tenure = Tenure::default();
    tenure.set(Some(until));
    Arc::new(tenure)
}

/// A controller with work of every kind to write: Tessera's DeviceClass and the policy params
/// (a quota of claims), `team-b`'s ResourceQuota in `b`, its stale one in `retired` to delete,
/// and the quota's status. `client` is the fake API server's.
fn controller_with_every_write(client: kube::Client) -> QuotaController {
    let q = quota(
        "team-b",
        json!({"namespaces": ["b"], "hard": {"nvidia.com/mig-1g.10gb": 3}, "allocation": "ResourceClaims"}),
    );
    let namespaces: Vec<Namespace> =
        ["b", "retired"].iter().map(|n| serde_json::from_value(json!({"metadata": {"name": n}})).unwrap()).collect();
    let rqs = vec![ours("team-b", "retired", "0")];
    QuotaController::from_stores(client, store_of(vec![q]), store_of(rqs), store_of(namespaces))
        .with_dra(store_of(vec![]), store_of(vec![]))
}

/// The writes the fake API server was asked for: (method, path).
fn writes(requests: &Requests) -> Vec<(String, String)> {
    let requests = requests.lock().unwrap();
    requests.iter().filter(|(m, _, _)| is_write(m)).map(|(m, p, _)| (m.clone(), p.clone())).collect()
}

/// A DeviceClass, the policy params, a ResourceQuota applied and one deleted, the quota's status.
fn assert_every_kind_written(requests: &Requests) {
    let writes = writes(requests);
    let wrote = |method: &str, path: &str| writes.iter().any(|(m, p)| m == method && p == path);
    assert!(wrote("PATCH", "/apis/resource.k8s.io/v1/deviceclasses/mig-1g.10gb.tessera.dev"), "{writes:?}");
    assert!(wrote("PATCH", "/api/v1/namespaces/tessera-system/configmaps/tessera-claim-classes"), "{writes:?}");
    assert!(wrote("PATCH", "/api/v1/namespaces/b/resourcequotas/tessera-team-b"), "{writes:?}");
    assert!(wrote("DELETE", "/api/v1/namespaces/retired/resourcequotas/tessera-team-b"), "{writes:?}");
    assert!(wrote("PATCH", "/apis/tessera.dev/v1alpha1/tenantgpuquotas/team-b/status"), "{writes:?}");
}

#[tokio::test]
async fn a_quota_pass_under_a_held_tenure_writes_every_kind_of_object() {
    let (client, requests) = recording_api(|method, _, _| (method == "DELETE").then(deleted));
    let controller = controller_with_every_write(client);
    let controller = controller.with_tenure(tenure_until(60));

    let result = controller.reconcile().await;
    assert!(result.is_ok(), "{result:?}");
    assert_every_kind_written(&requests);
}

#[tokio::test]
async fn a_quota_pass_whose_tenure_lapsed_writes_nothing_and_ends_not_leader() {
    let (client, requests) = recording_api(|method, _, _| (method == "DELETE").then(deleted));
    let controller = controller_with_every_write(client);
    let controller = controller.with_tenure(tenure_until(-1));

    let result = controller.reconcile().await;
    assert!(matches!(result, Err(Error::NotLeader)), "{result:?}");
    assert_eq!(writes(&requests), vec![], "a replica that may not write sends no write at all");
}

#[tokio::test]
async fn a_tenure_lapsing_mid_pass_stops_the_writes_after_the_one_sent() {
    // The lease runs out while a write of each kind in turn is in flight: nothing after it is sent.
    let kinds = [
        ("PATCH", "/deviceclasses/"),
        ("PATCH", "/configmaps/"),
        ("PATCH", "/resourcequotas/"),
        ("DELETE", "/resourcequotas/"),
    ];
    for (method, kind) in kinds {
        let tenure = tenure_until(60);
        let lapse = tenure.clone();
        let (client, requests) = recording_api(move |m, path, _| {
            if m == method && path.contains(kind) {
                lapse.set(None);
            }
            (m == "DELETE").then(deleted)
        });
        let controller = controller_with_every_write(client);
        let controller = controller.with_tenure(tenure);

        let result = controller.reconcile().await;
        assert!(matches!(result, Err(Error::NotLeader)), "{method} {kind}: {result:?}");
        let writes = writes(&requests);
        let first = writes.iter().position(|(m, p)| m == method && p.contains(kind)).expect("the write was sent");
        assert_eq!(first + 1, writes.len(), "{method} {kind}: {writes:?}");
    }
}

#[tokio::test]
async fn without_leader_election_a_quota_pass_always_writes() {
    let (client, requests) = recording_api(|method, _, _| (method == "DELETE").then(deleted));
    let controller = controller_with_every_write(client);

    let result = controller.reconcile().await;
    assert!(result.is_ok(), "{result:?}");
    assert_every_kind_written(&requests);
}
