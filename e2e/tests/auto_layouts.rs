//! Automatic plans (`spec.layoutsFrom`) on the real control plane: a tenant's quota is raised past
//! what the fleet supplies, the quota reports it, the automatic plan repartitions the idle GPUs
//! (cordon, drain, agent, uncordon), the quota is satisfied and the tenant's pods schedule, while
//! the node already running the tenant's pods is never touched.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tessera_crds::conditions::{CAPACITY_AVAILABLE, DEMAND_MET, READY, find};
use tessera_crds::{GpuNode, GpuPartitionPlan, TenantGpuQuota};
use tessera_e2e::fixtures::{
    FakeGpuNode, apply_file, create_gpu_nodes, create_namespace, http_get, install_crds, spawn_node_agent,
    spawn_operator, wait_for,
};
use tessera_e2e::{ControlPlane, Identity};

const T: Duration = Duration::from_secs(120);
const MIG1G: &str = "nvidia.com/mig-1g.10gb";

fn mig_pod(name: &str) -> Pod {
    serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "train"}},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {MIG1G: "1"}}}]}}),
    )
    .unwrap()
}

/// Waits until `names` are all Running; returns the node of each.
async fn wait_running(admin: &Client, names: &[String]) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "team");
    wait_for("the tenant's pods Running", T, || async {
        let mut nodes = Vec::new();
        for n in names {
            let p = pods.get(n).await.ok()?;
            (p.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(())?;
            nodes.push(p.spec?.node_name?);
        }
        Some(nodes)
    })
    .await
    .unwrap()
}

async fn wait_plan(admin: &Client, what: &str, check: impl Fn(&GpuPartitionPlan) -> bool) -> GpuPartitionPlan {
    let api: Api<GpuPartitionPlan> = Api::all(admin.clone());
    wait_for(what, Duration::from_secs(180), || async {
        let p = api.get("auto").await.ok()?;
        check(&p).then_some(p)
    })
    .await
    .unwrap()
}

fn applied_and_met(p: &GpuPartitionPlan, demand: i64) -> bool {
    let Some(st) = &p.status else { return false };
    let ready = find(&st.conditions, READY).is_some_and(|c| c.status == "True" && c.reason == "Applied");
    let met = find(&st.conditions, DEMAND_MET).is_some_and(|c| c.status == "True");
    let decided = st.layout_decision.as_ref().is_some_and(|d| d.demand.get(MIG1G) == Some(&demand));
    ready && met && decided && st.observed_generation == p.metadata.generation
}

/// Every node ever seen cordoned.
fn watch_cordons(admin: &Client) -> Arc<Mutex<BTreeSet<String>>> {
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let s = seen.clone();
    let api: Api<Node> = Api::all(admin.clone());
    tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default()).applied_objects().boxed();
        while let Some(Ok(node)) = stream.next().await {
            if node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false) {
                s.lock().unwrap().insert(node.name_any());
            }
        }
    });
    seen
}

/// The quota's `CapacityAvailable` statuses, in the order seen.
fn watch_capacity(admin: &Client) -> Arc<Mutex<Vec<String>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let api: Api<TenantGpuQuota> = Api::all(admin.clone());
    tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default()).applied_objects().boxed();
        while let Some(Ok(q)) = stream.next().await {
            let c = q.status.as_ref().and_then(|st| find(&st.conditions, CAPACITY_AVAILABLE).map(|c| c.status.clone()));
            if let Some(c) = c {
                let mut g = s.lock().unwrap();
                if g.last() != Some(&c) {
                    g.push(c);
                }
            }
        }
    });
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raising_a_quota_repartitions_idle_gpus_and_leaves_busy_ones_alone() {
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
    let names = ["gpu-0", "gpu-1"];
    let fake: Vec<FakeGpuNode> =
        names.iter().map(|n| FakeGpuNode::new(n, "NVIDIA-H100-80GB-HBM3", 1).label("pool", "a")).collect();
    create_gpu_nodes(&admin, &fake).await.unwrap();
    let mut agents = Vec::new();
    for n in names {
        agents.push(spawn_node_agent(&cp, n, &cp.dir.join(format!("{n}.json")), "H100-80GB", &[]).await.unwrap());
    }
    create_namespace(&admin, "team").await.unwrap();
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    let quota: TenantGpuQuota = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1",
        "kind": "TenantGpuQuota", "metadata": {"name": "team", "labels": {"tier": "training"}},
        "spec": {"namespaces": ["team"], "hard": {MIG1G: 7}}}))
    .unwrap();
    quotas.create(&PostParams::default(), &quota).await.unwrap();
    let (_op, port) = spawn_operator(&cp, "op").unwrap();
    let plan: GpuPartitionPlan = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1",
        "kind": "GpuPartitionPlan", "metadata": {"name": "auto"},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "a"}},
                 "layoutsFrom": {"quotaSelector": {"matchLabels": {"tier": "training"}}, "stabilizationSeconds": 8},
                 "rollout": {"maxUnavailable": 1, "drainTimeoutSeconds": 60}}}))
    .unwrap();
    // The API server refuses a plan with both fixed and automatic layouts, or neither.
    let plans: Api<GpuPartitionPlan> = Api::all(admin.clone());
    for spec in
        [json!({"layoutsFrom": {}, "layouts": [{"gpuProduct": "H100-80GB", "profiles": {"7g.80gb": 1}}]}), json!({})]
    {
        let bad = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan",
                         "metadata": {"name": "bad"}, "spec": spec});
        let err = plans.create(&PostParams::default(), &serde_json::from_value(bad).unwrap()).await.unwrap_err();
        assert!(err.to_string().contains("set exactly one of spec.layouts"), "{err}");
    }
    plans.create(&PostParams::default(), &plan).await.unwrap();

    // First decision: one of the two whole GPUs becomes seven 1g.10gb.
    let p = wait_plan(&admin, "the first decision applied", |p| applied_and_met(p, 7)).await;
    let d = p.status.unwrap().layout_decision.unwrap();
    assert_eq!((d.changed_gpus, d.targets.len()), (1, 1), "{d:?}");
    let busy = d.targets[0].node.clone();
    let idle = names.iter().find(|n| **n != busy).unwrap().to_string();

    // The tenant fills it: the node is now busy.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "team");
    let first: Vec<String> = (0..7).map(|i| format!("a-{i}")).collect();
    for n in &first {
        pods.create(&PostParams::default(), &mig_pod(n)).await.unwrap();
    }
    assert!(wait_running(&admin, &first).await.iter().all(|n| *n == busy), "only {busy} has 1g slices");
    let uids: Vec<String> =
        pods.list(&ListParams::default()).await.unwrap().items.iter().map(|p| p.uid().unwrap()).collect();
    let gns: Api<GpuNode> = Api::all(admin.clone());
    let busy_generation = gns.get(&busy).await.unwrap().metadata.generation;
    let cordoned = watch_cordons(&admin);
    let capacity = watch_capacity(&admin);

    // Raise the quota past the supply.
    let patch = json!({"spec": {"hard": {MIG1G: 14}}});
    quotas.patch("team", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let p = wait_plan(&admin, "the second decision applied", |p| applied_and_met(p, 14)).await;
    let st = p.status.unwrap();
    let d = st.layout_decision.unwrap();
    assert_eq!(d.targets.iter().map(|t| t.node.as_str()).collect::<Vec<_>>(), vec![idle.as_str()], "{d:?}");
    assert_eq!(d.kept_busy, vec![busy.clone()], "{d:?}");
    assert!(d.message.contains("left alone"), "{}", d.message);
    assert_eq!(st.fragmented_slices, 0, "seven 1g.10gb use every slice");
    wait_for("the quota sees the new supply", T, || async {
        let q = quotas.get("team").await.ok()?;
        find(&q.status?.conditions, CAPACITY_AVAILABLE).filter(|c| c.status == "True").map(|_| ())
    })
    .await
    .unwrap();
    let seen = capacity.lock().unwrap().clone();
    assert!(
        seen.windows(2).any(|w| w[0] == "False" && w[1] == "True"),
        "CapacityAvailable went False while short, then True: {seen:?}"
    );

    // The tenant's new pods schedule on the repartitioned node.
    let second: Vec<String> = (0..7).map(|i| format!("b-{i}")).collect();
    for n in &second {
        pods.create(&PostParams::default(), &mig_pod(n)).await.unwrap();
    }
    assert!(wait_running(&admin, &second).await.iter().all(|n| *n == idle));

    // The busy node was never touched: never cordoned, same intent, its pods never evicted.
    assert!(!cordoned.lock().unwrap().contains(&busy), "{busy} was cordoned");
    assert!(cordoned.lock().unwrap().contains(&idle), "the idle node went through the drain");
    assert_eq!(gns.get(&busy).await.unwrap().metadata.generation, busy_generation, "{busy}'s intent changed");
    let now: BTreeSet<String> =
        pods.list(&ListParams::default()).await.unwrap().items.iter().map(|p| p.uid().unwrap()).collect();
    assert!(uids.iter().all(|u| now.contains(u)), "a pod of the busy node was deleted");

    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(admin.clone(), "default");
    // Repeats of one reason on one object are one Event with a series count.
    let decided: i32 = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("LayoutsDecided"))
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum();
    assert_eq!(decided, 2, "one decision per demand, no flapping");
    let metrics = http_get(port, "/metrics").unwrap();
    assert!(metrics.contains("tessera_operator_plan_fragmented_slices{plan=\"auto\"} 0"), "{metrics}");
    drop(agents);
}
