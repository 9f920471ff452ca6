//! Smoke tests proving the control plane is real: CRDs, scheduling onto kwok nodes, ResourceQuota
//! admission, PodDisruptionBudget-guarded eviction, and RBAC.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use k8s_openapi::api::policy::v1::{Eviction, PodDisruptionBudget};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tessera_crds::gate::{GpuClassList, GpuQuotaGate};
use tessera_crds::{GpuNode, GpuPartitionPlan, TenantGpuQuota};
use tessera_e2e::fixtures::{FakeGpuNode, create_gpu_nodes, create_namespace, install_crds, wait_for};
use tessera_e2e::{ControlPlane, Identity};

const T: Duration = Duration::from_secs(60);

fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("valid object")
}

fn api_error_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// `make e2e KUBERNETES=1.35` really runs on 1.35: the server reports the minor asked for (the
/// default, when unset, is the newest supported, 1.37).
#[tokio::test]
async fn the_control_plane_runs_the_kubernetes_minor_asked_for() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    let info = admin.apiserver_version().await.unwrap();
    let wanted = std::env::var("KUBERNETES").unwrap_or_else(|_| "1.37".into());
    assert_eq!(format!("{}.{}", info.major, info.minor), wanted, "server reports {}", info.git_version);
}

#[tokio::test]
async fn crds_install_and_every_kind_round_trips() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    let names = install_crds(&admin).await.unwrap();
    assert_eq!(
        names,
        [
            "gpuclasslists.tessera.dev",
            "gpunodes.tessera.dev",
            "gpupartitionplans.tessera.dev",
            "gpuquotagates.tessera.dev",
            "tenantgpuquotas.tessera.dev"
        ]
    );

    // Every sample is accepted by the API server (schema and CEL) and reads back unchanged.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/samples");
    let plans: Api<GpuPartitionPlan> = Api::all(admin.clone());
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for v in serde_saphyr::from_multiple::<serde_json::Value>(&text).unwrap() {
            match v["kind"].as_str().unwrap() {
                "GpuPartitionPlan" => {
                    let obj: GpuPartitionPlan = from_json(v);
                    plans.create(&PostParams::default(), &obj).await.unwrap();
                    assert_eq!(plans.get(&obj.name_any()).await.unwrap().spec, obj.spec);
                }
                "TenantGpuQuota" => {
                    let obj: TenantGpuQuota = from_json(v);
                    quotas.create(&PostParams::default(), &obj).await.unwrap();
                    assert_eq!(quotas.get(&obj.name_any()).await.unwrap().spec, obj.spec);
                }
                other => panic!("unexpected sample kind {other}"),
            }
            seen += 1;
        }
    }
    assert_eq!(seen, 4);

    // GpuNode: spec by the operator, status by the agent through the status subresource.
    let nodes: Api<GpuNode> = Api::all(admin.clone());
    let gn: GpuNode = from_json(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "metadata": {"name": "node-a"},
        "spec": {"plan": "inference", "gpus": [{"index": 0, "migEnabled": true, "profiles": {"7g.80gb": 1}}]}
    }));
    nodes.create(&PostParams::default(), &gn).await.unwrap();
    let status = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "status": {
        "observedGeneration": 1,
        "gpus": [{"index": 0, "uuid": "GPU-0", "product": "NVIDIA H100 80GB HBM3", "migCapable": true, "migEnabled": true,
                  "instances": [{"profile": "7g.80gb", "start": 0, "size": 8, "uuid": "MIG-1"}]}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "Applied", "message": "ok",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    nodes.patch_status("node-a", &PatchParams::apply("agent"), &Patch::Apply(&status)).await.unwrap();
    let got = nodes.get("node-a").await.unwrap();
    assert_eq!(got.spec, gn.spec);
    assert_eq!(got.status.unwrap().gpus[0].instances[0].uuid.as_deref(), Some("MIG-1"));

    // The quota gate (namespaced) and the class list (cluster-scoped) read back as written; the
    // schema caps a gate's reason at 1024 characters.
    create_namespace(&admin, "tenant-a").await.unwrap();
    let gates: Api<GpuQuotaGate> = Api::namespaced(admin.clone(), "tenant-a");
    let gate: GpuQuotaGate = from_json(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuQuotaGate", "metadata": {"name": "gpu"},
        "spec": {"quota": "team-a", "state": "Enforced", "reason": "within the share",
                 "limited": ["requests.nvidia.com/mig-1g.10gb"], "blockedPods": ["p-1"]}
    }));
    gates.create(&PostParams::default(), &gate).await.unwrap();
    assert_eq!(gates.get("gpu").await.unwrap().spec, gate.spec);
    let mut long = gate.clone();
    long.metadata = kube::api::ObjectMeta { name: Some("long".into()), ..Default::default() };
    long.spec.reason = "x".repeat(1025);
    let err = gates.create(&PostParams::default(), &long).await.unwrap_err();
    assert_eq!(api_error_code(&err), Some(422), "{err}");
    assert!(err.to_string().contains("spec.reason"), "{err}");
    let lists: Api<GpuClassList> = Api::all(admin.clone());
    let list: GpuClassList = from_json(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuClassList", "metadata": {"name": "tessera"},
        "spec": {"open": ["fpga.example.com"], "tessera": ["mig-1g.10gb.tessera.dev"]}
    }));
    lists.create(&PostParams::default(), &list).await.unwrap();
    assert_eq!(lists.get("tessera").await.unwrap().spec, list.spec);

    // The CEL rules run in the API server: a bad maxUnavailable is refused with the rule's message.
    let mut bad: GpuPartitionPlan = plans.get("inference").await.unwrap();
    bad.metadata = kube::api::ObjectMeta { name: Some("bad".into()), ..Default::default() };
    bad.spec.rollout.max_unavailable = k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("0%".into());
    let err = plans.create(&PostParams::default(), &bad).await.unwrap_err();
    assert_eq!(api_error_code(&err), Some(422), "{err}");
    assert!(err.to_string().contains("maxUnavailable must be an integer >= 1 or a percentage"), "{err}");
}

async fn running_pods(pods: &Api<Pod>, selector: &str) -> Vec<Pod> {
    let list = pods.list(&ListParams::default().labels(selector)).await.map(|l| l.items).unwrap_or_default();
    list.into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .collect()
}

fn mig_deployment(name: &str, replicas: i32, resource: &str) -> Deployment {
    from_json(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
          "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{
            "name": "cuda", "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
            "resources": {"limits": {resource: "1"}, "requests": {resource: "1"}}}]}}}
    }))
}

#[tokio::test]
async fn mig_pods_are_scheduled_onto_a_kwok_node_that_offers_the_slice_and_run() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    create_gpu_nodes(
        &admin,
        &[
            FakeGpuNode::new("gpu-mig", "NVIDIA-H100-80GB-HBM3", 1).resource("nvidia.com/mig-1g.10gb", 7),
            FakeGpuNode::new("gpu-whole", "NVIDIA-H100-80GB-HBM3", 1).resource("nvidia.com/gpu", 1),
        ],
    )
    .await
    .unwrap();
    create_namespace(&admin, "ml").await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), "ml");
    deployments.create(&PostParams::default(), &mig_deployment("infer", 3, "nvidia.com/mig-1g.10gb")).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "ml");
    let running = wait_for("3 Running pods", T, || async {
        let r = running_pods(&pods, "app=infer").await;
        (r.len() == 3).then_some(r)
    })
    .await
    .unwrap();
    for p in running {
        assert_eq!(p.spec.unwrap().node_name.as_deref(), Some("gpu-mig"), "only gpu-mig offers the slice");
    }
    // An eighth slice does not exist: the scheduler leaves the pod Pending with the reason.
    deployments.create(&PostParams::default(), &mig_deployment("too-many", 5, "nvidia.com/mig-1g.10gb")).await.unwrap();
    let pending = wait_for("an unschedulable pod", T, || async {
        let list = pods.list(&ListParams::default().labels("app=too-many")).await.ok()?;
        list.items.into_iter().find(|p| {
            p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
                cs.iter().any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"))
            })
        })
    })
    .await
    .unwrap();
    let message = pending.status.unwrap().conditions.unwrap().into_iter().find(|c| c.type_ == "PodScheduled").unwrap();
    assert!(message.message.unwrap_or_default().contains("Insufficient nvidia.com/mig-1g.10gb"));
    assert_eq!(running_pods(&pods, "app=too-many").await.len(), 4);
}

#[tokio::test]
async fn resource_quota_admission_refuses_a_pod_over_the_limit() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    create_namespace(&admin, "team-a").await.unwrap();
    let quotas: Api<ResourceQuota> = Api::namespaced(admin.clone(), "team-a");
    let rq: ResourceQuota = from_json(json!({
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu"},
        "spec": {"hard": {"requests.nvidia.com/mig-1g.10gb": "1"}}
    }));
    quotas.create(&PostParams::default(), &rq).await.unwrap();
    // The controller-manager's resourcequota controller fills in status.hard; admission needs it.
    wait_for("quota status", T, || async {
        quotas.get("gpu").await.ok()?.status?.hard.filter(|h| !h.is_empty()).map(|_| ())
    })
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "team-a");
    let pod = |name: &str| -> Pod {
        from_json(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "x",
              "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}, "requests": {"nvidia.com/mig-1g.10gb": "1"}}}]}}))
    };
    pods.create(&PostParams::default(), &pod("first")).await.unwrap();
    let err = pods.create(&PostParams::default(), &pod("second")).await.unwrap_err();
    assert_eq!(api_error_code(&err), Some(403), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("exceeded quota: gpu") && msg.contains("requests.nvidia.com/mig-1g.10gb"), "{msg}");
}

/// A client that surfaces 429 at once instead of retrying it (kube retries 429 by default).
async fn no_retry_client(cp: &ControlPlane) -> Client {
    let mut config = cp.config(Identity::Admin).await.unwrap();
    config.default_retry = false;
    Client::try_from(config).unwrap()
}

async fn evict(pods: &Api<Pod>, name: &str) -> Result<(), kube::Error> {
    let eviction: Eviction = from_json(json!({
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name},
        "deleteOptions": {"gracePeriodSeconds": 0}
    }));
    pods.create_subresource::<Eviction, serde_json::Value>("eviction", name, &PostParams::default(), &eviction)
        .await
        .map(|_| ())
}

#[tokio::test]
async fn eviction_is_refused_with_429_while_a_pdb_allows_no_disruption() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    create_gpu_nodes(
        &admin,
        &[FakeGpuNode::new("gpu-0", "NVIDIA-A100-SXM4-40GB", 1).resource("nvidia.com/mig-1g.5gb", 7)],
    )
    .await
    .unwrap();
    create_namespace(&admin, "serve").await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), "serve");
    deployments.create(&PostParams::default(), &mig_deployment("web", 2, "nvidia.com/mig-1g.5gb")).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "serve");
    wait_for("2 Running pods", T, || async { (running_pods(&pods, "app=web").await.len() == 2).then_some(()) })
        .await
        .unwrap();

    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), "serve");
    let pdb: PodDisruptionBudget = from_json(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}
    }));
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    let allowed = |want: i32| {
        let pdbs = pdbs.clone();
        async move {
            wait_for(&format!("PDB disruptionsAllowed={want}"), T, || async {
                let s = pdbs.get("web").await.ok()?.status?;
                (s.current_healthy == Some(2) && s.disruptions_allowed == Some(want)).then_some(())
            })
            .await
            .unwrap()
        }
    };
    allowed(0).await;
    let raw: Api<Pod> = Api::namespaced(no_retry_client(&cp).await, "serve");
    let victim = running_pods(&pods, "app=web").await[0].name_any();
    let err = evict(&raw, &victim).await.unwrap_err();
    assert_eq!(api_error_code(&err), Some(429), "{err}");
    assert!(err.to_string().contains("disruption budget web"), "{err}");
    assert!(pods.get(&victim).await.unwrap().metadata.deletion_timestamp.is_none(), "the pod must survive");

    pdbs.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"minAvailable": 1}}))).await.unwrap();
    allowed(1).await;
    evict(&raw, &victim).await.unwrap();
    wait_for("victim gone", T, || async {
        match pods.get(&victim).await {
            Err(kube::Error::Api(s)) if s.code == 404 => Some(()),
            _ => None,
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_tenant_can_read_but_not_edit_its_quota() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    install_crds(&admin).await.unwrap();
    let quota: TenantGpuQuota = from_json(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "metadata": {"name": "team-a"},
        "spec": {"namespaces": ["team-a"], "hard": {"nvidia.com/mig-1g.10gb": 2}}
    }));
    Api::<TenantGpuQuota>::all(admin.clone()).create(&PostParams::default(), &quota).await.unwrap();
    // Tenants may read quotas (to see what is left), nothing more.
    let role: ClusterRole = from_json(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "tessera-quota-viewer"},
        "rules": [{"apiGroups": ["tessera.dev"], "resources": ["tenantgpuquotas"], "verbs": ["get", "list", "watch"]}]
    }));
    Api::<ClusterRole>::all(admin.clone()).create(&PostParams::default(), &role).await.unwrap();
    let binding: ClusterRoleBinding = from_json(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "team-a-quota-viewer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "tessera-quota-viewer"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "team-a"}]
    }));
    Api::<ClusterRoleBinding>::all(admin.clone()).create(&PostParams::default(), &binding).await.unwrap();

    let tenant: Api<TenantGpuQuota> = Api::all(cp.client(Identity::TenantA).await.unwrap());
    let seen = wait_for("RBAC binding effective", T, || async { tenant.get("team-a").await.ok() }).await.unwrap();
    assert_eq!(seen.spec.hard["nvidia.com/mig-1g.10gb"], 2);
    let patch = json!({"spec": {"hard": {"nvidia.com/mig-1g.10gb": 100}}});
    let err = tenant.patch("team-a", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap_err();
    assert_eq!(api_error_code(&err), Some(403), "{err}");
    let err = tenant.delete("team-a", &DeleteParams::default()).await.unwrap_err();
    assert_eq!(api_error_code(&err), Some(403), "{err}");
    // The other tenant has no binding at all.
    let other: Api<TenantGpuQuota> = Api::all(cp.client(Identity::TenantB).await.unwrap());
    assert_eq!(api_error_code(&other.get("team-a").await.unwrap_err()), Some(403));
}

#[tokio::test]
async fn teardown_leaves_no_process_behind() {
    let cp = ControlPlane::start().await.unwrap();
    let pids = cp.pids();
    assert_eq!(pids.len(), 5, "etcd, apiserver, controller-manager, scheduler, kwok");
    let dir = cp.dir.clone();
    drop(cp);
    for pid in pids {
        // SAFETY: signal 0 only checks whether the pid exists.
        let alive = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0;
        assert!(!alive, "pid {pid} survived teardown");
    }
    assert!(!dir.exists(), "temp dir removed after a passing test");
}

#[test]
fn components_die_with_a_killed_harness() {
    use std::io::{BufRead, BufReader};
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_cluster-up"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut pids = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(list) = line.strip_prefix("pids: ") {
            pids = list.split(' ').map(|p| p.parse::<i32>().unwrap()).collect();
            break;
        }
    }
    assert_eq!(pids.len(), 5);
    child.kill().unwrap(); // SIGKILL: no destructor runs
    child.wait().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    for pid in pids {
        // SAFETY: signal 0 only checks whether the pid exists.
        while unsafe { libc::kill(pid, 0) } == 0 {
            assert!(std::time::Instant::now() < deadline, "pid {pid} outlived the killed harness");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
