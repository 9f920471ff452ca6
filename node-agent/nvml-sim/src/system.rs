//! System-wide queries gpu-feature-discovery labels nodes with (driver and CUDA versions).

use std::ffi::{c_char, c_int, c_uint};

use nvml_wrapper_sys::bindings::*;

use crate::exports::nvml_fn;
use crate::session::{out, out_str};

/// The CUDA driver API version the simulated driver (580.159.04) ships: CUDA 13.0, as
/// `1000 * major + 10 * minor`.
pub const CUDA_DRIVER_VERSION: c_int = 13000;
/// NVML's own version for that driver (`nvidia-smi -q`'s "NVML Version").
pub const NVML_VERSION: &str = "13.580.159.04";

nvml_fn!(nvmlSystemGetCudaDriverVersion(cx, version: *mut c_int) {
    unsafe { out(version, CUDA_DRIVER_VERSION) }
});

nvml_fn!(nvmlSystemGetCudaDriverVersion_v2(cx, version: *mut c_int) {
    unsafe { out(version, CUDA_DRIVER_VERSION) }
});

nvml_fn!(nvmlSystemGetNVMLVersion(cx, version: *mut c_char, length: c_uint) {
    unsafe { out_str(version, length, NVML_VERSION) }
});
