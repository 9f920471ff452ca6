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
    /// The GPU is passed through to a VM: the guest cannot reset it, so a MIG mode change on an
    /// Ampere board stays pending (`RESET_REQUIRED`) until a host-side reset or a reboot. On bare
    /// metal the driver resets an idle Ampere GPU itself. Set with a `:passthrough` suffix on the
    /// product in `$TESSERA_SIM_GPUS` (e.g. `A100-40GB:passthrough`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub passthrough: bool,
    /// GPU instance id -> compute instances smaller than it (an admin's `nvidia-smi mig -cci`):
    /// such a GPU instance has no full-size compute instance.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub split: BTreeMap<u32, Vec<SplitCompute>>,
    /// GPU instance id -> MiB held by a context with no process (a zombie): only a reset frees it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub leaked_mib: BTreeMap<u32, u64>,
    /// Clients holding the GPU's device open without a compute context (a device plugin, a DCGM
    /// exporter): not listed as processes, but a MIG mode change cannot activate past them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<String>,
    /// GPU instance id -> the share of time its SMs are active, percent (0-100), as GPM
    /// (`nvmlGpmMigSampleGet`) reports it; unset is 0. Set with `node-agent sim set-activity`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sm_active_percent: BTreeMap<u32, f64>,
    /// The whole GPU's SM activity with MIG off, percent (with MIG on, the GPU's figure is its
    /// instances' mean weighted by compute slices).
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub whole_sm_active_percent: f64,
}

fn is_zero_f64(x: &f64) -> bool {
    *x == 0.0
}

/// SM activity of a device as GPM reports it: a MIG instance's set figure, or a whole GPU's (with
/// MIG on, its instances' figures weighted by compute slices over the GPU's slices).
pub fn sm_active_percent(st: &SimState, gpu: u32, gi: Option<u32>) -> f64 {
    let Some(g) = st.gpus.get(gpu as usize) else { return 0.0 };
    match gi {
        Some(gi) => g.sm_active_percent.get(&gi).copied().unwrap_or(0.0),
        None if !g.info.mig_enabled => g.whole_sm_active_percent,
        None => {
            let Ok(m) = model(&g.info.product) else { return 0.0 };
            let busy: f64 = g
                .instances
                .iter()
                .map(|i| {
                    let slices = m.profile(&i.profile).map_or(0, |p| p.compute_slices);
                    f64::from(slices) * g.sm_active_percent.get(&i.gpu_instance_id).copied().unwrap_or(0.0)
                })
                .sum();
            busy / f64::from(m.compute_slices.max(1))
        }
    }
}

/// A compute instance smaller than its GPU instance (e.g. one of three 1-slice ones in a 3g).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SplitCompute {
    pub id: u32,
    pub slices: u8,
    pub start: u8,
    pub uuid: String,
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

/// Ampere boards change MIG mode through a GPU reset (done by the driver itself on bare metal
/// when the GPU is idle; impossible from a VM guest), and keep the mode across reboots.
pub fn is_ampere(product: &str) -> bool {
    product.contains("A100") || product.contains("A800") || product.contains("A30")
}

/// The product and options of one `$TESSERA_SIM_GPUS` entry: `A100-40GB` or
/// `A100-40GB:passthrough`.
pub fn parse_gpu_spec(spec: &str) -> Result<(&str, bool), Error> {
    match spec.split_once(':') {
        None => Ok((spec, false)),
        Some((product, "passthrough")) => Ok((product, true)),
        Some((_, other)) => Err(Error::InvalidArgument(format!(
            "simulated GPU {spec:?}: unknown option {other:?} (the only option is \"passthrough\")"
        ))),
    }
}

/// 128 bits from FNV-1a over `parts`, twice with different offset bases: deterministic across
/// processes, builds and platforms (std's hasher promises none of that).
fn hash128(parts: &[&str]) -> u128 {
    let fnv = |basis: u64| {
        let mut h = basis;
        for part in parts {
            for b in part.bytes().chain([0xff]) {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        h
    };
    (u128::from(fnv(0xcbf2_9ce4_8422_2325)) << 64) | u128::from(fnv(0x6c62_272e_07bb_0142))
}

/// An NVML-style UUID: `prefix-` then 8-4-4-4-12 lowercase hex, derived from `parts`.
pub fn uuid(prefix: &str, parts: &[&str]) -> String {
    let h = format!("{:032x}", hash128(parts));
    format!("{prefix}-{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// Profile memory in MiB as NVML reports it (`memorySizeMB`), by memory slices. H100 80GB HBM3:
/// read on the real board (docs/hardware/h100-80gb-hbm3.txt, driver 580.159.04). A100 40GB/80GB:
/// NVIDIA's go-nvml mock tables (1g.5gb = 4864 MiB, as nvidia-smi's 4.75 GiB). A30: a public
/// `nvidia-smi mig -lgip` dump (5.81, 11.69, 23.50 GiB). Other boards are estimated from the
/// profile name (GB x 1000, no hardware record).
fn profile_memory_mib(model: &GpuModel, p: &ProfileSpec) -> u64 {
    let measured: &[u64] = match model.name {
        "H100-80GB" => &[9984, 20096, 0, 40448, 0, 0, 0, 81152],
        "A100-40GB" => &[4864, 9856, 0, 19968, 0, 0, 0, 40192],
        "A100-80GB" => &[9856, 19968, 0, 40192, 0, 0, 0, 80384],
        "A30-24GB" => &[5952, 11968, 0, 24064],
        _ => &[],
    };
    match measured.get(usize::from(p.memory_slices).wrapping_sub(1)) {
        Some(&mib) if mib > 0 => mib,
        _ => u64::from(p.memory_gb()) * 1000,
    }
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

/// A new simulated GPU of a catalog product (`spec`: see [`parse_gpu_spec`]), MIG disabled. Its
/// UUID is derived from `host` (what tells simulated nodes apart: the state file) and its index and
/// product, so the same simulated GPU gets the same UUID whenever it is made again.
pub fn new_gpu(host: &str, index: u32, spec: &str) -> Result<SimGpu, Error> {
    let (product, passthrough) = parse_gpu_spec(spec)?;
    let model = catalog::lookup(product)
        .ok_or_else(|| Error::InvalidArgument(format!("unknown simulated GPU product {product:?}")))?;
    Ok(SimGpu {
        info: GpuInfo {
            index,
            uuid: uuid("GPU", &[host, &index.to_string(), model.name]),
            product: model.nvml_names.first().copied().unwrap_or(model.name).to_string(),
            memory_mib: gpu_memory_mib(model),
            mig_capable: true,
            mig_enabled: false,
            mig_pending: None,
        },
        instances: Vec::new(),
        passthrough,
        split: BTreeMap::new(),
        leaked_mib: BTreeMap::new(),
        holders: Vec::new(),
        sm_active_percent: BTreeMap::new(),
        whole_sm_active_percent: 0.0,
    })
}

pub(crate) fn on_gpu(procs: &[SimProcess], gpu: u32) -> impl Iterator<Item = &SimProcess> {
    procs.iter().filter(move |p| p.gpu == gpu)
}

/// `nvmlDeviceSetMigMode`. Setting the current mode clears a pending opposite one. GPU instances
/// make the call fail (`IN_USE`); otherwise the mode becomes pending and activation is tried: an
/// Ampere GPU passed through to a VM needs a host-side reset (`RESET_REQUIRED`); elsewhere (Ampere
/// on bare metal, where the driver resets the GPU itself, and Hopper and later) a process or a
/// holder of the device keeps it pending (`IN_USE`).
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
    if g.passthrough && is_ampere(&g.info.product) {
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
        gpu_instance_id: gpu_instance_id(model, start, spec.memory_slices),
        compute_instance_id: None,
        profile: spec.name.to_string(),
        start,
        size: spec.memory_slices,
        uuid: String::new(),
        split_compute: 0,
    };
    g.instances.push(instance.clone());
    Ok(instance)
}

/// A GPU instance's id follows its placement, as on hardware: the slots form a binary tree
/// numbered breadth first (the whole GPU 0; halves 1, 2; quarters 3..6; single slots 7..14 on
/// an 8-slot GPU, 3..6 on the 4-slot A30, as `nvidia-smi mig -lgi` shows), so an id is reused
/// when an instance is made again at the same place.
pub fn gpu_instance_id(model: &GpuModel, start: u8, size: u8) -> u32 {
    let size = u32::from(size.max(1)).next_power_of_two();
    u32::from(model.memory_slots) / size - 1 + u32::from(start) / size
}

pub(crate) fn instance(g: &mut SimGpu, gpu_index: u32, gi: u32) -> Result<&mut Instance, Error> {
    g.instances
        .iter_mut()
        .find(|i| i.gpu_instance_id == gi)
        .ok_or_else(|| Error::NotFound(format!("GPU instance {gi} on GPU {gpu_index}")))
}

/// `nvmlGpuInstanceCreateComputeInstance` with the full-size profile: the MIG device appears. Its
/// UUID is derived from the GPU's, the GI/CI ids and a creation counter: stable while it exists,
/// new when the instance is made again.
pub fn create_compute_instance(st: &mut SimState, gpu_index: u32, gi: u32) -> Result<Instance, Error> {
    let serial = st.next_uuid.to_string();
    let g = gpu(st, gpu_index)?;
    let uuid = uuid("MIG", &[&g.info.uuid, &gi.to_string(), "0", &serial]);
    if g.split.get(&gi).is_some_and(|v| !v.is_empty()) {
        return Err(Error::InsufficientResources(format!("GPU instance {gi} holds smaller compute instances")));
    }
    let i = instance(g, gpu_index, gi)?;
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
    if instance(g, gpu_index, gi)?.compute_instance_id.is_some() || g.split.get(&gi).is_some_and(|v| !v.is_empty()) {
        return Err(Error::InUse(format!("GPU instance {gi} on GPU {gpu_index} has a compute instance")));
    }
    g.split.remove(&gi);
    g.instances.retain(|i| i.gpu_instance_id != gi);
    g.leaked_mib.remove(&gi);
    g.sm_active_percent.remove(&gi);
    Ok(())
}

/// A reboot or GPU reset: instances and held memory are gone; a pending MIG mode takes effect on
/// Ampere; on Hopper and later MIG mode is not persistent and comes back disabled.
pub fn reboot(st: &mut SimState) {
    for g in &mut st.gpus {
        g.instances.clear();
        g.split.clear();
        g.leaked_mib.clear();
        g.sm_active_percent.clear();
        g.info.mig_enabled = is_ampere(&g.info.product) && g.info.mig_pending.unwrap_or(g.info.mig_enabled);
        g.info.mig_pending = None;
    }
}
