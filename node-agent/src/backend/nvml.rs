//! Real GPUs through NVML. Inventory, MIG mode and processes come from nvml-wrapper; profiles,
//! placements and instance create/destroy from the raw calls in `nvml_raw`. Profiles and
//! placements are read at run time; the catalog is only a cross-check (`node-agent probe`).

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

use super::nvml_raw::{self, PROFILE_ENUMS};
use super::{GpuBackend, GpuInfo, GpuProcess, HardwareProfile, Instance, ModeChange, SmActivity, mode_change};
use crate::Error;

pub struct NvmlBackend {
    nvml: Nvml,
    /// The library it was opened from, to open it again after a driver restart.
    library: Option<std::path::PathBuf>,
    /// Each device's previous GPM sample.
    gpm: gpm::Samples,
}

fn nvml_err(what: &str) -> impl Fn(NvmlError) -> Error + '_ {
    move |e| match e {
        NvmlError::InUse => Error::InUse(what.to_string()),
        NvmlError::NotSupported => Error::NotSupported(what.to_string()),
        NvmlError::InvalidArg => Error::InvalidArgument(what.to_string()),
        NvmlError::NotFound => Error::NotFound(what.to_string()),
        NvmlError::FailedToLoadSymbol(symbol) => Error::MissingSymbol(format!("{what}: {symbol}")),
        other => Error::Nvml(format!("{what}: {other}")),
    }
}

fn open(library: Option<&std::path::Path>) -> Result<Nvml, Error> {
    let what = "initialise NVML (is the driver loaded?)";
    let nvml = match library {
        Some(path) => Nvml::builder().lib_path(path.as_os_str()).init(),
        None => Nvml::init(),
    };
    nvml.map_err(nvml_err(what))
}

impl NvmlBackend {
    /// Loads NVML from `library` (a path to a `libnvidia-ml.so.1`), or the system's library.
    pub fn init(library: Option<&std::path::Path>) -> Result<Self, Error> {
        Ok(Self {
            nvml: open(library)?,
            library: library.map(std::path::Path::to_path_buf),
            gpm: gpm::Samples::default(),
        })
    }

    pub fn driver_version(&self) -> String {
        self.nvml.sys_driver_version().unwrap_or_default()
    }

    fn device(&self, gpu: u32) -> Result<nvml_wrapper::Device<'_>, Error> {
        self.nvml.device_by_index(gpu).map_err(nvml_err("device"))
    }

    /// MIG devices' UUIDs by GPU instance id. Any failed read fails the list (the reconcile
    /// must not take a MIG device for free space).
    fn mig_uuids(&self, gpu: u32) -> Result<std::collections::HashMap<u32, String>, Error> {
        let d = self.device(gpu)?;
        let lib = self.nvml.lib();
        let mut out = std::collections::HashMap::new();
        for i in 0..d.mig_device_count().map_err(nvml_err("MIG device count"))? {
            let mig = match d.mig_device_by_index(i) {
                Ok(m) => m,
                Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
                Err(e) => return Err(nvml_err("MIG device")(e)),
            };
            // SAFETY: `mig` is a live MIG device handle of this session.
            let gi = nvml_raw::mig_device_gpu_instance_id(lib, unsafe { mig.handle() })?;
            out.insert(gi, mig.uuid().map_err(nvml_err("MIG device UUID"))?);
        }
        Ok(out)
    }

    /// Memory used in MiB by the MIG device of GPU instance `gi` (0 when there is none). Reads
    /// only that device: another device whose reads fail does not cost this one its figure.
    fn mig_memory_used_mib(&self, gpu: u32, gi: u32) -> Result<u64, Error> {
        let d = self.device(gpu)?;
        let lib = self.nvml.lib();
        for i in 0..d.mig_device_count().map_err(nvml_err("MIG device count"))? {
            let Ok(mig) = d.mig_device_by_index(i) else { continue };
            // SAFETY: `mig` is a live MIG device handle of this session.
            match nvml_raw::mig_device_gpu_instance_id(lib, unsafe { mig.handle() }) {
                Ok(id) if id == gi => {
                    return Ok(mig.memory_info().map_err(nvml_err("MIG device memory"))?.used / (1024 * 1024));
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(gpu, index = i, "skipping a MIG device whose instance id cannot be read: {e}")
                }
            }
        }
        Ok(0)
    }

    fn profile_ids(&mut self, gpu: u32) -> Result<Vec<(u32, String, u32)>, Error> {
        Ok(self.profiles(gpu)?.into_iter().map(|p| (p.id, p.name, u32::from(p.compute_slices))).collect())
    }
}

impl GpuBackend for NvmlBackend {
    /// The first read of every pass: after a driver restart (the session's GPUs are lost) NVML
    /// is opened again, so the agent carries on without being restarted itself.
    fn inventory(&mut self) -> Result<Vec<GpuInfo>, Error> {
        let count = match self.nvml.device_count() {
            Err(NvmlError::GpuLost | NvmlError::Uninitialized | NvmlError::DriverNotLoaded) => {
                tracing::warn!("NVML lost its GPUs (driver restarted?); opening it again");
                self.nvml = open(self.library.as_deref())?;
                self.gpm.forget();
                self.nvml.device_count()
            }
            other => other,
        }
        .map_err(nvml_err("device count"))?;
        let mut out = Vec::new();
        for index in 0..count {
            let d = self.device(index)?;
            let mode = d.mig_mode();
            let (mig_capable, mig_enabled, mig_pending) = match mode {
                Ok(m) => (true, m.current == 1, (m.pending != m.current).then_some(m.pending == 1)),
                Err(NvmlError::NotSupported) => (false, false, None),
                Err(e) => return Err(nvml_err("MIG mode")(e)),
            };
            out.push(GpuInfo {
                index,
                uuid: d.uuid().map_err(nvml_err("UUID"))?,
                product: d.name().map_err(nvml_err("name"))?,
                memory_mib: d.memory_info().map(|m| m.total / (1024 * 1024)).unwrap_or(0),
                mig_capable,
                mig_enabled,
                mig_pending,
            });
        }
        Ok(out)
    }

    fn profiles(&mut self, gpu: u32) -> Result<Vec<HardwareProfile>, Error> {
        let d = self.device(gpu)?;
        let lib = self.nvml.lib();
        // SAFETY: the handle belongs to `self.nvml`, which outlives this call.
        let handle = unsafe { d.handle() };
        let mut out = Vec::new();
        for e in PROFILE_ENUMS {
            let info = match nvml_raw::gpu_instance_profile(lib, handle, e) {
                Ok(i) => i,
                Err(Error::NotSupported(_) | Error::InvalidArgument(_) | Error::NotFound(_)) => continue,
                Err(other) => return Err(other),
            };
            let placements = nvml_raw::possible_placements(lib, handle, info.id)?;
            let size = placements.first().map(|p| p.1).unwrap_or(0);
            out.push(HardwareProfile {
                name: info.name,
                id: info.id,
                compute_slices: info.slice_count as u8,
                memory_slices: size as u8,
                max_count: info.instance_count as u8,
                memory_mib: info.memory_mib,
                starts: placements.iter().map(|p| p.0 as u8).collect(),
            });
        }
        Ok(out)
    }

    /// Every GPU instance, with its compute instance when it has one: a GPU instance without
    /// one is listed with `compute_instance_id: None` and no UUID (no MIG device exists).
    fn instances(&mut self, gpu: u32) -> Result<Vec<Instance>, Error> {
        let profiles = self.profile_ids(gpu)?;
        let uuids = self.mig_uuids(gpu)?;
        let d = self.device(gpu)?;
        let lib = self.nvml.lib();
        // SAFETY: the handle belongs to `self.nvml`, which outlives this call.
        let handle = unsafe { d.handle() };
        let mut out = Vec::new();
        for (id, name, slices) in profiles {
            for gi in nvml_raw::gpu_instances(lib, handle, id)? {
                // Only a full-size compute instance makes the GPU instance a MIG device Tessera
                // manages; smaller ones (an admin's) are counted and reported instead.
                let (whole, split_compute) = nvml_raw::compute_split(lib, gi.handle, slices)?;
                let complete = whole && split_compute == 0;
                out.push(Instance {
                    gpu_instance_id: gi.id,
                    compute_instance_id: complete.then_some(0),
                    profile: name.clone(),
                    start: gi.start as u8,
                    size: gi.size as u8,
                    uuid: if complete { uuids.get(&gi.id).cloned().unwrap_or_default() } else { String::new() },
                    split_compute,
                });
            }
        }
        out.sort_by_key(|i| i.start);
        Ok(out)
    }

    fn memory_used_mib(&mut self, gpu: u32, gpu_instance_id: u32) -> Result<u64, Error> {
        self.mig_memory_used_mib(gpu, gpu_instance_id)
    }

    fn processes(&mut self, gpu: u32) -> Result<Vec<GpuProcess>, Error> {
        let d = self.device(gpu)?;
        let list = d.running_compute_processes().map_err(nvml_err("processes"))?;
        Ok(list
            .into_iter()
            .map(|p| GpuProcess { pid: p.pid, gpu_instance_id: p.gpu_instance_id, name: String::new() })
            .collect())
    }

    fn gpu_memory_used_mib(&mut self, gpu: u32) -> Result<u64, Error> {
        Ok(self.device(gpu)?.memory_info().map_err(nvml_err("memory"))?.used / (1024 * 1024))
    }

    fn sm_activity(&mut self, gpu: u32, gpu_instance_id: Option<u32>, uuid: &str) -> Result<SmActivity, Error> {
        self.gpm.sample(&self.nvml, gpu, gpu_instance_id, uuid)
    }

    fn retain_gpm_samples(&mut self, present: &[&str]) {
        self.gpm.retain(&self.nvml, present)
    }

    /// What happened is NVML's activation status (nvml.h, nvmlDeviceSetMigMode): `IN_USE` means
    /// the GPU must be idled and the call retried, only `RESET_REQUIRED` asks for a reset.
    fn set_mig_mode(&mut self, gpu: u32, enabled: bool) -> Result<ModeChange, Error> {
        let d = self.device(gpu)?;
        let status = d.set_mig_mode(enabled).map_err(nvml_err("set MIG mode"))?;
        mode_change(gpu, enabled, nvml_raw::activation(status)?)
    }

    fn create_instance(&mut self, gpu: u32, profile: &str, start: u8) -> Result<Instance, Error> {
        let profiles = self.profiles(gpu)?;
        let p = profiles
            .iter()
            .find(|p| p.name == profile)
            .ok_or_else(|| Error::InvalidArgument(format!("GPU {gpu} has no profile {profile}")))?;
        let d = self.device(gpu)?;
        // SAFETY: the handle belongs to `self.nvml`, which outlives this call.
        let handle = unsafe { d.handle() };
        let id = nvml_raw::create(
            self.nvml.lib(),
            handle,
            p.id,
            u32::from(start),
            u32::from(p.memory_slices),
            u32::from(p.compute_slices),
        )?;
        let instances = self.instances(gpu)?;
        instances
            .into_iter()
            .find(|i| i.gpu_instance_id == id)
            .ok_or_else(|| Error::NotFound(format!("created GPU instance {id} is not listed")))
    }

    fn destroy_instance(&mut self, gpu: u32, gpu_instance_id: u32) -> Result<(), Error> {
        let d = self.device(gpu)?;
        // SAFETY: the handle belongs to `self.nvml`, which outlives this call.
        let handle = unsafe { d.handle() };
        nvml_raw::destroy(self.nvml.lib(), handle, gpu_instance_id)
    }

    fn destroy_half_made(&mut self, gpu: u32, gpu_instance_id: u32) -> Result<(), Error> {
        let d = self.device(gpu)?;
        // SAFETY: the handle belongs to `self.nvml`, which outlives this call.
        let handle = unsafe { d.handle() };
        nvml_raw::destroy_gpu_instance(self.nvml.lib(), handle, gpu_instance_id)
    }
}

mod gpm;
#[cfg(test)]
mod tests;
