//! The quota controller's start (DeviceClass cache) and its reports of failed shared writes.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::Client;
use serde_json::json;

use super::super::*;
use crate::quota_controller::test_support::store_of;

/// An API server whose `resource.k8s.io/v1` discovery answers `discovery` (404: not served)
/// and whose DeviceClass list answers `list`; a watch never answers.
fn api(discovery: u16, list: u16) -> Client {
    let served = crate::controller::fake_dra_api::Served {
        plural: "deviceclasses",
        singular: "deviceclass",
        kind: "DeviceClass",
        namespaced: false,
        items: json!([]),
    };
    crate::controller::fake_dra_api::api(served, discovery, list)
}

/// Without `resource.k8s.io/v1` the DeviceClass cache is ready and empty (waiting for it would
/// stall the whole operator forever); forbidden, it is not ready.
#[tokio::test]
async fn device_classes_are_ready_and_empty_without_the_api_and_not_ready_while_forbidden() {
    let none = watch_classes(api(404, 500), Arc::new(Notify::new()));
    tokio::time::timeout(Duration::from_secs(5), none.wait_until_ready()).await.expect("ready").unwrap();
    assert!(none.state().is_empty());
    let listed = watch_classes(api(200, 200), Arc::new(Notify::new()));
    tokio::time::timeout(Duration::from_secs(5), listed.wait_until_ready()).await.expect("ready").unwrap();
    let forbidden = watch_classes(api(200, 403), Arc::new(Notify::new()));
    assert!(tokio::time::timeout(Duration::from_millis(300), forbidden.wait_until_ready()).await.is_err());
}

/// DeviceClasses that cannot be listed hold the quota passes, not the caches
/// `run.rs` waits on before the rollout controller starts.
#[tokio::test]
async fn the_quota_caches_are_ready_while_device_classes_are_not() {
    let (classes, _writer) = kube::runtime::reflector::store::<DeviceClass>();
    let c = QuotaController::from_stores(api(404, 500), store_of(vec![]), store_of(vec![]), store_of(vec![]))
        .with_dra(classes, store_of(Vec::<ConfigMap>::new()));
    tokio::time::timeout(Duration::from_secs(2), c.wait_ready()).await.expect("ready without DeviceClasses");
    assert!(tokio::time::timeout(Duration::from_millis(200), c.wait_classes()).await.is_err());
}

/// A failed write of the policy params is reported on the quotas' status
/// (`WriteFailed`, naming the ConfigMap), not only logged.
#[tokio::test]
async fn a_failed_params_write_is_reported_on_the_quota_status() {
    use tessera_crds::TenantGpuQuota;
    use tessera_crds::conditions::{RECONCILING, find};
    let q: TenantGpuQuota = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1",
        "kind": "TenantGpuQuota", "metadata": {"name": "team-b", "uid": "uid-b"},
        "spec": {"namespaces": ["b"], "hard": {"nvidia.com/mig-1g.10gb": 3}, "allocation": "ResourceClaims"}}))
    .unwrap();
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "b"}})).unwrap();
    let (client, requests) = crate::quota_controller::test_support::api_refusing_writes_in_locked();
    let mut c = QuotaController::from_stores(client, store_of(vec![q]), store_of(vec![]), store_of(vec![ns]));
    c.namespace = "locked".into(); // the params' namespace refuses writes
    assert!(matches!(c.reconcile().await, Err(crate::Error::PartialPass(_))));
    let requests = requests.lock().unwrap().clone();
    let path = "/apis/tessera.dev/v1alpha1/tenantgpuquotas/team-b/status";
    let (_, _, body) = requests.iter().find(|(m, p, _)| m == "PATCH" && p == path).expect("status written");
    let st: tessera_crds::quota::TenantGpuQuotaStatus = serde_json::from_value(body["status"].clone()).unwrap();
    let msg = &find(&st.conditions, RECONCILING).expect("Reconciling").message;
    assert!(msg.contains("tessera-claim-classes") && msg.contains("lock-quotas"), "{msg}");
}

/// The params carry each tenant namespace's UID from the namespace cache (the policies compare
/// it with the namespace's); a terminating namespace keeps its own (dropped, a re-creation while
/// the operator is down would be neither checked nor pending).
#[tokio::test]
async fn the_params_carry_each_live_tenant_namespaces_uid() {
    use tessera_crds::TenantGpuQuota;
    let q: TenantGpuQuota = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1",
        "kind": "TenantGpuQuota", "metadata": {"name": "team-b", "uid": "uid-q"},
        "spec": {"namespaces": ["b", "gone"], "hard": {"nvidia.com/gpu": 3}}}))
    .unwrap();
    let b: Namespace = serde_json::from_value(json!({"metadata": {"name": "b", "uid": "uid-b"}})).unwrap();
    let gone: Namespace = serde_json::from_value(
        json!({"metadata": {"name": "gone", "uid": "uid-gone", "deletionTimestamp": "2026-01-01T00:00:00Z"}}),
    )
    .unwrap();
    let (client, requests) = crate::quota_controller::test_support::api_refusing_writes_in_locked();
    let c = QuotaController::from_stores(client, store_of(vec![q]), store_of(vec![]), store_of(vec![b, gone]))
        .with_dra(store_of(vec![]), store_of(Vec::<ConfigMap>::new()));
    let _ = c.reconcile().await;
    let requests = requests.lock().unwrap().clone();
    let path = "/api/v1/namespaces/tessera-system/configmaps/tessera-claim-classes";
    let (_, _, body) = requests.iter().find(|(m, p, _)| m == "PATCH" && p == path).expect("params written");
    assert_eq!(body["data"]["b.uid"], "uid-b", "{body}");
    assert_eq!(body["data"]["gone.uid"], "uid-gone", "a terminating namespace: {body}");
    assert_eq!(body["data"]["_pending"], "b gone", "{body}");
}
