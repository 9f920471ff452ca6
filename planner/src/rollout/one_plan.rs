//! One plan's pass over the nodes it owns: what it wants of each, which may change this pass,
//! the `maxUnavailable` budget they count against, then each node's step from its phase.

use std::rc::Rc;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use tessera_crds::gpunode::{GpuIntent, NodePhase};
use tessera_crds::validate::max_unavailable;
use tessera_crds::{GpuNode, GpuPartitionPlan};

use super::intent::Memo;
use super::kept_verdicts::{KeptVerdicts, Verdict};
use super::ownership::{Owned, clear_intent, release};
use super::{Action, NodeInput, PlanReport, applied, failed_here, in_flight, phases};
use crate::automatic_layouts::Ask;
use crate::liveness::AgentHealth;

/// Where a plan's pass keeps its nodes' verdicts: the carry, and the plan's index among the live.
pub(super) struct Keep<'c> {
    pub(super) carry: &'c mut KeptVerdicts,
    pub(super) plan: usize,
}

/// A node a plan may change this pass.
enum Candidate<'n, 'a> {
    /// Kept from the pass before: at rest with the plan's layout.
    Updated,
    /// Kept from the pass before: waiting for a slot (its position, the node).
    Waiting(usize, &'n NodeInput<'a>),
    /// Planned in full: its position, the node, its `GpuNode`, the intent the plan asks for.
    Full(usize, &'n NodeInput<'a>, &'n Arc<GpuNode>, Rc<Vec<GpuIntent>>),
}

/// Whether a node counts against `maxUnavailable` for `plan_generation`: in flight, failed for
/// this generation, or not updated while its agent is not responding.
fn unavailable(node: &NodeInput<'_>, gn: &GpuNode, desired: &[GpuIntent], plan: &str, generation: Option<i64>) -> bool {
    let r = gn.status.as_ref().and_then(|s| s.rollout.as_ref());
    let phase = r.map(|r| r.phase).unwrap_or_default();
    let failed_now = phase == NodePhase::Failed && r.is_some_and(|r| failed_here(r, plan, generation));
    in_flight(phase) || ((failed_now || node.agent != AgentHealth::Alive) && !applied(gn, desired))
}

/// Whether every GPU of the node is a board of the catalog (`validate` reads only the others).
fn catalogued<'a>(gn: &'a GpuNode, memo: &mut Memo<'a>) -> bool {
    gn.status.iter().flat_map(|s| s.gpus.iter()).all(|g| memo.lookup(&g.product).is_some())
}

/// What a plan wants of a node it owns.
enum Want<'a> {
    /// A change to plan: the node's `GpuNode` and the intent.
    Change(&'a Arc<GpuNode>, Rc<Vec<GpuIntent>>),
    /// Nothing: an automatic plan's decision leaves the node as it is.
    LeftAlone,
    /// Nothing it can do (no report yet, no layout that fits): reported, and the node released.
    Skipped,
}

fn want<'a>(
    plan: &'a GpuPartitionPlan,
    targets: &crate::FastMap<&str, &tessera_crds::plan::NodeTarget>,
    node: &'a NodeInput<'_>,
    actions: &mut Vec<Action>,
    report: &mut PlanReport,
    memo: &mut Memo<'a>,
) -> Want<'a> {
    if let Some(reason) = &node.dra_refused {
        refuse(plan, node, reason, actions, report);
        return Want::Skipped;
    }
    let Some(gn) = node.gpunode.as_ref().filter(|g| g.status.as_ref().is_some_and(|s| !s.gpus.is_empty())) else {
        report.skipped.insert(node.name.to_string(), "waiting for the node agent to report its GPUs".into());
        report.waiting_for_agents += 1;
        return Want::Skipped;
    };
    let wanted = match &plan.spec.layouts_from {
        None => memo.desired(&plan.spec, &gn.status.as_ref().expect("checked").gpus).map(Some),
        Some(_) => match crate::automatic_layouts::desired_from(targets, node.name, gn) {
            Ask::Target(d) | Ask::Finish(d) => Ok(Some(Rc::new(d))),
            Ask::LeaveAlone => Ok(None),
            Ask::Release => {
                release(node, actions);
                Ok(None)
            }
        },
    };
    match wanted {
        Ok(Some(desired)) => Want::Change(gn, desired),
        Ok(None) => Want::LeftAlone,
        Err(reason) => {
            if reason.contains("does not fit") {
                report.invalid.push(format!("{}: {reason}", node.name));
            }
            report.skipped.insert(node.name.to_string(), reason);
            release(node, actions);
            Want::Skipped
        }
    }
}

/// A node whose DRA driver manages MIG itself (DynamicMIG): released and its intent emptied, so
/// its agent is handed nothing and creates nothing; a Warning Event when that changes anything.
fn refuse(
    plan: &GpuPartitionPlan,
    node: &NodeInput<'_>,
    reason: &str,
    actions: &mut Vec<Action>,
    report: &mut PlanReport,
) {
    report.skipped.insert(node.name.to_string(), format!("refused: {reason}"));
    report.dra_refused.push(format!("{}: {reason}", node.name));
    let before = actions.len();
    release(node, actions);
    if actions.len() == before {
        clear_intent(node, actions);
    }
    if actions.len() > before {
        actions.push(Action::Event {
            plan: plan.metadata.name.clone().unwrap_or_default(),
            node: node.name.to_string(),
            reason: "DraRefused",
            message: format!("not managed by Tessera: {reason}"),
            warning: true,
        });
    }
}

/// Plans a plan's owned nodes: picks the candidates, counts the budget, then plans each node
/// from its phase (see [`phases`]) and keeps the verdicts that can be reused.
pub(super) fn plan_one<'a>(
    plan: &'a GpuPartitionPlan,
    nodes: &[Owned<'a, '_>],
    now: Timestamp,
    actions: &mut Vec<Action>,
    report: &mut PlanReport,
    memo: &mut Memo<'a>,
    keep: Keep<'_>,
) {
    let Keep { carry, plan: index } = keep;
    let name = plan.metadata.name.clone().unwrap_or_default();
    let generation = plan.metadata.generation;
    let policy = &plan.spec.rollout;
    // Nodes whose cached objects lag our own last write: in flight until the caches catch up.
    let targets = crate::automatic_layouts::targets_of(plan);
    let (candidates, untouched, others_in_flight) = candidates(plan, &targets, nodes, actions, report, memo, carry);
    report.matched = (candidates.len() + untouched) as i32;
    report.updated += untouched as i32;
    report.demand = crate::automatic_layouts::demand_condition(plan);
    let budget = max_unavailable(&policy.max_unavailable, candidates.len() + untouched).unwrap_or(1);
    // A node whose cache lags our last write counts as in flight whatever the cache shows. A
    // kept verdict is of a node at rest, which does not count.
    let mut busy = others_in_flight
        + candidates
            .iter()
            .filter(|c| match c {
                Candidate::Full(_, node, gn, desired) => {
                    node.cache_behind || unavailable(node, gn, desired, &name, generation)
                }
                Candidate::Updated | Candidate::Waiting(..) => false,
            })
            .count();
    report.budget = budget as i32;
    for candidate in candidates {
        let (position, node, gn, desired) = match candidate {
            Candidate::Updated => {
                report.updated += 1;
                carry.reused += 1;
                continue;
            }
            Candidate::Waiting(..) if busy >= budget || plan.spec.paused => {
                report.pending += 1;
                carry.reused += 1;
                continue;
            }
            // A slot is free: the waiting node is planned in full.
            Candidate::Waiting(position, node) => match want(plan, &targets, node, actions, report, memo) {
                Want::Change(gn, desired) => (position, node, gn, desired),
                // Not expected (its inputs made it a candidate before); planned in full next pass.
                Want::LeftAlone | Want::Skipped => {
                    carry.remember(position, node, None);
                    continue;
                }
            },
            Candidate::Full(position, node, gn, desired) => (position, node, gn, desired),
        };
        let before = (actions.len(), report.updated, report.pending, report.in_progress);
        let step = phases::Step { plan, name: &name, generation, node, gn, desired: &desired, now, budget };
        phases::plan_node(&step, &mut busy, actions, report);
        // Kept for the next pass: a verdict with no action, at rest (updated) or waiting.
        let quiet = actions.len() == before.0 && report.in_progress == before.3 && catalogued(gn, memo);
        let verdict = match (report.updated - before.1, report.pending - before.2) {
            (1, 0) if quiet => Some(Verdict::Updated(index)),
            (0, 1) if quiet => Some(Verdict::Waiting(index)),
            _ => None,
        };
        carry.remember(position, node, verdict);
    }
    report.unavailable = busy as i32;
}

/// The nodes a plan may change this pass (kept verdicts reused, the rest planned in full), how
/// many an automatic plan leaves alone, and how many owned nodes that are neither are in flight.
fn candidates<'a, 'i>(
    plan: &'a GpuPartitionPlan,
    targets: &crate::FastMap<&str, &tessera_crds::plan::NodeTarget>,
    nodes: &[Owned<'a, 'i>],
    actions: &mut Vec<Action>,
    report: &mut PlanReport,
    memo: &mut Memo<'a>,
    carry: &mut KeptVerdicts,
) -> (Vec<Candidate<'a, 'i>>, usize, usize) {
    let mut candidates = Vec::new();
    let mut is_candidate = vec![true; nodes.len()];
    let mut untouched = 0;
    for (i, &(position, node, kept)) in nodes.iter().enumerate() {
        match kept {
            Some(Verdict::Updated(_)) => {
                candidates.push(Candidate::Updated);
                continue;
            }
            Some(Verdict::Waiting(_)) => {
                candidates.push(Candidate::Waiting(position, node));
                continue;
            }
            Some(Verdict::Unowned) | None => {}
        }
        let want = want(plan, targets, node, actions, report, memo);
        if let Want::Change(gn, desired) = want {
            candidates.push(Candidate::Full(position, node, gn, desired));
            continue;
        }
        // An automatic plan leaves alone the nodes its decision does not change.
        untouched += usize::from(matches!(want, Want::LeftAlone));
        is_candidate[i] = false;
        carry.remember(position, node, None);
    }
    // Owned nodes that are not candidates (no report, no layout that fits any more) still count
    // while in flight: they are still cordoned.
    let others_in_flight = nodes
        .iter()
        .zip(&is_candidate)
        .filter(|(_, candidate)| !**candidate)
        .filter(|((_, n, _), _)| {
            n.gpunode.as_ref().and_then(|g| g.status.as_ref()?.rollout.as_ref()).is_some_and(|r| in_flight(r.phase))
        })
        .count();
    (candidates, untouched, others_in_flight)
}
