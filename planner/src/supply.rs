//! What a GPU supplies: its MIG instances as resource names, or itself as a whole GPU. The one
//! rule the quotas, automatic layouts and the DRA slice reading count supply by.

use std::collections::BTreeMap;

use tessera_crds::catalog;
use tessera_crds::gpunode::GpuState;
use tessera_crds::validate::GPU_RESOURCE;

/// What one GPU supplies per resource name: its MIG instances, or itself as a whole GPU.
pub fn gpu_supply(g: &GpuState, out: &mut BTreeMap<String, i64>) {
    supplied(g, |profile| *out.entry(resource_of(profile)).or_default() += 1);
}

/// Each slice one GPU supplies: `Some(profile)` per MIG instance, or `None` once for the GPU
/// itself when MIG is off. The one rule behind [`gpu_supply`] and `quota::Capacity::of`.
pub(crate) fn supplied<'a>(g: &'a GpuState, mut add: impl FnMut(Option<&'a str>)) {
    if g.mig_enabled {
        g.instances.iter().for_each(|i| add(Some(i.profile.as_str())));
    } else {
        add(None);
    }
}

/// The resource name of a slice from [`supplied`].
pub(crate) fn resource_of(profile: Option<&str>) -> String {
    profile.map_or_else(|| GPU_RESOURCE.to_string(), catalog::mig_resource_name)
}
