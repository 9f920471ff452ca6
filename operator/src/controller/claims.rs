//! The cluster's ResourceClaims (`resource.k8s.io/v1`), cached so the drain scope and automatic
//! layouts' busy check see pods that hold a GPU through DRA (see `gpu_use`). No pass runs before
//! the cache is synced: a drain planned without the claims would leave claim pods on a node
//! whose GPUs are about to change. A claim change wakes no pass (a pod whose claim the cache does
//! not show yet already counts as using a GPU); passes run every two seconds anyway.

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client};

use crate::cache::{Cache, start_cache};
use tessera_planner::dra::GpuDrivers;
use tessera_planner::gpu_use::ClaimIndex;

/// The claim cache and the drivers whose devices are GPUs.
#[derive(Clone)]
pub struct ClaimCache {
    store: Store<ResourceClaim>,
    drivers: GpuDrivers,
}

impl ClaimCache {
    /// Starts the cache. Where the API server serves no `resource.k8s.io/v1` (before Kubernetes
    /// 1.34, or DRA turned off) no claim can exist: the cache is synced and stays empty.
    pub fn start(client: Client, drivers: GpuDrivers) -> Self {
        let cache = Cache {
            trim: trim_claim,
            served: Some((
                "resourceclaims",
                "resource.k8s.io/v1 is not served: no pod uses a GPU through a ResourceClaim",
            )),
            failed: "ResourceClaim watch error; retrying with backoff",
            ..Cache::waking(vec![])
        };
        let store = start_cache(Api::<ResourceClaim>::all(client), watcher::Config::default(), cache).0;
        ClaimCache { store, drivers }
    }

    /// A cache over `store`, filled by the test.
    #[cfg(test)]
    pub fn of(store: Store<ResourceClaim>, drivers: GpuDrivers) -> Self {
        ClaimCache { store, drivers }
    }

    /// Until the first list of claims is in.
    pub async fn wait_ready(&self) {
        let _ = self.store.wait_until_ready().await;
    }

    /// The claims as the cache holds them now (trimmed: [`trim_claim`]).
    pub fn claims(&self) -> Vec<std::sync::Arc<ResourceClaim>> {
        self.store.state()
    }

    /// The claims as the cache holds them now, reduced to what GPU use needs.
    pub fn index(&self) -> ClaimIndex {
        let claims = self.store.state();
        ClaimIndex::new(claims.iter().map(|c| &**c), &self.drivers)
    }
}

/// Keeps what [`ClaimIndex`] reads (the name and the allocation's results) and each request's
/// class (the quotas count devices allocated through classes other than Tessera's:
/// `quota::holdings`): selectors, configs, constraints, the per-device status and `reservedFor`
/// are most of a claim and never read here.
pub fn trim_claim(claim: &mut ResourceClaim) {
    super::trim_metadata(claim);
    if let Some(devices) = claim.spec.as_mut().and_then(|s| s.devices.as_mut()) {
        devices.config = None;
        devices.constraints = None;
        for r in devices.requests.iter_mut().flatten() {
            if let Some(e) = r.exactly.as_mut() {
                e.selectors = None;
                e.tolerations = None;
            }
            for f in r.first_available.iter_mut().flatten() {
                f.selectors = None;
                f.tolerations = None;
            }
        }
    }
    if let Some(status) = claim.status.as_mut() {
        status.devices = None;
        status.reserved_for = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::mark_synced_empty;
    use kube::runtime::reflector;
    use serde_json::json;

    fn claim(name: &str) -> ResourceClaim {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ml",
                "managedFields": [{"manager": "kube-scheduler"}]},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}},
            "status": {"allocation": {"devices": {"results": [
                    {"request": "r", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0-mig-19-0-1"}]}},
                "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}],
                "devices": [{"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0-mig-19-0-1"}]}}))
        .unwrap()
    }

    fn bound_pod() -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ml"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": "c1"}]}}))
        .unwrap()
    }

    #[tokio::test]
    async fn the_cache_is_ready_only_once_the_claims_are_listed() {
        let (store, mut writer) = reflector::store::<ResourceClaim>();
        let cache = ClaimCache::of(store, GpuDrivers::default());
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(claim("c1")));
        let early = tokio::time::timeout(std::time::Duration::from_millis(50), cache.wait_ready()).await;
        assert!(early.is_err(), "ready before the list is complete: a pass could drain blind to claims");
        writer.apply_watcher_event(&watcher::Event::InitDone);
        tokio::time::timeout(std::time::Duration::from_secs(5), cache.wait_ready()).await.expect("ready once listed");
        let index = cache.index();
        assert!(tessera_planner::gpu_use::gpu_use(&bound_pod(), &index).devices.len() == 1, "{index:?}");
    }

    /// An API server: discovery of `resource.k8s.io/v1` answers `discovery` (404: not served),
    /// a list of claims answers `list` (the claim c1) and a watch never answers.
    fn api(discovery: u16, list: u16) -> Client {
        let served = crate::controller::fake_dra_api::Served {
            plural: "resourceclaims",
            singular: "resourceclaim",
            kind: "ResourceClaim",
            namespaced: true,
            items: json!([serde_json::to_value(claim("c1")).unwrap()]),
        };
        crate::controller::fake_dra_api::api(served, discovery, list)
    }

    #[tokio::test]
    async fn started_the_cache_holds_the_listed_claims_and_is_not_ready_while_it_cannot_list() {
        let within = |s: u64| std::time::Duration::from_millis(s);
        let cache = ClaimCache::start(api(200, 200), GpuDrivers::default());
        tokio::time::timeout(within(5000), cache.wait_ready()).await.expect("ready once listed");
        assert_eq!(tessera_planner::gpu_use::gpu_use(&bound_pod(), &cache.index()).devices.len(), 1);
        // Served but not listable (the RBAC rule missing): no pass may run blind to claims.
        let forbidden = ClaimCache::start(api(200, 403), GpuDrivers::default());
        assert!(tokio::time::timeout(within(300), forbidden.wait_ready()).await.is_err());
        // Not served at all: no claim can exist.
        let none = ClaimCache::start(api(404, 500), GpuDrivers::default());
        tokio::time::timeout(within(5000), none.wait_ready()).await.expect("ready without the API");
        assert!(none.store.state().is_empty());
    }

    #[tokio::test]
    async fn without_the_api_the_cache_is_ready_and_empty() {
        let (store, writer) = reflector::store::<ResourceClaim>();
        let cache = ClaimCache::of(store, GpuDrivers::default());
        mark_synced_empty::<ResourceClaim>(writer);
        tokio::time::timeout(std::time::Duration::from_secs(5), cache.wait_ready()).await.expect("ready");
        assert!(cache.store.state().is_empty());
    }

    #[test]
    fn a_trimmed_claim_keeps_what_gpu_use_reads() {
        let mut c = claim("c1");
        trim_claim(&mut c);
        let requests = c.spec.as_ref().and_then(|s| s.devices.as_ref()).and_then(|d| d.requests.as_ref()).unwrap();
        let class = requests[0].exactly.as_ref().map(|e| e.device_class_name.as_str());
        assert_eq!(class, Some("mig.nvidia.com"), "the request's class stays for the quotas");
        let status = c.status.as_ref().unwrap();
        assert!(status.devices.is_none() && status.reserved_for.is_none() && c.metadata.managed_fields.is_none());
        let index = ClaimIndex::new([&c], &GpuDrivers::default());
        assert_eq!(tessera_planner::gpu_use::gpu_use(&bound_pod(), &index).devices.len(), 1);
    }

    /// The quotas count an unallocated claim at its most (`quota::unallocated`): the cache keeps
    /// each request's mode, count and admin access, and each `firstAvailable` sub-request's.
    #[test]
    fn a_trimmed_claim_keeps_what_the_quotas_count_an_unallocated_one_by() {
        let mut c: ResourceClaim = serde_json::from_value(json!({"metadata": {"name": "s", "namespace": "x"},
            "spec": {"devices": {"requests": [
                {"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All",
                    "adminAccess": false, "selectors": [{"cel": {"expression": "true"}}]}},
                {"name": "f", "firstAvailable": [{"name": "a", "deviceClassName": "mig.nvidia.com",
                    "allocationMode": "ExactCount", "count": 3}]}]}}}))
        .unwrap();
        trim_claim(&mut c);
        let requests = c.spec.as_ref().and_then(|s| s.devices.as_ref()).and_then(|d| d.requests.as_ref()).unwrap();
        let e = requests[0].exactly.as_ref().unwrap();
        assert_eq!(
            (e.allocation_mode.as_deref(), e.admin_access, e.selectors.is_none()),
            (Some("All"), Some(false), true)
        );
        let sub = &requests[1].first_available.as_ref().unwrap()[0];
        assert_eq!(
            (sub.device_class_name.as_str(), sub.allocation_mode.as_deref(), sub.count),
            ("mig.nvidia.com", Some("ExactCount"), Some(3))
        );
    }
}
