//! The activity writer against what is stored: a recreated GpuNode, a back-off left over.

use super::*;

/// Samples until a sample writes nothing (the summary settled), at most five.
async fn settle(a: &mut Agent<SimBackend>, server: &Arc<Mutex<Server>>) {
    for _ in 0..5 {
        let before = server.lock().unwrap().patches.len();
        a.sample_activity().await.unwrap();
        if server.lock().unwrap().patches.len() == before {
            return;
        }
    }
    panic!("the summary never settled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_summary_back_to_what_was_written_ends_the_back_off_and_the_failure() {
    let state = temp_dir("activity-backoff-reset").join("sim.json");
    let mut b = SimBackend::open(&state, &["H100-80GB".into()]).unwrap();
    b.set_mig_mode(0, true).unwrap();
    let mig = b.create_instance(0, "3g.40gb", 4).unwrap();
    sim::set_activity(&state, 0, Some(&mig.uuid), 50.0).unwrap();
    let server = Arc::new(Mutex::new(Server::default()));
    let mut a = agent(&state, server.clone());
    a.activity.write_interval = SignedDuration::ZERO;
    settle(&mut a, &server).await;
    // A process appears (news); the server refuses four tries (samples 0, 1, 3, 7 of eight).
    server.lock().unwrap().fail = 100;
    sim::run_process(&state, 0, Some(&mig.uuid), 7, "python", Some(2048)).unwrap();
    for _ in 0..8 {
        let _ = a.sample_activity().await;
    }
    assert_eq!(server.lock().unwrap().fail, 96);
    // It ends: the summary is what is stored again, nothing is due, and nothing is failing.
    sim::stop_process(&state, 7).unwrap();
    a.sample_activity().await.unwrap();
    assert_eq!(a.activity.failing, None);
    assert_eq!(a.activity.backoff, Default::default(), "no wait left over");
    // Much later the next change is written at once, not after the rest of the old wait.
    server.lock().unwrap().fail = 0;
    let written = server.lock().unwrap().patches.len();
    sim::run_process(&state, 0, Some(&mig.uuid), 8, "python", Some(2048)).unwrap();
    a.sample_activity().await.unwrap();
    assert_eq!(server.lock().unwrap().patches.len(), written + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_gpu_node_or_a_removed_summary_is_written_again_at_rest() {
    let state = temp_dir("activity-recreated").join("sim.json");
    let mut b = SimBackend::open(&state, &["H100-80GB".into()]).unwrap();
    b.set_mig_mode(0, true).unwrap();
    let mig = b.create_instance(0, "3g.40gb", 4).unwrap();
    sim::set_activity(&state, 0, Some(&mig.uuid), 0.0).unwrap();
    let server = Arc::new(Mutex::new(Server { uid: Some("uid-1".into()), ..Default::default() }));
    let mut a = agent(&state, server.clone());
    a.activity.write_interval = SignedDuration::ZERO;
    settle(&mut a, &server).await;
    let stored = |uid: &str, activity: Option<&NodeActivity>| -> GpuNode {
        serde_json::from_value(serde_json::json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
            "metadata": {"name": "test", "uid": uid}, "spec": {},
            "status": {"activity": activity}}))
        .unwrap()
    };
    let written = a.activity.last.clone().unwrap().1;
    // The reconcile reads the GpuNode as written: nothing to do.
    a.activity.check_stored(&stored("uid-1", Some(&written)));
    let n = server.lock().unwrap().patches.len();
    a.sample_activity().await.unwrap();
    assert_eq!(server.lock().unwrap().patches.len(), n, "at rest, stored: no write");
    // Deleted and recreated (by the reconcile): no summary stored; the next sample writes it.
    server.lock().unwrap().uid = Some("uid-2".into());
    a.activity.check_stored(&stored("uid-2", None));
    a.sample_activity().await.unwrap();
    assert_eq!(server.lock().unwrap().patches.len(), n + 1);
    // Recreated with a summary another writer left (another UID than the one written to).
    a.activity.check_stored(&stored("uid-2", Some(&written)));
    a.sample_activity().await.unwrap();
    assert_eq!(server.lock().unwrap().patches.len(), n + 1, "same object: no write");
    server.lock().unwrap().uid = Some("uid-3".into());
    a.activity.check_stored(&stored("uid-3", Some(&written)));
    a.sample_activity().await.unwrap();
    assert_eq!(server.lock().unwrap().patches.len(), n + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leak_ending_at_an_idle_devices_baseline_is_written() {
    let state = temp_dir("activity-leak-baseline").join("sim.json");
    let mut b = SimBackend::open(&state, &["H100-80GB"].map(String::from)).unwrap();
    b.set_mig_mode(0, true).unwrap();
    let mig = b.create_instance(0, "3g.40gb", 4).unwrap();
    sim::set_activity(&state, 0, Some(&mig.uuid), 0.0).unwrap();
    // Real hardware: an idle MIG device shows some MiB in use, never 0.
    sim::leak_memory(&state, 0, &mig.uuid, 11).unwrap();
    let server = Arc::new(Mutex::new(Server::default()));
    let mut a = agent(&state, server.clone());
    a.activity.write_interval = SignedDuration::ZERO;
    settle(&mut a, &server).await;
    let written = |s: &Arc<Mutex<Server>>| s.lock().unwrap().patches.len();
    let memory = |s: &Arc<Mutex<Server>>| {
        s.lock().unwrap().patches.last().unwrap().1["status"]["activity"]["devices"][0]["memoryUsedMib"].clone()
    };
    let n = written(&server);
    // A leak begins (2 GiB, no process) and ends (back to the baseline): both written.
    sim::leak_memory(&state, 0, &mig.uuid, 2048).unwrap();
    a.sample_activity().await.unwrap();
    assert_eq!((written(&server), memory(&server)), (n + 1, 2048.into()));
    sim::leak_memory(&state, 0, &mig.uuid, 11).unwrap();
    a.sample_activity().await.unwrap();
    assert_eq!((written(&server), memory(&server)), (n + 2, 11.into()));
    // The baseline moving a little is nothing.
    sim::leak_memory(&state, 0, &mig.uuid, 14).unwrap();
    a.sample_activity().await.unwrap();
    assert_eq!(written(&server), n + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconcile_pass_checks_what_is_stored() {
    let state = temp_dir("activity-reconcile-checks").join("sim.json");
    let mut b = SimBackend::open(&state, &["H100-80GB"].map(String::from)).unwrap();
    b.set_mig_mode(0, true).unwrap();
    b.create_instance(0, "3g.40gb", 4).unwrap();
    let server = Arc::new(Mutex::new(Server::default()));
    let mut a = agent(&state, server.clone());
    a.activity.write_interval = SignedDuration::ZERO;
    settle(&mut a, &server).await;
    assert!(a.activity.last.is_some());
    // The GpuNode the reconcile reads stores no summary (recreated): what was written is
    // forgotten, so the next sample writes.
    a.reconcile().await.unwrap();
    assert!(a.activity.last.is_none());
}
