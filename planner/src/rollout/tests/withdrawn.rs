//! A node is drained only for a real difference between its intent and its agent's report: a
//! `Ready` that is not True for another reason (the operator's own `AgentNotResponding` marking,
//! a condition of an earlier generation) starts nothing, and a drain that turns out not to be
//! needed is withdrawn before the hand-over, our cordon undone.

use super::*;

/// n1's GpuNode with the intent `wanted()` seen (observedGeneration 2), its GPU holding
/// `profiles`, `ready` its Ready condition, and `rollout` its record.
fn reported(profiles: &[&str], ready: Option<Condition>, rollout: Option<serde_json::Value>) -> GpuNode {
    let mut gn = gpunode("n1", wanted(), false, rollout);
    let st = gn.status.as_mut().unwrap();
    st.observed_generation = Some(2);
    st.conditions = ready.into_iter().collect();
    let g = &mut st.gpus[0];
    g.mig_enabled = true;
    g.instances = instances(profiles.iter().copied());
    gn
}

/// The operator's marking of a dead agent, as `Action::AgentDown` writes it (no generation).
fn marked_dead() -> Option<Condition> {
    Some(cond(READY, "Unknown", "AgentNotResponding", None))
}

fn idle_record() -> serde_json::Value {
    json!({"phase": "Idle", "plan": "p", "planGeneration": 1})
}

/// A drain of plan p's generation 1 started a minute ago, by us where `ours`.
fn draining_record(ours: bool) -> serde_json::Value {
    json!({"phase": "Draining", "plan": "p", "planGeneration": 1, "cordonedByUs": ours,
           "drainStartedAt": "2026-05-31T23:59:00Z"})
}

fn started(actions: &[Action]) -> bool {
    actions.iter().any(|a| {
        matches!(a, Action::Cordon { .. })
            || matches!(a, Action::Rollout { rollout: Some(r), .. } if r.phase == NodePhase::Draining)
    })
}

fn plans() -> [GpuPartitionPlan; 1] {
    [plan("p", 0, json!(1), h100_layout())]
}

const HELD: &[&str] = &["3g.40gb", "3g.40gb"];

#[test]
fn a_node_at_rest_marked_dead_by_the_operator_is_not_started_once_its_agent_renews() {
    // The leader judged the agent dead through a frozen API server and marked Ready=Unknown;
    // the lease renews before the agent reports again. Nothing differs: nothing starts.
    let n = node("n1", false, reported(HELD, marked_dead(), Some(idle_record())));
    let (actions, reports) = plan_fleet(&plans(), &[n], now());
    assert!(!started(&actions), "{actions:?}");
    assert_eq!((reports["p"].updated, reports["p"].in_progress), (1, 0));
    assert!(actions.is_empty(), "the record already says Idle: {actions:?}");
}

#[test]
fn a_node_at_rest_with_a_dead_agent_that_holds_its_layout_is_reported_not_started() {
    let mut n = node("n1", false, reported(HELD, marked_dead(), Some(idle_record())));
    n.agent = AgentHealth::NotResponding { since: Some("2026-05-31T23:58:00Z".parse().unwrap()) };
    let (actions, reports) = plan_fleet(&plans(), &[n], now());
    assert!(actions.is_empty(), "{actions:?}");
    assert!(reports["p"].unresponsive[0].contains("holds its layout as last reported"), "{:?}", reports["p"]);
    assert_eq!(reports["p"].updated, 0, "nobody vouches for it now");
}

#[test]
fn a_ready_condition_of_an_earlier_generation_starts_nothing_where_the_gpus_hold_the_intent() {
    let stale = Some(cond(READY, "False", "AwaitingDrain", Some(1)));
    let (actions, reports) = plan_fleet(&plans(), &[node("n1", false, reported(HELD, stale, None))], now());
    assert!(!started(&actions), "{actions:?}");
    assert_eq!(reports["p"].updated, 1);
}

#[test]
fn a_real_difference_still_starts_the_node() {
    // The agent's own verdict on this generation (a leak it cannot clear without the hand-over).
    let own = Some(cond(READY, "False", "LeakedMemory", Some(2)));
    let (actions, _) = plan_fleet(&plans(), &[node("n1", false, reported(HELD, own, None))], now());
    assert!(started(&actions), "the agent says why it is not applied: {actions:?}");
    // Marked dead by the operator over an agent that said Stalled (or Reconciling) of this
    // generation, a condition the marking leaves in place.
    for (t, reason) in [(STALLED, "SplitComputeInstances"), (RECONCILING, "Retrying")] {
        let mut gn = reported(HELD, marked_dead(), None);
        gn.status.as_mut().unwrap().conditions.push(cond(t, "True", reason, Some(2)));
        let (actions, _) = plan_fleet(&plans(), &[node("n1", false, gn)], now());
        assert!(started(&actions), "the agent's own {t} is a difference: {actions:?}");
    }
    // Marked dead by the operator, but its GPUs hold another layout.
    let other = reported(&["3g.40gb", "1g.10gb"], marked_dead(), None);
    let (actions, _) = plan_fleet(&plans(), &[node("n1", false, other)], now());
    assert!(started(&actions), "the report differs from the intent: {actions:?}");
}

/// The withdrawal's actions in order, and nothing evicted or handed over: the `Idle` record still
/// naming our cordon, the Uncordon, the flag cleared (where ours), and the DrainWithdrawn Event.
fn assert_withdrawn(actions: &[Action], uncordon: bool) {
    let kinds: Vec<&str> = actions
        .iter()
        .map(|a| match a {
            Action::Uncordon { .. } => "uncordon",
            Action::Rollout { rollout: Some(r), .. } if r.phase == NodePhase::Idle && r.cordoned_by_us => "idle, ours",
            Action::Rollout { rollout: Some(r), .. } if r.phase == NodePhase::Idle => "idle",
            Action::Event { reason: "DrainWithdrawn", .. } => "event",
            Action::Intent { .. } => "intent",
            _ => "other",
        })
        .collect();
    let want: &[&str] = if uncordon { &["idle, ours", "uncordon", "idle", "event"] } else { &["idle", "event"] };
    assert_eq!(kinds, want, "{actions:?}");
}

#[test]
fn a_drain_of_a_node_that_holds_its_intent_is_withdrawn_and_our_cordon_undone() {
    // An unmanaged pod would hold this drain forever; the node is given back instead.
    let mut n = node("n1", true, reported(HELD, marked_dead(), Some(draining_record(true))));
    n.pods = Ok(vec![gpu_pod("notebook", json!({"ownerReferences": []}))]);
    let (actions, reports) = plan_fleet(&plans(), std::slice::from_ref(&n), now());
    assert_withdrawn(&actions, true);
    assert_eq!((reports["p"].updated, reports["p"].in_progress), (1, 0));
    assert!(reports["p"].drain_blocked.is_empty(), "{:?}", reports["p"]);
    // Withdrawn whether the agent is alive, unproven or still judged dead: it takes no hand-over.
    // Judged dead, it is reported as at rest, not counted updated.
    n.agent = AgentHealth::NotResponding { since: None };
    let (actions, reports) = plan_fleet(&plans(), std::slice::from_ref(&n), now());
    assert_withdrawn(&actions, true);
    assert_eq!(reports["p"].updated, 0);
    assert!(reports["p"].unresponsive[0].contains("holds its layout as last reported"), "{:?}", reports["p"]);
    n.agent = AgentHealth::Unproven;
    assert_withdrawn(&plan_fleet(&plans(), &[n], now()).0, true);
    // The agent says it applied the layout.
    let applied = node("n1", true, gpunode("n1", wanted(), true, Some(draining_record(true))));
    assert_withdrawn(&plan_fleet(&plans(), &[applied], now()).0, true);
}

#[test]
fn a_withdrawn_drain_leaves_an_admins_cordon_alone() {
    let n = node("n1", true, reported(HELD, marked_dead(), Some(draining_record(false))));
    assert_withdrawn(&plan_fleet(&plans(), &[n], now()).0, false);
}

#[test]
fn a_withdrawal_cut_short_leaves_a_cordon_the_next_pass_undoes_and_never_renews() {
    let ours_idle = json!({"phase": "Idle", "plan": "p", "planGeneration": 1, "cordonedByUs": true});
    // Cut after the `Idle` record: still cordoned. Uncordoned and the flag cleared, nothing more.
    let n = node("n1", true, reported(HELD, marked_dead(), Some(ours_idle.clone())));
    let (actions, reports) = plan_fleet(&plans(), &[n], now());
    assert!(matches!(&actions[0], Action::Uncordon { .. }), "{actions:?}");
    assert!(
        matches!(&actions[1], Action::Rollout { rollout: Some(r), .. } if r.phase == NodePhase::Idle && !r.cordoned_by_us),
        "{actions:?}"
    );
    assert_eq!(actions.len(), 2, "{actions:?}");
    assert_eq!(reports["p"].updated, 1);
    // Cut after the uncordon: the flag cleared, no new cordon, no drain.
    let n = node("n1", false, reported(HELD, marked_dead(), Some(ours_idle)));
    let (actions, _) = plan_fleet(&plans(), &[n], now());
    assert!(!started(&actions) && !actions.iter().any(|a| matches!(a, Action::Uncordon { .. })), "{actions:?}");
    assert!(actions.iter().all(|a| matches!(a, Action::Rollout { rollout: Some(r), .. } if !r.cordoned_by_us)));
    assert!(!actions.is_empty(), "the stale flag is cleared: {actions:?}");
}

#[test]
fn a_drain_whose_gpus_already_hold_the_plan_is_withdrawn_with_the_intent_taken_back() {
    // The intent was emptied (say) while the GPUs kept the plan's layout: taken back, as at rest.
    let mut gn = reported(HELD, None, Some(draining_record(true)));
    gn.spec.gpus = vec![];
    let (actions, reports) = plan_fleet(&plans(), &[node("n1", true, gn.clone())], now());
    assert!(matches!(&actions[0], Action::Intent { .. }), "{actions:?}");
    assert_withdrawn(&actions[1..], true);
    assert_eq!(reports["p"].in_progress, 1, "updated once the agent reports it applied");
    // Whatever the agent's health (just after a failover it is unproven): a drain for no change
    // evicts nothing.
    let mut n = node("n1", true, gn);
    n.pods = Ok(vec![gpu_pod("train", json!({}))]);
    n.agent = AgentHealth::Unproven;
    let (actions, _) = plan_fleet(&plans(), &[n], now());
    assert!(!actions.iter().any(|a| matches!(a, Action::Evict { .. })), "{actions:?}");
    assert!(matches!(&actions[0], Action::Intent { .. }), "{actions:?}");
    assert_withdrawn(&actions[1..], true);
}

#[test]
fn a_drain_for_a_real_difference_goes_on() {
    let mut n = node("n1", true, reported(&["3g.40gb", "1g.10gb"], marked_dead(), Some(draining_record(true))));
    n.pods = Ok(vec![gpu_pod("train", json!({}))]);
    let (actions, reports) = plan_fleet(&plans(), &[n], now());
    assert!(actions.iter().any(|a| matches!(a, Action::Evict { .. })), "{actions:?}");
    assert!(!actions.iter().any(|a| matches!(a, Action::Uncordon { .. })), "{actions:?}");
    assert_eq!(reports["p"].in_progress, 1);
}
