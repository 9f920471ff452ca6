//! The ResourceSlices the simulated driver keeps: one per opted-in node (pool = node name), its
//! devices from the node's GpuNode report, its pool generation bumped whenever they change.
//! Shaped observe -> plan (pure, here) -> act (`sim-dra-driver`).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Device, ResourcePool, ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use tessera_crds::gpunode::GpuNodeStatus;

use super::devices::{Skipped, node_devices};
use super::{DRIVER, SIM_DRA_LABEL};

/// Label on every slice the simulated driver owns (it deletes only those).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "tessera-sim-dra-driver");
/// Annotation holding a digest of the published devices: a change bumps the pool generation.
pub const DEVICES_DIGEST: &str = "tessera.dev/sim-dra-devices";

/// The name of a node's slice (one per node: the driver's devices fit in one).
pub fn slice_name(node: &str) -> String {
    format!("{node}-{DRIVER}")
}

/// What the simulated driver sees of one node.
#[derive(Debug, Clone, Default)]
pub struct ObservedNode {
    /// The Node's uid (the slice is owned by the Node, so it goes with it).
    pub uid: String,
    /// Whether the node carries `tessera.dev/sim-dra=true`.
    pub opted_in: bool,
    /// The agent's report, when its GpuNode has one.
    pub report: Option<GpuNodeStatus>,
}

/// Everything one pass looks at.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub nodes: BTreeMap<String, ObservedNode>,
    /// The slices carrying [`MANAGED_BY`], by name.
    pub slices: BTreeMap<String, ResourceSlice>,
}

/// One step of a pass.
#[derive(Debug, Clone, PartialEq)]
pub enum SliceAction {
    /// Server-side apply this slice (new, or its devices changed).
    Apply(Box<ResourceSlice>),
    /// Delete our slice of a node gone, opted out, or without a report.
    Delete(String),
}

/// The plan of one pass, and what could not be published (for the log).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SlicePlan {
    pub actions: Vec<SliceAction>,
    pub skipped: Vec<(String, Skipped)>,
}

/// Plans a pass: an up-to-date slice is left alone, so running it again changes nothing.
pub fn plan(observed: &Observed) -> SlicePlan {
    let mut out = SlicePlan::default();
    let mut wanted = BTreeMap::new();
    for (node, seen) in &observed.nodes {
        let Some(report) = seen.report.as_ref().filter(|_| seen.opted_in) else { continue };
        let built = node_devices(report);
        out.skipped.extend(built.skipped.into_iter().map(|s| (node.clone(), s)));
        let name = slice_name(node);
        let digest = digest(&built.devices);
        let existing = observed.slices.get(&name);
        let current = existing.is_some_and(|s| {
            s.spec.node_name.as_deref() == Some(node.as_str())
                && s.metadata.annotations.as_ref().and_then(|a| a.get(DEVICES_DIGEST)) == Some(&digest)
        });
        if !current {
            let generation = existing.map_or(0, |s| s.spec.pool.generation) + 1;
            out.actions.push(SliceAction::Apply(Box::new(node_slice(
                node,
                &seen.uid,
                built.devices,
                generation,
                &digest,
            ))));
        }
        wanted.insert(name, ());
    }
    for name in observed.slices.keys() {
        if !wanted.contains_key(name) {
            out.actions.push(SliceAction::Delete(name.clone()));
        }
    }
    out
}

/// A node's slice: driver `gpu.nvidia.com`, pool named after the node, owned by the Node.
pub fn node_slice(node: &str, node_uid: &str, devices: Vec<Device>, generation: i64, digest: &str) -> ResourceSlice {
    let owner = (!node_uid.is_empty()).then(|| {
        vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node.into(),
            uid: node_uid.into(),
            ..Default::default()
        }]
    });
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(node)),
            labels: Some([(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string())].into()),
            annotations: Some([(DEVICES_DIGEST.to_string(), digest.to_string())].into()),
            owner_references: owner,
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: DRIVER.into(),
            node_name: Some(node.into()),
            pool: ResourcePool { name: node.into(), generation, resource_slice_count: 1 },
            devices: Some(devices),
            ..Default::default()
        },
    }
}

/// A stable digest of the devices (FNV-1a of their JSON; maps in it are sorted).
pub fn digest(devices: &[Device]) -> String {
    let json = serde_json::to_vec(devices).unwrap_or_default();
    let hash = json.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3));
    format!("{hash:016x}")
}

/// Whether a Node's labels opt it in to the simulated driver.
pub fn opted_in(labels: Option<&BTreeMap<String, String>>) -> bool {
    labels.and_then(|l| l.get(SIM_DRA_LABEL)).is_some_and(|v| v == "true")
}
