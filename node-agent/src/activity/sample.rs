//! One observation per device from the backend: each MIG device of a GPU in MIG mode, or the
//! whole GPU with MIG off. GPM's SM activity where the board has it; without GPM (A100, A30, or a
//! driver without the GPM symbols) the device is measured by compute processes and memory only.

use tessera_crds::activity::ActivitySource;

use super::Observation;
use crate::Error;
use crate::backend::{GpuBackend, SmActivity};

/// GPM's answer as (source, figure). A missing symbol is a driver without GPM: processes and
/// memory from then on. Any other failure keeps the device on GPM with no figure this pass, so a
/// passing fault neither claims idleness nor wipes the device's history.
fn gpm<B: GpuBackend>(backend: &mut B, gpu: u32, gi: Option<u32>, uuid: &str) -> (ActivitySource, Option<f64>) {
    match backend.sm_activity(gpu, gi, uuid) {
        Ok(SmActivity::Percent(p)) => (ActivitySource::Gpm, Some(p)),
        Ok(SmActivity::FirstSample) => (ActivitySource::Gpm, None),
        Ok(SmActivity::Unsupported) | Err(Error::MissingSymbol(_)) => (ActivitySource::ProcessesAndMemory, None),
        Err(e) => {
            tracing::warn!(gpu, gpu_instance = ?gi, "GPM sample failed, no activity figure this pass: {e}");
            (ActivitySource::Gpm, None)
        }
    }
}

/// Observes every device of the node. Fails only when the GPUs themselves cannot be listed.
/// GPM samples are kept by device UUID, and those of devices not seen (destroyed) are dropped.
pub fn observe<B: GpuBackend>(backend: &mut B) -> Result<Vec<Observation>, Error> {
    let mut out = Vec::new();
    let mut sampled: Vec<String> = Vec::new();
    for g in backend.inventory()? {
        let procs = backend.processes(g.index)?;
        if !g.mig_enabled {
            let (source, sm_active_percent) = gpm(backend, g.index, None, &g.uuid);
            sampled.push(g.uuid.clone());
            out.push(Observation {
                gpu_index: g.index,
                model_name: g.product.clone(),
                uuid: None,
                profile: None,
                start: None,
                gpu_instance_id: None,
                source,
                sm_active_percent,
                memory_used_mib: backend.gpu_memory_used_mib(g.index)?,
                processes: procs.len() as u32,
                pids: procs.iter().map(|p| p.pid).collect(),
            });
            continue;
        }
        // Only MIG devices (a GPU instance with its compute instance) can be handed to a pod.
        for i in backend.instances(g.index)?.into_iter().filter(|i| i.compute_instance_id.is_some()) {
            let gi = i.gpu_instance_id;
            let (source, sm_active_percent) = gpm(backend, g.index, Some(gi), &i.uuid);
            sampled.push(i.uuid.clone());
            out.push(Observation {
                gpu_index: g.index,
                model_name: g.product.clone(),
                uuid: Some(i.uuid),
                profile: Some(i.profile),
                start: Some(i.start),
                gpu_instance_id: Some(gi),
                source,
                sm_active_percent,
                memory_used_mib: backend.memory_used_mib(g.index, gi)?,
                processes: procs.iter().filter(|p| p.gpu_instance_id == Some(gi)).count() as u32,
                pids: procs.iter().filter(|p| p.gpu_instance_id == Some(gi)).map(|p| p.pid).collect(),
            });
        }
    }
    backend.retain_gpm_samples(&sampled.iter().map(String::as_str).collect::<Vec<_>>());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::{self, SimBackend};
    use crate::testutil::temp_dir;

    #[test]
    fn hopper_mig_devices_by_gpm_and_ampere_by_processes() {
        let state = temp_dir("activity-sample").join("state.json");
        let mut b = SimBackend::open(&state, &["H100-80GB".into(), "A100-40GB".into()]).unwrap();
        b.set_mig_mode(0, true).unwrap();
        let three = b.create_instance(0, "3g.40gb", 4).unwrap();
        let one = b.create_instance(0, "1g.10gb", 0).unwrap();
        sim::set_activity(&state, 0, Some(&three.uuid), 55.0).unwrap();
        sim::run_process(&state, 0, Some(&three.uuid), 7, "python", Some(2048)).unwrap();
        sim::run_process(&state, 1, None, 8, "python", Some(100)).unwrap();
        let got = observe(&mut b).unwrap();
        let summary: Vec<_> = got
            .iter()
            .map(|o| (o.gpu_index, o.uuid.clone(), o.source, o.sm_active_percent, o.memory_used_mib, o.processes))
            .collect();
        assert_eq!(
            summary,
            vec![
                (0, Some(one.uuid.clone()), ActivitySource::Gpm, Some(0.0), 0, 0),
                (0, Some(three.uuid.clone()), ActivitySource::Gpm, Some(55.0), 2048, 1),
                (1, None, ActivitySource::ProcessesAndMemory, None, 100, 1),
            ]
        );
        assert_eq!((got[1].profile.as_deref(), got[1].start), (Some("3g.40gb"), Some(4)));
    }
}
