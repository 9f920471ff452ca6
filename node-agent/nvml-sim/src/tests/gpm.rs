//! GPM as C calls it: support by architecture, samples of MIG instances and whole GPUs whose
//! metrics give the activity the test set, and the invalid uses nvml.h rules out.

use std::ptr::null_mut;

use nvml_wrapper_sys::bindings::*;
use tessera_node_agent::backend::sim;

use crate::exports::*;
use crate::gpm::*;
use crate::tests::mig::{fixture, uuid};

const OK: nvmlReturn_t = nvmlReturn_enum_NVML_SUCCESS;
const INVALID: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const NOT_SUPPORTED: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;

fn support(dev: nvmlDevice_t) -> u32 {
    let mut s = nvmlGpmSupport_t { version: NVML_GPM_SUPPORT_VERSION, isSupportedDevice: 7 };
    assert_eq!(unsafe { nvmlGpmQueryDeviceSupport(dev, &mut s) }, OK);
    s.isSupportedDevice
}

fn alloc() -> nvmlGpmSample_t {
    let mut s = null_mut();
    assert_eq!(unsafe { nvmlGpmSampleAlloc(&mut s) }, OK);
    s
}

/// Metrics of two samples: (return code of the call, per-metric (code, value)).
fn metrics(a: nvmlGpmSample_t, b: nvmlGpmSample_t, ids: &[u32]) -> (nvmlReturn_t, Vec<(nvmlReturn_t, f64)>) {
    let mut get: nvmlGpmMetricsGet_t = unsafe { std::mem::zeroed() };
    get.version = NVML_GPM_METRICS_GET_VERSION;
    get.numMetrics = ids.len() as u32;
    (get.sample1, get.sample2) = (a, b);
    for (m, id) in get.metrics.iter_mut().zip(ids) {
        m.metricId = *id;
    }
    let rc = unsafe { nvmlGpmMetricsGet(&mut get) };
    (rc, get.metrics[..ids.len()].iter().map(|m| (m.nvmlReturn, m.value)).collect())
}

const SM: [u32; 3] = [
    nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL,
];

#[test]
fn hopper_supports_gpm_and_ampere_does_not() {
    let f = fixture();
    assert_eq!(support(f.h100), 1);
    assert_eq!(support(f.migs[0]), 1);
    assert_eq!(support(f.a100), 0);
    let s = alloc();
    unsafe {
        assert_eq!(nvmlGpmSampleGet(f.a100, s), NOT_SUPPORTED);
        assert_eq!(nvmlGpmMigSampleGet(f.a100, 1, s), NOT_SUPPORTED);
        // A stale version is refused, not misread.
        let mut old = nvmlGpmSupport_t { version: 0, isSupportedDevice: 0 };
        assert_eq!(nvmlGpmQueryDeviceSupport(f.h100, &mut old), nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        assert_eq!(nvmlGpmSampleFree(s), OK);
    }
}

#[test]
fn mig_samples_give_the_set_activity_and_the_gpu_their_weighted_mean() {
    let f = fixture();
    let (big, small) = (uuid(f.migs[0]), uuid(f.migs[1]));
    sim::set_activity(&f.state, 0, Some(&big), 70.0).unwrap();
    sim::set_activity(&f.state, 0, Some(&small), 35.0).unwrap();
    let mut gi = 0;
    assert_eq!(unsafe { nvmlDeviceGetGpuInstanceId(f.migs[0], &mut gi) }, OK);
    let (a, b) = (alloc(), alloc());
    unsafe {
        assert_eq!(nvmlGpmMigSampleGet(f.h100, gi, a), OK);
        assert_eq!(nvmlGpmMigSampleGet(f.h100, gi, b), OK);
    }
    let (rc, got) = metrics(a, b, &SM);
    assert_eq!(rc, OK);
    assert_eq!(got, vec![(OK, 70.0); 3]);
    // The MIG device handle samples the same instance.
    unsafe {
        assert_eq!(nvmlGpmSampleGet(f.migs[1], a), OK);
        assert_eq!(nvmlGpmSampleGet(f.migs[1], b), OK);
    }
    assert_eq!(metrics(a, b, &SM[..1]).1, vec![(OK, 35.0)]);
    // The whole GPU: (3 x 70 + 2 x 35) / 7 slices = 40.
    unsafe {
        assert_eq!(nvmlGpmSampleGet(f.h100, a), OK);
        assert_eq!(nvmlGpmSampleGet(f.h100, b), OK);
    }
    assert_eq!(metrics(a, b, &SM[..1]).1, vec![(OK, 40.0)]);
    // An activity change between the samples reads as the mean of the two.
    unsafe { assert_eq!(nvmlGpmSampleGet(f.migs[1], a), OK) };
    sim::set_activity(&f.state, 0, Some(&small), 0.0).unwrap();
    unsafe { assert_eq!(nvmlGpmSampleGet(f.migs[1], b), OK) };
    assert_eq!(metrics(a, b, &SM[..1]).1, vec![(OK, 17.5)]);
    unsafe {
        assert_eq!(nvmlGpmSampleFree(a), OK);
        assert_eq!(nvmlGpmSampleFree(b), OK);
    }
}

#[test]
fn gpm_refuses_what_nvml_h_rules_out() {
    let f = fixture();
    let (a, b, empty) = (alloc(), alloc(), alloc());
    let mut gi = 0;
    assert_eq!(unsafe { nvmlDeviceGetGpuInstanceId(f.migs[0], &mut gi) }, OK);
    unsafe {
        assert_eq!(nvmlGpmSampleAlloc(null_mut()), INVALID);
        // A GPU instance that does not exist; a MIG device handle where the parent is wanted.
        assert_eq!(nvmlGpmMigSampleGet(f.h100, 99, a), INVALID);
        assert_eq!(nvmlGpmMigSampleGet(f.migs[0], gi, a), INVALID);
        assert_eq!(nvmlGpmMigSampleGet(f.h100, gi, a), OK);
        assert_eq!(nvmlGpmSampleGet(f.migs[1], b), OK);
    }
    // Samples of two devices, an unfilled sample, a wrong version: refused.
    assert_eq!(metrics(a, b, &SM).0, INVALID);
    assert_eq!(metrics(a, empty, &SM).0, INVALID);
    let mut get: nvmlGpmMetricsGet_t = unsafe { std::mem::zeroed() };
    (get.sample1, get.sample2) = (a, a);
    assert_eq!(unsafe { nvmlGpmMetricsGet(&mut get) }, nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    // A metric the simulator does not model answers NOT_SUPPORTED in its slot only.
    let (rc, got) = metrics(a, a, &[nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL, SM[0]]);
    assert_eq!(rc, OK);
    assert_eq!(got[0].0, NOT_SUPPORTED);
    assert_eq!(got[1].0, OK);
    // A freed sample is gone: using or freeing it again is an invalid argument.
    unsafe {
        assert_eq!(nvmlGpmSampleFree(b), OK);
        assert_eq!(nvmlGpmSampleFree(b), INVALID);
        assert_eq!(nvmlGpmSampleGet(f.h100, b), INVALID);
    }
    assert_eq!(metrics(a, b, &SM).0, INVALID);
    // Setting the activity of an unknown MIG device, or outside 0-100, is refused.
    assert!(sim::set_activity(&f.state, 0, Some("MIG-nope"), 50.0).is_err());
    assert!(sim::set_activity(&f.state, 0, None, 101.0).is_err());
}
