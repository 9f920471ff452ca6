//! Which reported GPU or MIG instance a ResourceClaim's allocated device is. Unlike the device
//! plugin's extended resources, a claim's allocation names its device (`driver`, `pool`,
//! `device`), so its holder is exact. The device is found, best first:
//! - by the ResourceSlice's attributes of NVIDIA's driver: `uuid` is a whole GPU's or a MIG
//!   device's UUID; `parentUUID` names the GPU of a MIG device whose own UUID the node does not
//!   report, and the placement in its name then names the instance;
//! - without a slice (unreadable, not exported), by NVIDIA's device name alone
//!   (`gpu-<minor>`, `gpu-<parent minor>-mig-<GI profile id>-<start>-<size>`), the minor taken
//!   as the GPU's index.
//!
//! A device found nowhere on the node is listed as unplaced, never guessed.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::ResourceSlice;
use tessera_crds::catalog;
use tessera_crds::gpunode::GpuState;

use super::{Device, GPU_RESOURCE, GpuStatus, Held, Holder, NodeStatus};

use crate::dra::NVIDIA_GPU_DRIVER;
use crate::gpu_use::{AllocatedDevice, NvidiaDevice, parse_nvidia_device};

/// NVIDIA's attributes of one published device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceAttrs {
    pub uuid: Option<String>,
    pub parent_uuid: Option<String>,
    pub profile: Option<String>,
}

/// The devices of every ResourceSlice, by (driver, pool, device), the newest pool generation's.
#[derive(Debug, Clone, Default)]
pub struct SliceIndex {
    devices: BTreeMap<(String, String, String), (i64, DeviceAttrs)>,
}

impl SliceIndex {
    pub fn new<'a>(slices: impl IntoIterator<Item = &'a ResourceSlice>) -> Self {
        let mut index = SliceIndex::default();
        for s in slices {
            let (driver, pool, generation) = (&s.spec.driver, &s.spec.pool.name, s.spec.pool.generation);
            for d in s.spec.devices.iter().flatten() {
                // An attribute is named bare (the driver's domain) or qualified by it.
                let attr = |name: &str| {
                    let attrs = d.attributes.as_ref()?;
                    let a = attrs.get(name).or_else(|| attrs.get(&format!("{driver}/{name}")))?;
                    a.string.clone()
                };
                let attrs =
                    DeviceAttrs { uuid: attr("uuid"), parent_uuid: attr("parentUUID"), profile: attr("profile") };
                let key = (driver.clone(), pool.clone(), d.name.clone());
                match index.devices.get(&key) {
                    Some((g, _)) if *g > generation => {}
                    _ => {
                        index.devices.insert(key, (generation, attrs));
                    }
                }
            }
        }
        index
    }

    pub fn get(&self, d: &AllocatedDevice) -> Option<&DeviceAttrs> {
        self.devices.get(&(d.driver.clone(), d.pool.clone(), d.device.clone())).map(|(_, a)| a)
    }
}

/// Where `device` is among `gpus` (a node's report): (GPU position, instance position or
/// `None` for the whole GPU); `None` when the node reports no such device.
pub fn locate(device: &AllocatedDevice, gpus: &[GpuState], slices: &SliceIndex) -> Option<(usize, Option<usize>)> {
    let name = (device.driver == NVIDIA_GPU_DRIVER).then(|| parse_nvidia_device(&device.device)).flatten();
    let placement = |g: &GpuState| match &name {
        // No two instances of a GPU share a start; the older name form also gives the size.
        Some(NvidiaDevice::Mig { start, size, .. }) => g.instances.iter().position(|i| {
            i64::from(i.start) == i64::from(*start) && size.is_none_or(|size| i64::from(i.size) == i64::from(size))
        }),
        _ => None,
    };
    if let Some(attrs) = slices.get(device)
        && (attrs.uuid.is_some() || attrs.parent_uuid.is_some())
    {
        // The slice is the driver's word: a UUID it names and the node lacks is not guessed at.
        if let Some(uuid) = &attrs.uuid {
            for (gi, g) in gpus.iter().enumerate() {
                if &g.uuid == uuid && !g.mig_enabled {
                    return Some((gi, None));
                }
                if let Some(ii) = g.instances.iter().position(|i| i.uuid.as_ref() == Some(uuid)) {
                    return g.mig_enabled.then_some((gi, Some(ii)));
                }
            }
        }
        let parent = attrs.parent_uuid.as_ref()?;
        let gi = gpus.iter().position(|g| &g.uuid == parent && g.mig_enabled)?;
        let ii = placement(&gpus[gi])?;
        let profile_agrees = attrs.profile.as_ref().is_none_or(|p| {
            catalog::normalize_profile(p) == catalog::normalize_profile(&gpus[gi].instances[ii].profile)
        });
        return profile_agrees.then_some((gi, Some(ii)));
    }
    match name.as_ref()? {
        NvidiaDevice::Gpu { minor } => {
            gpus.iter().position(|g| i64::from(g.index) == i64::from(*minor) && !g.mig_enabled).map(|gi| (gi, None))
        }
        NvidiaDevice::Mig { parent_minor, .. } => {
            let gi = gpus.iter().position(|g| i64::from(g.index) == i64::from(*parent_minor) && g.mig_enabled)?;
            placement(&gpus[gi]).map(|ii| (gi, Some(ii)))
        }
    }
}

/// `Held::resource` of a claim the index lacks (created after the list, or not read).
pub const UNKNOWN_DEVICE: &str = "(device unknown: claim not read)";

/// Sets the holders of the devices claims name on `out` (exact); returns the devices taken and
/// the claim devices the node does not report. A shared claim's device shows its first holder.
pub fn place(
    out: &mut [GpuStatus],
    gpus: &[GpuState],
    mut claimed: Vec<(Holder, Option<AllocatedDevice>)>,
    slices: &SliceIndex,
) -> (BTreeSet<Device>, Vec<Held>) {
    claimed.sort();
    let mut taken: BTreeMap<Device, String> = BTreeMap::new();
    let mut unplaced = Vec::new();
    for (holder, device) in claimed {
        let Some(device) = device else {
            unplaced.push(Held { holder, resource: UNKNOWN_DEVICE.into(), count: 1 });
            continue;
        };
        match locate(&device, gpus, slices) {
            Some(at) if !taken.contains_key(&at) => {
                taken.insert(at, device.claim.clone());
                match at.1 {
                    Some(i) => out[at.0].instances[i].holder = Some(holder),
                    None => out[at.0].holder = Some(holder),
                }
            }
            // The same claim's device again: another pod sharing the claim.
            Some(at) if taken.get(&at) == Some(&device.claim) => {}
            _ => unplaced.push(Held { holder, resource: format!("{}/{}", device.driver, device.device), count: 1 }),
        }
    }
    (taken.into_keys().collect(), unplaced)
}

/// Adds the devices held through claims to their tenants: a placed device as the resource the
/// device plugin would name it by, one the node does not report under its driver's name.
pub fn count_for_tenants(nodes: &[NodeStatus], tenants: &mut BTreeMap<String, BTreeMap<String, i64>>) {
    let mut add = |h: &Holder, resource: String| {
        let e = tenants.entry(h.tenant.clone().unwrap_or_default()).or_default().entry(resource).or_default();
        *e = e.saturating_add(1);
    };
    for n in nodes {
        for g in &n.gpus {
            if let Some(h) = g.holder.as_ref().filter(|h| h.claim.is_some()) {
                add(h, GPU_RESOURCE.to_string());
            }
            for i in &g.instances {
                if let Some(h) = i.holder.as_ref().filter(|h| h.claim.is_some()) {
                    add(h, catalog::mig_resource_name(&i.profile));
                }
            }
        }
        for u in n.unplaced.iter().filter(|u| u.holder.claim.is_some() && u.resource != UNKNOWN_DEVICE) {
            let driver = u.resource.split_once('/').map_or(u.resource.as_str(), |(d, _)| d);
            add(&u.holder, driver.to_string());
        }
    }
}
