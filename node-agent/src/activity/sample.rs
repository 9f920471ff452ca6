//! One observation per device from the backend: each MIG device of a GPU in MIG mode, or the
//! whole GPU with MIG off. GPM's SM activity where the board has it; without GPM (A100, A30, or a
//! driver without the GPM symbols) the device is measured by compute processes and memory only.

use tessera_crds::activity::ActivitySource;

use super::{DeviceKey, Observation};
use crate::Error;
use crate::backend::{GpuBackend, GpuInfo, GpuProcess, Instance, SmActivity};

/// GPM's answer as (source, figure, failed). A missing symbol is a driver without GPM: processes
/// and memory from then on. Any other failure keeps the device on GPM with no figure this pass
/// and `failed` set: the tracker counts that sample idle without a process and unknown with one
/// (an idle pod's open context), and judges a device whose GPM keeps failing by its processes
/// ([`super::tracker::GPM_FAILURES_BEFORE_PROCESSES`]); the next sample tries GPM again, so a
/// passing fault neither wipes the device's history nor ends its idle stretch.
fn gpm<B: GpuBackend>(backend: &mut B, gpu: u32, gi: Option<u32>, uuid: &str) -> (ActivitySource, Option<f64>, bool) {
    match backend.sm_activity(gpu, gi, uuid) {
        Ok(SmActivity::Percent(p)) => (ActivitySource::Gpm, Some(p), false),
        Ok(SmActivity::FirstSample) => (ActivitySource::Gpm, None, false),
        Ok(SmActivity::Unsupported) | Err(Error::MissingSymbol(_)) => (ActivitySource::ProcessesAndMemory, None, false),
        Err(e) => {
            tracing::warn!(gpu, gpu_instance = ?gi, "GPM sample failed, judged by its processes this pass: {e}");
            (ActivitySource::Gpm, None, true)
        }
    }
}

/// A device whose reads failed: logged, and left out of this pass (see [`observe`]).
fn skipped(gpu: u32, gi: Option<u32>, e: &Error) {
    tracing::warn!(gpu, gpu_instance = ?gi, "could not read the device, no activity figure this pass: {e}");
}

/// Observes every device of the node. Fails only when the GPUs themselves cannot be listed: a
/// GPU or device whose reads fail (a lost GPU, `GPU_IS_LOST`) is left out of this pass, so the
/// others are still measured and written; the tracker keeps its history for up to 10 minutes
/// (see [`observe_all`]), after which the operator counts it unmeasured.
/// GPM samples are kept by device UUID, and those of devices not seen (destroyed) are dropped.
pub fn observe<B: GpuBackend>(backend: &mut B) -> Result<Vec<Observation>, Error> {
    observe_all(backend).map(|(o, _)| o)
}

/// [`observe`], with the devices whose reads failed (`(gpu, None)`: the GPU's, all of them), for
/// [`super::Tracker::observe_unread`].
pub fn observe_all<B: GpuBackend>(backend: &mut B) -> Result<(Vec<Observation>, Vec<DeviceKey>), Error> {
    let mut reads = Reads::default();
    for g in backend.inventory()? {
        match backend.processes(g.index) {
            Ok(procs) if !g.mig_enabled => observe_whole_gpu(backend, &g, &procs, &mut reads),
            Ok(procs) => observe_mig_devices(backend, &g, &procs, &mut reads),
            Err(e) => reads.mark_unread(g.index, None, (g.index, None), &e),
        }
    }
    backend.retain_gpm_samples(&reads.sampled.iter().map(String::as_str).collect::<Vec<_>>());
    Ok((reads.observations, reads.unread))
}

/// What a pass over the devices has read so far.
#[derive(Default)]
struct Reads {
    observations: Vec<Observation>,
    /// The devices whose reads failed.
    unread: Vec<DeviceKey>,
    /// The UUIDs GPM was sampled for: their samples are kept, the others' dropped.
    sampled: Vec<String>,
}

impl Reads {
    /// A device (`key`; `gi` for the log) whose read failed: logged, and marked unread.
    fn mark_unread(&mut self, gpu: u32, gi: Option<u32>, key: DeviceKey, e: &Error) {
        skipped(gpu, gi, e);
        self.unread.push(key);
    }
}

/// A GPU with MIG off, as one device. GPM is sampled (and its sample kept) before the memory
/// is read, so a failed memory read keeps the GPM history.
fn observe_whole_gpu<B: GpuBackend>(backend: &mut B, g: &GpuInfo, procs: &[GpuProcess], reads: &mut Reads) {
    let (source, sm_active_percent, gpm_failed) = gpm(backend, g.index, None, &g.uuid);
    reads.sampled.push(g.uuid.clone());
    let memory_used_mib = match backend.gpu_memory_used_mib(g.index) {
        Ok(m) => m,
        Err(e) => return reads.mark_unread(g.index, None, (g.index, None), &e),
    };
    reads.observations.push(Observation {
        gpu_index: g.index,
        model_name: g.product.clone(),
        gpu_uuid: g.uuid.clone(),
        uuid: None,
        profile: None,
        start: None,
        gpu_instance_id: None,
        source,
        sm_active_percent,
        gpm_failed,
        memory_used_mib,
        processes: procs.len() as u32,
        pids: procs.iter().map(|p| p.pid).collect(),
    });
}

/// Each MIG device of a GPU in MIG mode; all of them unread when its instances cannot be listed.
fn observe_mig_devices<B: GpuBackend>(backend: &mut B, g: &GpuInfo, procs: &[GpuProcess], reads: &mut Reads) {
    let instances = match backend.instances(g.index) {
        Ok(i) => i,
        Err(e) => return reads.mark_unread(g.index, None, (g.index, None), &e),
    };
    // Only MIG devices (a GPU instance with its compute instance) can be handed to a pod.
    for i in instances.into_iter().filter(|i| i.compute_instance_id.is_some()) {
        observe_mig_device(backend, g, i, procs, reads);
    }
}

/// One MIG device, with the processes in its GPU instance. GPM first, as for a whole GPU.
fn observe_mig_device<B: GpuBackend>(
    backend: &mut B,
    g: &GpuInfo,
    i: Instance,
    procs: &[GpuProcess],
    reads: &mut Reads,
) {
    let gi = i.gpu_instance_id;
    let (source, sm_active_percent, gpm_failed) = gpm(backend, g.index, Some(gi), &i.uuid);
    reads.sampled.push(i.uuid.clone());
    let memory_used_mib = match backend.memory_used_mib(g.index, gi) {
        Ok(m) => m,
        Err(e) => return reads.mark_unread(g.index, Some(gi), (g.index, Some(i.uuid)), &e),
    };
    reads.observations.push(Observation {
        gpu_index: g.index,
        model_name: g.product.clone(),
        gpu_uuid: g.uuid.clone(),
        uuid: Some(i.uuid),
        profile: Some(i.profile),
        start: Some(i.start),
        gpu_instance_id: Some(gi),
        source,
        sm_active_percent,
        gpm_failed,
        memory_used_mib,
        processes: procs.iter().filter(|p| p.gpu_instance_id == Some(gi)).count() as u32,
        pids: procs.iter().filter(|p| p.gpu_instance_id == Some(gi)).map(|p| p.pid).collect(),
    });
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

    /// An H100 with two MIG devices and a whole A100 beside it.
    fn two_gpus(tag: &str) -> (std::path::PathBuf, SimBackend, [crate::backend::Instance; 2]) {
        let state = temp_dir(tag).join("state.json");
        let mut b = SimBackend::open(&state, &["H100-80GB".into(), "A100-40GB".into()]).unwrap();
        b.set_mig_mode(0, true).unwrap();
        let three = b.create_instance(0, "3g.40gb", 4).unwrap();
        let one = b.create_instance(0, "1g.10gb", 0).unwrap();
        (state, b, [one, three])
    }

    #[test]
    fn a_lost_gpu_or_device_costs_only_its_own_figures() {
        use crate::activity::Tracker;
        use crate::activity::faulty::{Faulty, Read};
        use k8s_openapi::jiff::Timestamp;
        let (_state, b, [one, three]) = two_gpus("activity-lost");
        let (one_gi, one, three) = (one.gpu_instance_id, one.uuid, three.uuid);
        let mut f = Faulty { inner: b, failing: vec![] };
        let keys = |got: &[Observation]| got.iter().map(|o| o.key()).collect::<Vec<_>>();
        let t = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
        let mut tr = Tracker::default();
        let (got, _) = observe_all(&mut f).unwrap();
        tr.observe(t(0), got);
        let idle = |tr: &Tracker, s: i64| {
            tr.summary(t(s))
                .devices
                .into_iter()
                .map(|d| (d.gpu_index, d.uuid, d.idle_since.map(|x| x.0)))
                .collect::<Vec<_>>()
        };
        let all_idle_since_0 = idle(&tr, 0);
        assert_eq!(all_idle_since_0.len(), 3);
        assert!(all_idle_since_0.iter().all(|d| d.2 == Some(t(0))), "{all_idle_since_0:?}");
        // The A100 is lost (GPU_IS_LOST on its process list): the H100's devices are measured,
        // the A100 is marked unread, and keeps its history (idle since 0) while it is.
        f.failing = vec![Read::Processes(1)];
        let (got, unread) = observe_all(&mut f).expect("one lost GPU does not fail the pass");
        assert_eq!(keys(&got), vec![(0, Some(one.clone())), (0, Some(three.clone()))]);
        assert_eq!(unread, vec![(1, None)]);
        tr.observe_unread(t(30), got, &unread);
        assert_eq!(idle(&tr, 30), all_idle_since_0);
        // One MIG device's memory cannot be read: only that device goes without its figure.
        f.failing = vec![Read::Memory(0, Some(one_gi))];
        let (got, unread) = observe_all(&mut f).unwrap();
        assert_eq!(keys(&got), vec![(0, Some(three.clone())), (1, None)]);
        assert_eq!(unread, vec![(0, Some(one.clone()))]);
        tr.observe_unread(t(60), got, &unread);
        assert_eq!(idle(&tr, 60), all_idle_since_0);
        // The whole GPU's memory, and a GPU whose instances cannot be listed.
        f.failing = vec![Read::Memory(1, None), Read::Instances(0)];
        let (got, unread) = observe_all(&mut f).unwrap();
        assert_eq!(keys(&got), Vec::<(u32, Option<String>)>::new());
        assert_eq!(unread, vec![(0, None), (1, None)]);
        tr.observe_unread(t(90), got, &unread);
        assert_eq!(idle(&tr, 90), all_idle_since_0, "history kept while unread");
        // Past the gap rule it is forgotten: the operator counts it unmeasured.
        tr.observe_unread(t(700), vec![], &unread);
        assert!(idle(&tr, 700).is_empty());
    }

    #[test]
    fn a_gpm_error_falls_back_to_processes_for_that_sample_and_gpm_resumes() {
        use crate::activity::Tracker;
        use crate::activity::faulty::{Faulty, Read};
        use k8s_openapi::jiff::Timestamp;
        let (state, b, [one, _]) = two_gpus("activity-gpm-fallback");
        let (gi, one) = (one.gpu_instance_id, one.uuid);
        let mut f = Faulty { inner: b, failing: vec![] };
        let t = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
        let idle_since = |tr: &Tracker, s: i64| {
            let d = tr.summary(t(s)).devices.into_iter().find(|d| d.uuid.as_deref() == Some(one.as_str())).unwrap();
            (d.source, d.idle_since.map(|x| x.0))
        };
        let mut tr = Tracker::default();
        tr.observe(t(0), observe(&mut f).unwrap());
        tr.observe(t(30), observe(&mut f).unwrap());
        assert_eq!(idle_since(&tr, 30), (ActivitySource::Gpm, Some(t(0))));
        // GPM fails (a passing fault) while the device's pod holds a context: its open process
        // says nothing about computing, so the sample is unknown and the idle stretch goes on.
        f.failing = vec![Read::Gpm(0, Some(gi))];
        sim::run_process(&state, 0, Some(&one), 7, "python", Some(100)).unwrap();
        tr.observe(t(60), observe(&mut f).unwrap());
        assert_eq!(idle_since(&tr, 60), (ActivitySource::Gpm, Some(t(0))), "unknown: the stretch goes on");
        // Still no GPM, the process ended: idle by the processes rule, the same stretch.
        sim::stop_process(&state, 7).unwrap();
        tr.observe(t(90), observe(&mut f).unwrap());
        assert_eq!(idle_since(&tr, 90), (ActivitySource::Gpm, Some(t(0))));
        // GPM answers again: its figure decides (50% is busy), and the history was kept: the
        // hour's share blends the 0% sample before the errors with this one.
        f.failing.clear();
        sim::set_activity(&state, 0, Some(&one), 50.0).unwrap();
        tr.observe(t(120), observe(&mut f).unwrap());
        let d = tr.summary(t(120)).devices.into_iter().find(|d| d.uuid.as_deref() == Some(one.as_str())).unwrap();
        assert_eq!(d.active_percent_1h, Some(25), "30 s at 0% and 30 s at 50%");
        assert_eq!(idle_since(&tr, 120), (ActivitySource::Gpm, None));
    }
}
