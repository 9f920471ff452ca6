//! What the fleet status is computed from: the objects read (from the cluster or files), and what
//! could not be read.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube_core::Resource;
use tessera_crds::{GpuNode, GpuPartitionPlan, TenantGpuQuota};

use super::{DeviceIndex, FleetStatus, SliceIndex, Unreadable, fleet_status_with};
use crate::dra::GpuDrivers;
use crate::gpu_use::ClaimIndex;

/// What the report is computed from.
#[derive(Debug, Default)]
pub struct Inputs {
    pub gpunodes: Vec<GpuNode>,
    pub plans: Vec<GpuPartitionPlan>,
    pub quotas: Vec<TenantGpuQuota>,
    pub pods: Vec<Pod>,
    pub claims: Vec<ResourceClaim>,
    pub slices: Vec<ResourceSlice>,
    /// `--gpu-dra-drivers`: whose claim allocations are GPUs.
    pub drivers: GpuDrivers,
    pub unreadable: Vec<Unreadable>,
    /// The agents' heartbeat Leases; `None` when not read (no RBAC for them, `--from` files
    /// without any): then no node's activity is set aside (see `idle::stale`).
    pub leases: Option<Vec<Lease>>,
    /// Why the Leases could not be read from the cluster (a note, not a failure of the read).
    pub leases_unread: Option<String>,
}

impl Inputs {
    pub fn report(&self) -> FleetStatus {
        let dra =
            DeviceIndex { claims: ClaimIndex::new(&self.claims, &self.drivers), slices: SliceIndex::new(&self.slices) };
        let mut s = fleet_status_with(&self.gpunodes, &self.plans, &self.quotas, &self.pods, &dra);
        s.unreadable = self.unreadable.clone();
        // Without pods, or without the claims that say which devices pods hold through DRA, no
        // device is known to be free. Unread slices only cost the attributes (names still place).
        let holders = [resource_name::<Pod>(), resource_name::<ResourceClaim>()];
        s.holders_known = !s.unreadable.iter().any(|u| holders.contains(&u.resource));
        s
    }
}

/// `plural.group` as kubectl names a resource in its errors.
pub fn resource_name<K: Resource<DynamicType = ()>>() -> String {
    let group = K::group(&());
    if group.is_empty() { K::plural(&()).into_owned() } else { format!("{}.{group}", K::plural(&())) }
}
