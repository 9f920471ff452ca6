//! Rollouts when things fail, on the real control plane: a node agent that dies or keeps
//! failing mid-change, pods a drain must not or cannot evict, and kube-apiserver going down
//! mid-rollout. Each scenario checks that nothing is lost (no node left cordoned by us, no GPU
//! changed on an undrained node) and that the plan says why it waits.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tessera_crds::conditions::{READY, STALLED, find};
use tessera_crds::gpunode::NodePhase;
use tessera_crds::{GpuNode, GpuPartitionPlan};
use tessera_e2e::fixtures::{
    FakeGpuNode, apply_file, create_gpu_nodes, create_namespace, install_crds, spawn_node_agent, spawn_operator,
    wait_for, wait_plan_ready,
};
use tessera_e2e::process::Component;
use tessera_e2e::{ControlPlane, Identity};

const T: Duration = Duration::from_secs(150);
/// Short heartbeat leases, so a dead agent is noticed in seconds.
const LEASE: [&str; 2] = ["--lease-duration-seconds", "6"];

async fn cluster() -> (ControlPlane, Client) {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    install_crds(&admin).await.unwrap();
    for f in [
        "config/base/namespace.yaml",
        "config/rbac/node-agent.yaml",
        "config/rbac/node-agent-fence.yaml",
        "config/rbac/operator.yaml",
    ] {
        apply_file(&admin, f).await.unwrap();
    }
    (cp, admin)
}

/// `names` kwok nodes labelled pool=a with one simulated H100 each.
async fn nodes(admin: &Client, names: &[&str]) {
    let fake: Vec<FakeGpuNode> =
        names.iter().map(|n| FakeGpuNode::new(n, "NVIDIA-H100-80GB-HBM3", 1).label("pool", "a")).collect();
    create_gpu_nodes(admin, &fake).await.unwrap();
}

async fn agent(cp: &ControlPlane, node: &str, extra: &[&str]) -> Component {
    let mut args = LEASE.to_vec();
    args.extend_from_slice(extra);
    spawn_node_agent(cp, node, &cp.dir.join(format!("{node}.json")), "H100-80GB", &args).await.unwrap()
}

async fn registered(admin: &Client, node: &str) {
    let api: Api<GpuNode> = Api::all(admin.clone());
    wait_for(&format!("{node} reports its GPUs"), T, || async {
        api.get(node).await.ok()?.status.filter(|s| !s.gpus.is_empty()).map(|_| ())
    })
    .await
    .unwrap();
}

fn plan(name: &str, rollout: serde_json::Value) -> GpuPartitionPlan {
    serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan", "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "a"}},
                 "layouts": [{"gpuProduct": "H100-80GB", "profiles": {"3g.40gb": 2}}], "rollout": rollout}
    }))
    .unwrap()
}

async fn stalled(admin: &Client, plan: &str, reason: &str) -> String {
    let api: Api<GpuPartitionPlan> = Api::all(admin.clone());
    wait_for(&format!("{plan} Stalled {reason}"), T, || async {
        let p = api.get(plan).await.ok()?;
        find(&p.status?.conditions, STALLED)
            .filter(|c| c.status == "True" && c.reason == reason)
            .map(|c| c.message.clone())
    })
    .await
    .unwrap()
}

async fn ready(admin: &Client, plan: &str) {
    wait_plan_ready(admin, plan, T).await.unwrap();
}

async fn cordoned(admin: &Client) -> BTreeMap<String, bool> {
    let nodes: Api<Node> = Api::all(admin.clone());
    let list = nodes.list(&Default::default()).await.unwrap().items;
    list.iter().map(|n| (n.name_any(), n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false))).collect()
}

async fn phase(admin: &Client, node: &str) -> Option<NodePhase> {
    let api: Api<GpuNode> = Api::all(admin.clone());
    api.get(node).await.ok()?.status?.rollout.map(|r| r.phase)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_agent_stalls_the_plan_keeps_its_node_cordoned_and_the_rollout_resumes_when_it_is_back() {
    let (cp, admin) = cluster().await;
    nodes(&admin, &["gpu-0", "gpu-1"]).await;
    // gpu-0's agent dies right after its first driver call of the change.
    let mut dying = agent(&cp, "gpu-0", &["--sim-crash-after", "1"]).await;
    let _healthy = agent(&cp, "gpu-1", &[]).await;
    registered(&admin, "gpu-0").await;
    registered(&admin, "gpu-1").await;
    let _op = spawn_operator(&cp, "op").unwrap();
    let plans: Api<GpuPartitionPlan> = Api::all(admin.clone());
    // gpu-0 sorts first, so it is the first node handed over.
    plans.create(&PostParams::default(), &plan("p", json!({"maxUnavailable": 1}))).await.unwrap();
    assert!(dying.wait_exit(T).is_some(), "the injected crash ends gpu-0's agent");

    let msg = stalled(&admin, "p", "AgentNotResponding").await;
    assert!(msg.contains("gpu-0: node agent not responding: its lease was last renewed at"), "{msg}");
    assert!(msg.contains("the node stays cordoned until the agent is back"), "{msg}");
    let gns: Api<GpuNode> = Api::all(admin.clone());
    wait_for("gpu-0 Ready=Unknown", T, || async {
        let gn = gns.get("gpu-0").await.ok()?;
        find(&gn.status?.conditions, READY)
            .filter(|c| c.status == "Unknown" && c.reason == "AgentNotResponding")
            .map(|_| ())
    })
    .await
    .unwrap();
    let c = cordoned(&admin).await;
    assert!(c["gpu-0"] && !c["gpu-1"], "gpu-0 stays cordoned and gpu-1 is not started: {c:?}");
    assert_eq!(phase(&admin, "gpu-0").await, Some(NodePhase::Applying));
    assert_ne!(phase(&admin, "gpu-1").await, Some(NodePhase::Draining));

    // The agent comes back: the rollout resumes by itself.
    let _back = agent(&cp, "gpu-0", &[]).await;
    ready(&admin, "p").await;
    let c = cordoned(&admin).await;
    assert!(!c["gpu-0"] && !c["gpu-1"], "{c:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_keeps_failing_times_out_then_finishes_when_the_driver_recovers() {
    let (cp, admin) = cluster().await;
    nodes(&admin, &["gpu-0"]).await;
    // Every driver operation after the first fails (the agent retries every pass).
    let mut failing = agent(&cp, "gpu-0", &["--sim-fail-after", "1"]).await;
    registered(&admin, "gpu-0").await;
    let _op = spawn_operator(&cp, "op").unwrap();
    let plans: Api<GpuPartitionPlan> = Api::all(admin.clone());
    plans.create(&PostParams::default(), &plan("p", json!({"applyTimeoutSeconds": 5}))).await.unwrap();
    let msg = stalled(&admin, "p", "ApplyTimeout").await;
    assert!(msg.contains("gpu-0: applying since") && msg.contains("over 5s; the agent says Retrying"), "{msg}");
    assert!(cordoned(&admin).await["gpu-0"], "a node mid-change stays cordoned");
    failing.stop_now();
    let _fixed = agent(&cp, "gpu-0", &[]).await;
    ready(&admin, "p").await;
    assert!(!cordoned(&admin).await["gpu-0"]);
}

/// A node with no kubelet (kwok does not manage it): a deleted pod stays `Terminating` forever.
async fn dead_kubelet_node(admin: &Client, name: &str) {
    let resources = json!({"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "1"});
    let node: Node = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"pool": "a", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
        "status": {"capacity": resources, "allocatable": resources}}))
    .unwrap();
    Api::<Node>::all(admin.clone()).create(&PostParams::default(), &node).await.unwrap();
}

fn gpu_pod(name: &str, node: &str, owner: Option<serde_json::Value>) -> Pod {
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x",
                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
    if let Some(o) = owner {
        pod["metadata"]["ownerReferences"] = json!([o]);
    }
    serde_json::from_value(pod).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_drain_deletes_a_pod_stuck_terminating_and_an_unmanaged_pod_blocks_every_eviction_until_the_opt_in() {
    let (cp, admin) = cluster().await;
    dead_kubelet_node(&admin, "gpu-dead").await;
    let _agent = agent(&cp, "gpu-dead", &[]).await;
    registered(&admin, "gpu-dead").await;
    create_namespace(&admin, "ml").await.unwrap();
    // A managed pod (its controller exists, so the garbage collector keeps it) and a bare one.
    let cm = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(admin.clone(), "ml")
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "owner"}})).unwrap())
        .await
        .unwrap();
    let owner = json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": cm.uid(), "controller": true});
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "ml");
    pods.create(&PostParams::default(), &gpu_pod("stuck", "gpu-dead", Some(owner.clone()))).await.unwrap();

    let _op = spawn_operator(&cp, "op").unwrap();
    let plans: Api<GpuPartitionPlan> = Api::all(admin.clone());
    let rollout = json!({"drainTimeoutSeconds": 3, "forceAfterTimeout": true});
    plans.create(&PostParams::default(), &plan("p", rollout)).await.unwrap();

    // Evicted, the pod hangs Terminating (no kubelet confirms it); after the timeout the forced
    // drain deletes it anyway, and the rollout finishes.
    wait_for("stuck pod Terminating", T, || async {
        pods.get_opt("stuck").await.ok()??.metadata.deletion_timestamp.map(|_| ())
    })
    .await
    .unwrap();
    wait_for("stuck pod force-deleted", T, || async { pods.get_opt("stuck").await.ok()?.is_none().then_some(()) })
        .await
        .unwrap();
    ready(&admin, "p").await;

    // Next change: a bare notebook pod (no controller) and a managed pod. Like kubectl drain,
    // nothing is evicted while a pod refuses, and force does not override the refusal.
    pods.create(&PostParams::default(), &gpu_pod("notebook", "gpu-dead", None)).await.unwrap();
    pods.create(&PostParams::default(), &gpu_pod("managed", "gpu-dead", Some(owner))).await.unwrap();
    let relayout = json!({"spec": {"layouts": [{"gpuProduct": "H100-80GB", "profiles": {"1g.10gb": 7}}]}});
    plans.patch("p", &PatchParams::default(), &Patch::Merge(&relayout)).await.unwrap();
    let msg = stalled(&admin, "p", "DrainTimeout").await;
    assert!(msg.contains("pod ml/notebook has no controller") && msg.contains("evictUnmanagedPods"), "{msg}");
    // Said on the node as well: its record (which `kubectl tessera status` shows) and a Warning.
    let refused = "pod ml/notebook has no controller";
    let gns: Api<GpuNode> = Api::all(admin.clone());
    wait_for("gpu-dead's record names the refused pod", T, || async {
        gns.get("gpu-dead").await.ok()?.status?.rollout?.message.contains(refused).then_some(())
    })
    .await
    .unwrap();
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(admin.clone(), "default");
    wait_for("an EvictionBlocked Warning on gpu-dead names the refused pod", T, || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("EvictionBlocked")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("gpu-dead")
                    && e.note.as_deref().is_some_and(|n| n.contains(refused))
            })
            .then_some(())
    })
    .await
    .unwrap();
    for name in ["notebook", "managed"] {
        let pod = pods.get(name).await.unwrap();
        assert!(pod.metadata.deletion_timestamp.is_none(), "{name} was evicted while the drain could not finish");
    }
    assert_eq!(phase(&admin, "gpu-dead").await, Some(NodePhase::Draining));

    // The admin opts in: both go and the node is changed.
    let opt_in = json!({"spec": {"rollout": {"evictUnmanagedPods": true}}});
    plans.patch("p", &PatchParams::default(), &Patch::Merge(&opt_in)).await.unwrap();
    ready(&admin, "p").await;
    assert!(pods.get_opt("notebook").await.unwrap().is_none() && pods.get_opt("managed").await.unwrap().is_none());
    assert!(!cordoned(&admin).await["gpu-dead"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_held_by_a_pdb_names_it_on_the_node_and_in_drain_timeout() {
    let (cp, admin) = cluster().await;
    nodes(&admin, &["gpu-0"]).await;
    let _agent = agent(&cp, "gpu-0", &[]).await;
    registered(&admin, "gpu-0").await;
    let node_api: Api<Node> = Api::all(admin.clone());
    wait_for("gpu-0 advertises its GPU", T, || async {
        let a = node_api.get("gpu-0").await.ok()?.status?.allocatable?;
        (a.get("nvidia.com/gpu").map(|q| q.0.as_str()) == Some("1")).then_some(())
    })
    .await
    .unwrap();
    create_namespace(&admin, "serve").await.unwrap();
    // One GPU pod, and a budget that allows no disruption of it.
    let deploy: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
          "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{
            "name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}))
    .unwrap();
    Api::<Deployment>::namespaced(admin.clone(), "serve").create(&PostParams::default(), &deploy).await.unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), "serve");
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}}))
    .unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    wait_for("PDB allows no disruption", T, || async {
        let s = pdbs.get("web").await.ok()?.status?;
        (s.current_healthy == Some(1) && s.disruptions_allowed == Some(0)).then_some(())
    })
    .await
    .unwrap();

    let _op = spawn_operator(&cp, "op").unwrap();
    let plans: Api<GpuPartitionPlan> = Api::all(admin.clone());
    plans.create(&PostParams::default(), &plan("p", json!({"drainTimeoutSeconds": 5}))).await.unwrap();
    // The budget is named (namespace/name) in every place a user looks.
    let named = "blocked by PodDisruptionBudget serve/web";
    let msg = stalled(&admin, "p", "DrainTimeout").await;
    assert!(msg.contains(named), "{msg}");
    let gns: Api<GpuNode> = Api::all(admin.clone());
    let record = gns.get("gpu-0").await.unwrap().status.unwrap().rollout.unwrap();
    assert_eq!(record.phase, NodePhase::Draining);
    assert!(record.message.contains(named), "{}", record.message);
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(admin.clone(), "default");
    let blocked: Vec<(String, String)> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("EvictionBlocked"))
        .map(|e| (e.regarding.and_then(|r| r.kind).unwrap_or_default(), e.note.unwrap_or_default()))
        .collect();
    for kind in ["Node", "GpuPartitionPlan"] {
        assert!(blocked.iter().any(|(k, note)| k == kind && note.contains(named)), "{kind}: {blocked:?}");
    }

    // The budget relaxed: the drain finishes, and the node's record no longer says it is held.
    pdbs.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"minAvailable": 0}}))).await.unwrap();
    ready(&admin, "p").await;
    let record = gns.get("gpu-0").await.unwrap().status.unwrap().rollout.unwrap();
    assert!(record.message.is_empty(), "{}", record.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_apiserver_down_for_20s_mid_rollout_converges() {
    let (mut cp, admin) = cluster().await;
    let names = ["gpu-0", "gpu-1", "gpu-2"];
    nodes(&admin, &names).await;
    let mut agents = Vec::new();
    for n in names {
        agents.push(agent(&cp, n, &["--sim-latency-ms", "300"]).await);
        registered(&admin, n).await;
    }
    let _op = spawn_operator(&cp, "op").unwrap();
    let plans: Api<GpuPartitionPlan> = Api::all(admin.clone());
    plans.create(&PostParams::default(), &plan("p", json!({"maxUnavailable": 1}))).await.unwrap();
    let gns: Api<GpuNode> = Api::all(admin.clone());
    wait_in_flight(&gns).await;
    cp.restart_apiserver(Duration::from_secs(20)).await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    ready(&admin, "p").await;
    let c = cordoned(&admin).await;
    assert!(c.values().all(|v| !v), "no node left cordoned: {c:?}");
    let gns: Api<GpuNode> = Api::all(admin.clone());
    for n in names {
        let st = gns.get(n).await.unwrap().status.unwrap();
        let got: Vec<&str> = st.gpus[0].instances.iter().map(|i| i.profile.as_str()).collect();
        assert_eq!(got, ["3g.40gb", "3g.40gb"], "{n}");
    }
}

/// Each node's rollout record and cordon: what only the operator writes.
async fn operator_state(admin: &Client) -> BTreeMap<String, (Option<serde_json::Value>, bool)> {
    let gns: Api<GpuNode> = Api::all(admin.clone());
    let cordons = cordoned(admin).await;
    let mut state = BTreeMap::new();
    for g in gns.list(&Default::default()).await.unwrap().items {
        let record = g.status.as_ref().and_then(|s| s.rollout.as_ref()).map(|r| serde_json::to_value(r).unwrap());
        let cordon = cordons.get(&g.name_any()).copied().unwrap_or(false);
        state.insert(g.name_any(), (record, cordon));
    }
    state
}

/// The leader's Lease is taken from it mid-rollout (another holder, just renewed, as a replica
/// that took over writes it): the old leader writes nothing more from then on, without waiting
/// for its lease manager's next read of the Lease, and whoever leads next (the old replica or a
/// new one, once the taker never renews) decides from a read made after taking the lease: the
/// rollout converges and no node is left cordoned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_lease_is_taken_writes_nothing_more_and_the_next_leader_converges() {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let (cp, admin) = cluster().await;
    let names = ["gpu-0", "gpu-1", "gpu-2"];
    nodes(&admin, &names).await;
    let mut agents = Vec::new();
    for n in names {
        agents.push(agent(&cp, n, &["--sim-latency-ms", "300"]).await);
        registered(&admin, n).await;
    }
    let _a = spawn_operator(&cp, "op-a").unwrap();
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "tessera-system");
    wait_for("op-a leads", T, || async {
        leases.get("tessera-operator").await.ok()?.spec?.holder_identity.filter(|h| h == "op-a").map(|_| ())
    })
    .await
    .unwrap();
    let plans: Api<GpuPartitionPlan> = Api::all(admin.clone());
    plans.create(&PostParams::default(), &plan("p", json!({"maxUnavailable": 1}))).await.unwrap();
    let gns: Api<GpuNode> = Api::all(admin.clone());
    wait_in_flight(&gns).await;
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let taken = json!({"spec": {"holderIdentity": "taker", "acquireTime": now, "renewTime": now,
                                "leaseDurationSeconds": 30}});
    leases.patch("tessera-operator", &PatchParams::default(), &Patch::Merge(&taken)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await; // a write already sent lands
    let before = operator_state(&admin).await;
    // The agent finishes its change meanwhile: a leader would move the record on.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(operator_state(&admin).await, before, "the old leader wrote after its lease was taken");
    let _b = spawn_operator(&cp, "op-b").unwrap();
    ready(&admin, "p").await;
    let c = cordoned(&admin).await;
    assert!(c.values().all(|v| !v), "no node left cordoned: {c:?}");
    for n in names {
        let st = gns.get(n).await.unwrap().status.unwrap();
        let got: Vec<&str> = st.gpus[0].instances.iter().map(|i| i.profile.as_str()).collect();
        assert_eq!(got, ["3g.40gb", "3g.40gb"], "{n}");
    }
}

/// Waits until some node is mid-change (`Draining` or `Applying`).
async fn wait_in_flight(gns: &Api<GpuNode>) {
    wait_for("a node in flight", T, || async {
        let list = gns.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .any(|g| {
                g.status
                    .as_ref()
                    .and_then(|s| s.rollout.as_ref())
                    .is_some_and(|r| matches!(r.phase, NodePhase::Draining | NodePhase::Applying))
            })
            .then_some(())
    })
    .await
    .unwrap();
}
