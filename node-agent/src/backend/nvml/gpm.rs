//! GPM samples kept between the agent's passes: each call samples a device and compares with its
//! previous sample. nvml-wrapper's `GpmSample` borrows the `Nvml` it came from, so the previous
//! samples are kept as raw handles and rebuilt against the same session; a reopened session
//! (driver restart) forgets them, as the old library's samples mean nothing to the new one.

use std::collections::HashMap;

use nvml_wrapper::Nvml;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::{GpmSample, gpm_metrics_get};

use crate::Error;
use crate::backend::SmActivity;

/// Previous samples by device UUID (the MIG device's, or the GPU's), as raw handles
/// (`nvmlGpmSample_t`). Not by GPU instance id: an instance made again at the same place between
/// two samples gets the same id, and its first figure would pair the old instance's sample.
#[derive(Default)]
pub struct Samples {
    prev: HashMap<String, usize>,
}

/// Every GPM symbol the sampler calls, directly or through a sample's `Drop`: the bindings'
/// direct calls `expect` their symbol, so a driver without one must never reach them.
fn has_gpm_symbols(nvml: &Nvml) -> bool {
    let lib = nvml.lib();
    lib.nvmlGpmQueryDeviceSupport.is_ok()
        && lib.nvmlGpmSampleAlloc.is_ok()
        && lib.nvmlGpmSampleFree.is_ok()
        && lib.nvmlGpmSampleGet.is_ok()
        && lib.nvmlGpmMigSampleGet.is_ok()
        && lib.nvmlGpmMetricsGet.is_ok()
}

fn gpm_err(what: &'static str) -> impl Fn(NvmlError) -> Error {
    move |e| Error::Nvml(format!("GPM {what}: {e}"))
}

impl Samples {
    /// Forgets every sample (a new session): the next call per device is a first sample again.
    pub fn forget(&mut self) {
        // The old session's samples cannot be freed through the new library; they are leaked.
        self.prev.clear();
    }

    /// Frees the samples of devices not in `present` (destroyed since), so they neither pile up
    /// nor pair with anything later.
    pub fn retain(&mut self, nvml: &Nvml, present: &[&str]) {
        let gone: Vec<String> = self.prev.keys().filter(|k| !present.contains(&k.as_str())).cloned().collect();
        for uuid in gone {
            if let Some(old) = self.prev.remove(&uuid) {
                // SAFETY: as in `sample`: a handle of this session, owned here alone; freed on drop.
                drop(unsafe { GpmSample::from_handle(nvml, old as nvml_wrapper_sys::bindings::nvmlGpmSample_t) });
            }
        }
    }

    /// How many samples are kept (tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.prev.len()
    }

    pub fn sample(&mut self, nvml: &Nvml, gpu: u32, gi: Option<u32>, uuid: &str) -> Result<SmActivity, Error> {
        if !has_gpm_symbols(nvml) {
            return Err(Error::MissingSymbol("nvmlGpm* (GPM): the driver predates GPM".into()));
        }
        let device = nvml.device_by_index(gpu).map_err(gpm_err("device"))?;
        match device.gpm_support() {
            Ok(true) => {}
            Ok(false) | Err(NvmlError::NotSupported) => return Ok(SmActivity::Unsupported),
            Err(e) => return Err(gpm_err("support")(e)),
        }
        let new = match gi {
            Some(gi) => device.gpm_mig_sample(gi),
            None => device.gpm_sample(),
        }
        .map_err(gpm_err("sample"))?;
        let result = match self.prev.remove(uuid) {
            None => Ok(SmActivity::FirstSample),
            Some(old) => {
                // SAFETY: `old` came from `into_handle` on a sample of this same session (a new
                // session clears the table), and is owned here alone: rebuilt once, freed on drop.
                let old = unsafe { GpmSample::from_handle(nvml, old as nvml_wrapper_sys::bindings::nvmlGpmSample_t) };
                // No early return: the new sample is kept for the next pass even when this fails.
                match gpm_metrics_get(nvml, &old, &new, &[GpmMetricId::SmUtil]).map(|m| m.into_iter().next()) {
                    Ok(Some(Ok(m))) if m.value.is_finite() => Ok(SmActivity::Percent(m.value.clamp(0.0, 100.0))),
                    Ok(Some(Ok(m))) => Err(Error::Nvml(format!("GPM SM_UTIL is {}", m.value))),
                    Ok(Some(Err(e))) => Err(gpm_err("SM_UTIL")(e)),
                    Ok(None) => Err(Error::Nvml("GPM returned no metric".into())),
                    Err(e) => Err(gpm_err("metrics")(e)),
                }
            }
        };
        self.prev.insert(uuid.to_string(), new.into_handle() as usize);
        result
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::nvml::NvmlBackend;
    use crate::backend::sim::{self, CallFault};
    use crate::backend::{GpuBackend, SmActivity};
    use crate::testutil::nvml_sim;

    #[test]
    fn gpm_gives_each_mig_instance_its_activity_from_the_second_sample() {
        let (lib, state) = nvml_sim(&["H100-80GB", "A100-40GB"]);
        let mut b = NvmlBackend::init(Some(&lib)).unwrap();
        b.set_mig_mode(0, true).unwrap();
        let three = b.create_instance(0, "3g.40gb", 4).unwrap();
        let one = b.create_instance(0, "1g.10gb", 0).unwrap();
        sim::set_activity(&state, 0, Some(&three.uuid), 60.0).unwrap();
        let (g3, g1) = (Some(three.gpu_instance_id), Some(one.gpu_instance_id));
        assert_eq!(b.sm_activity(0, g3, &three.uuid).unwrap(), SmActivity::FirstSample);
        assert_eq!(b.sm_activity(0, g1, &one.uuid).unwrap(), SmActivity::FirstSample);
        assert_eq!(b.sm_activity(0, g3, &three.uuid).unwrap(), SmActivity::Percent(60.0));
        assert_eq!(b.sm_activity(0, g1, &one.uuid).unwrap(), SmActivity::Percent(0.0));
        // The whole GPU: 3 of 7 compute slices at 60%.
        let gpus: Vec<String> = b.inventory().unwrap().into_iter().map(|g| g.uuid).collect();
        assert_eq!(b.sm_activity(0, None, &gpus[0]).unwrap(), SmActivity::FirstSample);
        let SmActivity::Percent(whole) = b.sm_activity(0, None, &gpus[0]).unwrap() else { panic!("no figure") };
        assert!((whole - 60.0 * 3.0 / 7.0).abs() < 1e-9, "{whole}");
        // The A100 has no GPM: the sampler says so instead of failing.
        assert_eq!(b.sm_activity(1, None, &gpus[1]).unwrap(), SmActivity::Unsupported);
    }

    #[test]
    fn an_instance_made_again_with_the_same_id_starts_with_a_first_sample_not_the_old_ones() {
        let (lib, state) = nvml_sim(&["H100-80GB"]);
        let mut b = NvmlBackend::init(Some(&lib)).unwrap();
        b.set_mig_mode(0, true).unwrap();
        let old = b.create_instance(0, "3g.40gb", 4).unwrap();
        let g = Some(old.gpu_instance_id);
        assert_eq!(b.sm_activity(0, g, &old.uuid).unwrap(), SmActivity::FirstSample);
        assert_eq!(b.sm_activity(0, g, &old.uuid).unwrap(), SmActivity::Percent(0.0));
        // Destroyed and made again at the same place between two samples: same id, new UUID.
        b.destroy_instance(0, old.gpu_instance_id).unwrap();
        let new = b.create_instance(0, "3g.40gb", 4).unwrap();
        assert_eq!((new.gpu_instance_id, new.uuid != old.uuid), (old.gpu_instance_id, true));
        sim::set_activity(&state, 0, Some(&new.uuid), 100.0).unwrap();
        // Paired with the old instance's sample this would read 50%.
        assert_eq!(b.sm_activity(0, g, &new.uuid).unwrap(), SmActivity::FirstSample);
        assert_eq!(b.sm_activity(0, g, &new.uuid).unwrap(), SmActivity::Percent(100.0));
    }

    #[test]
    fn a_pass_drops_the_samples_of_destroyed_instances() {
        let (lib, _state) = nvml_sim(&["H100-80GB"]);
        let mut b = NvmlBackend::init(Some(&lib)).unwrap();
        b.set_mig_mode(0, true).unwrap();
        let three = b.create_instance(0, "3g.40gb", 4).unwrap();
        b.create_instance(0, "1g.10gb", 0).unwrap();
        crate::activity::sample::observe(&mut b).unwrap();
        assert_eq!(b.gpm.len(), 2);
        b.destroy_instance(0, three.gpu_instance_id).unwrap();
        let got = crate::activity::sample::observe(&mut b).unwrap();
        assert_eq!((got.len(), b.gpm.len()), (1, 1), "the destroyed instance's sample is freed");
        // MIG off: the whole GPU is the only device left.
        b.destroy_instance(0, got[0].gpu_instance_id.unwrap()).unwrap();
        b.set_mig_mode(0, false).unwrap();
        let got = crate::activity::sample::observe(&mut b).unwrap();
        assert_eq!((got.len(), b.gpm.len()), (1, 1));
    }

    #[test]
    fn a_failing_gpm_call_is_an_error_and_the_next_pass_recovers() {
        let (lib, state) = nvml_sim(&["H100-80GB"]);
        let mut b = NvmlBackend::init(Some(&lib)).unwrap();
        sim::set_activity(&state, 0, None, 25.0).unwrap();
        let gpu = b.inventory().unwrap()[0].uuid.clone();
        assert_eq!(b.sm_activity(0, None, &gpu).unwrap(), SmActivity::FirstSample);
        let fault = CallFault { function: "nvmlGpmMetricsGet".into(), nth: 1, code: 999, ..Default::default() };
        sim::add_call_fault(&state, fault).unwrap();
        assert!(b.sm_activity(0, None, &gpu).is_err());
        // The failed pass still kept its new sample: the next one has a figure.
        assert_eq!(b.sm_activity(0, None, &gpu).unwrap(), SmActivity::Percent(25.0));
    }
}
