//! GPU instances: the profiles a MIG-capable GPU offers and where they may be placed, and making,
//! listing and destroying GPU instances (nvml.h's semantics; MIG rules are the simulator's).

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings::*;
use tessera_node_agent::backend::sim::model;

use crate::exports::{mig_gpu, nvml_fn, version};
use crate::profiles;
use crate::session::{self, Code, Ctx, fail, gi_handle, gpu_handle, inout, out};

const VERSION_MISMATCH: Code = nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
const INVALID: Code = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const NOT_SUPPORTED: Code = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;

/// The GPU's product and its GPU instance profile for `profile` (an NVML profile enum).
fn profile_info(
    cx: &mut Ctx,
    device: nvmlDevice_t,
    profile: c_uint,
) -> Result<(String, tessera_node_agent::backend::HardwareProfile), Code> {
    let g = cx.physical(device)?;
    let product = cx.gpu(g)?.info.product.clone();
    if !cx.gpu(g)?.info.mig_capable {
        return Err(NOT_SUPPORTED);
    }
    if profile >= NVML_GPU_INSTANCE_PROFILE_COUNT {
        return Err(INVALID);
    }
    let p = profiles::by_enum(&product, profile).ok_or(NOT_SUPPORTED)?;
    Ok((product, p))
}

nvml_fn!(nvmlDeviceGetGpuInstanceProfileInfo(
    cx,
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) {
    let (product, p) = profile_info(cx, device, profile)?;
    let eng = profiles::engines(&product, &p);
    let i = unsafe { inout(info)? };
    i.id = p.id;
    i.isP2pSupported = 0;
    i.sliceCount = u32::from(p.compute_slices);
    i.instanceCount = u32::from(p.max_count);
    i.multiprocessorCount = eng.sm;
    i.copyEngineCount = eng.copy;
    (i.decoderCount, i.encoderCount, i.jpegCount, i.ofaCount) = (eng.decoders, eng.encoders, eng.jpeg, eng.ofa);
    i.memorySizeMB = p.memory_mib;
    Ok(())
});

nvml_fn!(nvmlDeviceGetGpuInstanceProfileInfoV(
    cx,
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
) {
    // nvml.h: `info->version` must be nvmlGpuInstanceProfileInfo_v2 or _v3
    // (NVML_STRUCT_VERSION: size | version << 24); anything else is a version mismatch.
    let v = unsafe { inout(info)? }.version;
    let v2 = version(std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>(), 2);
    let v3 = version(std::mem::size_of::<nvmlGpuInstanceProfileInfo_v3_t>(), 3);
    if v != v2 && v != v3 {
        return Err(VERSION_MISMATCH);
    }
    let (product, p) = profile_info(cx, device, profile)?;
    let eng = profiles::engines(&product, &p);
    let i = unsafe { inout(info)? };
    i.id = p.id;
    i.isP2pSupported = 0;
    i.sliceCount = u32::from(p.compute_slices);
    i.instanceCount = u32::from(p.max_count);
    i.multiprocessorCount = eng.sm;
    i.copyEngineCount = eng.copy;
    (i.decoderCount, i.encoderCount, i.jpegCount, i.ofaCount) = (eng.decoders, eng.encoders, eng.jpeg, eng.ofa);
    i.memorySizeMB = p.memory_mib;
    session::fill_name(&mut i.name, &format!("MIG {}", p.name));
    if v == v3 {
        // The v3 layout differs from v2 after `version` (no isP2pSupported, a capabilities word).
        let i3 = unsafe { inout(info.cast::<nvmlGpuInstanceProfileInfo_v3_t>())? };
        i3.id = p.id;
        i3.sliceCount = u32::from(p.compute_slices);
        i3.instanceCount = u32::from(p.max_count);
        i3.multiprocessorCount = eng.sm;
        i3.copyEngineCount = eng.copy;
        (i3.decoderCount, i3.encoderCount, i3.jpegCount, i3.ofaCount) = (eng.decoders, eng.encoders, eng.jpeg, eng.ofa);
        i3.memorySizeMB = p.memory_mib;
        session::fill_name(&mut i3.name, &format!("MIG {}", p.name));
        i3.capabilities = 0;
    }
    Ok(())
});

nvml_fn!(nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    cx,
    device: nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) {
    let g = cx.physical(device)?;
    let product = cx.gpu(g)?.info.product.clone();
    let p = profiles::by_id(&product, profile_id).ok_or(INVALID)?;
    let capacity = unsafe { *inout(count)? };
    unsafe { out(count, p.starts.len() as u32)? };
    // nvml.h: a null `placements` asks for the count.
    if placements.is_null() {
        return Ok(());
    }
    if (capacity as usize) < p.starts.len() {
        return Err(nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (i, s) in p.starts.iter().enumerate() {
        let placement = nvmlGpuInstancePlacement_t { start: u32::from(*s), size: u32::from(p.memory_slices) };
        unsafe { placements.add(i).write(placement) };
    }
    Ok(())
});

nvml_fn!(nvmlDeviceCreateGpuInstanceWithPlacement(
    cx,
    device: nvmlDevice_t,
    profile_id: c_uint,
    placement: *const nvmlGpuInstancePlacement_t,
    gpu_instance: *mut nvmlGpuInstance_t,
) {
    let (g, product) = mig_gpu(cx, device)?;
    let p = profiles::by_id(&product, profile_id).ok_or(INVALID)?;
    let at = unsafe { placement.as_ref() }.ok_or(INVALID)?;
    if gpu_instance.is_null() || at.size != u32::from(p.memory_slices) || at.start > 255 {
        return Err(INVALID);
    }
    let made = model::create_gpu_instance(&mut cx.state, g, &p.name, at.start as u8).map_err(fail)?;
    cx.changed = true;
    unsafe { out(gpu_instance, gi_handle(g, made.gpu_instance_id)) }
});

nvml_fn!(nvmlDeviceCreateGpuInstance(cx, device: nvmlDevice_t, profile_id: c_uint, gpu_instance: *mut nvmlGpuInstance_t) {
    // Without a placement the driver picks one, from the highest valid start down (NVIDIA's
    // user guide examples: two `-cgi 9` make GPU instances 2 then 1, i.e. 4:4 then 0:4; a 1g
    // first lands at 6:1, id 13), leaving the low slots free for large profiles.
    let (g, product) = mig_gpu(cx, device)?;
    let p = profiles::by_id(&product, profile_id).ok_or(INVALID)?;
    if gpu_instance.is_null() {
        return Err(INVALID);
    }
    let made = p
        .starts
        .iter()
        .rev()
        .find_map(|s| model::create_gpu_instance(&mut cx.state, g, &p.name, *s).ok())
        .ok_or(nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES)?;
    cx.changed = true;
    unsafe { out(gpu_instance, gi_handle(g, made.gpu_instance_id)) }
});

nvml_fn!(nvmlDeviceGetGpuInstances(
    cx,
    device: nvmlDevice_t,
    profile_id: c_uint,
    gpu_instances: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) {
    let (g, product) = mig_gpu(cx, device)?;
    let p = profiles::by_id(&product, profile_id).ok_or(INVALID)?;
    if gpu_instances.is_null() {
        return Err(INVALID);
    }
    let ids: Vec<u32> =
        cx.gpu(g)?.instances.iter().filter(|i| i.profile == p.name).map(|i| i.gpu_instance_id).collect();
    // nvml.h: the array must hold the profile's instanceCount entries.
    for (i, id) in ids.iter().enumerate() {
        unsafe { gpu_instances.add(i).write(gi_handle(g, *id)) };
    }
    unsafe { out(count, ids.len() as u32) }
});

nvml_fn!(nvmlDeviceGetGpuInstanceById(cx, device: nvmlDevice_t, id: c_uint, gpu_instance: *mut nvmlGpuInstance_t) {
    let (g, _) = mig_gpu(cx, device)?;
    if !cx.gpu(g)?.instances.iter().any(|i| i.gpu_instance_id == id) {
        return Err(nvmlReturn_enum_NVML_ERROR_NOT_FOUND);
    }
    unsafe { out(gpu_instance, gi_handle(g, id)) }
});

nvml_fn!(nvmlGpuInstanceGetInfo(cx, gpu_instance: nvmlGpuInstance_t, info: *mut nvmlGpuInstanceInfo_t) {
    let (g, gi) = cx.gpu_instance(gpu_instance)?;
    let product = cx.gpu(g)?.info.product.clone();
    let i = cx.instance(g, gi)?.clone();
    let profile_id = profiles::by_name(&product, &i.profile).map(|p| p.id).unwrap_or(0);
    let value = nvmlGpuInstanceInfo_t {
        device: gpu_handle(g),
        id: gi,
        profileId: profile_id,
        placement: nvmlGpuInstancePlacement_t { start: u32::from(i.start), size: u32::from(i.size) },
    };
    unsafe { out(info, value) }
});

nvml_fn!(nvmlGpuInstanceDestroy(cx, gpu_instance: nvmlGpuInstance_t) {
    // nvml.h: IN_USE while compute instances (or processes) are active in it.
    let (g, gi) = cx.gpu_instance(gpu_instance)?;
    model::destroy_gpu_instance(&mut cx.state, g, gi).map_err(fail)?;
    cx.changed = true;
    Ok(())
});
