//! Pure: turns what the agent observed and did into the `GpuNode` status it writes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use tessera_crds::conditions::{READY, RECONCILING, STALLED, gpunode_reasons, remove_condition, set_condition};
use tessera_crds::gpunode::{GpuProfileInfo, GpuState, MigInstance};

use crate::backend::{GpuInfo, HardwareProfile, Instance};

/// The outcome for one GPU of the intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuOutcome {
    InSync,
    /// Needs a human or an external event (busy instance, reset, impossible layout).
    Blocked {
        reason: &'static str,
        message: String,
    },
    /// A driver call failed; the next pass retries.
    Failed {
        message: String,
    },
    /// Waiting for someone else (the operator's hand-over of a drained node); not an error.
    Waiting {
        reason: &'static str,
        message: String,
    },
}

/// `table`: the driver's profile table, reported only for boards the catalog lacks.
pub fn gpu_state(info: &GpuInfo, instances: &[Instance], table: &[HardwareProfile]) -> GpuState {
    GpuState {
        index: info.index as i32,
        uuid: info.uuid.clone(),
        product: info.product.clone(),
        memory_mib: info.memory_mib as i64,
        mig_capable: info.mig_capable,
        mig_enabled: info.mig_enabled,
        mig_pending: info.mig_pending.is_some(),
        // A GPU instance without its compute instance is no MIG device: nothing to report.
        instances: instances
            .iter()
            .filter_map(|i| Some((i, i.compute_instance_id?)))
            .map(|(i, compute_instance_id)| MigInstance {
                profile: i.profile.clone(),
                start: i32::from(i.start),
                size: i32::from(i.size),
                uuid: (!i.uuid.is_empty()).then(|| i.uuid.clone()),
                gpu_instance_id: i.gpu_instance_id as i32,
                compute_instance_id: compute_instance_id as i32,
            })
            .collect(),
        profiles: table
            .iter()
            .map(|p| GpuProfileInfo {
                name: p.name.clone(),
                id: p.id,
                compute_slices: p.compute_slices,
                memory_slices: p.memory_slices,
                max_count: p.max_count,
                starts: p.starts.clone(),
            })
            .collect(),
    }
}

/// Computes the agent's conditions and the generation to report as applied.
pub fn conditions(
    previous: &[Condition],
    outcomes: &[(u32, GpuOutcome)],
    generation: Option<i64>,
    previous_applied: Option<i64>,
    now: Time,
) -> (Vec<Condition>, Option<i64>) {
    let mut conds: Vec<Condition> =
        previous.iter().filter(|c| [READY, RECONCILING, STALLED].contains(&c.type_.as_str())).cloned().collect();
    let blocked: Vec<String> = outcomes
        .iter()
        .filter_map(|(gpu, o)| match o {
            GpuOutcome::Blocked { message, .. } => Some(format!("GPU {gpu}: {message}")),
            _ => None,
        })
        .collect();
    let failed: Vec<String> = outcomes
        .iter()
        .filter_map(|(gpu, o)| match o {
            GpuOutcome::Failed { message } => Some(format!("GPU {gpu}: {message}")),
            _ => None,
        })
        .collect();
    let first_reason = outcomes.iter().find_map(|(_, o)| match o {
        GpuOutcome::Blocked { reason, .. } => Some(*reason),
        _ => None,
    });
    let waiting: Vec<(&'static str, String)> = outcomes
        .iter()
        .filter_map(|(gpu, o)| match o {
            GpuOutcome::Waiting { reason, message } => Some((*reason, format!("GPU {gpu}: {message}"))),
            _ => None,
        })
        .collect();
    let t = now;
    if let Some(reason) = first_reason {
        let msg = blocked.join("; ");
        set_condition(&mut conds, STALLED, true, reason, &msg, generation, t.clone());
        set_condition(&mut conds, READY, false, reason, &msg, generation, t.clone());
        remove_condition(&mut conds, RECONCILING);
        (conds, previous_applied)
    } else if !failed.is_empty() || !waiting.is_empty() {
        let reason = if failed.is_empty() { waiting[0].0 } else { gpunode_reasons::RETRYING };
        let ready_reason = if failed.is_empty() { waiting[0].0 } else { gpunode_reasons::APPLY_FAILED };
        let msg = failed.into_iter().chain(waiting.into_iter().map(|(_, m)| m)).collect::<Vec<_>>().join("; ");
        remove_condition(&mut conds, STALLED);
        set_condition(&mut conds, RECONCILING, true, reason, &msg, generation, t.clone());
        set_condition(&mut conds, READY, false, ready_reason, &msg, generation, t);
        (conds, previous_applied)
    } else {
        remove_condition(&mut conds, STALLED);
        remove_condition(&mut conds, RECONCILING);
        let msg = format!("{} GPU(s) match the intent", outcomes.len());
        set_condition(&mut conds, READY, true, gpunode_reasons::APPLIED, msg, generation, t);
        (conds, generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn in_sync_reports_ready_and_the_generation() {
        let (c, applied) = conditions(&[], &[(0, GpuOutcome::InSync)], Some(3), Some(2), now());
        assert_eq!(applied, Some(3));
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].type_.as_str(), c[0].status.as_str()), (READY, "True"));
    }

    #[test]
    fn a_blocked_gpu_stalls_and_keeps_the_old_generation() {
        let outcomes =
            [(0, GpuOutcome::InSync), (1, GpuOutcome::Blocked { reason: "InstanceInUse", message: "pid 7".into() })];
        let (c, applied) = conditions(&[], &outcomes, Some(3), Some(2), now());
        assert_eq!(applied, Some(2));
        let stalled = c.iter().find(|c| c.type_ == STALLED).unwrap();
        assert_eq!(stalled.reason, "InstanceInUse");
        assert_eq!(stalled.message, "GPU 1: pid 7");
        assert_eq!(c.iter().find(|c| c.type_ == READY).unwrap().status, "False");
    }

    #[test]
    fn waiting_for_the_hand_over_is_reconciling_not_applied() {
        let waiting = GpuOutcome::Waiting { reason: "AwaitingDrain", message: "2 step(s)".into() };
        let (c, applied) = conditions(&[], &[(0, GpuOutcome::InSync), (1, waiting)], Some(3), Some(2), now());
        assert_eq!(applied, Some(2), "a generation waiting for the hand-over is not applied");
        let reconciling = c.iter().find(|c| c.type_ == RECONCILING).unwrap();
        assert_eq!((reconciling.reason.as_str(), reconciling.message.as_str()), ("AwaitingDrain", "GPU 1: 2 step(s)"));
        assert!(!c.iter().any(|c| c.type_ == STALLED));
        assert_eq!(c.iter().find(|c| c.type_ == READY).unwrap().status, "False");
    }

    #[test]
    fn a_failure_is_reconciling_not_stalled() {
        let (c, applied) = conditions(&[], &[(0, GpuOutcome::Failed { message: "x".into() })], Some(3), None, now());
        assert_eq!(applied, None);
        assert!(c.iter().any(|c| c.type_ == RECONCILING && c.status == "True"));
        assert!(!c.iter().any(|c| c.type_ == STALLED));
    }
}
