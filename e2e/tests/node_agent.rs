//! The node agent against the real control plane: it runs as its own process with the RBAC from
//! `config/`, on simulated GPUs, and plays the device plugin so the real scheduler sees the slices.
//! Every test runs twice with the same assertions: on the simulator backend (`::sim`) and on the
//! real NVML backend over the simulated `libnvidia-ml.so.1` (`::nvml`).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tessera_crds::GpuNode;
use tessera_crds::conditions::{READY, STALLED, find};
use tessera_e2e::fixtures::{
    AgentBackend, FakeGpuNode, apply_file, create_gpu_nodes, install_crds, spawn_node_agent_on, wait_for,
};
use tessera_e2e::{ControlPlane, Identity};

const T: Duration = Duration::from_secs(60);

/// `name::sim` and `name::nvml`: the test body `name(backend)` on each backend.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => { $(
        mod $name {
            use super::AgentBackend;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sim() {
                super::$name(AgentBackend::Sim).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn nvml() {
                super::$name(AgentBackend::Nvml).await
            }
        }
    )* };
}

on_both_backends!(
    the_agent_applies_an_intent_reports_it_and_advertises_the_slices,
    an_agent_killed_mid_apply_converges_after_restart,
    a_busy_instance_is_not_destroyed_and_the_condition_names_the_process,
    without_the_hand_over_the_agent_destroys_nothing_and_says_it_waits,
    a_node_agent_cannot_modify_another_nodes_objects,
);

/// Makes the next agent on `state` abort mid-apply at its `k`-th chance: the simulator backend
/// after its k-th driver operation (arguments); the NVML library right before its k-th
/// compute-instance create, i.e. between the two calls that make a MIG device (a fault written
/// into the state).
fn crash_mid_apply(backend: AgentBackend, state: &std::path::Path, gpus: &str, k: u64) -> Vec<String> {
    use tessera_node_agent::backend::sim;
    match backend {
        AgentBackend::Sim => vec!["--sim-crash-after".into(), k.to_string()],
        AgentBackend::Nvml => {
            let products: Vec<String> = gpus.split(',').map(str::to_string).collect();
            sim::SimBackend::open(state, &products).unwrap();
            let function = "nvmlGpuInstanceCreateComputeInstance".to_string();
            sim::add_call_fault(state, sim::CallFault { function, nth: k, crash: true, ..Default::default() }).unwrap();
            vec![]
        }
    }
}

async fn setup(nodes: &[&str]) -> (ControlPlane, Client) {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    install_crds(&admin).await.unwrap();
    apply_file(&admin, "config/base/namespace.yaml").await.unwrap();
    apply_file(&admin, "config/rbac/node-agent.yaml").await.unwrap();
    apply_file(&admin, "config/rbac/node-agent-fence.yaml").await.unwrap();
    let fake: Vec<FakeGpuNode> = nodes.iter().map(|n| FakeGpuNode::new(n, "NVIDIA-H100-80GB-HBM3", 2)).collect();
    create_gpu_nodes(&admin, &fake).await.unwrap();
    (cp, admin)
}

/// Sets the node's intent and hands the node over (phase `Applying`), as the operator does once
/// the node is drained; returns the new generation.
async fn set_intent(admin: &Client, node: &str, gpus: serde_json::Value) -> i64 {
    let generation = set_intent_only(admin, node, gpus).await;
    hand_over(admin, node, "Applying").await;
    generation
}

/// Sets the intent without handing the node over.
async fn set_intent_only(admin: &Client, node: &str, gpus: serde_json::Value) -> i64 {
    let api: Api<GpuNode> = Api::all(admin.clone());
    let body = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "metadata": {"name": node},
                      "spec": {"plan": "test", "gpus": gpus}});
    let gn = api.patch(node, &PatchParams::apply("tessera-operator").force(), &Patch::Apply(&body)).await.unwrap();
    gn.metadata.generation.unwrap()
}

/// Writes the operator's rollout phase for the node, and cordons it for `Applying` (the agent
/// checks both before a disruptive step), uncordons it otherwise.
async fn hand_over(admin: &Client, node: &str, phase: &str) {
    let nodes: Api<Node> = Api::all(admin.clone());
    let cordon = if phase == "Applying" { json!(true) } else { serde_json::Value::Null };
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(json!({"spec": {"unschedulable": cordon}})))
        .await
        .unwrap();
    let api: Api<GpuNode> = Api::all(admin.clone());
    let body = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
                      "status": {"rollout": {"phase": phase, "plan": "test"}}});
    api.patch_status(node, &PatchParams::apply("tessera-operator").force(), &Patch::Apply(&body)).await.unwrap();
}

async fn wait_applied(admin: &Client, node: &str, generation: i64) -> GpuNode {
    let api: Api<GpuNode> = Api::all(admin.clone());
    wait_for(&format!("{node} applied generation {generation}"), T, || async {
        let gn = api.get(node).await.ok()?;
        let st = gn.status.as_ref()?;
        let ready = find(&st.conditions, READY).is_some_and(|c| c.status == "True");
        (st.observed_generation == Some(generation) && ready).then_some(gn)
    })
    .await
    .unwrap()
}

fn profiles(gn: &GpuNode, gpu: usize) -> Vec<(String, i32)> {
    let st = gn.status.as_ref().unwrap();
    st.gpus[gpu].instances.iter().map(|i| (i.profile.clone(), i.start)).collect()
}

async fn the_agent_applies_an_intent_reports_it_and_advertises_the_slices(backend: AgentBackend) {
    let (cp, admin) = setup(&["gpu-a"]).await;
    let dir = cp.dir.clone();
    let selector = ["--gpu-client-selector", "app=nvidia-device-plugin-daemonset"];
    let _agent = spawn_node_agent_on(&cp, backend, "gpu-a", &dir.join("gpu-a.json"), "H100-80GB,H100-80GB", &selector)
        .await
        .unwrap();
    // A device-plugin pod on this node: it must be restarted to see the new MIG devices.
    let system: Api<Pod> = Api::namespaced(admin.clone(), "kube-system");
    let plugin: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "nvidia-device-plugin-gpu-a", "labels": {"app": "nvidia-device-plugin-daemonset"}},
        "spec": {"nodeName": "gpu-a", "containers": [{"name": "c", "image": "x"}]}}))
    .unwrap();
    let plugin_uid = system.create(&PostParams::default(), &plugin).await.unwrap().metadata.uid;
    let api: Api<GpuNode> = Api::all(admin.clone());
    // The agent registers its node and reports the inventory before any intent exists.
    let gn = wait_for("inventory", T, || async {
        api.get("gpu-a").await.ok().filter(|g| g.status.as_ref().is_some_and(|s| s.gpus.len() == 2))
    })
    .await
    .unwrap();
    assert_eq!(gn.status.unwrap().gpus[0].product, "NVIDIA H100 80GB HBM3");
    let owner = &gn.metadata.owner_references.as_ref().expect("owned by its Node")[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Node", "gpu-a"));

    let generation = set_intent(
        &admin,
        "gpu-a",
        json!([
            {"index": 0, "migEnabled": true, "profiles": {"3g.40gb": 1, "2g.20gb": 2}},
            {"index": 1, "migEnabled": true, "profiles": {"1g.10gb": 7}},
        ]),
    )
    .await;
    let gn = wait_applied(&admin, "gpu-a", generation).await;
    hand_over(&admin, "gpu-a", "Idle").await; // done: uncordoned, as the operator finishes
    assert_eq!(profiles(&gn, 0), vec![("2g.20gb".into(), 0), ("2g.20gb".into(), 2), ("3g.40gb".into(), 4)]);
    wait_for("device plugin restarted", T, || async {
        match system.get_opt("nvidia-device-plugin-gpu-a").await.ok()? {
            None => Some(()),
            Some(p) if p.metadata.uid != plugin_uid || p.metadata.deletion_timestamp.is_some() => Some(()),
            Some(_) => None,
        }
    })
    .await
    .unwrap();
    assert_eq!(profiles(&gn, 1).len(), 7);
    let st = gn.status.unwrap();
    assert!(st.gpus[0].instances.iter().all(|i| i.uuid.as_deref().is_some_and(|u| u.starts_with("MIG-"))));

    // Played device plugin: the real scheduler sees the slices and runs a pod on one.
    let nodes: Api<Node> = Api::all(admin.clone());
    let alloc = wait_for("MIG resources advertised", T, || async {
        let a = nodes.get("gpu-a").await.ok()?.status?.allocatable?;
        a.contains_key("nvidia.com/mig-1g.10gb").then_some(a)
    })
    .await
    .unwrap();
    assert_eq!(alloc["nvidia.com/mig-1g.10gb"].0, "7");
    assert_eq!(alloc["nvidia.com/mig-2g.20gb"].0, "2");
    assert_eq!(alloc["nvidia.com/mig-3g.40gb"].0, "1");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "infer"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"}}}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    wait_for("pod Running on gpu-a", T, || async {
        let p = pods.get("infer").await.ok()?;
        (p.status?.phase.as_deref() == Some("Running") && p.spec?.node_name.as_deref() == Some("gpu-a")).then_some(())
    })
    .await
    .unwrap();

    // Back to whole GPUs on GPU 1: stale MIG resources are withdrawn.
    let generation = set_intent(
        &admin,
        "gpu-a",
        json!([
            {"index": 0, "migEnabled": true, "profiles": {"3g.40gb": 1, "2g.20gb": 2}},
            {"index": 1, "migEnabled": false},
        ]),
    )
    .await;
    wait_applied(&admin, "gpu-a", generation).await;
    let alloc = wait_for("1g.10gb withdrawn", T, || async {
        let a = nodes.get("gpu-a").await.ok()?.status?.allocatable?;
        (!a.contains_key("nvidia.com/mig-1g.10gb")).then_some(a)
    })
    .await
    .unwrap();
    assert_eq!(alloc["nvidia.com/gpu"].0, "1");
}

async fn an_agent_killed_mid_apply_converges_after_restart(backend: AgentBackend) {
    let (cp, admin) = setup(&["gpu-b"]).await;
    // Killed at several points of the same layout, each on fresh GPUs: after the k-th driver
    // operation (simulator: mode, then GPU-instance and compute-instance creates, so even k stop
    // between the two creates of a MIG device), or right before the k-th compute-instance create
    // (NVML: always between the two).
    let points: &[u64] = if backend == AgentBackend::Sim { &[2, 5, 8] } else { &[1, 3, 6] };
    for (round, &k) in points.iter().enumerate() {
        let state = cp.dir.join(format!("gpu-b-{round}.json"));
        let crash = crash_mid_apply(backend, &state, "H100-80GB", k);
        let crash: Vec<&str> = crash.iter().map(String::as_str).collect();
        // A zero count changes the generation, not the layout.
        let unused = ["2g.20gb", "3g.40gb", "4g.40gb"][round];
        let generation = set_intent(
            &admin,
            "gpu-b",
            json!([{"index": 0, "migEnabled": true, "profiles": {"1g.10gb": 7, unused: 0}}]),
        )
        .await;
        let mut agent = spawn_node_agent_on(&cp, backend, "gpu-b", &state, "H100-80GB", &crash).await.unwrap();
        let status = agent.wait_exit(T).expect("the injected crash ends the agent");
        assert!(!status.success());
        let half: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
        let made = half["gpus"][0]["instances"].as_array().unwrap().len();
        assert!(made > 0 && made < 7, "crash at {k}: a partial layout ({made} instances)");

        drop(agent);
        let _agent = spawn_node_agent_on(&cp, backend, "gpu-b", &state, "H100-80GB", &[]).await.unwrap();
        let gn = wait_applied(&admin, "gpu-b", generation).await;
        let starts: Vec<i32> = profiles(&gn, 0).iter().map(|p| p.1).collect();
        assert_eq!(starts, vec![0, 1, 2, 3, 4, 5, 6], "crash at {k}: exactly seven, no duplicates, none lost");
        let st = gn.status.unwrap();
        assert!(
            st.gpus[0].instances.iter().all(|i| i.uuid.is_some()),
            "crash at {k}: whole MIG devices: {:?}",
            st.gpus[0]
        );
    }
}

async fn a_busy_instance_is_not_destroyed_and_the_condition_names_the_process(backend: AgentBackend) {
    let (cp, admin) = setup(&["gpu-c"]).await;
    let state = cp.dir.join("gpu-c.json");
    let _agent = spawn_node_agent_on(&cp, backend, "gpu-c", &state, "H100-80GB", &[]).await.unwrap();
    let api: Api<GpuNode> = Api::all(admin.clone());
    wait_for("registered", T, || async { api.get("gpu-c").await.ok()?.status.map(|_| ()) }).await.unwrap();
    let generation =
        set_intent(&admin, "gpu-c", json!([{"index": 0, "migEnabled": true, "profiles": {"7g.80gb": 1}}])).await;
    let gn = wait_applied(&admin, "gpu-c", generation).await;
    let uuid = gn.status.unwrap().gpus[0].instances[0].uuid.clone().unwrap();
    sim_cli(&state, &["run-process", "--gpu", "0", "--mig-uuid", &uuid, "--pid", "4242"]);

    let generation =
        set_intent(&admin, "gpu-c", json!([{"index": 0, "migEnabled": true, "profiles": {"1g.10gb": 7}}])).await;
    let gn = wait_for("Stalled InstanceInUse", T, || async {
        let gn = api.get("gpu-c").await.ok()?;
        let st = gn.status.as_ref()?;
        find(&st.conditions, STALLED).filter(|c| c.status == "True" && c.reason == "InstanceInUse").map(|_| gn.clone())
    })
    .await
    .unwrap();
    let st = gn.status.unwrap();
    let stalled = find(&st.conditions, STALLED).unwrap();
    assert!(stalled.message.contains("4242") && stalled.message.contains(&uuid), "{}", stalled.message);
    assert_eq!(st.gpus[0].instances.len(), 1, "the busy 7g instance is still there");
    assert_ne!(st.observed_generation, Some(generation));

    // The workload ends: the agent converges on its next pass.
    sim_cli(&state, &["stop-process", "--pid", "4242"]);
    let gn = wait_applied(&admin, "gpu-c", generation).await;
    assert_eq!(profiles(&gn, 0).len(), 7);
    assert!(find(&gn.status.unwrap().conditions, STALLED).is_none());
}

async fn without_the_hand_over_the_agent_destroys_nothing_and_says_it_waits(backend: AgentBackend) {
    let (cp, admin) = setup(&["gpu-d"]).await;
    let state = cp.dir.join("gpu-d.json");
    let _agent = spawn_node_agent_on(&cp, backend, "gpu-d", &state, "H100-80GB", &[]).await.unwrap();
    let api: Api<GpuNode> = Api::all(admin.clone());
    wait_for("registered", T, || async { api.get("gpu-d").await.ok()?.status.map(|_| ()) }).await.unwrap();
    let generation =
        set_intent(&admin, "gpu-d", json!([{"index": 0, "migEnabled": true, "profiles": {"7g.80gb": 1}}])).await;
    wait_applied(&admin, "gpu-d", generation).await;
    // The operator withdrew the hand-over (a failed node, uncordoned): a new intent must wait.
    hand_over(&admin, "gpu-d", "Failed").await;
    let generation =
        set_intent_only(&admin, "gpu-d", json!([{"index": 0, "migEnabled": true, "profiles": {"1g.10gb": 7}}])).await;
    let gn = wait_for("Reconciling AwaitingDrain", T, || async {
        let gn = api.get("gpu-d").await.ok()?;
        let st = gn.status.as_ref()?;
        find(&st.conditions, tessera_crds::conditions::RECONCILING)
            .filter(|c| c.reason == "AwaitingDrain" && c.observed_generation == Some(generation))
            .map(|_| gn.clone())
    })
    .await
    .unwrap();
    assert_eq!(profiles(&gn, 0), vec![("7g.80gb".to_string(), 0)], "the 7g instance is untouched");
    let held: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    assert_eq!(held["gpus"][0]["instances"].as_array().unwrap().len(), 1, "the GPU itself is unchanged");
    // Handed over: it applies.
    hand_over(&admin, "gpu-d", "Applying").await;
    let gn = wait_applied(&admin, "gpu-d", generation).await;
    assert_eq!(profiles(&gn, 0).len(), 7);
    // And it renews its heartbeat lease, named after its node.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(admin.clone(), tessera_crds::gpunode::AGENT_LEASE_NAMESPACE);
    let lease = leases.get("gpu-d").await.unwrap();
    assert!(lease.spec.and_then(|s| s.renew_time).is_some());
}

/// Runs `node-agent sim ARGS --state STATE` (the workload side of the simulated GPUs).
fn sim_cli(state: &std::path::Path, args: &[&str]) {
    let out = std::process::Command::new(tessera_e2e::fixtures::workspace_binary("node-agent"))
        .arg("sim")
        .args(args)
        .arg("--state")
        .arg(state)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

async fn a_node_agent_cannot_modify_another_nodes_objects(backend: AgentBackend) {
    let (cp, admin) = setup(&["gpu-x", "gpu-y"]).await;
    let state = cp.dir.join("gpu-y.json");
    let _y = spawn_node_agent_on(&cp, backend, "gpu-y", &state, "H100-80GB", &[]).await.unwrap();
    let api: Api<GpuNode> = Api::all(admin.clone());
    wait_for("gpu-y registered", T, || async { api.get("gpu-y").await.ok()?.status.map(|_| ()) }).await.unwrap();

    // The agent identity of gpu-x: same service account, token bound to a pod on gpu-x.
    let kubeconfig = tessera_e2e::fixtures::node_agent_kubeconfig(&cp, "gpu-x").await.unwrap();
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
    let x = Client::try_from(config).unwrap();
    let as_x: Api<GpuNode> = Api::all(x.clone());
    let fake = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "status": {"gpus": []}});
    // A new admission policy takes effect asynchronously: probe with dry runs until it denies.
    let probe = PatchParams { dry_run: true, ..PatchParams::apply("tessera-node-agent").force() };
    wait_for("the fence is active", T, || async {
        as_x.patch_status("gpu-y", &probe, &Patch::Apply(&fake)).await.is_err().then_some(())
    })
    .await
    .unwrap();
    let err = as_x
        .patch_status("gpu-y", &PatchParams::apply("tessera-node-agent").force(), &Patch::Apply(&fake))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("may write only its own node") && msg.contains("token of node gpu-x, object gpu-y"), "{msg}");
    let nodes: Api<Node> = Api::all(x.clone());
    let err = nodes
        .patch_status(
            "gpu-y",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"capacity": {"nvidia.com/gpu": "99"}}})),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("may write only its own node"), "{err}");
    // Nor another node's heartbeat.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(x.clone(), tessera_crds::gpunode::AGENT_LEASE_NAMESPACE);
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "gpu-y"},
                       "spec": {"holderIdentity": "gpu-y", "leaseDurationSeconds": 40}});
    let err = leases
        .patch("gpu-y", &PatchParams::apply("tessera-node-agent").force(), &Patch::Apply(&lease))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("may write only its own node"), "{err}");
    // Its own node's object is fine.
    let own =
        json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "metadata": {"name": "gpu-x"}, "spec": {}});
    as_x.patch("gpu-x", &PatchParams::apply("tessera-node-agent"), &Patch::Apply(&own)).await.unwrap();
}
