use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;
use serde_json::{Value, json};

use super::*;
use crate::agent::Agent;
use crate::backend::GpuBackend;
use crate::backend::sim::SimBackend;
use crate::testutil::temp_dir;

fn gpu(index: u32, mig: bool) -> GpuInfo {
    GpuInfo {
        index,
        uuid: format!("GPU-{index}"),
        product: "NVIDIA H100 80GB HBM3".into(),
        memory_mib: 81559,
        mig_capable: true,
        mig_enabled: mig,
        mig_pending: None,
    }
}

fn mig(gi: u32, uuid: &str) -> Instance {
    Instance {
        gpu_instance_id: gi,
        compute_instance_id: Some(0),
        profile: "3g.40gb".into(),
        start: 0,
        size: 4,
        uuid: uuid.into(),
        split_compute: 0,
    }
}

#[test]
fn the_fingerprint_changes_with_the_mig_devices_and_nothing_else() {
    let base = fingerprint(&[(gpu(0, true), vec![mig(1, "MIG-a"), mig(2, "MIG-b")]), (gpu(1, false), vec![])]);
    let reordered = fingerprint(&[(gpu(1, false), vec![]), (gpu(0, true), vec![mig(2, "MIG-b"), mig(1, "MIG-a")])]);
    assert_eq!(base, reordered, "order is not a change");
    let half = Instance { compute_instance_id: None, uuid: String::new(), ..mig(3, "") };
    let with_half =
        fingerprint(&[(gpu(0, true), vec![mig(1, "MIG-a"), mig(2, "MIG-b"), half]), (gpu(1, false), vec![])]);
    assert_eq!(base, with_half, "a half-made instance is no MIG device");
    let changes = [
        fingerprint(&[(gpu(0, true), vec![mig(1, "MIG-a"), mig(2, "MIG-c")]), (gpu(1, false), vec![])]),
        fingerprint(&[(gpu(0, true), vec![mig(1, "MIG-a")]), (gpu(1, false), vec![])]),
        fingerprint(&[(gpu(0, true), vec![mig(1, "MIG-a"), mig(2, "MIG-b")]), (gpu(1, true), vec![])]),
    ];
    for c in changes {
        assert_ne!(base, c);
    }
    assert_eq!(base.len(), 16);
}

#[test]
fn clients_restart_when_asked_or_when_the_recorded_devices_differ() {
    // (recorded, now, the pass asks) -> restart
    let table = [
        (None, "x", false, false),
        (None, "x", true, true),
        (Some("x"), "x", false, false),
        (Some("y"), "x", false, true),
        (Some("x"), "x", true, true),
    ];
    for (recorded, now, asks, want) in table {
        assert_eq!(must_restart(recorded, now, asks), want, "{recorded:?} {now} {asks}");
    }
}

/// An API server for one node `test` whose GpuNode wants one 7g.80gb and carries `recorded`:
/// answers the reads and writes of a pass, records the pod deletes and keeps the annotation.
#[derive(Default)]
struct Server {
    recorded: Option<String>,
    deleted: Vec<String>,
    /// The query of each pod list (its label selector).
    listed: Vec<String>,
}

fn client(server: Arc<Mutex<Server>>) -> Client {
    let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let server = server.clone();
        async move {
            let (method, path) = (req.method().clone(), req.uri().path().to_string());
            let query = req.uri().query().unwrap_or_default().to_string();
            let body = req.into_body().collect_bytes().await.map_err(|e| std::io::Error::other(e.to_string()))?;
            let mut s = server.lock().unwrap();
            if method == http::Method::PATCH && path.ends_with("/gpunodes/test") {
                let patch: Value = serde_json::from_slice(&body).unwrap();
                s.recorded = patch["metadata"]["annotations"][RESTARTED_FOR].as_str().map(str::to_string);
            }
            let gpunode = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
                "metadata": {"name": "test", "generation": 1,
                             "annotations": s.recorded.as_ref().map(|r| json!({RESTARTED_FOR: r}))},
                "spec": {"gpus": [{"index": 0, "migEnabled": true, "profiles": {"7g.80gb": 1}}]}});
            let out = if path.contains("/gpunodes/test") {
                gpunode
            } else if path == "/api/v1/pods" {
                s.listed.push(query);
                json!({"apiVersion": "v1", "kind": "PodList", "metadata": {},
                       "items": [{"metadata": {"name": "dp", "namespace": "gpu"}}]})
            } else if method == http::Method::DELETE && path.starts_with("/api/v1/namespaces/") {
                s.deleted.push(path.clone());
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "dp", "namespace": "gpu"}})
            } else {
                return Err(std::io::Error::other(format!("no {method} {path} in this test")));
            };
            Ok(http::Response::new(kube::client::Body::from(out.to_string().into_bytes())))
        }
    });
    Client::new(svc, "default")
}

/// The agent made the GPU's MIG device and was killed before restarting the GPU clients: the
/// next agent finds nothing to change on the GPU, and still restarts them, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_lost_to_a_killed_agent_is_redone_by_the_next_pass_once() {
    let state = temp_dir("clients").join("sim.json");
    let mut sim = SimBackend::open(&state, &["H100-80GB".into()]).unwrap();
    sim.set_mig_mode(0, true).unwrap();
    sim.create_instance(0, "7g.80gb", 0).unwrap();
    // What the agent before recorded: the GPU before it made the device.
    let server = Arc::new(Mutex::new(Server { recorded: Some("before".into()), ..Default::default() }));
    let mut agent = Agent {
        backend: SimBackend::at(&state),
        client: client(server.clone()),
        node: "test".into(),
        advertise_resources: false,
        gpu_client_selector: Some("app=nvidia-device-plugin-daemonset".into()),
        dra_plugin_selector: None,
        lease_duration: Duration::from_secs(40),
        activity: Default::default(),
    };
    agent.reconcile().await.unwrap();
    assert_eq!(server.lock().unwrap().deleted, vec!["/api/v1/namespaces/gpu/pods/dp".to_string()]);
    let recorded = server.lock().unwrap().recorded.clone();
    let gpus = vec![(sim.inventory().unwrap()[0].clone(), sim.instances(0).unwrap())];
    assert_eq!(recorded, Some(fingerprint(&gpus)), "the restart is recorded");
    agent.reconcile().await.unwrap();
    assert_eq!(server.lock().unwrap().deleted.len(), 1, "recorded: not restarted again");
}

#[test]
fn the_dra_kubelet_plugin_is_restarted_apart_from_the_gpu_clients() {
    assert_eq!(DRA_KUBELET_PLUGIN_SELECTOR, "nvidia-dra-driver-gpu-component=kubelet-plugin");
    let dp = "app in (nvidia-device-plugin-daemonset)";
    let table: [(Option<&str>, Option<&str>, &[&str]); 5] = [
        (Some(dp), Some(DRA_KUBELET_PLUGIN_SELECTOR), &[dp, DRA_KUBELET_PLUGIN_SELECTOR]),
        (None, Some(DRA_KUBELET_PLUGIN_SELECTOR), &[DRA_KUBELET_PLUGIN_SELECTOR]),
        (Some(dp), Some(" "), &[dp]),
        (Some(dp), Some(dp), &[dp]),
        (None, None, &[]),
    ];
    for (clients, dra, want) in table {
        assert_eq!(restart_selectors(clients, dra), want, "{clients:?} {dra:?}");
    }
}

/// An agent with only the DRA kubelet plugin to restart (no GPU client selector) still restarts
/// it after a change: `--gpu-client-selector` is not needed for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dra_kubelet_plugin_alone_is_restarted_after_a_change() {
    let state = temp_dir("dra-plugin").join("sim.json");
    let mut sim = SimBackend::open(&state, &["H100-80GB".into()]).unwrap();
    sim.set_mig_mode(0, true).unwrap();
    sim.create_instance(0, "7g.80gb", 0).unwrap();
    let server = Arc::new(Mutex::new(Server { recorded: Some("before".into()), ..Default::default() }));
    let mut agent = Agent {
        backend: SimBackend::at(&state),
        client: client(server.clone()),
        node: "test".into(),
        advertise_resources: false,
        gpu_client_selector: None,
        dra_plugin_selector: Some(DRA_KUBELET_PLUGIN_SELECTOR.into()),
        lease_duration: Duration::from_secs(40),
        activity: Default::default(),
    };
    agent.reconcile().await.unwrap();
    let s = server.lock().unwrap();
    assert_eq!(s.deleted.len(), 1, "the plugin pod is restarted");
    assert!(
        s.listed.iter().all(|q| q.contains("labelSelector=nvidia-dra-driver-gpu-component%3Dkubelet-plugin")),
        "{:?}",
        s.listed
    );
}
