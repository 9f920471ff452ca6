//! Gates mode under a burst, with kube-scheduler, kwok and a node's DRA devices: from the moment
//! two namespaces join their quotas (share 3 each), 50 GPU pods are tried at once in one, and in
//! the other 50 claims of Tessera's per-profile class (each with a pod, so the scheduler
//! allocates it) and 50 of NVIDIA's classes. At every poll at most the share is bound or
//! allocated; in the end exactly the share is, and no claim of NVIDIA's classes exists.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tessera_crds::TenantGpuQuota;
use tessera_e2e::dra::pods::{claim, pod_with_claim};
use tessera_e2e::fixtures::{
    FakeGpuNode, apply_file, create_gpu_nodes, create_namespace, install_crds, spawn_operator_with, wait_for,
};
use tessera_e2e::{ControlPlane, Identity};

const T: Duration = Duration::from_secs(90);
const SHARE: usize = 3;
const BURST: usize = 50;
/// How long the creators go on trying once both namespaces are labelled tenant.
const AFTER_TENANT: Duration = Duration::from_secs(10);
/// Past this the limits are taken as never coming into force.
const GIVE_UP: Duration = Duration::from_secs(120);
const OURS: &str = "mig-1g.10gb.tessera.dev";

fn gpu_pod(name: &str) -> Pod {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}))
    .unwrap()
}

fn quota(name: &str, spec: Value) -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": name}, "spec": spec}))
    .unwrap()
}

/// Node n1's ten 1g.10gb MIG devices, as NVIDIA's DRA driver publishes them.
fn slice() -> ResourceSlice {
    let devices: Vec<Value> = (0..10)
        .map(|i| json!({"name": format!("mig-{i}"), "attributes": {"type": {"string": "mig"}, "profile": {"string": "1g.10gb"}}}))
        .collect();
    serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "n1-gpu"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "n1",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1}, "devices": devices}}))
    .unwrap()
}

/// Runs `attempt` every second until it succeeds or `stop` is set (at most [`GIVE_UP`]);
/// counts successes.
fn keep_trying<F, Fut>(done: Arc<AtomicUsize>, stop: Arc<AtomicBool>, mut attempt: F) -> tokio::task::JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    tokio::spawn(async move {
        let started = Instant::now();
        while !stop.load(Ordering::SeqCst) && started.elapsed() < GIVE_UP {
            if attempt().await {
                done.fetch_add(1, Ordering::SeqCst);
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

/// (GPU pods bound in team-p, claims allocated in team-c); asserts neither is past the share.
async fn check(admin: &Client) -> (usize, usize) {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "team-p");
    let listed = pods.list(&Default::default()).await.unwrap().items;
    let bound = listed
        .iter()
        .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()) && p.metadata.deletion_timestamp.is_none())
        .count();
    let claims: Api<ResourceClaim> = Api::namespaced(admin.clone(), "team-c");
    let list = claims.list(&Default::default()).await.unwrap().items;
    let allocated = list.iter().filter(|c| c.status.as_ref().is_some_and(|s| s.allocation.is_some())).count();
    assert!(bound <= SHARE, "{bound} GPU pods bound in team-p, past the share of {SHARE}");
    assert!(allocated <= SHARE, "{allocated} claims allocated in team-c, past the share of {SHARE}");
    let nvidia: Vec<String> =
        list.iter().filter(|c| !c.name_any().starts_with("ours-")).map(|c| c.name_any()).collect();
    assert!(nvidia.is_empty(), "claims of NVIDIA's classes admitted in a tenant namespace: {nvidia:?}");
    (bound, allocated)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_pods_and_a_hundred_claims_from_the_moment_two_namespaces_join_never_pass_the_share() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    install_crds(&admin).await.unwrap();
    for f in ["config/base/namespace.yaml", "config/rbac/operator.yaml", "config/rbac/quota-gates.yaml"] {
        apply_file(&admin, f).await.unwrap();
    }
    create_gpu_nodes(&admin, &[FakeGpuNode::new("n1", "NVIDIA-H100-80GB-HBM3", 8).resource("nvidia.com/gpu", 8)])
        .await
        .unwrap();
    let classes: Api<DeviceClass> = Api::all(admin.clone());
    for (name, kind) in [("mig.nvidia.com", "mig"), ("gpu.nvidia.com", "gpu")] {
        let class: DeviceClass = serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass", "metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression":
                format!("device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == '{kind}'")}}]}}))
        .unwrap();
        classes.create(&PostParams::default(), &class).await.unwrap();
    }
    Api::<ResourceSlice>::all(admin.clone()).create(&PostParams::default(), &slice()).await.unwrap();
    for ns in ["team-p", "team-c"] {
        create_namespace(&admin, ns).await.unwrap();
    }
    let (_op, _) = spawn_operator_with(&cp, "op", &[("TESSERA_QUOTA_ADMISSION", "gates")]).unwrap();
    // Tessera's class, made by the operator for a quota elsewhere, so claims of it can be tried at once.
    create_namespace(&admin, "team-x").await.unwrap();
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    let elsewhere =
        json!({"namespaces": ["team-x"], "hard": {"nvidia.com/mig-1g.10gb": 1}, "allocation": "ResourceClaims"});
    quotas.create(&PostParams::default(), &quota("team-x", elsewhere)).await.unwrap();
    wait_for("Tessera's class made", T, || async { classes.get_opt(OURS).await.ok()?.map(|_| ()) }).await.unwrap();

    // Both join, and the burst starts at once.
    let pods_spec = json!({"namespaces": ["team-p"], "hard": {"nvidia.com/gpu": SHARE}});
    quotas.create(&PostParams::default(), &quota("team-p", pods_spec)).await.unwrap();
    let claims_spec =
        json!({"namespaces": ["team-c"], "hard": {"nvidia.com/mig-1g.10gb": SHARE}, "allocation": "ResourceClaims"});
    quotas.create(&PostParams::default(), &quota("team-c", claims_spec)).await.unwrap();
    let (pods_made, ours_made, nvidia_made) =
        (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut creators = Vec::new();
    let stop = Arc::new(AtomicBool::new(false));
    for i in 0..BURST {
        let pods: Api<Pod> = Api::namespaced(admin.clone(), "team-p");
        creators.push(keep_trying(pods_made.clone(), stop.clone(), move || {
            let pods = pods.clone();
            async move { pods.create(&PostParams::default(), &gpu_pod(&format!("p-{i:02}"))).await.is_ok() }
        }));
        let (claims, pods): (Api<ResourceClaim>, Api<Pod>) =
            (Api::namespaced(admin.clone(), "team-c"), Api::namespaced(admin.clone(), "team-c"));
        creators.push(keep_trying(ours_made.clone(), stop.clone(), move || {
            let (claims, pods) = (claims.clone(), pods.clone());
            async move {
                let name = format!("ours-{i:02}");
                if claims.get_opt(&name).await.ok().flatten().is_none()
                    && claims.create(&PostParams::default(), &claim("team-c", &name, OURS, None, 1)).await.is_err()
                {
                    return false;
                }
                let pod = pod_with_claim("team-c", &format!("uses-{i:02}"), &name);
                pods.create(&PostParams::default(), &pod).await.is_ok()
            }
        }));
        let claims: Api<ResourceClaim> = Api::namespaced(admin.clone(), "team-c");
        let class = if i % 2 == 0 { "mig.nvidia.com" } else { "gpu.nvidia.com" };
        creators.push(keep_trying(nvidia_made.clone(), stop.clone(), move || {
            let claims = claims.clone();
            async move {
                let c = claim("team-c", &format!("nvidia-{i:02}"), class, None, 1);
                claims.create(&PostParams::default(), &c).await.is_ok()
            }
        }));
    }

    // Every poll within the share, while the creators try: until both namespaces have been
    // tenants for a while and the share has been in use for 5 s.
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let started = Instant::now();
    let (mut full_since, mut tenant_since) = (None, None);
    while started.elapsed() < GIVE_UP {
        let (bound, allocated) = check(&admin).await;
        let full = bound == SHARE && allocated == SHARE;
        match (full, full_since) {
            (true, None) => full_since = Some(Instant::now()),
            (false, _) => full_since = None,
            _ => {}
        }
        if tenant_since.is_none() {
            let mut tenants = 0;
            for ns in ["team-p", "team-c"] {
                let n = namespaces.get(ns).await.unwrap();
                tenants += usize::from(n.labels().get("tessera.dev/gpu-gate").map(String::as_str) == Some("tenant"));
            }
            tenant_since = (tenants == 2).then(Instant::now);
        }
        let waited = tenant_since.is_some_and(|t| t.elapsed() > AFTER_TENANT);
        if waited && full_since.is_some_and(|t| t.elapsed() > Duration::from_secs(5)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for c in creators {
        c.await.unwrap();
    }
    let (bound, allocated) = check(&admin).await;
    assert_eq!((bound, allocated), (SHARE, SHARE), "the share is in use");
    assert_eq!(pods_made.load(Ordering::SeqCst), SHARE, "GPU pods admitted in team-p");
    assert_eq!(ours_made.load(Ordering::SeqCst), SHARE, "claims of Tessera's class admitted in team-c");
    assert_eq!(nvidia_made.load(Ordering::SeqCst), 0, "claims of NVIDIA's classes admitted in team-c");
    for ns in ["team-p", "team-c"] {
        let n = namespaces.get(ns).await.unwrap();
        assert_eq!(n.labels().get("tessera.dev/gpu-gate").map(String::as_str), Some("tenant"), "{ns}");
    }
}
