//! Facts about the API server's admission that the quota gate design rests on
//! (`docs/design/quota-gates.md`), checked on the real kube-apiserver of each supported minor: if
//! a release changes one, this fails before the design silently stops holding.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::json;
use tessera_e2e::fixtures::{apply_file, create_namespace, wait_for};
use tessera_e2e::{ControlPlane, Identity};

const T: Duration = Duration::from_secs(60);

fn pod(name: &str, limits: serde_json::Value) -> Pod {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}]}}))
    .unwrap()
}

/// A binding with `parameterNotFoundAction: Deny` refuses every request it matches in a namespace
/// without the params, even one its policy's match conditions would skip (a CPU pod): match
/// conditions are evaluated per params object, after the params are collected. So a gate that
/// must close GPU work but not CPU work where it is missing cannot be a Deny binding's params.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_binding_without_params_refuses_requests_its_match_conditions_would_skip() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    create_namespace(&admin, "x").await.unwrap();
    apply_file(&admin, "e2e/testdata/deny-without-params.yaml").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "x");
    let cpu = |name: &str| pod(name, json!({"cpu": "1"}));
    let gpu = |name: &str| pod(name, json!({"nvidia.com/gpu": "1"}));
    // The policy is in force once a GPU pod is refused (the API server loads policies async).
    let mut n = 0;
    let refusal = wait_for("the Deny binding in force", T, || {
        n += 1;
        let (pods, name) = (pods.clone(), format!("gpu-{n}"));
        async move { pods.create(&PostParams::default(), &gpu(&name)).await.err().map(|e| e.to_string()) }
    })
    .await
    .unwrap();
    assert!(refusal.contains("no params found for policy binding with `Deny` parameterNotFoundAction"), "{refusal}");
    let cpu_refused = pods.create(&PostParams::default(), &cpu("cpu-no-params")).await.unwrap_err().to_string();
    assert!(
        cpu_refused.contains("no params found for policy binding with `Deny` parameterNotFoundAction"),
        "a CPU pod, which the match conditions skip, is refused too: {cpu_refused}"
    );

    // With the params there, the match conditions apply: the CPU pod is admitted, the GPU pod
    // judged by the params.
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("facts.tessera.dev", "v1", "FactGate"), "factgates");
    let gates: Api<DynamicObject> = Api::namespaced_with(admin.clone(), "x", &ar);
    let gate: DynamicObject = serde_json::from_value(json!({"apiVersion": "facts.tessera.dev/v1", "kind": "FactGate",
        "metadata": {"name": "gate"}, "spec": {"open": false}}))
    .unwrap();
    gates.create(&PostParams::default(), &gate).await.unwrap();
    let mut n = 0;
    wait_for("the params seen", T, || {
        n += 1;
        let (pods, name) = (pods.clone(), format!("cpu-{n}"));
        async move { pods.create(&PostParams::default(), &cpu(&name)).await.ok() }
    })
    .await
    .unwrap();
    let closed = pods.create(&PostParams::default(), &gpu("gpu-closed")).await.unwrap_err().to_string();
    assert!(closed.contains("the gate is closed"), "{closed}");
}

/// A ResourceQuota held by a finalizer after its deletion is still enforced, and its usage kept:
/// Tessera's ResourceQuotas stay in force through a quota's deletion or rename until the new
/// limits are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_quota_held_by_a_finalizer_is_still_enforced() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    create_namespace(&admin, "x").await.unwrap();
    let rqs: Api<ResourceQuota> = Api::namespaced(admin.clone(), "x");
    let rq: ResourceQuota = serde_json::from_value(json!({"metadata": {"name": "held",
        "finalizers": ["facts.tessera.dev/hold"]}, "spec": {"hard": {"requests.nvidia.com/gpu": "1"}}}))
    .unwrap();
    rqs.create(&PostParams::default(), &rq).await.unwrap();
    wait_for("the limit in force", T, || async { rqs.get("held").await.ok()?.status?.hard }).await.unwrap();
    rqs.delete("held", &Default::default()).await.unwrap();
    let held = rqs.get("held").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some(), "held by its finalizer");

    let pods: Api<Pod> = Api::namespaced(admin.clone(), "x");
    let gpu = |name: &str| pod(name, json!({"nvidia.com/gpu": "1"}));
    pods.create(&PostParams::default(), &gpu("first")).await.unwrap();
    let refused = pods.create(&PostParams::default(), &gpu("second")).await.unwrap_err().to_string();
    assert!(refused.contains("exceeded quota: held"), "the terminating ResourceQuota still limits: {refused}");
    let used = wait_for("usage counted", T, || async {
        let used = rqs.get("held").await.ok()?.status?.used?;
        used.get("requests.nvidia.com/gpu").filter(|q| q.0 == "1").cloned()
    })
    .await;
    assert!(used.is_ok(), "the quota controller keeps the terminating ResourceQuota's usage");

    let release = json!({"metadata": {"finalizers": null}});
    rqs.patch("held", &PatchParams::default(), &Patch::Merge(&release)).await.unwrap();
    wait_for("the ResourceQuota gone", T, || async { rqs.get_opt("held").await.ok()?.is_none().then_some(()) })
        .await
        .unwrap();
    pods.create(&PostParams::default(), &gpu("third")).await.expect("no limit once it is gone");
}
