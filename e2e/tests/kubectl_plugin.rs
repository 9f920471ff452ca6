//! The real `kubectl-tessera status` against the real control plane: GpuNodes written as an agent
//! and the operator would, pods scheduled onto MIG resources in tenant namespaces, and a tenant
//! whose RBAC lets it read Tessera's objects but not every pod.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tessera_crds::{GpuNode, TenantGpuQuota};
use tessera_e2e::fixtures::{
    FakeGpuNode, apply_file, create_gpu_nodes, create_namespace, install_crds, wait_for, workspace_binary,
};
use tessera_e2e::{ControlPlane, Identity};

const T: Duration = Duration::from_secs(60);

fn from_json<K: serde::de::DeserializeOwned>(v: Value) -> K {
    serde_json::from_value(v).expect("a valid object")
}

/// Creates a GpuNode and writes its status as the agent (GPUs, Ready) and the operator (rollout).
async fn write_gpunode(admin: &Client, name: &str, plan: Option<&str>, gpus: Value, rollout: Value) {
    let api: Api<GpuNode> = Api::all(admin.clone());
    let spec = match plan {
        Some(p) => json!({"plan": p}),
        None => json!({}),
    };
    api.create(
        &PostParams::default(),
        &from_json(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": name}, "spec": spec})),
    )
    .await
    .unwrap();
    let status = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "status": {
        "observedGeneration": 1, "gpus": gpus, "rollout": rollout,
        "conditions": [{"type": "Ready", "status": "True", "reason": "Applied", "message": "ok",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    api.patch_status(name, &PatchParams::apply("e2e").force(), &Patch::Apply(&status)).await.unwrap();
}

/// A pod asking the scheduler for `resource`, left to land where a node advertises it.
async fn gpu_pod(admin: &Client, ns: &str, name: &str, resource: &str) {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let pod: Pod = from_json(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {resource: "1"}}}]}}));
    pods.create(&PostParams::default(), &pod).await.unwrap();
    wait_for(&format!("{ns}/{name} running"), T, || async {
        let p = pods.get(name).await.ok()?;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await
    .unwrap();
}

/// Runs the plugin; stdout is a pipe, so its text has no colour. Returns (exit, stdout, stderr).
fn plugin(kubeconfig: &Path, args: &[&str], env_only: bool) -> (i32, String, String) {
    let mut cmd = Command::new(workspace_binary("kubectl-tessera"));
    if env_only {
        cmd.env("KUBECONFIG", kubeconfig);
    } else {
        cmd.env("KUBECONFIG", "/nonexistent").arg("--kubeconfig").arg(kubeconfig);
    }
    let out = cmd.args(args).env_remove("NO_COLOR").output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_fleet_and_who_holds_each_instance() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    install_crds(&admin).await.unwrap();
    apply_file(&admin, "config/rbac/viewer.yaml").await.unwrap();
    for ns in ["team-a", "scratch"] {
        create_namespace(&admin, ns).await.unwrap();
    }
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    quotas
        .create(&PostParams::default(), &from_json(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
            "metadata": {"name": "team-a"}, "spec": {"namespaces": ["team-a"], "hard": {"nvidia.com/mig-3g.40gb": 1}}})))
        .await
        .unwrap();
    create_gpu_nodes(
        &admin,
        &[
            FakeGpuNode::new("h100-a", "NVIDIA-H100-80GB-HBM3", 1)
                .resource("nvidia.com/mig-3g.40gb", 1)
                .resource("nvidia.com/mig-2g.20gb", 2),
            FakeGpuNode::new("a30-a", "NVIDIA-A30", 1).resource("nvidia.com/mig-1g.6gb", 2),
        ],
    )
    .await
    .unwrap();
    let inst = |p: &str, start: i32, size: i32| json!({"profile": p, "start": start, "size": size});
    write_gpunode(
        &admin,
        "h100-a",
        Some("inference"),
        json!([{"index": 0, "uuid": "GPU-h", "product": "NVIDIA H100 80GB HBM3", "migCapable": true, "migEnabled": true,
                "instances": [inst("2g.20gb", 0, 2), inst("2g.20gb", 2, 2), inst("3g.40gb", 4, 4)]}]),
        json!({"phase": "Idle", "plan": "inference"}),
    )
    .await;
    write_gpunode(
        &admin,
        "a30-a",
        None,
        json!([{"index": 0, "uuid": "GPU-a", "product": "NVIDIA A30", "migCapable": true, "migEnabled": true,
                "instances": [inst("2g.12gb", 0, 2), inst("1g.6gb", 2, 1), inst("1g.6gb", 3, 1)]}]),
        json!({"phase": "Draining", "message": "evicting 1 pod"}),
    )
    .await;
    gpu_pod(&admin, "team-a", "train", "nvidia.com/mig-3g.40gb").await;
    gpu_pod(&admin, "scratch", "try", "nvidia.com/mig-2g.20gb").await;

    // JSON, connecting through --kubeconfig.
    let kubeconfig = cp.kubeconfig(Identity::Admin).to_path_buf();
    let (code, out, err) = plugin(&kubeconfig, &["status", "-o", "json"], false);
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["nodes"][0]["name"], "a30-a");
    assert_eq!(v["nodes"][0]["phase"], "Draining");
    assert_eq!(v["nodes"][0]["gpus"][0]["slots"], "AABC", "an A30 has four memory slots");
    let h100 = &v["nodes"][1];
    assert_eq!(
        (h100["name"].as_str(), h100["phase"].as_str(), h100["plan"].as_str()),
        (Some("h100-a"), Some("Idle"), Some("inference"))
    );
    let g = &h100["gpus"][0];
    assert_eq!(g["slots"], "AABBCCCC");
    assert_eq!(g["instances"][2]["profile"], "3g.40gb");
    assert_eq!(g["instances"][2]["holder"], json!({"pod": "team-a/train", "tenant": "team-a"}));
    assert_eq!(g["instances"][2]["exact"], true, "the only 3g.40gb");
    assert_eq!(g["instances"][0]["holder"], json!({"pod": "scratch/try"}), "no quota claims scratch");
    assert_eq!(g["instances"][0]["exact"], false, "one of two 2g.20gb");
    assert_eq!(v["tenants"]["team-a"], json!({"nvidia.com/mig-3g.40gb": 1}));

    // Plain text, connecting through KUBECONFIG as kubectl does.
    let (code, text, err) = plugin(&kubeconfig, &["status"], true);
    assert_eq!(code, 0, "{text}{err}");
    assert!(!text.contains('\x1b'), "no colour into a pipe: {text}");
    assert!(text.contains("a30-a  phase Draining  ready True\n  evicting 1 pod\n"), "{text}");
    assert!(text.contains("  gpu0  A30-24GB  [AABC]   A 2g.12gb  B 1g.6gb  C 1g.6gb  (0/3 busy)"), "{text}");
    assert!(text.contains("h100-a  phase Idle  ready True  plan inference"), "{text}");
    assert!(text.contains("  gpu0  H100-80GB  [AABBCCCC]  A 2g.20gb  B 2g.20gb  C 3g.40gb  (2/3 busy)"), "{text}");
    assert!(text.contains("C  team-a  team-a/train"), "{text}");
    assert!(text.contains("A~ (no quota)  scratch/try"), "{text}");

    // A tenant who may read Tessera's objects (the tessera-view role) but not every pod: the
    // diagrams are shown, the pods it could not read are named, and the exit status says so.
    let crb: ClusterRoleBinding = from_json(json!({"apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding", "metadata": {"name": "team-a-tessera-view"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "tessera-view"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "team-a"}]}));
    Api::<ClusterRoleBinding>::all(admin.clone()).create(&PostParams::default(), &crb).await.unwrap();
    let tenant = cp.kubeconfig(Identity::TenantA).to_path_buf();
    let (code, text, err) = wait_for("the binding to take effect", T, || {
        let tenant = tenant.clone();
        async move {
            let r = plugin(&tenant, &["status"], false);
            r.1.contains("[AABBCCCC]").then_some(r)
        }
    })
    .await
    .unwrap();
    assert_eq!(code, 1, "{text}{err}");
    assert!(
        text.contains("[AABBCCCC]  A 2g.20gb  B 2g.20gb  C 3g.40gb  (busy: unknown, pods unreadable)"),
        "no pods read: which instances are busy is unknown, none is shown free: {text}"
    );
    assert!(!text.contains(" busy)") && !text.contains("free"), "{text}");
    let (code, json, _) = plugin(&tenant, &["status", "-o", "json"], false);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["holdersKnown"], false, "{json}");
    assert!(err.contains("error: cannot read pods: pods is forbidden: User \"alice@team-a\""), "{err}");
    assert!(!err.contains("gpunodes"), "{err}");
}
