//! One reconcile pass, in steps run in turn: read the node's `GpuNode` into the pass's inputs
//! (`read_inputs`, registering it when missing), stop the GPU clients before a MIG mode change
//! (`hold_for_mode_change`), plan and act on each GPU (`apply_held`, see `apply`), read back what
//! the GPUs hold (`read_gpus`), write the status once (`write_status`), then advertise the MIG
//! devices, restart the GPU clients (`restart_gpu_clients_if_due`) and resume them
//! (`resume_gpu_clients_if_done`).

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tessera_crds::GpuNode;
use tessera_crds::gpunode::{GpuIntent, GpuState, NodePhase};
use tracing::warn;

use super::{Agent, MANAGER};
use crate::Error;
use crate::backend::{GpuBackend, GpuInfo, Instance};
use crate::gpu_clients::{self, pause};
use crate::report::{self, GpuOutcome};

/// What a pass reads of its node's `GpuNode` before it acts.
struct PassInputs {
    /// The node's `GpuNode` as the pass began (registered by it when missing).
    gpunode: GpuNode,
    /// What the operator asks of each GPU.
    intent: Vec<GpuIntent>,
    /// The operator's hand-over: the node is drained for this change. Without it only
    /// non-disruptive steps run (creating instances in free space, as after a reboot).
    handed_over: bool,
    /// The GPU clients' pause record (`pause::PAUSED_FOR`), updated when this pass pauses them.
    paused: Option<String>,
}

/// What the GPUs hold once the pass has acted.
struct GpusHeld {
    inventory: Vec<GpuInfo>,
    /// Each GPU as the status reports it.
    gpus: Vec<GpuState>,
    /// Each GPU with its instances (none with MIG off).
    instances: Vec<(GpuInfo, Vec<Instance>)>,
}

impl<B: GpuBackend> Agent<B> {
    /// One pass. Returns the outcome per GPU of the intent.
    pub async fn reconcile(&mut self) -> Result<Vec<(u32, GpuOutcome)>, Error> {
        let api: Api<GpuNode> = Api::all(self.client.clone());
        let mut inputs = self.read_inputs(&api).await?;
        let hold = self.hold_for_mode_change(&mut inputs).await;
        let (outcomes, changed) =
            tokio::task::block_in_place(|| self.apply_held(&inputs.intent, inputs.handed_over, hold.as_deref()));
        let held = tokio::task::block_in_place(|| self.read_gpus())?;
        self.write_status(&api, &inputs.gpunode, &outcomes, &held.gpus).await?;
        if self.advertise_resources {
            self.advertise(&held.instances).await?;
        }
        self.restart_gpu_clients_if_due(&api, &inputs.gpunode, &held.instances, changed).await?;
        self.resume_gpu_clients_if_done(&inputs, &held.inventory).await?;
        Ok(outcomes)
    }

    /// Reads this node's `GpuNode` (registering it when missing) into the pass's inputs.
    async fn read_inputs(&mut self, api: &Api<GpuNode>) -> Result<PassInputs, Error> {
        let gpunode = match api.get_opt(&self.node).await? {
            Some(gn) => gn,
            None => self.register(api).await?,
        };
        // A GpuNode recreated, or its summary removed, while this agent ran: the activity pass
        // writes it again even with nothing new.
        self.activity.check_stored(&gpunode);
        let intent = gpunode.spec.gpus.clone();
        let handed_over =
            gpunode.status.as_ref().and_then(|s| s.rollout.as_ref()).is_some_and(|r| r.phase == NodePhase::Applying);
        let paused = gpunode.annotations().get(pause::PAUSED_FOR).cloned();
        Ok(PassInputs { gpunode, intent, handed_over, paused })
    }

    /// Registers the node so the operator can see its inventory; the spec is the operator's.
    /// Owned by the Node: the garbage collector removes it when the node leaves.
    async fn register(&self, api: &Api<GpuNode>) -> Result<GpuNode, Error> {
        let node = Api::<Node>::all(self.client.clone()).get(&self.node).await?;
        let owner = json!({"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": node.metadata.uid});
        let body = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
                          "metadata": {"name": self.node, "ownerReferences": [owner]}, "spec": {}});
        Ok(api.patch(&self.node, &PatchParams::apply(MANAGER), &Patch::Apply(&body)).await?)
    }

    /// A MIG mode change on the handed-over node first stops the GPU clients (deploy labels);
    /// returns why it still waits for them. A pause that fails leaves the change as before.
    async fn hold_for_mode_change(&mut self, inputs: &mut PassInputs) -> Option<String> {
        match self.gpu_client_selector.clone() {
            Some(selector) if inputs.handed_over => {
                self.pause_gpu_clients(&mut inputs.paused, &inputs.intent, &selector).await.unwrap_or_else(|e| {
                    warn!(error = %e, "could not pause the GPU clients; changing the MIG mode without it");
                    None
                })
            }
            _ => None,
        }
    }

    /// Reads back what the GPUs hold, for the status, the advertised resources and the GPU
    /// clients. Blocking: called inside `block_in_place`.
    fn read_gpus(&mut self) -> Result<GpusHeld, Error> {
        let inventory = self.backend.inventory()?;
        let mut gpus = Vec::new();
        let mut all_instances = Vec::new();
        for info in &inventory {
            let instances = if info.mig_enabled { self.backend.instances(info.index)? } else { vec![] };
            // Boards the catalog lacks: report the driver's table so the operator can validate plans.
            let table = if info.mig_capable && tessera_crds::catalog::lookup(&info.product).is_none() {
                self.backend.profiles(info.index)?
            } else {
                vec![]
            };
            gpus.push(report::gpu_state(info, &instances, &table));
            all_instances.push((info.clone(), instances));
        }
        Ok(GpusHeld { inventory, gpus, instances: all_instances })
    }

    /// The pass's one status write: the GPUs as they are, and the conditions the outcomes come to.
    async fn write_status(
        &self,
        api: &Api<GpuNode>,
        gpunode: &GpuNode,
        outcomes: &[(u32, GpuOutcome)],
        gpus: &[GpuState],
    ) -> Result<(), Error> {
        let previous = gpunode.status.clone().unwrap_or_default();
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let (conditions, applied) = report::conditions(
            &previous.conditions,
            outcomes,
            gpunode.metadata.generation,
            previous.observed_generation,
            now,
        );
        let status = json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
            "status": {"observedGeneration": applied, "gpus": gpus, "conditions": conditions}
        });
        api.patch_status(&self.node, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&status)).await?;
        Ok(())
    }

    /// Restarts the GPU clients when the pass changed a GPU or they were last restarted for other
    /// MIG devices, and records on the `GpuNode` what they are restarted for. Level-triggered:
    /// a restart lost to a kill right after a driver step is redone by the next pass.
    async fn restart_gpu_clients_if_due(
        &self,
        api: &Api<GpuNode>,
        gpunode: &GpuNode,
        instances: &[(GpuInfo, Vec<Instance>)],
        changed: bool,
    ) -> Result<(), Error> {
        let selectors =
            gpu_clients::restart_selectors(self.gpu_client_selector.as_deref(), self.dra_plugin_selector.as_deref());
        if selectors.is_empty() {
            return Ok(());
        }
        let now = gpu_clients::fingerprint(instances);
        let recorded = gpunode.annotations().get(gpu_clients::RESTARTED_FOR).map(String::as_str);
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
        Ok(())
    }

    /// Level-triggered: any pass that finds a pause and no mode change left to make (done, or
    /// the hand-over withdrawn) undoes it, after the restart, so the clients come back to the
    /// new MIG devices.
    async fn resume_gpu_clients_if_done(&self, inputs: &PassInputs, inventory: &[GpuInfo]) -> Result<(), Error> {
        if let Some(record) = &inputs.paused
            && !(inputs.handed_over && pause::mode_change_pending(inventory, &inputs.intent))
        {
            self.resume_gpu_clients(record).await?;
        }
        Ok(())
    }
}
