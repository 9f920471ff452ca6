//! The reconcile loop: observe the GPUs and the node's `GpuNode`, plan each GPU (pure), act one
//! driver call at a time, and write one status at the end. No state is kept between passes, so
//! the agent can be killed at any point and the next pass re-plans from what the GPUs hold.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use tessera_crds::GpuNode;
use tessera_crds::activity::DevicePod;
use tessera_crds::catalog::mig_resource_name;
use tessera_crds::gpunode::{ACTIVITY_CURRENT_UNTIL, ACTIVITY_FAILING_SINCE, AGENT_LEASE_NAMESPACE, NodePhase};
use tessera_crds::solver::ProfileCounts;
use tracing::{info, warn};

mod activity_pass;

use crate::Error;
use crate::backend::{GpuBackend, ModeChange, model_from_hardware};
use crate::gpu_clients::{self, pause};
use crate::planner::{self, Blocked, Observed, Step, Target};
use crate::report::{self, GpuOutcome};

/// The field manager for everything the agent writes.
pub const MANAGER: &str = "tessera-node-agent";

// Memory in use in a MIG device with no process above this is leaked (shared with the activity
// report and the operator; see its doc).
use tessera_crds::activity::LEAK_THRESHOLD_MIB;

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
    /// ResourceSlices list the new MIG devices ([`gpu_clients::DRA_KUBELET_PLUGIN_SELECTOR`]).
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

    /// One pass. Returns the outcome per GPU of the intent.
    pub async fn reconcile(&mut self) -> Result<Vec<(u32, GpuOutcome)>, Error> {
        let api: Api<GpuNode> = Api::all(self.client.clone());
        let gn = match api.get_opt(&self.node).await? {
            Some(gn) => gn,
            None => {
                // Register the node so the operator can see its inventory; the spec is the operator's.
                // Owned by the Node: the garbage collector removes it when the node leaves.
                let node = Api::<Node>::all(self.client.clone()).get(&self.node).await?;
                let owner = json!({"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": node.metadata.uid});
                let body = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
                                  "metadata": {"name": self.node, "ownerReferences": [owner]}, "spec": {}});
                api.patch(&self.node, &PatchParams::apply(MANAGER), &Patch::Apply(&body)).await?
            }
        };
        // A GpuNode recreated, or its summary removed, while this agent ran: the activity pass
        // writes it again even with nothing new.
        self.activity.check_stored(&gn);
        let generation = gn.metadata.generation;
        let intent = gn.spec.gpus.clone();
        // The operator's hand-over: the node is drained for this change. Without it only
        // non-disruptive steps run (creating instances in free space, as after a reboot).
        let handed_over =
            gn.status.as_ref().and_then(|s| s.rollout.as_ref()).is_some_and(|r| r.phase == NodePhase::Applying);
        // A MIG mode change on the handed-over node first stops the GPU clients (deploy labels);
        // `hold` says why it still waits for them. A pause that fails leaves the change as before.
        let mut paused = gn.annotations().get(pause::PAUSED_FOR).cloned();
        let hold = match self.gpu_client_selector.clone() {
            Some(selector) if handed_over => {
                self.pause_gpu_clients(&mut paused, &intent, &selector).await.unwrap_or_else(|e| {
                    warn!(error = %e, "could not pause the GPU clients; changing the MIG mode without it");
                    None
                })
            }
            _ => None,
        };
        let (outcomes, changed) =
            tokio::task::block_in_place(|| self.apply_held(&intent, handed_over, hold.as_deref()));
        let inventory = tokio::task::block_in_place(|| self.backend.inventory())?;
        let mut gpus = Vec::new();
        let mut all_instances = Vec::new();
        for info in &inventory {
            let instances = if info.mig_enabled {
                tokio::task::block_in_place(|| self.backend.instances(info.index))?
            } else {
                vec![]
            };
            // Boards the catalog lacks: report the driver's table so the operator can validate plans.
            let table = if info.mig_capable && tessera_crds::catalog::lookup(&info.product).is_none() {
                tokio::task::block_in_place(|| self.backend.profiles(info.index))?
            } else {
                vec![]
            };
            gpus.push(report::gpu_state(info, &instances, &table));
            all_instances.push((info.clone(), instances));
        }
        let previous = gn.status.clone().unwrap_or_default();
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let (conditions, applied) =
            report::conditions(&previous.conditions, &outcomes, generation, previous.observed_generation, now);
        let status = json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
            "status": {"observedGeneration": applied, "gpus": gpus, "conditions": conditions}
        });
        api.patch_status(&self.node, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&status)).await?;
        if self.advertise_resources {
            self.advertise(&all_instances).await?;
        }
        let selectors =
            gpu_clients::restart_selectors(self.gpu_client_selector.as_deref(), self.dra_plugin_selector.as_deref());
        if !selectors.is_empty() {
            // Level-triggered: what the clients were last restarted for is on the GpuNode, so a
            // restart lost to a kill right after a driver step is redone by the next pass.
            let now = gpu_clients::fingerprint(&all_instances);
            let recorded = gn.annotations().get(gpu_clients::RESTARTED_FOR).map(String::as_str);
            let restart = gpu_clients::must_restart(recorded, &now, changed);
            if restart {
                for selector in &selectors {
                    self.restart_gpu_clients(selector).await?;
                }
            }
            if restart || recorded != Some(now.as_str()) {
                let patch = json!({"metadata": {"annotations": {gpu_clients::RESTARTED_FOR: now}}});
                api.patch(&self.node, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            }
        }
        // Level-triggered: any pass that finds a pause and no mode change left to make (done, or
        // the hand-over withdrawn) undoes it, after the restart above, so the clients come back
        // to the new MIG devices.
        if let Some(record) = &paused
            && !(handed_over && pause::mode_change_pending(&inventory, &intent))
        {
            self.resume_gpu_clients(record).await?;
        }
        Ok(outcomes)
    }

    /// [`Self::apply_held`] with nothing held.
    #[cfg(test)]
    pub(crate) fn apply(
        &mut self,
        intent: &[tessera_crds::gpunode::GpuIntent],
        handed_over: bool,
    ) -> (Vec<(u32, GpuOutcome)>, bool) {
        self.apply_held(intent, handed_over, None)
    }

    /// Brings every GPU of the intent to its target; returns the outcomes and whether the GPU
    /// clients must restart: a GPU changed (they re-enumerate), or a MIG mode change found the
    /// GPU held (they let go; the next pass retries). A pass that changes nothing restarts nobody.
    /// While `hold` (why) is set the GPU clients are still stopping: a GPU whose MIG mode must
    /// change changes nothing and waits.
    pub(crate) fn apply_held(
        &mut self,
        intent: &[tessera_crds::gpunode::GpuIntent],
        handed_over: bool,
        hold: Option<&str>,
    ) -> (Vec<(u32, GpuOutcome)>, bool) {
        let mut outcomes = Vec::new();
        let mut changed = false;
        let inventory = match self.backend.inventory() {
            Ok(i) => i,
            Err(e) => {
                return (
                    intent.iter().map(|g| (g.index as u32, GpuOutcome::Failed { message: e.to_string() })).collect(),
                    false,
                );
            }
        };
        for want in intent {
            let gpu = want.index as u32;
            let Some(info) = inventory.iter().find(|i| i.index == gpu) else {
                let message = format!("no GPU with index {gpu} on this node ({} GPUs)", inventory.len());
                outcomes.push((gpu, GpuOutcome::Blocked { reason: "GpuNotFound", message }));
                continue;
            };
            if want.mig_enabled && !info.mig_capable {
                let message = format!("{} is not MIG capable", info.product);
                outcomes.push((gpu, GpuOutcome::Blocked { reason: "MigNotSupported", message }));
                continue;
            }
            let target = Target {
                mig_enabled: want.mig_enabled,
                profiles: want
                    .profiles
                    .iter()
                    .filter(|(_, n)| **n > 0)
                    .map(|(k, n)| (k.clone(), *n as u32))
                    .collect::<ProfileCounts>(),
            };
            // `changed` only when a driver step really changed the GPU, or a MIG mode change found
            // the GPU held by its clients (restarting them lets go): never on a pass that changed
            // nothing (a blocked or failing GPU would make them flap).
            let mut ran = false;
            let outcome = match self.apply_gpu(info, &target, handed_over, hold, &mut ran) {
                Ok(()) => GpuOutcome::InSync,
                Err(o) => o,
            };
            changed |= ran;
            outcomes.push((gpu, outcome));
        }
        (outcomes, changed)
    }

    fn apply_gpu(
        &mut self,
        info: &crate::backend::GpuInfo,
        target: &Target,
        handed_over: bool,
        hold: Option<&str>,
        ran: &mut bool,
    ) -> Result<(), GpuOutcome> {
        let failed = |e: Error| GpuOutcome::Failed { message: e.to_string() };
        let gpu = info.index;
        let profiles = if info.mig_capable { self.backend.profiles(gpu).map_err(failed)? } else { vec![] };
        let model = model_from_hardware(&info.product, &profiles);
        let instances = if info.mig_enabled { self.backend.instances(gpu).map_err(failed)? } else { vec![] };
        let mut busy: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        let mut gpu_processes = Vec::new();
        for p in self.backend.processes(gpu).map_err(failed)? {
            match p.gpu_instance_id {
                Some(gi) => busy.entry(gi).or_default().push(p.pid),
                None => gpu_processes.push(p.pid),
            }
        }
        // Memory in use in an instance no process uses is held by a zombie context.
        let mut leaked = BTreeMap::new();
        for i in instances.iter().filter(|i| i.compute_instance_id.is_some() && !busy.contains_key(&i.gpu_instance_id))
        {
            let used = self.backend.memory_used_mib(gpu, i.gpu_instance_id).map_err(failed)?;
            if used > LEAK_THRESHOLD_MIB {
                leaked.insert(i.gpu_instance_id, used);
            }
        }
        let observed = Observed {
            mig_enabled: info.mig_enabled,
            mig_pending: info.mig_pending,
            instances,
            busy,
            gpu_processes,
            leaked,
        };
        let steps = match planner::plan(model, &observed, target) {
            Ok(steps) => steps,
            Err(b) => {
                let reason = match &b {
                    Blocked::Busy(_) | Blocked::GpuBusy(_) => "InstanceInUse",
                    Blocked::NoFit(_) => "LayoutDoesNotFit",
                    Blocked::LeakedMemory(_) => "LeakedMemory",
                    Blocked::SplitComputeInstances(_) => "SplitComputeInstances",
                };
                let pids: Vec<u32> = match &b {
                    Blocked::Busy(list) => list.iter().flat_map(|(_, p)| p.iter().copied()).collect(),
                    Blocked::GpuBusy(p) => p.clone(),
                    _ => vec![],
                };
                let mut message = b.to_string();
                let named = if pids.is_empty() { Default::default() } else { self.pods_of(&pids) };
                if !named.is_empty() {
                    let list: Vec<String> = named.iter().map(|(pid, pod)| format!("PID {pid} is pod {pod}")).collect();
                    message.push_str(&format!("; {}", list.join(", ")));
                }
                return Err(GpuOutcome::Blocked { reason, message });
            }
        };
        // A half-made instance (no compute instance) is remade without the hand-over: nothing
        // can use it. Whoever made it (this agent before a crash, an admin's `-cgi` without `-C`)
        // loses only an unusable GPU instance; one that got its compute instance since this pass
        // read the GPU is refused by the driver. Beside a layout change everything waits.
        let disruptive = steps.iter().filter(|s| s.needs_hand_over()).count();
        if disruptive > 0 && !handed_over {
            return Err(GpuOutcome::Waiting {
                reason: "AwaitingDrain",
                message: format!(
                    "{disruptive} step(s) destroy instances or change MIG mode; waiting for the operator to drain \
                     the node and hand it over"
                ),
            });
        }
        if let Some(message) = hold
            && steps.iter().any(|s| matches!(s, Step::SetMigMode(_)))
        {
            return Err(GpuOutcome::Waiting { reason: "StoppingGpuClients", message: message.to_string() });
        }
        for step in &steps {
            if step.needs_hand_over() && !self.still_handed_over() {
                // The operator withdrew the hand-over (or the node is schedulable again) since
                // this pass began: stop before changing anything a workload could be using.
                return Err(GpuOutcome::Waiting {
                    reason: "AwaitingDrain",
                    message: "the hand-over was withdrawn mid-pass; nothing more is destroyed".into(),
                });
            }
            info!(gpu, ?step, "applying");
            match step {
                Step::Destroy { gpu_instance_id, .. } => {
                    self.backend.destroy_instance(gpu, *gpu_instance_id).map_err(failed)?
                }
                Step::DestroyHalfMade { gpu_instance_id, .. } => {
                    self.backend.destroy_half_made(gpu, *gpu_instance_id).map_err(failed)?
                }
                Step::Create { profile, start } => {
                    self.backend.create_instance(gpu, profile, *start).map_err(failed)?;
                }
                Step::SetMigMode(on) => {
                    let change = self.backend.set_mig_mode(gpu, *on).map_err(|e| {
                        // nvml.h: "idle the device and retry": the GPU clients hold it.
                        *ran |= matches!(e, Error::InUse(_));
                        failed(e)
                    })?;
                    if change == ModeChange::ResetRequired {
                        return Err(GpuOutcome::Blocked {
                            reason: "ResetRequired",
                            message: format!(
                                "MIG mode change to {} needs a GPU reset or node reboot",
                                if *on { "enabled" } else { "disabled" }
                            ),
                        });
                    }
                }
            }
            // Only a step that succeeded changed the GPU (a failed NVML call changes nothing).
            *ran = true;
        }
        Ok(())
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
