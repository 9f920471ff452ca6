//! GpuPartitionPlan rollouts on the real control plane: kwok nodes, simulated node agents as real
//! processes, the operator as a real process with the RBAC from `config/`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tessera_crds::conditions::{CONFLICT, READY, STALLED, find};
use tessera_crds::{GpuNode, GpuPartitionPlan};
use tessera_e2e::fixtures::{
    FakeGpuNode, apply_file, create_gpu_nodes, create_namespace, http_get, install_crds, spawn_node_agent,
    spawn_operator, wait_for,
};
use tessera_e2e::process::Component;
use tessera_e2e::{ControlPlane, Identity};

const T: Duration = Duration::from_secs(120);

struct Fleet {
    cp: ControlPlane,
    admin: Client,
    _agents: Vec<Component>,
    nodes: Vec<String>,
}

/// `n` kwok nodes labelled pool=a with three simulated H100s each, and their agents.
async fn fleet(n: usize) -> Fleet {
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
    let names: Vec<String> = (0..n).map(|i| format!("gpu-{i}")).collect();
    let fake: Vec<FakeGpuNode> =
        names.iter().map(|n| FakeGpuNode::new(n, "NVIDIA-H100-80GB-HBM3", 3).label("pool", "a")).collect();
    create_gpu_nodes(&admin, &fake).await.unwrap();
    let mut agents = Vec::new();
    for n in &names {
        let state = cp.dir.join(format!("{n}.json"));
        agents.push(spawn_node_agent(&cp, n, &state, "H100-80GB,H100-80GB,H100-80GB", &[]).await.unwrap());
    }
    let nodes: Api<Node> = Api::all(admin.clone());
    for n in &names {
        wait_for(&format!("{n} advertises whole GPUs"), T, || async {
            let a = nodes.get(n).await.ok()?.status?.allocatable?;
            (a.get("nvidia.com/gpu").map(|q| q.0.as_str()) == Some("3")).then_some(())
        })
        .await
        .unwrap();
    }
    Fleet { cp, admin, _agents: agents, nodes: names }
}

fn plan(name: &str, priority: i32, max_unavailable: serde_json::Value, gpu0: serde_json::Value) -> GpuPartitionPlan {
    serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan", "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "a"}}, "priority": priority,
                 "layouts": [
                    {"gpuProduct": "H100-80GB", "gpuIndices": [0], "profiles": gpu0},
                    {"gpuProduct": "H100-80GB", "migEnabled": false}],
                 "rollout": {"maxUnavailable": max_unavailable, "drainTimeoutSeconds": 300}}
    }))
    .unwrap()
}

async fn wait_plan_ready(admin: &Client, name: &str) -> GpuPartitionPlan {
    let api: Api<GpuPartitionPlan> = Api::all(admin.clone());
    wait_for(&format!("plan {name} Ready"), Duration::from_secs(240), || async {
        let p = api.get(name).await.ok()?;
        let st = p.status.as_ref()?;
        let ready = find(&st.conditions, READY).is_some_and(|c| c.status == "True" && c.reason == "Applied");
        (ready && st.observed_generation == p.metadata.generation).then_some(p)
    })
    .await
    .unwrap()
}

/// Records the most nodes ever unschedulable at once.
fn watch_cordons(admin: &Client) -> Arc<Mutex<usize>> {
    let max = Arc::new(Mutex::new(0usize));
    let m = max.clone();
    let api: Api<Node> = Api::all(admin.clone());
    tokio::spawn(async move {
        let mut cordoned: BTreeSet<String> = BTreeSet::new();
        let mut s = watcher(api, watcher::Config::default()).applied_objects().boxed();
        while let Some(Ok(node)) = s.next().await {
            if node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false) {
                cordoned.insert(node.name_any());
            } else {
                cordoned.remove(&node.name_any());
            }
            let mut g = m.lock().unwrap();
            *g = (*g).max(cordoned.len());
        }
    });
    max
}

/// Records the fewest Running, not-terminating pods of `app` ever seen (after the first sample).
fn watch_available(admin: &Client, ns: &str, app: &str) -> Arc<Mutex<Option<usize>>> {
    let min = Arc::new(Mutex::new(None));
    let m = min.clone();
    let api: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let cfg = watcher::Config::default().labels(&format!("app={app}"));
    tokio::spawn(async move {
        let mut state: BTreeMap<String, bool> = BTreeMap::new();
        let mut synced = false;
        let mut s = watcher(api, cfg).boxed();
        while let Some(Ok(ev)) = s.next().await {
            match ev {
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                    let ok = p.metadata.deletion_timestamp.is_none()
                        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                    state.insert(p.name_any(), ok);
                }
                watcher::Event::Delete(p) => {
                    state.remove(&p.name_any());
                }
                watcher::Event::Init => {
                    state.clear();
                    synced = false;
                }
                watcher::Event::InitDone => synced = true,
            }
            if !synced {
                continue; // a (re)list in progress is not a state of the cluster
            }
            let available = state.values().filter(|v| **v).count();
            let mut g = m.lock().unwrap();
            *g = Some(g.map_or(available, |x: usize| x.min(available)));
        }
    });
    min
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_rolls_out_two_nodes_at_a_time_without_breaking_a_pdb() {
    let f = fleet(6).await;
    let admin = f.admin.clone();
    create_namespace(&admin, "serve").await.unwrap();
    let deploy: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 6, "selector": {"matchLabels": {"app": "web"}},
          "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{
            "name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}))
    .unwrap();
    Api::<Deployment>::namespaced(admin.clone(), "serve").create(&PostParams::default(), &deploy).await.unwrap();
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web"},
        "spec": {"minAvailable": 5, "selector": {"matchLabels": {"app": "web"}}}}))
    .unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), "serve");
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    wait_for("PDB allows one disruption", T, || async {
        let s = pdbs.get("web").await.ok()?.status?;
        (s.current_healthy == Some(6) && s.disruptions_allowed == Some(1)).then_some(())
    })
    .await
    .unwrap();
    let max_cordoned = watch_cordons(&admin);
    let min_available = watch_available(&admin, "serve", "web");

    // Preview first: a dry run against the live cluster.
    let the_plan = plan("inference", 0, json!(2), json!({"3g.40gb": 2}));
    let file = f.cp.dir.join("plan.yaml");
    std::fs::write(&file, serde_saphyr::to_string(&the_plan).unwrap()).unwrap();
    let out = std::process::Command::new(tessera_e2e::fixtures::workspace_binary("tessera-operator"))
        .args(["plan", "preview", "-o", "json"])
        .arg(&file)
        .env("KUBECONFIG", f.cp.kubeconfig(Identity::Admin))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let preview: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(preview[0]["changes"].as_array().unwrap().len(), 6);
    let evictions: usize =
        preview[0]["changes"].as_array().unwrap().iter().map(|c| c["evict"].as_array().unwrap().len()).sum();
    assert_eq!(evictions, 6, "every web pod uses a GPU and would be evicted");
    assert_eq!(preview[0]["capacity_before"], json!({"nvidia.com/gpu": 18}));
    assert_eq!(preview[0]["capacity_after"], json!({"nvidia.com/gpu": 12, "nvidia.com/mig-3g.40gb": 12}));
    assert!(
        Api::<GpuPartitionPlan>::all(admin.clone()).list(&Default::default()).await.unwrap().items.is_empty(),
        "preview changed nothing"
    );

    let (_op, port) = spawn_operator(&f.cp, "op-1").unwrap();
    let plans: Api<GpuPartitionPlan> = Api::all(admin.clone());
    plans.create(&PostParams::default(), &the_plan).await.unwrap();
    let p = wait_plan_ready(&admin, "inference").await;
    let st = p.status.unwrap();
    assert_eq!((st.matched_nodes, st.updated_nodes, st.failed_nodes), (6, 6, 0));

    let max = *max_cordoned.lock().unwrap();
    assert!((1..=2).contains(&max), "at most maxUnavailable=2 nodes cordoned at once, saw {max}");
    let min = min_available.lock().unwrap().unwrap();
    assert!(min >= 5, "the Deployment dropped to {min} available pods, below its PDB's minAvailable 5");
    let nodes: Api<Node> = Api::all(admin.clone());
    let gns: Api<GpuNode> = Api::all(admin.clone());
    for n in &f.nodes {
        let node = nodes.get(n).await.unwrap();
        assert!(!node.spec.unwrap().unschedulable.unwrap_or(false), "{n} left cordoned");
        let gn = gns.get(n).await.unwrap();
        let gs = gn.status.unwrap();
        let gpu0: Vec<&str> = gs.gpus[0].instances.iter().map(|i| i.profile.as_str()).collect();
        assert_eq!(gpu0, vec!["3g.40gb", "3g.40gb"], "{n}");
        assert!(!gs.gpus[1].mig_enabled && !gs.gpus[2].mig_enabled);
        assert_eq!(gs.rollout.unwrap().phase, tessera_crds::gpunode::NodePhase::Idle);
    }
    // Events: one per plan, reason and pass naming the nodes of the wave, not one per node
    // (cluster-scoped objects' events land in `default`).
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(admin.clone(), "default");
    let events = events.list(&Default::default()).await.unwrap().items;
    let on_plan = |reason: &str| -> Vec<String> {
        events
            .iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("GpuPartitionPlan"))
            .filter_map(|e| e.note.clone())
            .collect()
    };
    for reason in ["DrainStarted", "Applying", "Applied"] {
        let notes = on_plan(reason);
        // Six nodes, two at a time: at least three waves, each of them named.
        assert!((3..=6).contains(&notes.len()), "{reason}: {notes:?}");
        for n in &f.nodes {
            assert!(notes.iter().any(|note| note.contains(n.as_str())), "{reason} never names {n}: {notes:?}");
        }
    }
    let normal_on_nodes: Vec<_> = events
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Node"))
        .filter(|e| {
            e.type_.as_deref() == Some("Normal") && e.reporting_controller.as_deref() == Some("tessera-operator")
        })
        .collect();
    assert!(normal_on_nodes.is_empty(), "per-node Normal events: {normal_on_nodes:?}");
    let metrics = http_get(port, "/metrics").unwrap();
    assert!(metrics.contains("tessera_operator_reconciles_total"), "{metrics}");
    assert!(metrics.contains("tessera_operator_evictions_total"), "{metrics}");
    assert!(metrics.contains("tessera_operator_node_rollout_duration_seconds_count 6"), "{metrics}");
    assert!(http_get(port, "/readyz").unwrap().starts_with("HTTP/1.1 200"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_killed_mid_rollout_resumes_and_converges() {
    let f = fleet(3).await;
    let admin = f.admin.clone();
    let (mut op, _) = spawn_operator(&f.cp, "op-a").unwrap();
    let plans: Api<GpuPartitionPlan> = Api::all(admin.clone());
    plans.create(&PostParams::default(), &plan("p", 0, json!(1), json!({"1g.10gb": 7}))).await.unwrap();
    // Kill it as soon as a node is mid-rollout.
    let gns: Api<GpuNode> = Api::all(admin.clone());
    wait_for("a node in flight", T, || async {
        let list = gns.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .any(|g| {
                g.status.as_ref().and_then(|s| s.rollout.as_ref()).is_some_and(|r| {
                    matches!(
                        r.phase,
                        tessera_crds::gpunode::NodePhase::Draining | tessera_crds::gpunode::NodePhase::Applying
                    )
                })
            })
            .then_some(())
    })
    .await
    .unwrap();
    op.stop_now();
    let (_op2, _) = spawn_operator(&f.cp, "op-b").unwrap();
    let p = wait_plan_ready(&admin, "p").await;
    assert_eq!(p.status.unwrap().updated_nodes, 3);
    let nodes: Api<Node> = Api::all(admin.clone());
    for n in &f.nodes {
        assert!(!nodes.get(n).await.unwrap().spec.unwrap().unschedulable.unwrap_or(false), "{n} left cordoned");
    }
    // Deleting the plan releases its nodes and never reconfigures a GPU.
    plans.delete("p", &DeleteParams::default()).await.unwrap();
    wait_for("plan gone", T, || async { plans.get_opt("p").await.ok()?.is_none().then_some(()) }).await.unwrap();
    for n in &f.nodes {
        let gn = gns.get(n).await.unwrap();
        assert_eq!(gn.status.unwrap().gpus[0].instances.len(), 7, "{n} kept its layout");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_priority_plans_conflict_and_impossible_layouts_are_reported_not_applied() {
    let f = fleet(2).await;
    let admin = f.admin.clone();
    let (_op, _) = spawn_operator(&f.cp, "op").unwrap();
    let plans: Api<GpuPartitionPlan> = Api::all(admin.clone());
    plans.create(&PostParams::default(), &plan("left", 3, json!(1), json!({"7g.80gb": 1}))).await.unwrap();
    plans.create(&PostParams::default(), &plan("right", 3, json!(1), json!({"1g.10gb": 7}))).await.unwrap();
    for name in ["left", "right"] {
        let p = wait_for(&format!("{name} Conflict"), T, || async {
            let p = plans.get(name).await.ok()?;
            find(&p.status.as_ref()?.conditions, CONFLICT).filter(|c| c.status == "True").map(|_| p.clone())
        })
        .await
        .unwrap();
        let st = p.status.unwrap();
        assert_eq!(find(&st.conditions, STALLED).unwrap().reason, "Conflict");
        let other = if name == "left" { "right" } else { "left" };
        let msg = &find(&st.conditions, CONFLICT).unwrap().message;
        assert!(msg.contains(&format!("plan(s) {other} of equal priority also match node(s) gpu-0, gpu-1")), "{msg}");
        assert_eq!(find(&st.conditions, READY).unwrap().status, "False");
    }
    let gns: Api<GpuNode> = Api::all(admin.clone());
    for n in &f.nodes {
        assert!(gns.get(n).await.unwrap().spec.gpus.is_empty(), "neither plan acted on {n}");
    }
    plans.delete("left", &DeleteParams::default()).await.unwrap();
    plans.delete("right", &DeleteParams::default()).await.unwrap();

    // An impossible layout is refused by the API server (CEL rules generated from the catalog), and
    // no node is touched.
    let err = plans.create(&PostParams::default(), &plan("impossible", 0, json!(1), json!({"4g.40gb": 2}))).await;
    let msg = match err {
        Err(kube::Error::Api(s)) if s.code == 422 => s.message,
        other => panic!("expected a 422 refusal, got {other:?}"),
    };
    assert!(msg.contains("2 x 4g.40gb requested, but one H100-80GB holds at most 1"), "{msg}");
    // A pass may have run between the two creations (the periodic one, or under load), with
    // `left` owning both nodes and cordoning one: the conflict releases it. Released means
    // uncordoned, with no intent ever written.
    let nodes: Api<Node> = Api::all(admin.clone());
    for n in &f.nodes {
        wait_for(&format!("{n} schedulable"), T, || async {
            let node = nodes.get(n).await.ok()?;
            (!node.spec?.unschedulable.unwrap_or(false)).then_some(())
        })
        .await
        .unwrap();
        assert!(gns.get(n).await.unwrap().spec.gpus.is_empty());
    }
}
