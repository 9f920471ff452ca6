use std::sync::{Arc, Mutex};

use kube::Client;
use serde_json::Value;

use std::time::Duration;

use k8s_openapi::jiff::SignedDuration;

use super::*;
use crate::backend::sim::{self, SimBackend};
use crate::testutil::temp_dir;

/// The API server's side: each status patch as (query, body); fail the next `fail` writes.
#[derive(Default)]
struct Server {
    patches: Vec<(String, Value)>,
    fail: u32,
    /// Pod lists (the holder lookups).
    pod_lists: u32,
    /// The GpuNode's stored `status` (what an earlier run wrote).
    stored: Value,
    /// GpuNode reads.
    reads: u32,
    /// The pods listed (items of the PodList) and each pod list's query.
    pods: Vec<Value>,
    pod_queries: Vec<String>,
    /// Fail the next `fail_pod_lists` pod lists.
    fail_pod_lists: u32,
    /// Each heartbeat Lease apply's body.
    leases: Vec<Value>,
    /// The GpuNode's UID in the answers to status writes.
    uid: Option<String>,
    /// The heartbeat Lease a GET finds (what the previous run left); `None`: not found.
    lease: Option<Value>,
    /// An older CRD without `status.activity`: the answer to a status write lacks it (pruned).
    prune: bool,
}

fn agent(state: &std::path::Path, server: Arc<Mutex<Server>>) -> Agent<SimBackend> {
    agent_on(SimBackend::at(state), server)
}

/// [`agent`] over any backend (a faulty one).
fn agent_on<B: crate::backend::GpuBackend>(backend: B, server: Arc<Mutex<Server>>) -> Agent<B> {
    let mut agent = Agent::offline(backend);
    agent.client = Client::new(
        tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let server = server.clone();
            async move {
                let query = req.uri().query().unwrap_or_default().to_string();
                let path = req.uri().path().to_string();
                let get = req.method() == http::Method::GET;
                let body = req.into_body().collect_bytes().await.map_err(|e| std::io::Error::other(e.to_string()))?;
                let mut s = server.lock().unwrap();
                if path == "/api/v1/pods" {
                    s.pod_lists += 1;
                    s.pod_queries.push(query);
                    if s.fail_pod_lists > 0 {
                        s.fail_pod_lists -= 1;
                        return Err(std::io::Error::other("API server unavailable"));
                    }
                    let list =
                        serde_json::json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": s.pods});
                    return Ok(http::Response::new(kube::client::Body::from(list.to_string().into_bytes())));
                }
                if path.ends_with("/leases/test") && get {
                    let Some(lease) = s.lease.clone() else {
                        let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "reason": "NotFound", "code": 404, "message": "leases \"test\" not found"});
                        let mut res = http::Response::new(kube::client::Body::from(status.to_string().into_bytes()));
                        *res.status_mut() = http::StatusCode::NOT_FOUND;
                        return Ok(res);
                    };
                    return Ok(http::Response::new(kube::client::Body::from(lease.to_string().into_bytes())));
                }
                if path.ends_with("/leases/test") {
                    let lease: Value = serde_json::from_slice(&body).unwrap();
                    s.leases.push(lease.clone());
                    return Ok(http::Response::new(kube::client::Body::from(lease.to_string().into_bytes())));
                }
                if path.ends_with("/gpunodes/test") {
                    s.reads += 1;
                    let node = serde_json::json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
                        "metadata": {"name": "test"}, "spec": {}, "status": s.stored});
                    return Ok(http::Response::new(kube::client::Body::from(node.to_string().into_bytes())));
                }
                assert!(path.ends_with("/gpunodes/test/status"), "only the status is written: {path}");
                if s.fail > 0 {
                    s.fail -= 1;
                    return Err(std::io::Error::other("API server unavailable"));
                }
                let patch: Value = serde_json::from_slice(&body).unwrap();
                // The stored object, as a real server answers: the status sent (the CRD's schema
                // known), or without `activity` (pruned by an older CRD).
                let mut status = patch["status"].clone();
                if s.prune {
                    status.as_object_mut().map(|o| o.remove("activity"));
                }
                // The reconcile's status apply leaves the stored summary (another manager's).
                if status.get("activity").is_none() && s.stored.get("activity").is_some() {
                    status["activity"] = s.stored["activity"].clone();
                }
                s.patches.push((query, patch));
                let out = serde_json::json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
                    "metadata": {"name": "test", "uid": s.uid}, "spec": {}, "status": status});
                Ok::<_, std::io::Error>(http::Response::new(kube::client::Body::from(out.to_string().into_bytes())))
            }
        }),
        "default",
    );
    agent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_only_activity_under_its_own_manager_once_per_change_and_retries_a_failed_write() {
    let state = temp_dir("activity-writer").join("sim.json");
    let mut b = SimBackend::open(&state, &["H100-80GB".into()]).unwrap();
    b.set_mig_mode(0, true).unwrap();
    let mig = b.create_instance(0, "3g.40gb", 4).unwrap();
    sim::set_activity(&state, 0, Some(&mig.uuid), 50.0).unwrap();
    let server = Arc::new(Mutex::new(Server { fail: 1, ..Default::default() }));
    let mut a = agent(&state, server.clone());
    a.activity.write_interval = SignedDuration::ZERO;
    // The first write fails: nothing counts as written, the next sample writes.
    assert!(a.sample_activity().await.is_err());
    assert!(a.activity.last.is_none());
    a.sample_activity().await.unwrap();
    // Unchanged: no write.
    a.sample_activity().await.unwrap();
    let patches = server.lock().unwrap().patches.clone();
    assert_eq!(patches.len(), 1, "{patches:?}");
    let text = a.activity.metrics.lock().unwrap().clone();
    // DCGM's labels: `UUID` the GPU's, the MIG device's own as `MIG_UUID`.
    let gpu = b.inventory().unwrap()[0].uuid.clone();
    assert!(text.contains(&format!("tessera_gpu_sm_active_ratio{{gpu=\"0\",UUID=\"{gpu}\"")), "{text}");
    assert!(text.contains(&format!(",MIG_UUID=\"{}\",GPU_I_ID=", mig.uuid)), "{text}");
    let (query, body) = &patches[0];
    assert!(query.contains("fieldManager=tessera-node-agent-activity"), "{query}");
    assert!(query.contains("force=true"), "{query}");
    let status = body["status"].as_object().unwrap();
    assert_eq!(status.keys().collect::<Vec<_>>(), vec!["activity"], "only the activity is applied");
    let dev = &body["status"]["activity"]["devices"][0];
    assert_eq!(dev["uuid"], mig.uuid.as_str());
    assert_eq!(dev["source"], "Gpm");
    // Going idle is news.
    sim::set_activity(&state, 0, Some(&mig.uuid), 0.0).unwrap();
    a.sample_activity().await.unwrap();
    let patches = server.lock().unwrap().patches.clone();
    assert_eq!(patches.len(), 2);
    assert!(patches[1].1["status"]["activity"]["devices"][0]["idleSince"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_the_server_keeps_refusing_backs_off_instead_of_retrying_every_sample() {
    let state = temp_dir("activity-backoff").join("sim.json");
    let mut b = SimBackend::open(&state, &["H100-80GB".into()]).unwrap();
    b.set_mig_mode(0, true).unwrap();
    b.create_instance(0, "3g.40gb", 4).unwrap();
    let server = Arc::new(Mutex::new(Server { fail: 100, ..Default::default() }));
    let mut a = agent(&state, server.clone());
    a.activity.write_interval = SignedDuration::ZERO;
    // Tries at samples 0, 1 and 3; 2 and 4..6 wait.
    let got: Vec<bool> = {
        let mut out = Vec::new();
        for _ in 0..7 {
            out.push(a.sample_activity().await.is_err());
        }
        out
    };
    assert_eq!(got, vec![true, true, false, true, false, false, false]);
    assert_eq!(server.lock().unwrap().fail, 97, "three writes tried in seven samples");
    // Once the server answers, the next try writes and the wait starts over.
    server.lock().unwrap().fail = 0;
    a.sample_activity().await.unwrap();
    assert_eq!(server.lock().unwrap().patches.len(), 1);
    assert_eq!(a.activity.backoff, Default::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_are_looked_up_only_when_the_processes_change() {
    let state = temp_dir("activity-holders").join("sim.json");
    let mut b = SimBackend::open(&state, &["H100-80GB".into()]).unwrap();
    b.set_mig_mode(0, true).unwrap();
    let mig = b.create_instance(0, "3g.40gb", 4).unwrap();
    // Both PIDs run in one pod (their cgroups say so): found by the first list that asks.
    let (proc, uid) = (state.with_file_name("proc"), "0f3c1e9a-5b7d-4c2e-9a1b-2d3e4f5a6b71");
    for pid in ["4242", "4243"] {
        std::fs::create_dir_all(proc.join(pid)).unwrap();
        std::fs::write(proc.join(pid).join("cgroup"), format!("0::/kubepods/besteffort/pod{uid}/ctr")).unwrap();
    }
    let pod =
        serde_json::json!({"metadata": {"namespace": "ml", "name": "nb", "uid": uid}, "spec": {"containers": []}});
    let server = Arc::new(Mutex::new(Server { pods: vec![pod], ..Default::default() }));
    let mut a = agent(&state, server.clone());
    a.activity.proc_root = proc;
    a.sample_activity().await.unwrap();
    assert_eq!(server.lock().unwrap().pod_lists, 0, "no process, no lookup");
    sim::run_process(&state, 0, Some(&mig.uuid), 4242, "python", Some(100)).unwrap();
    a.sample_activity().await.unwrap();
    a.sample_activity().await.unwrap();
    assert_eq!(server.lock().unwrap().pod_lists, 1, "the same PIDs: looked up once");
    sim::run_process(&state, 0, Some(&mig.uuid), 4243, "python", Some(100)).unwrap();
    a.sample_activity().await.unwrap();
    assert_eq!(server.lock().unwrap().pod_lists, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_devices_pod_is_listed_from_the_watch_cache_retried_on_failure_and_written_on_change() {
    let dir = temp_dir("activity-pod");
    let state = dir.join("sim.json");
    let mut b = SimBackend::open(&state, &["H100-80GB".into()]).unwrap();
    b.set_mig_mode(0, true).unwrap();
    let mig = b.create_instance(0, "3g.40gb", 4).unwrap();
    // Two pods on the node; PID 4242 runs in the first, 4243 in the second (their cgroups).
    let uid = |n: u32| format!("0f3c1e9a-5b7d-4c2e-9a1b-2d3e4f5a6b7{n}");
    for (pid, n) in [(4242, 1), (4243, 2)] {
        std::fs::create_dir_all(dir.join("proc").join(pid.to_string())).unwrap();
        let cgroup = format!("0::/kubepods/besteffort/pod{}/ctr", uid(n));
        std::fs::write(dir.join("proc").join(pid.to_string()).join("cgroup"), cgroup).unwrap();
    }
    let pod = |n: u32| {
        serde_json::json!({"metadata": {"namespace": "ml", "name": format!("nb-{n}"), "uid": uid(n)},
            "spec": {"nodeName": "test", "containers": []}})
    };
    let server = Arc::new(Mutex::new(Server { pods: vec![pod(1), pod(2)], fail_pod_lists: 1, ..Default::default() }));
    let mut a = agent(&state, server.clone());
    a.activity.proc_root = dir.join("proc");
    a.activity.write_interval = SignedDuration::ZERO;
    sim::set_activity(&state, 0, Some(&mig.uuid), 50.0).unwrap();
    sim::run_process(&state, 0, Some(&mig.uuid), 4242, "python", Some(100)).unwrap();
    // The first pod list fails: no pod named, and the next sample lists again.
    a.sample_activity().await.unwrap();
    assert!(server.lock().unwrap().patches[0].1["status"]["activity"]["devices"][0]["pod"].is_null());
    // The next: the first share and the pod (news), then at rest.
    for _ in 0..3 {
        a.sample_activity().await.unwrap();
    }
    let named = |s: &Server, i: usize| s.patches[i].1["status"]["activity"]["devices"][0]["pod"].clone();
    {
        let s = server.lock().unwrap();
        assert_eq!(s.pod_lists, 2, "a failed list is tried again, once");
        assert_eq!(s.patches.len(), 2, "at rest: no write for the holder");
        assert_eq!(named(&s, 1), serde_json::json!({"namespace": "ml", "name": "nb-1", "uid": uid(1)}));
        let query = &s.pod_queries[1];
        for part in ["fieldSelector=spec.nodeName%3Dtest", "resourceVersion=0", "resourceVersionMatch=NotOlderThan"] {
            assert!(query.split('&').any(|q| q == part), "the pod list is served from the watch cache: {query}");
        }
    }
    // The first pod's process ends, the second's starts: the device has another holder.
    sim::stop_process(&state, 4242).unwrap();
    sim::run_process(&state, 0, Some(&mig.uuid), 4243, "python", Some(100)).unwrap();
    a.sample_activity().await.unwrap();
    let s = server.lock().unwrap();
    assert_eq!(s.patches.len(), 3, "a new holder is news");
    assert_eq!(named(&s, 2)["name"], "nb-2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_keeps_the_stored_idle_since_and_reads_it_once() {
    let state = temp_dir("activity-restart").join("sim.json");
    let mut b = SimBackend::open(&state, &["H100-80GB".into()]).unwrap();
    b.set_mig_mode(0, true).unwrap();
    let mig = b.create_instance(0, "3g.40gb", 4).unwrap();
    let gone = "MIG-00000000-0000-0000-0000-000000000000";
    sim::set_activity(&state, 0, Some(&mig.uuid), 0.0).unwrap();
    let since = "2026-01-01T00:00:00Z";
    let measured = Timestamp::now().checked_sub(SignedDuration::from_mins(1)).unwrap().to_string();
    let stored = serde_json::json!({"activity": {"measuredAt": measured, "devices": [
        {"gpuIndex": 0, "uuid": mig.uuid, "source": "Gpm", "activePercent1h": 30, "idleSince": since},
        {"gpuIndex": 0, "uuid": gone, "source": "Gpm", "idleSince": since}]}});
    let server = Arc::new(Mutex::new(Server { stored, ..Default::default() }));
    let mut a = agent(&state, server.clone());
    a.activity.write_interval = SignedDuration::ZERO;
    a.sample_activity().await.unwrap();
    a.sample_activity().await.unwrap();
    let s = server.lock().unwrap();
    assert_eq!(s.reads, 1, "the stored summary is read once per run");
    let devices = s.patches[0].1["status"]["activity"]["devices"].as_array().unwrap().clone();
    assert_eq!(devices.len(), 1, "a device that no longer exists is not carried: {devices:?}");
    assert_eq!(devices[0]["uuid"], mig.uuid.as_str());
    assert_eq!(devices[0]["idleSince"], since, "{devices:?}");
    assert_eq!(devices[0]["activePercent1h"], 30, "{devices:?}");
    let last = &s.patches.last().unwrap().1["status"]["activity"]["devices"][0];
    assert_eq!(last["idleSince"], since, "still idle on GPM's first figure: {last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_stored_summary_fails_the_pass_instead_of_starting_empty() {
    let state = temp_dir("activity-unreadable").join("sim.json");
    let mut b = SimBackend::open(&state, &["H100-80GB".into()]).unwrap();
    b.set_mig_mode(0, true).unwrap();
    b.create_instance(0, "3g.40gb", 4).unwrap();
    let mut a = agent(&state, Arc::new(Mutex::new(Server::default())));
    a.client = Client::new(
        tower::service_fn(|_req: http::Request<kube::client::Body>| async move {
            Err::<http::Response<kube::client::Body>, _>(std::io::Error::other("API server unavailable"))
        }),
        "default",
    );
    assert!(a.sample_activity().await.is_err());
    assert!(!a.activity.seeded, "tried again on the next sample");
    assert!(a.activity.last.is_none(), "nothing written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_rendered_while_the_stored_summary_cannot_be_read() {
    let state = temp_dir("activity-unseeded-metrics").join("sim.json");
    let mut b = SimBackend::open(&state, &["H100-80GB".into()]).unwrap();
    b.set_mig_mode(0, true).unwrap();
    let mig = b.create_instance(0, "3g.40gb", 4).unwrap();
    sim::run_process(&state, 0, Some(&mig.uuid), 7, "python", Some(2048)).unwrap();
    let mut a = agent(&state, Arc::new(Mutex::new(Server::default())));
    a.client = Client::new(
        tower::service_fn(|_req: http::Request<kube::client::Body>| async move {
            Err::<http::Response<kube::client::Body>, _>(std::io::Error::other("API server unavailable"))
        }),
        "default",
    );
    assert!(a.sample_activity().await.is_err(), "the pass still fails: nothing can be written");
    let text = a.activity.metrics.lock().unwrap().clone();
    assert!(text.lines().any(|l| l.starts_with("tessera_gpu_fb_used_mib{") && l.ends_with(" 2048")), "{text}");
    assert!(!a.activity.seeded, "seeding is tried again on the next sample");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_left_behind_past_two_samples_rides_on_the_heartbeat_lease_until_current_again() {
    let state = temp_dir("activity-failing").join("sim.json");
    let mut b = SimBackend::open(&state, &["H100-80GB".into()]).unwrap();
    b.set_mig_mode(0, true).unwrap();
    b.create_instance(0, "3g.40gb", 4).unwrap();
    let server = Arc::new(Mutex::new(Server { fail: 100, ..Default::default() }));
    let mut a = agent(&state, server.clone());
    a.activity.write_interval = SignedDuration::ZERO;
    // Two samples are 20 s at first (none elapses), then 2 ms (both elapse).
    a.activity.sample_interval = Duration::from_secs(10);
    let annotation =
        |s: &Server| s.leases.last().unwrap()["metadata"]["annotations"]["tessera.dev/activity-failing-since"].clone();
    // The write is refused: a first failure is not announced yet (retried next sample).
    assert!(a.sample_activity().await.is_err());
    let since = a.activity.failing.expect("the first failure is recorded");
    a.renew_lease().await.unwrap();
    assert!(annotation(&server.lock().unwrap()).is_null(), "within two samples: not announced");
    // Still refused (or waiting out the back-off) two samples later: announced, with since when.
    a.activity.sample_interval = Duration::from_millis(1);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let _ = a.sample_activity().await;
    a.renew_lease().await.unwrap();
    let want = serde_json::json!(since.to_string());
    assert_eq!(annotation(&server.lock().unwrap()), want);
    // The server answers again: once written, the renewal leaves the annotation out (server-side
    // apply removes it).
    server.lock().unwrap().fail = 0;
    for _ in 0..4 {
        let _ = a.sample_activity().await;
    }
    assert_eq!(server.lock().unwrap().patches.len(), 1);
    assert_eq!(a.activity.failing, None);
    a.renew_lease().await.unwrap();
    assert!(annotation(&server.lock().unwrap()).is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_that_cannot_be_listed_leave_the_report_behind_and_are_announced() {
    // No state file: the simulator cannot list the GPUs.
    let state = temp_dir("activity-unlisted").join("missing.json");
    let server = Arc::new(Mutex::new(Server::default()));
    let mut a = agent(&state, server.clone());
    a.activity.sample_interval = Duration::from_millis(1);
    assert!(a.sample_activity().await.is_err());
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(a.sample_activity().await.is_err());
    let since = a.activity.failing.unwrap();
    assert_eq!(a.activity.failing_since(Timestamp::now()), Some(since));
    assert!(server.lock().unwrap().patches.is_empty());
    // The heartbeat Lease carries it to the operator.
    a.renew_lease().await.unwrap();
    let lease = server.lock().unwrap().leases.last().unwrap().clone();
    let want = serde_json::json!(since.to_string());
    assert_eq!(lease["metadata"]["annotations"]["tessera.dev/activity-failing-since"], want);
}

/// The stored summary against what was written (a recreated GpuNode, a back-off left over).
mod stored;

mod prune;
/// What a restarted agent takes over from its previous run, and holders looked up again.
mod restart;
