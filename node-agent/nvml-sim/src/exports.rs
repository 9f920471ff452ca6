//! The NVML functions the agent's paths use, with nvml.h's semantics (cited per function where
//! the behaviour is not obvious). MIG rules are the simulator's (`backend::sim::model`). GPU
//! instances are in `gpu_instances`, compute instances in `compute_instances`; both, and the
//! other modules of exported functions, declare theirs with [`nvml_fn!`] from here.

use std::ffi::{c_char, c_uint};

use nvml_wrapper_sys::bindings::*;
use tessera_node_agent::backend::sim::model::{self, Activation};

use crate::profiles;
use crate::session::{self, Code, Ctx, Dev, fail, gpu_handle, inout, mig_handle, out, out_str};

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

/// nvml.h's `NVML_STRUCT_VERSION`: a versioned struct's size and version in one word.
pub(crate) fn version(data_size: usize, ver: u32) -> u32 {
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

// ---- MIG devices ----

/// nvml.h: GPU-instance calls on a GPU without MIG mode enabled are NOT_SUPPORTED.
pub(crate) fn mig_gpu(cx: &mut Ctx, device: nvmlDevice_t) -> Result<(u32, String), Code> {
    let g = cx.physical(device)?;
    let info = &cx.gpu(g)?.info;
    if !info.mig_enabled {
        return Err(NOT_SUPPORTED);
    }
    Ok((g, info.product.clone()))
}

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
