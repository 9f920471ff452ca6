//! Whatever holds a drain is said on the node (its record and Events, through
//! `Action::Blockers`) as well as in the plan's status, in the same words.

use super::*;

fn blockers_of<'a>(actions: &'a [Action], node: &str) -> Option<&'a Vec<String>> {
    actions.iter().find_map(|a| match a {
        Action::Blockers { node: n, reasons } if n == node => Some(reasons),
        _ => None,
    })
}

fn reconciling(report: &PlanReport) -> String {
    let st = crate::status::plan_status(&[], report, Some(1), false, Time(now()));
    st.conditions.iter().find(|c| c.type_ == RECONCILING).map(|c| c.message.clone()).unwrap_or_default()
}

#[test]
fn every_pod_that_holds_a_drain_is_named_on_the_node_as_well_as_in_the_plan() {
    let bare = gpu_pod("notebook", json!({"ownerReferences": null}));
    let mut scratch = gpu_pod("scratch", json!({}));
    scratch.spec.as_mut().unwrap().volumes =
        Some(vec![serde_json::from_value(json!({"name": "t", "emptyDir": {}})).unwrap()]);
    let orphan = gpu_pod(
        "orphan",
        json!({"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
        "name": "gone", "uid": "u", "controller": true}]}),
    );
    // Its grace period ended a minute ago: past what a kubelet takes to confirm a kill.
    let stuck = gpu_pod("stuck", json!({"deletionTimestamp": "2026-05-31T23:59:00Z"}));
    let mut n = node("n1", true, gpunode("n1", json!([]), true, Some(draining("2026-05-31T23:58:00Z"))));
    n.pods = Ok(vec![bare, scratch, orphan, stuck]);
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[n], now());
    let on_node = blockers_of(&actions, "n1").expect("the node's blockers are handed to the controller to record");
    let wanted = [
        "pod ml/notebook has no controller",
        "pod ml/scratch has emptyDir data",
        "pod ml/orphan belongs to DaemonSet gone, which no longer exists",
        "pod ml/stuck is stuck terminating: its grace period ended at 2026-05-31T23:59:00Z",
    ];
    for want in wanted {
        assert_eq!(on_node.iter().filter(|b| b.contains(want)).count(), 1, "{want} on the node: {on_node:?}");
        let in_plan = reports["p"].drain_blocked.iter().filter(|b| b.contains(want)).count();
        assert_eq!(in_plan, 1, "{want} once in the plan: {:?}", reports["p"].drain_blocked);
    }
    assert!(reconciling(&reports["p"]).contains("n1: pod ml/notebook has no controller"));
}

#[test]
fn a_blocker_already_recorded_on_the_node_is_said_once_in_the_plan() {
    let refusal = "pod ml/notebook has no controller and would be gone for good (set spec.rollout.evictUnmanagedPods \
                   to evict it)";
    let mut r = draining("2026-06-01T00:00:00Z");
    r["message"] = json!(refusal);
    let mut n = node("n1", true, gpunode("n1", json!([]), true, Some(r)));
    n.pods = Ok(vec![gpu_pod("notebook", json!({"ownerReferences": null}))]);
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[n], now());
    assert_eq!(blockers_of(&actions, "n1"), Some(&vec![refusal.to_string()]));
    assert_eq!(reports["p"].drain_blocked, vec![format!("n1: {refusal}")]);
}

#[test]
fn a_drain_no_pod_holds_clears_what_the_node_said_before() {
    // Evictions go on and nothing refuses: the node is told nothing holds it (a stale message of
    // an earlier pass is then cleared by the controller).
    let mut n = node("n1", true, gpunode("n1", json!([]), true, Some(draining("2026-06-01T00:00:00Z"))));
    n.pods =
        Ok(vec![gpu_pod("a", json!({})), gpu_pod("leaving", json!({"deletionTimestamp": "2026-06-01T00:00:00Z"}))]);
    let (actions, _) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[n], now());
    assert_eq!(blockers_of(&actions, "n1"), Some(&vec![]), "{actions:?}");
}

#[test]
fn replacements_that_keep_coming_back_are_named_after_a_few_evictions() {
    let started = "2026-05-31T23:59:00Z";
    // Created 40 s after the cordon: the scheduler put it on the cordoned node.
    let back = gpu_pod("rs-x", json!({"creationTimestamp": "2026-05-31T23:59:40Z"}));
    let before = gpu_pod("rs-y", json!({"creationTimestamp": "2026-05-31T00:00:00Z"}));
    let mut n = node("n1", true, gpunode("n1", json!([]), true, Some(draining(started))));
    n.pods = Ok(vec![back, before]);
    n.returns = [("ReplicaSet ml/rs".to_string(), crate::drain::RETURNS_REPORTED - 1)].into();
    let p = plan("p", 0, json!(1), h100_layout());
    let (actions, reports) = plan_fleet(std::slice::from_ref(&p), std::slice::from_ref(&n), now());
    let came_back = |actions: &[Action], pod: &str| {
        actions.iter().find_map(|a| match a {
            Action::Evict { pod: name, came_back, .. } if name == pod => Some(came_back.clone()),
            _ => None,
        })
    };
    // Each eviction of a returning pod is counted for its owner (by the controller).
    assert_eq!(came_back(&actions, "rs-x"), Some(Some("ReplicaSet ml/rs".into())));
    assert_eq!(came_back(&actions, "rs-y"), Some(None));
    assert_eq!(blockers_of(&actions, "n1"), Some(&vec![]), "not said before the threshold");
    assert!(reports["p"].drain_blocked.is_empty());
    n.returns.insert("ReplicaSet ml/rs".into(), crate::drain::RETURNS_REPORTED);
    let (actions, reports) = plan_fleet(&[p], &[n], now());
    let said = "pods of ReplicaSet ml/rs keep coming back to the cordoned node";
    assert!(blockers_of(&actions, "n1").unwrap().iter().any(|b| b.starts_with(said)), "{actions:?}");
    assert!(reconciling(&reports["p"]).contains(&format!("n1: {said}")), "{}", reconciling(&reports["p"]));
}

#[test]
fn a_drain_timeout_names_the_pdb_that_refused() {
    // The record as the controller writes it after a refused eviction.
    let status: kube_core::Status = serde_json::from_value(json!({"status": "Failure", "code": 429,
        "message": "Cannot evict pod as it would violate the pod's disruption budget.", "reason": "TooManyRequests",
        "details": {"causes": [{"reason": "DisruptionBudget",
                                "message": "The disruption budget web needs 2 healthy pods and has 2 currently"}]}}))
    .unwrap();
    let refused = crate::drain::message(&[], &[crate::drain::eviction_refused("ml", "a", &status)]);
    let mut r = draining("2026-05-31T00:00:00Z");
    r["message"] = json!(refused);
    let mut n = node("n1", true, gpunode("n1", json!([]), true, Some(r)));
    n.pods = Ok(vec![gpu_pod("a", json!({}))]);
    let (_, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[n], now());
    let st = crate::status::plan_status(&[], &reports["p"], Some(1), false, Time(now()));
    let stalled = st.conditions.iter().find(|c| c.type_ == STALLED).unwrap();
    assert_eq!(stalled.reason, "DrainTimeout");
    assert!(stalled.message.contains("eviction of ml/a blocked by PodDisruptionBudget ml/web"), "{}", stalled.message);
}

#[test]
fn a_gpu_daemonset_pod_holds_the_hand_over_and_is_named_not_evicted() {
    // Its DaemonSet exists and tolerates the cordon: evicting it only brings it back, and handing
    // the node over lets the agent destroy the instance it holds while it runs on.
    let ds = gpu_pod(
        "exporter-x",
        json!({"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
        "name": "gpu-probe", "uid": "u", "controller": true}]}),
    );
    let mut n = node("n1", true, gpunode("n1", json!([]), true, Some(draining("2026-05-31T00:00:00Z"))));
    n.daemonsets = [("ml".to_string(), "gpu-probe".to_string())].into();
    n.pods = Ok(vec![ds.clone()]);
    let mut p = plan("p", 0, json!(1), h100_layout());
    p.spec.rollout.force_after_timeout = true; // the drain timed out: force does not remove it either
    let (actions, reports) = plan_fleet(&[p], &[n.clone()], now());
    assert!(
        !actions.iter().any(|a| matches!(
            a,
            Action::Intent { .. } | Action::Evict { .. } | Action::ForceDelete { .. } | Action::Rollout { .. }
        )),
        "not handed over, nothing evicted: {actions:?}"
    );
    let on_node = blockers_of(&actions, "n1").expect("named on the node");
    assert!(
        on_node.iter().any(|b| b.starts_with("pod ml/exporter-x of DaemonSet ml/gpu-probe uses a GPU")),
        "{on_node:?}"
    );
    assert!(reports["p"].drain_blocked.iter().any(|b| b.contains("pod ml/exporter-x of DaemonSet ml/gpu-probe")));
    // Once it is gone (the DaemonSet no longer selects the node), the node is handed over.
    n.pods = Ok(vec![]);
    let (actions, _) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[n], now());
    assert!(actions.iter().any(|a| matches!(a, Action::Intent { .. })), "{actions:?}");
}
