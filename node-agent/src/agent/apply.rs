//! Bringing each GPU of the intent to its target, one GPU at a time, in steps: read what the GPU
//! holds (`observe_gpu`), plan it (the pure [`planner::plan`]; a blocked plan becomes its outcome
//! in `blocked`), check that the steps may run now (`may_run`), then run them one driver call at
//! a time (`run_steps`).

use std::collections::BTreeMap;

use tessera_crds::catalog::GpuModel;
use tessera_crds::conditions::gpunode_reasons as reasons;
use tessera_crds::gpunode::GpuIntent;
use tessera_crds::solver::ProfileCounts;
use tracing::info;

use super::Agent;
use crate::Error;
use crate::backend::{GpuBackend, GpuInfo, Instance, ModeChange, model_from_hardware};
use crate::planner::{self, Blocked, Observed, Step, Target};
use crate::report::GpuOutcome;

// Memory in use in a MIG device with no process above this is leaked (shared with the activity
// report and the operator; see its doc).
use tessera_crds::activity::LEAK_THRESHOLD_MIB;

impl<B: GpuBackend> Agent<B> {
    /// [`Self::apply_held`] with nothing held.
    #[cfg(test)]
    pub(crate) fn apply(&mut self, intent: &[GpuIntent], handed_over: bool) -> (Vec<(u32, GpuOutcome)>, bool) {
        self.apply_held(intent, handed_over, None)
    }

    /// Brings every GPU of the intent to its target; returns the outcomes and whether the GPU
    /// clients must restart: a GPU changed (they re-enumerate), or a MIG mode change found the
    /// GPU held (they let go; the next pass retries). A pass that changes nothing restarts nobody.
    /// While `hold` (why) is set the GPU clients are still stopping: a GPU whose MIG mode must
    /// change changes nothing and waits.
    pub(crate) fn apply_held(
        &mut self,
        intent: &[GpuIntent],
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
                outcomes.push((gpu, GpuOutcome::Blocked { reason: reasons::GPU_NOT_FOUND, message }));
                continue;
            };
            if want.mig_enabled && !info.mig_capable {
                let message = format!("{} is not MIG capable", info.product);
                outcomes.push((gpu, GpuOutcome::Blocked { reason: reasons::MIG_NOT_SUPPORTED, message }));
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

    /// One GPU: observe, plan, check the steps may run now, run them. Sets `ran` when the GPU
    /// clients must restart (see [`Self::apply_held`]).
    fn apply_gpu(
        &mut self,
        info: &GpuInfo,
        target: &Target,
        handed_over: bool,
        hold: Option<&str>,
        ran: &mut bool,
    ) -> Result<(), GpuOutcome> {
        let (model, observed) = self.observe_gpu(info).map_err(failed)?;
        let steps = planner::plan(model, &observed, target).map_err(|b| self.blocked(b))?;
        may_run(&steps, handed_over, hold)?;
        self.run_steps(info.index, &steps, ran)
    }

    /// What one GPU holds, as the planner reads it, with the model its driver describes.
    fn observe_gpu(&mut self, info: &GpuInfo) -> Result<(&'static GpuModel, Observed), Error> {
        let gpu = info.index;
        let profiles = if info.mig_capable { self.backend.profiles(gpu)? } else { vec![] };
        let model = model_from_hardware(&info.product, &profiles);
        let instances = if info.mig_enabled { self.backend.instances(gpu)? } else { vec![] };
        let mut busy: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        let mut gpu_processes = Vec::new();
        for p in self.backend.processes(gpu)? {
            match p.gpu_instance_id {
                Some(gi) => busy.entry(gi).or_default().push(p.pid),
                None => gpu_processes.push(p.pid),
            }
        }
        let leaked = self.leaked_memory(gpu, &instances, &busy)?;
        let observed = Observed {
            mig_enabled: info.mig_enabled,
            mig_pending: info.mig_pending,
            instances,
            busy,
            gpu_processes,
            leaked,
        };
        Ok((model, observed))
    }

    /// Memory in use in an instance no process uses is held by a zombie context: MiB by GPU
    /// instance id, of the MIG devices above [`LEAK_THRESHOLD_MIB`].
    fn leaked_memory(
        &mut self,
        gpu: u32,
        instances: &[Instance],
        busy: &BTreeMap<u32, Vec<u32>>,
    ) -> Result<BTreeMap<u32, u64>, Error> {
        let mut leaked = BTreeMap::new();
        for i in instances.iter().filter(|i| i.compute_instance_id.is_some() && !busy.contains_key(&i.gpu_instance_id))
        {
            let used = self.backend.memory_used_mib(gpu, i.gpu_instance_id)?;
            if used > LEAK_THRESHOLD_MIB {
                leaked.insert(i.gpu_instance_id, used);
            }
        }
        Ok(leaked)
    }

    /// A GPU the planner found blocked, as its outcome; the pods behind the PIDs in the way are
    /// named in the message.
    fn blocked(&self, b: Blocked) -> GpuOutcome {
        let pids = blocking_pids(&b);
        let mut message = b.to_string();
        let named = if pids.is_empty() { Default::default() } else { self.pods_of(&pids) };
        if !named.is_empty() {
            let list: Vec<String> = named.iter().map(|(pid, pod)| format!("PID {pid} is pod {pod}")).collect();
            message.push_str(&format!("; {}", list.join(", ")));
        }
        GpuOutcome::Blocked { reason: blocked_reason(&b), message }
    }

    /// Runs the steps in order, one driver call each, stopping at the first that fails or may no
    /// longer run. Sets `ran` as [`Self::apply_held`] says.
    fn run_steps(&mut self, gpu: u32, steps: &[Step], ran: &mut bool) -> Result<(), GpuOutcome> {
        for step in steps {
            if step.needs_hand_over() && !self.still_handed_over() {
                // The operator withdrew the hand-over (or the node is schedulable again) since
                // this pass began: stop before changing anything a workload could be using.
                return Err(GpuOutcome::Waiting {
                    reason: reasons::AWAITING_DRAIN,
                    message: "the hand-over was withdrawn mid-pass; nothing more is destroyed".into(),
                });
            }
            info!(gpu, ?step, "applying");
            self.run_step(gpu, step, ran)?;
            // Only a step that succeeded changed the GPU (a failed NVML call changes nothing).
            *ran = true;
        }
        Ok(())
    }

    /// One step's driver call. A MIG mode change the GPU clients refuse sets `ran` (restarting
    /// them lets go); one that needs a reset is blocked.
    fn run_step(&mut self, gpu: u32, step: &Step, ran: &mut bool) -> Result<(), GpuOutcome> {
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
                        reason: reasons::RESET_REQUIRED,
                        message: format!(
                            "MIG mode change to {} needs a GPU reset or node reboot",
                            if *on { "enabled" } else { "disabled" }
                        ),
                    });
                }
            }
        }
        Ok(())
    }
}

/// A driver call that failed, as the GPU's outcome.
fn failed(e: Error) -> GpuOutcome {
    GpuOutcome::Failed { message: e.to_string() }
}

/// The condition reason a blocked plan reports.
fn blocked_reason(b: &Blocked) -> &'static str {
    match b {
        Blocked::Busy(_) | Blocked::GpuBusy(_) => reasons::INSTANCE_IN_USE,
        Blocked::NoFit(_) => reasons::LAYOUT_DOES_NOT_FIT,
        Blocked::LeakedMemory(_) => reasons::LEAKED_MEMORY,
        Blocked::SplitComputeInstances(_) => reasons::SPLIT_COMPUTE_INSTANCES,
    }
}

/// The PIDs of the processes in a blocked plan's way (none for a blocker that is no process).
fn blocking_pids(b: &Blocked) -> Vec<u32> {
    match b {
        Blocked::Busy(list) => list.iter().flat_map(|(_, p)| p.iter().copied()).collect(),
        Blocked::GpuBusy(p) => p.clone(),
        _ => vec![],
    }
}

/// Whether the planned steps may run now: any that destroy instances or change MIG mode wait
/// for the hand-over, and a MIG mode change waits while `hold` (why) says the GPU clients are
/// still stopping.
fn may_run(steps: &[Step], handed_over: bool, hold: Option<&str>) -> Result<(), GpuOutcome> {
    // A half-made instance (no compute instance) is remade without the hand-over: nothing
    // can use it. Whoever made it (this agent before a crash, an admin's `-cgi` without `-C`)
    // loses only an unusable GPU instance; one that got its compute instance since this pass
    // read the GPU is refused by the driver. Beside a layout change everything waits.
    let disruptive = steps.iter().filter(|s| s.needs_hand_over()).count();
    if disruptive > 0 && !handed_over {
        return Err(GpuOutcome::Waiting {
            reason: reasons::AWAITING_DRAIN,
            message: format!(
                "{disruptive} step(s) destroy instances or change MIG mode; waiting for the operator to drain \
                 the node and hand it over"
            ),
        });
    }
    if let Some(message) = hold
        && steps.iter().any(|s| matches!(s, Step::SetMigMode(_)))
    {
        return Err(GpuOutcome::Waiting { reason: reasons::STOPPING_GPU_CLIENTS, message: message.to_string() });
    }
    Ok(())
}
