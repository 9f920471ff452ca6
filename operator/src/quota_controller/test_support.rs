//! Test doubles for the quota controller: a controller over stores the test fills, a client
//! whose fake API server records each request, caches filled from a list, and the fixtures the
//! controller tests build on.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, ResourceQuota};
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use serde_json::json;
use tessera_crds::TenantGpuQuota;
use tessera_planner::dra::GpuDrivers;
use tessera_planner::idle::gate::Verdicts;
use tessera_planner::quota::stamp::{IN_FORCE_SINCE, format};
use tessera_planner::quota::{quota_label_value, resource_quota_name};
use tokio::sync::Notify;

use super::QuotaController;
use crate::controller::claims::ClaimCache;
use crate::controller::dra::DraWatch;
use crate::leader::Tenure;
use crate::metrics::Metrics;

impl QuotaController {
    /// A controller over stores filled by the caller (tests), not by watches. What it shares
    /// with the rollout controller starts empty: no Node, claim or slice, no verdicts published,
    /// a tenure that always holds (as without leader election).
    pub(crate) fn from_stores(
        client: kube::Client,
        quotas: Store<TenantGpuQuota>,
        rqs: Store<ResourceQuota>,
        namespaces: Store<Namespace>,
    ) -> Self {
        let (metrics, changed) = (Arc::new(Metrics::default()), Arc::new(Notify::new()));
        Self {
            client,
            admission: super::QuotaAdmission::Params,
            open: tessera_planner::quota::gates::open::OpenNamespaces::parse(
                tessera_planner::quota::gates::open::DEFAULT_OPEN,
            )
            .expect("the default open list"),
            gates: reflector::store().0,
            gpu_pods: reflector::store().0,
            metrics,
            quotas,
            rqs,
            namespaces,
            gpunodes: reflector::store().0,
            classes: reflector::store().0,
            drivers: GpuDrivers::default(),
            namespace: "tessera-system".into(),
            policy_params: reflector::store().0,
            changed,
            fleet_changed: Arc::new(Notify::new()),
            dra: DraWatch::of(reflector::store().0, GpuDrivers::default()),
            nodes: reflector::store().0,
            claims: ClaimCache::of(reflector::store().0, GpuDrivers::default()),
            not_reporting: Default::default(),
            idle: Default::default(),
            idle_failed: Default::default(),
            binding_problem: Default::default(),
            pods: {
                // Listed and empty: tests that want it unlisted replace it.
                let (pods, mut writer) = reflector::store();
                writer.apply_watcher_event(&watcher::Event::InitDone);
                pods
            },
            pods_unlisted: Default::default(),
            deleted: Default::default(),
            tenure: Default::default(),
        }
    }

    /// [`Self::from_stores`] with the cluster's DeviceClasses and policy params ConfigMap (tests).
    pub(crate) fn with_dra(mut self, classes: Store<DeviceClass>, policy_params: Store<ConfigMap>) -> Self {
        (self.classes, self.policy_params) = (classes, policy_params);
        self
    }

    /// With the rollout controller's ResourceClaim cache.
    pub(crate) fn with_claims(mut self, claims: ClaimCache) -> Self {
        self.claims = claims;
        self
    }

    /// With the rollout controller's Node cache.
    pub(crate) fn with_nodes(mut self, nodes: Store<Node>) -> Self {
        self.nodes = nodes;
        self
    }

    /// With the verdicts the rollout controller published.
    pub(crate) fn with_not_reporting(mut self, verdicts: Verdicts) -> Self {
        self.not_reporting = verdicts;
        self
    }

    /// In gates mode, with the cached gates and GPU pods.
    pub(crate) fn with_gates(
        mut self,
        gates: Store<tessera_crds::gate::GpuQuotaGate>,
        gpu_pods: Store<k8s_openapi::api::core::v1::Pod>,
    ) -> Self {
        (self.admission, self.gates, self.gpu_pods) = (super::QuotaAdmission::Gates, gates, gpu_pods);
        self
    }

    /// With the leader tenure the rollout controller follows.
    pub(crate) fn with_tenure(mut self, tenure: Arc<Tenure>) -> Self {
        self.tenure = tenure;
        self
    }
}

/// What the fake API server was asked: (method, path, body).
pub(crate) type Requests = std::sync::Arc<std::sync::Mutex<Vec<(String, String, serde_json::Value)>>>;

/// A client whose fake API server records each request and answers it with `answer(method, path,
/// body)` (`(code, body)`), else by default: a quota status write gets a `TenantGpuQuota` back,
/// every other request its own body.
pub(crate) fn recording_api<F>(answer: F) -> (kube::Client, Requests)
where
    F: Fn(&str, &str, &serde_json::Value) -> Option<(u16, serde_json::Value)> + Clone + Send + 'static,
{
    let requests = Requests::default();
    let seen = requests.clone();
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let (seen, answer) = (seen.clone(), answer.clone());
        async move {
            let (parts, body) = req.into_parts();
            let body: serde_json::Value =
                serde_json::from_slice(&body.collect_bytes().await.unwrap()).unwrap_or_default();
            let (method, path) = (parts.method.to_string(), parts.uri.path().to_string());
            seen.lock().unwrap().push((method.clone(), path.clone(), body.clone()));
            let (code, answer) = answer(&method, &path, &body).unwrap_or_else(|| {
                if path.ends_with("/status") {
                    (
                        200,
                        json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
                                 "metadata": {"name": "q"}, "spec": {"namespaces": [], "hard": {}}}),
                    )
                } else {
                    (200, body)
                }
            });
            let bytes = serde_json::to_vec(&answer).unwrap();
            Ok::<_, std::convert::Infallible>(
                http::Response::builder().status(code).body(kube::client::Body::from(bytes)).unwrap(),
            )
        }
    });
    (kube::Client::new(service, "default"), requests)
}

/// The answer to a DELETE: success.
pub(crate) fn deleted() -> (u16, serde_json::Value) {
    (200, json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}))
}

/// A client whose API server refuses every ResourceQuota write in namespace `locked` (as an
/// admission policy would) and accepts everything else, recording each request.
pub(crate) fn api_refusing_writes_in_locked() -> (kube::Client, Requests) {
    recording_api(|method, path, _| {
        if path.contains("/namespaces/locked/") && method == "PATCH" {
            Some((
                422,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 422,
                         "reason": "Invalid", "message": "denied by policy lock-quotas"}),
            ))
        } else {
            (method == "DELETE").then(deleted)
        }
    })
}

pub(crate) fn store_of<K>(objects: Vec<K>) -> kube::runtime::reflector::Store<K>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, mut writer) = kube::runtime::reflector::store();
    for o in objects {
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(o));
    }
    store
}

/// A TenantGpuQuota `name` with `spec`, at generation 1.
pub(crate) fn quota(name: &str, spec: serde_json::Value) -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": name, "generation": 1, "uid": format!("uid-{name}")}, "spec": spec}))
    .unwrap()
}

/// A ResourceQuota as Tessera writes it for `quota` in `ns`.
pub(crate) fn ours(quota: &str, ns: &str, used: &str) -> ResourceQuota {
    serde_json::from_value(json!({"metadata": {"name": resource_quota_name(quota), "namespace": ns,
        "labels": {"tessera.dev/quota": quota_label_value(quota)},
        "ownerReferences": [{"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "name": quota,
                             "uid": format!("uid-{quota}"), "controller": true}]},
        "spec": {"hard": {"requests.nvidia.com/mig-1g.10gb": "4"}},
        "status": {"used": {"requests.nvidia.com/mig-1g.10gb": used}}}))
    .unwrap()
}

/// `rq` as a previous pass left it once its limits were in force: stamped at its creation (or,
/// with none, a fixed time before the tests' `now`).
pub(crate) fn stamped(mut rq: ResourceQuota) -> ResourceQuota {
    let at = rq.metadata.creation_timestamp.as_ref().map_or("2026-05-01T00:00:00Z".to_string(), |c| format(c.0));
    rq.metadata.annotations.get_or_insert_default().insert(IN_FORCE_SINCE.into(), at);
    rq
}
