//! Pure planner: the smallest set of driver operations that takes one GPU from what it holds to
//! what its intent asks for. Matching instances are kept (busy ones first), only what must go is
//! destroyed, and new instances get explicit placements that fit around the kept ones.

use std::collections::BTreeMap;

use tessera_crds::catalog::GpuModel;
use tessera_crds::solver::{self, FitError, Placement, ProfileCounts};

use crate::backend::Instance;

/// What one GPU should look like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub mig_enabled: bool,
    pub profiles: ProfileCounts,
}

/// What one GPU looks like now.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Observed {
    pub mig_enabled: bool,
    pub mig_pending: Option<bool>,
    pub instances: Vec<Instance>,
    /// GPU instance id -> PIDs of processes running in it.
    pub busy: BTreeMap<u32, Vec<u32>>,
    /// PIDs on the whole GPU (MIG disabled).
    pub gpu_processes: Vec<u32>,
    /// GPU instance id -> MiB in use with no process in it (a zombie context holds it).
    pub leaked: BTreeMap<u32, u64>,
}

/// One driver operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Destroy {
        gpu_instance_id: u32,
        profile: String,
        start: u8,
    },
    /// A GPU instance without its compute instance (its creator died between the two calls):
    /// no MIG device, so no process runs in it and no pod holds it.
    DestroyHalfMade {
        gpu_instance_id: u32,
        profile: String,
        start: u8,
    },
    SetMigMode(bool),
    Create {
        profile: String,
        start: u8,
    },
}

impl Step {
    /// Whether the step may disturb a workload, so it waits for the operator's hand-over (the
    /// node drained): destroying a MIG device or changing MIG mode. Creating in free space and
    /// destroying a half-made instance (nothing can be using it) are no layout change.
    pub fn needs_hand_over(&self) -> bool {
        matches!(self, Step::Destroy { .. } | Step::SetMigMode(_))
    }
}

/// Why the GPU cannot reach its target now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Blocked {
    #[error("{}", describe_busy(.0))]
    Busy(Vec<(Instance, Vec<u32>)>),
    #[error("MIG mode cannot change while processes use the GPU (PIDs {0:?})")]
    GpuBusy(Vec<u32>),
    #[error("the target layout does not fit: {0}")]
    NoFit(FitError),
    #[error("{}", describe_leaked(.0))]
    LeakedMemory(Vec<(Instance, u64)>),
    /// GPU instances split into smaller compute instances (an admin's `nvidia-smi mig -cci`):
    /// not MIG devices Tessera made or manages, and destroying them could end someone's work, so
    /// the GPU is left as it is.
    #[error("{}", describe_split(.0))]
    SplitComputeInstances(Vec<Instance>),
}

fn describe_split(list: &[Instance]) -> String {
    let parts: Vec<String> = list
        .iter()
        .map(|i| {
            format!(
                "GPU instance {} ({}@{}) holds {} smaller compute instances",
                i.gpu_instance_id, i.profile, i.start, i.split_compute
            )
        })
        .collect();
    format!(
        "{}; Tessera manages only whole MIG devices and leaves this GPU unchanged: destroy those compute \
         instances (nvidia-smi mig -dci) to hand it back",
        parts.join("; ")
    )
}

fn describe_leaked(list: &[(Instance, u64)]) -> String {
    let parts: Vec<String> =
        list.iter().map(|(i, mib)| format!("{}@{} ({}) holds {mib} MiB", i.profile, i.start, i.uuid)).collect();
    format!(
        "instances that must be destroyed hold memory with no process using them (a zombie context): {}; \
         a GPU reset frees it",
        parts.join("; ")
    )
}

/// Refuses a plan that destroys an instance holding memory no process accounts for: the driver
/// would refuse too, and only a GPU reset frees it.
fn refuse_leaked(observed: &Observed, steps: Vec<Step>) -> Result<Vec<Step>, Blocked> {
    let leaked: Vec<(Instance, u64)> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Destroy { gpu_instance_id, .. } | Step::DestroyHalfMade { gpu_instance_id, .. } => {
                observed.leaked.get(gpu_instance_id).map(|mib| (*gpu_instance_id, *mib))
            }
            _ => None,
        })
        .filter_map(|(id, mib)| observed.instances.iter().find(|i| i.gpu_instance_id == id).map(|i| (i.clone(), mib)))
        .collect();
    if leaked.is_empty() { Ok(steps) } else { Err(Blocked::LeakedMemory(leaked)) }
}

fn describe_busy(list: &[(Instance, Vec<u32>)]) -> String {
    let parts: Vec<String> = list
        .iter()
        .map(|(i, pids)| format!("{}@{} ({}) is used by PIDs {pids:?}", i.profile, i.start, i.uuid))
        .collect();
    format!("instances that must be destroyed are in use: {}", parts.join("; "))
}

fn placement(i: &Instance) -> Placement {
    Placement { start: i.start, size: i.size, profile: i.profile.clone() }
}

/// Plans one GPU. An empty plan means the GPU already matches. A GPU with a GPU instance split
/// into smaller compute instances is not planned at all (see [`Blocked::SplitComputeInstances`]).
///
/// A mode already pending is set again: NVML's activation status then says whether a reset is
/// really needed (Ampere) or the GPU was only busy (Hopper). A pending opposite mode (a change
/// the intent no longer wants) is cleared by setting the current mode, or the next reset would
/// apply it.
pub fn plan(model: &GpuModel, observed: &Observed, target: &Target) -> Result<Vec<Step>, Blocked> {
    let split: Vec<Instance> = observed.instances.iter().filter(|i| i.split_compute > 0).cloned().collect();
    if !split.is_empty() {
        return Err(Blocked::SplitComputeInstances(split));
    }
    plan_steps(model, observed, target).and_then(|steps| refuse_leaked(observed, steps))
}

fn plan_steps(model: &GpuModel, observed: &Observed, target: &Target) -> Result<Vec<Step>, Blocked> {
    let mut steps = Vec::new();
    if observed.mig_enabled != target.mig_enabled {
        let busy: Vec<_> = busy_among(observed, &observed.instances);
        if !busy.is_empty() {
            return Err(Blocked::Busy(busy));
        }
        if !observed.gpu_processes.is_empty() {
            return Err(Blocked::GpuBusy(observed.gpu_processes.clone()));
        }
        steps.extend(observed.instances.iter().map(destroy));
        steps.push(Step::SetMigMode(target.mig_enabled));
        if target.mig_enabled {
            let new = solver::fit(model, &target.profiles).map_err(Blocked::NoFit)?;
            steps.extend(new.into_iter().map(|p| Step::Create { profile: p.profile, start: p.start }));
        }
        return Ok(steps);
    }
    if observed.mig_pending == Some(!target.mig_enabled) {
        steps.push(Step::SetMigMode(target.mig_enabled));
    }
    if !target.mig_enabled {
        return Ok(steps);
    }
    let (kept, new) = choose_kept(model, observed, target)?;
    let mut destroyed: Vec<&Instance> = observed.instances.iter().filter(|i| !kept.contains(i)).collect();
    if !destroyed.is_empty() && !observed.gpu_processes.is_empty() {
        // Processes the driver could not tie to an instance may be using any of them.
        return Err(Blocked::GpuBusy(observed.gpu_processes.clone()));
    }
    destroyed.sort_by_key(|i| i.start);
    steps.extend(destroyed.into_iter().map(destroy));
    steps.extend(new.into_iter().map(|p| Step::Create { profile: p.profile, start: p.start }));
    Ok(steps)
}

fn destroy(i: &Instance) -> Step {
    let (gpu_instance_id, profile, start) = (i.gpu_instance_id, i.profile.clone(), i.start);
    match i.compute_instance_id {
        Some(_) => Step::Destroy { gpu_instance_id, profile, start },
        None => Step::DestroyHalfMade { gpu_instance_id, profile, start },
    }
}

fn busy_among(observed: &Observed, instances: &[Instance]) -> Vec<(Instance, Vec<u32>)> {
    instances
        .iter()
        .filter_map(|i| observed.busy.get(&i.gpu_instance_id).filter(|p| !p.is_empty()).map(|p| (i.clone(), p.clone())))
        .collect()
}

/// Picks the largest set of current instances to keep (busy ones always) such that the rest of
/// the target still fits around them; returns it with the placements to create.
fn choose_kept<'a>(
    model: &GpuModel,
    observed: &'a Observed,
    target: &Target,
) -> Result<(Vec<&'a Instance>, Vec<Placement>), Blocked> {
    let mut instances: Vec<&Instance> = observed.instances.iter().collect();
    instances.sort_by_key(|i| i.start);
    let is_busy = |i: &Instance| observed.busy.get(&i.gpu_instance_id).is_some_and(|p| !p.is_empty());
    // Candidates: finished MIG devices whose profile the target wants. A GPU instance without its
    // compute instance is never kept: it is destroyed and made again whole.
    let candidates: Vec<&Instance> = instances
        .iter()
        .copied()
        .filter(|i| i.compute_instance_id.is_some() && target.profiles.get(&i.profile).copied().unwrap_or(0) > 0)
        .collect();
    let n = candidates.len();
    // Subsets in order of (busy kept desc, kept desc, earliest starts first): deterministic.
    let mut subsets: Vec<u32> = (0..(1u32 << n)).collect();
    let score = |mask: u32| {
        let kept = (0..n).filter(|b| mask & (1 << b) != 0);
        let busy = kept.clone().filter(|&b| is_busy(candidates[b])).count();
        (busy, kept.count())
    };
    subsets.sort_by(|a, b| score(*b).cmp(&score(*a)).then(a.cmp(b)));
    let mut first_error = None;
    for mask in subsets {
        let kept: Vec<&Instance> = (0..n).filter(|b| mask & (1 << b) != 0).map(|b| candidates[b]).collect();
        let kept_counts = solver::counts_of(&kept.iter().map(|i| placement(i)).collect::<Vec<_>>());
        if kept_counts.iter().any(|(p, c)| *c > target.profiles.get(p).copied().unwrap_or(0)) {
            continue;
        }
        let mut rest = target.profiles.clone();
        for (p, c) in &kept_counts {
            if let Some(n) = rest.get_mut(p) {
                *n -= c;
            }
        }
        rest.retain(|_, n| *n > 0);
        let kept_placements: Vec<Placement> = kept.iter().map(|i| placement(i)).collect();
        match solver::fit_around(model, &kept_placements, &rest) {
            Ok(new) => {
                let dropped: Vec<Instance> =
                    instances.iter().filter(|i| !kept.contains(i)).map(|i| (*i).clone()).collect();
                let busy = busy_among(observed, &dropped);
                if !busy.is_empty() {
                    // The best layout that keeps every busy instance still drops one: blocked.
                    return Err(Blocked::Busy(busy));
                }
                return Ok((kept, new));
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    // Nothing fits even from scratch (the empty subset was tried last).
    Err(Blocked::NoFit(first_error.unwrap_or(FitError::NoPlacement {
        product: model.name.to_string(),
        best_partial: vec![],
        unplaced: target.profiles.clone(),
    })))
}

#[cfg(test)]
mod tests;
