//! Admission on the real API server: the CEL rules generated from the MIG catalog refuse layouts
//! that cannot fit the product they name, and the node-agent fence keeps each agent's pod deletes
//! to the GPU client pods of its own node.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tessera_crds::GpuPartitionPlan;
use tessera_crds::admission::{Limits, maximal_multisets};
use tessera_crds::catalog::MODELS;
use tessera_e2e::fixtures::{FakeGpuNode, apply_file, create_gpu_nodes, install_crds, node_agent_kubeconfig, wait_for};
use tessera_e2e::{ControlPlane, Identity};

const T: Duration = Duration::from_secs(60);

fn plan(name: &str, layouts: Vec<Value>) -> GpuPartitionPlan {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan",
        "metadata": {"name": name}, "spec": {"layouts": layouts}}))
    .expect("a plan")
}

fn layout(product: &str, profiles: Value) -> Value {
    json!({"gpuProduct": product, "profiles": profiles})
}

fn counts(set: &Limits) -> Value {
    Value::Object(set.iter().map(|(k, v)| (k.to_string(), json!(v))).collect())
}

/// Creates the plan; the API server's refusal (422 Invalid) as its message, or `None` if stored.
async fn create(api: &Api<GpuPartitionPlan>, p: &GpuPartitionPlan, dry_run: bool) -> Option<String> {
    match api.create(&PostParams { dry_run, ..Default::default() }, p).await {
        Ok(_) => None,
        Err(kube::Error::Api(s)) if s.code == 422 => Some(s.message),
        Err(e) => panic!("{}: unexpected error {e}", p.name_any()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_refuses_layouts_that_cannot_fit_their_catalog_product() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    install_crds(&admin).await.unwrap();
    let plans: Api<GpuPartitionPlan> = Api::all(admin.clone());
    let refused: [(Vec<Value>, &str); 9] = [
        (
            vec![layout("H100-80GB", json!({"3g.40gb": 3}))],
            "spec.layouts[0].profiles: Invalid value: does not fit H100-80GB: 3 x 3g.40gb requested, \
             but one H100-80GB holds at most 2",
        ),
        (
            vec![layout("NVIDIA-H100-80GB-HBM3", json!({"3g.40gb": 1, "2g.10gb": 1}))],
            "does not fit H100-80GB: profiles that do not exist on H100-80GB: 2g.10gb; valid profiles: 1g.10gb, \
             1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb",
        ),
        (
            vec![layout("nvidia a30", json!({"1g.6gb": 5}))],
            "does not fit A30-24GB: 5 x 1g.6gb requested, but one A30-24GB holds at most 4",
        ),
        (
            vec![layout("A30-24GB", json!({"2g.12gb": 2, "1g.6gb": 1}))],
            "does not fit A30-24GB: the layout needs 5 compute slices, but one A30-24GB has 4",
        ),
        (
            vec![layout("NVIDIA A30", json!({"1g.6gb+me": 1, "2g.12gb+me": 1}))],
            "does not fit A30-24GB: 2 instances with media extensions (+me) requested, but a GPU holds at most one",
        ),
        (
            vec![layout("H100-80GB", json!({"1g.10gb+me": 2}))],
            "does not fit H100-80GB: 2 x 1g.10gb+me requested, but one H100-80GB holds at most 1",
        ),
        (
            vec![json!({"gpuProduct": "H100-80GB", "migEnabled": false, "profiles": {"1g.10gb": 1}})],
            "spec.layouts[0].profiles: Invalid value: profiles must be empty when migEnabled is false",
        ),
        (
            // A GFD label with its MIG suffix, padded with a no-break space, in the second layout.
            vec![
                layout("A100-40GB", json!({"7g.40gb": 1})),
                layout("\u{a0}NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", json!({"3g.20gb": 2, "1g.5gb": 1})),
            ],
            "spec.layouts[1].profiles: Invalid value: does not fit A100-40GB: the layout needs 9 memory \
             slices, but one A100-40GB has 8",
        ),
        (
            vec![layout("B200-180GB", json!({"9g.99gb": 1}))],
            "profiles that do not exist on B200-180GB: 9g.99gb (no catalog GPU has it)",
        ),
    ];
    for (i, (layouts, want)) in refused.into_iter().enumerate() {
        let p = plan(&format!("refused-{i}"), layouts);
        let msg = create(&plans, &p, false).await.unwrap_or_else(|| panic!("{} was accepted", p.name_any()));
        // Kubernetes 1.35 names the value (`Invalid value: "object": `), 1.37 does not.
        let msg = msg.replace("Invalid value: \"object\": ", "Invalid value: ");
        assert!(msg.contains(want), "{}: expected {want:?} in {msg:?}", p.name_any());
    }
    // A typo names itself, also beside a second unknown name: which of the two is named
    // first follows the API server's CEL map iteration, which is not ordered (1.35 names either).
    let p = plan("refused-typos", vec![layout("H100-80GB", json!({"3g.40b": 1, "zz.typo": 2}))]);
    let msg = create(&plans, &p, false).await.expect("refused-typos was accepted");
    assert!(
        ["3g.40b", "zz.typo"].iter().any(|t| msg.contains(&format!(
            "profiles that do not exist on H100-80GB: {t} and more that no catalog GPU has; valid profiles:"
        ))),
        "{msg}"
    );
    assert!(plans.list(&Default::default()).await.unwrap().items.is_empty(), "nothing refused was stored");

    // Products outside the catalog stay allowed; the operator checks them against the agent's table.
    let unknown = plan("new-board", vec![layout("NVIDIA RTX PRO 6000 Blackwell", json!({"3g.40gb": 3, "9g.99gb": 1}))]);
    assert_eq!(create(&plans, &unknown, false).await, None);
    // The samples still apply.
    for f in ["gpupartitionplan-inference", "gpupartitionplan-training", "tenantgpuquota-team-a"] {
        apply_file(&admin, &format!("config/samples/{f}.yaml")).await.unwrap();
    }
    assert_eq!(plans.list(&Default::default()).await.unwrap().items.len(), 3);

    // Every board: each maximal layout is admitted, and one instance more of any profile is not.
    for m in MODELS {
        let maximal = maximal_multisets(m);
        let mut grown = Vec::new();
        for set in &maximal {
            for p in m.profiles {
                let mut g = set.clone();
                *g.entry(p.name).or_default() += 1;
                grown.push(g);
            }
        }
        for chunk in maximal.chunks(32) {
            let p = plan("sweep", chunk.iter().map(|s| layout(m.name, counts(s))).collect());
            assert_eq!(create(&plans, &p, true).await, None, "{}: a maximal layout was refused", m.name);
        }
        for chunk in grown.chunks(32) {
            let p = plan("sweep", chunk.iter().map(|s| layout(m.name, counts(s))).collect());
            let msg = create(&plans, &p, true).await.unwrap_or_else(|| panic!("{}: {chunk:?} accepted", m.name));
            let refusals = msg.matches(&format!("does not fit {}: ", m.name)).count();
            assert_eq!(refusals, chunk.len(), "{}: every layout over a maximal one is refused: {msg}", m.name);
        }
    }
}

/// The GPU client apps of the agent DaemonSet's default `--gpu-client-selector` (`app in (...)`).
fn gpu_client_apps() -> Vec<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/agent/daemonset.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let arg = text.lines().find_map(|l| l.split("--gpu-client-selector=").nth(1)).expect("a default selector");
    let inner = arg.trim().strip_prefix("app in (").and_then(|s| s.strip_suffix(')')).expect("app in (...)");
    inner.split(',').map(|s| s.trim().to_string()).collect()
}

fn pod(name: &str, node: &str, app: Option<&str>) -> Pod {
    let labels = app.map(|a| json!({"app": a})).unwrap_or(json!({}));
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}}))
    .unwrap()
}

async fn client_from(kubeconfig: &std::path::Path) -> Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
    Client::try_from(config).unwrap()
}

fn refusal(e: kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 403 => s.message,
        other => panic!("expected 403 Forbidden, got {other}"),
    }
}

/// A control plane with the CRDs, the agent's RBAC and fences, and two one-GPU nodes gpu-a and
/// gpu-b.
async fn fenced_cluster() -> (ControlPlane, Client) {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    install_crds(&admin).await.unwrap();
    apply_file(&admin, "config/base/namespace.yaml").await.unwrap();
    apply_file(&admin, "config/rbac/node-agent.yaml").await.unwrap();
    apply_file(&admin, "config/rbac/node-agent-fence.yaml").await.unwrap();
    create_gpu_nodes(
        &admin,
        &[FakeGpuNode::new("gpu-a", "NVIDIA-H100-80GB-HBM3", 1), FakeGpuNode::new("gpu-b", "NVIDIA-H100-80GB-HBM3", 1)],
    )
    .await
    .unwrap();
    (cp, admin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_agent_may_delete_only_gpu_client_pods_on_its_own_node() {
    let (cp, admin) = fenced_cluster().await;
    let system: Api<Pod> = Api::namespaced(admin.clone(), "kube-system");
    let tenant: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let apps = gpu_client_apps();
    assert_eq!(apps.len(), 3, "{apps:?}");
    for (i, app) in apps.iter().enumerate() {
        system.create(&PostParams::default(), &pod(&format!("client-{i}-a"), "gpu-a", Some(app))).await.unwrap();
    }
    system.create(&PostParams::default(), &pod("plugin-b", "gpu-b", Some(&apps[0]))).await.unwrap();
    tenant.create(&PostParams::default(), &pod("inference-a", "gpu-a", Some("inference"))).await.unwrap();
    tenant.create(&PostParams::default(), &pod("bare-a", "gpu-a", None)).await.unwrap();

    // The agent of gpu-a: its service account with a token bound to a pod on gpu-a.
    let agent = client_from(&node_agent_kubeconfig(&cp, "gpu-a").await.unwrap()).await;
    let as_agent_system: Api<Pod> = Api::namespaced(agent.clone(), "kube-system");
    let as_agent_tenant: Api<Pod> = Api::namespaced(agent.clone(), "default");
    // A new admission policy takes effect asynchronously: probe with dry runs until it denies.
    let dry = DeleteParams { dry_run: true, ..Default::default() };
    wait_for("the pod fence is active", T, || async {
        as_agent_system.delete("plugin-b", &dry).await.is_err().then_some(())
    })
    .await
    .unwrap();

    let msg = refusal(as_agent_system.delete("plugin-b", &DeleteParams::default()).await.unwrap_err());
    assert!(msg.contains("token of node gpu-a, pod kube-system/plugin-b on node gpu-b"), "{msg}");
    for name in ["inference-a", "bare-a"] {
        let msg = refusal(as_agent_tenant.delete(name, &DeleteParams::default()).await.unwrap_err());
        assert!(msg.contains(&format!("pod default/{name} is not a GPU client")), "{msg}");
    }
    // The same service account without a node claim (a static token, a stolen legacy token).
    let unbound: Api<Pod> = Api::namespaced(cp.client(Identity::NodeAgent).await.unwrap(), "kube-system");
    let msg = refusal(unbound.delete("client-0-a", &DeleteParams::default()).await.unwrap_err());
    assert!(msg.contains("token of node (none)"), "{msg}");
    assert!(system.get("plugin-b").await.unwrap().metadata.deletion_timestamp.is_none(), "plugin-b untouched");
    for name in ["inference-a", "bare-a"] {
        assert!(tenant.get(name).await.unwrap().metadata.deletion_timestamp.is_none(), "{name} untouched");
    }

    // What the agent does restart: every GPU client pod on its own node.
    for i in 0..apps.len() {
        as_agent_system.delete(&format!("client-{i}-a"), &DeleteParams::default()).await.unwrap();
    }
}

/// The Node fence: an agent pauses its GPU clients through the GPU Operator's deploy labels, and
/// may change nothing else on any Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_agent_may_change_only_the_deploy_labels_of_its_own_node() {
    let (cp, admin) = fenced_cluster().await;
    let agent = client_from(&node_agent_kubeconfig(&cp, "gpu-a").await.unwrap()).await;
    let nodes: Api<Node> = Api::all(agent.clone());
    let pause = json!({"metadata": {"labels": {"nvidia.com/gpu.deploy.device-plugin": "paused-for-mig-change"}}});
    let dry = PatchParams { dry_run: true, ..Default::default() };
    wait_for("the Node fence is active", T, || async {
        nodes.patch("gpu-b", &dry, &Patch::Merge(&pause)).await.is_err().then_some(())
    })
    .await
    .unwrap();

    let msg = refusal(nodes.patch("gpu-b", &PatchParams::default(), &Patch::Merge(&pause)).await.unwrap_err());
    assert!(msg.contains("token of node gpu-a, Node gpu-b"), "{msg}");
    let unbound: Api<Node> = Api::all(cp.client(Identity::NodeAgent).await.unwrap());
    let msg = refusal(unbound.patch("gpu-a", &PatchParams::default(), &Patch::Merge(&pause)).await.unwrap_err());
    assert!(msg.contains("token of node (none)"), "{msg}");
    let refused = [
        (json!({"metadata": {"labels": {"tenant": "mine"}}}), "another label changed"),
        (json!({"metadata": {"annotations": {"x": "y"}}}), "its annotations, owners, finalizers or spec changed"),
        (json!({"spec": {"unschedulable": true}}), "its annotations, owners, finalizers or spec changed"),
    ];
    for (patch, reason) in refused {
        let msg = refusal(nodes.patch("gpu-a", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap_err());
        assert!(msg.contains(&format!("Node gpu-a, {reason}")), "{patch}: {msg}");
    }
    let admin_nodes: Api<Node> = Api::all(admin.clone());
    let labels = admin_nodes.get("gpu-b").await.unwrap().metadata.labels.unwrap_or_default();
    assert!(!labels.contains_key("nvidia.com/gpu.deploy.device-plugin"), "gpu-b untouched");

    // What the agent does: pause, then restore, its own node's deploy labels.
    nodes.patch("gpu-a", &PatchParams::default(), &Patch::Merge(&pause)).await.unwrap();
    let restore = json!({"metadata": {"labels": {"nvidia.com/gpu.deploy.device-plugin": "true"}}});
    let node = nodes.patch("gpu-a", &PatchParams::default(), &Patch::Merge(&restore)).await.unwrap();
    assert_eq!(node.labels()["nvidia.com/gpu.deploy.device-plugin"], "true");
}
