//! `kubectl apply -k config/default` on the real control plane: every object is accepted and the
//! workloads land where they should.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use kube::api::{Api, PostParams};
use serde_json::json;
use tessera_e2e::fixtures::{FakeGpuNode, create_gpu_nodes, wait_for};
use tessera_e2e::{ControlPlane, Identity};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_overlay_applies_and_schedules_the_agent_on_gpu_nodes_only() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    let mut plain = FakeGpuNode::new("cpu-0", "none", 0);
    plain.labels.insert("nvidia.com/mig.capable".into(), "false".into());
    create_gpu_nodes(
        &admin,
        &[
            FakeGpuNode::new("gpu-0", "NVIDIA-H100-80GB-HBM3", 8),
            FakeGpuNode::new("gpu-1", "NVIDIA-A100-SXM4-40GB", 8),
            plain,
        ],
    )
    .await
    .unwrap();
    // The GPU Operator provides the `nvidia` RuntimeClass on a real cluster.
    let rc: k8s_openapi::api::node::v1::RuntimeClass =
        serde_json::from_value(json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"}))
            .unwrap();
    Api::<k8s_openapi::api::node::v1::RuntimeClass>::all(admin.clone())
        .create(&PostParams::default(), &rc)
        .await
        .unwrap();

    let bin = std::path::PathBuf::from(
        std::env::var("TESSERA_CONTROLPLANE_BIN").expect("make test sets TESSERA_CONTROLPLANE_BIN"),
    );
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::process::Command::new(bin.join("kubectl"))
        .args(["apply", "--server-side", "-k", "config/default"])
        .env("KUBECONFIG", cp.kubeconfig(Identity::Admin))
        .current_dir(&repo)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));

    let ds: Api<DaemonSet> = Api::namespaced(admin.clone(), "tessera-system");
    let status = wait_for("agent DaemonSet scheduled", Duration::from_secs(60), || async {
        let s = ds.get("tessera-node-agent").await.ok()?.status?;
        (s.desired_number_scheduled == 2 && s.current_number_scheduled == 2).then_some(s)
    })
    .await
    .unwrap();
    assert_eq!(status.desired_number_scheduled, 2, "GPU nodes only, not cpu-0");
    let deploy: Api<Deployment> = Api::namespaced(admin.clone(), "tessera-system");
    let d = wait_for("operator Deployment created its pods", Duration::from_secs(60), || async {
        let d = deploy.get("tessera-operator").await.ok()?;
        (d.status.as_ref()?.replicas? == 2).then_some(d)
    })
    .await
    .unwrap();
    assert_eq!(d.spec.unwrap().template.spec.unwrap().service_account_name.as_deref(), Some("tessera-operator"));
}
