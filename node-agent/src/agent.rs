//! The reconcile loop: observe the GPUs and the node's `GpuNode`, plan each GPU (pure), act one
//! driver call at a time, and write one status at the end. No state is kept between passes, so
//! the agent can be killed at any point and the next pass re-plans from what the GPUs hold.
//! The pass's steps are in `reconcile`, each GPU's in `apply`, the activity pass in
//! `activity_pass`.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use tessera_crds::GpuNode;
use tessera_crds::activity::DevicePod;
use tessera_crds::catalog::mig_resource_name;
use tessera_crds::gpunode::{ACTIVITY_CURRENT_UNTIL, ACTIVITY_FAILING_SINCE, AGENT_LEASE_NAMESPACE, NodePhase};
use tracing::{info, warn};

mod activity_pass;
mod apply;
mod reconcile;

use crate::Error;
use crate::backend::GpuBackend;
use crate::gpu_clients::pause;

/// The field manager for everything the agent writes.
pub const MANAGER: &str = "tessera-node-agent";

pub struct Agent<B: GpuBackend> {
    pub backend: B,
    pub client: Client,
    pub node: String,
    /// Play the NVIDIA device plugin: advertise `nvidia.com/mig-*` on the Node (simulation only).
    pub advertise_resources: bool,
    /// Pods on this node to restart after a change so they re-enumerate MIG devices (device
    /// plugin, feature discovery, DCGM exporter). Empty: none.
    pub gpu_client_selector: Option<String>,
    /// NVIDIA's DRA kubelet plugin pods on this node, restarted with the GPU clients so the
    /// ResourceSlices list the new MIG devices ([`crate::gpu_clients::DRA_KUBELET_PLUGIN_SELECTOR`]).
    pub dra_plugin_selector: Option<String>,
    /// How long the heartbeat lease stays valid; it is renewed four times per duration.
    pub lease_duration: Duration,
    /// Allocated versus used: the devices' activity, sampled and written apart from the passes.
    pub activity: crate::activity::writer::Writer,
}

#[cfg(test)]
impl<B: GpuBackend> Agent<B> {
    /// An agent for tests that drive `apply` only (inside a multi-thread runtime, from
    /// `block_in_place`): its API server answers only the hand-over re-check, with its node
    /// handed over (`Applying`) and cordoned.
    pub(crate) fn offline(backend: B) -> Self {
        let server = tower::service_fn(|req: http::Request<kube::client::Body>| async move {
            let path = req.uri().path().to_string();
            let body = if path.ends_with("/gpunodes/test") {
                json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "metadata": {"name": "test"},
                       "spec": {}, "status": {"rollout": {"phase": "Applying", "plan": "test"}}})
            } else if path.ends_with("/nodes/test") {
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "test"}, "spec": {"unschedulable": true}})
            } else {
                return Err(std::io::Error::other(format!("no {path} in this test")));
            };
            Ok(http::Response::new(kube::client::Body::from(body.to_string().into_bytes())))
        });
        Agent {
            backend,
            client: Client::new(server, "default"),
            node: "test".into(),
            advertise_resources: false,
            gpu_client_selector: None,
            dra_plugin_selector: None,
            lease_duration: Duration::from_secs(40),
            activity: Default::default(),
        }
    }
}

impl<B: GpuBackend> Agent<B> {
    /// Runs until the process is stopped: a pass on every change of this node's `GpuNode`, and
    /// at least every `resync`.
    pub async fn run(mut self, resync: Duration) -> Result<(), Error> {
        let api: Api<GpuNode> = Api::all(self.client.clone());
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.node));
        let mut events = watcher(api, config).boxed();
        let mut tick = tokio::time::interval(resync);
        // The heartbeat shares this loop with the reconcile passes: an agent stuck in a driver
        // call stops renewing, and the operator sees it as not responding.
        let mut heartbeat = tokio::time::interval(self.lease_duration / 4);
        let mut activity = tokio::time::interval(self.activity.sample_interval);
        loop {
            tokio::select! {
                _ = activity.tick() => {
                    if let Err(e) = self.sample_activity().await {
                        warn!(error = %e, "activity sample failed; retrying on the next one");
                    }
                    continue;
                }
                ev = events.next() => match ev {
                    Some(Err(e)) => warn!(error = %e, "watch error; the watcher retries"),
                    None => return Ok(()),
                    Some(Ok(_)) => {}
                },
                _ = tick.tick() => {}
                _ = heartbeat.tick() => {
                    if let Err(e) = self.renew_lease().await {
                        warn!(error = %e, "could not renew the heartbeat lease; retrying");
                    }
                    continue;
                }
            }
            if let Err(e) = self.reconcile().await {
                warn!(error = %e, "reconcile failed; retrying on the next event or resync");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }

    /// The pods behind PIDs, from their cgroups and this node's pods (empty where the PID
    /// namespace or the API does not tell). Called from blocking code inside `block_in_place`.
    pub(crate) fn pods_of(&self, pids: &[u32]) -> BTreeMap<u32, DevicePod> {
        self.try_pods_of(pids).unwrap_or_default()
    }

    /// [`Self::pods_of`], failing when the pods cannot be listed. The list is served from the API
    /// server's watch cache (`resourceVersion=0`), not etcd: a pod running a GPU process was
    /// bound (and cached) before its containers started.
    pub(crate) fn try_pods_of(&self, pids: &[u32]) -> Result<BTreeMap<u32, DevicePod>, Error> {
        let lp = ListParams::default().fields(&format!("spec.nodeName={}", self.node)).match_any();
        let pods = tokio::runtime::Handle::current().block_on(Api::<Pod>::all(self.client.clone()).list(&lp))?;
        let by_uid = pods
            .items
            .iter()
            .filter_map(|p| {
                let uid = p.metadata.uid.clone()?;
                Some((uid.clone(), DevicePod { namespace: p.namespace()?, name: p.name_any(), uid }))
            })
            .collect();
        Ok(crate::pods::pods_of(pids, &by_uid, &self.activity.proc_root))
    }

    /// Re-reads, right before a disruptive driver call, that the node is still handed over
    /// (`Applying`) and cordoned. Called from blocking code inside `block_in_place`.
    fn still_handed_over(&self) -> bool {
        let handle = tokio::runtime::Handle::current();
        let gn = handle.block_on(Api::<GpuNode>::all(self.client.clone()).get(&self.node));
        let node = handle.block_on(Api::<Node>::all(self.client.clone()).get(&self.node));
        let applying = gn.ok().and_then(|g| g.status?.rollout).is_some_and(|r| r.phase == NodePhase::Applying);
        let cordoned = node.ok().and_then(|n| n.spec?.unschedulable).unwrap_or(false);
        applying && cordoned
    }

    /// Sets the node's `nvidia.com/mig-*` and `nvidia.com/gpu` capacity from the instances, and
    /// removes stale ones, as the device plugin's mixed strategy would.
    async fn advertise(&self, gpus: &[(crate::backend::GpuInfo, Vec<crate::backend::Instance>)]) -> Result<(), Error> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = nodes.get(&self.node).await?;
        let mut counts: BTreeMap<String, u32> = BTreeMap::new();
        for (info, instances) in gpus {
            if info.mig_enabled {
                // A GPU instance without its compute instance is no MIG device yet.
                for i in instances.iter().filter(|i| i.compute_instance_id.is_some()) {
                    *counts.entry(mig_resource_name(&i.profile)).or_default() += 1;
                }
            } else {
                *counts.entry("nvidia.com/gpu".to_string()).or_default() += 1;
            }
        }
        let mut resources = serde_json::Map::new();
        let current = node.status.and_then(|s| s.capacity).unwrap_or_default();
        for key in current.keys().filter(|k| k.starts_with("nvidia.com/mig-") || *k == "nvidia.com/gpu") {
            resources.insert(key.clone(), serde_json::Value::Null);
        }
        for (k, v) in counts {
            resources.insert(k, json!(v.to_string()));
        }
        let patch = json!({"status": {"capacity": resources, "allocatable": resources}});
        nodes.patch_status(&self.node, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        Ok(())
    }

    /// Renews (or creates) this node's heartbeat Lease in [`AGENT_LEASE_NAMESPACE`].
    /// The first renewal of a run reads what the previous run left on it first
    /// ([`Agent::previous_run`]): the apply overwrites it.
    pub async fn renew_lease(&mut self) -> Result<(), Error> {
        self.previous_run().await?;
        let api: Api<Lease> = Api::namespaced(self.client.clone(), AGENT_LEASE_NAMESPACE);
        // Whether the activity report is current rides on the renewal (see
        // `ACTIVITY_FAILING_SINCE`): applied while failing, left out (so removed) once current.
        // `ACTIVITY_CURRENT_UNTIL` always: without it the next run would trust `renewTime`.
        let until = self.activity.current_until().map_or_else(|| "unknown".to_string(), |t| t.to_string());
        let mut metadata = json!({"name": self.node, "annotations": {ACTIVITY_CURRENT_UNTIL: until}});
        if let Some(since) = self.activity.failing_since(k8s_openapi::jiff::Timestamp::now()) {
            metadata["annotations"][ACTIVITY_FAILING_SINCE] = json!(since.to_string());
        }
        let body = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": metadata,
            "spec": {"holderIdentity": self.node, "leaseDurationSeconds": self.lease_duration.as_secs().max(1),
                     "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now())}});
        api.patch(&self.node, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&body)).await?;
        Ok(())
    }

    /// This node's GPU client pods (terminating ones too: they may still hold the GPU).
    async fn gpu_client_pods(&self, selector: &str) -> Result<Vec<Pod>, Error> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let lp = ListParams::default().labels(selector).fields(&format!("spec.nodeName={}", self.node));
        Ok(pods.list(&lp).await?.items)
    }

    /// Before a MIG mode change: records the deploy labels on the `GpuNode` (`paused`, the
    /// annotation's text, is updated), then pauses them. Returns why the change must still wait:
    /// client pods left on the node, within [`pause::WAIT_LIMIT`]. Nothing to pause: `None`.
    async fn pause_gpu_clients(
        &mut self,
        paused: &mut Option<String>,
        intent: &[tessera_crds::gpunode::GpuIntent],
        selector: &str,
    ) -> Result<Option<String>, Error> {
        let inventory = tokio::task::block_in_place(|| self.backend.inventory())?;
        if !pause::mode_change_pending(&inventory, intent) {
            return Ok(None);
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        let labels = nodes.get(&self.node).await?.metadata.labels.unwrap_or_default();
        let now = k8s_openapi::jiff::Timestamp::now();
        let existing = paused.as_deref().map(pause::Record::parse);
        let record = match existing {
            Some(Ok(record)) => record,
            other => {
                if let Some(Err(e)) = &other {
                    warn!(error = %e, "rewriting the pause record (labels still paused are restored to true)");
                }
                // An unreadable record still marks a pause: a fresh one keeps it, and its clock.
                let fresh = pause::Record::of(&labels, now)
                    .or_else(|| other.is_some().then(|| pause::Record { since: now, labels: Default::default() }));
                let Some(fresh) = fresh else { return Ok(None) };
                // The record first: a kill before the labels change leaves nothing to undo wrongly.
                let text = fresh.to_json();
                let patch = json!({"metadata": {"annotations": {pause::PAUSED_FOR: text}}});
                Api::<GpuNode>::all(self.client.clone())
                    .patch(&self.node, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                *paused = Some(text);
                fresh
            }
        };
        let writes = pause::pause_patch(&labels);
        if !writes.is_empty() {
            info!(labels = ?writes.keys().collect::<Vec<_>>(), "pausing the GPU clients for a MIG mode change");
            let patch = json!({"metadata": {"labels": writes}});
            nodes.patch(&self.node, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
        let left = self.gpu_client_pods(selector).await?;
        if !pause::must_wait(left.len(), record.since, now) {
            return Ok(None);
        }
        let names: Vec<String> =
            left.iter().map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any())).collect();
        Ok(Some(format!(
            "waiting for the GPU clients to stop before the MIG mode change (their nvidia.com/gpu.deploy.* labels are \
             paused): {} left",
            names.join(", ")
        )))
    }

    /// Undoes a pause: labels still paused get their recorded values back (one found `false`
    /// stays), then the record goes.
    async fn resume_gpu_clients(&self, record: &str) -> Result<(), Error> {
        let record =
            pause::Record::parse(record).map_err(|e| warn!(error = %e, "restoring paused labels to true")).ok();
        let nodes: Api<Node> = Api::all(self.client.clone());
        let labels = nodes.get(&self.node).await?.metadata.labels.unwrap_or_default();
        let writes = pause::restore_patch(record.as_ref(), &labels);
        if !writes.is_empty() {
            info!(labels = ?writes, "resuming the GPU clients");
            let patch = json!({"metadata": {"labels": writes}});
            nodes.patch(&self.node, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
        let patch = json!({"metadata": {"annotations": {pause::PAUSED_FOR: null}}});
        Api::<GpuNode>::all(self.client.clone())
            .patch(&self.node, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    async fn restart_gpu_clients(&self, selector: &str) -> Result<(), Error> {
        for p in self.gpu_client_pods(selector).await? {
            let ns = p.namespace().unwrap_or_default();
            info!(pod = %p.name_any(), namespace = %ns, "restarting GPU client to re-enumerate MIG devices");
            Api::<Pod>::namespaced(self.client.clone(), &ns).delete(&p.name_any(), &DeleteParams::default()).await?;
        }
        Ok(())
    }
}
