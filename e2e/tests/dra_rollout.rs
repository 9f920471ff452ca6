//! Rollouts, automatic layouts, the CLI and quotas when pods hold GPUs through DRA ResourceClaims,
//! on the real control plane: the simulated NVIDIA DRA driver publishes the node's MIG devices,
//! kube-scheduler allocates claims from them, the resource-claim controller makes claims from
//! templates, and the operator and node agents run as real processes.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, ResourceQuota};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tessera_crds::conditions::{DEMAND_MET, READY, find};
use tessera_crds::gpunode::NodePhase;
use tessera_crds::{GpuNode, GpuPartitionPlan, TenantGpuQuota};
use tessera_e2e::dra::{
    self, MIG_CLASS, SIM_DRA_LABEL, allocated_devices, device_names, profile_selector, spawn_sim_dra_driver,
    wait_pod_claim_allocated, wait_slice,
};
use tessera_e2e::fixtures::{
    FakeGpuNode, apply_file, create_gpu_nodes, create_namespace, install_crds, spawn_node_agent, spawn_operator,
    wait_for, workspace_binary,
};
use tessera_e2e::process::Component;
use tessera_e2e::{ControlPlane, Identity};

const T: Duration = Duration::from_secs(120);
const MIG1G: &str = "nvidia.com/mig-1g.10gb";
const MIG3G: &str = "nvidia.com/mig-3g.40gb";

/// A control plane with Tessera's CRDs, RBAC and NVIDIA's DeviceClasses, the kwok node `gpu-0`
/// (pool=a, one H100, opted in to the simulated driver) and its agent.
async fn cluster(extra_rbac: &[&str]) -> (ControlPlane, Client, Component) {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    install_crds(&admin).await.unwrap();
    let base = [
        "config/base/namespace.yaml",
        "config/rbac/node-agent.yaml",
        "config/rbac/node-agent-fence.yaml",
        "config/rbac/operator.yaml",
    ];
    for f in base.iter().chain(extra_rbac) {
        apply_file(&admin, f).await.unwrap();
    }
    let node = FakeGpuNode::new("gpu-0", "NVIDIA-H100-80GB-HBM3", 1).label("pool", "a").label(SIM_DRA_LABEL, "true");
    create_gpu_nodes(&admin, &[node]).await.unwrap();
    let agent = spawn_node_agent(&cp, "gpu-0", &cp.dir.join("gpu-0.json"), "H100-80GB", &[]).await.unwrap();
    wait_for("gpu-0 reports its GPU", T, || async {
        let st = Api::<GpuNode>::all(admin.clone()).get("gpu-0").await.ok()?.status?;
        (st.gpus.len() == 1).then_some(())
    })
    .await
    .unwrap();
    dra::apply_device_classes(&admin).await.unwrap();
    (cp, admin, agent)
}

/// A fixed plan over pool=a: GPU 0 of every H100 gets `profiles`; drains take their time.
fn plan(name: &str, profiles: Value) -> GpuPartitionPlan {
    serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan", "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "a"}},
                 "layouts": [{"gpuProduct": "H100-80GB", "profiles": profiles}],
                 "rollout": {"maxUnavailable": 1, "drainTimeoutSeconds": 300}}}))
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

/// The profiles gpu-0's agent reports on GPU 0.
async fn reported(admin: &Client) -> Vec<String> {
    let st = Api::<GpuNode>::all(admin.clone()).get("gpu-0").await.unwrap().status.unwrap();
    st.gpus[0].instances.iter().map(|i| i.profile.clone()).collect()
}

/// Plan `p` makes seven 1g.10gb on gpu-0 (the operator runs from here on); the simulated driver
/// then publishes them. Returns the operator and the driver.
async fn seven_1g_published(cp: &ControlPlane, admin: &Client) -> (Component, Component) {
    let (op, _) = spawn_operator(cp, "op").unwrap();
    let plans: Api<GpuPartitionPlan> = Api::all(admin.clone());
    plans.create(&PostParams::default(), &plan("p", json!({"1g.10gb": 7}))).await.unwrap();
    wait_plan_ready(admin, "p").await;
    let driver = spawn_sim_dra_driver(cp).unwrap();
    wait_slice(admin, "gpu-0", T, |s| device_names(s).len() == 7).await.unwrap();
    (op, driver)
}

/// A ReplicaSet `train` in `ns` of `replicas` pods kept to gpu-0, each with its own claim (from
/// a template) for one 1g.10gb of NVIDIA's MIG class; waits until each is bound with its claim
/// allocated from gpu-0's pool. Returns the pods.
async fn claim_pods(admin: &Client, ns: &str, replicas: i32) -> Vec<Pod> {
    create_namespace(admin, ns).await.unwrap();
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(admin.clone(), ns);
    let template = dra::claim_template(ns, "one-1g", MIG_CLASS, Some(&profile_selector("1g.10gb")), 1);
    templates.create(&PostParams::default(), &template).await.unwrap();
    let pod = dra::on_node(dra::pod_with_claim_template(ns, "train", "one-1g"), "gpu-0");
    let rs = dra::replica_set(ns, "train", replicas, &pod);
    Api::<ReplicaSet>::namespaced(admin.clone(), ns).create(&PostParams::default(), &rs).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let bound = wait_for("the claim pods bound and Running", T, || async {
        let list = pods.list(&ListParams::default().labels("app=train")).await.ok()?.items;
        let ok = |p: &Pod| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("gpu-0")
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        };
        (list.len() == replicas as usize && list.iter().all(ok)).then_some(list)
    })
    .await
    .unwrap();
    for p in &bound {
        let claim = wait_pod_claim_allocated(admin, ns, &p.name_any(), T).await.unwrap();
        let devices = allocated_devices(&claim);
        assert_eq!(devices.len(), 1, "{devices:?}");
        assert_eq!(devices[0].1, "gpu-0", "allocated from gpu-0's pool: {devices:?}");
    }
    bound
}

/// Sets `slot` to the first instant `seen` holds for an object the watch reports.
fn first_seen<K>(
    api: Api<K>,
    slot: Arc<Mutex<Option<Instant>>>,
    seen: impl Fn(&watcher::Event<K>) -> bool + Send + 'static,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    tokio::spawn(async move {
        let mut s = watcher(api, watcher::Config::default()).boxed();
        while let Some(Ok(ev)) = s.next().await {
            if seen(&ev) {
                slot.lock().unwrap().get_or_insert_with(Instant::now);
            }
        }
    });
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_set_pod_holding_a_mig_device_through_a_claim_is_evicted_before_the_layout_changes_and_its_pdb_holds_the_drain()
 {
    let (cp, admin, _agent) = cluster(&[]).await;
    let (_op, _driver) = seven_1g_published(&cp, &admin).await;
    let pods = claim_pods(&admin, "team", 1).await;
    let old_uid = pods[0].uid().unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), "team");
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "train"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "train"}}}}))
    .unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    wait_for("PDB allows no disruption", T, || async {
        let s = pdbs.get("train").await.ok()?.status?;
        (s.current_healthy == Some(1) && s.disruptions_allowed == Some(0)).then_some(())
    })
    .await
    .unwrap();

    // When the old pod is first seen going, when the agent is first handed the node, and when
    // the node first reports the new layout.
    let (gone, handed, changed) = (Arc::default(), Arc::default(), Arc::default());
    let uid = old_uid.clone();
    first_seen(Api::<Pod>::namespaced(admin.clone(), "team"), Arc::clone(&gone), move |ev| match ev {
        watcher::Event::Delete(p) => p.uid().as_deref() == Some(uid.as_str()),
        watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
            p.uid().as_deref() == Some(uid.as_str()) && p.metadata.deletion_timestamp.is_some()
        }
        _ => false,
    });
    let gn_event = |check: fn(&GpuNode) -> bool| {
        move |ev: &watcher::Event<GpuNode>| match ev {
            watcher::Event::Apply(g) | watcher::Event::InitApply(g) => g.name_any() == "gpu-0" && check(g),
            _ => false,
        }
    };
    let gns: Api<GpuNode> = Api::all(admin.clone());
    first_seen(
        gns.clone(),
        Arc::clone(&handed),
        gn_event(|g| {
            g.status.as_ref().and_then(|s| s.rollout.as_ref()).is_some_and(|r| r.phase == NodePhase::Applying)
        }),
    );
    first_seen(
        gns.clone(),
        Arc::clone(&changed),
        gn_event(|g| {
            g.status.as_ref().is_some_and(|s| s.gpus.iter().any(|g| g.instances.iter().any(|i| i.profile == "3g.40gb")))
        }),
    );

    // The layout changes under the pod: the drain is held by the budget, naming it.
    let plans: Api<GpuPartitionPlan> = Api::all(admin.clone());
    let layouts = json!({"spec": {"layouts": [{"gpuProduct": "H100-80GB", "profiles": {"3g.40gb": 2}}]}});
    plans.patch("p", &PatchParams::default(), &Patch::Merge(&layouts)).await.unwrap();
    let named = "blocked by PodDisruptionBudget team/train";
    wait_for("gpu-0's drain held by the budget", T, || async {
        let r = gns.get("gpu-0").await.ok()?.status?.rollout?;
        (r.phase == NodePhase::Draining && r.message.contains(named)).then_some(())
    })
    .await
    .unwrap();
    let node = Api::<Node>::all(admin.clone()).get("gpu-0").await.unwrap();
    assert!(node.spec.unwrap().unschedulable.unwrap_or(false), "gpu-0 is cordoned while it drains");
    let team: Api<Pod> = Api::namespaced(admin.clone(), "team");
    let now: Vec<String> =
        team.list(&ListParams::default()).await.unwrap().items.iter().filter_map(|p| p.uid()).collect();
    assert_eq!(now, vec![old_uid.clone()], "the budget keeps the claim pod");
    assert!(gone.lock().unwrap().is_none(), "the pod was deleted past its budget");
    assert!(handed.lock().unwrap().is_none(), "gpu-0 was handed to its agent while the claim pod ran");
    assert_eq!(reported(&admin).await, vec!["1g.10gb"; 7], "gpu-0's layout changed under the claim pod");

    // The budget relaxed: the pod is evicted (the ReplicaSet makes a new one), then the layout
    // changes, and the node is uncordoned.
    pdbs.patch("train", &PatchParams::default(), &Patch::Merge(json!({"spec": {"minAvailable": 0}}))).await.unwrap();
    wait_plan_ready(&admin, "p").await;
    let (gone, handed, changed) =
        (gone.lock().unwrap().expect("the claim pod was evicted"), *handed.lock().unwrap(), *changed.lock().unwrap());
    let handed = handed.expect("gpu-0 was handed to its agent");
    assert!(gone < handed, "the claim pod was evicted before gpu-0 went to its agent");
    assert!(handed <= changed.expect("the new layout reported"));
    assert_eq!(reported(&admin).await, vec!["3g.40gb"; 2]);
    let node = Api::<Node>::all(admin.clone()).get("gpu-0").await.unwrap();
    assert!(!node.spec.unwrap().unschedulable.unwrap_or(false), "gpu-0 left cordoned");
    let now: Vec<String> = wait_for("the ReplicaSet's replacement", T, || async {
        let uids: Vec<String> =
            team.list(&ListParams::default()).await.ok()?.items.iter().filter_map(|p| p.uid()).collect();
        (uids.len() == 1).then_some(uids)
    })
    .await
    .unwrap();
    assert_ne!(now[0], old_uid, "a new pod replaced the evicted one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn automatic_layouts_keep_a_node_whose_pod_holds_a_gpu_claim_busy() {
    let (cp, admin, _agent) = cluster(&[]).await;
    create_namespace(&admin, "team").await.unwrap();
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    let quota: TenantGpuQuota = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1",
        "kind": "TenantGpuQuota", "metadata": {"name": "team", "labels": {"tier": "training"}},
        "spec": {"namespaces": ["team"], "hard": {MIG1G: 7}}}))
    .unwrap();
    quotas.create(&PostParams::default(), &quota).await.unwrap();
    let (_op, _) = spawn_operator(&cp, "op").unwrap();
    let auto: GpuPartitionPlan = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1",
        "kind": "GpuPartitionPlan", "metadata": {"name": "auto"},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "a"}},
                 "layoutsFrom": {"quotaSelector": {"matchLabels": {"tier": "training"}}, "stabilizationSeconds": 5},
                 "rollout": {"maxUnavailable": 1, "drainTimeoutSeconds": 60}}}))
    .unwrap();
    let plans: Api<GpuPartitionPlan> = Api::all(admin.clone());
    plans.create(&PostParams::default(), &auto).await.unwrap();
    let decided = |resource: &'static str, n: i64| {
        let plans = plans.clone();
        async move {
            wait_for(&format!("a decision for {n} {resource}"), Duration::from_secs(180), || async {
                let p = plans.get("auto").await.ok()?;
                let st = p.status.clone()?;
                let d = st.layout_decision.as_ref()?;
                (d.demand.get(resource) == Some(&n) && st.observed_generation == p.metadata.generation).then_some(p)
            })
            .await
            .unwrap()
        }
    };
    decided(MIG1G, 7).await;
    wait_plan_ready(&admin, "auto").await;
    let _driver = spawn_sim_dra_driver(&cp).unwrap();
    wait_slice(&admin, "gpu-0", T, |s| device_names(s).len() == 7).await.unwrap();

    // A pod outside any tenant holds one of the 1g.10gb through a claim: gpu-0 is busy.
    let pods = claim_pods(&admin, "research", 1).await;
    let uid = pods[0].uid().unwrap();
    let generation = Api::<GpuNode>::all(admin.clone()).get("gpu-0").await.unwrap().metadata.generation;
    let cordoned = watch_cordons(&admin);

    // The demand turns to 3g.40gb, which would repartition gpu-0: it is left alone.
    let patch = json!({"spec": {"hard": {MIG1G: null, MIG3G: 2}}});
    quotas.patch("team", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let p = decided(MIG3G, 2).await;
    let d = p.status.unwrap().layout_decision.unwrap();
    assert_eq!(d.kept_busy, vec!["gpu-0".to_string()], "{d:?}");
    assert!(d.targets.iter().all(|t| t.node != "gpu-0"), "{d:?}");
    // The decision is written first (its own field manager), the conditions at the end of the
    // same pass: wait for them rather than read them in between.
    wait_for("DemandMet=False after the decision", T, || async {
        let st = plans.get("auto").await.ok()?.status?;
        find(&st.conditions, DEMAND_MET).is_some_and(|c| c.status == "False").then_some(())
    })
    .await
    .unwrap();
    assert!(!cordoned.lock().unwrap().contains("gpu-0"), "the busy node was cordoned");
    let gn = Api::<GpuNode>::all(admin.clone()).get("gpu-0").await.unwrap();
    assert_eq!(gn.metadata.generation, generation, "the busy node's intent changed");
    assert_eq!(reported(&admin).await, vec!["1g.10gb"; 7]);
    let research: Api<Pod> = Api::namespaced(admin.clone(), "research");
    let now: Vec<String> =
        research.list(&ListParams::default()).await.unwrap().items.iter().filter_map(|p| p.uid()).collect();
    assert_eq!(now, vec![uid], "the claim pod was evicted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_names_the_claim_holding_a_device_exactly_and_preview_lists_the_claim_pod_to_evict() {
    let (cp, admin, _agent) = cluster(&[]).await;
    let (op, _driver) = seven_1g_published(&cp, &admin).await;
    drop(op); // preview and status read the cluster; nothing else may change it
    let pods = claim_pods(&admin, "team", 1).await;
    let pod = pods[0].name_any();
    let claim = wait_pod_claim_allocated(&admin, "team", &pod, T).await.unwrap();
    let device = allocated_devices(&claim).remove(0).2;
    let start: i64 = device.rsplit('-').next().unwrap().parse().unwrap();

    let kubeconfig = cp.kubeconfig(Identity::Admin).to_path_buf();
    let out = std::process::Command::new(workspace_binary("kubectl-tessera"))
        .args(["status", "-o", "json"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let instances = v["nodes"][0]["gpus"][0]["instances"].as_array().unwrap();
    let held: Vec<&Value> = instances.iter().filter(|i| !i["holder"].is_null()).collect();
    assert_eq!(held.len(), 1, "one of seven 1g.10gb is held: {instances:?}");
    assert_eq!(held[0]["start"], json!(start), "the claim's device {device}: {held:?}");
    assert_eq!(held[0]["exact"], true, "a claim names its device: {held:?}");
    assert_eq!(held[0]["holder"]["pod"], format!("team/{pod}"));
    assert_eq!(held[0]["holder"]["claim"], claim.name_any());

    let file = cp.dir.join("plan.yaml");
    std::fs::write(&file, serde_saphyr::to_string(&plan("p", json!({"3g.40gb": 2}))).unwrap()).unwrap();
    let out = std::process::Command::new(workspace_binary("tessera-operator"))
        .args(["plan", "preview", "-o", "json"])
        .arg(&file)
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let preview: Value = serde_json::from_slice(&out.stdout).unwrap();
    let changes = preview[0]["changes"].as_array().unwrap();
    assert_eq!(changes.len(), 1, "{preview}");
    assert_eq!(changes[0]["node"], "gpu-0");
    assert_eq!(changes[0]["evict"], json!([format!("team/{pod}")]), "{preview}");
}

/// Waits until our ResourceQuota in `ns` holds `key` at `hard` in its status (admission enforces it).
async fn wait_quota_key(admin: &Client, ns: &str, quota: &str, key: &str, hard: &str) {
    let rqs: Api<ResourceQuota> = Api::namespaced(admin.clone(), ns);
    let name = tessera_planner::quota::resource_quota_name(quota);
    wait_for(&format!("{ns}/{name} {key}={hard}"), T, || async {
        let rq = rqs.get(&name).await.ok()?;
        (rq.status?.hard?.get(key).map(|q| q.0.as_str()) == Some(hard)).then_some(())
    })
    .await
    .unwrap();
}

/// The lines of kube-controller-manager's log that contain `needle`.
fn kcm_log_lines(cp: &ControlPlane, needle: &str) -> Vec<String> {
    let log = std::fs::read_to_string(cp.dir.join("logs/kube-controller-manager.log")).unwrap_or_default();
    log.lines().filter(|l| l.contains(needle)).map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_from_templates_are_held_to_the_quota_and_a_closed_class_template_gets_no_claim() {
    let (cp, admin, _agent) = cluster(&["config/rbac/claim-classes.yaml"]).await;
    for ns in ["team-q", "team-e"] {
        create_namespace(&admin, ns).await.unwrap();
    }
    // Made before team-e is a tenant's: the claims the controller makes from it are what is refused.
    let closed = dra::claim_template("team-e", "broad", MIG_CLASS, None, 1);
    Api::<ResourceClaimTemplate>::namespaced(admin.clone(), "team-e")
        .create(&PostParams::default(), &closed)
        .await
        .unwrap();
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    for (name, spec) in [
        ("team-q", json!({"namespaces": ["team-q"], "hard": {MIG1G: 2}, "allocation": "ResourceClaims"})),
        ("team-e", json!({"namespaces": ["team-e"], "hard": {MIG1G: 2}})),
    ] {
        let q = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
            "metadata": {"name": name}, "spec": spec}))
        .unwrap();
        quotas.create(&PostParams::default(), &q).await.unwrap();
    }
    let (_op, _) = spawn_operator(&cp, "op").unwrap();
    let ours = "mig-1g.10gb.tessera.dev";
    wait_quota_key(&admin, "team-q", "team-q", &format!("{ours}.deviceclass.resource.k8s.io/devices"), "2").await;
    wait_for("Tessera's 1g.10gb class", T, || async {
        Api::<DeviceClass>::all(admin.clone()).get_opt(ours).await.ok()?
    })
    .await
    .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "tessera-system");
    wait_for("the claim-class policy covers team-e", T, || async {
        cms.get("tessera-claim-classes").await.ok()?.data?.contains_key("team-e.quota").then_some(())
    })
    .await
    .unwrap();
    // Tessera's class opens in team-q a pass after its ResourceQuota is stamped in force.
    wait_for("Tessera's class open in team-q", T, || async {
        let data = cms.get("tessera-claim-classes").await.ok()?.data?;
        let allowed = data.get("team-q.allowed")?;
        (allowed == "_tessera" || allowed.split(' ').any(|c| c == ours)).then_some(())
    })
    .await
    .unwrap();

    // Four pods, each with its own claim of Tessera's class: two claims are made, no more.
    let template = dra::claim_template("team-q", "one-1g", ours, None, 1);
    Api::<ResourceClaimTemplate>::namespaced(admin.clone(), "team-q")
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    let rs = dra::replica_set("team-q", "train", 4, &dra::pod_with_claim_template("team-q", "train", "one-1g"));
    Api::<ReplicaSet>::namespaced(admin.clone(), "team-q").create(&PostParams::default(), &rs).await.unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(admin.clone(), "team-q");
    wait_for("two claims made and a third refused by the quota", T, || async {
        let made = claims.list(&ListParams::default()).await.ok()?.items.len();
        let refused = !kcm_log_lines(&cp, "exceeded quota: tessera-team-q").is_empty();
        (made == 2 && refused).then_some(())
    })
    .await
    .unwrap();
    let pods = Api::<Pod>::namespaced(admin.clone(), "team-q").list(&ListParams::default()).await.unwrap().items;
    assert_eq!(pods.len(), 4, "the ReplicaSet made its four pods");
    let st = wait_for("the quota's usage through claims", T, || async {
        let st = quotas.get("team-q").await.ok()?.status?;
        (st.resources.first()?.used == 2).then_some(st)
    })
    .await
    .unwrap();
    assert_eq!((st.resources[0].name.as_str(), st.resources[0].remaining), (MIG1G, 0));
    assert_eq!(claims.list(&ListParams::default()).await.unwrap().items.len(), 2, "still two claims");

    // ExtendedResources (default): a pod of NVIDIA's broad class gets no claim, and stays pending.
    let pods_e: Api<Pod> = Api::namespaced(admin.clone(), "team-e");
    pods_e.create(&PostParams::default(), &dra::pod_with_claim_template("team-e", "broad", "broad")).await.unwrap();
    let lines = wait_for("the controller's claim refused by the claim-class policy", T, || async {
        let lines = kcm_log_lines(&cp, "closed in namespaces of TenantGpuQuota team-e");
        (!lines.is_empty()).then_some(lines)
    })
    .await
    .unwrap();
    assert!(lines.iter().any(|l| l.contains("class mig.nvidia.com")), "{lines:?}");
    let claims_e: Api<ResourceClaim> = Api::namespaced(admin.clone(), "team-e");
    assert!(
        claims_e.list(&ListParams::default()).await.unwrap().items.is_empty(),
        "a claim of the closed class was made"
    );
    let pod = pods_e.get("broad").await.unwrap();
    assert!(pod.spec.unwrap().node_name.is_none(), "the pod was bound without its claim");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_driver_publishes_shared_counters_is_refused_never_cordoned_and_gets_no_intent() {
    let (cp, admin, _agent) = cluster(&[]).await;
    // NVIDIA's driver in DynamicMIG mode: partitionable devices with shared counters.
    let slice: ResourceSlice = serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice", "metadata": {"name": "gpu-0-counters"},
        "spec": {"driver": dra::DRIVER, "nodeName": "gpu-0",
                 "pool": {"name": "gpu-0", "generation": 1, "resourceSliceCount": 1},
                 "sharedCounters": [{"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}]}}))
    .unwrap();
    let made = Api::<ResourceSlice>::all(admin.clone()).create(&PostParams::default(), &slice).await.unwrap();
    let kept = made.spec.shared_counters.as_ref().is_some_and(|c| !c.is_empty());
    // Before 1.36 the DRAPartitionableDevices gate is off by default and the API server drops the
    // field: no driver can run DynamicMIG there, so there is nothing to refuse.
    let version = admin.apiserver_version().await.unwrap();
    let minor: u32 = version.minor.trim_end_matches('+').parse().unwrap();
    if minor < 36 && !kept {
        eprintln!(
            "1.{minor}: sharedCounters dropped by the API server (DRAPartitionableDevices off); nothing to refuse"
        );
        return;
    }
    assert!(kept, "the API server kept sharedCounters (DRAPartitionableDevices on)");
    let cordoned = watch_cordons(&admin);
    let (_op, _) = spawn_operator(&cp, "op").unwrap();
    let plans: Api<GpuPartitionPlan> = Api::all(admin.clone());
    plans.create(&PostParams::default(), &plan("p", json!({"1g.10gb": 7}))).await.unwrap();
    let st = wait_for("gpu-0 skipped as DynamicMIG", T, || async {
        let p = plans.get("p").await.ok()?;
        let st = p.status?;
        (st.observed_generation == p.metadata.generation && st.skipped_nodes.contains_key("gpu-0")).then_some(st)
    })
    .await
    .unwrap();
    let why = &st.skipped_nodes["gpu-0"];
    assert!(why.contains("DynamicMIG") && why.contains("gpu-0-counters"), "{why}");
    let gns: Api<GpuNode> = Api::all(admin.clone());
    let cond = wait_for("gpu-0's DraInSync False", T, || async {
        let st = gns.get("gpu-0").await.ok()?.status?;
        find(&st.conditions, "DraInSync").filter(|c| c.status == "False").cloned()
    })
    .await
    .unwrap();
    assert_eq!(cond.reason, "DynamicMig", "{cond:?}");
    let gn = gns.get("gpu-0").await.unwrap();
    assert!(gn.spec.gpus.is_empty(), "gpu-0 got an intent: {:?}", gn.spec);
    assert!(!cordoned.lock().unwrap().contains("gpu-0"), "gpu-0 was cordoned");
    assert!(reported(&admin).await.is_empty(), "gpu-0's GPU was partitioned");
}
