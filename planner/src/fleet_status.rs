//! The fleet at a glance, as `kubectl tessera status` shows it and the idle report reads it. Per node its rollout phase and per GPU the
//! slot diagram of its MIG instances (`[AABBCCC.]`), which of them pods hold, and the tenant of
//! each pod (its namespace's TenantGpuQuota).
//!
//! The API does not say which device the device plugin gave a pod, only how many of each resource
//! it holds on its node. So pods are matched to the node's instances of their resource, lowest GPU
//! index and slot first, and an instance whose holder could be another one is marked `exact:
//! false`. When every instance of a resource on a node is free, or all are held by one pod, the
//! attribution is exact. A pod holding a device through a ResourceClaim is exact: the claim's
//! allocation names the device (`claims`). So is a pod the node agent saw running on a device
//! (`named`).

mod claims;
mod held;
mod inputs;
mod named;
mod render;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube_core::ResourceExt;
use serde::Serialize;
use tessera_crds::conditions;
use tessera_crds::gpunode::{GpuIntent, GpuState};
use tessera_crds::{GpuNode, GpuPartitionPlan, TenantGpuQuota, catalog};

pub use claims::{SliceIndex, locate};
pub use held::gpu_resources;
use held::{extended_held, holds_devices};
pub use inputs::{Inputs, resource_name};

use crate::gpu_use::{AllocatedDevice, ClaimIndex, gpu_use};
pub use render::{clean, text};

const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Letters naming a GPU's instances in its slot diagram, by start slot.
const LETTERS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// The whole report.
#[derive(Debug, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FleetStatus {
    pub plans: Vec<PlanSummary>,
    pub nodes: Vec<NodeStatus>,
    /// Per tenant (quota name, or `""` for namespaces no quota claims): resource -> units held.
    pub tenants: BTreeMap<String, BTreeMap<String, i64>>,
    /// False when pods could not be read: then no instance is known to be free or busy.
    pub holders_known: bool,
    /// What could not be read (resource and the API's answer): the rest of the report stands.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<Unreadable>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Unreadable {
    pub resource: String,
    pub error: String,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PlanSummary {
    pub name: String,
    pub paused: bool,
    pub matched: i32,
    pub updated: i32,
    pub in_progress: i32,
    pub failed: i32,
    /// `Ready` condition status (`True`, `False`, `Unknown`), and its reason and message.
    pub ready: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// The rollout phase the operator wrote (`Idle`, `Draining`, ...), `-` before any plan.
    pub phase: String,
    /// The agent's `Ready` condition status, `Unknown` when it has not reported.
    pub ready: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    pub gpus: Vec<GpuStatus>,
    /// Pods holding more of a resource than the node reports (a stale report, or a resource the
    /// node's agent does not know): they are listed, not drawn.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unplaced: Vec<Held>,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuStatus {
    pub index: i32,
    /// Catalog name (`H100-80GB`) when known, else the driver's product name.
    pub product: String,
    /// `mig`, `whole` (MIG off) or `no-mig` (the board has no MIG).
    pub mode: String,
    /// Memory slots, one character each: the instance's letter or `.` when free. Empty unless
    /// MIG is on.
    pub slots: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<InstanceStatus>,
    /// For a whole GPU: the pod holding it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,
    /// For a whole GPU, whether the API pins its state down (see the module comment).
    pub exact: bool,
    /// Since when its holder has left it idle, past the tenant's `idleAfter` (see
    /// `kubectl tessera idle`); absent when busy, free or not measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_since: Option<k8s_openapi::jiff::Timestamp>,
    /// MIG mode changes at the next GPU reset.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub mig_pending: bool,
    /// The operator's intent for this GPU when it differs from what the GPU holds, e.g.
    /// `7x1g.10gb` or `whole`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    pub letter: char,
    pub profile: String,
    pub start: i32,
    pub size: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,
    /// Whether the API pins this instance's state down (see the module comment).
    pub exact: bool,
    /// Since when its holder has left it idle, past the tenant's `idleAfter` (see
    /// `kubectl tessera idle`); absent when busy, free or not measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_since: Option<k8s_openapi::jiff::Timestamp>,
}

/// A pod holding a device, and its tenant.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Holder {
    /// `namespace/name`.
    pub pod: String,
    /// The TenantGpuQuota claiming the pod's namespace, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The ResourceClaim through which the pod holds the device (DRA); absent for extended
    /// resources.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Held {
    pub holder: Holder,
    pub resource: String,
    pub count: i64,
}

/// The ResourceClaims and ResourceSlices read, for the devices pods hold through DRA.
#[derive(Debug, Default)]
pub struct DeviceIndex {
    pub claims: ClaimIndex,
    pub slices: SliceIndex,
}

/// Pure: the report from what was read, without claims (a pod naming one holds an unknown
/// device).
pub fn fleet_status(
    gpunodes: &[GpuNode],
    plans: &[GpuPartitionPlan],
    quotas: &[TenantGpuQuota],
    pods: &[Pod],
) -> FleetStatus {
    fleet_status_with(gpunodes, plans, quotas, pods, &DeviceIndex::default())
}

/// A device a pod holds through a claim, or `None` for a claim the index lacks.
type ClaimHolds = (Holder, Option<AllocatedDevice>);

/// Pure: the report from what was read, the devices held through claims included.
pub fn fleet_status_with(
    gpunodes: &[GpuNode],
    plans: &[GpuPartitionPlan],
    quotas: &[TenantGpuQuota],
    pods: &[Pod],
    dra: &DeviceIndex,
) -> FleetStatus {
    let tenant_of = tenants_of_namespaces(quotas);
    let mut pods_by_node: BTreeMap<&str, (Vec<PodHolds>, Vec<ClaimHolds>)> = BTreeMap::new();
    let mut tenants: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    for pod in pods.iter().filter(|p| holds_devices(p)) {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else { continue };
        let ns = pod.namespace().unwrap_or_default();
        let tenant = tenant_of.get(ns.as_str()).cloned();
        let holder = Holder { pod: format!("{ns}/{}", pod.name_any()), tenant: tenant.clone(), claim: None };
        let used = gpu_use(pod, &dra.claims);
        let claimed: Vec<ClaimHolds> = used
            .devices
            .into_iter()
            .map(|d| (Holder { claim: Some(d.claim.clone()), ..holder.clone() }, Some(d)))
            .chain(used.unknown_claims.into_iter().map(|c| (Holder { claim: Some(c), ..holder.clone() }, None)))
            .collect();
        let held = extended_held(pod);
        if held.is_empty() && claimed.is_empty() {
            continue;
        }
        let t = tenants.entry(tenant.clone().unwrap_or_default()).or_default();
        for (r, n) in &held {
            let e = t.entry(r.clone()).or_default();
            *e = e.saturating_add(*n);
        }
        let entry = pods_by_node.entry(node).or_default();
        if !held.is_empty() {
            entry.0.push((holder, held, pod.metadata.uid.clone()));
        }
        entry.1.extend(claimed);
    }
    let mut nodes: Vec<NodeStatus> = gpunodes
        .iter()
        .map(|gn| {
            let (pods, claimed) = pods_by_node.remove(gn.name_any().as_str()).unwrap_or_default();
            node_status(gn, pods, claimed, &dra.slices)
        })
        .collect();
    claims::count_for_tenants(&nodes, &mut tenants);
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let mut plans: Vec<PlanSummary> = plans.iter().map(plan_summary).collect();
    plans.sort_by(|a, b| a.name.cmp(&b.name));
    FleetStatus { plans, nodes, tenants, holders_known: true, unreadable: Vec::new() }
}

/// The tenant of each namespace a quota claims. Two quotas claiming one namespace (the quota
/// controller reports that conflict) are both named, `a|b (conflict)`, rather than one picked.
fn tenants_of_namespaces(quotas: &[TenantGpuQuota]) -> BTreeMap<&str, String> {
    let mut claims: BTreeMap<&str, std::collections::BTreeSet<&str>> = BTreeMap::new();
    for q in quotas {
        for ns in &q.spec.namespaces {
            claims.entry(ns.as_str()).or_default().insert(q.metadata.name.as_deref().unwrap_or(""));
        }
    }
    claims
        .into_iter()
        .map(|(ns, names)| {
            let label = if names.len() == 1 {
                names.into_iter().collect()
            } else {
                format!("{} (conflict)", names.into_iter().collect::<Vec<_>>().join("|"))
            };
            (ns, label)
        })
        .collect()
}

fn plan_summary(p: &GpuPartitionPlan) -> PlanSummary {
    let st = p.status.clone().unwrap_or_default();
    let ready = conditions::find(&st.conditions, conditions::READY);
    PlanSummary {
        name: p.name_any(),
        paused: p.spec.paused,
        matched: st.matched_nodes,
        updated: st.updated_nodes,
        in_progress: st.in_progress_nodes,
        failed: st.failed_nodes,
        ready: ready.map(|c| c.status.clone()).unwrap_or_else(|| "Unknown".into()),
        reason: ready.filter(|c| c.status != "True").map(|c| c.reason.clone()).unwrap_or_default(),
        message: ready.filter(|c| c.status != "True").map(|c| c.message.clone()).unwrap_or_default(),
    }
}

/// A pod, the units of each GPU resource it holds, and its UID.
type PodHolds = (Holder, BTreeMap<String, i64>, Option<String>);

/// A device a pod may hold: (GPU position in the node's list, instance position or `None` for
/// the whole GPU).
pub(crate) type Device = (usize, Option<usize>);

fn node_status(gn: &GpuNode, mut pods: Vec<PodHolds>, claimed: Vec<ClaimHolds>, slices: &SliceIndex) -> NodeStatus {
    let st = gn.status.clone().unwrap_or_default();
    let rollout = st.rollout.as_ref();
    let ready = conditions::find(&st.conditions, conditions::READY);
    let mut gpus: Vec<GpuState> = st.gpus.clone();
    gpus.sort_by_key(|g| g.index);
    let mut out: Vec<GpuStatus> = gpus.iter().map(|g| gpu_status(g, &gn.spec.gpus)).collect();
    // Devices named by claims first: exact, and no longer free for the guesses below.
    let (mut taken, mut unplaced) = claims::place(&mut out, &gpus, claimed, slices);
    // Then those the agent saw one pod's processes on: exact too.
    named::place(&mut out, &gpus, st.activity.as_ref(), &mut pods, &mut taken);

    // Devices per resource, in the order pods are given them.
    let mut devices: BTreeMap<String, Vec<Device>> = BTreeMap::new();
    for (gi, g) in gpus.iter().enumerate() {
        if g.mig_enabled {
            let mut order: Vec<usize> = (0..g.instances.len()).collect();
            order.sort_by_key(|&i| (g.instances[i].start, i));
            for i in order.into_iter().filter(|&i| !taken.contains(&(gi, Some(i)))) {
                devices.entry(catalog::mig_resource_name(&g.instances[i].profile)).or_default().push((gi, Some(i)));
            }
        } else if !taken.contains(&(gi, None)) {
            devices.entry(GPU_RESOURCE.into()).or_default().push((gi, None));
        }
    }
    pods.sort_by(|a, b| a.0.cmp(&b.0));
    for (resource, list) in &devices {
        let mut next = 0;
        let mut holders = Vec::new();
        for (holder, held, _) in &pods {
            let want = held.get(resource).copied().unwrap_or(0);
            let take = usize::try_from(want).unwrap_or(0).min(list.len() - next);
            for &(gi, inst) in &list[next..next + take] {
                set_holder(&mut out[gi], inst, holder.clone());
            }
            if take > 0 {
                holders.push(holder);
            }
            next += take;
            let short = want - i64::try_from(take).unwrap_or(want);
            if short > 0 {
                unplaced.push(Held { holder: holder.clone(), resource: resource.clone(), count: short });
            }
        }
        holders.dedup();
        let exact = next == 0 || (next == list.len() && holders.len() == 1);
        for &(gi, inst) in list {
            match inst {
                Some(i) => out[gi].instances[i].exact = exact,
                None => out[gi].exact = exact,
            }
        }
    }
    for (holder, held, _) in &pods {
        for (resource, n) in held.iter().filter(|(r, _)| !devices.contains_key(*r)) {
            unplaced.push(Held { holder: holder.clone(), resource: resource.clone(), count: *n });
        }
    }
    unplaced.sort_by(|a, b| (&a.holder, &a.resource).cmp(&(&b.holder, &b.resource)));
    NodeStatus {
        name: gn.name_any(),
        plan: gn.spec.plan.clone().or_else(|| rollout.and_then(|r| r.plan.clone())),
        phase: rollout.map(|r| format!("{:?}", r.phase)).unwrap_or_else(|| "-".into()),
        ready: ready.map(|c| c.status.clone()).unwrap_or_else(|| "Unknown".into()),
        message: rollout
            .map(|r| r.message.clone())
            .filter(|m| !m.is_empty())
            .or_else(|| ready.filter(|c| c.status != "True").map(|c| c.message.clone()))
            .unwrap_or_default(),
        gpus: out,
        unplaced,
    }
}

fn set_holder(g: &mut GpuStatus, instance: Option<usize>, holder: Holder) {
    match instance {
        Some(i) => g.instances[i].holder = Some(holder),
        None => g.holder = Some(holder),
    }
}

fn gpu_status(g: &GpuState, intents: &[GpuIntent]) -> GpuStatus {
    let product = catalog::lookup(&g.product).map(|m| m.name.to_string()).unwrap_or_else(|| g.product.clone());
    let mode = match (g.mig_capable || g.mig_enabled, g.mig_enabled) {
        (_, true) => "mig",
        (true, false) => "whole",
        (false, false) => "no-mig",
    };
    let mut instances: Vec<InstanceStatus> = g
        .instances
        .iter()
        .map(|i| InstanceStatus {
            letter: '?',
            profile: i.profile.clone(),
            start: i.start,
            size: i.size,
            holder: None,
            exact: true,
            idle_since: None,
        })
        .collect();
    let mut slots = String::new();
    if g.mig_enabled {
        let n = memory_slots(g);
        let mut axis = vec![b'.'; n];
        let mut by_start: Vec<usize> = (0..instances.len()).collect();
        by_start.sort_by_key(|&i| (instances[i].start, i));
        for (k, &i) in by_start.iter().enumerate() {
            let letter = LETTERS[k % LETTERS.len()];
            instances[i].letter = char::from(letter);
            let (start, size) = (instances[i].start.max(0) as usize, instances[i].size.max(0) as usize);
            for s in axis.iter_mut().skip(start).take(size) {
                *s = letter;
            }
        }
        slots = String::from_utf8(axis).unwrap_or_default();
    }
    let target = intents
        .iter()
        .find(|i| i.index == g.index)
        .and_then(|want| (!g.holds(want)).then(|| layout_label(want.mig_enabled, &want.profile_counts())));
    GpuStatus {
        index: g.index,
        product,
        mode: mode.into(),
        slots,
        instances,
        holder: None,
        exact: true,
        idle_since: None,
        mig_pending: g.mig_pending,
        target,
    }
}

/// `2x2g.20gb+1x3g.40gb`, or `whole`.
pub fn layout_label(mig: bool, profiles: &BTreeMap<String, i32>) -> String {
    if !mig {
        return "whole".into();
    }
    if profiles.is_empty() {
        return "MIG, no instances".into();
    }
    profiles.iter().map(|(p, n)| format!("{n}x{p}")).collect::<Vec<_>>().join("+")
}

/// Memory slots of a GPU: the catalog's, else the driver's profile table's, else what its
/// instances span (at most 16: a hostile report cannot blow the diagram up).
fn memory_slots(g: &GpuState) -> usize {
    if let Some(m) = catalog::lookup(&g.product) {
        return usize::from(m.memory_slots);
    }
    if catalog::valid_table(&g.profiles) {
        return usize::from(catalog::model_from_table(&g.product, &g.profiles).memory_slots);
    }
    let span = g.instances.iter().map(|i| i64::from(i.start.max(0)) + i64::from(i.size.max(0))).max().unwrap_or(8);
    span.clamp(1, 16) as usize
}
