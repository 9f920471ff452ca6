//! Automatic mode (`spec.layoutsFrom`), pure: the demand a plan serves (its quotas' and the
//! others' guarantees, `coverage`), when to work its layouts out again, the decision itself
//! (`fleet::solve` over the plan's idle GPUs), and what the rollout planner should ask of each
//! node. The controller stores the decision in the plan's
//! `status.layoutDecision` and the rollout takes it from there, with the plan's policy.
//!
//! Never flapping: a decision is only worked out again when the demand, the plan or the plan's
//! fleet (nodes and GPUs, not their layouts) changes, after the change has held still for
//! `stabilizationSeconds`, and after the nodes in flight have finished; and the solver changes
//! nothing when the current layouts serve the demand as well as any other would.

use std::collections::{BTreeMap, BTreeSet};
use tessera_crds::conditions::plan_reasons;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube_core::ResourceExt;
use tessera_crds::gpunode::{GpuIntent, GpuState, NodePhase};
use tessera_crds::plan::{ExcludedNode, GpuTarget, LayoutDecision, LayoutsFrom, NodeTarget};
use tessera_crds::solver::Placement;
use tessera_crds::{GpuNode, GpuPartitionPlan, TenantGpuQuota, catalog};

use crate::coverage;
pub use crate::coverage::Demand;
use crate::fleet::{self, FleetAnswer, GpuSlot, Layout};
use crate::selector::matches;
pub use excluded::{Exclusions, RETRY_ANNOTATION, exclusions};

/// The demand an automatic plan serves: the quotas it selects plus its headroom, and every other
/// quota's guarantee (`coverage`: the supply those are guaranteed is not the plan's to count).
pub fn plan_demand(from: &LayoutsFrom, quotas: &[TenantGpuQuota]) -> Demand {
    Demand::of(quotas, |q| matches(&from.quota_selector, q.labels()), i64::from(from.headroom_percent))
}

/// The solver's view of the reported GPUs; `changeable(node)` says which nodes may change. GPUs
/// of boards the catalog lacks (and without a valid reported table) are left out.
pub fn gpu_slots<'a>(
    gpunodes: impl IntoIterator<Item = &'a GpuNode>,
    changeable: &dyn Fn(&str) -> bool,
) -> Vec<GpuSlot> {
    let mut out = Vec::new();
    for gn in gpunodes {
        let node = gn.name_any();
        let may_change = changeable(&node);
        out.extend(gn.status.iter().flat_map(|s| s.gpus.iter()).filter_map(|g| gpu_slot(&node, g, may_change)));
    }
    out
}

/// One reported GPU as the solver sees it: `None` unless MIG capable and of a known geometry.
pub fn gpu_slot(node: &str, g: &GpuState, changeable: bool) -> Option<GpuSlot> {
    if !g.mig_capable {
        return None;
    }
    let model = catalog::lookup(&g.product)
        .or_else(|| catalog::valid_table(&g.profiles).then(|| catalog::model_from_table(&g.product, &g.profiles)))?;
    let instances: Vec<Placement> = g
        .instances
        .iter()
        .map(|i| Placement {
            start: i.start.clamp(0, 255) as u8,
            size: i.size.clamp(0, 255) as u8,
            profile: catalog::normalize_profile(&i.profile),
        })
        .collect();
    Some(GpuSlot {
        node: node.to_string(),
        index: g.index,
        model,
        mig_enabled: g.mig_enabled,
        instances,
        busy: vec![],
        changeable,
    })
}

/// A digest of the plan's nodes and their GPUs (index and product, not layouts: the rollout
/// changes those itself). FNV-1a, hex.
pub fn fleet_digest<'a>(gpunodes: impl IntoIterator<Item = &'a GpuNode>) -> String {
    let mut parts: Vec<String> = gpunodes
        .into_iter()
        .map(|gn| {
            let gpus: Vec<String> =
                gn.status.iter().flat_map(|s| s.gpus.iter()).map(|g| format!("{}={}", g.index, g.product)).collect();
            format!("{}:{}", gn.name_any(), gpus.join(","))
        })
        .collect();
    parts.sort();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.join(";").bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// What to do about an automatic plan's decision this pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// The stored decision stands.
    Keep,
    /// Something changed; decide once the nodes in flight are done.
    Wait(String),
    /// Something changed (`why`); decide if it holds still `left` more seconds.
    Stabilize { why: String, left: i64 },
    /// Work the layouts out now, for this reason.
    Decide(String),
}

/// Whether to decide again. `stable_for` is how long (seconds) the current demand and fleet
/// have been seen unchanged; `in_flight` is how many of the plan's nodes are mid-change;
/// `blocked` how many of the decision's targets cannot be changed any more (failed, or their
/// agent stopped responding); `lifted` the nodes it left out that may be tried again
/// ([`Exclusions`]).
pub fn next(
    plan: &GpuPartitionPlan,
    demand: &BTreeMap<String, i64>,
    digest: &str,
    stable_for: i64,
    in_flight: usize,
    blocked: usize,
    lifted: &[String],
) -> Next {
    let Some(from) = &plan.spec.layouts_from else { return Next::Keep };
    let decision = plan.status.as_ref().and_then(|s| s.layout_decision.as_ref());
    let why = match decision {
        None => "no decision yet".to_string(),
        Some(d) if d.plan_generation != plan.metadata.generation => "the plan changed".to_string(),
        Some(d) if &d.demand != demand => format!("the quotas' demand changed: {}", demand_change(&d.demand, demand)),
        Some(d) if d.fleet != digest => "the plan's nodes or GPUs changed".to_string(),
        Some(_) if blocked > 0 => format!("{blocked} target node(s) failed or lost their agent"),
        Some(_) if !lifted.is_empty() => format!("node(s) left out may be tried again: {}", lifted.join(", ")),
        Some(_) => return Next::Keep,
    };
    if in_flight > 0 {
        return Next::Wait(format!("{why}; deciding again once the {in_flight} node(s) in flight are done"));
    }
    let wait = from.stabilization_seconds.max(0) - stable_for;
    if decision.is_some() && wait > 0 {
        return Next::Stabilize { why, left: wait };
    }
    Next::Decide(why)
}

/// The plan's message while it waits out `stabilizationSeconds`: what changed, what the fleet
/// supplies of the demand now (the quota controller's figures, `coverage`), and when it decides.
pub fn stabilizing_message(
    why: &str,
    demand: &BTreeMap<String, i64>,
    supply: &BTreeMap<String, i64>,
    stabilization_seconds: i64,
    decide_at: &Time,
) -> String {
    let short = coverage::shortfall(demand, supply);
    let now = if short.is_empty() {
        "the fleet's current layouts cover the demand".to_string()
    } else {
        let parts: Vec<String> = short
            .iter()
            .map(|(r, n)| format!("{r} {} of {} (short {n})", supply.get(r).copied().unwrap_or(0), demand[r]))
            .collect();
        format!("the fleet supplies {}", parts.join(", "))
    };
    format!(
        "waiting {stabilization_seconds}s (stabilizationSeconds) for the change to hold still: {why}; {now}; deciding \
         at {} unless it changes again",
        decide_at.0
    )
}

fn demand_change(old: &BTreeMap<String, i64>, new: &BTreeMap<String, i64>) -> String {
    let keys: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    let parts: Vec<String> = keys
        .into_iter()
        .filter_map(|k| {
            let (a, b) = (old.get(k).copied().unwrap_or(0), new.get(k).copied().unwrap_or(0));
            (a != b).then(|| format!("{k} {a} -> {b}"))
        })
        .collect();
    parts.join(", ")
}

/// The decision for an answer of the solver.
#[allow(clippy::too_many_arguments)]
pub fn decision(
    plan: &GpuPartitionPlan,
    demand: &Demand,
    answer: &FleetAnswer,
    digest: String,
    kept_busy: &BTreeSet<String>,
    excluded: &[ExcludedNode],
    why: &str,
    now: Time,
) -> LayoutDecision {
    let mut per_node: BTreeMap<String, Vec<GpuTarget>> = BTreeMap::new();
    for g in answer.gpus.iter().filter(|g| g.changed) {
        let profiles = g.layout.profiles().into_iter().map(|(p, n)| (p, n.min(i32::MAX as u32) as i32)).collect();
        let target = GpuTarget { index: g.index, mig_enabled: g.layout != Layout::Whole, profiles };
        per_node.entry(g.node.clone()).or_default().push(target);
    }
    let targets: Vec<NodeTarget> = per_node.into_iter().map(|(node, gpus)| NodeTarget { node, gpus }).collect();
    let shortfall = |m: &BTreeMap<String, i64>| -> String {
        m.iter().map(|(r, n)| format!("{r} by {n}")).collect::<Vec<_>>().join(", ")
    };
    let mut message = match (answer.changed, answer.shortfall.is_empty()) {
        (0, true) => "the current layouts meet the demand; nothing changes".to_string(),
        (n, true) => format!(
            "repartitioning {n} idle GPU(s) on {} node(s) to meet the demand ({} instance(s) destroyed)",
            targets.len(),
            answer.destroyed
        ),
        (0, false) => format!(
            "the demand cannot be met: short of {}; no change of this plan's idle GPUs helps (add GPUs, widen \
             the plan's nodeSelector or free busy nodes)",
            shortfall(&answer.shortfall)
        ),
        (n, false) => format!(
            "repartitioning {n} idle GPU(s) on {} node(s) gets closest to the demand, still short of {} (add GPUs, \
             widen the plan's nodeSelector or free busy nodes)",
            targets.len(),
            shortfall(&answer.shortfall)
        ),
    };
    if !kept_busy.is_empty() {
        message.push_str(&format!(
            "; {} node(s) running GPU pods left alone: {}",
            kept_busy.len(),
            kept_busy.iter().take(10).cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    if !excluded.is_empty() {
        let list: Vec<String> =
            excluded.iter().take(10).map(|e| format!("{} ({}: {})", e.node, e.reason, e.message)).collect();
        message.push_str(&format!(
            "; {} node(s) left out because their agent could not apply a layout asked of them (tried again when \
             the agent's report or the plan changes, or on a new {RETRY_ANNOTATION} annotation value): {}",
            excluded.len(),
            list.join(", ")
        ));
    }
    if let Some(note) = demand.others_note() {
        message.push_str(&format!("; {note}"));
    }
    message.push_str(&format!(" (decided because {why})"));
    LayoutDecision {
        plan_generation: plan.metadata.generation,
        decided_at: Some(now),
        demand: demand.total(),
        supply_before: answer.supply_before.clone(),
        supply_after: answer.supply_after.clone(),
        shortfall: answer.shortfall.clone(),
        changed_gpus: answer.changed.min(i32::MAX as u32) as i32,
        destroyed_instances: answer.destroyed.min(i32::MAX as u32) as i32,
        fleet: digest,
        targets,
        kept_busy: kept_busy.iter().cloned().collect(),
        excluded: excluded.to_vec(),
        message,
    }
}

/// What the GPUs the solver cannot carve supply (not MIG capable, or a board the catalog lacks
/// without a valid reported table), as the quota controller counts them.
pub fn unseen_supply<'a>(gpunodes: impl IntoIterator<Item = &'a GpuNode>) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for g in gpunodes.into_iter().flat_map(|gn| gn.status.iter().flat_map(|s| s.gpus.iter())) {
        if gpu_slot("", g, false).is_none() {
            crate::supply::gpu_supply(g, &mut out);
        }
    }
    out
}

/// The solver over the whole fleet for `demand`, GPUs changeable where `changeable(node)`: the
/// one computation behind an automatic plan's decision and `plan suggest`. Supply and shortfall
/// are the whole fleet's (GPUs the solver cannot carve included), against the total demand, so
/// they are the quota controller's figures for the same layouts (`coverage::shortfall`).
pub fn solve_for<'a>(
    demand: &Demand,
    gpunodes: impl IntoIterator<Item = &'a GpuNode> + Clone,
    changeable: &dyn Fn(&str) -> bool,
) -> Result<FleetAnswer, fleet::SolveError> {
    let total = demand.total();
    let slots = gpu_slots(gpunodes.clone(), changeable);
    let unseen = unseen_supply(gpunodes);
    // No GPU holds more than 8 instances: a demand beyond 8 per GPU (an "unlimited" quota) is
    // capped for the solver, whose objective would otherwise lose the small terms, and the
    // shortfall is reported against the real demand.
    let cap = (slots.len() as i64).saturating_mul(8);
    let capped: BTreeMap<String, i64> = total
        .iter()
        .map(|(r, n)| (r.clone(), n.saturating_sub(unseen.get(r).copied().unwrap_or(0)).clamp(0, cap)))
        .collect();
    let mut answer = fleet::solve(&slots, &capped)?;
    for (r, n) in &unseen {
        for supply in [&mut answer.supply_before, &mut answer.supply_after] {
            let e = supply.entry(r.clone()).or_default();
            *e = e.saturating_add(*n);
        }
    }
    answer.shortfall = coverage::shortfall(&total, &answer.supply_after);
    Ok(answer)
}

/// Works out an automatic plan's layouts: the fleet's GPUs, of which the plan's `owned` nodes
/// may change unless `busy` (running GPU pods), `frozen` (mid-change, failed, or whose agent
/// is down) or `excluded` (their agent could not apply what the plan asked, [`exclusions`]).
#[allow(clippy::too_many_arguments)]
pub fn decide(
    plan: &GpuPartitionPlan,
    demand: &Demand,
    gpunodes: &[&GpuNode],
    owned: &BTreeSet<String>,
    busy: &BTreeSet<String>,
    frozen: &BTreeSet<String>,
    excluded: &[ExcludedNode],
    why: &str,
    now: Time,
) -> Result<LayoutDecision, fleet::SolveError> {
    let excluded: Vec<ExcludedNode> = excluded.iter().filter(|e| owned.contains(&e.node)).cloned().collect();
    let out: BTreeSet<&str> = excluded.iter().map(|e| e.node.as_str()).collect();
    let changeable = |n: &str| owned.contains(n) && !busy.contains(n) && !frozen.contains(n) && !out.contains(n);
    let answer = solve_for(demand, gpunodes.iter().copied(), &changeable)?;
    let kept_busy: BTreeSet<String> = busy.intersection(owned).cloned().collect();
    let mine = gpunodes.iter().copied().filter(|g| owned.contains(&g.name_any()));
    let digest = fleet_digest(mine);
    Ok(decision(plan, demand, &answer, digest, &kept_busy, &excluded, why, now))
}

/// A node whose rollout record says it cannot take a new layout now: mid-change or failed.
pub fn frozen_by_rollout(gn: &GpuNode) -> bool {
    let phase = gn.status.as_ref().and_then(|s| s.rollout.as_ref()).map(|r| r.phase);
    matches!(phase, Some(NodePhase::Draining | NodePhase::Applying | NodePhase::Uncordoning | NodePhase::Failed))
}

/// What an automatic plan asks of one of its nodes.
#[derive(Debug, Clone, PartialEq)]
pub enum Ask {
    /// Roll this intent out: the node is a target of the current decision.
    Target(Vec<GpuIntent>),
    /// The node was handed to its agent with this intent: finish it before anything else, as
    /// stopping halfway would leave it cordoned with half a layout.
    Finish(Vec<GpuIntent>),
    /// Not a target, but a rollout record of ours or another plan's is on it (draining, pending,
    /// failed): release it (uncordon what we cordoned, forget the record).
    Release,
    /// Not a target: leave it as it is.
    LeaveAlone,
}

/// What an automatic plan asks of `node`. Targets of a decision made for another generation of
/// the plan are ignored (the plan changed; a new decision follows).
pub fn desired(plan: &GpuPartitionPlan, node: &str, gn: &GpuNode) -> Ask {
    desired_from(&targets_of(plan), node, gn)
}

/// The current decision's targets of a plan by node (none when the decision is for another
/// generation): looked up once per node, where a search of the list per node was quadratic.
pub fn targets_of(plan: &GpuPartitionPlan) -> crate::FastMap<&str, &tessera_crds::plan::NodeTarget> {
    plan.status
        .as_ref()
        .and_then(|s| s.layout_decision.as_ref())
        .filter(|d| d.plan_generation == plan.metadata.generation)
        .map(|d| d.targets.iter().rev().map(|t| (t.node.as_str(), t)).collect())
        .unwrap_or_default()
}

/// [`desired`] with the plan's targets already indexed ([`targets_of`]).
pub fn desired_from(targets: &crate::FastMap<&str, &tessera_crds::plan::NodeTarget>, node: &str, gn: &GpuNode) -> Ask {
    if let Some(t) = targets.get(node) {
        return Ask::Target(t.gpus.iter().map(GpuIntent::from).collect());
    }
    let Some(r) = gn.status.as_ref().and_then(|s| s.rollout.as_ref()) else { return Ask::LeaveAlone };
    match r.phase {
        // An `Idle` record still naming our cordon (a withdrawn drain cut short) is released:
        // left alone, nothing would ever undo the cordon.
        NodePhase::Idle if !r.cordoned_by_us => Ask::LeaveAlone,
        // The intent is written when a node is handed over (Draining -> Applying).
        NodePhase::Applying | NodePhase::Uncordoning if !gn.spec.gpus.is_empty() => Ask::Finish(gn.spec.gpus.clone()),
        _ => Ask::Release,
    }
}

/// The plan's condition about the demand: (met, reason, message), from its decision.
pub fn demand_condition(plan: &GpuPartitionPlan) -> Option<(bool, &'static str, String)> {
    plan.spec.layouts_from.as_ref()?;
    let Some(d) = plan.status.as_ref().and_then(|s| s.layout_decision.as_ref()) else {
        return Some((false, plan_reasons::DECIDING, "working out the layouts from the quotas".into()));
    };
    if d.shortfall.is_empty() {
        Some((true, plan_reasons::DEMAND_MET, d.message.clone()))
    } else {
        Some((false, plan_reasons::DEMAND_NOT_MET, d.message.clone()))
    }
}

pub mod excluded;
#[cfg(test)]
mod tests;
pub mod written;
