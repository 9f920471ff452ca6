use serde_json::json;

use super::*;

fn pod(name: &str, node: Option<&str>, resource: &str) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "x",
            "creationTimestamp": "2026-06-01T09:00:00Z", "labels": {"big": "label"}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i",
            "resources": {"requests": {resource: "1"}}}]}}))
    .unwrap()
}

fn gpu() -> Pod {
    pod("g", None, "nvidia.com/mig-1g.10gb")
}

/// Only GPU pods reach the cache, bare; others leave it; a pass wakes only when the cached set
/// changes (a new GPU pod, one bound or gone, the end of a re-list).
#[test]
fn only_unbound_gpu_pods_are_cached_and_only_their_changes_wake_a_pass() {
    let want_bare = Pod {
        metadata: ObjectMeta {
            name: Some("g".into()),
            namespace: Some("x".into()),
            creation_timestamp: gpu().metadata.creation_timestamp,
            annotations: Some([("tessera.dev/gpu-resources".to_string(), "nvidia.com/mig-1g.10gb".to_string())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let (no, yes) = (|_: &Pod| false, |_: &Pod| true);
    let got = sift(Event::Apply(gpu()), no).unwrap();
    assert!(matches!(&got, (Event::Apply(p), true) if *p == want_bare), "{got:?}");
    assert!(matches!(sift(Event::Apply(gpu()), yes), Some((Event::Apply(_), false))), "an update of a cached pod");
    let cpu = pod("c", None, "cpu");
    assert!(matches!(sift(Event::Apply(cpu.clone()), no), Some((Event::Delete(_), false))), "never cached");
    let bound = pod("g", Some("n1"), "nvidia.com/mig-1g.10gb");
    assert!(matches!(sift(Event::Apply(bound), yes), Some((Event::Delete(_), true))), "bound: leaves the cache");
    assert!(matches!(sift(Event::Delete(gpu()), yes), Some((Event::Delete(_), true))));
    assert!(matches!(sift(Event::Delete(cpu.clone()), no), Some((Event::Delete(_), false))));
    assert!(matches!(sift(Event::InitApply(gpu()), no), Some((Event::InitApply(p), false)) if p == want_bare));
    assert!(sift(Event::InitApply(cpu), no).is_none(), "a re-list keeps only GPU pods");
    assert!(matches!(sift(Event::InitDone, no), Some((Event::InitDone, true))));
}

#[test]
fn the_planner_reads_the_cached_pods() {
    let (store, mut writer) = reflector::store::<Pod>();
    let (ev, _) = sift(Event::Apply(gpu()), |_| false).unwrap();
    writer.apply_watcher_event(&ev);
    let created = gpu().metadata.creation_timestamp.map(|t| t.0);
    assert_eq!(
        pending(&store),
        vec![PendingPod {
            namespace: "x".into(),
            name: "g".into(),
            created,
            resources: ["nvidia.com/mig-1g.10gb".to_string()].into()
        }]
    );
}

/// Through the cache's store: a pass is woken exactly where [`sift`] says, and the store holds
/// the unbound GPU pods only.
#[tokio::test]
async fn the_pod_cache_wakes_a_pass_exactly_where_sift_says() {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let (store, writer) = reflector::store::<Pod>();
    let changed = Arc::new(Notify::new());
    tokio::spawn(keep_pods(rx, writer, changed.clone()));
    let names = || {
        let mut names: Vec<String> = store.state().iter().filter_map(|p| p.metadata.name.clone()).collect();
        names.sort();
        names
    };
    let (cpu, other) = (pod("c", None, "cpu"), pod("h", None, "nvidia.com/mig-1g.10gb"));
    let steps = [
        (Event::Init, false),
        (Event::InitApply(gpu()), false),
        (Event::InitApply(cpu.clone()), false),
        (Event::InitDone, true),
        (Event::Apply(gpu()), false),
        (Event::Apply(cpu.clone()), false),
        (Event::Delete(cpu), false),
        (Event::Apply(other.clone()), true),
        (Event::Apply(pod("g", Some("n1"), "nvidia.com/mig-1g.10gb")), true),
    ];
    for (i, (event, wakes)) in steps.into_iter().enumerate() {
        tx.unbounded_send(Ok(event)).unwrap();
        let woken = tokio::time::timeout(std::time::Duration::from_millis(200), changed.notified()).await.is_ok();
        assert_eq!(woken, wakes, "step {i}");
    }
    assert_eq!(names(), ["h"], "the bound pod left the cache, the CPU pod never entered it");
    tx.unbounded_send(Ok(Event::Delete(other))).unwrap();
    assert!(tokio::time::timeout(std::time::Duration::from_secs(5), changed.notified()).await.is_ok());
    assert!(names().is_empty());
}
