//! The activity writer against an older CRD whose schema lacks `status.activity` (the agent
//! upgraded first): the API server prunes what it does not know.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_crd_that_prunes_the_summary_is_written_at_the_interval_not_every_reconcile() {
    let state = temp_dir("activity-pruned").join("sim.json");
    let mut b = SimBackend::open(&state, &["H100-80GB"].map(String::from)).unwrap();
    b.set_mig_mode(0, true).unwrap();
    let mig = b.create_instance(0, "3g.40gb", 4).unwrap();
    sim::set_activity(&state, 0, Some(&mig.uuid), 0.0).unwrap();
    let server = Arc::new(Mutex::new(Server { prune: true, ..Default::default() }));
    let mut a = agent(&state, server.clone());
    a.activity.write_interval = SignedDuration::from_hours(1);
    // The activity writes (the reconcile writes the rest of the status too).
    let written = |s: &Arc<Mutex<Server>>| {
        s.lock().unwrap().patches.iter().filter(|p| p.1["status"].get("activity").is_some()).count()
    };
    a.sample_activity().await.unwrap();
    assert_eq!(written(&server), 1);
    assert_eq!(a.activity.pruned, Some(vec!["status.activity".to_string()]), "the answer lacks what was sent");
    // The reconcile finds no summary stored, as expected of that CRD: no write per reconcile.
    for _ in 0..3 {
        a.reconcile().await.unwrap();
        a.sample_activity().await.unwrap();
    }
    assert_eq!(written(&server), 1, "at most one write per interval while the CRD prunes it");
    assert_eq!(a.activity.failing, None, "nothing the write could do better: not announced as failing");
    // The interval passes (here: set to 0) and the CRD was upgraded meanwhile: the next sample
    // writes again at rest and the summary is stored.
    server.lock().unwrap().prune = false;
    a.activity.write_interval = SignedDuration::ZERO;
    a.sample_activity().await.unwrap();
    assert_eq!(written(&server), 2);
    assert_eq!(a.activity.pruned, None);
    let stored = server.lock().unwrap().patches.last().unwrap().1["status"].clone();
    server.lock().unwrap().stored = stored;
    a.reconcile().await.unwrap();
    a.sample_activity().await.unwrap();
    assert_eq!(written(&server), 2, "stored and at rest: nothing more");
}

#[test]
fn dropped_fields_are_named_by_path() {
    use serde_json::json;
    let sent = json!({"measuredAt": "t", "devices": [{"gpuIndex": 0, "pod": {"name": "a"}, "memoryUsedMib": 12},
        {"gpuIndex": 1, "pod": {"name": "b"}}]});
    assert_eq!(crate::activity::prune::dropped(&sent, &sent.clone(), "status.activity"), Vec::<String>::new());
    let got = json!({"measuredAt": "t", "devices": [{"gpuIndex": 0, "memoryUsedMib": 0}, {"gpuIndex": 1}]});
    assert_eq!(
        crate::activity::prune::dropped(&sent, &got, "status.activity"),
        vec!["status.activity.devices[].memoryUsedMib", "status.activity.devices[].pod"]
    );
    assert_eq!(
        crate::activity::prune::dropped(&sent, &serde_json::Value::Null, "status.activity"),
        vec!["status.activity"]
    );
}
