//! Holders the node agent named (`GpuNode.status.activity.devices[].pod`) against the
//! placement's guesses, and what the alert's series may count.

use serde_json::{Value, json};

use super::super::*;
use crate::fleet_status::fleet_status;

const H100: &str = "NVIDIA H100 80GB HBM3";
const NOW: &str = "2026-06-01T12:00:00Z";
const LONG_AGO: &str = "2026-05-01T00:00:00Z";

/// A node `n1` with one H100 cut 3g.40gb@0 + 3g.40gb@4, and the agent's figures.
fn gpunode(activity: Vec<Value>) -> GpuNode {
    let gpus = json!([{"index": 0, "uuid": "GPU-0", "product": H100, "migCapable": true, "migEnabled": true,
        "instances": [{"profile": "3g.40gb", "start": 0, "size": 4, "uuid": "MIG-0"},
                      {"profile": "3g.40gb", "start": 4, "size": 4, "uuid": "MIG-4"}]}]);
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": "n1"}, "spec": {},
        "status": {"gpus": gpus, "activity": {"measuredAt": NOW, "devices": activity}}}))
    .unwrap()
}

/// The agent's figure for the instance at `start`: idle since long ago, or busy with the
/// processes of `pod` (`namespace/name/uid`) when given.
fn act(start: i32, pod: Option<(&str, &str, &str)>) -> Value {
    let mut d = json!({"gpuIndex": 0, "uuid": format!("MIG-{start}"), "profile": "3g.40gb", "start": start,
        "source": "Gpm", "memoryUsedMib": 0, "processes": 0});
    match pod {
        Some((ns, name, uid)) => {
            d["activePercent1h"] = json!(40);
            d["processes"] = json!(1);
            d["pod"] = json!({"namespace": ns, "name": name, "uid": uid});
        }
        None => {
            d["activePercent1h"] = json!(0);
            d["idleSince"] = json!(LONG_AGO);
        }
    }
    d
}

/// A pod on `n1` holding `n` `mig-3g.40gb`, with UID `uid-<name>`.
fn pod(ns: &str, name: &str, n: i64) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}")},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/mig-3g.40gb": n}}}]},
        "status": {"phase": "Running"}}))
    .unwrap()
}

fn quota(name: &str) -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": name}, "spec": {"namespaces": [name], "hard": {}}}))
    .unwrap()
}

fn report(activity: Vec<Value>, pods: &[Pod]) -> IdleReport {
    let nodes = [gpunode(activity)];
    let status = fleet_status(&nodes, &[], &[quota("ml"), quota("web")], pods);
    idle_report(&status, &nodes, pods, &BTreeMap::new(), &crate::idle::NotReporting::new(), NOW.parse().unwrap())
}

/// Whether each instance's holder is exact, as `kubectl tessera status` places them.
fn exact(activity: Vec<Value>, pods: &[Pod]) -> Vec<bool> {
    let s = fleet_status(&[gpunode(activity)], &[], &[], pods);
    s.nodes[0].gpus[0].instances.iter().map(|i| i.exact).collect()
}

fn idle(r: &IdleReport) -> Vec<(&str, bool)> {
    r.idle.iter().map(|h| (h.pod.as_str(), h.exact)).collect()
}

#[test]
fn a_pod_the_agent_saw_on_a_device_holds_it_exactly_and_the_last_one_by_elimination() {
    // The placement alone would give ml/a the instance at 0 (busy) and web/b the one at 4
    // (idle), both guessed. The agent saw web/b's processes on 0: web/b holds 0, so ml/a, the
    // only other pod of the profile, holds 4, which is idle.
    let pods = [pod("ml", "a", 1), pod("web", "b", 1)];
    let r = report(vec![act(0, Some(("web", "b", "uid-b"))), act(4, None)], &pods);
    assert_eq!(idle(&r), [("ml/a", true)]);
    assert_eq!(r.tenants["web"].idle, 0, "{r:?}");
    assert_eq!(r.tenants["web"].active, 1, "{r:?}");
    assert_eq!(exact(vec![act(0, Some(("web", "b", "uid-b"))), act(4, None)], &pods), [true, true]);
}

#[test]
fn a_naming_that_no_longer_holds_is_ignored_and_the_guess_stays_a_guess() {
    let pods = [pod("ml", "a", 1), pod("web", "b", 1)];
    let named = |ns, name, uid| vec![act(0, Some((ns, name, uid))), act(4, None)];
    let with_c = [pod("ml", "a", 1), pod("web", "b", 1), pod("web", "c", 0)];
    let cases: [(&str, Vec<Value>, &[Pod]); 4] = [
        ("a later pod of the same name (another UID)", named("web", "b", "uid-old"), &pods),
        ("a pod that is gone", named("web", "gone", "uid-gone"), &pods),
        ("a pod holding no such resource", named("web", "c", "uid-c"), &with_c),
        (
            "a pod named on more devices than it holds (a privileged pod seeing every GPU)",
            vec![act(0, Some(("web", "b", "uid-b"))), act(4, Some(("web", "b", "uid-b")))],
            &pods,
        ),
    ];
    for (case, activity, pods) in cases {
        assert_eq!(exact(activity, pods), [false, false], "{case}");
    }
    let r = report(named("web", "b", "uid-old"), &pods);
    assert_eq!(idle(&r), [("web/b", false)], "the guess, marked");
    // The instance is made again (new UUID) since the agent named its pod: that naming is old.
    let mut old = act(0, Some(("web", "b", "uid-b")));
    old["uuid"] = json!("MIG-before");
    assert_eq!(exact(vec![old, act(4, None)], &pods), [false, false], "an instance made again");
}

#[test]
fn guessed_pods_are_certainly_idle_only_when_every_device_they_may_hold_is() {
    let pods = [pod("ml", "a", 1), pod("web", "b", 1)];
    let certain = |r: &IdleReport| -> Vec<(String, bool, Option<String>)> {
        r.idle.iter().map(|h| (h.pod.clone(), h.exact, h.certain_since.map(|t| t.to_string()))).collect()
    };
    // Neither device runs a process: nobody is named, both holders are guesses.
    let mut later = act(4, None);
    later["idleSince"] = json!("2026-05-20T00:00:00Z");
    let r = report(vec![act(0, None), later.clone()], &pods);
    // Whichever device each holds, it has idled since the group's latest idleSince at least.
    let since = Some("2026-05-20T00:00:00Z".to_string());
    assert_eq!(certain(&r), [("ml/a".into(), false, since.clone()), ("web/b".into(), false, since)]);
    assert_eq!(r.idle[0].idle_since.to_string(), LONG_AGO, "the listed device keeps its own figure");
    // One device busy (processes the agent could not tie to a pod): either pod may hold it.
    let mut busy = act(0, None);
    busy["idleSince"] = Value::Null;
    busy["activePercent1h"] = json!(40);
    busy["processes"] = json!(1);
    let r = report(vec![busy, later], &pods);
    assert_eq!(certain(&r), [("web/b".into(), false, None)], "the guess alone: not certain");
    // An exact holder is certain from its own idleSince.
    let r = report(vec![act(0, Some(("web", "b", "uid-b"))), act(4, None)], &pods);
    assert_eq!(certain(&r), [("ml/a".into(), true, Some(LONG_AGO.to_string()))]);
}
