//! The NVML functions the agent's paths use, with nvml.h's semantics (cited per function where
//! the behaviour is not obvious). MIG rules are the simulator's (`backend::sim::model`).

use std::ffi::{c_char, c_uint};

use nvml_wrapper_sys::bindings::*;
use tessera_node_agent::backend::sim::model::{self, Activation};
use tessera_node_agent::backend::sim::split;

use crate::profiles;
use crate::session::{self, Code, Ctx, Dev, ci_handle, fail, gi_handle, gpu_handle, inout, mig_handle, out, out_str};

const MIB: u64 = 1024 * 1024;
/// nvml.h: `gpuInstanceId` / `computeInstanceId` are 0xFFFFFFFF outside MIG.
const NO_ID: u32 = 0xFFFF_FFFF;
const DRIVER_VERSION: &str = "580.159.04";

macro_rules! nvml_fn {
    ($name:ident($cx:ident $(, $arg:ident: $ty:ty)* $(,)?) $body:block) => {
        /// An NVML entry point; see nvml.h.
        ///
        /// # Safety
        /// Pointer arguments are null or valid as nvml.h states for this function.
        #[unsafe(no_mangle)]
        #[allow(unused_unsafe, unused_variables)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> nvmlReturn_t {
            crate::session::call(stringify!($name), |$cx: &mut crate::session::Ctx| -> Result<(), crate::session::Code> { $body })
        }
    };
}
pub(crate) use nvml_fn;

fn version(data_size: usize, ver: u32) -> u32 {
    data_size as u32 | (ver << 24)
}

const VERSION_MISMATCH: Code = nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
const INVALID: Code = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const NOT_SUPPORTED: Code = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;

// ---- init, shutdown, errors, system ----

/// # Safety
/// No pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    session::init("nvmlInit_v2")
}

/// # Safety
/// No pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit() -> nvmlReturn_t {
    session::init("nvmlInit")
}

/// # Safety
/// No pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    session::init("nvmlInitWithFlags")
}

/// # Safety
/// No pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    session::shutdown()
}

/// # Safety
/// No pointers; returns a static NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let s: &'static [u8] = match result {
        nvmlReturn_enum_NVML_SUCCESS => b"Success\0",
        nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => b"Uninitialized\0",
        nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => b"Invalid Argument\0",
        nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => b"Not Supported\0",
        nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => b"Insufficient Permissions\0",
        nvmlReturn_enum_NVML_ERROR_NOT_FOUND => b"Not Found\0",
        nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE => b"Insufficient Size\0",
        nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED => b"Driver Not Loaded\0",
        nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => b"GPU is lost\0",
        nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED => b"GPU requires reset\0",
        nvmlReturn_enum_NVML_ERROR_IN_USE => b"In use by another client\0",
        nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES => b"Insufficient resources\0",
        nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH => b"Version mismatch\0",
        _ => b"Unknown Error\0",
    };
    s.as_ptr().cast()
}

nvml_fn!(nvmlSystemGetDriverVersion(cx, version: *mut c_char, length: c_uint) {
    unsafe { out_str(version, length, DRIVER_VERSION) }
});

// ---- devices ----

nvml_fn!(nvmlDeviceGetCount_v2(cx, count: *mut c_uint) {
    unsafe { out(count, cx.state.gpus.len() as u32) }
});

nvml_fn!(nvmlDeviceGetHandleByIndex_v2(cx, index: c_uint, device: *mut nvmlDevice_t) {
    cx.gpu(index)?;
    unsafe { out(device, gpu_handle(index)) }
});

nvml_fn!(nvmlDeviceGetName(cx, device: nvmlDevice_t, name: *mut c_char, length: c_uint) {
    let text = match cx.device(device)? {
        Dev::Gpu(g) => cx.gpu(g)?.info.product.clone(),
        Dev::Mig(g, gi) => {
            let product = cx.gpu(g)?.info.product.clone();
            format!("{product} MIG {}", cx.instance(g, gi)?.profile)
        }
    };
    unsafe { out_str(name, length, &text) }
});

nvml_fn!(nvmlDeviceGetUUID(cx, device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) {
    let text = match cx.device(device)? {
        Dev::Gpu(g) => cx.gpu(g)?.info.uuid.clone(),
        Dev::Mig(g, gi) => cx.instance(g, gi)?.uuid.clone(),
    };
    unsafe { out_str(uuid, length, &text) }
});

nvml_fn!(nvmlDeviceGetPciInfo_v3(cx, device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) {
    let g = cx.physical(device)?;
    let product = cx.gpu(g)?.info.product.clone();
    let id = tessera_crds::catalog::lookup(&product).and_then(|m| m.pci_device_ids.first().copied()).unwrap_or(0);
    let p = unsafe { inout(pci)? };
    let bus = 0x1b + g;
    let (bus_id, legacy) = crate::session::bus_ids(g);
    session::fill_name(&mut p.busIdLegacy, &legacy);
    session::fill_name(&mut p.busId, &bus_id);
    (p.domain, p.bus, p.device) = (0, bus, 0);
    p.pciDeviceId = (u32::from(id) << 16) | 0x10de;
    p.pciSubSystemId = 0;
    Ok(())
});

/// Used and total memory in MiB of a GPU or MIG device.
fn memory(cx: &mut Ctx, device: nvmlDevice_t) -> Result<(u64, u64), Code> {
    Ok(match cx.device(device)? {
        Dev::Gpu(g) => {
            let total = cx.gpu(g)?.info.memory_mib;
            let used: u64 = cx.procs.iter().filter(|p| p.gpu == g).map(|p| p.used_mib).sum::<u64>()
                + cx.gpu(g)?.leaked_mib.values().sum::<u64>();
            (used, total)
        }
        Dev::Mig(g, gi) => {
            let profile = cx.instance(g, gi)?.profile.clone();
            let product = cx.gpu(g)?.info.product.clone();
            let total = profiles::by_name(&product, &profile).map(|p| p.memory_mib).unwrap_or(0);
            (model::memory_used_mib(&cx.state, &cx.procs, g, gi), total)
        }
    })
}

nvml_fn!(nvmlDeviceGetMemoryInfo(cx, device: nvmlDevice_t, memory_out: *mut nvmlMemory_t) {
    let (used, total) = memory(cx, device)?;
    let m = nvmlMemory_t { total: total * MIB, free: total.saturating_sub(used) * MIB, used: used * MIB };
    unsafe { out(memory_out, m) }
});

nvml_fn!(nvmlDeviceGetMemoryInfo_v2(cx, device: nvmlDevice_t, memory_out: *mut nvmlMemory_v2_t) {
    let m = unsafe { inout(memory_out)? };
    if m.version != version(std::mem::size_of::<nvmlMemory_v2_t>(), 2) {
        return Err(VERSION_MISMATCH);
    }
    let (used, total) = memory(cx, device)?;
    (m.total, m.reserved, m.free, m.used) = (total * MIB, 0, total.saturating_sub(used) * MIB, used * MIB);
    Ok(())
});

nvml_fn!(nvmlDeviceGetComputeRunningProcesses_v3(
    cx,
    device: nvmlDevice_t,
    info_count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) {
    // nvml.h: on a GPU in MIG mode the parent device lists every instance's processes (for a
    // privileged caller); a MIG device lists its own.
    let dev = cx.device(device)?;
    let list: Vec<nvmlProcessInfo_t> = cx
        .procs
        .iter()
        .filter(|p| match dev {
            Dev::Gpu(g) => p.gpu == g,
            Dev::Mig(g, gi) => p.gpu == g && p.process.gpu_instance_id == Some(gi),
        })
        .map(|p| nvmlProcessInfo_t {
            pid: p.process.pid,
            usedGpuMemory: p.used_mib * MIB,
            gpuInstanceId: p.process.gpu_instance_id.unwrap_or(NO_ID),
            computeInstanceId: if p.process.gpu_instance_id.is_some() { 0 } else { NO_ID },
        })
        .collect();
    let capacity = unsafe { *inout(info_count)? };
    unsafe { out(info_count, list.len() as u32)? };
    if list.is_empty() {
        return Ok(());
    }
    // nvml.h: NVML_ERROR_INSUFFICIENT_SIZE when infos is too small (or null), with the count set.
    if infos.is_null() || (capacity as usize) < list.len() {
        return Err(nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (i, p) in list.into_iter().enumerate() {
        unsafe { infos.add(i).write(p) };
    }
    Ok(())
});

// ---- MIG mode ----

nvml_fn!(nvmlDeviceGetMigMode(cx, device: nvmlDevice_t, current: *mut c_uint, pending: *mut c_uint) {
    let g = cx.physical(device)?;
    let info = &cx.gpu(g)?.info;
    if !info.mig_capable {
        return Err(NOT_SUPPORTED);
    }
    let now = u32::from(info.mig_enabled);
    let next = info.mig_pending.map(u32::from).unwrap_or(now);
    unsafe {
        out(current, now)?;
        out(pending, next)
    }
});

nvml_fn!(nvmlDeviceSetMigMode(cx, device: nvmlDevice_t, mode: c_uint, activation_status: *mut nvmlReturn_t) {
    // nvml.h: the call sets the (pending) mode and tries to activate it; `activationStatus` says
    // how that went: IN_USE when the GPU is not idle ("idle the device and retry"),
    // RESET_REQUIRED when only a reset or reboot can activate it.
    if mode > 1 || activation_status.is_null() {
        return Err(INVALID);
    }
    let g = cx.physical(device)?;
    let procs = cx.procs.clone();
    let activation = model::set_mig_mode(&mut cx.state, &procs, g, mode == 1).map_err(fail)?;
    cx.changed = true;
    let status = match activation {
        Activation::Applied => nvmlReturn_enum_NVML_SUCCESS,
        Activation::InUse => nvmlReturn_enum_NVML_ERROR_IN_USE,
        Activation::ResetRequired => nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED,
    };
    unsafe { out(activation_status, status) }
});

// ---- GPU instance profiles and placements ----

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

// ---- GPU instances ----

/// nvml.h: GPU-instance calls on a GPU without MIG mode enabled are NOT_SUPPORTED.
fn mig_gpu(cx: &mut Ctx, device: nvmlDevice_t) -> Result<(u32, String), Code> {
    let g = cx.physical(device)?;
    let info = &cx.gpu(g)?.info;
    if !info.mig_enabled {
        return Err(NOT_SUPPORTED);
    }
    Ok((g, info.product.clone()))
}

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

// ---- compute instances ----

/// The GPU instance's compute slices and its full-size compute profile enum (= id).
fn full_ci(cx: &mut Ctx, g: u32, gi: u32) -> Result<(u8, u32), Code> {
    let product = cx.gpu(g)?.info.product.clone();
    let profile = cx.instance(g, gi)?.profile.clone();
    let slices = profiles::by_name(&product, &profile).map(|p| p.compute_slices).ok_or(INVALID)?;
    Ok((slices, profiles::full_ci_enum(slices).ok_or(NOT_SUPPORTED)?))
}

/// A compute profile of a GPU instance: its slices, whether it is the full-size one, and how many
/// fit in the GPU instance; `None` when the GPU instance has no such profile.
struct CiProfile {
    slices: u8,
    full: bool,
    count: u32,
}

fn ci_profile_of(cx: &mut Ctx, g: u32, gi: u32, profile: u32) -> Result<Option<CiProfile>, Code> {
    let (gi_slices, full) = full_ci(cx, g, gi)?;
    if profile == full {
        return Ok(Some(CiProfile { slices: gi_slices, full: true, count: 1 }));
    }
    let Some(slices) = profiles::ci_enum_slices(profile) else { return Ok(None) };
    Ok(split::split_sizes(gi_slices).into_iter().find(|(c, _)| *c == slices).map(|(_, count)| CiProfile {
        slices,
        full: false,
        count,
    }))
}

/// Compute profile info for `profile` (enum = id) in a GPU instance: the full-size profile and the
/// smaller ones the GPU instance can hold (`split::split_sizes`); others are NOT_SUPPORTED,
/// enums past NVML's count INVALID_ARGUMENT. SMs are the GPU instance's, pro rata.
fn ci_profile(cx: &mut Ctx, gpu_instance: nvmlGpuInstance_t, profile: u32, eng: u32) -> Result<(CiProfile, u32), Code> {
    let (g, gi) = cx.gpu_instance(gpu_instance)?;
    if profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT || eng >= NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT {
        return Err(INVALID);
    }
    let p = ci_profile_of(cx, g, gi, profile)?.ok_or(NOT_SUPPORTED)?;
    let product = cx.gpu(g)?.info.product.clone();
    let gi_profile = cx.instance(g, gi)?.profile.clone();
    let hw = profiles::by_name(&product, &gi_profile).ok_or(INVALID)?;
    let sm = profiles::engines(&product, &hw).sm * u32::from(p.slices) / u32::from(hw.compute_slices.max(1));
    Ok((p, sm))
}

nvml_fn!(nvmlGpuInstanceGetComputeInstanceProfileInfo(
    cx,
    gpu_instance: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) {
    let (p, sm) = ci_profile(cx, gpu_instance, profile, eng_profile)?;
    let i = unsafe { inout(info)? };
    (i.id, i.sliceCount, i.instanceCount) = (profile, u32::from(p.slices), p.count);
    i.multiprocessorCount = sm;
    i.sharedCopyEngineCount = u32::from(p.slices);
    Ok(())
});

nvml_fn!(nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    cx,
    gpu_instance: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_v2_t,
) {
    let i = unsafe { inout(info)? };
    if i.version != version(std::mem::size_of::<nvmlComputeInstanceProfileInfo_v2_t>(), 2) {
        return Err(VERSION_MISMATCH);
    }
    let (p, sm) = ci_profile(cx, gpu_instance, profile, eng_profile)?;
    (i.id, i.sliceCount, i.instanceCount) = (profile, u32::from(p.slices), p.count);
    i.multiprocessorCount = sm;
    i.sharedCopyEngineCount = u32::from(p.slices);
    session::fill_name(&mut i.name, &format!("MIG {}c", p.slices));
    Ok(())
});

nvml_fn!(nvmlGpuInstanceCreateComputeInstance(
    cx,
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    compute_instance: *mut nvmlComputeInstance_t,
) {
    let (g, gi) = cx.gpu_instance(gpu_instance)?;
    let Some(p) = ci_profile_of(cx, g, gi, profile_id)? else {
        session::log(format!("create compute profile id {profile_id} in GPU instance {gi}: no such profile"));
        return Err(NOT_SUPPORTED);
    };
    if compute_instance.is_null() {
        return Err(INVALID);
    }
    let handle = if p.full {
        model::create_compute_instance(&mut cx.state, g, gi).map_err(fail)?;
        ci_handle(g, gi)
    } else {
        let made = split::create_split_compute_instance(&mut cx.state, g, gi, p.slices).map_err(fail)?;
        session::split_ci_handle(g, gi, made.id)
    };
    cx.changed = true;
    unsafe { out(compute_instance, handle) }
});

nvml_fn!(nvmlGpuInstanceGetComputeInstances(
    cx,
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    compute_instances: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) {
    let (g, gi) = cx.gpu_instance(gpu_instance)?;
    let p = ci_profile_of(cx, g, gi, profile_id)?.ok_or(NOT_SUPPORTED)?;
    if compute_instances.is_null() {
        return Err(INVALID);
    }
    let handles: Vec<nvmlComputeInstance_t> = if p.full {
        let exists = cx.instance(g, gi)?.compute_instance_id.is_some();
        if exists { vec![ci_handle(g, gi)] } else { vec![] }
    } else {
        let list = cx.gpu(g)?.split.get(&gi).cloned().unwrap_or_default();
        list.iter().filter(|c| c.slices == p.slices).map(|c| session::split_ci_handle(g, gi, c.id)).collect()
    };
    // nvml.h: the array must hold the profile's instanceCount entries.
    for (i, h) in handles.iter().enumerate() {
        unsafe { compute_instances.add(i).write(*h) };
    }
    unsafe { out(count, handles.len() as u32) }
});

nvml_fn!(nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
    cx,
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    count: *mut c_uint,
) {
    // How many more compute instances of the profile fit next to those in the GPU instance.
    let (g, gi) = cx.gpu_instance(gpu_instance)?;
    let p = ci_profile_of(cx, g, gi, profile_id)?.ok_or(NOT_SUPPORTED)?;
    let whole = cx.instance(g, gi)?.compute_instance_id.is_some();
    let mut taken = cx.gpu(g)?.split.get(&gi).cloned().unwrap_or_default();
    let (gi_slices, _) = full_ci(cx, g, gi)?;
    let left = if whole {
        0
    } else if p.full {
        u32::from(taken.is_empty())
    } else {
        let mut n = 0;
        while let Some(&start) = split::free_starts(gi_slices, p.slices, &taken).first() {
            taken.push(model::SplitCompute { id: u32::MAX, slices: p.slices, start, uuid: String::new() });
            n += 1;
        }
        n
    };
    unsafe { out(count, left) }
});

nvml_fn!(nvmlGpuInstanceGetComputeInstanceById(
    cx,
    gpu_instance: nvmlGpuInstance_t,
    id: c_uint,
    compute_instance: *mut nvmlComputeInstance_t,
) {
    let (g, gi) = cx.gpu_instance(gpu_instance)?;
    let handle = if cx.instance(g, gi)?.compute_instance_id == Some(id) {
        ci_handle(g, gi)
    } else if cx.gpu(g)?.split.get(&gi).is_some_and(|l| l.iter().any(|c| c.id == id)) {
        session::split_ci_handle(g, gi, id)
    } else {
        return Err(nvmlReturn_enum_NVML_ERROR_NOT_FOUND);
    };
    unsafe { out(compute_instance, handle) }
});

nvml_fn!(nvmlComputeInstanceGetInfo_v2(cx, compute_instance: nvmlComputeInstance_t, info: *mut nvmlComputeInstanceInfo_t) {
    let value = if let Some((g, gi, ci)) = cx.split_compute_instance(compute_instance)? {
        let c = cx.gpu(g)?.split.get(&gi).and_then(|l| l.iter().find(|c| c.id == ci)).cloned().ok_or(INVALID)?;
        nvmlComputeInstanceInfo_t {
            device: gpu_handle(g),
            gpuInstance: gi_handle(g, gi),
            id: ci,
            profileId: profiles::full_ci_enum(c.slices).ok_or(INVALID)?,
            placement: nvmlComputeInstancePlacement_t { start: u32::from(c.start), size: u32::from(c.slices) },
        }
    } else {
        let (g, gi) = cx.compute_instance(compute_instance)?;
        let (slices, full) = full_ci(cx, g, gi)?;
        nvmlComputeInstanceInfo_t {
            device: gpu_handle(g),
            gpuInstance: gi_handle(g, gi),
            id: 0,
            profileId: full,
            placement: nvmlComputeInstancePlacement_t { start: 0, size: u32::from(slices) },
        }
    };
    unsafe { out(info, value) }
});

nvml_fn!(nvmlComputeInstanceDestroy(cx, compute_instance: nvmlComputeInstance_t) {
    // nvml.h: IN_USE while processes are active on it; a zombie context holding memory counts.
    let procs = cx.procs.clone();
    if let Some((g, gi, ci)) = cx.split_compute_instance(compute_instance)? {
        split::destroy_split_compute_instance(&mut cx.state, &procs, g, gi, ci).map_err(fail)?;
    } else {
        let (g, gi) = cx.compute_instance(compute_instance)?;
        model::destroy_compute_instance(&mut cx.state, &procs, g, gi).map_err(fail)?;
    }
    cx.changed = true;
    Ok(())
});

// ---- MIG devices ----

/// Whole instances (MIG devices) of a GPU by GPU instance id.
pub(crate) fn mig_devices(cx: &mut Ctx, g: u32) -> Result<Vec<u32>, Code> {
    let mut ids: Vec<u32> =
        cx.gpu(g)?.instances.iter().filter(|i| i.compute_instance_id.is_some()).map(|i| i.gpu_instance_id).collect();
    ids.sort();
    Ok(ids)
}

nvml_fn!(nvmlDeviceGetMaxMigDeviceCount(cx, device: nvmlDevice_t, count: *mut c_uint) {
    let g = cx.physical(device)?;
    let info = cx.gpu(g)?.info.clone();
    let max = match model::model(&info.product) {
        Ok(m) if info.mig_enabled => u32::from(m.compute_slices),
        _ => 0,
    };
    unsafe { out(count, max) }
});

nvml_fn!(nvmlDeviceGetMigDeviceHandleByIndex(cx, device: nvmlDevice_t, index: c_uint, mig_device: *mut nvmlDevice_t) {
    let (g, _) = mig_gpu(cx, device)?;
    // nvml.h: NOT_FOUND when no valid MIG device exists at the index.
    let gi = *mig_devices(cx, g)?.get(index as usize).ok_or(nvmlReturn_enum_NVML_ERROR_NOT_FOUND)?;
    unsafe { out(mig_device, mig_handle(g, gi)) }
});

nvml_fn!(nvmlDeviceIsMigDeviceHandle(cx, device: nvmlDevice_t, is_mig: *mut c_uint) {
    let mig = matches!(cx.device(device)?, Dev::Mig(..));
    unsafe { out(is_mig, u32::from(mig)) }
});

nvml_fn!(nvmlDeviceGetGpuInstanceId(cx, device: nvmlDevice_t, id: *mut c_uint) {
    match cx.device(device)? {
        Dev::Mig(_, gi) => unsafe { out(id, gi) },
        Dev::Gpu(_) => Err(NOT_SUPPORTED),
    }
});

nvml_fn!(nvmlDeviceGetComputeInstanceId(cx, device: nvmlDevice_t, id: *mut c_uint) {
    match cx.device(device)? {
        Dev::Mig(..) => unsafe { out(id, 0) },
        Dev::Gpu(_) => Err(NOT_SUPPORTED),
    }
});

nvml_fn!(nvmlDeviceGetDeviceHandleFromMigDeviceHandle(cx, mig_device: nvmlDevice_t, device: *mut nvmlDevice_t) {
    match cx.device(mig_device)? {
        Dev::Mig(g, _) => unsafe { out(device, gpu_handle(g)) },
        Dev::Gpu(_) => Err(INVALID),
    }
});
