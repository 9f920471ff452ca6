//! `kubectl tessera idle`: the devices pods hold that sit idle beyond their tenant's `idleAfter`,
//! across the fleet, from the same reads as `status` (the cluster, or `--from` files) and the
//! same join as the operator's quota status (`tessera_planner::idle`). It reports; it evicts nothing.

use std::io::Write as _;

use clap::ValueEnum;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use super::Output;
use super::connect::ClusterArgs;
use super::status::load;
use crate::Error;
use tessera_planner::dra::GpuDrivers;
use tessera_planner::fleet_status::{Inputs, clean};
use tessera_planner::idle::{IdleHolder, IdleReport, idle_report, idle_thresholds};

/// The order idle holders are listed in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum SortBy {
    /// Longest idle first.
    #[default]
    IdleSince,
    /// Most memory held first.
    Memory,
    /// By tenant, then longest idle first.
    Tenant,
}

/// `-o json`: the report and what could not be read.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Json<'a> {
    #[serde(flatten)]
    report: &'a IdleReport,
    /// False when pods or claims could not be read: no idle holder and no leak is known.
    holders_known: bool,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    unreadable: &'a [tessera_planner::fleet_status::Unreadable],
}

/// `-o json`'s body.
pub fn json_body(r: &IdleReport, inputs: &Inputs) -> String {
    let holders_known = inputs.report().holders_known;
    let body = Json { report: r, holders_known, unreadable: &inputs.unreadable };
    format!("{}\n", serde_json::to_string_pretty(&body).unwrap_or_default())
}

/// Pure: the report from what was read, its idle holders in `sort` order. Ties keep the
/// longest-idle first, then pod and device, so the order is stable. Without pods or claims
/// every device looks free: no memory is called leaked then (unknown, not "no pod holds it").
pub fn report(inputs: &Inputs, now: Timestamp, sort: SortBy) -> IdleReport {
    let status = inputs.report();
    let thresholds = idle_thresholds(&inputs.quotas);
    let mut r = idle_report(
        &status,
        &inputs.gpunodes,
        &inputs.pods,
        &thresholds,
        &super::status::not_reporting(inputs, now),
        now,
    );
    if !status.holders_known {
        r.leaked.clear();
    }
    sort_holders(&mut r.idle, sort);
    r
}

pub fn sort_holders(holders: &mut [IdleHolder], sort: SortBy) {
    let base = |h: &IdleHolder| (h.idle_since, h.pod.clone(), h.node.clone(), h.gpu, h.start);
    match sort {
        SortBy::IdleSince => holders.sort_by_key(base),
        SortBy::Memory => holders.sort_by_key(|h| (std::cmp::Reverse(h.memory_used_mib), base(h))),
        SortBy::Tenant => holders.sort_by_key(|h| (h.tenant.clone().unwrap_or_default(), base(h))),
    }
}

/// `2d3h`, `45m`: how long, coarse enough to read at a glance.
fn age(since: Timestamp, now: Timestamp) -> String {
    let s = now.duration_since(since).as_secs().max(0);
    match s {
        s if s >= 86400 => format!("{}d{}h", s / 86400, s % 86400 / 3600),
        s if s >= 3600 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        s => format!("{}m", s / 60),
    }
}

/// The text table: one line per idle holder (`~` before a guessed pod), then leaked memory.
/// `holders_known` false (pods or claims unreadable): no holder is known, so none is idle and
/// no device is known to be free (no leak listed).
pub fn text(r: &IdleReport, now: Timestamp, holders_known: bool) -> String {
    let mut rows =
        vec![["TENANT", "POD", "NODE", "GPU", "SLICE", "MEMORY", "IDLE FOR", "IDLE SINCE"].map(String::from)];
    for h in &r.idle {
        let mut pod = format!("{}{}", if h.exact { "" } else { "~" }, h.pod);
        if let Some(v) = &h.virtual_pod {
            pod.push_str(&format!(" (vcluster {v})"));
        }
        let slice = match h.start {
            Some(s) => format!("{}@{s}", h.profile),
            None => h.profile.clone(),
        };
        rows.push([
            clean(h.tenant.as_deref().unwrap_or("-")).into_owned(),
            clean(&pod).into_owned(),
            clean(&h.node).into_owned(),
            h.gpu.to_string(),
            clean(&slice).into_owned(),
            format!("{} MiB", h.memory_used_mib),
            age(h.idle_since, now),
            h.idle_since.to_string(),
        ]);
    }
    let mut out = String::new();
    if !holders_known {
        out.push_str("(idle slices and leaked memory unknown: pods or resource claims unreadable)\n");
    } else if r.idle.is_empty() {
        out.push_str("No idle slices.\n");
    } else {
        let widths: Vec<usize> = (0..8).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
        for row in &rows {
            let cells: Vec<String> = row.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
            out.push_str(cells.join("  ").trim_end());
            out.push('\n');
        }
        if r.idle.iter().any(|h| !h.exact) {
            out.push_str(
                "~ guessed holder: several pods hold this profile on the node (see `kubectl tessera status`)\n",
            );
        }
    }
    for l in r.leaked.iter().filter(|_| holders_known) {
        let slice = l.start.map(|s| format!("{}@{s}", l.profile)).unwrap_or_else(|| l.profile.clone());
        out.push_str(&format!(
            "leaked: {} GPU {} {}: {} MiB, {} process(es), no pod holds it\n",
            clean(&l.node),
            l.gpu,
            clean(&slice),
            l.memory_used_mib,
            l.processes
        ));
    }
    for s in &r.not_reporting {
        out.push_str(&format!(
            "not measured: {}: {}; its {} held device(s) count as unmeasured\n",
            clean(&s.node),
            s.reason(),
            s.held
        ));
    }
    out
}

/// Prints the idle holders; exit 0, or 1 when part of the fleet could not be read.
pub async fn run(
    cluster: &ClusterArgs,
    from: &[String],
    drivers: &GpuDrivers,
    output: Output,
    sort: SortBy,
) -> Result<i32, Error> {
    let inputs = load(cluster, from, drivers).await?;
    let now = Timestamp::now();
    let r = report(&inputs, now, sort);
    let body = match output {
        Output::Json => json_body(&r, &inputs),
        Output::Text => text(&r, now, inputs.report().holders_known),
    };
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_all(body.as_bytes()).and_then(|()| stdout.flush())
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        return Err(Error::ReadFile { path: "(writing stdout)".into(), source: e });
    }
    for u in &inputs.unreadable {
        let _ = writeln!(std::io::stderr(), "error: cannot read {}: {}", u.resource, clean(&u.error));
    }
    if let Some(e) = &inputs.leases_unread {
        let _ = writeln!(
            std::io::stderr(),
            "note: cannot read the agents' heartbeat leases ({}), so figures of agents that stopped are shown as they last wrote them: {}",
            tessera_crds::gpunode::AGENT_LEASE_NAMESPACE,
            clean(e)
        );
    }
    Ok(if inputs.unreadable.is_empty() { 0 } else { 1 })
}

#[cfg(test)]
mod tests;
