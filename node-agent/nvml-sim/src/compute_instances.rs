//! Compute instances in a GPU instance: the full-size one that makes it a MIG device, and the
//! smaller ones an admin may split it into (`split`); their profiles, capacity, making, finding
//! and destroying (nvml.h's semantics).

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings::*;
use tessera_node_agent::backend::sim::model;
use tessera_node_agent::backend::sim::split;

use crate::exports::{nvml_fn, version};
use crate::profiles;
use crate::session::{self, Code, Ctx, ci_handle, fail, gi_handle, gpu_handle, inout, out};

const VERSION_MISMATCH: Code = nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
const INVALID: Code = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const NOT_SUPPORTED: Code = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;

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

/// The compute profile `profile` (enum = id) of GPU instance `gi`, if it has one.
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
