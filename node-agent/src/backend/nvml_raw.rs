//! The MIG calls nvml-wrapper 0.13 lacks (GPU/compute instance profiles, placements, create,
//! destroy, list), made through its raw `nvml.lib()` bindings. This is the agent's only `unsafe`.
//!
//! Every function takes handles obtained from NVML in the same session (`Nvml` outlives them) and
//! passes NVML pointers to properly sized, zero-initialised `#[repr(C)]` structs or arrays that
//! live on the stack or in a `Vec` for the duration of the call.
//!
//! The bindings resolve every symbol when the library is loaded and their call methods `expect`
//! it, so a driver without one would panic the agent: [`nvml!`] calls through the resolved
//! symbol instead and returns [`Error::MissingSymbol`] naming it.

// The bindgen names of NVML's return codes are lower-case constants.
#![allow(non_upper_case_globals)]

use std::ffi::CStr;

use nvml_wrapper_sys::bindings::*;

use crate::Error;

pub type Lib = NvmlLib;

/// `nvml!(lib, nvmlFoo(args...))`: calls the symbol if the library has it, otherwise returns
/// `Err(Error::MissingSymbol("nvmlFoo"))` from the enclosing function. Use inside `unsafe`.
macro_rules! nvml {
    ($lib:expr, $f:ident ( $($arg:expr),* $(,)? )) => {
        match $lib.$f.as_ref() {
            Ok(f) => f($($arg),*),
            Err(_) => return Err(Error::MissingSymbol(stringify!($f).to_string())),
        }
    };
}

pub fn check(rc: nvmlReturn_t, what: &str) -> Result<(), Error> {
    match rc {
        nvmlReturn_enum_NVML_SUCCESS => Ok(()),
        nvmlReturn_enum_NVML_ERROR_IN_USE => Err(Error::InUse(what.into())),
        nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES => Err(Error::InsufficientResources(what.into())),
        nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => Err(Error::NotSupported(what.into())),
        nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => Err(Error::InvalidArgument(what.into())),
        nvmlReturn_enum_NVML_ERROR_NOT_FOUND => Err(Error::NotFound(what.into())),
        other => Err(Error::Nvml(format!("{what}: NVML error {other}"))),
    }
}

/// GPU-instance profile info (v2, with the profile's name) for a profile enum value.
pub struct ProfileInfo {
    pub id: u32,
    pub name: String,
    pub slice_count: u32,
    pub instance_count: u32,
    pub memory_mib: u64,
}

pub fn gpu_instance_profile(lib: &Lib, device: nvmlDevice_t, profile_enum: u32) -> Result<ProfileInfo, Error> {
    // SAFETY: zeroed is a valid bit pattern for this plain C struct; `version` is set as NVML
    // requires (nvml.h NVML_STRUCT_VERSION: size | 2 << 24); `device` is a live handle.
    let mut info: nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
    info.version = std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as u32 | (2 << 24);
    let rc = unsafe { nvml!(lib, nvmlDeviceGetGpuInstanceProfileInfoV(device, profile_enum, &mut info)) };
    check(rc, &format!("GPU instance profile {profile_enum}"))?;
    // SAFETY: NVML writes a NUL-terminated string into the 96-byte `name` buffer; the last byte is
    // forced to NUL so the read can never run past it.
    info.name[95] = 0;
    let name = unsafe { CStr::from_ptr(info.name.as_ptr()) }.to_string_lossy().into_owned();
    Ok(ProfileInfo {
        id: info.id,
        name: name.trim_start_matches("MIG ").to_string(),
        slice_count: info.sliceCount,
        instance_count: info.instanceCount,
        memory_mib: info.memorySizeMB,
    })
}

/// Valid placements (start, size) of a profile id on the memory axis.
pub fn possible_placements(lib: &Lib, device: nvmlDevice_t, profile_id: u32) -> Result<Vec<(u32, u32)>, Error> {
    let mut buf = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; 32];
    let mut count = buf.len() as u32;
    // SAFETY: `buf` has room for `count` placements and outlives the call; NVML writes at most
    // `count` entries and stores the number written in `count`.
    let rc = unsafe {
        nvml!(lib, nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, profile_id, buf.as_mut_ptr(), &mut count))
    };
    check(rc, &format!("placements of profile {profile_id}"))?;
    Ok(buf[..count.min(32) as usize].iter().map(|p| (p.start, p.size)).collect())
}

/// An existing GPU instance: its handle, id and placement.
pub struct GpuInstance {
    pub handle: nvmlGpuInstance_t,
    pub id: u32,
    pub start: u32,
    pub size: u32,
}

fn gpu_instance_info(lib: &Lib, gi: nvmlGpuInstance_t) -> Result<GpuInstance, Error> {
    // SAFETY: `gi` is a live GPU instance handle; `info` is a zeroed C struct NVML fills.
    let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    check(unsafe { nvml!(lib, nvmlGpuInstanceGetInfo(gi, &mut info)) }, "GPU instance info")?;
    Ok(GpuInstance { handle: gi, id: info.id, start: info.placement.start, size: info.placement.size })
}

pub fn gpu_instances(lib: &Lib, device: nvmlDevice_t, profile_id: u32) -> Result<Vec<GpuInstance>, Error> {
    let mut handles: Vec<nvmlGpuInstance_t> = vec![std::ptr::null_mut(); 16];
    let mut count = 0u32;
    // SAFETY: `handles` holds 16 slots, more than any GPU's 7 instances of one profile; NVML
    // writes the handles and their number.
    let rc = unsafe { nvml!(lib, nvmlDeviceGetGpuInstances(device, profile_id, handles.as_mut_ptr(), &mut count)) };
    check(rc, &format!("GPU instances of profile {profile_id}"))?;
    handles[..count.min(16) as usize].iter().map(|&h| gpu_instance_info(lib, h)).collect()
}

/// The compute-instance profile enum for a full-size CI of a GI with `slices` compute slices.
fn full_compute_profile(slices: u32) -> Option<u32> {
    Some(match slices {
        1 => NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2 => NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3 => NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4 => NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        6 => NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
        7 => NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
        8 => NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
        _ => return None,
    })
}

/// Compute-instance profile info for a profile enum; `None` when the GPU instance has no such
/// profile.
fn compute_profile(lib: &Lib, gi: nvmlGpuInstance_t, profile_enum: u32) -> Result<Option<(u32, u32)>, Error> {
    // SAFETY: `gi` is live; `info` is a zeroed C struct NVML fills.
    let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        nvml!(
            lib,
            nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi,
                profile_enum,
                NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                &mut info
            )
        )
    };
    match check(rc, &format!("compute instance profile {profile_enum}")) {
        Ok(()) => Ok(Some((info.id, info.instanceCount))),
        Err(Error::NotSupported(_) | Error::InvalidArgument(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Every compute instance of a GPU instance, whatever its profile: nvml.h lists them per profile
/// *id* (not enum), so each enum's id is read first; enums past the bindings' count are tried too,
/// as newer drivers add profiles.
pub fn compute_instances(lib: &Lib, gi: nvmlGpuInstance_t) -> Result<Vec<nvmlComputeInstance_t>, Error> {
    Ok(compute_instances_by_profile(lib, gi)?.into_iter().map(|(_, ci)| ci).collect())
}

/// Every compute instance of a GPU instance with its profile enum.
fn compute_instances_by_profile(lib: &Lib, gi: nvmlGpuInstance_t) -> Result<Vec<(u32, nvmlComputeInstance_t)>, Error> {
    let mut out = Vec::new();
    let mut seen_ids = Vec::new();
    for profile_enum in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT + 8 {
        let Some((id, max)) = compute_profile(lib, gi, profile_enum)? else { continue };
        // A later enum (a `_REV` variant) may answer with an id already read: its instances are
        // the same ones, listed once under the first (standard) enum, or the full-size compute
        // instance would also count as a smaller one and be destroyed twice.
        if seen_ids.contains(&id) {
            continue;
        }
        seen_ids.push(id);
        let mut cis: Vec<nvmlComputeInstance_t> = vec![std::ptr::null_mut(); max.max(1) as usize];
        let mut count = 0u32;
        // SAFETY: `cis` has `instanceCount` slots, as nvml.h asks; NVML writes at most that.
        let rc = unsafe { nvml!(lib, nvmlGpuInstanceGetComputeInstances(gi, id, cis.as_mut_ptr(), &mut count)) };
        check(rc, &format!("compute instances of profile id {id}"))?;
        out.extend(cis[..(count as usize).min(cis.len())].iter().map(|ci| (profile_enum, *ci)));
    }
    Ok(out)
}

/// A GPU instance's compute instances, told apart: whether it has its full-size one (a MIG device
/// as Tessera makes it), and how many smaller ones it holds (an admin's `nvidia-smi mig -cci`).
pub fn compute_split(lib: &Lib, gi: nvmlGpuInstance_t, gi_slices: u32) -> Result<(bool, u32), Error> {
    let full = full_compute_profile(gi_slices);
    let all = compute_instances_by_profile(lib, gi)?;
    let whole = all.iter().any(|(e, _)| Some(*e) == full);
    let smaller = all.iter().filter(|(e, _)| Some(*e) != full).count() as u32;
    Ok((whole, smaller))
}

/// Creates a GPU instance of `profile_id` at (start, size) and one full-size compute instance in
/// it: two driver calls. If anything after the first fails, the GPU instance is destroyed again;
/// if even that fails, the error says so (the next pass finds it and remakes it). Returns the GPU
/// instance id.
pub fn create(
    lib: &Lib,
    device: nvmlDevice_t,
    profile_id: u32,
    start: u32,
    size: u32,
    slices: u32,
) -> Result<u32, Error> {
    let placement = nvmlGpuInstancePlacement_t { start, size };
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: `placement` and `gi` are valid for the call; `device` is live.
    let rc = unsafe { nvml!(lib, nvmlDeviceCreateGpuInstanceWithPlacement(device, profile_id, &placement, &mut gi)) };
    check(rc, &format!("create GPU instance profile {profile_id} at {start}"))?;
    let finish = || -> Result<u32, Error> {
        let id = gpu_instance_info(lib, gi)?.id;
        let ci_profile = full_compute_profile(slices)
            .ok_or_else(|| Error::NotSupported(format!("no full-size compute profile for {slices} slices")))?;
        let (ci_id, _) = compute_profile(lib, gi, ci_profile)?
            .ok_or_else(|| Error::NotSupported(format!("compute profile {ci_profile} in GPU instance {id}")))?;
        let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: `gi` is live and `ci` is valid for NVML to write the new handle.
        let rc = unsafe { nvml!(lib, nvmlGpuInstanceCreateComputeInstance(gi, ci_id, &mut ci)) };
        check(rc, &format!("create compute instance in GPU instance {id}"))?;
        Ok(id)
    };
    let e = match finish() {
        Ok(id) => return Ok(id),
        Err(e) => e,
    };
    // SAFETY: `gi` is live and has no compute instance (its creation failed).
    let undo = match lib.nvmlGpuInstanceDestroy.as_ref() {
        Ok(f) => check(unsafe { f(gi) }, "destroy it again"),
        Err(_) => Err(Error::MissingSymbol("nvmlGpuInstanceDestroy".into())),
    };
    Err(match undo {
        Ok(()) => e,
        Err(undo) => Error::Nvml(format!("{e}; the half-made GPU instance is left: {undo}")),
    })
}

fn gpu_instance_by_id(lib: &Lib, device: nvmlDevice_t, gpu_instance_id: u32) -> Result<nvmlGpuInstance_t, Error> {
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: `device` is live; NVML writes the handle of the instance with this id.
    let rc = unsafe { nvml!(lib, nvmlDeviceGetGpuInstanceById(device, gpu_instance_id, &mut gi)) };
    check(rc, &format!("find GPU instance {gpu_instance_id}"))?;
    Ok(gi)
}

/// Destroys the GPU instance alone: nvml.h refuses (`IN_USE`) while it has compute instances.
pub fn destroy_gpu_instance(lib: &Lib, device: nvmlDevice_t, gpu_instance_id: u32) -> Result<(), Error> {
    let gi = gpu_instance_by_id(lib, device, gpu_instance_id)?;
    // SAFETY: `gi` was just returned by NVML for this live device.
    check(unsafe { nvml!(lib, nvmlGpuInstanceDestroy(gi)) }, &format!("destroy GPU instance {gpu_instance_id}"))
}

/// Destroys every compute instance of the GPU instance, then the GPU instance. Any error is
/// returned as it is, naming the call.
pub fn destroy(lib: &Lib, device: nvmlDevice_t, gpu_instance_id: u32) -> Result<(), Error> {
    let gi = gpu_instance_by_id(lib, device, gpu_instance_id)?;
    for ci in compute_instances(lib, gi)? {
        // SAFETY: `ci` was just returned by NVML for this live GI.
        let rc = unsafe { nvml!(lib, nvmlComputeInstanceDestroy(ci)) };
        check(rc, &format!("destroy a compute instance of GPU instance {gpu_instance_id}"))?;
    }
    // SAFETY: `gi` is live and now has no compute instances.
    check(unsafe { nvml!(lib, nvmlGpuInstanceDestroy(gi)) }, &format!("destroy GPU instance {gpu_instance_id}"))
}

/// The GPU instance id of a MIG device handle.
pub fn mig_device_gpu_instance_id(lib: &Lib, mig_device: nvmlDevice_t) -> Result<u32, Error> {
    let mut id = 0u32;
    // SAFETY: `mig_device` is a live MIG device handle; NVML writes one integer.
    let rc = unsafe { nvml!(lib, nvmlDeviceGetGpuInstanceId(mig_device, &mut id)) };
    check(rc, "MIG device GPU instance id")?;
    Ok(id)
}

/// Profile enum values NVML defines (0..NVML_GPU_INSTANCE_PROFILE_COUNT).
pub const PROFILE_ENUMS: std::ops::Range<u32> = 0..NVML_GPU_INSTANCE_PROFILE_COUNT;

/// NVML's return code for a MIG mode activation status.
pub fn activation(status: u32) -> Result<super::sim::model::Activation, Error> {
    use super::sim::model::Activation;
    match status {
        nvmlReturn_enum_NVML_SUCCESS => Ok(Activation::Applied),
        nvmlReturn_enum_NVML_ERROR_IN_USE => Ok(Activation::InUse),
        nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED => Ok(Activation::ResetRequired),
        other => check(other, "MIG mode activation").map(|_| Activation::Applied),
    }
}
