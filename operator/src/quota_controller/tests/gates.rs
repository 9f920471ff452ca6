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

#[tokio::test]
async fn the_gate_is_written_owned_by_its_resource_quota_and_the_label_follows_once_it_is_seen() {
    // A namespace still labelled `none` that a quota now claims: the label goes, the gate is written.
    let (client, r) = recording_api(|_, _, _| None);
    let _ = controller(client, Some("none"), vec![]).reconcile().await;
    let reqs = requests(&r);
    let gate = written(&reqs, GATE).expect("the gate applied");
    assert_eq!(gate["metadata"]["ownerReferences"][0]["uid"], "rq-uid");
    assert_eq!(gate["spec"]["state"], "Enforced");
    let label = written(&reqs, NAMESPACE).expect("the none label removed");
    assert_eq!(label["metadata"]["labels"]["tessera.dev/gpu-gate"], Value::Null);

    // Next pass: the gate as written is cached; the namespace is labelled tenant, the gate not rewritten.
    let cached: GpuQuotaGate = serde_json::from_value(json!({"metadata": {"name": "gpu", "namespace": "a",
        "ownerReferences": gate["metadata"]["ownerReferences"].clone()}, "spec": gate["spec"].clone()}))
    .unwrap();
    let (client, r) = recording_api(|_, _, _| None);
    let _ = controller(client, None, vec![cached]).reconcile().await;
    let reqs = requests(&r);
    assert!(
        written(&reqs, GATE).is_none(),
        "current: {:?}",
        reqs.iter().map(|(m, p, b)| format!("{m} {p} {b}")).collect::<Vec<_>>()
    );
    let dump: Vec<String> = reqs.iter().map(|(m, p, b)| format!("{m} {p} {b}")).collect();
    assert_eq!(
        written(&reqs, NAMESPACE).unwrap_or_else(|| panic!("labelled: {dump:?}"))["metadata"]["labels"]["tessera.dev/gpu-gate"],
        "tenant"
    );
}

#[tokio::test]
async fn a_refused_gate_write_leaves_the_namespace_unlabelled_and_says_so_on_the_quota() {
    let (client, r) = recording_api(|method, path, _| {
        (method == "PATCH" && path == GATE).then(|| {
            (422, json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 422, "message": "refused"}))
        })
    });
    let result = controller(client, None, vec![]).reconcile().await;
    assert!(matches!(result, Err(crate::Error::PartialPass(_))), "{result:?}");
    let reqs = requests(&r);
    assert!(written(&reqs, NAMESPACE).is_none(), "no tenant label without the gate: {reqs:?}");
    let status = written(&reqs, "/apis/tessera.dev/v1alpha1/tenantgpuquotas/team-a/status").expect("status");
    let text = status.to_string();
    assert!(text.contains("GpuQuotaGate gpu in a: "), "{text}");
}
