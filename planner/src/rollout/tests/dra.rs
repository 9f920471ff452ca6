//! Nodes whose GPU DRA driver runs DynamicMIG: refused, never handed to their agent.

use super::*;

const WHY: &str = "the GPU DRA driver publishes partitionable devices (DynamicMIG)";

fn refused(mut n: NodeInput<'static>) -> NodeInput<'static> {
    n.dra_refused = Some(WHY.into());
    n
}

#[test]
fn a_dynamic_mig_node_is_neither_drained_nor_handed_over_and_the_plan_says_why() {
    let nodes = [refused(node("n1", false, gpunode("n1", json!([]), true, None)))];
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &nodes, now());
    assert!(
        !actions.iter().any(|a| matches!(a, Action::Cordon { .. } | Action::Intent { .. } | Action::Rollout { .. })),
        "{actions:?}"
    );
    assert_eq!(reports["p"].skipped["n1"], format!("refused: {WHY}"));
    assert_eq!(reports["p"].dra_refused, [format!("n1: {WHY}")]);
}

#[test]
fn a_node_refused_mid_drain_is_uncordoned_released_and_its_intent_emptied() {
    let r = json!({"phase": "Draining", "plan": "p", "cordonedByUs": true, "drainStartedAt": "2026-06-01T00:00:00Z"});
    let nodes = [refused(node("n1", true, gpunode("n1", json!([]), true, Some(r))))];
    let (actions, _) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &nodes, now());
    assert!(actions.iter().any(|a| matches!(a, Action::Uncordon { .. })), "{actions:?}");
    assert!(actions.iter().any(|a| matches!(a, Action::Rollout { rollout: None, .. })), "{actions:?}");
    assert!(actions.iter().any(|a| matches!(a, Action::Event { reason: "DraRefused", warning: true, .. })));
    assert!(!actions.iter().any(|a| matches!(a, Action::Intent { .. })));
    // Released, with the old intent still there: emptied, so the agent creates nothing either.
    let nodes = [refused(node("n1", false, gpunode("n1", wanted(), true, None)))];
    let (actions, _) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &nodes, now());
    assert!(actions.iter().any(|a| matches!(a, Action::ClearIntent { .. })), "{actions:?}");
}

#[test]
fn a_refusal_overrides_a_verdict_kept_from_the_pass_before() {
    let plans = [plan("p", 0, json!(1), h100_layout())];
    let idle = json!({"phase": "Idle", "plan": "p", "planGeneration": 1});
    let mut n = node("n1", false, gpunode("n1", wanted(), true, Some(idle)));
    n.versions = Some(versions_of(&n));
    let mut carry = KeptVerdicts::default();
    for _ in 0..2 {
        let (_, reports) = plan_fleet_with(&plans, std::slice::from_ref(&n), now(), &mut carry);
        assert_eq!(reports["p"].updated, 1);
    }
    assert_eq!(carry.reused, 1, "the second pass reused the verdict");
    // Same Node and GpuNode versions; only the slices changed.
    let n = refused(n);
    let (actions, reports) = plan_fleet_with(&plans, &[n], now(), &mut carry);
    assert_eq!(reports["p"].updated, 0);
    assert!(actions.iter().any(|a| matches!(a, Action::Rollout { rollout: None, .. })), "released: {actions:?}");
    assert!(reports["p"].skipped.contains_key("n1"));
}
