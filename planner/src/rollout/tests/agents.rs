//! A node is started and handed over only to an agent seen alive at that moment;
//! one not proven yet (its lease first seen, or the lease watch just back) is neither trusted
//! nor reported dead.

use super::*;

fn stall_reason(report: &PlanReport) -> Option<String> {
    let st = crate::status::plan_status(&[], report, Some(1), false, Time(now()));
    st.conditions.iter().find(|c| c.type_ == STALLED && c.status == "True").map(|c| c.reason.clone())
}

fn handed_over(actions: &[Action]) -> bool {
    actions.iter().any(|a| {
        matches!(a, Action::Intent { .. })
            || matches!(a, Action::Rollout { rollout: Some(r), .. } if r.phase == NodePhase::Applying)
    })
}

#[test]
fn a_drained_node_is_not_handed_to_an_agent_that_is_not_alive() {
    let drained = || node("n1", true, gpunode("n1", json!([]), true, Some(draining("2026-06-01T00:00:00Z"))));
    let plans = [plan("p", 0, json!(1), h100_layout())];
    // A crash-looping agent, alive when the drain started, dead once it is done.
    let mut dead = drained();
    dead.agent = AgentHealth::NotResponding { since: Some("2026-05-31T23:59:00Z".parse().unwrap()) };
    let (actions, reports) = plan_fleet(&plans, &[dead], now());
    assert!(!handed_over(&actions), "{actions:?}");
    assert!(!actions.iter().any(|a| matches!(a, Action::Uncordon { .. })), "it stays drained: {actions:?}");
    assert_eq!(reports["p"].in_progress, 1);
    assert!(reports["p"].unresponsive[0].contains("not handed over"), "{:?}", reports["p"].unresponsive);
    assert_eq!(stall_reason(&reports["p"]).as_deref(), Some("AgentNotResponding"));
    // Not proven yet (the operator just started): it waits, without a stall.
    let mut unproven = drained();
    unproven.agent = AgentHealth::Unproven;
    let (actions, reports) = plan_fleet(&plans, &[unproven], now());
    assert!(!handed_over(&actions), "{actions:?}");
    assert!(reports["p"].unresponsive.is_empty() && stall_reason(&reports["p"]).is_none(), "{:?}", reports["p"]);
    assert_eq!(reports["p"].in_progress, 1);
    // Seen renewing: handed over.
    let (actions, _) = plan_fleet(&plans, &[drained()], now());
    assert!(handed_over(&actions), "{actions:?}");
}

#[test]
fn an_unproven_agent_neither_starts_its_node_nor_is_reported_dead() {
    let mut n = node("n1", false, gpunode("n1", json!([]), true, None));
    n.agent = AgentHealth::Unproven;
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[n], now());
    assert!(actions.is_empty(), "no start, no Ready=Unknown: {actions:?}");
    assert_eq!((reports["p"].pending, reports["p"].in_progress), (1, 0));
    assert!(reports["p"].unresponsive.is_empty() && stall_reason(&reports["p"]).is_none(), "{:?}", reports["p"]);
    // Mid-apply, the operator just restarted: it stays handed over, and the plan is not stalled.
    let r = json!({"phase": "Applying", "plan": "p", "planGeneration": 1, "cordonedByUs": true,
                   "applyStartedAt": "2026-05-31T23:59:30Z"});
    let mut n = node("n1", true, gpunode("n1", wanted(), false, Some(r)));
    n.agent = AgentHealth::Unproven;
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[n], now());
    assert!(actions.is_empty(), "{actions:?}");
    assert!(reports["p"].unresponsive.is_empty() && stall_reason(&reports["p"]).is_none(), "{:?}", reports["p"]);
}

#[test]
fn a_released_node_mid_apply_waits_for_an_unproven_agent_and_not_for_a_dead_one() {
    let r = json!({"phase": "Applying", "plan": "gone", "planGeneration": 1, "cordonedByUs": true});
    let mut n = node("n1", true, gpunode("n1", wanted(), false, Some(r)));
    n.agent = AgentHealth::Unproven;
    let (actions, _) = plan_fleet(&[], std::slice::from_ref(&n), now());
    assert!(actions.is_empty(), "it may be mid-change: {actions:?}");
    n.agent = AgentHealth::NotResponding { since: None };
    let (actions, _) = plan_fleet(&[], &[n], now());
    assert!(actions.iter().any(|a| matches!(a, Action::Uncordon { .. })), "{actions:?}");
}

#[test]
fn an_unproven_agent_holds_a_rollout_slot_until_it_is_judged() {
    // Budget 1: n1 not updated and not proven could turn out dead (and count): n2 waits.
    let mut n1 = node("n1", false, gpunode("n1", json!([]), true, None));
    n1.agent = AgentHealth::Unproven;
    let n2 = node("n2", false, gpunode("n2", json!([]), true, None));
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[n1, n2], now());
    assert!(!actions.iter().any(|a| matches!(a, Action::Cordon { .. })), "{actions:?}");
    assert_eq!((reports["p"].pending, reports["p"].unavailable), (2, 1));
    assert!(stall_reason(&reports["p"]).is_none(), "{:?}", reports["p"]);
}

/// A draining node whose agent stopped responding evicts nothing more (no
/// one could take the hand-over, so the pods would be disrupted for nothing); the drain resumes
/// once the agent is back.
#[test]
fn a_draining_node_whose_agent_is_dead_evicts_nothing_until_it_is_back() {
    let mut n = node("n1", true, gpunode("n1", json!([]), true, Some(draining("2026-06-01T00:00:00Z"))));
    n.pods = Ok(vec![gpu_pod("a", json!({}))]);
    n.agent = AgentHealth::NotResponding { since: Some("2026-05-31T23:59:00Z".parse().unwrap()) };
    let plans = [plan("p", 0, json!(1), h100_layout())];
    let (actions, reports) = plan_fleet(&plans, std::slice::from_ref(&n), now());
    assert!(!actions.iter().any(|a| matches!(a, Action::Evict { .. } | Action::Uncordon { .. })), "{actions:?}");
    assert!(reports["p"].unresponsive[0].contains("draining paused"), "{:?}", reports["p"].unresponsive);
    n.agent = AgentHealth::Alive;
    let (actions, _) = plan_fleet(&plans, &[n], now());
    assert!(actions.iter().any(|a| matches!(a, Action::Evict { pod, .. } if pod == "a")), "{actions:?}");
}
