//! The MIG calls nvml-wrapper 0.13 lacks (GPU/compute instance profiles, placements, create,
//! destroy, list), made through its raw `nvml.lib()` bindings. This is the agent's only `unsafe`.
//!
//! Every function takes handles obtained from NVML in the same session (`Nvml` outlives them) and
//! passes NVML pointers to properly sized, zero-initialised `#[repr(C)]` structs or arrays that
//! live on the stack or in a `Vec` for the duration of the call.

// The bindgen names of NVML's return codes are lower-case constants.
#![allow(non_upper_case_globals)]

use std::ffi::CStr;

use nvml_wrapper_sys::bindings::*;

use crate::Error;

pub type Lib = NvmlLib;

fn check(rc: nvmlReturn_t, what: &str) -> Result<(), Error> {
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
    // requires (size | 2 << 24); `device` is a live handle from the caller's Nvml session.
    let mut info: nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
    info.version = std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as u32 | (2 << 24);
    let rc = unsafe { lib.nvmlDeviceGetGpuInstanceProfileInfoV(device, profile_enum, &mut info) };
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
    let rc =
        unsafe { lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, profile_id, buf.as_mut_ptr(), &mut count) };
    check(rc, &format!("placements of profile {profile_id}"))?;
    Ok(buf[..count.min(32) as usize].iter().map(|p| (p.start, p.size)).collect())
}

/// An existing GPU instance: its id and placement.
pub struct GpuInstance {
    pub id: u32,
    pub start: u32,
    pub size: u32,
}

pub fn gpu_instances(lib: &Lib, device: nvmlDevice_t, profile_id: u32) -> Result<Vec<GpuInstance>, Error> {
    let mut handles: Vec<nvmlGpuInstance_t> = vec![std::ptr::null_mut(); 16];
    let mut count = 0u32;
    // SAFETY: `handles` holds 16 slots, more than any GPU's 7 instances of one profile; NVML
    // writes the handles and their number.
    let rc = unsafe { lib.nvmlDeviceGetGpuInstances(device, profile_id, handles.as_mut_ptr(), &mut count) };
    check(rc, &format!("GPU instances of profile {profile_id}"))?;
    let mut out = Vec::new();
    for &handle in &handles[..count.min(16) as usize] {
        // SAFETY: `handle` was just returned by NVML; `info` is a zeroed C struct NVML fills.
        let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
        check(unsafe { lib.nvmlGpuInstanceGetInfo(handle, &mut info) }, "GPU instance info")?;
        out.push(GpuInstance { id: info.id, start: info.placement.start, size: info.placement.size });
    }
    Ok(out)
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

/// Creates a GPU instance of `profile_id` at (start, size) and one full-size compute instance in
/// it. If the compute instance fails, the GPU instance is destroyed again so nothing half-made
/// remains. Returns the GPU instance id.
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
    let rc = unsafe { lib.nvmlDeviceCreateGpuInstanceWithPlacement(device, profile_id, &placement, &mut gi) };
    check(rc, &format!("create GPU instance profile {profile_id} at {start}"))?;
    let result = (|| {
        let ci_profile = full_compute_profile(slices)
            .ok_or_else(|| Error::NotSupported(format!("no full-size compute profile for {slices} slices")))?;
        // SAFETY: `gi` was just created; `info` is a zeroed C struct NVML fills.
        let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        let rc = unsafe {
            lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi,
                ci_profile,
                NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                &mut info,
            )
        };
        check(rc, "compute instance profile")?;
        let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: `gi` is live and `ci` is valid for NVML to write the new handle.
        check(unsafe { lib.nvmlGpuInstanceCreateComputeInstance(gi, info.id, &mut ci) }, "create compute instance")
    })();
    // SAFETY: `gi` is live; `info` is a zeroed C struct NVML fills.
    let mut gi_info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    check(unsafe { lib.nvmlGpuInstanceGetInfo(gi, &mut gi_info) }, "GPU instance info")?;
    if let Err(e) = result {
        // SAFETY: `gi` is live and has no compute instance (its creation failed).
        let _ = unsafe { lib.nvmlGpuInstanceDestroy(gi) };
        return Err(e);
    }
    Ok(gi_info.id)
}

/// Destroys every compute instance of the GPU instance, then the GPU instance.
pub fn destroy(lib: &Lib, device: nvmlDevice_t, gpu_instance_id: u32) -> Result<(), Error> {
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: `device` is live; NVML writes the handle of the instance with this id.
    check(unsafe { lib.nvmlDeviceGetGpuInstanceById(device, gpu_instance_id, &mut gi) }, "find GPU instance")?;
    for profile in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
        let mut cis: Vec<nvmlComputeInstance_t> = vec![std::ptr::null_mut(); 8];
        let mut count = 0u32;
        // SAFETY: `cis` has 8 slots, more than a GI's compute slices; NVML writes at most that.
        let rc = unsafe { lib.nvmlGpuInstanceGetComputeInstances(gi, profile, cis.as_mut_ptr(), &mut count) };
        if rc != nvmlReturn_enum_NVML_SUCCESS {
            continue; // profile not supported on this GI
        }
        for &ci in &cis[..count.min(8) as usize] {
            // SAFETY: `ci` was just returned by NVML for this live GI.
            check(unsafe { lib.nvmlComputeInstanceDestroy(ci) }, "destroy compute instance")?;
        }
    }
    // SAFETY: `gi` is live and now has no compute instances.
    check(unsafe { lib.nvmlGpuInstanceDestroy(gi) }, "destroy GPU instance")
}

/// The GPU instance id of a MIG device handle.
pub fn mig_device_gpu_instance_id(lib: &Lib, mig_device: nvmlDevice_t) -> Result<u32, Error> {
    let mut id = 0u32;
    // SAFETY: `mig_device` is a live MIG device handle; NVML writes one integer.
    check(unsafe { lib.nvmlDeviceGetGpuInstanceId(mig_device, &mut id) }, "MIG device GPU instance id")?;
    Ok(id)
}

/// Profile enum values NVML defines (0..NVML_GPU_INSTANCE_PROFILE_COUNT).
pub const PROFILE_ENUMS: std::ops::Range<u32> = 0..NVML_GPU_INSTANCE_PROFILE_COUNT;
