//! A quota pass's first step: every cache the plan reads, taken once into [`Inputs`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use tessera_crds::TenantGpuQuota;
use tessera_planner::quota::claims::ClassView;
use tessera_planner::quota::early_pods::PendingPod;
use tessera_planner::quota::{Capacity, DraInputs};
use tracing::{info, warn};

use super::{Inputs, QuotaController, pending_pods};

impl QuotaController {
    /// Reads the quotas, namespaces, ResourceQuotas, the fleet's capacity and the DRA side of
    /// the plan from the caches.
    pub(super) fn observe(&self) -> Inputs {
        let all_namespaces = self.namespaces.state();
        let (namespace_uids, created) =
            tessera_planner::quota::pod_gate::namespace_facts(all_namespaces.iter().map(|n| &**n));
        let rqs = self.current_resource_quotas(&created);
        // Selectors read as names: every step after sees one list of namespaces per quota.
        let quotas: Vec<TenantGpuQuota> = tessera_planner::quota::selection::resolve(
            self.quotas.state().iter().map(|q| (**q).clone()).collect(),
            all_namespaces.iter().map(|n| &**n),
            &rqs,
        );
        let namespaces: BTreeSet<String> =
            all_namespaces.iter().filter(|n| n.metadata.deletion_timestamp.is_none()).map(|n| n.name_any()).collect();
        let capacity = self.capacity();
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let classes = self.classes.state();
        let dra = self.dra_inputs(&classes, namespace_uids);
        Inputs { quotas, namespaces, rqs, capacity, classes, dra, now }
    }

    /// The cached ResourceQuotas as the cluster has them: a lagging watch may still show a
    /// previous namespace's of the same name (`created`: each namespace's creation), or one this
    /// controller deleted as still there.
    fn current_resource_quotas(&self, created: &BTreeMap<String, Time>) -> Vec<ResourceQuota> {
        let rqs: Vec<ResourceQuota> = self.rqs.state().iter().map(|q| (**q).clone()).collect();
        let rqs = self.deleted.hide(rqs);
        tessera_planner::quota::pod_gate::of_current_namespaces(rqs, created)
    }

    /// What the fleet supplies: the GpuNodes, stand-ins for DRA drivers' nodes, and the
    /// `nvidia.com/` resources the Nodes advertise.
    fn capacity(&self) -> Capacity {
        let stand_ins = crate::controller::dra::supply_nodes(&self.dra, &self.gpunodes);
        let mut capacity = Capacity::of(self.gpunodes.state().iter().map(|g| &**g).chain(&stand_ins));
        capacity.advertised = tessera_planner::quota::advertised(self.nodes.state().iter().map(|n| &**n));
        capacity
    }

    /// The claims, classes, stored params and unbound pods the plan reads.
    fn dra_inputs(&self, classes: &[Arc<DeviceClass>], namespace_uids: BTreeMap<String, String>) -> DraInputs {
        // Devices held through classes other than Tessera's.
        let claims = self.claims.claims();
        let claims = || claims.iter().map(|c| &**c);
        let slices = self.dra.slices();
        let held =
            tessera_planner::quota::holdings::held_elsewhere(claims(), slices.iter().map(|s| &**s), &self.drivers);
        let view = ClassView::of(classes.iter().map(|c| &**c), &self.drivers);
        // Claims not allocated yet, counted at their most.
        let pending = tessera_planner::quota::unallocated::unallocated(claims(), &view);
        let admin_access = tessera_planner::quota::unallocated::admin_access(claims(), &view);
        let ours = tessera_planner::quota::unallocated::ours(claims());
        let stored_params = self.policy_params.state().first().and_then(|c| c.data.clone()).unwrap_or_default();
        let params_uids =
            stored_params.iter().filter_map(|(k, v)| Some((k.strip_suffix(".uid")?.to_string(), v.clone()))).collect();
        let (pods, pods_listed) = self.unbound_pods();
        let drivers = self.drivers.clone();
        DraInputs {
            classes: view,
            drivers,
            held,
            pending,
            namespace_uids,
            params_uids,
            admin_access,
            ours,
            stored_params,
            pods,
            pods_unknown: !pods_listed,
        }
    }

    /// The unbound pods asking for GPUs, and whether their cache is listed: logged when that
    /// changes; each quota's status says it on every pass.
    fn unbound_pods(&self) -> (Vec<PendingPod>, bool) {
        let pods = pending_pods::pending(&self.pods);
        let pods_listed = pending_pods::listed(&self.pods);
        if self.pods_unlisted.swap(!pods_listed, std::sync::atomic::Ordering::Relaxed) == pods_listed {
            match pods_listed {
                true => info!("unbound pods listed: <ns>.pods are computed again"),
                false => warn!("unbound pods not listed (RBAC: watch pods?): the stored <ns>.pods are carried"),
            }
        }
        (pods, pods_listed)
    }
}
