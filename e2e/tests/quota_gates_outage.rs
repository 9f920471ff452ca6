//! Gates mode when people and outages act on it, on the real API server with kube-scheduler and
//! kwok: who may write gates (SubjectAccessReview for `edit` and `admin`, a real write under a
//! wildcard role, whose deletion of a gate is undone); an admin deleting a Tessera ResourceQuota; the operator at 0 replicas while a
//! quota is renamed and a namespace is made again. No poll ever sees more GPU pods admitted in a
//! namespace than its share.

use std::time::Duration;

use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{Namespace, Pod, ResourceQuota};
use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tessera_crds::TenantGpuQuota;
use tessera_crds::gate::GpuQuotaGate;
use tessera_e2e::fixtures::{
    FakeGpuNode, apply_file, create_gpu_nodes, create_namespace, install_crds, spawn_operator_with, wait_for,
};
use tessera_e2e::{ControlPlane, Identity};

const T: Duration = Duration::from_secs(90);
const LABEL: &str = "tessera.dev/gpu-gate";
const GATES: &[(&str, &str)] = &[("TESSERA_QUOTA_ADMISSION", "gates")];

fn pod(name: &str, limits: Value) -> Pod {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}]}}))
    .unwrap()
}

fn quota(name: &str, namespaces: &[&str], gpus: i64) -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": name}, "spec": {"namespaces": namespaces, "hard": {"nvidia.com/gpu": gpus}}}))
    .unwrap()
}

/// `user`'s SubjectAccessReview for `verb` on gates in `ns`.
async fn may(admin: &Client, user: &str, verb: &str, resource: &str, ns: &str) -> bool {
    let review: SubjectAccessReview = serde_json::from_value(json!({"apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview", "spec": {"user": user, "groups": ["system:authenticated"],
            "resourceAttributes": {"namespace": ns, "verb": verb, "group": "tessera.dev", "resource": resource}}}))
    .unwrap();
    let api: Api<SubjectAccessReview> = Api::all(admin.clone());
    api.create(&PostParams::default(), &review).await.unwrap().status.unwrap().allowed
}

async fn bind(admin: &Client, ns: &str, user: &str, role: &str) {
    let rb: RoleBinding = serde_json::from_value(json!({"metadata": {"name": format!("{user}-{role}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), ns).create(&PostParams::default(), &rb).await.unwrap();
}

/// The admin's client acting as `user` (impersonation).
async fn as_user(cp: &ControlPlane, user: &str) -> Client {
    let mut config = cp.config(Identity::Admin).await.unwrap();
    config.auth_info.impersonate = Some(user.to_string());
    config.auth_info.impersonate_groups = Some(vec!["system:authenticated".to_string()]);
    Client::try_from(config).unwrap()
}

async fn label_of(namespaces: &Api<Namespace>, ns: &str) -> Option<String> {
    namespaces.get_opt(ns).await.ok().flatten()?.labels().get(LABEL).cloned()
}

/// The GPU pods of `ns` not terminating (what its ResourceQuota counts).
async fn gpu_pods(admin: &Client, ns: &str) -> usize {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let list = pods.list(&Default::default()).await.unwrap().items;
    list.iter().filter(|p| p.metadata.deletion_timestamp.is_none() && p.name_any().starts_with("gpu-")).count()
}

/// Tries `n` GPU pods in `ns` named `gpu-<tag>-<i>`; asserts no more than `share` exist after each.
async fn try_gpu_pods(admin: &Client, ns: &str, tag: &str, n: usize, share: usize) -> usize {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let mut admitted = 0;
    for i in 0..n {
        if pods
            .create(&PostParams::default(), &pod(&format!("gpu-{tag}-{i}"), json!({"nvidia.com/gpu": "1"})))
            .await
            .is_ok()
        {
            admitted += 1;
        }
        let have = gpu_pods(admin, ns).await;
        assert!(have <= share, "{have} GPU pods in {ns}, past the share of {share}");
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gates_hold_against_people_and_an_operator_at_zero_replicas() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    install_crds(&admin).await.unwrap();
    for f in [
        "config/base/namespace.yaml",
        "config/rbac/operator.yaml",
        "config/rbac/viewer.yaml",
        "config/rbac/quota-gates.yaml",
    ] {
        apply_file(&admin, f).await.unwrap();
    }
    create_gpu_nodes(&admin, &[FakeGpuNode::new("n1", "NVIDIA-H100-80GB-HBM3", 8).resource("nvidia.com/gpu", 8)])
        .await
        .unwrap();
    let class: DeviceClass = serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "mig.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}))
    .unwrap();
    Api::<DeviceClass>::all(admin.clone()).create(&PostParams::default(), &class).await.unwrap();
    for ns in ["team-a", "team-b"] {
        create_namespace(&admin, ns).await.unwrap();
    }
    let (operator, _) = spawn_operator_with(&cp, "op", GATES).unwrap();
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    quotas.create(&PostParams::default(), &quota("team", &["team-a", "team-b"], 4)).await.unwrap();
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let tenant_with = |ns: &'static str, rq: &'static str| {
        let (admin, namespaces) = (admin.clone(), namespaces.clone());
        async move {
            wait_for(&format!("{ns} a tenant's, {rq} in force"), T, || async {
                (label_of(&namespaces, ns).await.as_deref() == Some("tenant")).then_some(())?;
                let r = Api::<ResourceQuota>::namespaced(admin.clone(), ns).get_opt(rq).await.ok()??;
                r.metadata.deletion_timestamp.is_none().then_some(())?;
                let hard = r.status.as_ref()?.hard.as_ref()?;
                (hard.get("requests.nvidia.com/gpu")?.0 == "2").then_some(r.clone())
            })
            .await
            .unwrap()
        }
    };
    tenant_with("team-a", "tessera-team").await;
    let first = tenant_with("team-b", "tessera-team").await;

    // Who may write gates: not `edit` or `admin` (RBAC; once aggregation has given them
    // Tessera's read rights, so the roles are complete), a wildcard role by RBAC but not past the guard.
    bind(&admin, "team-a", "erin", "edit").await;
    bind(&admin, "team-a", "adam", "admin").await;
    wait_for("edit and admin aggregated", T, || async {
        (may(&admin, "erin", "get", "tenantgpuquotas", "team-a").await
            && may(&admin, "adam", "get", "tenantgpuquotas", "team-a").await)
            .then_some(())
    })
    .await
    .unwrap();
    for user in ["erin", "adam"] {
        for verb in ["create", "update", "patch", "delete", "deletecollection"] {
            assert!(!may(&admin, user, verb, "gpuquotagates", "team-a").await, "{user} may {verb} gates");
        }
    }
    let wildcard: ClusterRole = serde_json::from_value(json!({"metadata": {"name": "everything"},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}))
    .unwrap();
    Api::<ClusterRole>::all(admin.clone()).create(&PostParams::default(), &wildcard).await.unwrap();
    bind(&admin, "team-a", "wanda", "everything").await;
    assert!(may(&admin, "wanda", "patch", "gpuquotagates", "team-a").await, "RBAC lets a wildcard role");
    let wanda: Api<GpuQuotaGate> = Api::namespaced(as_user(&cp, "wanda").await, "team-a");
    let open_up = json!({"spec": {"over": [], "blockedPods": []}});
    let msg = wanda.patch("gpu", &PatchParams::default(), &Patch::Merge(&open_up)).await.unwrap_err().to_string();
    assert!(msg.contains("gpuquotagates are written by the Tessera operator only"), "{msg}");
    // A deletion is not guarded (the garbage collector and the namespace controller delete
    // gates): it closes the namespace until the operator writes the gate again.
    let before = wanda.get("gpu").await.unwrap().metadata.uid;
    wanda.delete("gpu", &Default::default()).await.unwrap();
    wait_for("the gate written again", T, || async {
        let again = wanda.get_opt("gpu").await.ok()??;
        (again.metadata.uid != before).then_some(())
    })
    .await
    .unwrap();

    // An admin deletes team-b's ResourceQuota: held and enforced until a new one is in force.
    assert_eq!(try_gpu_pods(&admin, "team-b", "one", 1, 2).await, 1);
    let rqs: Api<ResourceQuota> = Api::namespaced(admin.clone(), "team-b");
    rqs.delete("tessera-team", &Default::default()).await.unwrap();
    assert!(rqs.get("tessera-team").await.unwrap().metadata.deletion_timestamp.is_some(), "held by the finalizer");
    try_gpu_pods(&admin, "team-b", "two", 3, 2).await;
    let again = tenant_with("team-b", "tessera-team").await;
    assert_ne!(again.metadata.uid, first.metadata.uid, "made again");
    try_gpu_pods(&admin, "team-b", "three", 3, 2).await;

    // The operator at 0 replicas: team-b deleted (its held ResourceQuota let go) while it is up,
    // then, with it down, made again, and the quota renamed (GitOps: delete, then create).
    Api::<Pod>::namespaced(admin.clone(), "team-a")
        .create(&PostParams::default(), &pod("gpu-early", json!({"nvidia.com/gpu": "1"})))
        .await
        .unwrap();
    namespaces.delete("team-b", &Default::default()).await.unwrap();
    wait_for("team-b gone", T, || async { namespaces.get_opt("team-b").await.ok()?.is_none().then_some(()) })
        .await
        .unwrap();
    drop(operator);
    create_namespace(&admin, "team-b").await.unwrap();
    quotas.delete("team", &Default::default()).await.unwrap();
    wait_for("the old quota gone", T, || async { quotas.get_opt("team").await.ok()?.is_none().then_some(()) })
        .await
        .unwrap();
    quotas.create(&PostParams::default(), &quota("team-2", &["team-a", "team-b"], 4)).await.unwrap();
    // Let the garbage collector act on the old quota's ResourceQuotas: held, still enforced.
    let team_a: Api<ResourceQuota> = Api::namespaced(admin.clone(), "team-a");
    wait_for("team-a's old ResourceQuota deleted but held", T, || async {
        team_a.get("tessera-team").await.ok()?.metadata.deletion_timestamp.map(|_| ())
    })
    .await
    .unwrap();
    // The made-again namespace: GPU pods and claims refused, CPU pods admitted.
    assert_eq!(label_of(&namespaces, "team-b").await, None);
    assert_eq!(try_gpu_pods(&admin, "team-b", "down", 2, 0).await, 0);
    let claims: Api<ResourceClaim> = Api::namespaced(admin.clone(), "team-b");
    let claim: ResourceClaim = serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim", "metadata": {"name": "c"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}}}))
    .unwrap();
    let msg = claims.create(&PostParams::default(), &claim).await.unwrap_err().to_string();
    assert!(msg.contains("claims wait until the operator"), "{msg}");
    let cpu: Api<Pod> = Api::namespaced(admin.clone(), "team-b");
    cpu.create(&PostParams::default(), &pod("cpu", json!({"cpu": "1"}))).await.unwrap();
    // The renamed quota's namespace keeps the old limits while the operator is down (never above
    // a share that was in force): one more GPU pod, then refused.
    try_gpu_pods(&admin, "team-a", "down", 3, 2).await;
    assert_eq!(gpu_pods(&admin, "team-a").await, 2);

    // Back up: the new quota takes over both namespaces, the old ResourceQuota let go.
    let (_operator, _) = spawn_operator_with(&cp, "op-2", GATES).unwrap();
    tenant_with("team-a", "tessera-team-2").await;
    tenant_with("team-b", "tessera-team-2").await;
    wait_for("team-a's old ResourceQuota let go", T, || async {
        team_a.get_opt("tessera-team").await.ok()?.is_none().then_some(())
    })
    .await
    .unwrap();
    try_gpu_pods(&admin, "team-a", "up", 2, 2).await;
    assert_eq!(try_gpu_pods(&admin, "team-b", "up", 3, 2).await, 2, "team-b takes its share");
}
