//! `kubectl apply -k config/default` on the real control plane: every object is accepted and the
//! workloads land where they should.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tessera_e2e::fixtures::{FakeGpuNode, create_gpu_nodes, wait_for};
use tessera_e2e::render::{kustomize, object};
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
    assert_eq!(d.spec.template.spec.unwrap().service_account_name.as_deref(), Some("tessera-operator"));
}

fn tolerates_kwok(agent: &Value) -> bool {
    let tolerations = agent["spec"]["template"]["spec"]["tolerations"].as_array().cloned().unwrap_or_default();
    tolerations.iter().any(|t| t["key"].as_str() == Some("kwok.x-k8s.io/node"))
}

#[test]
fn the_default_overlay_runs_the_operator_non_root_read_only_without_privilege_escalation() {
    let docs = kustomize("config/default");
    let pod = &object(&docs, "Deployment", "tessera-operator")["spec"]["template"]["spec"];
    let security = &pod["securityContext"];
    assert_eq!(security["runAsNonRoot"].as_bool(), Some(true), "pod runAsNonRoot: {security:?}");
    assert!(security["runAsUser"].as_u64().is_some_and(|uid| uid > 0), "pod runAsUser non-root: {security:?}");
    assert_eq!(security["seccompProfile"]["type"].as_str(), Some("RuntimeDefault"), "pod seccompProfile: {security:?}");
    let containers = pod["containers"].as_array().expect("operator containers");
    assert!(!containers.is_empty());
    for c in containers {
        let s = &c["securityContext"];
        let name = c["name"].as_str().unwrap_or("?");
        assert_eq!(s["allowPrivilegeEscalation"].as_bool(), Some(false), "{name}: allowPrivilegeEscalation: {s:?}");
        assert_eq!(s["readOnlyRootFilesystem"].as_bool(), Some(true), "{name}: readOnlyRootFilesystem: {s:?}");
        assert_ne!(s["privileged"].as_bool(), Some(true), "{name}: privileged");
        assert_ne!(s["runAsNonRoot"].as_bool(), Some(false), "{name}: runAsNonRoot overridden to false");
        assert!(s["runAsUser"].as_u64().is_none_or(|uid| uid > 0), "{name}: runAsUser 0");
        let drop = s["capabilities"]["drop"].as_array().cloned().unwrap_or_default();
        assert!(drop.iter().any(|d| d.as_str() == Some("ALL")), "{name}: capabilities.drop ALL: {s:?}");
    }
}

#[test]
fn the_default_overlay_references_the_images_make_images_builds_and_no_test_detail() {
    let docs = kustomize("config/default");
    let tag = format!("v{}", env!("CARGO_PKG_VERSION"));
    let operator = &object(&docs, "Deployment", "tessera-operator")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(operator["image"].as_str(), Some(format!("tessera/operator:{tag}").as_str()));
    let agent = object(&docs, "DaemonSet", "tessera-node-agent");
    assert_eq!(
        agent["spec"]["template"]["spec"]["containers"][0]["image"].as_str(),
        Some(format!("tessera/node-agent:{tag}").as_str())
    );
    assert!(!tolerates_kwok(agent), "config/default is for real clusters: the kwok toleration belongs in config/kwok");
}

#[test]
fn the_kwok_overlay_is_the_default_overlay_plus_the_kwok_toleration() {
    let default = kustomize("config/default");
    let mut kwok = kustomize("config/kwok");
    let agent = kwok
        .iter_mut()
        .find(|d| {
            d["kind"].as_str() == Some("DaemonSet") && d["metadata"]["name"].as_str() == Some("tessera-node-agent")
        })
        .expect("agent DaemonSet in config/kwok");
    assert!(tolerates_kwok(agent), "config/kwok tolerates kwok.x-k8s.io/node");
    let tolerations = agent["spec"]["template"]["spec"]["tolerations"].as_array_mut().unwrap();
    tolerations.retain(|t| t["key"].as_str() != Some("kwok.x-k8s.io/node"));
    assert_eq!(kwok.len(), default.len(), "config/kwok renders a different number of objects than config/default");
    for (k, d) in kwok.iter().zip(&default) {
        assert!(
            k == d,
            "config/kwok differs from config/default by more than the toleration in {} {}",
            d["kind"].as_str().unwrap_or("?"),
            d["metadata"]["name"].as_str().unwrap_or("?")
        );
    }
}
