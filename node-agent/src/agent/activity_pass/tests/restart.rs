//! What a restarted agent takes over from its previous run (the stored summary, its heartbeat
//! Lease), and holders whose PIDs no pod was found for.

use super::*;
use crate::activity::faulty::{Faulty, Read};

fn ago(mins: i64) -> Timestamp {
    Timestamp::now().checked_sub(SignedDuration::from_mins(mins)).unwrap()
}

/// The heartbeat Lease as the previous run left it: renewed at `renewed`, with the failing
/// annotation if any.
fn lease(renewed: Timestamp, failing_since: Option<&str>) -> Value {
    let mut lease = serde_json::json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "test", "namespace": "tessera-node-leases"},
        "spec": {"holderIdentity": "test", "leaseDurationSeconds": 40,
                 "renewTime": renewed.to_string()}});
    if let Some(since) = failing_since {
        lease["metadata"]["annotations"] = serde_json::json!({"tessera.dev/activity-failing-since": since});
    }
    lease
}

/// One idle H100 MIG device, and the summary an earlier run stored for it at `measured`.
fn idle_device(name: &str, measured: Timestamp, idle_since: &str) -> (std::path::PathBuf, String, Value) {
    let state = temp_dir(name).join("sim.json");
    let mut b = SimBackend::open(&state, &["H100-80GB".into()]).unwrap();
    b.set_mig_mode(0, true).unwrap();
    let mig = b.create_instance(0, "3g.40gb", 4).unwrap();
    sim::set_activity(&state, 0, Some(&mig.uuid), 0.0).unwrap();
    let stored = serde_json::json!({"activity": {"measuredAt": measured.to_string(), "devices": [
        {"gpuIndex": 0, "uuid": mig.uuid, "profile": "3g.40gb", "start": 4, "source": "Gpm",
         "activePercent1h": 30, "idleSince": idle_since, "memoryUsedMib": 11}]}});
    (state, mig.uuid, stored)
}

fn written_device(s: &Server, i: usize) -> Value {
    s.patches[i].1["status"]["activity"]["devices"][0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pid_no_pod_was_found_for_is_looked_up_again_and_named_once_found() {
    let dir = temp_dir("activity-pid-unmapped");
    let state = dir.join("sim.json");
    let mut b = SimBackend::open(&state, &["H100-80GB".into()]).unwrap();
    b.set_mig_mode(0, true).unwrap();
    let mig = b.create_instance(0, "3g.40gb", 4).unwrap();
    let uid = "0f3c1e9a-5b7d-4c2e-9a1b-2d3e4f5a6b71";
    let pod = serde_json::json!({"metadata": {"namespace": "ml", "name": "nb-1", "uid": uid},
        "spec": {"nodeName": "test", "containers": []}});
    let server = Arc::new(Mutex::new(Server { pods: vec![pod], ..Default::default() }));
    let mut a = agent(&state, server.clone());
    a.activity.proc_root = dir.join("proc");
    a.activity.write_interval = SignedDuration::ZERO;
    sim::run_process(&state, 0, Some(&mig.uuid), 4242, "python", Some(100)).unwrap();
    // The pod list works, but the PID's cgroup cannot be read yet (a race with its start).
    a.sample_activity().await.unwrap();
    assert_eq!(server.lock().unwrap().pod_lists, 1);
    assert!(written_device(&server.lock().unwrap(), 0)["pod"].is_null());
    std::fs::create_dir_all(dir.join("proc/4242")).unwrap();
    std::fs::write(dir.join("proc/4242/cgroup"), format!("0::/kubepods/besteffort/pod{uid}/ctr")).unwrap();
    // The same PIDs: the one not found is looked up again, found, named and written.
    a.sample_activity().await.unwrap();
    {
        let s = server.lock().unwrap();
        assert_eq!(s.pod_lists, 2, "looked up again");
        let last = s.patches.len() - 1;
        assert_eq!(written_device(&s, last)["pod"]["name"], "nb-1", "{:?}", s.patches);
    }
    // Every PID found: no more lists while they run.
    for _ in 0..4 {
        a.sample_activity().await.unwrap();
    }
    assert_eq!(server.lock().unwrap().pod_lists, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_unreadable_at_restart_keeps_its_stored_figures() {
    let since = "2026-01-01T00:00:00Z";
    let (state, uuid, stored) = idle_device("activity-restart-unread", ago(1), since);
    let server = Arc::new(Mutex::new(Server { stored, lease: Some(lease(ago(0), None)), ..Default::default() }));
    // The GPU's processes cannot be read on the first pass (GPU_IS_LOST): its devices are unread.
    let faulty = Faulty { inner: SimBackend::at(&state), failing: vec![Read::Processes(0)] };
    let mut a = agent_on(faulty, server.clone());
    a.activity.write_interval = SignedDuration::ZERO;
    a.sample_activity().await.unwrap();
    {
        let s = server.lock().unwrap();
        assert_eq!(s.patches.len(), 1, "one first write: {:?}", s.patches);
        let d = written_device(&s, 0);
        assert_eq!(d["uuid"], uuid.as_str(), "kept as stored: {:?}", s.patches);
        assert_eq!(d["idleSince"], since);
        assert_eq!(d["activePercent1h"], 30);
    }
    let text = a.activity.metrics.lock().unwrap().clone();
    assert!(!text.contains("UUID=\"\""), "no GPU UUID known yet: left off /metrics: {text}");
    // Read again: the same idle stretch goes on.
    a.backend.failing.clear();
    a.sample_activity().await.unwrap();
    a.sample_activity().await.unwrap();
    let s = server.lock().unwrap();
    assert_eq!(written_device(&s, s.patches.len() - 1)["idleSince"], since, "{:?}", s.patches);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stretch_does_not_span_an_outage_the_lease_tells_of() {
    let since = "2026-01-01T00:00:00Z";
    let started = Timestamp::now();
    // The previous run's last renewal was an hour ago, its last write two.
    let (state, _, stored) = idle_device("activity-restart-outage", ago(120), since);
    let server = Arc::new(Mutex::new(Server { stored, lease: Some(lease(ago(60), None)), ..Default::default() }));
    let mut a = agent(&state, server.clone());
    a.activity.write_interval = SignedDuration::ZERO;
    // GPM's first sample, then its first figure (idle).
    a.sample_activity().await.unwrap();
    a.sample_activity().await.unwrap();
    let s = server.lock().unwrap();
    let d = written_device(&s, s.patches.len() - 1);
    let idle_since: Timestamp = d["idleSince"].as_str().expect("idle").parse().unwrap();
    assert!(idle_since.as_second() >= started.as_second(), "a new stretch from the restart, not {idle_since}: {d:?}");
    assert_eq!(d["activePercent24h"], 30, "the stored shares are still history: {d:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_carries_the_failing_annotation_of_its_previous_run() {
    // NVML is still broken (the simulator cannot list the GPUs), as it was before the restart.
    let state = temp_dir("activity-restart-failing").join("missing.json");
    let since = ago(30).to_string();
    let server = Arc::new(Mutex::new(Server { lease: Some(lease(ago(0), Some(&since))), ..Default::default() }));
    let mut a = agent(&state, server.clone());
    let annotation =
        |s: &Server| s.leases.last().unwrap()["metadata"]["annotations"]["tessera.dev/activity-failing-since"].clone();
    let want = serde_json::json!(since);
    // The first renewal, before any sample, keeps the annotation.
    a.renew_lease().await.unwrap();
    assert_eq!(annotation(&server.lock().unwrap()), want);
    assert!(a.sample_activity().await.is_err());
    a.renew_lease().await.unwrap();
    assert_eq!(annotation(&server.lock().unwrap()), want, "the same failure, the same since");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_never_brought_the_report_up_to_date_does_not_make_it_current_for_the_next() {
    let since = "2026-01-01T00:00:00Z";
    // Run N stopped two hours ago, its summary current then. Run N+1 either fails every pass
    // (NVML not ready) while renewing, or renews once and is killed before its first pass. Run
    // N+2 starts a minute later: nobody observed the device for two hours.
    for n1_samples in [2, 0] {
        let started = Timestamp::now();
        let (state, _, stored) = idle_device("activity-restart-unseeded", ago(120), since);
        let server = Arc::new(Mutex::new(Server { stored, lease: Some(lease(ago(120), None)), ..Default::default() }));
        let missing = temp_dir("activity-restart-unseeded-n1").join("missing.json");
        let mut n1 = agent(&missing, server.clone());
        n1.renew_lease().await.unwrap();
        for _ in 0..n1_samples {
            assert!(n1.sample_activity().await.is_err());
            n1.renew_lease().await.unwrap();
        }
        let left = server.lock().unwrap().leases.last().unwrap().clone();
        server.lock().unwrap().lease = Some(left);
        let mut n2 = agent(&state, server.clone());
        n2.activity.write_interval = SignedDuration::ZERO;
        n2.sample_activity().await.unwrap();
        n2.sample_activity().await.unwrap();
        let s = server.lock().unwrap();
        let d = written_device(&s, s.patches.len() - 1);
        let idle_since: Timestamp = d["idleSince"].as_str().expect("idle").parse().unwrap();
        assert!(
            idle_since.as_second() >= started.as_second(),
            "N+1 with {n1_samples} failed passes: a new stretch, not {idle_since}: {d:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_time_inherited_from_the_future_is_announced_from_now() {
    // The previous run announced a failure; the clock has stepped back an hour since, so the
    // announced time lies in the future. NVML is still broken.
    let state = temp_dir("activity-restart-failing-future").join("missing.json");
    let future = ago(-60).to_string();
    let server = Arc::new(Mutex::new(Server { lease: Some(lease(ago(0), Some(&future))), ..Default::default() }));
    let mut a = agent(&state, server.clone());
    a.activity.sample_interval = Duration::from_millis(1);
    let before = Timestamp::now();
    a.renew_lease().await.unwrap();
    assert!(a.sample_activity().await.is_err());
    tokio::time::sleep(Duration::from_millis(10)).await;
    a.renew_lease().await.unwrap();
    let s = server.lock().unwrap();
    let since = s.leases.last().unwrap()["metadata"]["annotations"]["tessera.dev/activity-failing-since"].clone();
    let since: Timestamp = since.as_str().expect("still announced").parse().unwrap();
    assert!(since >= before && since <= Timestamp::now(), "capped at the restart, not {since}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passing_read_failure_keeps_the_holder_named_without_a_list_or_a_write() {
    let dir = temp_dir("activity-unread-holder");
    let state = dir.join("sim.json");
    let mut b = SimBackend::open(&state, &["H100-80GB".into()]).unwrap();
    b.set_mig_mode(0, true).unwrap();
    let mig = b.create_instance(0, "3g.40gb", 4).unwrap();
    let uid = "0f3c1e9a-5b7d-4c2e-9a1b-2d3e4f5a6b72";
    let pod = serde_json::json!({"metadata": {"namespace": "ml", "name": "nb-1", "uid": uid},
        "spec": {"nodeName": "test", "containers": []}});
    std::fs::create_dir_all(dir.join("proc/4242")).unwrap();
    std::fs::write(dir.join("proc/4242/cgroup"), format!("0::/kubepods/besteffort/pod{uid}/ctr")).unwrap();
    sim::run_process(&state, 0, Some(&mig.uuid), 4242, "python", Some(100)).unwrap();
    let server = Arc::new(Mutex::new(Server { pods: vec![pod], ..Default::default() }));
    let faulty = Faulty { inner: SimBackend::at(&state), failing: vec![] };
    let mut a = agent_on(faulty, server.clone());
    a.activity.proc_root = dir.join("proc");
    a.activity.write_interval = SignedDuration::ZERO;
    a.sample_activity().await.unwrap();
    assert_eq!(written_device(&server.lock().unwrap(), 0)["pod"]["name"], "nb-1");
    // GPM's first figure (its own write).
    a.sample_activity().await.unwrap();
    let writes = server.lock().unwrap().patches.len();
    // One sample its processes cannot be read (kept as last read), then read again.
    a.backend.failing = vec![Read::Processes(0)];
    a.sample_activity().await.unwrap();
    a.backend.failing.clear();
    a.sample_activity().await.unwrap();
    let s = server.lock().unwrap();
    assert_eq!(s.pod_lists, 1, "the kept device's PIDs are still looked up: no new list");
    assert_eq!(s.patches.len(), writes, "the holder stays named: no write: {:?}", s.patches);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_unreadable_at_restart_keeps_its_stored_holder() {
    let (state, _, mut stored) = idle_device("activity-restart-unread-holder", ago(1), "2026-01-01T00:00:00Z");
    let pod = serde_json::json!({"namespace": "ml", "name": "nb-1", "uid": "uid-nb-1"});
    stored["activity"]["devices"][0]["pod"] = pod.clone();
    let server = Arc::new(Mutex::new(Server { stored, lease: Some(lease(ago(0), None)), ..Default::default() }));
    let faulty = Faulty { inner: SimBackend::at(&state), failing: vec![Read::Processes(0)] };
    let mut a = agent_on(faulty, server.clone());
    a.activity.write_interval = SignedDuration::ZERO;
    a.sample_activity().await.unwrap();
    let s = server.lock().unwrap();
    assert_eq!(written_device(&s, 0)["pod"], pod, "the stored holder, not unnamed: {:?}", s.patches);
}
