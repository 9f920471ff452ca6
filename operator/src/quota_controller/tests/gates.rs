//! Gates mode's pass against a fake API server: what it writes, in which order across passes,
//! and what a failed write leaves (closed, never open).

use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use serde_json::{Value, json};
use tessera_crds::gate::GpuQuotaGate;

use super::super::QuotaController;
use super::super::test_support::{Requests, quota, recording_api, store_of};

fn namespace(label: Option<&str>) -> Namespace {
    let mut v = json!({"metadata": {"name": "a"}});
    if let Some(l) = label {
        v["metadata"]["labels"] = json!({"tessera.dev/gpu-gate": l});
    }
    serde_json::from_value(v).unwrap()
}

/// Tessera's class for whole GPUs, held at 0 on the extended-resources path.
const CLASS_KEY: &str = "gpu.tessera.dev.deviceclass.resource.k8s.io/devices";

/// Tessera's ResourceQuota of `team-a` in `a`, in force as planned (a share of 2), held.
fn in_force() -> ResourceQuota {
    serde_json::from_value(json!({"metadata": {"name": "tessera-team-a", "namespace": "a", "uid": "rq-uid",
            "finalizers": ["tessera.dev/in-force"], "labels": {"tessera.dev/quota": "team-a"},
            "annotations": {"tessera.dev/quota-name": "team-a"},
            "ownerReferences": [{"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "name": "team-a",
                "uid": "uid-team-a", "controller": true}]},
        "spec": {"hard": {"requests.nvidia.com/gpu": "2", CLASS_KEY: "0"}},
        "status": {"hard": {"requests.nvidia.com/gpu": "2", CLASS_KEY: "0"}, "used": {"requests.nvidia.com/gpu": "0", CLASS_KEY: "0"}}}))
    .unwrap()
}

fn controller(client: kube::Client, label: Option<&str>, gates: Vec<GpuQuotaGate>) -> QuotaController {
    let q = quota("team-a", json!({"namespaces": ["a"], "hard": {"nvidia.com/gpu": 2}}));
    QuotaController::from_stores(
        client,
        store_of(vec![q]),
        store_of(vec![in_force()]),
        store_of(vec![namespace(label)]),
    )
    .with_gates(store_of(gates), store_of(vec![]))
}

fn written<'a>(requests: &'a [(String, String, Value)], path: &str) -> Option<&'a Value> {
    requests.iter().find(|(m, p, _)| m == "PATCH" && p == path).map(|(_, _, b)| b)
}

const GATE: &str = "/apis/tessera.dev/v1alpha1/namespaces/a/gpuquotagates/gpu";
const NAMESPACE: &str = "/api/v1/namespaces/a";

fn requests(r: &Requests) -> Vec<(String, String, Value)> {
    r.lock().unwrap().clone()
}

/// The gate as the API server would cache it after `written` (its body as applied).
fn cached(written: &Value) -> GpuQuotaGate {
    serde_json::from_value(json!({"metadata": {"name": "gpu", "namespace": "a",
        "ownerReferences": written["metadata"]["ownerReferences"].clone()}, "spec": written["spec"].clone()}))
    .unwrap()
}

fn dump(reqs: &[(String, String, Value)]) -> Vec<String> {
    reqs.iter().map(|(m, p, b)| format!("{m} {p} {b}")).collect()
}

#[tokio::test]
async fn a_claimed_namespace_goes_joining_then_tenant_once_its_gate_owned_by_its_resource_quota_is_seen() {
    // A namespace labelled `open` that a quota now claims: straight to joining, and a first gate
    // that binds nothing (the pod cache may lag the label).
    let (client, r) = recording_api(|_, _, _| None);
    let _ = controller(client, Some("open"), vec![]).reconcile().await;
    let reqs = requests(&r);
    let first = written(&reqs, GATE).expect("the gate applied");
    assert_eq!(first["metadata"]["ownerReferences"][0]["uid"], "rq-uid");
    assert_eq!(first["spec"]["state"], "Enforced");
    assert_eq!(first["spec"]["blockAllBindings"], true, "{first}");
    let label = written(&reqs, NAMESPACE).expect("labelled");
    assert_eq!(label["metadata"]["labels"]["tessera.dev/gpu-gate"], "joining");

    // Seen joining: the gate is written without the block; not yet tenant (the cached gate is the first one).
    let (client, r) = recording_api(|_, _, _| None);
    let _ = controller(client, Some("joining"), vec![cached(first)]).reconcile().await;
    let reqs = requests(&r);
    let second = written(&reqs, GATE).unwrap_or_else(|| panic!("rewritten: {:?}", dump(&reqs)));
    assert_eq!(second["spec"].get("blockAllBindings"), None, "{second}");
    assert!(written(&reqs, NAMESPACE).is_none(), "not tenant before its gate is seen: {:?}", dump(&reqs));

    // The gate as written cached: tenant, the gate not rewritten.
    let (client, r) = recording_api(|_, _, _| None);
    let _ = controller(client, Some("joining"), vec![cached(second)]).reconcile().await;
    let reqs = requests(&r);
    assert!(written(&reqs, GATE).is_none(), "current: {:?}", dump(&reqs));
    let label = written(&reqs, NAMESPACE).unwrap_or_else(|| panic!("labelled: {:?}", dump(&reqs)));
    assert_eq!(label["metadata"]["labels"]["tessera.dev/gpu-gate"], "tenant");
}

#[tokio::test]
async fn a_refused_gate_write_never_makes_the_namespace_tenant_and_says_so_on_the_quota() {
    let refuse = |method: &str, path: &str, _: &Value| {
        (method == "PATCH" && path == GATE).then(|| {
            (422, json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 422, "message": "refused"}))
        })
    };
    // Unlabelled: joining (closed to new GPU work; bindings wait for the missing gate).
    let (client, r) = recording_api(refuse);
    let result = controller(client, None, vec![]).reconcile().await;
    assert!(matches!(result, Err(crate::Error::PartialPass(_))), "{result:?}");
    let reqs = requests(&r);
    let label = written(&reqs, NAMESPACE).expect("labelled");
    assert_eq!(label["metadata"]["labels"]["tessera.dev/gpu-gate"], "joining");
    let status = written(&reqs, "/apis/tessera.dev/v1alpha1/tenantgpuquotas/team-a/status").expect("status");
    let text = status.to_string();
    assert!(text.contains("GpuQuotaGate gpu in a: "), "{text}");
    // Joining, its ResourceQuota in force, an older gate of it cached, the new gate refused:
    // never tenant (the cached gate is not the planned one; the refused write changed nothing).
    let stale: GpuQuotaGate = serde_json::from_value(json!({"metadata": {"name": "gpu", "namespace": "a",
        "ownerReferences": [{"apiVersion": "v1", "kind": "ResourceQuota", "name": "tessera-team-a", "uid": "rq-uid"}]},
        "spec": {"quota": "team-a", "state": "Enforced", "reason": "older", "limited": ["nvidia.com/gpu"]}}))
    .unwrap();
    let (client, r) = recording_api(refuse);
    let _ = controller(client, Some("joining"), vec![stale]).reconcile().await;
    let reqs = requests(&r);
    assert!(written(&reqs, GATE).is_some(), "the gate write was tried");
    assert!(written(&reqs, NAMESPACE).is_none(), "no tenant label without the gate: {:?}", dump(&reqs));
}

#[tokio::test]
async fn a_resource_quota_let_go_is_remembered_as_deleted_so_a_lagging_cache_does_not_show_it_in_force() {
    // No quota names `a` any more, labelled closed: its held ResourceQuota is let go and deleted.
    let held = in_force();
    let (client, r) = recording_api(|_, _, _| None);
    let c = QuotaController::from_stores(
        client,
        store_of(vec![]),
        store_of(vec![held]),
        store_of(vec![namespace(Some("closed"))]),
    )
    .with_gates(store_of(vec![]), store_of(vec![]));
    let _ = c.reconcile().await;
    let reqs = requests(&r);
    let rq = "/api/v1/namespaces/a/resourcequotas/tessera-team-a";
    let order: Vec<&str> = reqs.iter().filter(|(_, p, _)| p == rq).map(|(m, _, _)| m.as_str()).collect();
    assert_eq!(order, ["PATCH", "DELETE"], "the finalizer off, then the delete: {:?}", dump(&reqs));
    assert_eq!(written(&reqs, rq).unwrap()["metadata"]["finalizers"], json!([]));
    assert_eq!(c.deleted.len(), 1, "remembered as deleted");
}
