//! What the GPU DRA drivers publish per node (ResourceSlices), held against the node agent's
//! report: the MIG supply the slices add (never a device twice), where the two disagree (a driver
//! that has not re-enumerated after a layout change), and whether a node runs NVIDIA's DynamicMIG
//! (the driver carves MIG devices per claim itself: Tessera must not touch that node). Pure.
//!
//! The device plugin and a DRA driver on one node serve the same physical MIG devices. The
//! agent's report (NVML) is the node's truth: a slice device on a GPU the agent reports is the
//! agent's device (counted once, by the agent) or a stale one (counted never, reported). Slice
//! devices count as supply only on GPUs no agent reports (a node without a Tessera agent).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use tessera_crds::catalog;
use tessera_crds::conditions::gpunode_reasons;
use tessera_crds::gpunode::{GpuNodeStatus, GpuState, MigInstance};

use crate::dra::GpuDrivers;

/// GpuNode condition: whether the node's GPU DRA driver publishes what the agent reports.
pub const DRA_IN_SYNC: &str = "DraInSync";

/// One pool of one GPU driver on a node: the slices of its newest generation.
#[derive(Debug, Clone)]
pub struct Pool<'a> {
    pub driver: &'a str,
    pub name: &'a str,
    pub generation: i64,
    /// `resourceSliceCount` of the newest generation: how many slices make the pool.
    pub expected: i64,
    pub slices: Vec<&'a ResourceSlice>,
}

impl Pool<'_> {
    /// All the slices of the newest generation are present (the scheduler uses no other pool;
    /// half a pool says nothing about the devices in the other half).
    pub fn complete(&self) -> bool {
        let names: BTreeSet<&str> = self.slices.iter().filter_map(|s| s.metadata.name.as_deref()).collect();
        self.expected > 0 && names.len() as i64 >= self.expected
    }
}

/// The GPU drivers' pools of one node.
#[derive(Debug, Clone, Default)]
pub struct NodeSlices<'a> {
    pub pools: Vec<Pool<'a>>,
}

/// The GPU drivers' slices per node (slices of other drivers, and slices for no one node, left
/// out), each pool reduced to its newest generation.
pub fn by_node<'a>(
    slices: impl IntoIterator<Item = &'a ResourceSlice>,
    drivers: &GpuDrivers,
) -> BTreeMap<&'a str, NodeSlices<'a>> {
    let mut pools: BTreeMap<(&str, &str, &str), Pool<'a>> = BTreeMap::new();
    for s in slices {
        let spec = &s.spec;
        let Some(node) = spec.node_name.as_deref().filter(|n| !n.is_empty()) else { continue };
        if !drivers.contains(&spec.driver) {
            continue;
        }
        let key = (node, spec.driver.as_str(), spec.pool.name.as_str());
        let pool = pools.entry(key).or_insert_with(|| Pool {
            driver: &spec.driver,
            name: &spec.pool.name,
            generation: spec.pool.generation,
            expected: spec.pool.resource_slice_count,
            slices: Vec::new(),
        });
        if spec.pool.generation > pool.generation {
            pool.generation = spec.pool.generation;
            pool.expected = spec.pool.resource_slice_count;
            pool.slices.clear();
        }
        if spec.pool.generation == pool.generation {
            pool.slices.push(s);
        }
    }
    let mut out: BTreeMap<&str, NodeSlices<'a>> = BTreeMap::new();
    for ((node, _, _), pool) in pools {
        out.entry(node).or_default().pools.push(pool);
    }
    out
}

/// A device of a GPU driver, as far as Tessera reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SliceDevice {
    /// A whole GPU (`type: gpu`).
    Gpu { name: String, uuid: Option<String> },
    /// A MIG device (`type: mig`); placement `(start, size)` from NVIDIA's device name
    /// `gpu-<minor>-mig-<profile id>-<start>-<size>`.
    Mig {
        name: String,
        uuid: Option<String>,
        parent_uuid: Option<String>,
        profile: String,
        placement: Option<(i32, i32)>,
    },
}

impl SliceDevice {
    pub fn name(&self) -> &str {
        match self {
            SliceDevice::Gpu { name, .. } | SliceDevice::Mig { name, .. } => name,
        }
    }

    /// The GPU it is or lies on, by UUID.
    fn gpu_uuid(&self) -> Option<&str> {
        match self {
            SliceDevice::Gpu { uuid, .. } => uuid.as_deref(),
            SliceDevice::Mig { parent_uuid, .. } => parent_uuid.as_deref(),
        }
    }

    /// What identifies the physical device across drivers: its UUID, else its GPU and placement.
    fn identity(&self) -> String {
        match self {
            SliceDevice::Gpu { uuid: Some(u), .. } | SliceDevice::Mig { uuid: Some(u), .. } => u.clone(),
            SliceDevice::Mig { parent_uuid: Some(p), placement: Some((s, n)), .. } => format!("{p}/{s}+{n}"),
            other => format!("name:{}", other.name()),
        }
    }
}

/// A string attribute, unqualified or qualified by the driver's domain.
fn attribute<'d>(d: &'d Device, driver: &str, key: &str) -> Option<&'d str> {
    let attrs = d.attributes.as_ref()?;
    attrs.get(key).or_else(|| attrs.get(&format!("{driver}/{key}")))?.string.as_deref().filter(|s| !s.is_empty())
}

/// `(start, size)` from `gpu-<minor>-mig-<profile id>-<start>-<size>`.
fn placement(name: &str) -> Option<(i32, i32)> {
    let (_, tail) = name.split_once("-mig-")?;
    let parts: Vec<&str> = tail.split('-').collect();
    match parts.as_slice() {
        [_, start, size] => Some((start.parse().ok()?, size.parse().ok()?)),
        _ => None,
    }
}

/// The device as Tessera reads it; `None` for devices that are neither a GPU nor a MIG device.
pub fn read_device(d: &Device, driver: &str) -> Option<SliceDevice> {
    let uuid = attribute(d, driver, "uuid").map(str::to_string);
    match attribute(d, driver, "type")? {
        "gpu" => Some(SliceDevice::Gpu { name: d.name.clone(), uuid }),
        "mig" => Some(SliceDevice::Mig {
            name: d.name.clone(),
            uuid,
            parent_uuid: attribute(d, driver, "parentUUID").map(str::to_string),
            profile: attribute(d, driver, "profile")?.to_string(),
            placement: placement(&d.name),
        }),
        _ => None,
    }
}

impl<'a> NodeSlices<'a> {
    /// The devices of the complete pools, each physical device once.
    pub fn devices(&self) -> Vec<SliceDevice> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for pool in self.pools.iter().filter(|p| p.complete()) {
            for d in pool.slices.iter().flat_map(|s| s.spec.devices.iter().flatten()) {
                if let Some(dev) = read_device(d, pool.driver)
                    && seen.insert(dev.identity())
                {
                    out.push(dev);
                }
            }
        }
        out
    }

    /// Every pool complete (and at least one): the slices say all the driver publishes.
    pub fn all_complete(&self) -> bool {
        !self.pools.is_empty() && self.pools.iter().all(Pool::complete)
    }
}

/// The GPUs the node's slices show beyond the agent's report, as GPU states (MIG devices as
/// instances): the devices of complete pools on GPUs the agent does not report (all of them on a
/// node without a report). Not MIG capable as far as Tessera knows, so the solver only counts
/// them (`automatic_layouts::unseen_supply`) and never plans for them.
pub fn extra_gpus(status: Option<&GpuNodeStatus>, node: &NodeSlices<'_>) -> Vec<GpuState> {
    let reported: BTreeSet<&str> =
        status.iter().flat_map(|s| s.gpus.iter()).map(|g| g.uuid.as_str()).filter(|u| !u.is_empty()).collect();
    let agent_reports = status.is_some_and(|s| !s.gpus.is_empty());
    let mut gpus: BTreeMap<String, GpuState> = BTreeMap::new();
    for d in node.devices() {
        // On a reported node a device must be shown to lie on a GPU the agent does not report.
        let elsewhere = match d.gpu_uuid() {
            Some(u) => !reported.contains(u),
            None => !agent_reports,
        };
        if !elsewhere {
            continue;
        }
        // Its GPU: by UUID, else by NVIDIA's name prefix `gpu-<minor>`.
        let key =
            d.gpu_uuid().map_or_else(|| d.name().split("-mig-").next().unwrap_or_default().to_string(), str::to_string);
        let g = gpus.entry(key.clone()).or_insert_with(|| GpuState { index: -1, uuid: key, ..Default::default() });
        if let SliceDevice::Mig { uuid, profile, placement, .. } = &d {
            g.mig_enabled = true;
            let (start, size) = placement.unwrap_or((-1, 0));
            g.instances.push(MigInstance {
                profile: profile.clone(),
                start,
                size,
                uuid: uuid.clone(),
                ..Default::default()
            });
        }
    }
    gpus.into_values().collect()
}

/// What the node's slices supply beyond the agent's report, per resource name ([`extra_gpus`]).
pub fn extra_supply(status: Option<&GpuNodeStatus>, node: &NodeSlices<'_>) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for g in extra_gpus(status, node) {
        crate::supply::gpu_supply(&g, &mut out);
    }
    out
}

/// Prefix of the name of a [`supply_nodes`] stand-in: no Node is named so.
pub const DRA_SUPPLY_PREFIX: &str = "dra-slices:";

/// Stand-in GpuNodes carrying what the GPU DRA drivers supply beyond the agents' reports, one per
/// node that has any: counted with the real ones wherever the fleet's supply is (the quota
/// controller's `CapacityAvailable`, automatic plans), so the two agree and no device counts
/// twice. Named [`DRA_SUPPLY_PREFIX`]`<node>`: no plan selects or owns them.
pub fn supply_nodes<'a>(
    nodes: &BTreeMap<&'a str, NodeSlices<'a>>,
    status_of: impl Fn(&str) -> Option<std::sync::Arc<tessera_crds::GpuNode>>,
) -> Vec<tessera_crds::GpuNode> {
    let mut out = Vec::new();
    for (name, slices) in nodes {
        let gn = status_of(name);
        let gpus = extra_gpus(gn.as_ref().and_then(|g| g.status.as_ref()), slices);
        if gpus.is_empty() {
            continue;
        }
        let mut stand_in = tessera_crds::GpuNode::new(&format!("{DRA_SUPPLY_PREFIX}{name}"), Default::default());
        stand_in.status = Some(GpuNodeStatus { gpus, ..Default::default() });
        out.push(stand_in);
    }
    out
}

/// Where the slices and the agent disagree (device names of the slices; the agent's devices as
/// `gpu <index> <profile> at <start>`). Empty unless every pool of the node is complete.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Disagreement {
    /// Listed by the slices, not found on the GPU by the agent.
    pub stale: Vec<String>,
    /// Found by the agent, not listed by the slices.
    pub missing: Vec<String>,
}

impl Disagreement {
    pub fn is_empty(&self) -> bool {
        self.stale.is_empty() && self.missing.is_empty()
    }

    /// For the GpuNode condition and the plan's status.
    pub fn message(&self) -> String {
        let mut parts = Vec::new();
        if !self.stale.is_empty() {
            parts.push(format!("the DRA driver lists devices the GPUs no longer hold: {}", self.stale.join(", ")));
        }
        if !self.missing.is_empty() {
            parts.push(format!("the DRA driver does not list: {}", self.missing.join(", ")));
        }
        format!("{} (its kubelet plugin has not re-enumerated since the layout changed)", parts.join("; "))
    }
}

fn same_instance(d: &SliceDevice, g: &GpuState, i: &MigInstance) -> bool {
    let SliceDevice::Mig { uuid, parent_uuid, profile, placement, .. } = d else { return false };
    if let (Some(a), Some(b)) = (uuid, &i.uuid) {
        return a == b;
    }
    parent_uuid.as_deref() == Some(g.uuid.as_str())
        && *placement == Some((i.start, i.size))
        && catalog::normalize_profile(profile) == catalog::normalize_profile(&i.profile)
}

/// Compares the agent's report with the slices, only when every pool of the node is complete
/// (a pool mid-publication is not yet a disagreement). Devices on GPUs the agent does not report
/// are not judged.
pub fn compare(status: &GpuNodeStatus, node: &NodeSlices<'_>) -> Disagreement {
    let mut out = Disagreement::default();
    if !node.all_complete() || status.gpus.is_empty() {
        return out;
    }
    let devices = node.devices();
    fn on<'d>(devices: &'d [SliceDevice], g: &'d GpuState) -> impl Iterator<Item = &'d SliceDevice> + 'd {
        devices.iter().filter(move |d| d.gpu_uuid() == Some(g.uuid.as_str()))
    }
    for g in status.gpus.iter().filter(|g| !g.uuid.is_empty()) {
        for d in on(&devices, g) {
            let real = match d {
                SliceDevice::Gpu { .. } => !g.mig_enabled,
                SliceDevice::Mig { .. } => g.mig_enabled && g.instances.iter().any(|i| same_instance(d, g, i)),
            };
            if !real {
                out.stale.push(d.name().to_string());
            }
        }
        if g.mig_enabled {
            for i in g.instances.iter().filter(|i| !on(&devices, g).any(|d| same_instance(d, g, i))) {
                out.missing.push(format!("gpu {} {} at {}", g.index, i.profile, i.start));
            }
        } else if !on(&devices, g).any(|d| matches!(d, SliceDevice::Gpu { .. })) {
            out.missing.push(format!("gpu {} (whole)", g.index));
        }
    }
    out
}

/// Why the node runs NVIDIA's DynamicMIG (KEP-4815 partitionable devices: a slice with shared
/// counters, or devices that consume them), naming the slices; `None` for a static layout.
pub fn dynamic_mig(node: &NodeSlices<'_>) -> Option<String> {
    let mut found = BTreeSet::new();
    for pool in &node.pools {
        for s in &pool.slices {
            let counters = s.spec.shared_counters.as_ref().is_some_and(|c| !c.is_empty());
            let consumers =
                s.spec.devices.iter().flatten().any(|d| d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty()));
            if counters || consumers {
                found.insert(format!("{} ({})", s.metadata.name.as_deref().unwrap_or("?"), pool.driver));
            }
        }
    }
    if found.is_empty() {
        return None;
    }
    Some(format!(
        "the GPU DRA driver publishes partitionable devices (shared counters) in ResourceSlice(s) {}: DynamicMIG \
         creates MIG devices per claim and must not share a GPU with Tessera's layouts",
        found.into_iter().collect::<Vec<_>>().join(", ")
    ))
}

/// What to do with a GpuNode's [`DRA_IN_SYNC`] condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeCondition {
    /// No GPU driver publishes for the node: none.
    Absent,
    /// A pool is mid-publication: the last verdict stands.
    Keep,
    /// `(in sync, reason, message)`.
    Set(bool, &'static str, String),
}

/// The node's [`DRA_IN_SYNC`] from its slices and its agent's report: `False`/`DynamicMig` when
/// refused, `False`/`SlicesStale` on a disagreement, `True`/`InSync` when the complete pools list
/// what the agent reports.
pub fn node_condition(status: Option<&GpuNodeStatus>, node: Option<&NodeSlices<'_>>) -> NodeCondition {
    let Some(node) = node.filter(|n| !n.pools.is_empty()) else { return NodeCondition::Absent };
    if let Some(why) = dynamic_mig(node) {
        return NodeCondition::Set(false, gpunode_reasons::DYNAMIC_MIG, why);
    }
    let Some(st) = status.filter(|s| !s.gpus.is_empty()) else { return NodeCondition::Absent };
    if !node.all_complete() {
        return NodeCondition::Keep;
    }
    let d = compare(st, node);
    if d.is_empty() {
        let msg = "the GPU DRA driver lists the MIG devices the node agent reports";
        NodeCondition::Set(true, gpunode_reasons::IN_SYNC, msg.into())
    } else {
        NodeCondition::Set(false, gpunode_reasons::SLICES_STALE, d.message())
    }
}

/// Whether `current` (the cached condition) must be written to become `want`.
pub fn must_write(
    current: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    want: &NodeCondition,
) -> bool {
    match (current, want) {
        (_, NodeCondition::Keep) | (None, NodeCondition::Absent) => false,
        (Some(_), NodeCondition::Absent) | (None, NodeCondition::Set(..)) => true,
        (Some(c), NodeCondition::Set(ok, reason, message)) => {
            c.status != if *ok { "True" } else { "False" } || c.reason != *reason || c.message != *message
        }
    }
}

#[cfg(test)]
mod tests;
