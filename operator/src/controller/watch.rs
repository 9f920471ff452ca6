//! The caches of the fleet both controllers read, each started by `cache::start_cache` (the
//! leases by their own stream, see `leases`), and how the rollout's dirty marks are told of
//! their changes.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Client, Resource};
use tessera_crds::gpunode::AGENT_LEASE_NAMESPACE;
use tessera_crds::{GpuNode, GpuPartitionPlan, TenantGpuQuota};
use tessera_planner::dra::GpuDrivers;
use tessera_planner::liveness::LeaseWatch;
use tessera_planner::trimmed::{SlimGpuNode, SlimNode};
use tokio::sync::Notify;

use super::claims::ClaimCache;
use super::dra::DraWatch;
use super::fleet_cache::Dirty;
use super::{leases, trim_node};
use crate::cache::{Cache, Marks, start_cache};
use crate::pass_wakes::{self, Waker};

/// The caches of the fleet, started once per process (`run`) and read by both controllers: the
/// quota controller reads the same GpuNodes, Nodes, claims and slices as the rollout.
#[derive(Clone)]
pub(crate) struct Caches {
    pub(crate) plans: Store<GpuPartitionPlan>,
    pub(crate) gpunodes: Store<GpuNode>,
    pub(crate) nodes: Store<Node>,
    pub(crate) leases: Store<Lease>,
    /// Whether the lease watch is caught up (no agent is judged dead through one that is not).
    pub(crate) lease_watch: Arc<Mutex<LeaseWatch>>,
    /// The quotas (automatic plans serve them, and `fragmentedSlices` is measured against them).
    pub(crate) quotas: Store<TenantGpuQuota>,
    /// ResourceClaims: which pods use a GPU through DRA (the rollout's drain scope, its busy check).
    pub(crate) claims: ClaimCache,
    /// The GPU DRA drivers' ResourceSlices: the nodes the rollout refuses, the supply counted.
    pub(crate) dra: Arc<DraWatch>,
    /// The nodes the GpuNode, Node and Lease watches saw change.
    pub(crate) dirty: Arc<Dirty>,
    /// How far the GpuNode and Node caches have got (highest resourceVersion they hold), and the
    /// newest version the operator wrote to each (see [`start_cache`]).
    pub(crate) gpunodes_progress: Arc<AtomicU64>,
    pub(crate) nodes_progress: Arc<AtomicU64>,
    pub(crate) gpunodes_written: Arc<AtomicU64>,
    pub(crate) nodes_written: Arc<AtomicU64>,
    /// Fires on every change the rollout reads (see `pass_wakes`).
    pub(crate) changed: Arc<Notify>,
    /// Fires when a GpuNode's GPUs change, or a slice does (the quota controller's wake-up).
    pub(crate) fleet_changed: Arc<Notify>,
    /// Fires on every TenantGpuQuota change (the quota controller's own caches fire it too).
    pub(crate) quota_changed: Arc<Notify>,
}

impl Caches {
    /// Starts the watches. `gpu_drivers`: whose claim allocations and slices are GPUs.
    pub(crate) fn start(client: &Client, gpu_drivers: GpuDrivers) -> Self {
        let (changed, fleet_changed) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        // Nodes, GpuNodes and Leases are named alike: their changes name the node to read again.
        let dirty = Arc::new(Dirty::default());
        let all = watcher::Config::default;
        let plans = start_cache(
            Api::<GpuPartitionPlan>::all(client.clone()),
            all(),
            Cache::waking(vec![Waker { notify: changed.clone(), differs: pass_wakes::plan_differs }]),
        )
        .0;
        // The quota controller reads the same GpuNodes (their capacity): one cache, woken both.
        let gpunodes_written = Arc::new(AtomicU64::new(0));
        let nodes_written = Arc::new(AtomicU64::new(0));
        let (gpunodes, gpunodes_progress) = start_cache(
            Api::<SlimGpuNode>::all(client.clone()),
            all(),
            Cache {
                dirty: Some(dirty.clone()),
                written: gpunodes_written.clone(),
                ..Cache::waking(vec![
                    Waker::always(changed.clone()),
                    Waker { notify: fleet_changed.clone(), differs: pass_wakes::gpus_differ },
                ])
            },
        );
        let (nodes, nodes_progress) = start_cache(
            Api::<SlimNode>::all(client.clone()),
            all(),
            Cache {
                trim: trim_node,
                dirty: Some(dirty.clone()),
                written: nodes_written.clone(),
                ..Cache::waking(vec![Waker { notify: changed.clone(), differs: pass_wakes::node_differs }])
            },
        );
        let (leases, lease_watch) = leases::watch_leases(
            Api::<Lease>::namespaced(client.clone(), AGENT_LEASE_NAMESPACE),
            Waker { notify: changed.clone(), differs: pass_wakes::lease_differs },
            dirty.clone(),
        );
        // One watch of the quotas for both controllers: the rollout reads what automatic plans
        // serve, the quota controller everything.
        let quota_changed = Arc::new(Notify::new());
        let quotas = start_cache(
            Api::<TenantGpuQuota>::all(client.clone()),
            all(),
            Cache::waking(vec![
                Waker { notify: changed.clone(), differs: pass_wakes::quota_differs },
                Waker::always(quota_changed.clone()),
            ]),
        )
        .0;
        let claims = ClaimCache::start(client.clone(), gpu_drivers.clone());
        // The GPU DRA drivers' slices: a change wakes both controllers (refusals, supply).
        let dra = DraWatch::start(client.clone(), gpu_drivers, vec![changed.clone(), fleet_changed.clone()]);
        Self {
            plans,
            gpunodes,
            nodes,
            leases,
            lease_watch,
            quotas,
            claims,
            dra,
            dirty,
            gpunodes_progress,
            nodes_progress,
            gpunodes_written,
            nodes_written,
            changed,
            fleet_changed,
            quota_changed,
        }
    }
}

impl<K: Resource> Marks<K> for Dirty {
    fn mark(&self, event: &watcher::Event<K>) {
        Dirty::mark(self, event);
    }
}
