//! Which plan owns each node of a pass: of the live plans whose selector matches it, the one of
//! top priority owns it and several at the top conflict (nobody acts); and what becomes of a
//! node no plan acts on: released, its intent emptied.

use std::collections::BTreeMap;

use tessera_crds::GpuPartitionPlan;
use tessera_crds::gpunode::{NodePhase, NodeRollout};

use super::kept_verdicts::{KeptVerdicts, Verdict};
use super::{Action, NodeInput, PlanReport, agent_stalled, applied};
use crate::selector::matches;

/// A node a plan owns (its position among the pass's nodes, the node), with the verdict kept
/// for it from the pass before.
pub(super) type Owned<'n, 'a> = (usize, &'n NodeInput<'a>, Option<Verdict>);

/// A pass's nodes by the plan (name) that owns them and the plans that match them.
#[derive(Default)]
pub(super) struct Ownership<'p, 'n, 'a> {
    /// The nodes each plan owns.
    pub(super) owned: BTreeMap<&'p str, Vec<Owned<'n, 'a>>>,
    /// Every node each plan's selector matches (its own or not), for checking the plan. A node
    /// with a kept verdict is left out: it reports only boards of the catalog, which `validate`
    /// does not look at.
    pub(super) matched: BTreeMap<&'p str, Vec<&'n NodeInput<'a>>>,
}

/// Gives each node to its owner: highest priority wins; a tie at the top is a conflict and
/// nobody acts. Nodes no plan owns are released here; kept verdicts are reused.
pub(super) fn assign<'p, 'n, 'a>(
    live: &[&'p GpuPartitionPlan],
    nodes: &'n [NodeInput<'a>],
    carry: &mut KeptVerdicts,
    reports: &mut BTreeMap<String, PlanReport>,
    actions: &mut Vec<Action>,
) -> Ownership<'p, 'n, 'a> {
    let mut ownership = Ownership::default();
    for (position, node) in nodes.iter().enumerate() {
        if reuse_kept(live, position, node, carry, &mut ownership.owned) {
            continue;
        }
        match top_plans(live, node, &mut ownership.matched).as_slice() {
            [] => unowned(position, node, carry, actions),
            [one] => ownership.owned.entry(*one).or_default().push((position, node, None)),
            many => conflict(position, node, many, carry, reports, actions),
        }
    }
    ownership
}

/// Reuses the verdict kept for a node from the pass before: `true` when it settles the node's
/// owner (none, or a plan still live), `false` when the node is to be matched in full.
fn reuse_kept<'p, 'n, 'a>(
    live: &[&'p GpuPartitionPlan],
    position: usize,
    node: &'n NodeInput<'a>,
    carry: &mut KeptVerdicts,
    owned: &mut BTreeMap<&'p str, Vec<Owned<'n, 'a>>>,
) -> bool {
    let kept = carry.verdict(position, node);
    match kept {
        Some(Verdict::Unowned) => {
            carry.reused += 1;
            true
        }
        Some(Verdict::Updated(p) | Verdict::Waiting(p)) => match live.get(p) {
            Some(&plan) => {
                owned
                    .entry(plan.metadata.name.as_deref().unwrap_or_default())
                    .or_default()
                    .push((position, node, kept));
                true
            }
            None => false,
        },
        None => false,
    }
}

/// The names of the live plans of top priority whose selector matches the node, in the order of
/// `live`; every plan that matches it at all is noted in `matched`.
fn top_plans<'p, 'n, 'a>(
    live: &[&'p GpuPartitionPlan],
    node: &'n NodeInput<'a>,
    matched: &mut BTreeMap<&'p str, Vec<&'n NodeInput<'a>>>,
) -> Vec<&'p str> {
    let mut top: Option<i32> = None;
    let mut winners: Vec<&str> = Vec::new();
    for p in live.iter().filter(|p| matches(&p.spec.node_selector, node.labels)) {
        let name = p.metadata.name.as_deref().unwrap_or_default();
        matched.entry(name).or_default().push(node);
        match top {
            Some(t) if p.spec.priority < t => continue,
            Some(t) if p.spec.priority == t => winners.push(name),
            _ => {
                top = Some(p.spec.priority);
                winners = vec![name];
            }
        }
    }
    winners
}

/// A node no plan matches: released, then its intent emptied if that left nothing to do; kept
/// as unowned for the next pass when neither had anything to do.
fn unowned(position: usize, node: &NodeInput<'_>, carry: &mut KeptVerdicts, actions: &mut Vec<Action>) {
    let before = actions.len();
    release(node, actions);
    if actions.len() == before {
        clear_intent(node, actions);
    }
    carry.remember(position, node, (actions.len() == before).then_some(Verdict::Unowned));
}

/// A node the plans `many` claim at the same top priority: each reports the others, and the
/// node is released, since none of them acts on it.
fn conflict(
    position: usize,
    node: &NodeInput<'_>,
    many: &[&str],
    carry: &mut KeptVerdicts,
    reports: &mut BTreeMap<String, PlanReport>,
    actions: &mut Vec<Action>,
) {
    for p in many {
        let others = many.iter().filter(|o| *o != p).map(|o| o.to_string()).collect();
        reports.get_mut(*p).expect("every plan has a report").conflicts.insert(node.name.to_string(), others);
    }
    release(node, actions);
    carry.remember(position, node, None);
}

/// The live plans of top priority that match a node: one owns it; several conflict.
pub fn contenders(live: &[&GpuPartitionPlan], labels: &BTreeMap<String, String>) -> Vec<String> {
    let matching: Vec<&&GpuPartitionPlan> = live.iter().filter(|p| matches(&p.spec.node_selector, labels)).collect();
    let top = matching.iter().map(|p| p.spec.priority).max();
    matching
        .iter()
        .filter(|p| Some(p.spec.priority) == top)
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect()
}

/// A node no plan acts on any more: finish an in-flight apply, uncordon what we cordoned, forget.
/// Forgetting the rollout withdraws the hand-over, so the agent changes nothing disruptive after.
pub(super) fn release(node: &NodeInput<'_>, actions: &mut Vec<Action>) {
    if node.cache_behind {
        return; // decided on the next pass, from a view that shows our last write
    }
    let Some(gn) = &node.gpunode else { return };
    let Some(r) = gn.status.as_ref().and_then(|s| s.rollout.as_ref()) else { return };
    // An agent not proven yet (the operator just started) may be mid-change: wait to know.
    let agent_working = !node.agent.is_not_responding() && !applied(gn, &gn.spec.gpus) && agent_stalled(gn).is_none();
    if r.phase == NodePhase::Applying && agent_working {
        return; // the agent is reconfiguring a drained node: let it finish first
    }
    if r.cordoned_by_us && node.unschedulable {
        if r.phase == NodePhase::Applying {
            // Withdraw the hand-over before the uncordon, so a late agent changes nothing.
            let withdrawn = NodeRollout { phase: NodePhase::Pending, ..r.clone() };
            actions.push(Action::Rollout { node: node.name.to_string(), rollout: Some(withdrawn) });
        }
        actions.push(Action::Uncordon { node: node.name.to_string() });
    }
    actions.push(Action::Rollout { node: node.name.to_string(), rollout: None });
}

/// A node that no plan matches, released (no rollout record left): its intent is emptied, once.
/// What it held came from a plan that was deleted or no longer selects it; kept, it named that
/// plan (`kubectl get gpunodes`, `kubectl tessera status`) and had the agent re-create, in free
/// space, instances an admin removed by hand. Empty, the agent leaves the GPUs as they are.
/// Nodes of an invalid plan, or claimed by plans in conflict, keep theirs: a plan still owns them.
pub(super) fn clear_intent(node: &NodeInput<'_>, actions: &mut Vec<Action>) {
    if node.cache_behind {
        return;
    }
    let Some(gn) = &node.gpunode else { return };
    let released = gn.status.as_ref().and_then(|s| s.rollout.as_ref()).is_none();
    if released && (gn.spec.plan.is_some() || !gn.spec.gpus.is_empty()) {
        actions.push(Action::ClearIntent { node: node.name.to_string() });
    }
}
