//! Idle slices per tenant on the real control plane: a node agent (real NVML backend over the
//! simulated `libnvidia-ml.so.1`, whose GPM reports the activity the test sets), the operator and
//! a TenantGpuQuota. One pod's slice is busy, the other's idle: only the idle one is reported,
//! and it stays reported with the same `idleSince` across an agent restart.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tessera_crds::activity::DeviceActivity;
use tessera_crds::{GpuNode, TenantGpuQuota};
use tessera_e2e::fixtures::{
    AgentBackend, FakeGpuNode, apply_file, create_gpu_nodes, create_namespace, http_get, install_crds,
    spawn_node_agent_on, spawn_operator, wait_for, workspace_binary,
};
use tessera_e2e::process::Component;
use tessera_e2e::{ControlPlane, Identity};
use tessera_node_agent::backend::GpuBackend;
use tessera_node_agent::backend::sim::{self, SimBackend};

const T: Duration = Duration::from_secs(60);
/// Short intervals so the test runs in about a minute (defaults: 30 s and 300 s).
const FAST: [&str; 6] =
    ["--activity-sample-seconds", "1", "--activity-write-interval-seconds", "2", "--metrics-addr", ""];

async fn spawn_agent(cp: &ControlPlane, state: &std::path::Path) -> Component {
    spawn_node_agent_on(cp, AgentBackend::Nvml, "gpu-a", state, "H100-80GB", &FAST).await.unwrap()
}

/// The node's stored activity for the device `uuid`.
async fn device(admin: &Client, uuid: &str) -> Option<DeviceActivity> {
    let gn = Api::<GpuNode>::all(admin.clone()).get("gpu-a").await.ok()?;
    gn.status?.activity?.devices.into_iter().find(|d| d.uuid.as_deref() == Some(uuid))
}

/// `kubectl tessera idle -o json` as the admin.
fn idle_json(cp: &ControlPlane) -> Value {
    let out = std::process::Command::new(workspace_binary("kubectl-tessera"))
        .env("KUBECONFIG", cp.kubeconfig(Identity::Admin))
        .args(["idle", "-o", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn listed_since(v: &Value, pod: &str) -> Option<Timestamp> {
    let e = v["idle"].as_array()?.iter().find(|e| e["pod"] == pod)?;
    e["idleSince"].as_str()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_slice_is_reported_for_its_tenant_and_survives_an_agent_restart() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    install_crds(&admin).await.unwrap();
    for f in [
        "config/base/namespace.yaml",
        "config/rbac/operator.yaml",
        "config/rbac/viewer.yaml",
        "config/rbac/node-agent.yaml",
        "config/rbac/node-agent-fence.yaml",
    ] {
        apply_file(&admin, f).await.unwrap();
    }
    create_namespace(&admin, "ml").await.unwrap();
    create_gpu_nodes(&admin, &[FakeGpuNode::new("gpu-a", "NVIDIA-H100-80GB-HBM3", 1)]).await.unwrap();
    // The GPU carved before the agent starts (as after a reboot with the layout in place): one
    // 3g.40gb and one 2g.20gb, so each pod's slice is known exactly.
    let state = cp.dir.join("gpu-a.json");
    let mut b = SimBackend::open(&state, &["H100-80GB".into()]).unwrap();
    b.set_mig_mode(0, true).unwrap();
    let busy = b.create_instance(0, "3g.40gb", 4).unwrap().uuid;
    let idle = b.create_instance(0, "2g.20gb", 0).unwrap().uuid;
    drop(b);
    sim::set_activity(&state, 0, Some(&busy), 60.0).unwrap();
    // Busy until its pod runs: it goes idle while held (so idleSince is after the pod's start).
    sim::set_activity(&state, 0, Some(&idle), 60.0).unwrap();
    let mut agent = spawn_agent(&cp, &state).await;
    let (_op, op_port) = spawn_operator(&cp, "op").unwrap();
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    let quota: TenantGpuQuota = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1",
        "kind": "TenantGpuQuota", "metadata": {"name": "ml"},
        "spec": {"namespaces": ["ml"], "idleAfter": "10s",
                 "hard": {"nvidia.com/mig-3g.40gb": 1, "nvidia.com/mig-2g.20gb": 1}}}))
    .unwrap();
    quotas.create(&PostParams::default(), &quota).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "ml");
    for (name, resource) in [("train", "nvidia.com/mig-3g.40gb"), ("notebook", "nvidia.com/mig-2g.20gb")] {
        let pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {resource: "1"}}}]}}))
        .unwrap();
        // The quota's ResourceQuota may not be enforced yet: retry until admitted.
        wait_for(&format!("ml/{name} created"), T, || async {
            pods.create(&PostParams::default(), &pod).await.ok().map(|_| ())
        })
        .await
        .unwrap();
    }
    for name in ["train", "notebook"] {
        wait_for(&format!("ml/{name} running on gpu-a"), T, || async {
            let p = pods.get(name).await.ok()?;
            (p.status?.phase.as_deref() == Some("Running") && p.spec?.node_name.as_deref() == Some("gpu-a"))
                .then_some(())
        })
        .await
        .unwrap();
    }

    sim::set_activity(&state, 0, Some(&idle), 0.0).unwrap();
    // The agent reports the idle device with its idleSince, the busy one without.
    let since =
        wait_for("the idle device's idleSince written", T, || async { device(&admin, &idle).await?.idle_since })
            .await
            .unwrap()
            .0;
    // The quota names the idle pod once the threshold passed (the operator refreshes its report
    // every 60 s), never the busy one.
    let activity = wait_for("the quota reports the idle holder", Duration::from_secs(100), || async {
        let a = quotas.get("ml").await.ok()?.status?.activity?;
        assert!(a.idle_holders.iter().all(|h| h.pod != "ml/train"), "the busy pod is never idle: {a:?}");
        a.idle_holders.iter().any(|h| h.pod == "ml/notebook").then_some(a)
    })
    .await
    .unwrap();
    let holder = activity.idle_holders.iter().find(|h| h.pod == "ml/notebook").unwrap();
    assert_eq!((holder.profile.as_str(), holder.idle_since.0), ("2g.20gb", since), "{activity:?}");
    assert_eq!((activity.allocated, activity.idle, activity.active), (2, 1, 1), "{activity:?}");
    assert!(device(&admin, &busy).await.unwrap().idle_since.is_none());

    // Killed and restarted: the new agent writes at once (its first write), keeping idleSince.
    agent.stop_now();
    // `measuredAt` is stored to the second: a second after the kill, any later one is the new
    // agent's.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let killed_at = Timestamp::from_second(Timestamp::now().as_second()).unwrap();
    agent = spawn_agent(&cp, &state).await;
    let gn_api: Api<GpuNode> = Api::all(admin.clone());
    let after = wait_for("the restarted agent's first write", T, || async {
        let a = gn_api.get("gpu-a").await.ok()?.status?.activity?;
        (a.measured_at.as_ref()?.0 >= killed_at).then_some(a)
    })
    .await
    .unwrap();
    let d = after.devices.iter().find(|d| d.uuid.as_deref() == Some(idle.as_str())).unwrap();
    assert_eq!(d.idle_since.as_ref().map(|t| t.0), Some(since), "idleSince kept across the restart: {after:?}");
    let v = idle_json(&cp);
    assert_eq!(listed_since(&v, "ml/notebook"), Some(since), "kubectl tessera idle lists it: {v}");
    assert_eq!(listed_since(&v, "ml/train"), None, "{v}");
    // Still reported by the quota with the same idleSince. The operator reuses its report for
    // 60 s and writes the quota only on change, so the quota read at once would show the old
    // report: wait until it has computed one after the new agent's write was seen (its stamp, to
    // the second, later than now), then for the pass's status write (a pass every 5 s at most).
    let seen_at = Timestamp::now().as_second();
    wait_for("an idle report computed after the restart", Duration::from_secs(100), || async {
        let m = http_get(op_port, "/metrics").ok()?;
        let at = m.lines().find_map(|l| l.strip_prefix("tessera_operator_idle_report_timestamp_seconds "))?;
        (at.trim().parse::<i64>().ok()? > seen_at).then_some(())
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let q = quotas.get("ml").await.unwrap().status.unwrap().activity.unwrap();
    assert!(q.idle_holders.iter().any(|h| h.pod == "ml/notebook" && h.idle_since.0 == since), "{q:?}");
    agent.stop();
}
