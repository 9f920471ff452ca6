//! Naming and looking up devices, GPUs and MIG devices alike: the calls NVIDIA's device plugin
//! and gpu-feature-discovery make to list MIG devices and to find them again by UUID or PCI
//! address (nvml.h's semantics; return codes cited where MIG handles differ from GPUs).

use std::ffi::{CStr, c_char, c_int, c_uint};

use nvml_wrapper_sys::bindings::*;
use tessera_node_agent::backend::sim::model;

use crate::exports::{mig_devices, nvml_fn};
use crate::profiles;
use crate::session::{Code, Ctx, Dev, bus_ids, gpu_handle, inout, mig_handle, out};

const INVALID: Code = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const NOT_FOUND: Code = nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
const NOT_SUPPORTED: Code = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;

/// Parses a bus id in the forms nvml.h accepts (hex): `domain:bus:device.function`,
/// `domain:bus:device`, `bus:device.function`. Returns (domain, bus, device, function).
pub fn parse_bus_id(s: &str) -> Option<(u32, u32, u32, u32)> {
    let hex = |t: &str| if t.is_empty() { None } else { u32::from_str_radix(t, 16).ok() };
    let parts: Vec<&str> = s.trim().split(':').collect();
    match parts.as_slice() {
        [d, b, rest] => {
            let (dev, f) = match rest.split_once('.') {
                Some((dev, f)) => (hex(dev)?, hex(f)?),
                None => (hex(rest)?, 0),
            };
            Some((hex(d)?, hex(b)?, dev, f))
        }
        [b, rest] => {
            let (dev, f) = rest.split_once('.')?;
            Some((0, hex(b)?, hex(dev)?, hex(f)?))
        }
        _ => None,
    }
}

/// CUDA compute capability by the catalog's model name (the board's architecture): Ampere 8.0,
/// Hopper 9.0, Blackwell datacenter 10.0 (Blackwell Ultra B300/GB300 10.3), RTX PRO Blackwell
/// 12.0.
pub fn compute_capability(product: &str) -> Option<(i32, i32)> {
    let name = model::model(product).ok()?.name;
    Some(if name.starts_with("A30") || name.starts_with("A100") {
        (8, 0)
    } else if name.starts_with("H100") || name.starts_with("H200") || name.starts_with("GH200") {
        (9, 0)
    } else if name.starts_with("B200") || name.starts_with("GB200") {
        (10, 0)
    } else if name.starts_with("B300") || name.starts_with("GB300") {
        (10, 3)
    } else if name.starts_with("RTX-PRO") {
        (12, 0)
    } else {
        return None;
    })
}

/// A C string argument: null or not UTF-8 is an invalid argument.
///
/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn arg_str<'a>(p: *const c_char) -> Result<&'a str, Code> {
    if p.is_null() {
        return Err(INVALID);
    }
    // SAFETY: non-null and NUL-terminated per the contract above.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| INVALID)
}

fn by_uuid(cx: &mut Ctx, uuid: &str) -> Result<nvmlDevice_t, Code> {
    if uuid.is_empty() {
        return Err(INVALID);
    }
    for g in 0..cx.state.gpus.len() as u32 {
        if cx.gpu(g)?.info.uuid == uuid {
            return Ok(gpu_handle(g));
        }
        // A GPU instance without its compute instance is no MIG device: its UUID finds nothing.
        let found = cx.gpu(g)?.instances.iter().find(|i| i.uuid == uuid && i.compute_instance_id.is_some());
        if let Some(i) = found {
            return Ok(mig_handle(g, i.gpu_instance_id));
        }
    }
    Err(NOT_FOUND)
}

nvml_fn!(nvmlDeviceGetHandleByUUID(cx, uuid: *const c_char, device: *mut nvmlDevice_t) {
    // nvml.h: "Reference in which to return the device handle or MIG device handle".
    let uuid = unsafe { arg_str(uuid)? };
    if device.is_null() {
        return Err(INVALID);
    }
    let h = by_uuid(cx, uuid)?;
    unsafe { out(device, h) }
});

fn by_bus_id(cx: &mut Ctx, bus_id: *const c_char, device: *mut nvmlDevice_t) -> Result<(), Code> {
    let wanted = unsafe { arg_str(bus_id)? };
    let wanted = parse_bus_id(wanted).ok_or(INVALID)?;
    if device.is_null() {
        return Err(INVALID);
    }
    // Only physical GPUs sit on the bus; MIG devices have no bus id of their own.
    let g = (0..cx.state.gpus.len() as u32).find(|g| parse_bus_id(&bus_ids(*g).0) == Some(wanted)).ok_or(NOT_FOUND)?;
    unsafe { out(device, gpu_handle(g)) }
}

nvml_fn!(nvmlDeviceGetHandleByPciBusId_v2(cx, bus_id: *const c_char, device: *mut nvmlDevice_t) {
    by_bus_id(cx, bus_id, device)
});

nvml_fn!(nvmlDeviceGetHandleByPciBusId(cx, bus_id: *const c_char, device: *mut nvmlDevice_t) {
    by_bus_id(cx, bus_id, device)
});

nvml_fn!(nvmlDeviceGetIndex(cx, device: nvmlDevice_t, index: *mut c_uint) {
    // nvml.h: a MIG device's index is the one nvmlDeviceGetMigDeviceHandleByIndex takes.
    let i = match cx.device(device)? {
        Dev::Gpu(g) => g,
        Dev::Mig(g, gi) => mig_devices(cx, g)?.iter().position(|x| *x == gi).ok_or(INVALID)? as u32,
    };
    unsafe { out(index, i) }
});

nvml_fn!(nvmlDeviceGetMinorNumber(cx, device: nvmlDevice_t, minor: *mut c_uint) {
    // /dev/nvidia<minor>. A MIG device has no device node of its own (its access goes through
    // the parent's and /dev/nvidia-caps), so the query is NOT_SUPPORTED on it.
    match cx.device(device)? {
        Dev::Gpu(g) => unsafe { out(minor, g) },
        Dev::Mig(..) => Err(NOT_SUPPORTED),
    }
});

nvml_fn!(nvmlDeviceGetCudaComputeCapability(cx, device: nvmlDevice_t, major: *mut c_int, minor: *mut c_int) {
    // A MIG device reports its parent's architecture.
    let g = match cx.device(device)? {
        Dev::Gpu(g) | Dev::Mig(g, _) => g,
    };
    if major.is_null() || minor.is_null() {
        return Err(INVALID);
    }
    let product = cx.gpu(g)?.info.product.clone();
    let (a, b) = compute_capability(&product).ok_or(nvmlReturn_enum_NVML_ERROR_UNKNOWN)?;
    unsafe {
        out(major, a)?;
        out(minor, b)
    }
});

fn attributes(cx: &mut Ctx, device: nvmlDevice_t, attributes: *mut nvmlDeviceAttributes_t) -> Result<(), Code> {
    // nvml.h: "This API currently only supports MIG device handles": a GPU's is NOT_SUPPORTED.
    let (g, gi) = match cx.device(device)? {
        Dev::Mig(g, gi) => (g, gi),
        Dev::Gpu(_) => return Err(NOT_SUPPORTED),
    };
    let a = unsafe { inout(attributes)? };
    let product = cx.gpu(g)?.info.product.clone();
    let name = cx.instance(g, gi)?.profile.clone();
    let p = profiles::by_name(&product, &name).ok_or(nvmlReturn_enum_NVML_ERROR_UNKNOWN)?;
    // The simulator's MIG devices hold one full-size compute instance.
    *a = nvmlDeviceAttributes_t {
        multiprocessorCount: profiles::multiprocessors(&product, &p),
        sharedCopyEngineCount: u32::from(p.compute_slices),
        sharedDecoderCount: 0,
        sharedEncoderCount: 0,
        sharedJpegCount: 0,
        sharedOfaCount: 0,
        gpuInstanceSliceCount: u32::from(p.compute_slices),
        computeInstanceSliceCount: u32::from(p.compute_slices),
        memorySizeMB: p.memory_mib,
    };
    Ok(())
}

nvml_fn!(nvmlDeviceGetAttributes_v2(cx, device: nvmlDevice_t, attrs: *mut nvmlDeviceAttributes_t) {
    attributes(cx, device, attrs)
});

nvml_fn!(nvmlDeviceGetAttributes(cx, device: nvmlDevice_t, attrs: *mut nvmlDeviceAttributes_t) {
    attributes(cx, device, attrs)
});

nvml_fn!(nvmlDeviceGetGpuInstanceRemainingCapacity(cx, device: nvmlDevice_t, profile_id: c_uint, count: *mut c_uint) {
    // nvml.h: NOT_SUPPORTED without MIG mode enabled; an unknown profile id is INVALID_ARGUMENT
    // (as the placements call). The count: how many more the driver would create now, each at
    // the first free start, on a scratch copy of the state.
    let g = cx.physical(device)?;
    let info = cx.gpu(g)?.info.clone();
    if !info.mig_enabled {
        return Err(NOT_SUPPORTED);
    }
    let p = profiles::by_id(&info.product, profile_id).ok_or(INVALID)?;
    if count.is_null() {
        return Err(INVALID);
    }
    let mut scratch = cx.state.clone();
    let mut n = 0;
    while p.starts.iter().any(|s| model::create_gpu_instance(&mut scratch, g, &p.name, *s).is_ok()) {
        n += 1;
    }
    unsafe { out(count, n) }
});
