//! Pure: a plan's status from the planner's report. kstatus reads `Stalled` as Failed,
//! `Reconciling` as InProgress and `Ready` as Current; Argo CD's health script reads the same.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use tessera_crds::GpuPartitionPlanStatus;
use tessera_crds::conditions::{CONFLICT, READY, RECONCILING, STALLED, remove_condition, set_condition};

use crate::rollout::PlanReport;

pub fn plan_status(
    previous: &[Condition],
    report: &PlanReport,
    generation: Option<i64>,
    paused: bool,
    now: Time,
) -> GpuPartitionPlanStatus {
    let mut c: Vec<Condition> = previous.to_vec();
    let g = generation;
    let t = || now.clone();
    let stalled: Option<(&str, String)> = if !report.conflicts.is_empty() {
        Some((
            "Conflict",
            format!(
                "another plan of equal priority matches node(s) {}; neither acts there",
                report.conflicts.join(", ")
            ),
        ))
    } else if !report.invalid.is_empty() {
        Some(("InvalidLayout", report.invalid.join("; ")))
    } else if !report.reset_required.is_empty() {
        Some((
            "ResetRequired",
            format!(
                "GPU reset or node reboot needed (nodes stay cordoned until then): {}",
                report.reset_required.join("; ")
            ),
        ))
    } else if !report.drain_timeouts.is_empty() {
        Some(("DrainTimeout", report.drain_timeouts.join("; ")))
    } else if !report.failed.is_empty() {
        let list: Vec<String> = report.failed.iter().map(|(n, m)| format!("{n}: {m}")).collect();
        Some(("NodeFailed", list.join("; ")))
    } else {
        None
    };
    if report.conflicts.is_empty() {
        remove_condition(&mut c, CONFLICT);
    } else {
        set_condition(
            &mut c,
            CONFLICT,
            true,
            "EqualPriority",
            format!("node(s) {} are also matched by another plan of the same priority", report.conflicts.join(", ")),
            g,
            t(),
        );
    }
    match &stalled {
        Some((reason, msg)) => set_condition(&mut c, STALLED, true, reason, msg.clone(), g, t()),
        None => remove_condition(&mut c, STALLED),
    }
    let remaining = report.in_progress + report.pending;
    if remaining > 0 {
        let mut msg = format!(
            "{} of {} node(s) updated; {} in progress, {} waiting",
            report.updated, report.matched, report.in_progress, report.pending
        );
        if paused {
            msg.push_str(" (paused: no new node starts)");
        }
        if !report.drain_blocked.is_empty() {
            msg.push_str(&format!("; {}", report.drain_blocked.join("; ")));
        }
        set_condition(&mut c, RECONCILING, true, if paused { "Paused" } else { "RollingOut" }, msg, g, t());
    } else {
        remove_condition(&mut c, RECONCILING);
    }
    let ready = stalled.is_none() && remaining == 0;
    let (reason, msg) = match (&stalled, ready) {
        (Some((reason, msg)), _) => (*reason, msg.clone()),
        (None, true) if report.matched == 0 => ("NoNodes", "no GPU node matches the plan".to_string()),
        (None, true) => ("Applied", format!("all {} matched node(s) have the plan's layout", report.matched)),
        (None, false) => ("RollingOut", format!("{} of {} node(s) updated", report.updated, report.matched)),
    };
    set_condition(&mut c, READY, ready, reason, msg, g, t());
    GpuPartitionPlanStatus {
        observed_generation: generation,
        conditions: c,
        matched_nodes: report.matched,
        updated_nodes: report.updated,
        in_progress_nodes: report.in_progress,
        failed_nodes: report.failed.len() as i32,
        skipped_nodes: report.skipped.clone(),
    }
}
