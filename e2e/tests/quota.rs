//! TenantGpuQuota on the real control plane: enforced by the API server's ResourceQuota admission.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tessera_crds::TenantGpuQuota;
use tessera_crds::conditions::{CAPACITY_AVAILABLE, READY, find};
use tessera_e2e::fixtures::{apply_file, create_namespace, install_crds, spawn_operator, wait_for};
use tessera_e2e::process::Component;
use tessera_e2e::{ControlPlane, Identity};

const T: Duration = Duration::from_secs(60);

async fn setup(namespaces: &[&str]) -> (ControlPlane, Client, Component) {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    install_crds(&admin).await.unwrap();
    for f in ["config/base/namespace.yaml", "config/rbac/operator.yaml", "config/rbac/viewer.yaml"] {
        apply_file(&admin, f).await.unwrap();
    }
    for ns in namespaces {
        create_namespace(&admin, ns).await.unwrap();
    }
    let (op, _) = spawn_operator(&cp, "op").unwrap();
    (cp, admin, op)
}

fn quota(name: &str, spec: serde_json::Value) -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "metadata": {"name": name}, "spec": spec}))
        .unwrap()
}

fn mig_pod(name: &str) -> Pod {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]}}))
    .unwrap()
}

/// Waits until our ResourceQuota exists in `ns` with the given hard limit and the controller-manager
/// has filled in its status (admission needs both).
async fn wait_enforced(admin: &Client, ns: &str, quota: &str, resource: &str, hard: &str) {
    let rqs: Api<ResourceQuota> = Api::namespaced(admin.clone(), ns);
    let name = tessera_operator::quota::resource_quota_name(quota);
    wait_for(&format!("{ns}/{name} enforced"), T, || async {
        let rq = rqs.get(&name).await.ok()?;
        let spec_ok = rq.spec.as_ref()?.hard.as_ref()?.get(resource).map(|q| q.0.as_str()) == Some(hard);
        let status_ok = rq.status.as_ref()?.hard.as_ref()?.get(resource).map(|q| q.0.as_str()) == Some(hard);
        (spec_ok && status_ok).then_some(())
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_over_the_quota_are_refused_with_the_quota_named_even_when_created_concurrently() {
    let (_cp, admin, _op) = setup(&["team-a", "team-a-batch"]).await;
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    quotas
        .create(
            &PostParams::default(),
            &quota(
                "team-a",
                json!({"namespaces": ["team-a", "team-a-batch"],
            "hard": {"nvidia.com/mig-1g.10gb": 7}, "split": "Explicit",
            "namespaceHard": {"team-a": {"nvidia.com/mig-1g.10gb": 5}, "team-a-batch": {"nvidia.com/mig-1g.10gb": 2}}}),
            ),
        )
        .await
        .unwrap();
    wait_enforced(&admin, "team-a", "team-a", "requests.nvidia.com/mig-1g.10gb", "5").await;
    wait_enforced(&admin, "team-a-batch", "team-a", "requests.nvidia.com/mig-1g.10gb", "2").await;

    // 20 pods at once into a namespace whose share is 5: the API server admits exactly 5.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "team-a");
    let results = futures::future::join_all((0..20).map(|i| {
        let pods = pods.clone();
        async move { pods.create(&PostParams::default(), &mig_pod(&format!("p{i}"))).await }
    }))
    .await;
    let admitted = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(admitted, 5, "exactly the share is admitted");
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        let msg = r.to_string();
        assert!(
            msg.contains("exceeded quota: tessera-team-a") || msg.contains("the object has been modified"),
            "refusal names the quota: {msg}"
        );
    }
    assert!(
        results
            .iter()
            .filter_map(|r| r.as_ref().err())
            .any(|e| e.to_string().contains("exceeded quota: tessera-team-a"))
    );
    assert_eq!(pods.list(&ListParams::default()).await.unwrap().items.len(), 5);

    // Status: usage per resource and per namespace.
    let q = wait_for("usage reported", T, || async {
        let q = quotas.get("team-a").await.ok()?;
        let st = q.status.clone()?;
        (st.resources.first()?.used == 5).then_some(st)
    })
    .await
    .unwrap();
    assert_eq!((q.resources[0].hard, q.resources[0].remaining), (7, 2));
    assert_eq!(find(&q.conditions, READY).unwrap().status, "True");

    // Drift is corrected.
    let rqs: Api<ResourceQuota> = Api::namespaced(admin.clone(), "team-a");
    rqs.patch(
        "tessera-team-a",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"hard": {"requests.nvidia.com/mig-1g.10gb": "50"}}})),
    )
    .await
    .unwrap();
    wait_enforced(&admin, "team-a", "team-a", "requests.nvidia.com/mig-1g.10gb", "5").await;

    // Deleting the quota removes what it created.
    quotas.delete("team-a", &DeleteParams::default()).await.unwrap();
    for ns in ["team-a", "team-a-batch"] {
        let rqs: Api<ResourceQuota> = Api::namespaced(admin.clone(), ns);
        wait_for(&format!("{ns} ResourceQuota removed"), T, || async {
            rqs.get_opt("tessera-team-a").await.ok()?.is_none().then_some(())
        })
        .await
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_edit_its_quota_or_resource_quota() {
    let (cp, admin, _op) = setup(&["team-a"]).await;
    Api::<TenantGpuQuota>::all(admin.clone())
        .create(
            &PostParams::default(),
            &quota("team-a", json!({"namespaces": ["team-a"], "hard": {"nvidia.com/mig-1g.10gb": 2}})),
        )
        .await
        .unwrap();
    wait_enforced(&admin, "team-a", "team-a", "requests.nvidia.com/mig-1g.10gb", "2").await;
    // The tenant is an editor of its namespace (the usual grant).
    let rb: RoleBinding =
        serde_json::from_value(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "team-a-edit", "namespace": "team-a"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "team-a"}]}))
        .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), "team-a").create(&PostParams::default(), &rb).await.unwrap();
    let tenant = cp.client(Identity::TenantA).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "team-a");
    wait_for("tenant can create pods", T, || async {
        pods.create(&PostParams::default(), &mig_pod("mine")).await.ok()
    })
    .await
    .unwrap();
    let forbidden = |e: kube::Error| matches!(e, kube::Error::Api(s) if s.code == 403);
    let rqs: Api<ResourceQuota> = Api::namespaced(tenant.clone(), "team-a");
    let raise = json!({"spec": {"hard": {"requests.nvidia.com/mig-1g.10gb": "100"}}});
    assert!(forbidden(rqs.patch("tessera-team-a", &PatchParams::default(), &Patch::Merge(&raise)).await.unwrap_err()));
    assert!(forbidden(rqs.delete("tessera-team-a", &DeleteParams::default()).await.unwrap_err()));
    let quotas: Api<TenantGpuQuota> = Api::all(tenant.clone());
    // TenantGpuQuota is cluster-scoped: no namespace role reaches it, and tenants get no cluster write.
    let raise = json!({"spec": {"hard": {"nvidia.com/mig-1g.10gb": 100}}});
    assert!(forbidden(quotas.patch("team-a", &PatchParams::default(), &Patch::Merge(&raise)).await.unwrap_err()));
    assert!(forbidden(quotas.delete("team-a", &DeleteParams::default()).await.unwrap_err()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_commitment_shows_in_capacity_available_with_the_shortfall() {
    let (_cp, admin, _op) = setup(&["a", "b"]).await;
    // The fleet: one node whose agent reported seven 1g.10gb slices.
    let gns: Api<tessera_crds::GpuNode> = Api::all(admin.clone());
    let gn: tessera_crds::GpuNode =
        serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": "gpu-0"}, "spec": {}}))
        .unwrap();
    gns.create(&PostParams::default(), &gn).await.unwrap();
    let inst: Vec<_> = (0..7).map(|i| json!({"profile": "1g.10gb", "start": i, "size": 1})).collect();
    let status = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "status": {"gpus": [
        {"index": 0, "uuid": "GPU-0", "product": "NVIDIA H100 80GB HBM3", "migCapable": true, "migEnabled": true, "instances": inst}]}});
    gns.patch_status("gpu-0", &PatchParams::apply("tessera-node-agent"), &Patch::Apply(&status)).await.unwrap();

    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    quotas
        .create(
            &PostParams::default(),
            &quota("a", json!({"namespaces": ["a"], "hard": {"nvidia.com/mig-1g.10gb": 4}})),
        )
        .await
        .unwrap();
    let ok = wait_for("a: capacity sufficient", T, || async {
        let q = quotas.get("a").await.ok()?;
        find(&q.status?.conditions, CAPACITY_AVAILABLE).filter(|c| c.status == "True").cloned()
    })
    .await
    .unwrap();
    assert_eq!(ok.reason, "Sufficient");
    quotas
        .create(
            &PostParams::default(),
            &quota("b", json!({"namespaces": ["b"], "hard": {"nvidia.com/mig-1g.10gb": 5}})),
        )
        .await
        .unwrap();
    for name in ["a", "b"] {
        let c = wait_for(&format!("{name}: over-committed"), T, || async {
            let q = quotas.get(name).await.ok()?;
            find(&q.status?.conditions, CAPACITY_AVAILABLE).filter(|c| c.status == "False").cloned()
        })
        .await
        .unwrap();
        assert_eq!(c.message, "over-committed: nvidia.com/mig-1g.10gb: quotas 9, fleet 7, short 2");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicts_long_names_and_a_users_own_resource_quota_lose_no_limit() {
    let (_cp, admin, _op) = setup(&["team-a", "team-b", "shared"]).await;
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    let mig = "requests.nvidia.com/mig-1g.10gb";
    // A 253-character quota name: longer than a label value (63) and than `tessera-<name>` allows.
    let long = format!("{}z", "l".repeat(252));
    for (name, ns) in [("team-a", "team-a"), (long.as_str(), "team-b")] {
        let spec = json!({"namespaces": [ns], "hard": {"nvidia.com/mig-1g.10gb": 3}});
        quotas.create(&PostParams::default(), &quota(name, spec)).await.unwrap();
    }
    wait_enforced(&admin, "team-a", "team-a", mig, "3").await;
    wait_enforced(&admin, "team-b", &long, mig, "3").await;

    // A GitOps typo: another quota claims team-a too. What was enforced there stays enforced.
    let typo = json!({"namespaces": ["team-a", "shared"], "hard": {"nvidia.com/mig-1g.10gb": 10}});
    quotas.create(&PostParams::default(), &quota("typo", typo)).await.unwrap();
    wait_for("Conflict reported", T, || async {
        let q = quotas.get("team-a").await.ok()?;
        find(&q.status?.conditions, tessera_crds::conditions::CONFLICT).filter(|c| c.status == "True").map(|_| ())
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await; // several operator passes
    wait_enforced(&admin, "team-a", "team-a", mig, "3").await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "team-a");
    for i in 0..3 {
        pods.create(&PostParams::default(), &mig_pod(&format!("p{i}"))).await.unwrap();
    }
    let err = pods.create(&PostParams::default(), &mig_pod("p3")).await.unwrap_err();
    assert!(err.to_string().contains("exceeded quota"), "{err}");

    // A user's own ResourceQuota that happens to carry our name is neither adopted nor deleted.
    let rqs: Api<ResourceQuota> = Api::namespaced(admin.clone(), "shared");
    let theirs: ResourceQuota = serde_json::from_value(json!({"metadata": {"name": "tessera-mine"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "1"}}}))
    .unwrap();
    rqs.create(&PostParams::default(), &theirs).await.unwrap();
    let spec = json!({"namespaces": ["shared-not-claimed-yet"], "hard": {"nvidia.com/gpu": 2}});
    quotas.create(&PostParams::default(), &quota("mine", spec)).await.unwrap();
    let patch = json!({"spec": {"namespaces": ["shared"]}});
    quotas
        .patch("typo", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"namespaces": ["team-b-x"]}})))
        .await
        .unwrap();
    quotas.patch("mine", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let msg = wait_for("ResourceQuotaNameTaken", T, || async {
        let q = quotas.get("mine").await.ok()?;
        find(&q.status?.conditions, tessera_crds::conditions::STALLED)
            .filter(|c| c.reason == "ResourceQuotaNameTaken")
            .map(|c| c.message.clone())
    })
    .await
    .unwrap();
    assert!(msg.contains("namespace shared: a ResourceQuota named tessera-mine exists"), "{msg}");
    let rq = rqs.get("tessera-mine").await.unwrap();
    assert!(rq.metadata.owner_references.is_none(), "not adopted");
    assert_eq!(rq.spec.unwrap().hard.unwrap()["requests.nvidia.com/gpu"].0, "1", "not overwritten");
}
