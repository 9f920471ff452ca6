//! The one rule for "this pod uses a GPU", on both ways GPUs reach pods: extended resources from
//! the device plugin (`nvidia.com/gpu`, `nvidia.com/mig-*`) and ResourceClaims allocated devices
//! of a GPU DRA driver. The drain scope, automatic layouts' busy check, `plan preview`/`suggest`
//! and `kubectl tessera status` all ask it, so they cannot disagree.
//!
//! Decisions (README "GPUs allocated through DRA"):
//! - A claim shared by several pods: every pod that names it uses its devices.
//! - A claim allocated but not yet reserved for anyone (`status.reservedFor` empty): the pod
//!   naming it uses it (the scheduler reserves it as it binds; waiting for the reservation would
//!   let a layout change slip in between).
//! - A claim reserved for other pods only (`reservedFor` UIDs without the pod's): not taken for
//!   the pod's. Bound, the pod must be among them (the kubelet runs no pod its claim is not
//!   reserved for), so the cache shows an older claim of that name (deleted and created again)
//!   or is behind: GPU use of an unknown device. Not bound: no device of its own yet.
//! - Admin-access results (monitoring, `adminAccess: true`) observe a device without holding it,
//!   like a metrics exporter using no GPU resource: not GPU use here (they still count for quota).
//! - A claim not allocated yet: no device, no node: not GPU use.
//! - A pod bound to a node that names a claim this index does not hold (a cache behind, a
//!   template's claim not reported yet): GPU use of an unknown device. Evicting a pod that turns
//!   out not to need a GPU costs a restart; changing a GPU under one that does loses its work.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::dra::GpuDrivers;

/// One device a claim was allocated, as `status.allocation.devices.results[]` names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct AllocatedDevice {
    pub claim: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
}

/// What one claim means for GPU use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ClaimGpus {
    allocated: bool,
    /// The GPU-driver devices it holds (admin-access results left out).
    devices: Vec<AllocatedDevice>,
    /// The nodes its allocation is on: `allocation.nodeSelector`'s `metadata.name` fields and
    /// its GPU devices' pools (NVIDIA's DRA driver names a node's pool after the node).
    nodes: Vec<String>,
    /// The pods it is reserved for (`status.reservedFor`, resource `pods`): (name, UID).
    reserved_for: Vec<(String, String)>,
}

impl ClaimGpus {
    /// Whether it is reserved for `pod` (by UID; by name only where either lacks one).
    fn reserved_for(&self, pod: &Pod) -> bool {
        let (name, uid) = (pod.metadata.name.as_deref().unwrap_or_default(), pod.metadata.uid.as_deref());
        self.reserved_for.iter().any(|(n, u)| match uid.filter(|u| !u.is_empty()) {
            Some(uid) if !u.is_empty() => u == uid,
            _ => n == name,
        })
    }
}

/// The node names a claim's `allocation.nodeSelector` pins by `metadata.name` (the scheduler's
/// form for node-local devices).
fn selector_nodes(allocation: &k8s_openapi::api::resource::v1::AllocationResult) -> Vec<String> {
    let terms = allocation.node_selector.iter().flat_map(|s| s.node_selector_terms.iter());
    terms
        .flat_map(|t| t.match_fields.iter().flatten())
        .filter(|f| f.key == "metadata.name" && f.operator == "In")
        .flat_map(|f| f.values.iter().flatten().cloned())
        .collect()
}

/// The ResourceClaims of the cluster (or of the namespaces asked about), reduced to what GPU use
/// needs. Built once per pass from the claim cache.
#[derive(Debug, Clone, Default)]
pub struct ClaimIndex {
    /// By (namespace, name).
    claims: BTreeMap<(String, String), ClaimGpus>,
}

impl ClaimIndex {
    pub fn new<'a>(claims: impl IntoIterator<Item = &'a ResourceClaim>, drivers: &GpuDrivers) -> Self {
        let mut index = ClaimIndex::default();
        for c in claims {
            let ns = c.metadata.namespace.clone().unwrap_or_default();
            let name = c.metadata.name.clone().unwrap_or_default();
            let allocation = c.status.as_ref().and_then(|s| s.allocation.as_ref());
            let results =
                allocation.and_then(|a| a.devices.as_ref()).and_then(|d| d.results.as_deref()).unwrap_or_default();
            let devices: Vec<AllocatedDevice> = results
                .iter()
                .filter(|r| drivers.contains(&r.driver) && r.admin_access != Some(true))
                .map(|r| AllocatedDevice {
                    claim: name.clone(),
                    driver: r.driver.clone(),
                    pool: r.pool.clone(),
                    device: r.device.clone(),
                })
                .collect();
            let mut nodes: Vec<String> = allocation.map(selector_nodes).unwrap_or_default();
            nodes.extend(devices.iter().map(|d| d.pool.clone()));
            nodes.sort();
            nodes.dedup();
            let reserved = c.status.as_ref().and_then(|s| s.reserved_for.as_ref()).into_iter().flatten();
            let reserved_for = reserved
                .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or_default().is_empty())
                .map(|r| (r.name.clone(), r.uid.clone()))
                .collect();
            let gpus = ClaimGpus { allocated: allocation.is_some(), devices, nodes, reserved_for };
            index.claims.insert((ns, name), gpus);
        }
        index
    }

    /// Why `node` must not be handed over yet: its GPU claims reserved for a pod not among
    /// `bound` (the node's pods). The scheduler reserves a claim in PreBind and writes the Bind
    /// after, so such a pod is in its binding cycle: unseen by a drain that lists the node's
    /// pods, and about to start on the devices the change would destroy. Once bound it is
    /// drained like any pod; a pod whose binding fails loses the reservation.
    pub fn binding_on(&self, node: &str, bound: &[Pod]) -> Vec<String> {
        let mut why = Vec::new();
        for ((ns, name), c) in &self.claims {
            if c.devices.is_empty() || !c.nodes.iter().any(|n| n == node) {
                continue;
            }
            let on_node = |(pod, uid): &(String, String)| {
                bound.iter().any(|p| {
                    p.metadata.namespace.as_deref() == Some(ns.as_str())
                        && match p.metadata.uid.as_deref().filter(|u| !u.is_empty()) {
                            Some(u) if !uid.is_empty() => u == uid,
                            _ => p.metadata.name.as_deref() == Some(pod.as_str()),
                        }
                })
            };
            for (pod, _) in c.reserved_for.iter().filter(|r| !on_node(r)) {
                why.push(format!(
                    "claim {ns}/{name} holds a GPU of {node} reserved for pod {ns}/{pod}, which is not bound to the \
                     node yet (the scheduler is binding it): the node is not handed to its node agent until the pod \
                     shows on it (then it is drained) or loses the reservation"
                ));
            }
        }
        why
    }

    /// An index that holds no claim. With it, a bound pod naming a claim counts as GPU use of
    /// an unknown device (see the module doc): right where claims cannot be read.
    pub fn empty() -> Self {
        ClaimIndex::default()
    }
}

/// How a pod uses GPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuUse {
    /// Requests or limits `nvidia.com/gpu` or `nvidia.com/mig-*`.
    pub extended: bool,
    /// GPU devices its allocated claims hold, each once.
    pub devices: Vec<AllocatedDevice>,
    /// Claims it names that the index does not hold while it is bound to a node.
    pub unknown_claims: Vec<String>,
}

impl GpuUse {
    pub fn any(&self) -> bool {
        self.extended || !self.devices.is_empty() || !self.unknown_claims.is_empty()
    }
}

/// Whether a pod requests or is limited to any `nvidia.com/gpu` or `nvidia.com/mig-*` resource
/// (the device plugin's way; also how a KEP-5004 extended-resource pod asks for a DRA device).
pub fn uses_extended_gpu(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else { return false };
    spec.containers.iter().chain(spec.init_containers.iter().flatten()).any(|c| {
        let r = c.resources.as_ref();
        let names = r
            .and_then(|r| r.requests.as_ref())
            .into_iter()
            .flatten()
            .chain(r.and_then(|r| r.limits.as_ref()).into_iter().flatten())
            .map(|(k, _)| k.as_str());
        names.into_iter().any(is_gpu_resource)
    })
}

/// `nvidia.com/gpu` or `nvidia.com/mig-<profile>`.
pub fn is_gpu_resource(name: &str) -> bool {
    name == "nvidia.com/gpu" || name.starts_with("nvidia.com/mig-")
}

/// One claim a pod uses: the entry in `spec.resourceClaims` (or the scheduler's claim for its
/// DRA-backed extended resources) and the ResourceClaim's name, `None` while a template's claim
/// is not reported yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodClaim {
    pub entry: String,
    pub claim: Option<String>,
}

/// The ResourceClaims a pod uses: named directly, generated from its templates (as
/// `status.resourceClaimStatuses` reports them), and the one the scheduler made for its
/// DRA-backed extended resources (KEP-5004).
pub fn pod_claims(pod: &Pod) -> Vec<PodClaim> {
    let statuses = pod.status.as_ref().and_then(|s| s.resource_claim_statuses.as_ref());
    let mut out = Vec::new();
    for c in pod.spec.iter().flat_map(|s| s.resource_claims.iter().flatten()) {
        let claim = if let Some(name) = &c.resource_claim_name {
            Some(name.clone())
        } else if c.resource_claim_template_name.is_some() {
            match statuses.into_iter().flatten().find(|s| s.name == c.name) {
                // Reported with no claim: generating one was not necessary.
                Some(s) if s.resource_claim_name.is_none() => continue,
                Some(s) => s.resource_claim_name.clone(),
                None => None,
            }
        } else {
            continue;
        };
        out.push(PodClaim { entry: c.name.clone(), claim });
    }
    if let Some(ext) = pod.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref()) {
        out.push(PodClaim { entry: "(extended resources)".into(), claim: Some(ext.resource_claim_name.clone()) });
    }
    out
}

/// How `pod` uses GPUs, by extended resources and by the claims in `claims`.
pub fn gpu_use(pod: &Pod, claims: &ClaimIndex) -> GpuUse {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
    let mut used = GpuUse { extended: uses_extended_gpu(pod), ..GpuUse::default() };
    for PodClaim { entry, claim } in pod_claims(pod) {
        let found = claim.as_ref().and_then(|n| claims.claims.get(&(ns.clone(), n.clone())));
        match (found, claim) {
            // Bound but shown unallocated: the cache is behind the scheduler's write.
            (Some(c), Some(name)) if bound && !c.allocated => used.unknown_claims.push(name),
            // Reserved for other pods only: not the pod's claim as the cache shows it.
            (Some(c), Some(name)) if !c.reserved_for.is_empty() && !c.reserved_for(pod) => {
                if bound {
                    used.unknown_claims.push(name);
                }
            }
            (Some(c), _) => used.devices.extend(c.devices.iter().cloned()),
            (None, Some(name)) if bound => used.unknown_claims.push(name),
            (None, None) if bound => used.unknown_claims.push(format!("({entry}: claim not created yet)")),
            (None, _) => {}
        }
    }
    used.devices.sort();
    used.devices.dedup();
    used
}

/// Whether a pod uses a GPU on either way (the drain scope's and the busy check's test).
pub fn uses_gpu(pod: &Pod, claims: &ClaimIndex) -> bool {
    gpu_use(pod, claims).any()
}

/// What NVIDIA's DRA driver's device names say: `gpu-<minor>` for a whole GPU; a MIG device is
/// `gpu-<parent minor>-mig-<profile, dots dropped>-<GI profile id>-<start>` (driver 25.12 and
/// later, e.g. `gpu-7-mig-1g10gb-19-0`) or `gpu-<parent minor>-mig-<GI profile id>-<start>-<size>`
/// (earlier releases). Only the older form carries the size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvidiaDevice {
    Gpu { minor: u32 },
    Mig { parent_minor: u32, gi_profile_id: u32, start: u32, size: Option<u32>, profile: Option<String> },
}

/// Parses a device name of NVIDIA's DRA driver; `None` for any other form.
pub fn parse_nvidia_device(name: &str) -> Option<NvidiaDevice> {
    let rest = name.strip_prefix("gpu-")?;
    let num =
        |s: &str| (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse::<u32>().ok()).flatten();
    let parts: Vec<&str> = rest.split('-').collect();
    match parts.as_slice() {
        [minor] => Some(NvidiaDevice::Gpu { minor: num(minor)? }),
        [minor, "mig", id, start, size] if num(id).is_some() => Some(NvidiaDevice::Mig {
            parent_minor: num(minor)?,
            gi_profile_id: num(id)?,
            start: num(start)?,
            size: Some(num(size)?),
            profile: None,
        }),
        [minor, "mig", profile @ .., id, start]
            if !profile.is_empty() && profile.iter().all(|p| !p.is_empty()) && num(profile[0]).is_none() =>
        {
            Some(NvidiaDevice::Mig {
                parent_minor: num(minor)?,
                gi_profile_id: num(id)?,
                start: num(start)?,
                size: None,
                profile: Some(profile.join("-")),
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests;
