//! The simulated GPUs' state and MIG rules: the one implementation of MIG behaviour behind both
//! the simulator backend ([`super::SimBackend`]) and the simulated NVML library
//! (`node-agent/nvml-sim`, `libnvidia-ml.so.1`). Pure: no I/O; callers load and save the state.
//!
//! A MIG device is two driver objects, as on the hardware: a GPU instance, then a compute instance
//! in it. A GPU instance without its compute instance (the creator died between the two calls) is
//! stored with `compute_instance_id: None` and no MIG device UUID.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tessera_crds::catalog::{self, GpuModel, ProfileSpec};
use tessera_crds::solver::{self, Placement};

use crate::Error;
use crate::backend::{GpuInfo, GpuProcess, HardwareProfile, Instance};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimState {
    pub gpus: Vec<SimGpu>,
    /// Mutating operations performed so far (drives the simulator backend's injected faults).
    pub ops: u64,
    pub next_uuid: u64,
    /// Faults the simulated NVML library injects into its calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub call_faults: Vec<CallFault>,
    /// Bumped by a simulated driver restart: NVML sessions opened before it see their GPUs lost.
    #[serde(default)]
    pub driver_generation: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimGpu {
    pub info: GpuInfo,
    pub instances: Vec<Instance>,
    pub next_gpu_instance_id: u32,
    /// GPU instance id -> MiB held by a context with no process (a zombie): only a reset frees it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub leaked_mib: BTreeMap<u32, u64>,
    /// Clients holding the GPU's device open without a compute context (a device plugin, a DCGM
    /// exporter): not listed as processes, but a MIG mode change cannot activate past them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimProcess {
    pub gpu: u32,
    #[serde(flatten)]
    pub process: GpuProcess,
    /// Device memory the process holds.
    #[serde(default)]
    pub used_mib: u64,
}

/// A fault the simulated NVML library injects: the `nth` call (1-based, counted from when the
/// fault was written) of every NVML function whose name starts with `function` (all when empty)
/// returns `code`, or aborts the process before doing anything when `crash` is set.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallFault {
    #[serde(default)]
    pub function: String,
    pub nth: u64,
    #[serde(default)]
    pub code: u32,
    #[serde(default)]
    pub crash: bool,
    /// Matching calls seen so far.
    #[serde(default)]
    pub seen: u64,
}

/// What a MIG mode change did, as NVML's activation status says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Applied,
    /// The mode is pending: something holds the GPU (Hopper and later); idle it and retry.
    InUse,
    /// The mode is pending until a GPU reset or reboot (Ampere).
    ResetRequired,
}

/// Ampere boards need a GPU reset to change MIG mode; Hopper and later do not.
pub fn needs_reset(product: &str) -> bool {
    product.contains("A100") || product.contains("A800") || product.contains("A30")
}

/// Profile memory in MiB as NVML reports it. H100 80GB HBM3 values were read on the real board
/// (docs/hardware/h100-80gb-hbm3.txt, driver 580.159.04); other boards are estimated from the
/// profile name (GB x 1000, no hardware record).
fn profile_memory_mib(model: &GpuModel, p: &ProfileSpec) -> u64 {
    if model.name == "H100-80GB" {
        match p.memory_slices {
            1 => return 9984,
            2 => return 20096,
            4 => return 40448,
            8 => return 81152,
            _ => {}
        }
    }
    u64::from(p.memory_gb()) * 1000
}

/// Whole-GPU memory in MiB: the H100 80GB HBM3's measured 81559 MiB, otherwise GB x 1024.
pub fn gpu_memory_mib(model: &GpuModel) -> u64 {
    if model.name == "H100-80GB" {
        return 81559;
    }
    u64::from(model.profiles.iter().map(|p| p.memory_gb()).max().unwrap_or(0)) * 1024
}

/// The profile table a simulated GPU reports.
pub fn profiles(model: &GpuModel) -> Vec<HardwareProfile> {
    model
        .profiles
        .iter()
        .map(|p| HardwareProfile {
            name: p.name.to_string(),
            id: p.id,
            compute_slices: p.compute_slices,
            memory_slices: p.memory_slices,
            max_count: p.max_count,
            memory_mib: profile_memory_mib(model, p),
            starts: p.starts.to_vec(),
        })
        .collect()
}

pub fn model(product: &str) -> Result<&'static GpuModel, Error> {
    catalog::lookup(product).ok_or_else(|| Error::NotSupported(format!("{product} has no MIG geometry")))
}

pub fn gpu(state: &mut SimState, gpu: u32) -> Result<&mut SimGpu, Error> {
    state.gpus.get_mut(gpu as usize).ok_or_else(|| Error::NotFound(format!("GPU {gpu}")))
}

/// A new simulated GPU of a catalog product, MIG disabled.
pub fn new_gpu(index: u32, product: &str) -> Result<SimGpu, Error> {
    let model = catalog::lookup(product)
        .ok_or_else(|| Error::InvalidArgument(format!("unknown simulated GPU product {product:?}")))?;
    Ok(SimGpu {
        info: GpuInfo {
            index,
            uuid: format!("GPU-sim-{index:04}-{}", model.name.to_ascii_lowercase()),
            product: model.nvml_names.first().copied().unwrap_or(model.name).to_string(),
            memory_mib: gpu_memory_mib(model),
            mig_capable: true,
            mig_enabled: false,
            mig_pending: None,
        },
        instances: Vec::new(),
        next_gpu_instance_id: 1,
        leaked_mib: BTreeMap::new(),
        holders: Vec::new(),
    })
}

fn on_gpu(procs: &[SimProcess], gpu: u32) -> impl Iterator<Item = &SimProcess> {
    procs.iter().filter(move |p| p.gpu == gpu)
}

/// `nvmlDeviceSetMigMode`. Setting the current mode clears a pending opposite one. GPU instances
/// make the call fail (`IN_USE`); otherwise the mode becomes pending and activation is tried:
/// Ampere needs a reset, and on Hopper and later a process or a holder of the device keeps it
/// (`IN_USE`).
pub fn set_mig_mode(
    st: &mut SimState,
    procs: &[SimProcess],
    gpu_index: u32,
    enabled: bool,
) -> Result<Activation, Error> {
    let g = gpu(st, gpu_index)?;
    if !g.info.mig_capable {
        return Err(Error::NotSupported(format!("GPU {gpu_index} is not MIG capable")));
    }
    if g.info.mig_enabled == enabled {
        g.info.mig_pending = None;
        return Ok(Activation::Applied);
    }
    if !g.instances.is_empty() {
        return Err(Error::InUse(format!("GPU {gpu_index} has GPU instances")));
    }
    g.info.mig_pending = Some(enabled);
    if needs_reset(&g.info.product) {
        return Ok(Activation::ResetRequired);
    }
    if on_gpu(procs, gpu_index).next().is_some() || !g.holders.is_empty() {
        return Ok(Activation::InUse);
    }
    g.info.mig_enabled = enabled;
    g.info.mig_pending = None;
    Ok(Activation::Applied)
}

/// `nvmlDeviceCreateGpuInstanceWithPlacement`: a GPU instance with no compute instance yet.
pub fn create_gpu_instance(st: &mut SimState, gpu_index: u32, profile: &str, start: u8) -> Result<Instance, Error> {
    let g = gpu(st, gpu_index)?;
    if !g.info.mig_enabled {
        return Err(Error::InvalidArgument(format!("MIG mode is disabled on GPU {gpu_index}")));
    }
    let model = model(&g.info.product)?;
    let spec =
        model.profile(profile).ok_or_else(|| Error::InvalidArgument(format!("profile {profile} on {}", model.name)))?;
    let mut layout: Vec<Placement> =
        g.instances.iter().map(|i| Placement { start: i.start, size: i.size, profile: i.profile.clone() }).collect();
    layout.push(Placement { start, size: spec.memory_slices, profile: spec.name.to_string() });
    if !solver::is_valid(model, &layout) {
        return Err(Error::InsufficientResources(format!(
            "{}@{start} does not fit next to {:?}",
            spec.name, g.instances
        )));
    }
    let instance = Instance {
        gpu_instance_id: g.next_gpu_instance_id,
        compute_instance_id: None,
        profile: spec.name.to_string(),
        start,
        size: spec.memory_slices,
        uuid: String::new(),
    };
    g.next_gpu_instance_id += 1;
    g.instances.push(instance.clone());
    Ok(instance)
}

fn instance(g: &mut SimGpu, gpu_index: u32, gi: u32) -> Result<&mut Instance, Error> {
    g.instances
        .iter_mut()
        .find(|i| i.gpu_instance_id == gi)
        .ok_or_else(|| Error::NotFound(format!("GPU instance {gi} on GPU {gpu_index}")))
}

/// `nvmlGpuInstanceCreateComputeInstance` with the full-size profile: the MIG device appears.
pub fn create_compute_instance(st: &mut SimState, gpu_index: u32, gi: u32) -> Result<Instance, Error> {
    let uuid = format!("MIG-sim-{gpu_index:02}-{:06}", st.next_uuid);
    let i = instance(gpu(st, gpu_index)?, gpu_index, gi)?;
    if i.compute_instance_id.is_some() {
        return Err(Error::InsufficientResources(format!("GPU instance {gi} already has its compute instance")));
    }
    i.compute_instance_id = Some(0);
    i.uuid = uuid;
    let out = i.clone();
    st.next_uuid += 1;
    Ok(out)
}

/// Memory in use in a GPU instance: its processes' plus what a zombie context holds.
pub fn memory_used_mib(st: &SimState, procs: &[SimProcess], gpu_index: u32, gi: u32) -> u64 {
    let processes: u64 =
        on_gpu(procs, gpu_index).filter(|p| p.process.gpu_instance_id == Some(gi)).map(|p| p.used_mib).sum();
    let leaked = st.gpus.get(gpu_index as usize).and_then(|g| g.leaked_mib.get(&gi)).copied().unwrap_or(0);
    processes + leaked
}

/// `nvmlComputeInstanceDestroy`: refused while a process (or a zombie context) uses it.
pub fn destroy_compute_instance(st: &mut SimState, procs: &[SimProcess], gpu_index: u32, gi: u32) -> Result<(), Error> {
    if memory_used_mib(st, procs, gpu_index, gi) > 0
        || on_gpu(procs, gpu_index).any(|p| p.process.gpu_instance_id == Some(gi))
    {
        return Err(Error::InUse(format!("GPU instance {gi} on GPU {gpu_index} has processes or held memory")));
    }
    let i = instance(gpu(st, gpu_index)?, gpu_index, gi)?;
    if i.compute_instance_id.take().is_none() {
        return Err(Error::NotFound(format!("compute instance of GPU instance {gi} on GPU {gpu_index}")));
    }
    i.uuid.clear();
    Ok(())
}

/// `nvmlGpuInstanceDestroy`: refused while compute instances are active in it (nvml.h: `IN_USE`).
pub fn destroy_gpu_instance(st: &mut SimState, gpu_index: u32, gi: u32) -> Result<(), Error> {
    let g = gpu(st, gpu_index)?;
    if instance(g, gpu_index, gi)?.compute_instance_id.is_some() {
        return Err(Error::InUse(format!("GPU instance {gi} on GPU {gpu_index} has a compute instance")));
    }
    g.instances.retain(|i| i.gpu_instance_id != gi);
    g.leaked_mib.remove(&gi);
    Ok(())
}

/// A reboot or GPU reset: instances and held memory are gone; a pending MIG mode takes effect on
/// Ampere; on Hopper and later MIG mode is not persistent and comes back disabled.
pub fn reboot(st: &mut SimState) {
    for g in &mut st.gpus {
        g.instances.clear();
        g.leaked_mib.clear();
        g.info.mig_enabled = needs_reset(&g.info.product) && g.info.mig_pending.unwrap_or(g.info.mig_enabled);
        g.info.mig_pending = None;
    }
}
