use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use serde_json::json;

use super::{bare, holders, sift};
use crate::quota_controller::test_support::store_of;

fn pod(name: &str, node: Option<&str>, phase: &str, gpus: i64) -> Pod {
    serde_json::from_value(
        json!({"metadata": {"name": name, "namespace": "a", "creationTimestamp": "2026-12-01T00:00:00Z",
            "labels": {"big": "label"}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x",
            "resources": {"limits": {"nvidia.com/mig-1g.10gb": gpus.to_string(), "cpu": "1"}}}]},
        "status": {"phase": phase}}),
    )
    .unwrap()
}

#[test]
fn only_charged_pods_are_kept_bare_and_a_binding_wakes_a_pass() {
    let p = pod("p", None, "Pending", 2);
    let (event, wake) = sift(Event::Apply(p.clone()), |_| None).unwrap();
    let Event::Apply(kept) = event else { panic!("kept") };
    assert!(wake, "new");
    assert!(kept.metadata.labels.is_none(), "bare");
    // The same pod again wakes nothing; bound, it wakes.
    let cached = kept.clone();
    assert!(!sift(Event::Apply(p), |_| Some(cached.clone())).unwrap().1);
    assert!(sift(Event::Apply(pod("p", Some("n1"), "Running", 2)), |_| Some(cached.clone())).unwrap().1);
    // Finished: dropped from the cache, waking (it was there).
    let (event, wake) = sift(Event::Apply(pod("p", Some("n1"), "Succeeded", 2)), |_| Some(cached.clone())).unwrap();
    assert!(matches!(event, Event::Delete(_)) && wake);
    // A CPU pod is never kept.
    assert!(bare(&pod("cpu", None, "Pending", 0)).is_none());
}

#[test]
fn the_cache_gives_each_namespace_its_holders_with_charges_and_binding() {
    let store = store_of(vec![
        bare(&pod("a", Some("n1"), "Running", 2)).unwrap(),
        bare(&pod("b", None, "Pending", 1)).unwrap(),
    ]);
    let hs = holders(&store);
    let mut a = hs["a"].clone();
    a.sort_by(|x, y| x.name.cmp(&y.name));
    assert_eq!(a.len(), 2);
    assert_eq!(a[0].charges["requests.nvidia.com/mig-1g.10gb"], 2);
    assert!(a[0].placed && !a[1].placed);
    assert_eq!(a[1].created, "2026-12-01T00:00:00Z");
}
