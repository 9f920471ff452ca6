//! Pure: a plan's status from the planner's report. kstatus reads `Stalled` as Failed,
//! `Reconciling` as InProgress and `Ready` as Current; Argo CD's health script reads the same.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use tessera_crds::GpuPartitionPlanStatus;
use tessera_crds::conditions::{
    CONFLICT, DEMAND_MET, READY, RECONCILING, STALLED, plan_reasons, remove_condition, set_condition,
};

use crate::rollout::PlanReport;

/// The plan's status from this pass's report. The conditions are set in a fixed order, so ones
/// that are new this pass are appended in that order.
pub fn plan_status(
    previous: &[Condition],
    report: &PlanReport,
    generation: Option<i64>,
    paused: bool,
    now: Time,
) -> GpuPartitionPlanStatus {
    let mut c: Vec<Condition> = previous.to_vec();
    let g = generation;
    let stalled = stalled(report);
    set_conflict(&mut c, report, g, now.clone());
    set_stalled(&mut c, stalled.as_ref(), g, now.clone());
    set_dra_in_sync(&mut c, report, g, now.clone());
    set_demand_met(&mut c, report, g, now.clone());
    set_reconciling(&mut c, report, paused, g, now.clone());
    set_ready(&mut c, report, stalled, g, now);
    GpuPartitionPlanStatus {
        observed_generation: generation,
        conditions: c,
        matched_nodes: report.matched,
        updated_nodes: report.updated,
        in_progress_nodes: report.in_progress,
        failed_nodes: report.failed.len() as i32,
        skipped_nodes: report.skipped.clone(),
        fragmented_slices: report.fragmented_slices,
        layout_decision: None,
    }
}

/// `Conflict`: present while plans of equal priority match the same nodes, naming them.
fn set_conflict(c: &mut Vec<Condition>, report: &PlanReport, g: Option<i64>, now: Time) {
    if report.conflicts.is_empty() {
        remove_condition(c, CONFLICT);
    } else {
        set_condition(c, CONFLICT, true, plan_reasons::EQUAL_PRIORITY, conflict_message(report), g, now);
    }
}

/// `Stalled`: present while progress needs a human (see [`stall_reasons`]).
fn set_stalled(c: &mut Vec<Condition>, stalled: Option<&(&'static str, String)>, g: Option<i64>, now: Time) {
    match stalled {
        Some((reason, msg)) => set_condition(c, STALLED, true, reason, msg.clone(), g, now),
        None => remove_condition(c, STALLED),
    }
}

/// `DraInSync`: False while a matched node's GPU DRA driver is refused (DynamicMIG) or lists
/// devices other than the agent reports, naming the nodes; absent when all agree (or no DRA).
fn set_dra_in_sync(c: &mut Vec<Condition>, report: &PlanReport, g: Option<i64>, now: Time) {
    let nodes: Vec<&str> = report.dra_refused.iter().chain(&report.dra_stale).map(String::as_str).collect();
    if nodes.is_empty() {
        remove_condition(c, crate::dra_slices::DRA_IN_SYNC);
        return;
    }
    let reason =
        if report.dra_refused.is_empty() { plan_reasons::SLICES_STALE } else { plan_reasons::DYNAMIC_MIG_REFUSED };
    set_condition(c, crate::dra_slices::DRA_IN_SYNC, false, reason, nodes.join("; "), g, now);
}

/// `DemandMet` (automatic plans): the decision's verdict on the quotas' demand, `False` until
/// every node holds a decision that covers it; absent for plans with a fixed layout.
fn set_demand_met(c: &mut Vec<Condition>, report: &PlanReport, g: Option<i64>, now: Time) {
    match &report.demand {
        // The decision covers the demand once applied; the quotas' `CapacityAvailable` reads the
        // fleet as it is. Until every node is done (or while one failed), say not yet, so the two
        // never disagree on what the fleet supplies now.
        Some((true, _, msg)) if report.in_progress + report.pending > 0 || !report.failed.is_empty() => {
            let waiting = report.in_progress + report.pending + report.failed.len() as i32;
            let msg = format!("met once applied ({waiting} node(s) not done yet): {msg}");
            set_condition(c, DEMAND_MET, false, plan_reasons::NOT_YET_APPLIED, msg, g, now)
        }
        Some((met, reason, msg)) => set_condition(c, DEMAND_MET, *met, reason, msg.clone(), g, now),
        None => remove_condition(c, DEMAND_MET),
    }
}

/// `Reconciling`: present while work remains (see [`remaining`]), saying what is in progress and
/// what holds it.
fn set_reconciling(c: &mut Vec<Condition>, report: &PlanReport, paused: bool, g: Option<i64>, now: Time) {
    if remaining(report) == 0 {
        remove_condition(c, RECONCILING);
        return;
    }
    let reason = match (paused, stabilizing(report)) {
        (true, _) => plan_reasons::PAUSED,
        (false, Some(_)) => plan_reasons::STABILIZING,
        (false, None) => plan_reasons::ROLLING_OUT,
    };
    set_condition(c, RECONCILING, true, reason, reconciling_message(report, paused), g, now);
}

/// `Reconciling`'s message: the node counts, then each thing that holds or slows the rollout.
fn reconciling_message(report: &PlanReport, paused: bool) -> String {
    let mut msg = format!(
        "{} of {} node(s) updated; {} in progress, {} waiting",
        report.updated, report.matched, report.in_progress, report.pending
    );
    if report.waiting_for_agents > 0 {
        msg.push_str(&format!("; {} matched node(s) have no node agent report yet", report.waiting_for_agents));
    }
    if paused {
        msg.push_str(" (paused: no new node starts)");
    }
    if let Some(why) = &report.deciding {
        msg.push_str(&format!("; layouts: {why}"));
    } else if deciding(report) {
        msg.push_str("; working out the layouts from the quotas");
    }
    for part in [&report.drain_blocked, &report.agent_progress] {
        if !part.is_empty() {
            msg.push_str(&format!("; {}", part.join("; ")));
        }
    }
    if !report.errors.is_empty() {
        msg.push_str(&format!("; API errors, retried: {}", report.errors.join("; ")));
    }
    msg
}

/// `Ready`: always present; `True` once nothing is stalled and no work remains.
fn set_ready(
    c: &mut Vec<Condition>,
    report: &PlanReport,
    stalled: Option<(&'static str, String)>,
    g: Option<i64>,
    now: Time,
) {
    let ready = stalled.is_none() && remaining(report) == 0;
    let (reason, msg) = ready_reason(report, stalled, ready);
    set_condition(c, READY, ready, reason, msg, g, now);
}

/// `Ready`'s (reason, message): the stall when stalled, else what the plan has or waits for.
fn ready_reason(report: &PlanReport, stalled: Option<(&'static str, String)>, ready: bool) -> (&'static str, String) {
    let stabilizing = stabilizing(report);
    match (stalled, ready) {
        (Some(stall), _) => stall,
        (None, true) if report.matched == 0 => (plan_reasons::NO_NODES, "no GPU node matches the plan".to_string()),
        (None, false) if report.in_progress + report.pending == 0 && report.waiting_for_agents > 0 => (
            plan_reasons::WAITING_FOR_AGENTS,
            format!("{} matched node(s) have no node agent report yet", report.waiting_for_agents),
        ),
        (None, true) if report.demand.is_some() => (
            plan_reasons::APPLIED,
            format!("all {} matched node(s) have the layouts decided for the quotas", report.matched),
        ),
        (None, true) => {
            (plan_reasons::APPLIED, format!("all {} matched node(s) have the plan's layout", report.matched))
        }
        (None, false) if stabilizing.is_some() => (plan_reasons::STABILIZING, stabilizing.cloned().unwrap_or_default()),
        (None, false) => {
            (plan_reasons::ROLLING_OUT, format!("{} of {} node(s) updated", report.updated, report.matched))
        }
    }
}

/// Work still to do: nodes changing or waiting, nodes without an agent report, API errors to
/// retry, and a layout decision not made yet.
fn remaining(report: &PlanReport) -> i32 {
    report.in_progress
        + report.pending
        + report.waiting_for_agents
        + report.errors.len() as i32
        + i32::from(deciding(report))
}

/// Whether an automatic plan still waits for (or works out) its layout decision.
fn deciding(report: &PlanReport) -> bool {
    report.deciding.is_some() || report.demand.as_ref().is_some_and(|(_, r, _)| *r == plan_reasons::DECIDING)
}

/// An automatic plan waiting to decide, with no node of it mid-change: nothing rolls out, so
/// it says that it waits and why (its layout step's message) rather than `RollingOut`.
fn stabilizing(report: &PlanReport) -> Option<&String> {
    report.deciding.as_ref().filter(|_| report.in_progress == 0)
}

/// `Stalled`'s (reason, message): the most fundamental reason; with several, every
/// "reason: message" joined, so none is hidden.
fn stalled(report: &PlanReport) -> Option<(&'static str, String)> {
    let reasons = stall_reasons(report);
    match reasons.as_slice() {
        [] => None,
        [(reason, msg)] => Some((*reason, msg.clone())),
        [(reason, _), ..] => {
            Some((*reason, reasons.iter().map(|(r, m)| format!("{r}: {m}")).collect::<Vec<_>>().join(" | ")))
        }
    }
}

/// Why a plan cannot make progress without a human, most fundamental first: (reason, message).
fn stall_reasons(report: &PlanReport) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if !report.invalid_spec.is_empty() {
        out.push((
            plan_reasons::INVALID_SPEC,
            format!("the plan acts on no node until fixed: {}", report.invalid_spec.join("; ")),
        ));
    }
    if !report.conflicts.is_empty() {
        out.push((plan_reasons::CONFLICT, conflict_message(report)));
    }
    if !report.invalid.is_empty() {
        out.push((plan_reasons::INVALID_LAYOUT, report.invalid.join("; ")));
    }
    if !report.unresponsive.is_empty() {
        out.push((plan_reasons::AGENT_NOT_RESPONDING, report.unresponsive.join("; ")));
    }
    if !report.reset_required.is_empty() {
        out.push((
            plan_reasons::RESET_REQUIRED,
            format!(
                "GPU reset or node reboot needed (nodes stay cordoned until then): {}",
                report.reset_required.join("; ")
            ),
        ));
    }
    if !report.apply_timeouts.is_empty() {
        out.push((
            plan_reasons::APPLY_TIMEOUT,
            format!("node(s) stay cordoned until their agent reports success: {}", report.apply_timeouts.join("; ")),
        ));
    }
    if !report.drain_timeouts.is_empty() {
        out.push((plan_reasons::DRAIN_TIMEOUT, report.drain_timeouts.join("; ")));
    }
    if !report.failed.is_empty() {
        let list: Vec<String> = report.failed.iter().map(|(n, m)| format!("{n}: {m}")).collect();
        out.push((plan_reasons::NODE_FAILED, list.join("; ")));
    }
    if halted(report) {
        let msg = format!(
            "rollout halted: {} node(s) failed or without a responding agent use the whole maxUnavailable \
             budget of {}; {} node(s) wait",
            report.unavailable, report.budget, report.pending
        );
        let stuck = [plan_reasons::NODE_FAILED, plan_reasons::AGENT_NOT_RESPONDING];
        match out.iter_mut().find(|(r, _)| stuck.contains(r)) {
            Some((_, m)) => *m = format!("{msg}. {m}"),
            None => out.push((plan_reasons::NODE_FAILED, msg)),
        }
    }
    out
}

/// Nodes wait while failed or unresponsive nodes hold every rollout slot.
fn halted(report: &PlanReport) -> bool {
    let stuck = report.failed.len() + report.unresponsive.len();
    report.pending > 0 && stuck > 0 && report.unavailable >= report.budget
}

/// `Conflict`'s message: each set of equal-priority plans with the nodes they also match.
fn conflict_message(report: &PlanReport) -> String {
    let mut by_plans: std::collections::BTreeMap<String, Vec<&str>> = Default::default();
    for (node, others) in &report.conflicts {
        by_plans.entry(others.join(", ")).or_default().push(node);
    }
    let parts: Vec<String> = by_plans
        .iter()
        .map(|(others, nodes)| format!("plan(s) {others} of equal priority also match node(s) {}", nodes.join(", ")))
        .collect();
    format!("{}; neither plan acts there", parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Time {
        Time("2026-06-01T00:00:00Z".parse().unwrap())
    }

    fn cond<'a>(st: &'a GpuPartitionPlanStatus, t: &str) -> Option<&'a Condition> {
        st.conditions.iter().find(|c| c.type_ == t)
    }

    #[test]
    fn nodes_without_an_agent_report_are_work_still_to_do() {
        let report = PlanReport { waiting_for_agents: 2, ..Default::default() };
        let st = plan_status(&[], &report, Some(1), false, now());
        let ready = cond(&st, READY).unwrap();
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "WaitingForAgents"));
        assert!(
            cond(&st, RECONCILING)
                .is_some_and(|c| c.message.contains("2 matched node(s) have no node agent report yet"))
        );
    }

    #[test]
    fn dra_disagreements_and_refusals_name_their_nodes_and_clear_when_gone() {
        let report = PlanReport {
            dra_refused: vec!["n1: DynamicMIG".into()],
            dra_stale: vec!["n2: lists gpu-0-mig-14-0-2".into()],
            ..Default::default()
        };
        let st = plan_status(&[], &report, Some(1), false, now());
        let c = cond(&st, crate::dra_slices::DRA_IN_SYNC).unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "DynamicMigRefused"));
        assert_eq!(c.message, "n1: DynamicMIG; n2: lists gpu-0-mig-14-0-2");
        let stale = PlanReport { dra_stale: report.dra_stale.clone(), ..Default::default() };
        let st = plan_status(&st.conditions, &stale, Some(1), false, now());
        assert_eq!(cond(&st, crate::dra_slices::DRA_IN_SYNC).unwrap().reason, "SlicesStale");
        let st = plan_status(&st.conditions, &PlanReport::default(), Some(1), false, now());
        assert!(cond(&st, crate::dra_slices::DRA_IN_SYNC).is_none());
    }

    #[test]
    fn a_plan_matching_nothing_is_ready_and_says_so() {
        let st = plan_status(&[], &PlanReport::default(), Some(1), false, now());
        let ready = cond(&st, READY).unwrap();
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("True", "NoNodes"));
        assert!(cond(&st, RECONCILING).is_none() && cond(&st, STALLED).is_none());
    }

    /// An automatic plan waiting out `stabilizationSeconds` says so, not `RollingOut`.
    #[test]
    fn a_plan_waiting_to_decide_says_it_is_stabilizing_and_why() {
        let waiting = "waiting 30s (stabilizationSeconds) for the change to hold still: the quotas' demand changed: \
                       nvidia.com/mig-1g.10gb 18 -> 20; the fleet supplies nvidia.com/mig-1g.10gb 18 of 20 (short 2); \
                       deciding at 2026-06-01T00:00:30Z unless it changes again";
        let report = PlanReport { matched: 1, updated: 1, deciding: Some(waiting.into()), ..Default::default() };
        let st = plan_status(&[], &report, Some(1), false, now());
        let ready = cond(&st, READY).unwrap();
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "Stabilizing"));
        assert_eq!(ready.message, waiting);
        let reconciling = cond(&st, RECONCILING).unwrap();
        assert_eq!(reconciling.reason, "Stabilizing");
        assert!(reconciling.message.contains("short 2"), "{}", reconciling.message);
        // Waiting for nodes mid-change is a rollout in progress.
        let report = PlanReport {
            matched: 2,
            updated: 1,
            in_progress: 1,
            deciding: Some("deciding again once the 1 node(s) in flight are done".into()),
            ..Default::default()
        };
        let st = plan_status(&[], &report, Some(1), false, now());
        assert_eq!(cond(&st, READY).unwrap().reason, "RollingOut");
    }

    /// A decision that covers the demand is `DemandMet=True` only once its
    /// nodes hold it (the quotas read the fleet as it is); a paused, failed or running rollout
    /// says `NotYetApplied`.
    #[test]
    fn demand_is_met_only_once_the_decision_is_applied() {
        let demand = Some((true, "DemandMet", "covers nvidia.com/mig-1g.10gb 20".to_string()));
        let applied = PlanReport { matched: 2, updated: 2, demand: demand.clone(), ..Default::default() };
        let met = cond(&plan_status(&[], &applied, Some(1), false, now()), DEMAND_MET).unwrap().clone();
        assert_eq!((met.status.as_str(), met.reason.as_str()), ("True", "DemandMet"));
        for report in [
            PlanReport { matched: 2, updated: 1, in_progress: 1, demand: demand.clone(), ..Default::default() },
            PlanReport { matched: 2, updated: 1, pending: 1, demand: demand.clone(), ..Default::default() },
            PlanReport {
                matched: 2,
                updated: 1,
                failed: vec![("n".into(), "leak".into())],
                demand: demand.clone(),
                ..Default::default()
            },
        ] {
            let c = cond(&plan_status(&[], &report, Some(1), false, now()), DEMAND_MET).unwrap().clone();
            assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "NotYetApplied"), "{report:?}");
            assert!(c.message.contains("1 node(s) not done yet") && c.message.contains("covers"), "{}", c.message);
        }
    }

    #[test]
    fn last_transition_time_moves_only_when_the_status_changes() {
        let rolling = PlanReport { matched: 2, updated: 1, in_progress: 1, ..Default::default() };
        let first = plan_status(&[], &rolling, Some(1), false, now());
        let later = Time("2026-06-01T01:00:00Z".parse().unwrap());
        let again = plan_status(&first.conditions, &rolling, Some(1), false, later.clone());
        assert_eq!(cond(&again, READY).unwrap().last_transition_time, now());
        let done = PlanReport { matched: 2, updated: 2, ..Default::default() };
        let flipped = plan_status(&again.conditions, &done, Some(1), false, later.clone());
        assert_eq!(cond(&flipped, READY).unwrap().last_transition_time, later);
    }
}
