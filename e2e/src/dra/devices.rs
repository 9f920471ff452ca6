//! A node's devices as NVIDIA's DRA driver (`gpu.nvidia.com`, static MIG) publishes them, built
//! from what the node agent reports in its GpuNode's status: a GPU with MIG off is one device
//! `gpu-<minor>`; a GPU with MIG on is its MIG devices `gpu-<minor>-mig-<profile>-<GI profile
//! id>-<start>` (the name NVIDIA's driver gives them since v25.12; older releases wrote
//! `gpu-<minor>-mig-<GI profile id>-<start>-<size>`), and not itself.
//!
//! The report has no minor numbers, versions or engine counts: the GPU index stands for the
//! minor, the versions are those of the H100 the catalog was read on, and the per-profile
//! engine and multiprocessor counts are approximations. Profile, UUIDs, placement, memory and
//! memory slices follow the report exactly: those are what claims select on.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tessera_crds::catalog;
use tessera_crds::gpunode::{GpuNodeStatus, GpuState, MigInstance};

/// Most devices one ResourceSlice may list (`resource.k8s.io/v1`).
pub const MAX_DEVICES_PER_SLICE: usize = 128;

/// The driver version NVIDIA's driver would report (semver of 580.159.04).
const DRIVER_VERSION: &str = "580.159.4";
const CUDA_DRIVER_VERSION: &str = "13.0.0";

/// Something in the report that yields no device, and why (the simulated driver logs these).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Where in the GpuNode, e.g. `status.gpus[0].instances[2].uuid`.
    pub path: String,
    pub reason: String,
}

/// The devices to publish for one node, and what was left out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeDevices {
    pub devices: Vec<Device>,
    pub skipped: Vec<Skipped>,
}

/// Builds the devices of a node from its agent's report. Never fails: a GPU or instance that
/// cannot be published is listed in `skipped` with the field and the reason, the rest is kept.
pub fn node_devices(status: &GpuNodeStatus) -> NodeDevices {
    let mut out = NodeDevices::default();
    let mut names = BTreeSet::new();
    for (g, gpu) in status.gpus.iter().enumerate() {
        let at = format!("status.gpus[{g}]");
        if gpu.index < 0 {
            out.skip(format!("{at}.index"), format!("index {} is negative", gpu.index));
            continue;
        }
        if gpu.uuid.trim().is_empty() {
            out.skip(format!("{at}.uuid"), "no GPU UUID reported".into());
            continue;
        }
        let mut candidates = Vec::new();
        if gpu.mig_enabled {
            for (i, inst) in gpu.instances.iter().enumerate() {
                let at = format!("{at}.instances[{i}]");
                match mig_device(gpu, inst) {
                    Ok(d) => candidates.push((at, d)),
                    Err((field, reason)) => out.skip(format!("{at}{field}"), reason),
                }
            }
        } else {
            candidates.push((at, gpu_device(gpu)));
        }
        for (at, device) in candidates {
            if !names.insert(device.name.clone()) {
                out.skip(at, format!("a second device named {}", device.name));
            } else if out.devices.len() >= MAX_DEVICES_PER_SLICE {
                out.skip(at, format!("more than {MAX_DEVICES_PER_SLICE} devices on one node"));
            } else {
                out.devices.push(device);
            }
        }
    }
    out
}

impl NodeDevices {
    fn skip(&mut self, path: String, reason: String) {
        self.skipped.push(Skipped { path, reason });
    }
}

/// The device name NVIDIA's driver gives a MIG device.
pub fn mig_device_name(minor: i32, profile: &str, gi_profile_id: u32, start: i32) -> String {
    let profile: String = catalog::normalize_profile(profile)
        .replace('.', "")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' })
        .collect();
    format!("gpu-{minor}-mig-{}-{gi_profile_id}-{start}", profile.trim_matches('-'))
}

fn gpu_device(gpu: &GpuState) -> Device {
    let mut attributes = common_attributes(gpu);
    attributes.insert("type".into(), string("gpu"));
    attributes.insert("uuid".into(), string(&gpu.uuid));
    let mut capacity = BTreeMap::new();
    if gpu.memory_mib > 0 {
        capacity.insert("memory".into(), capacity_of(gpu.memory_mib.saturating_mul(1 << 20)));
    }
    Device {
        name: format!("gpu-{}", gpu.index),
        attributes: Some(attributes),
        capacity: Some(capacity),
        ..Default::default()
    }
}

/// One MIG device, or the field (suffix of the instance's path) and why it cannot be published.
fn mig_device(gpu: &GpuState, inst: &MigInstance) -> Result<Device, (&'static str, String)> {
    let uuid = inst.uuid.as_deref().map(str::trim).unwrap_or_default();
    if uuid.is_empty() {
        return Err((".uuid", "no MIG UUID reported: the device does not exist yet".into()));
    }
    let geometry = geometry(gpu, &inst.profile)
        .ok_or_else(|| (".profile", format!("profile {:?} is unknown for {:?}", inst.profile, gpu.product)))?;
    let end = i64::from(inst.start) + i64::from(inst.size);
    if inst.start < 0 || inst.size <= 0 || end > i64::from(geometry.memory_slots) {
        return Err((
            ".start",
            format!(
                "placement start {} size {} is outside the {} memory slots",
                inst.start, inst.size, geometry.memory_slots
            ),
        ));
    }
    let profile = catalog::normalize_profile(&inst.profile);
    let mut attributes = common_attributes(gpu);
    attributes.insert("type".into(), string("mig"));
    attributes.insert("uuid".into(), string(uuid));
    attributes.insert("parentUUID".into(), string(&gpu.uuid));
    attributes.insert("profile".into(), string(&profile));
    let memory_mib = if gpu.memory_mib > 0 {
        gpu.memory_mib * i64::from(geometry.memory_slices) / i64::from(geometry.memory_slots)
    } else {
        i64::from(catalog::parse_profile_name(&profile).map_or(0, |p| p.memory_gb)) * 1024
    };
    let compute = i64::from(geometry.compute_slices);
    let full_or_media = profile.ends_with("+me") || geometry.compute_slices >= geometry.compute_slots;
    let mut capacity: BTreeMap<String, DeviceCapacity> = [
        ("multiprocessors", compute * sms_per_slice(&gpu.product)),
        ("copyEngines", compute),
        ("decoders", compute),
        ("encoders", i64::from(full_or_media)),
        ("jpegEngines", i64::from(full_or_media)),
        ("ofaEngines", i64::from(full_or_media)),
        ("memory", memory_mib.saturating_mul(1 << 20)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), capacity_of(v)))
    .collect();
    for slot in inst.start..inst.start + inst.size {
        capacity.insert(format!("memorySlice{slot}"), capacity_of(1));
    }
    Ok(Device {
        name: mig_device_name(gpu.index, &profile, geometry.id, inst.start),
        attributes: Some(attributes),
        capacity: Some(capacity),
        ..Default::default()
    })
}

/// What the device name and capacities need of a profile.
struct Geometry {
    id: u32,
    compute_slices: u8,
    memory_slices: u8,
    memory_slots: u8,
    compute_slots: u8,
}

/// The profile as the GPU's reported table has it, else as the catalog has it for the product.
fn geometry(gpu: &GpuState, profile: &str) -> Option<Geometry> {
    let wanted = catalog::normalize_profile(profile);
    if catalog::valid_table(&gpu.profiles) {
        let model = catalog::model_from_table(&gpu.product, &gpu.profiles);
        let p = gpu.profiles.iter().find(|p| catalog::normalize_profile(&p.name) == wanted)?;
        return Some(Geometry {
            id: p.id,
            compute_slices: p.compute_slices,
            memory_slices: p.memory_slices,
            memory_slots: model.memory_slots,
            compute_slots: model.compute_slices,
        });
    }
    let model = catalog::lookup(&gpu.product)?;
    let p = model.profile(&wanted)?;
    Some(Geometry {
        id: p.id,
        compute_slices: p.compute_slices,
        memory_slices: p.memory_slices,
        memory_slots: model.memory_slots,
        compute_slots: model.compute_slices,
    })
}

/// Attributes every device of a GPU carries (NVIDIA's `CommonAttributesMig` and the GPU's own).
fn common_attributes(gpu: &GpuState) -> BTreeMap<String, DeviceAttribute> {
    let mut a = BTreeMap::new();
    a.insert("productName".into(), string(&gpu.product));
    a.insert("brand".into(), string("Nvidia"));
    if let Some((architecture, compute_capability)) = architecture(&gpu.product) {
        a.insert("architecture".into(), string(architecture));
        a.insert("cudaComputeCapability".into(), version(compute_capability));
    }
    a.insert("driverVersion".into(), version(DRIVER_VERSION));
    a.insert("cudaDriverVersion".into(), version(CUDA_DRIVER_VERSION));
    a
}

/// Architecture and CUDA compute capability of the catalog's boards.
fn architecture(product: &str) -> Option<(&'static str, &'static str)> {
    let name = catalog::lookup(product)?.name;
    if name.starts_with("A30") || name.starts_with("A100") {
        Some(("Ampere", "8.0.0"))
    } else if name.starts_with("B200") {
        Some(("Blackwell", "10.0.0"))
    } else {
        Some(("Hopper", "9.0.0"))
    }
}

/// Streaming multiprocessors per compute slice (approximate: 98 of A100's 108 SMs serve 7 slices).
fn sms_per_slice(product: &str) -> i64 {
    match architecture(product) {
        Some(("Ampere", _)) => 14,
        Some(("Blackwell", _)) => 18,
        _ => 16,
    }
}

fn string(s: &str) -> DeviceAttribute {
    DeviceAttribute { string: Some(s.to_string()), ..Default::default() }
}

fn version(v: &str) -> DeviceAttribute {
    DeviceAttribute { version: Some(v.to_string()), ..Default::default() }
}

fn capacity_of(n: i64) -> DeviceCapacity {
    DeviceCapacity { value: canonical_quantity(n), ..Default::default() }
}

/// `n` written as the API server stores a binary quantity (`10240Mi` comes back as `10Gi`), so
/// what is published reads back unchanged.
pub fn canonical_quantity(n: i64) -> Quantity {
    const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let (mut mantissa, mut exp) = (n, 0);
    while mantissa != 0 && mantissa % 1024 == 0 && exp + 1 < SUFFIXES.len() && n.unsigned_abs() >= 1024 {
        mantissa /= 1024;
        exp += 1;
    }
    Quantity(format!("{mantissa}{}", SUFFIXES[exp]))
}
