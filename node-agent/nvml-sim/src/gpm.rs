//! GPU Performance Monitoring (nvml.h's GPM group) as NVML offers it: Hopper and later support
//! it, Ampere (A100, A30) answers `NOT_SUPPORTED`. A sample records the SM activity set on its
//! device (`node-agent sim set-activity`, `SimGpu::sm_active_percent`) when it was taken; the
//! metrics of two samples are the mean of their two figures, so a steady set activity reads back
//! exactly. SM_UTIL, SM_OCCUPANCY and GRAPHICS_UTIL all report that figure (the simulator models
//! one activity per device); every other metric answers `NOT_SUPPORTED` in its own slot.

use std::collections::HashMap;
use std::ffi::c_uint;
use std::sync::Mutex;

use nvml_wrapper_sys::bindings::*;
use tessera_node_agent::backend::sim::model;

use crate::devices::compute_capability;
use crate::exports::nvml_fn;
use crate::session::{Code, Ctx, Dev, inout, out};

const INVALID: Code = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const NOT_SUPPORTED: Code = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
const VERSION_MISMATCH: Code = nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;

/// What a filled sample holds: its device (GPU, GPU instance or whole GPU) and the activity.
#[derive(Clone, Copy, PartialEq)]
struct Taken {
    gpu: u32,
    gi: Option<u32>,
    percent: f64,
}

/// Live samples by handle (an opaque token, never dereferenced): `None` until filled. A handle
/// not in the table (freed, or never allocated) is an invalid argument, not undefined behaviour.
static SAMPLES: Mutex<Option<HashMap<usize, Option<Taken>>>> = Mutex::new(None);
static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
const SAMPLE_TAG: usize = 0x6770_6d00_0000;

fn with_samples<T>(f: impl FnOnce(&mut HashMap<usize, Option<Taken>>) -> T) -> T {
    let mut g = SAMPLES.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

/// GPM support of a GPU: compute capability 9.0 (Hopper) and later.
fn supported(cx: &mut Ctx, gpu: u32) -> Result<bool, Code> {
    let product = cx.gpu(gpu)?.info.product.clone();
    Ok(compute_capability(&product).is_some_and(|(major, _)| major >= 9))
}

fn fill(cx: &mut Ctx, sample: nvmlGpmSample_t, gpu: u32, gi: Option<u32>) -> Result<(), Code> {
    if !supported(cx, gpu)? {
        return Err(NOT_SUPPORTED);
    }
    let percent = model::sm_active_percent(&cx.state, gpu, gi);
    with_samples(|s| match s.get_mut(&(sample as usize)) {
        Some(slot) => {
            *slot = Some(Taken { gpu, gi, percent });
            Ok(())
        }
        None => Err(INVALID),
    })
}

nvml_fn!(nvmlGpmQueryDeviceSupport(cx, device: nvmlDevice_t, support: *mut nvmlGpmSupport_t) {
    let g = match cx.device(device)? {
        Dev::Gpu(g) | Dev::Mig(g, _) => g,
    };
    let s = unsafe { inout(support)? };
    if s.version != NVML_GPM_SUPPORT_VERSION {
        return Err(VERSION_MISMATCH);
    }
    s.isSupportedDevice = u32::from(supported(cx, g)?);
    Ok(())
});

nvml_fn!(nvmlGpmSampleAlloc(cx, sample: *mut nvmlGpmSample_t) {
    if sample.is_null() {
        return Err(INVALID);
    }
    let h = SAMPLE_TAG | NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    with_samples(|s| s.insert(h, None));
    unsafe { out(sample, h as nvmlGpmSample_t) }
});

nvml_fn!(nvmlGpmSampleFree(cx, sample: nvmlGpmSample_t) {
    with_samples(|s| s.remove(&(sample as usize))).map(|_| ()).ok_or(INVALID)
});

nvml_fn!(nvmlGpmSampleGet(cx, device: nvmlDevice_t, sample: nvmlGpmSample_t) {
    // A GPU handle samples the whole GPU (with MIG on, all its instances); a MIG device handle
    // its own instance.
    match cx.device(device)? {
        Dev::Gpu(g) => fill(cx, sample, g, None),
        Dev::Mig(g, gi) => fill(cx, sample, g, Some(gi)),
    }
});

nvml_fn!(nvmlGpmMigSampleGet(cx, device: nvmlDevice_t, gpu_instance_id: c_uint, sample: nvmlGpmSample_t) {
    let g = cx.physical(device)?;
    if !supported(cx, g)? {
        return Err(NOT_SUPPORTED);
    }
    if !cx.gpu(g)?.info.mig_enabled {
        return Err(NOT_SUPPORTED);
    }
    cx.instance(g, gpu_instance_id)?;
    fill(cx, sample, g, Some(gpu_instance_id))
});

nvml_fn!(nvmlGpmMetricsGet(cx, get: *mut nvmlGpmMetricsGet_t) {
    let m = unsafe { inout(get)? };
    if m.version != NVML_GPM_METRICS_GET_VERSION {
        return Err(VERSION_MISMATCH);
    }
    let n = m.numMetrics as usize;
    if n > m.metrics.len() {
        return Err(INVALID);
    }
    // Both samples filled, from the same device.
    let (a, b) = with_samples(|s| {
        let a = s.get(&(m.sample1 as usize)).copied().flatten();
        let b = s.get(&(m.sample2 as usize)).copied().flatten();
        (a, b)
    });
    let (Some(a), Some(b)) = (a, b) else { return Err(INVALID) };
    if (a.gpu, a.gi) != (b.gpu, b.gi) {
        return Err(INVALID);
    }
    let value = (a.percent + b.percent) / 2.0;
    for metric in &mut m.metrics[..n] {
        metric.metricInfo = nvmlGpmMetric_t__bindgen_ty_1 {
            shortName: std::ptr::null_mut(),
            longName: std::ptr::null_mut(),
            unit: std::ptr::null_mut(),
        };
        match metric.metricId {
            nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL
            | nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY
            | nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL => {
                metric.nvmlReturn = nvmlReturn_enum_NVML_SUCCESS;
                metric.value = value;
            }
            _ => {
                metric.nvmlReturn = NOT_SUPPORTED;
                metric.value = 0.0;
            }
        }
    }
    Ok(())
});
