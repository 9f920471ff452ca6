//! Issue 24 M2: a pass whose policy-params write fails deletes no ResourceQuota.

use k8s_openapi::api::core::v1::Namespace;
use serde_json::{Value, json};

use super::*;
use crate::quota::tests::{Requests, store_of};

/// A client that records every request, answers the params ConfigMap's apply with `params`
/// (HTTP code) and accepts every other write.
fn api(params: u16) -> (Client, Requests) {
    let requests = Requests::default();
    let seen = requests.clone();
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let seen = seen.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body: Value = serde_json::from_slice(&body.collect_bytes().await.unwrap()).unwrap_or_default();
            let (method, path) = (parts.method.to_string(), parts.uri.path().to_string());
            seen.lock().unwrap().push((method.clone(), path.clone(), body.clone()));
            let params_write = path.ends_with("/configmaps/tessera-claim-classes") && method == "PATCH";
            let (code, answer) = if params_write && params != 200 {
                (params, json!({"kind": "Status", "apiVersion": "v1", "code": params}))
            } else if path == "/api/v1/pods" {
                (200, json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": []}))
            } else if path.ends_with("/status") {
                (
                    200,
                    json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
                    "metadata": {"name": "b"}, "spec": {"namespaces": [], "hard": {}}}),
                )
            } else if method == "DELETE" {
                (200, json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}))
            } else {
                (200, body)
            };
            let bytes = serde_json::to_vec(&answer).unwrap();
            Ok::<_, std::convert::Infallible>(
                http::Response::builder().status(code).body(kube::client::Body::from(bytes)).unwrap(),
            )
        }
    });
    (Client::new(service, "default"), requests)
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
        serde_json::from_value(json!({"metadata": {"name": crate::quota::resource_quota_name("a"),
        "namespace": "x", "labels": {"tessera.dev/quota": crate::quota::quota_label_value("a")},
        "ownerReferences": [{"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "name": "a",
                             "uid": "uid-a", "controller": true}]},
        "spec": {"hard": {"requests.nvidia.com/gpu": "1"}}, "status": {"hard": {"requests.nvidia.com/gpu": "1"}}}))
        .unwrap();
    let ns = |n: &str| -> Namespace { serde_json::from_value(json!({"metadata": {"name": n, "uid": "uid"}})).unwrap() };
    // `b`'s own ResourceQuota in `x` is in force: `x` is not pending, so `a`'s may go.
    let in_force: ResourceQuota =
        serde_json::from_value(json!({"metadata": {"name": crate::quota::resource_quota_name("b"),
        "namespace": "x", "labels": {"tessera.dev/quota": crate::quota::quota_label_value("b")},
        "ownerReferences": [{"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "name": "b",
                             "uid": "uid-b", "controller": true}]},
        "spec": {"hard": {"requests.nvidia.com/gpu": "1"}}, "status": {"hard": {"requests.nvidia.com/gpu": "1"}}}))
        .unwrap();
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

/// Issue 24 M2: with the params write failing, the stale params still say `x.quota=a` (not
/// pending) while `b`'s new ResourceQuota has no `status.hard` yet: deleting `a`'s left `x`
/// unlimited until `b`'s status synced. The stale one is kept until the params are written.
#[tokio::test]
async fn a_failed_params_write_deletes_no_resource_quota_in_that_pass() {
    let stale = format!("/api/v1/namespaces/x/resourcequotas/{}", crate::quota::resource_quota_name("a"));
    let (client, requests) = api(200);
    let _ = controller(client).reconcile().await;
    assert_eq!(deletes(&requests), [stale], "params written: the stale ResourceQuota goes");

    let (client, requests) = api(500);
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
