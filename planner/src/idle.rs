//! Allocated versus used, per tenant: the holders `kubectl tessera status` places on each device
//! (exact from claims, guessed for extended-resource pods) joined with the activity each node's
//! agent writes (`GpuNode.status.activity`). Pure; the quota controller, the metrics and
//! `kubectl tessera idle` all read this one join. Tessera reports idle slices; it evicts nothing.
//!
//! Decisions:
//! - A device is idle once the agent says it has been idle (`idleSince`) for at least the
//!   tenant's `idleAfter` (a notebook team and a batch team differ, so it is per quota).
//! - A held device the agent did not measure (old agent, stale report) is neither active nor
//!   idle: `unmeasured`, so a missing figure is never read as idleness.
//! - A node whose agent is not reporting (its heartbeat Lease ran out) has its summary set
//!   aside: its held devices count `unmeasured`, and the report says why (see [`stale`]).
//! - A device no pod holds is listed as leaked, unattributed, when it runs a compute process or
//!   holds more than [`LEAKED_MEMORY_MIB`]: once a pod ends, no API object says which pod held a
//!   device-plugin device, so naming a tenant would be a guess. An idle MIG instance shows tens
//!   of MiB on real hardware (driver context), which is no leak.
//! - A guessed holder still counts in its tenant's figures and is listed (`exact: false`), but
//!   fires the alert only when it is idle for certain: the guessed pod may not be the idle one.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube_core::ResourceExt;
use serde::Serialize;
use tessera_crds::activity::{ActivitySource, DeviceActivity};
use tessera_crds::quota::{AgentNotReporting, IdleSlice, MAX_IDLE_HOLDERS, TenantActivity, parse_idle_after};
use tessera_crds::{GpuNode, TenantGpuQuota};

use crate::fleet_status::{FleetStatus, Holder};

pub mod gate;
pub mod stale;
use stale::{NotReporting, SetAside};
use tessera_crds::activity::LEAK_THRESHOLD_MIB;

/// Memory on a free device above which it counts as leaked (with no compute process): the one
/// threshold the node agent also uses ([`LEAK_THRESHOLD_MIB`]); an idle MIG instance shows some
/// 10-30 MiB of driver memory.
pub const LEAKED_MEMORY_MIB: i64 = LEAK_THRESHOLD_MIB as i64;

/// The threshold when a quota sets none.
pub const DEFAULT_IDLE_AFTER: SignedDuration = SignedDuration::from_secs(3600);

/// vCluster's annotations on a pod it synced to the host: the pod's name and namespace inside
/// the virtual cluster.
pub const VCLUSTER_NAME: &str = "vcluster.loft.sh/object-name";
pub const VCLUSTER_NAMESPACE: &str = "vcluster.loft.sh/object-namespace";

/// Per tenant (quota name, `""` for namespaces no quota claims).
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TenantUse {
    /// Devices (MIG instances or whole GPUs) its pods hold.
    pub allocated: i64,
    /// Held devices measured busy, or idle for less than the threshold.
    pub active: i64,
    /// Held devices idle for at least the threshold.
    pub idle: i64,
    /// Held devices the agent reported no figure for.
    pub unmeasured: i64,
    /// Nodes holding its devices whose agents are not reporting (see [`stale`]).
    #[serde(skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub not_reporting: std::collections::BTreeSet<String>,
}

/// A held device idle beyond its tenant's threshold.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct IdleHolder {
    /// `namespace/name` on the host cluster.
    pub pod: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// `namespace/name` inside a vCluster, when the pod was synced from one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub virtual_pod: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    pub node: String,
    pub gpu: i32,
    /// The MIG profile, or `whole`.
    pub profile: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<i32>,
    pub memory_used_mib: i64,
    pub idle_since: Timestamp,
    /// False when the holder is the status placement's guess (extended resources of one
    /// profile shared by several pods on a node).
    pub exact: bool,
    /// Since when the pod is idle for sure: `idle_since` for an exact holder; for a guessed one
    /// whose every possible device is idle (see `certain`), the latest `idleSince` among them (or its
    /// start); absent for a guess alone. Only these fire `TesseraSlicesIdle`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub certain_since: Option<Timestamp>,
}

/// Memory in use on a device no pod holds.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Leaked {
    pub node: String,
    pub gpu: i32,
    pub profile: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<i32>,
    pub memory_used_mib: i64,
    pub processes: i32,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct IdleReport {
    pub tenants: BTreeMap<String, TenantUse>,
    pub idle: Vec<IdleHolder>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub leaked: Vec<Leaked>,
    /// Nodes whose agents are not reporting: their figures were not read.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_reporting: Vec<SetAside>,
}

/// Marks the devices of `report`'s idle holders on `status` (the placement it was computed
/// from), for `kubectl tessera status`.
pub fn mark_idle(status: &mut FleetStatus, report: &IdleReport) {
    for h in &report.idle {
        let Some(node) = status.nodes.iter_mut().find(|n| n.name == h.node) else { continue };
        let Some(g) = node.gpus.iter_mut().find(|g| g.index == h.gpu) else { continue };
        match h.start {
            Some(start) => {
                if let Some(i) = g.instances.iter_mut().find(|i| i.start == start) {
                    i.idle_since = Some(h.idle_since);
                }
            }
            None => g.idle_since = Some(h.idle_since),
        }
    }
}

/// Each quota's `idleAfter`. A value that does not parse (the quota controller reports it on
/// the quota's `Ready` condition) falls back to the default rather than hiding the tenant.
pub fn idle_thresholds(quotas: &[TenantGpuQuota]) -> BTreeMap<String, SignedDuration> {
    quotas
        .iter()
        .filter_map(|q| {
            let secs = parse_idle_after(q.spec.idle_after.as_deref()?).ok()?;
            Some((q.name_any(), SignedDuration::from_secs(i64::try_from(secs).ok()?)))
        })
        .collect()
}

/// `1h30m` for 5400 s: a threshold as `spec.idleAfter` spells it.
pub fn format_duration(d: SignedDuration) -> String {
    let s = d.as_secs().max(0);
    let mut out = String::new();
    for (unit, n) in [("d", s / 86400), ("h", s % 86400 / 3600), ("m", s % 3600 / 60), ("s", s % 60)] {
        if n > 0 {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    if out.is_empty() { "0s".into() } else { out }
}

/// A tenant's figures for its quota's status: the counts and its oldest idle holders.
pub fn tenant_activity(report: &IdleReport, tenant: &str, threshold: SignedDuration) -> TenantActivity {
    let u = report.tenants.get(tenant).cloned().unwrap_or_default();
    let idle_holders = report
        .idle
        .iter()
        .filter(|h| h.tenant.as_deref() == Some(tenant))
        .take(MAX_IDLE_HOLDERS)
        .map(|h| IdleSlice {
            pod: h.pod.clone(),
            node: h.node.clone(),
            gpu: h.gpu,
            profile: h.profile.clone(),
            start: h.start,
            memory_used_mib: h.memory_used_mib,
            idle_since: Time(h.idle_since),
            exact: h.exact,
        })
        .collect();
    let not_reporting = report
        .not_reporting
        .iter()
        .filter(|s| u.not_reporting.contains(&s.node))
        .take(MAX_IDLE_HOLDERS)
        .map(|s| AgentNotReporting { node: s.node.clone(), since: s.since.map(Time) })
        .collect();
    TenantActivity {
        idle_after: format_duration(threshold),
        allocated: u.allocated,
        active: u.active,
        idle: u.idle,
        unmeasured: u.unmeasured,
        idle_holders,
        not_reporting,
    }
}

/// The quota controller's idle figures for one pass (see [`gate`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Computed now, or within the refresh interval.
    Report(IdleReport),
    /// Not computed (pods not listed, no verdicts yet): the figures stay as old as they are.
    Keep,
    /// Nothing to report on (no node measures): the figures go.
    Clear,
}

/// A quota's `status.activity` for this pass: from the report when there is one, the figures it
/// had when the pass keeps them (a failed read neither drops nor zeroes them), none when cleared.
pub fn status_activity(
    outcome: &Outcome,
    previous: Option<&TenantActivity>,
    tenant: &str,
    thresholds: &BTreeMap<String, SignedDuration>,
) -> Option<TenantActivity> {
    match outcome {
        Outcome::Report(r) => {
            Some(tenant_activity(r, tenant, thresholds.get(tenant).copied().unwrap_or(DEFAULT_IDLE_AFTER)))
        }
        Outcome::Keep => previous.cloned(),
        Outcome::Clear => None,
    }
}

/// One device as the placement drew it.
struct Placed<'a> {
    gpu: i32,
    profile: String,
    start: Option<i32>,
    holder: Option<&'a Holder>,
    exact: bool,
    /// The MIG instance's UUID as the GpuNode reports it, when it does.
    uuid: Option<&'a str>,
}

/// Pure: the report at `now`. `status` is `fleet_status_with`'s placement over the same
/// `gpunodes`; `idle_after` maps tenants to thresholds (others get `DEFAULT_IDLE_AFTER`);
/// `not_reporting` names the nodes whose agents' summaries are not to be read.
pub fn idle_report(
    status: &FleetStatus,
    gpunodes: &[GpuNode],
    pods: &[Pod],
    idle_after: &BTreeMap<String, SignedDuration>,
    not_reporting: &NotReporting,
    now: Timestamp,
) -> IdleReport {
    let pass = Pass::of(pods, idle_after, now);
    let mut report = IdleReport::default();
    for node in &status.nodes {
        add_node(&pass, node, gpunodes, not_reporting, &mut report);
    }
    report.idle.sort_by(|a, b| (a.idle_since, &a.pod, &a.node, a.gpu).cmp(&(b.idle_since, &b.pod, &b.node, b.gpu)));
    report
}

/// What every node of a report reads: the pods' virtual names and start times, the thresholds
/// and the time.
struct Pass<'a> {
    /// Host `namespace/name` -> `namespace/name` inside the vCluster that synced the pod.
    virtual_of: BTreeMap<String, String>,
    /// Host `namespace/name` -> when the pod started.
    started: BTreeMap<String, Timestamp>,
    idle_after: &'a BTreeMap<String, SignedDuration>,
    now: Timestamp,
}

impl<'a> Pass<'a> {
    /// Indexes `pods` by their host `namespace/name`.
    fn of(pods: &[Pod], idle_after: &'a BTreeMap<String, SignedDuration>, now: Timestamp) -> Self {
        let virtual_of = pods.iter().filter_map(|p| Some((host_key(p), virtual_name(p)?))).collect();
        // A pod idles no longer than it has run: a device idle since before its holder started (a
        // notebook handed a slice that sat free) counts from the pod's start.
        let started =
            pods.iter().filter_map(|p| Some((host_key(p), p.status.as_ref()?.start_time.as_ref()?.0))).collect();
        Pass { virtual_of, started, idle_after, now }
    }

    /// When `pod` counts as idle from: `since`, or its start when that is later.
    fn idle_from(&self, pod: &str, since: Timestamp) -> Timestamp {
        self.started.get(pod).map_or(since, |p| since.max(*p))
    }
}

/// One node as its held devices are counted: its name, whether its agent is not reporting, and
/// per profile since when every device a guessed holder may hold is idle.
struct NodeFigures<'a> {
    name: &'a str,
    stale: bool,
    sure: BTreeMap<String, Timestamp>,
}

/// Adds one node's devices to `report`: free devices that leak, held devices per tenant, and the
/// node set aside when its agent is not reporting.
fn add_node(
    pass: &Pass<'_>,
    node: &crate::fleet_status::NodeStatus,
    gpunodes: &[GpuNode],
    not_reporting: &NotReporting,
    report: &mut IdleReport,
) {
    let reported = gpunodes.iter().find(|g| g.name_any() == node.name).and_then(|g| g.status.as_ref());
    let activity = reported.and_then(|s| s.activity.as_ref());
    let stale = not_reporting.get(&node.name);
    // A dead agent's last summary says nothing of now: none of it is read.
    let devices = activity.filter(|_| stale.is_none()).map(|a| a.devices.as_slice()).unwrap_or_default();
    let mut held = 0;
    let placed = placed(node, reported.map(|s| s.gpus.as_slice()).unwrap_or_default());
    let sure = certain::idle_groups(&placed, devices);
    let figures = NodeFigures { name: &node.name, stale: stale.is_some(), sure };
    for p in placed {
        let measured = devices.iter().find(|d| matches(d, &p));
        match p.holder {
            None => note_leak(&node.name, p, measured, report),
            Some(h) => {
                held += 1;
                count_held(pass, &figures, p, h, measured, report);
            }
        }
    }
    if let Some(s) = stale.filter(|_| activity.is_some() || held > 0) {
        report.not_reporting.push(SetAside { node: node.name.clone(), since: s.since, cause: s.cause, held });
    }
}

/// Lists a device no pod holds as leaked when it runs a compute process or holds more memory
/// than an idle instance does.
fn note_leak(node: &str, p: Placed<'_>, measured: Option<&DeviceActivity>, report: &mut IdleReport) {
    if let Some(d) = measured.filter(|d| d.processes > 0 || d.memory_used_mib > LEAKED_MEMORY_MIB) {
        report.leaked.push(Leaked {
            node: node.to_string(),
            gpu: p.gpu,
            profile: p.profile,
            start: p.start,
            memory_used_mib: d.memory_used_mib,
            processes: d.processes,
        });
    }
}

/// Counts a held device for its tenant (allocated, then unmeasured, active or idle), and lists
/// its holder when the device is idle beyond the tenant's threshold.
fn count_held(
    pass: &Pass<'_>,
    node: &NodeFigures<'_>,
    p: Placed<'_>,
    h: &Holder,
    measured: Option<&DeviceActivity>,
    report: &mut IdleReport,
) {
    let tenant = h.tenant.clone().unwrap_or_default();
    let threshold = pass.idle_after.get(&tenant).copied().unwrap_or(DEFAULT_IDLE_AFTER);
    let t = report.tenants.entry(tenant).or_default();
    t.allocated += 1;
    if node.stale {
        t.not_reporting.insert(node.name.to_string());
    }
    // GPM with neither a share nor an idle time: no second sample yet (an agent just
    // started), or its calls fail: not measured, never "active".
    let unmeasured_gpm = |d: &&DeviceActivity| {
        d.source == ActivitySource::Gpm && d.idle_since.is_none() && d.active_percent_1h.is_none()
    };
    let Some(d) = measured.filter(|d| !unmeasured_gpm(d)) else {
        t.unmeasured += 1;
        return;
    };
    let since = d.idle_since.as_ref().map(|s| pass.idle_from(&h.pod, s.0));
    match since.filter(|s| pass.now.duration_since(*s) >= threshold) {
        None => t.active += 1,
        Some(since) => {
            t.idle += 1;
            // A guessed holder whose whole group is idle has idled since the group's
            // latest idle start at least, whichever device it holds.
            let certain_since =
                if p.exact { Some(since) } else { node.sure.get(&p.profile).map(|s| pass.idle_from(&h.pod, *s)) };
            report.idle.push(IdleHolder {
                pod: h.pod.clone(),
                tenant: h.tenant.clone(),
                virtual_pod: pass.virtual_of.get(&h.pod).cloned(),
                claim: h.claim.clone(),
                node: node.name.to_string(),
                gpu: p.gpu,
                profile: p.profile,
                start: p.start,
                memory_used_mib: d.memory_used_mib,
                idle_since: since,
                exact: p.exact,
                certain_since,
            });
        }
    }
}

/// Every device of a node's report: the MIG instances of MIG GPUs, else the whole GPU; `gpus`
/// (the GpuNode's) gives the instances' UUIDs.
fn placed<'a>(
    node: &'a crate::fleet_status::NodeStatus,
    gpus: &'a [tessera_crds::gpunode::GpuState],
) -> Vec<Placed<'a>> {
    let mut out = Vec::new();
    for g in &node.gpus {
        if g.mode == "mig" {
            for i in &g.instances {
                let uuid = gpus
                    .iter()
                    .find(|s| s.index == g.index)
                    .and_then(|s| s.instances.iter().find(|r| r.start == i.start))
                    .and_then(|r| r.uuid.as_deref());
                out.push(Placed {
                    uuid,
                    gpu: g.index,
                    profile: i.profile.clone(),
                    start: Some(i.start),
                    holder: i.holder.as_ref(),
                    exact: i.exact,
                });
            }
        } else {
            out.push(Placed {
                gpu: g.index,
                profile: "whole".into(),
                start: None,
                holder: g.holder.as_ref(),
                exact: g.exact,
                uuid: None,
            });
        }
    }
    out
}

/// The agent's figure for a device: same GPU and, for a MIG instance, same start slot (a start
/// is unique on a GPU) and same profile. A MIG figure never matches a whole GPU and back, and an
/// instance re-made at the same start with another profile does not take the old one's figure,
/// so a layout change the agent has not measured yet reads as unmeasured. Where both sides name
/// the instance's UUID they must agree: an instance destroyed and made again alike is new, and
/// does not inherit its predecessor's `idleSince` (as `status` names holders, `named.rs`).
fn matches(d: &DeviceActivity, p: &Placed) -> bool {
    let profile = |s: &str| tessera_crds::catalog::normalize_profile(s);
    d.gpu_index == p.gpu
        && d.start == p.start
        && (d.uuid.is_none() || p.uuid.is_none() || d.uuid.as_deref() == p.uuid)
        && match (&d.profile, p.start) {
            (Some(dp), Some(_)) => profile(dp) == profile(&p.profile),
            (None, None) => true,
            _ => false,
        }
}

fn host_key(p: &Pod) -> String {
    format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any())
}

/// `namespace/name` inside the vCluster that synced `p`, when both annotations are there.
pub fn virtual_name(p: &Pod) -> Option<String> {
    let a = p.metadata.annotations.as_ref()?;
    let (name, ns) = (a.get(VCLUSTER_NAME)?, a.get(VCLUSTER_NAMESPACE)?);
    (!name.is_empty() && !ns.is_empty()).then(|| format!("{ns}/{name}"))
}

mod certain;
#[cfg(test)]
mod tests;
