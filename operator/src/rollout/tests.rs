use std::collections::BTreeSet;

use proptest::prelude::*;
use serde_json::json;

use super::*;

fn plan(name: &str, priority: i32, max_unavailable: serde_json::Value, layouts: serde_json::Value) -> GpuPartitionPlan {
    serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan",
        "metadata": {"name": name, "generation": 1},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "a"}}, "priority": priority, "layouts": layouts,
                 "rollout": {"maxUnavailable": max_unavailable, "drainTimeoutSeconds": 60}}
    }))
    .unwrap()
}

fn h100_layout() -> serde_json::Value {
    json!([{"gpuProduct": "H100-80GB", "profiles": {"3g.40gb": 2}}])
}

fn gpunode(name: &str, spec_gpus: serde_json::Value, applied: bool, rollout: Option<serde_json::Value>) -> GpuNode {
    let mut status =
        json!({"gpus": [{"index": 0, "uuid": "GPU-0", "product": "NVIDIA H100 80GB HBM3", "migCapable": true}]});
    if applied {
        status["observedGeneration"] = json!(2);
        status["conditions"] = json!([{"type": "Ready", "status": "True", "reason": "Applied", "message": "",
                                       "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 2}]);
    }
    if let Some(r) = rollout {
        status["rollout"] = r;
    }
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": name, "generation": 2}, "spec": {"gpus": spec_gpus}, "status": status}))
    .unwrap()
}

fn wanted() -> serde_json::Value {
    json!([{"index": 0, "migEnabled": true, "profiles": {"3g.40gb": 2}}])
}

fn node(name: &str, unschedulable: bool, gn: GpuNode) -> NodeInput {
    NodeInput {
        name: name.into(),
        labels: [("pool".to_string(), "a".to_string())].into(),
        unschedulable,
        gpunode: Some(gn),
        pods: vec![],
    }
}

fn now() -> Timestamp {
    "2026-06-01T00:00:00Z".parse().unwrap()
}

#[test]
fn a_node_in_sync_is_updated_and_left_alone() {
    let nodes = [node("n1", false, gpunode("n1", wanted(), true, None))];
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &nodes, now());
    assert_eq!(reports["p"].updated, 1);
    assert!(actions.iter().all(|a| matches!(a, Action::Rollout { .. })), "{actions:?}");
}

#[test]
fn a_differing_node_records_draining_before_cordoning() {
    let nodes = [node("n1", false, gpunode("n1", json!([]), true, None))];
    let (actions, _) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &nodes, now());
    match &actions[..2] {
        [Action::Rollout { rollout: Some(r), .. }, Action::Cordon { node }] => {
            assert_eq!(r.phase, NodePhase::Draining);
            assert!(r.cordoned_by_us);
            assert_eq!(node, "n1");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_already_cordoned_node_is_not_ours_to_uncordon() {
    let nodes = [node("n1", true, gpunode("n1", json!([]), true, None))];
    let (actions, _) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &nodes, now());
    assert!(!actions.iter().any(|a| matches!(a, Action::Cordon { .. })));
    let Action::Rollout { rollout: Some(r), .. } = &actions[0] else { panic!() };
    assert!(!r.cordoned_by_us);
}

#[test]
fn a_drained_node_gets_its_intent_then_applying() {
    let r = json!({"phase": "Draining", "plan": "p", "cordonedByUs": true, "drainStartedAt": "2026-06-01T00:00:00Z"});
    let nodes = [node("n1", true, gpunode("n1", json!([]), true, Some(r)))];
    let (actions, _) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &nodes, now());
    assert!(matches!(&actions[0], Action::Intent { gpus, .. } if gpus.len() == 1));
    assert!(matches!(&actions[1], Action::Rollout { rollout: Some(r), .. } if r.phase == NodePhase::Applying));
}

#[test]
fn gpu_pods_are_evicted_and_a_timeout_stalls_without_force() {
    let r = json!({"phase": "Draining", "plan": "p", "cordonedByUs": true, "drainStartedAt": "2026-05-31T00:00:00Z",
                   "message": "eviction of ml/a blocked: Cannot evict pod as it would violate the pod's disruption budget web"});
    let mut n = node("n1", true, gpunode("n1", json!([]), true, Some(r)));
    let pod = |name: &str, gpu: bool| -> Pod {
        let res = if gpu { json!({"limits": {"nvidia.com/mig-3g.40gb": "1"}}) } else { json!({}) };
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ml"},
            "spec": {"containers": [{"name": "c", "resources": res}]}, "status": {"phase": "Running"}}))
        .unwrap()
    };
    n.pods = vec![pod("a", true), pod("b", false)];
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[n], now());
    assert_eq!(actions, vec![Action::Evict { node: "n1".into(), namespace: "ml".into(), pod: "a".into() }]);
    assert_eq!(reports["p"].drain_timeouts.len(), 1);
    assert!(reports["p"].drain_timeouts[0].contains("disruption budget web"), "{:?}", reports["p"]);
}

#[test]
fn equal_priorities_conflict_and_neither_acts() {
    let nodes = [node("n1", false, gpunode("n1", json!([]), true, None))];
    let plans = [plan("p", 5, json!(1), h100_layout()), plan("q", 5, json!(1), h100_layout())];
    let (actions, reports) = plan_fleet(&plans, &nodes, now());
    assert!(actions.is_empty(), "{actions:?}");
    assert_eq!(reports["p"].conflicts, vec!["n1"]);
    assert_eq!(reports["q"].conflicts, vec!["n1"]);
    // A higher priority wins cleanly.
    let plans = [plan("p", 5, json!(1), h100_layout()), plan("q", 6, json!(1), h100_layout())];
    let (_, reports) = plan_fleet(&plans, &nodes, now());
    assert!(reports["q"].conflicts.is_empty());
    assert_eq!(reports["q"].in_progress, 1);
    assert_eq!(reports["p"].matched, 0);
}

#[test]
fn an_impossible_layout_is_reported_not_applied() {
    let nodes = [node("n1", false, gpunode("n1", json!([]), true, None))];
    let bad = json!([{"gpuProduct": "H100-80GB", "profiles": {"4g.40gb": 2}}]);
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), bad)], &nodes, now());
    assert!(actions.is_empty());
    assert!(reports["p"].invalid[0].contains("holds at most 1"), "{:?}", reports["p"]);
}

#[test]
fn a_product_without_a_layout_is_skipped() {
    let nodes = [node("n1", false, gpunode("n1", json!([]), true, None))];
    let a30 = json!([{"gpuProduct": "A30", "profiles": {"4g.24gb": 1}}]);
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), a30)], &nodes, now());
    assert!(actions.is_empty());
    assert!(reports["p"].skipped["n1"].contains("no layout for this node's GPUs (NVIDIA H100 80GB HBM3)"));
}

#[test]
fn a_deleted_plan_releases_its_nodes_without_reconfiguring() {
    let r = json!({"phase": "Draining", "plan": "p", "cordonedByUs": true});
    let nodes = [node("n1", true, gpunode("n1", json!([]), true, Some(r)))];
    let (actions, _) = plan_fleet(&[], &nodes, now());
    assert_eq!(
        actions,
        vec![Action::Uncordon { node: "n1".into() }, Action::Rollout { node: "n1".into(), rollout: None }]
    );
}

#[test]
fn an_agent_failure_uncordons_and_reports() {
    let r = json!({"phase": "Applying", "plan": "p", "planGeneration": 1, "cordonedByUs": true});
    let mut gn = gpunode("n1", wanted(), false, Some(r));
    gn.status.as_mut().unwrap().conditions = serde_json::from_value(json!([{"type": "Stalled", "status": "True",
        "reason": "InstanceInUse", "message": "pid 7", "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 2}])).unwrap();
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[node("n1", true, gn)], now());
    assert!(actions.contains(&Action::Uncordon { node: "n1".into() }));
    assert_eq!(reports["p"].failed, vec![("n1".to_string(), "InstanceInUse: pid 7".to_string())]);
}

#[test]
fn finishing_a_node_reports_how_long_its_change_took() {
    let r = json!({"phase": "Applying", "plan": "p", "planGeneration": 1, "cordonedByUs": true, "drainStartedAt": "2026-05-31T23:59:00Z"});
    let nodes = [node("n1", true, gpunode("n1", wanted(), true, Some(r)))];
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &nodes, now());
    assert!(actions.contains(&Action::Completed { node: "n1".into(), seconds: 60.0 }), "{actions:?}");
    assert!(actions.contains(&Action::Uncordon { node: "n1".into() }));
    assert_eq!(reports["p"].updated, 1);
}

#[test]
fn a_reset_request_keeps_the_node_cordoned_and_stalls_the_plan() {
    let r = json!({"phase": "Applying", "plan": "p", "planGeneration": 1, "cordonedByUs": true});
    let mut gn = gpunode("n1", wanted(), false, Some(r));
    gn.status.as_mut().unwrap().conditions = serde_json::from_value(json!([{"type": "Stalled", "status": "True",
        "reason": "ResetRequired", "message": "GPU 0: MIG mode change to enabled needs a GPU reset or node reboot",
        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 2}]))
    .unwrap();
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[node("n1", true, gn)], now());
    assert!(actions.is_empty(), "{actions:?}");
    assert_eq!(reports["p"].reset_required.len(), 1);
    assert!(reports["p"].failed.is_empty());
    let st = crate::status::plan_status(&[], &reports["p"], Some(1), false, Time(now()));
    let stalled = st.conditions.iter().find(|c| c.type_ == STALLED).unwrap();
    assert_eq!(stalled.reason, "ResetRequired");
    assert!(stalled.message.contains("n1: ResetRequired"), "{}", stalled.message);
}

/// Simulates rollouts to completion, executing the planner's actions against a tiny model of
/// the cluster (agents apply instantly), over random fleets and budgets.
fn simulate(n: usize, budget: serde_json::Value, pre_cordoned: &BTreeSet<usize>) -> (usize, BTreeSet<String>, usize) {
    let plans = [plan("p", 0, budget.clone(), h100_layout())];
    let mut nodes: Vec<NodeInput> = (0..n)
        .map(|i| {
            node(&format!("n{i:02}"), pre_cordoned.contains(&i), gpunode(&format!("n{i:02}"), json!([]), true, None))
        })
        .collect();
    let mut max_disrupted = 0;
    let mut uncordoned = BTreeSet::new();
    for _round in 0..(4 * n + 10) {
        let (actions, reports) = plan_fleet(&plans, &nodes, now());
        for a in actions {
            let find = |nodes: &mut Vec<NodeInput>, name: &str| nodes.iter().position(|x| x.name == name).unwrap();
            match a {
                Action::Cordon { node } => {
                    let i = find(&mut nodes, &node);
                    nodes[i].unschedulable = true;
                }
                Action::Uncordon { node } => {
                    let i = find(&mut nodes, &node);
                    nodes[i].unschedulable = false;
                    uncordoned.insert(node);
                }
                Action::Rollout { node, rollout } => {
                    let i = find(&mut nodes, &node);
                    nodes[i].gpunode.as_mut().unwrap().status.as_mut().unwrap().rollout = rollout;
                }
                Action::Intent { node, gpus, .. } => {
                    // The agent applies it at once and reports the new generation.
                    let i = find(&mut nodes, &node);
                    let gn = nodes[i].gpunode.as_mut().unwrap();
                    gn.spec.gpus = gpus;
                    gn.metadata.generation = Some(gn.metadata.generation.unwrap() + 1);
                    gn.status.as_mut().unwrap().observed_generation = gn.metadata.generation;
                    for c in &mut gn.status.as_mut().unwrap().conditions {
                        c.observed_generation = gn.metadata.generation;
                    }
                }
                Action::Evict { .. } | Action::ForceDelete { .. } | Action::Event { .. } | Action::Completed { .. } => {
                }
            }
        }
        let disrupted = nodes
            .iter()
            .filter(|x| {
                x.gpunode
                    .as_ref()
                    .unwrap()
                    .status
                    .as_ref()
                    .unwrap()
                    .rollout
                    .as_ref()
                    .is_some_and(|r| in_flight(r.phase))
            })
            .count();
        max_disrupted = max_disrupted.max(disrupted);
        if reports["p"].updated as usize == n && disrupted == 0 {
            let still_cordoned = nodes.iter().filter(|x| x.unschedulable).count();
            return (max_disrupted, uncordoned, still_cordoned);
        }
    }
    panic!("rollout did not converge");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn never_more_than_max_unavailable_and_never_uncordon_what_we_did_not_cordon(
        n in 1usize..12,
        budget in 1usize..5,
        percent in proptest::bool::ANY,
        cordoned in proptest::collection::btree_set(0usize..12, 0..4),
    ) {
        let (value, limit) = if percent {
            let pct = budget * 20; // 20..80 %
            (json!(format!("{pct}%")), ((n * pct) / 100).max(1))
        } else {
            (json!(budget), budget)
        };
        let (max_disrupted, uncordoned, still_cordoned) = simulate(n, value, &cordoned);
        prop_assert!(max_disrupted <= limit, "{max_disrupted} > {limit}");
        for i in &cordoned {
            prop_assert!(!uncordoned.contains(&format!("n{i:02}")), "uncordoned pre-cordoned n{i:02}");
        }
        let pre = cordoned.iter().filter(|i| **i < n).count();
        prop_assert_eq!(still_cordoned, pre, "only the nodes cordoned before us stay cordoned");
    }
}

#[test]
fn paused_plans_start_no_new_node_but_finish_in_flight_ones() {
    let mut p = plan("p", 0, json!(2), h100_layout());
    p.spec.paused = true;
    let r = json!({"phase": "Draining", "plan": "p", "cordonedByUs": true, "drainStartedAt": "2026-06-01T00:00:00Z"});
    let nodes = [
        node("n1", true, gpunode("n1", json!([]), true, Some(r))),
        node("n2", false, gpunode("n2", json!([]), true, None)),
    ];
    let (actions, reports) = plan_fleet(&[p], &nodes, now());
    assert!(actions.iter().any(|a| matches!(a, Action::Intent { node, .. } if node == "n1")));
    assert!(!actions.iter().any(|a| matches!(a, Action::Cordon { node } if node == "n2")));
    assert_eq!(reports["p"].pending, 1);
}
