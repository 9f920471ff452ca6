//! The GPU backend the agent drives: real GPUs through NVML, or simulated ones with the same rules.

pub mod nvml;
mod nvml_raw;
pub mod sim;

use serde::{Deserialize, Serialize};
use tessera_crds::catalog::GpuModel;
use tessera_crds::gpunode::GpuProfileInfo;

use crate::Error;

/// One physical GPU as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    /// NVML product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub product: String,
    pub memory_mib: u64,
    pub mig_capable: bool,
    pub mig_enabled: bool,
    /// The MIG mode after the next reset or reboot, when it differs from the current one.
    pub mig_pending: Option<bool>,
}

/// A MIG device: a GPU instance with one full-size compute instance. `compute_instance_id` is
/// `None` for a GPU instance whose compute instance was never made (its creator died between the
/// two driver calls): no MIG device, no UUID, nothing a pod can use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    pub gpu_instance_id: u32,
    pub compute_instance_id: Option<u32>,
    pub profile: String,
    pub start: u8,
    pub size: u8,
    /// The MIG device UUID.
    pub uuid: String,
    /// Compute instances smaller than the GPU instance (made outside Tessera, e.g. three 1-slice
    /// ones in a 3g with `nvidia-smi mig -cci`); 0 for a MIG device or a half-made instance. Such a
    /// GPU instance is no MIG device Tessera manages: `compute_instance_id` is `None`, and the
    /// agent leaves its GPU alone (`planner::Blocked::SplitComputeInstances`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub split_compute: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A process using a GPU; `gpu_instance_id` is set for processes inside a MIG device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuProcess {
    pub pid: u32,
    pub gpu_instance_id: Option<u32>,
    #[serde(default)]
    pub name: String,
}

/// What GPM says a device's SMs did between this sample and the previous one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SmActivity {
    /// The board has no GPM (A100, A30): only processes and memory can be seen.
    Unsupported,
    /// The device's first sample: a figure needs two.
    FirstSample,
    /// The share of time SMs were busy, percent (GPM's SM_UTIL, DCGM's SM_ACTIVE).
    Percent(f64),
}

/// What a MIG mode change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeChange {
    Applied,
    /// The mode is pending until a GPU reset or a reboot (Ampere; or a reset was refused).
    ResetRequired,
}

/// NVML's activation status in the backend's terms, the same for both backends: `IN_USE` is an
/// error to retry once the GPU's clients are stopped, not a reset.
pub(crate) fn mode_change(gpu: u32, enabled: bool, activation: sim::model::Activation) -> Result<ModeChange, Error> {
    match activation {
        sim::model::Activation::Applied => Ok(ModeChange::Applied),
        sim::model::Activation::ResetRequired => Ok(ModeChange::ResetRequired),
        sim::model::Activation::InUse => Err(Error::InUse(format!(
            "MIG mode change to {} on GPU {gpu} is pending: the GPU is in use (activation status IN_USE); \
             stop its clients and retry",
            if enabled { "enabled" } else { "disabled" }
        ))),
    }
}

/// A GPU-instance profile as the hardware reports it (NVML), or as the catalog states it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HardwareProfile {
    pub name: String,
    pub id: u32,
    pub compute_slices: u8,
    pub memory_slices: u8,
    pub max_count: u8,
    pub memory_mib: u64,
    pub starts: Vec<u8>,
}

/// Everything the agent needs from a GPU. Every method is a single driver call or a read, so the
/// agent can be killed between any two and re-plan from what it reads back.
pub trait GpuBackend: Send {
    fn inventory(&mut self) -> Result<Vec<GpuInfo>, Error>;
    /// The profile table of one GPU (read from NVML at run time on real hardware).
    fn profiles(&mut self, gpu: u32) -> Result<Vec<HardwareProfile>, Error>;
    fn instances(&mut self, gpu: u32) -> Result<Vec<Instance>, Error>;
    fn processes(&mut self, gpu: u32) -> Result<Vec<GpuProcess>, Error>;
    /// Device memory in use in a GPU instance's MIG device, in MiB.
    fn memory_used_mib(&mut self, gpu: u32, gpu_instance_id: u32) -> Result<u64, Error>;
    /// Device memory in use on a whole GPU, in MiB.
    fn gpu_memory_used_mib(&mut self, gpu: u32) -> Result<u64, Error>;
    /// SM activity of a MIG instance (`Some(gpu_instance_id)`) or a whole GPU since the previous
    /// call for the same device: each call takes a GPM sample and keeps it for the next, under
    /// `uuid` (the MIG device's, or the GPU's): an instance made again at the same place gets
    /// the same id but a new UUID, and its first sample must not be paired with the old one's.
    fn sm_activity(&mut self, gpu: u32, gpu_instance_id: Option<u32>, uuid: &str) -> Result<SmActivity, Error>;
    /// Drops the kept GPM samples of devices not in `present` (UUIDs): destroyed instances.
    fn retain_gpm_samples(&mut self, _present: &[&str]) {}
    fn set_mig_mode(&mut self, gpu: u32, enabled: bool) -> Result<ModeChange, Error>;
    /// Creates a GPU instance at `start` and its full-size compute instance.
    fn create_instance(&mut self, gpu: u32, profile: &str, start: u8) -> Result<Instance, Error>;
    /// Destroys the GPU instance (and its compute instances).
    fn destroy_instance(&mut self, gpu: u32, gpu_instance_id: u32) -> Result<(), Error>;
    /// Destroys a GPU instance with no compute instance, and nothing else: if it has one by now,
    /// the driver refuses (`InUse`) and it stays.
    fn destroy_half_made(&mut self, gpu: u32, gpu_instance_id: u32) -> Result<(), Error>;
}

/// A geometry model for the solver built from the hardware's own table (the same model the
/// operator builds from a reported table: one builder, `catalog::model_from_table`).
pub fn model_from_hardware(product: &str, profiles: &[HardwareProfile]) -> &'static GpuModel {
    let table: Vec<GpuProfileInfo> = profiles
        .iter()
        .map(|p| GpuProfileInfo {
            name: p.name.clone(),
            id: p.id,
            compute_slices: p.compute_slices,
            memory_slices: p.memory_slices,
            max_count: p.max_count,
            starts: p.starts.clone(),
        })
        .collect();
    tessera_crds::catalog::model_from_table(product, &table)
}

/// Differences between a hardware table and the catalog, for `node-agent probe`.
pub fn catalog_differences(product: &str, hardware: &[HardwareProfile]) -> Vec<String> {
    let Some(model) = tessera_crds::catalog::lookup(product) else {
        return vec![format!("{product:?} is not in the catalog; the hardware table is used as is")];
    };
    let mut diffs = Vec::new();
    for h in hardware {
        match model.profile(&h.name) {
            None => diffs.push(format!("{}: on the GPU but not in the catalog", h.name)),
            Some(c) => {
                let want = (c.id, c.compute_slices, c.memory_slices, c.max_count, c.starts.to_vec());
                let got = (h.id, h.compute_slices, h.memory_slices, h.max_count, h.starts.clone());
                if want != got {
                    diffs.push(format!("{}: catalog (id, compute, memory, max, starts) {want:?}, GPU {got:?}", h.name));
                }
            }
        }
    }
    for c in model.profiles {
        if !hardware.iter().any(|h| h.name == c.name) {
            diffs.push(format!("{}: in the catalog but not reported by the GPU", c.name));
        }
    }
    diffs
}

/// A boxed backend is a backend (the binary picks NVML or the simulator at run time).
impl GpuBackend for Box<dyn GpuBackend> {
    fn inventory(&mut self) -> Result<Vec<GpuInfo>, Error> {
        (**self).inventory()
    }
    fn profiles(&mut self, gpu: u32) -> Result<Vec<HardwareProfile>, Error> {
        (**self).profiles(gpu)
    }
    fn instances(&mut self, gpu: u32) -> Result<Vec<Instance>, Error> {
        (**self).instances(gpu)
    }
    fn processes(&mut self, gpu: u32) -> Result<Vec<GpuProcess>, Error> {
        (**self).processes(gpu)
    }
    fn memory_used_mib(&mut self, gpu: u32, gpu_instance_id: u32) -> Result<u64, Error> {
        (**self).memory_used_mib(gpu, gpu_instance_id)
    }
    fn gpu_memory_used_mib(&mut self, gpu: u32) -> Result<u64, Error> {
        (**self).gpu_memory_used_mib(gpu)
    }
    fn sm_activity(&mut self, gpu: u32, gpu_instance_id: Option<u32>, uuid: &str) -> Result<SmActivity, Error> {
        (**self).sm_activity(gpu, gpu_instance_id, uuid)
    }
    fn retain_gpm_samples(&mut self, present: &[&str]) {
        (**self).retain_gpm_samples(present)
    }
    fn set_mig_mode(&mut self, gpu: u32, enabled: bool) -> Result<ModeChange, Error> {
        (**self).set_mig_mode(gpu, enabled)
    }
    fn create_instance(&mut self, gpu: u32, profile: &str, start: u8) -> Result<Instance, Error> {
        (**self).create_instance(gpu, profile, start)
    }
    fn destroy_instance(&mut self, gpu: u32, gpu_instance_id: u32) -> Result<(), Error> {
        (**self).destroy_instance(gpu, gpu_instance_id)
    }
    fn destroy_half_made(&mut self, gpu: u32, gpu_instance_id: u32) -> Result<(), Error> {
        (**self).destroy_half_made(gpu, gpu_instance_id)
    }
}
