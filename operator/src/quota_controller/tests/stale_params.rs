//! The params as last written and a pass: one whose params write fails deletes no ResourceQuota;
//! one keeps the `<ns>.uid` of a namespace gone from the cache.

use k8s_openapi::api::core::v1::Namespace;
use serde_json::{Value, json};

use super::super::*;
use crate::quota_controller::test_support::{Requests, store_of};

/// A client that records every request, answers the params ConfigMap's apply with a 500 when
/// `fail_params` and accepts every other write.
fn api(fail_params: bool) -> (Client, Requests) {
    crate::quota_controller::test_support::recording_api(move |method, path, _| {
        let params_write = path.ends_with("/configmaps/tessera-claim-classes") && method == "PATCH";
        if fail_params && params_write {
            return Some((500, json!({"kind": "Status", "apiVersion": "v1", "code": 500})));
        }
        accept(method, path)
    })
}

/// Every other request: the pod list empty, quota status writes answered as `b`, deletes done.
fn accept(method: &str, path: &str) -> Option<(u16, Value)> {
    if path == "/api/v1/pods" {
        Some((200, json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": []})))
    } else if path.ends_with("/status") {
        Some((
            200,
            json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
            "metadata": {"name": "b"}, "spec": {"namespaces": [], "hard": {}}}),
        ))
    } else {
        (method == "DELETE").then(crate::quota_controller::test_support::deleted)
    }
}

/// Namespace `x` moved from quota `a` (now listing `y`) to quota `b`: `a`'s ResourceQuota in `x`
/// is stale and planned for deletion.
fn controller(client: Client) -> QuotaController {
    let b: TenantGpuQuota = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1",
        "kind": "TenantGpuQuota", "metadata": {"name": "b", "uid": "uid-b", "generation": 1},
        "spec": {"namespaces": ["x"], "hard": {"nvidia.com/gpu": 1}}}))
    .unwrap();
    let a: TenantGpuQuota = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1",
        "kind": "TenantGpuQuota", "metadata": {"name": "a", "uid": "uid-a", "generation": 1},
        "spec": {"namespaces": ["y"], "hard": {"nvidia.com/gpu": 1}}}))
    .unwrap();
    let old: ResourceQuota =
        serde_json::from_value(json!({"metadata": {"name": tessera_planner::quota::resource_quota_name("a"),
        "namespace": "x", "labels": {"tessera.dev/quota": tessera_planner::quota::quota_label_value("a")},
        "ownerReferences": [{"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "name": "a",
                             "uid": "uid-a", "controller": true}]},
        "spec": {"hard": {"requests.nvidia.com/gpu": "1"}}, "status": {"hard": {"requests.nvidia.com/gpu": "1"}}}))
        .unwrap();
    let ns = |n: &str| -> Namespace { serde_json::from_value(json!({"metadata": {"name": n, "uid": "uid"}})).unwrap() };
    // `b`'s own ResourceQuota in `x` is in force and stamped: `x` is not pending, so `a`'s may go.
    let in_force: ResourceQuota =
        serde_json::from_value(json!({"metadata": {"name": tessera_planner::quota::resource_quota_name("b"),
        "namespace": "x", "labels": {"tessera.dev/quota": tessera_planner::quota::quota_label_value("b")},
        "ownerReferences": [{"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "name": "b",
                             "uid": "uid-b", "controller": true}]},
        "spec": {"hard": {"requests.nvidia.com/gpu": "1"}}, "status": {"hard": {"requests.nvidia.com/gpu": "1"}}}))
        .unwrap();
    let in_force = crate::quota_controller::test_support::stamped(in_force);
    QuotaController::from_stores(
        client,
        store_of(vec![a, b]),
        store_of(vec![old, in_force]),
        store_of(vec![ns("x"), ns("y")]),
    )
}

fn deletes(requests: &Requests) -> Vec<String> {
    let requests = requests.lock().unwrap();
    requests.iter().filter(|(m, _, _)| m == "DELETE").map(|(_, p, _)| p.clone()).collect()
}

/// With the params write failing, the stale params still say `x.quota=a` (not pending) while
/// `b`'s new ResourceQuota has no `status.hard` yet: deleting `a`'s would leave `x` unlimited
/// until `b`'s status synced. The stale one is kept until the params are written.
#[tokio::test]
async fn a_failed_params_write_deletes_no_resource_quota_in_that_pass() {
    let stale = format!("/api/v1/namespaces/x/resourcequotas/{}", tessera_planner::quota::resource_quota_name("a"));
    let (client, requests) = api(false);
    let _ = controller(client).reconcile().await;
    assert_eq!(deletes(&requests), [stale], "params written: the stale ResourceQuota goes");

    let (client, requests) = api(true);
    let _ = controller(client).reconcile().await;
    assert!(
        requests
            .lock()
            .unwrap()
            .iter()
            .any(|(m, p, _)| m == "PATCH" && p.ends_with("/configmaps/tessera-claim-classes")),
        "the params write was tried"
    );
    assert_eq!(deletes(&requests), Vec::<String>::new(), "params not written: nothing deleted");
}

/// `t` gone from the namespace cache (deleted; its ResourceQuota watch
/// may have caught up already). The pass keeps the `t.uid` the params held (read from the
/// params ConfigMap's cache) instead of dropping it, so a namespace created under that name
/// while the operator is down is refused until a pass sees it.
#[tokio::test]
async fn a_pass_keeps_the_params_uid_of_a_namespace_gone_from_the_cache() {
    let q: TenantGpuQuota = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1",
        "kind": "TenantGpuQuota", "metadata": {"name": "b", "uid": "uid-b", "generation": 1},
        "spec": {"namespaces": ["x", "t"], "hard": {"nvidia.com/gpu": 2}}}))
    .unwrap();
    let x: Namespace = serde_json::from_value(json!({"metadata": {"name": "x", "uid": "uid-x"}})).unwrap();
    let params: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "tessera-claim-classes",
        "namespace": "tessera-system"}, "data": {"t.quota": "b", "t.uid": "old-t", "x.quota": "b", "x.uid": "uid-x"}}))
    .unwrap();
    let (client, requests) = api(false);
    let c = QuotaController::from_stores(client, store_of(vec![q]), store_of(vec![]), store_of(vec![x]))
        .with_dra(store_of(vec![]), store_of(vec![params]));
    let _ = c.reconcile().await;
    let requests = requests.lock().unwrap();
    let written = requests
        .iter()
        .find(|(m, p, _)| m == "PATCH" && p.ends_with("/configmaps/tessera-claim-classes"))
        .map(|(_, _, body)| body["data"].clone())
        .expect("the params written");
    assert_eq!(written["t.uid"], "old-t", "{written}");
    assert_eq!(written["x.uid"], "uid-x", "{written}");
    assert!(written["_pending"].as_str().unwrap().split(' ').any(|n| n == "t"), "{written}");
}
