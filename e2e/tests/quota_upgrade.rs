//! The upgrade from params mode (`config/rbac/claim-classes.yaml`, the params ConfigMap) to
//! gates mode, with kube-scheduler and kwok, as a platform team does it: the gate policies
//! applied beside the old ones, the operator restarted with `--quota-admission=gates`. A GPU-pod
//! creator runs throughout, and pods are deleted under it so that its pods keep being admitted
//! and bound: at no poll are more than the share bound, before, during or after. In a second
//! namespace six GPU pods made before its quota existed (no ResourceQuota counted them) have
//! their scheduling gates removed in params mode, before the switch: only the admission
//! policies, params then both then gates, keep them to the share, and at no poll are more than
//! two bound; in the end two are. At the end the
//! operator has deleted the params mode's policies, bindings and ConfigMap, and GPU pods are
//! admitted and bound again within the share.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ResourceQuota};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tessera_crds::TenantGpuQuota;
use tessera_e2e::fixtures::{
    FakeGpuNode, apply_file, create_gpu_nodes, create_namespace, install_crds, spawn_operator, spawn_operator_with,
    wait_for,
};
use tessera_e2e::{ControlPlane, Identity};

const T: Duration = Duration::from_secs(90);
const SHARE: usize = 2;
const PARAMS: [&str; 4] = ["tessera-claim-classes", "tessera-gpu-pods", "tessera-gpu-bindings", "tessera-quota-names"];

fn gpu_pod(name: &str) -> Pod {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}))
    .unwrap()
}

/// A GPU pod kube-scheduler leaves alone until its scheduling gate is removed.
fn gated_pod(name: &str) -> Pod {
    let mut pod = gpu_pod(name);
    pod.spec.as_mut().unwrap().scheduling_gates =
        Some(vec![k8s_openapi::api::core::v1::PodSchedulingGate { name: "example.com/later".into() }]);
    pod
}

/// The GPU pods bound to a node and not terminating, oldest first.
async fn bound(pods: &Api<Pod>) -> Vec<Pod> {
    let mut list: Vec<Pod> = pods
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()) && p.metadata.deletion_timestamp.is_none())
        .collect();
    list.sort_by_key(|p| p.creation_timestamp());
    list
}

/// Tries a GPU pod every 100 ms; counts those admitted.
fn creator(pods: Api<Pod>, admitted: Arc<AtomicUsize>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for n in 0.. {
            if pods.create(&PostParams::default(), &gpu_pod(&format!("c-{n:05}"))).await.is_ok() {
                admitted.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// Asserts at most the share bound, and deletes the oldest bound pod now and then so that the
/// creator's pods keep being admitted. Returns the names bound.
async fn check_and_churn(pods: &Api<Pod>, poll: usize) -> Vec<String> {
    let early = Api::<Pod>::namespaced(pods.clone().into_client(), "team-b");
    let b = bound(&early).await;
    assert!(b.len() <= SHARE, "more than the share of team-b's early pods bound at poll {poll}: {}", b.len());
    let b = bound(pods).await;
    let names: Vec<String> = b.iter().map(|p| p.name_any()).collect();
    assert!(b.len() <= SHARE, "more than the share bound at poll {poll}: {names:?}");
    if poll.is_multiple_of(8)
        && let Some(oldest) = b.first()
    {
        let _ = pods
            .delete(&oldest.name_any(), &DeleteParams { grace_period_seconds: Some(0), ..Default::default() })
            .await;
    }
    names
}

async fn params_gone(admin: &Client) -> bool {
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "tessera-system");
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(admin.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(admin.clone());
    if !matches!(cms.get_opt("tessera-claim-classes").await, Ok(None)) {
        return false;
    }
    for name in PARAMS {
        if !matches!(policies.get_opt(name).await, Ok(None)) || !matches!(bindings.get_opt(name).await, Ok(None)) {
            return false;
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upgrade_from_params_to_gates_never_binds_past_the_share_and_retires_the_params() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    install_crds(&admin).await.unwrap();
    for f in ["config/base/namespace.yaml", "config/rbac/operator.yaml", "config/rbac/claim-classes.yaml"] {
        apply_file(&admin, f).await.unwrap();
    }
    create_gpu_nodes(&admin, &[FakeGpuNode::new("n1", "NVIDIA-H100-80GB-HBM3", 8).resource("nvidia.com/gpu", 8)])
        .await
        .unwrap();
    // team-b's six GPU pods are made before any quota claims it (no ResourceQuota counts them
    // at creation): only the admission policies, params then gates, keep them to the share.
    for ns in ["team-a", "team-b"] {
        create_namespace(&admin, ns).await.unwrap();
    }
    let early: Api<Pod> = Api::namespaced(admin.clone(), "team-b");
    let (params_operator, _) = spawn_operator(&cp, "params").unwrap();
    for i in 0..6 {
        early.create(&PostParams::default(), &gated_pod(&format!("early-{i}"))).await.unwrap();
    }
    let quota = |name: &str| -> TenantGpuQuota {
        serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
            "metadata": {"name": name}, "spec": {"namespaces": [name], "hard": {"nvidia.com/gpu": SHARE}}}))
        .unwrap()
    };
    for name in ["team-a", "team-b"] {
        Api::<TenantGpuQuota>::all(admin.clone()).create(&PostParams::default(), &quota(name)).await.unwrap();
    }
    let rqs: Api<ResourceQuota> = Api::namespaced(admin.clone(), "team-a");
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "tessera-system");
    wait_for("params mode enforcing team-a", T, || async {
        let hard = rqs.get("tessera-team-a").await.ok()?.status?.hard?;
        (hard.get("requests.nvidia.com/gpu")?.0 == SHARE.to_string()).then_some(())?;
        let data = cms.get("tessera-claim-classes").await.ok()?.data?;
        (data.contains_key("team-a.quota") && data.contains_key("team-b.quota")).then_some(())
    })
    .await
    .unwrap();

    let pods: Api<Pod> = Api::namespaced(admin.clone(), "team-a");
    let admitted = Arc::new(AtomicUsize::new(0));
    let creating = creator(pods.clone(), admitted.clone());
    let mut poll = 0;
    wait_for("the share bound in params mode", T, || {
        poll += 1;
        let (pods, n) = (pods.clone(), poll);
        async move { (check_and_churn(&pods, n).await.len() == SHARE).then_some(()) }
    })
    .await
    .unwrap();

    // In params mode alone first: team-b's early pods ungated and listed in the params, never
    // more than the share bound for longer than the scheduler's longest backoff.
    wait_for("team-b's early pods in the params", T, || async {
        let pods = cms.get("tessera-claim-classes").await.ok()?.data?.get("team-b.pods")?.clone();
        (0..6).all(|i| pods.contains(&format!("early-{i}"))).then_some(())
    })
    .await
    .unwrap();
    let ungate = json!({"spec": {"schedulingGates": null}});
    for i in 0..6 {
        let patch = kube::api::Patch::Merge(&ungate);
        early.patch(&format!("early-{i}"), &kube::api::PatchParams::default(), &patch).await.unwrap();
    }
    for _ in 0..60 {
        poll += 1;
        check_and_churn(&pods, poll).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The upgrade: the gate policies beside the old ones, then the operator in gates mode.
    apply_file(&admin, "config/rbac/quota-gates.yaml").await.unwrap();
    drop(params_operator);
    let (_gates_operator, _) = spawn_operator_with(&cp, "gates", &[("TESSERA_QUOTA_ADMISSION", "gates")]).unwrap();
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    wait_for("team-a a tenant's under the gates and the params retired", Duration::from_secs(180), || {
        poll += 1;
        let (pods, n, admin, namespaces) = (pods.clone(), poll, admin.clone(), namespaces.clone());
        async move {
            check_and_churn(&pods, n).await;
            let ns = namespaces.get("team-a").await.ok()?;
            (ns.labels().get("tessera.dev/gpu-gate").map(String::as_str) == Some("tenant")).then_some(())?;
            params_gone(&admin).await.then_some(())
        }
    })
    .await
    .unwrap();
    let rq = rqs.get("tessera-team-a").await.unwrap();
    assert!(rq.finalizers().iter().any(|f| f == "tessera.dev/in-force"), "the gates mode holds its ResourceQuota");

    // GPU work goes on under the gates: a pod the creator makes from now on is admitted and bound.
    let made = pods.list(&Default::default()).await.unwrap().items;
    let since = made.iter().map(|p| p.name_any()).max().unwrap_or_default();
    wait_for("a pod made after the upgrade bound", T, || {
        poll += 1;
        let (pods, n, since) = (pods.clone(), poll, since.clone());
        async move { check_and_churn(&pods, n).await.iter().any(|p| *p > since).then_some(()) }
    })
    .await
    .unwrap();
    for n in 0..20 {
        check_and_churn(&pods, n * 8 + 1).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    creating.abort();
    assert!(admitted.load(Ordering::SeqCst) > 2 * SHARE, "the churn kept the creator's pods being admitted");
    // The share of team-b's early pods is bound (the scheduler retries the refused bindings
    // with a backoff of up to 10 s): the gates let the share through, no more.
    wait_for("two of team-b's early pods bound", T, || {
        poll += 1;
        let (pods, n, early) = (pods.clone(), poll, early.clone());
        async move {
            check_and_churn(&pods, n).await;
            (bound(&early).await.len() == SHARE).then_some(())
        }
    })
    .await
    .unwrap();
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    let c = wait_for("ClaimPolicyBound on team-a", T, || async {
        let st = quotas.get("team-a").await.ok()?.status?;
        st.conditions.into_iter().find(|c| c.type_ == "ClaimPolicyBound" && c.status == "True")
    })
    .await
    .unwrap();
    assert_eq!(c.reason, "Bound", "{c:?}");
}
