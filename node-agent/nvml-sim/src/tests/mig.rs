//! The calls NVIDIA's device plugin and gpu-feature-discovery make to name, find and
//! health-check MIG devices, called as C would call them, one test per call, on an H100 in MIG
//! mode holding a 3g.40gb and a 2g.20gb MIG device and a half-made 1g.10gb GPU instance (no
//! compute instance), next to an A100 40GB with MIG off.

use std::ffi::{CStr, CString, c_char};
use std::path::PathBuf;
use std::ptr::null_mut;
use std::sync::Mutex;

use nvml_wrapper_sys::bindings::*;
use tessera_node_agent::backend::sim::SimBackend;

use crate::compute_instances::*;
use crate::devices::*;
use crate::events::*;
use crate::exports::*;
use crate::gpu_instances::*;

/// The library keeps one session per process: tests that open one take turns.
pub static SESSION_LOCK: Mutex<()> = Mutex::new(());

const OK: nvmlReturn_t = nvmlReturn_enum_NVML_SUCCESS;
const INVALID: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const NOT_FOUND: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
const NOT_SUPPORTED: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;

pub(crate) struct Fixture {
    _lock: std::sync::MutexGuard<'static, ()>,
    pub(crate) state: PathBuf,
    pub(crate) h100: nvmlDevice_t,
    pub(crate) a100: nvmlDevice_t,
    /// MIG devices by index: the 3g.40gb, then the 2g.20gb.
    pub(crate) migs: Vec<nvmlDevice_t>,
    /// The half-made 1g.10gb GPU instance's UUID (it names no MIG device).
    half_made_uuid: String,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // A failed assertion must not leave the session open for the next test.
        while unsafe { nvmlShutdown() } == OK {}
    }
}

pub(crate) fn uuid(dev: nvmlDevice_t) -> String {
    let mut buf = [0 as c_char; 96];
    assert_eq!(unsafe { nvmlDeviceGetUUID(dev, buf.as_mut_ptr(), 96) }, OK);
    unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap().to_string()
}

pub(crate) fn fixture() -> Fixture {
    let lock = SESSION_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("tessera-nvml-mig-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("state.json");
    SimBackend::open(&state, &["H100-80GB".to_string(), "A100-40GB".to_string()]).unwrap();
    // SAFETY: the session lock is held; the library reads the variable at nvmlInit only.
    unsafe { std::env::set_var("TESSERA_NVML_SIM_STATE", &state) };
    unsafe {
        assert_eq!(nvmlInit_v2(), OK);
        let (mut h100, mut a100) = (null_mut(), null_mut());
        assert_eq!(nvmlDeviceGetHandleByIndex_v2(0, &mut h100), OK);
        assert_eq!(nvmlDeviceGetHandleByIndex_v2(1, &mut a100), OK);
        let mut status = 0;
        assert_eq!(nvmlDeviceSetMigMode(h100, 1, &mut status), OK);
        // 3g.40gb (id 9, compute profile 2), 2g.20gb (id 14, compute 1), 1g.10gb (id 19) alone.
        // Placed (start, memory slices): 4-7, 0-1 and 2; slice 3 stays free.
        for (profile, start, size, ci_profile) in [(9, 4, 4, Some(2)), (14, 0, 2, Some(1)), (19, 2, 1, None)] {
            let mut gi = null_mut();
            let at = nvmlGpuInstancePlacement_t { start, size };
            let rc = nvmlDeviceCreateGpuInstanceWithPlacement(h100, profile, &at, &mut gi);
            assert_eq!(rc, OK, "GPU instance {profile}");
            if let Some(c) = ci_profile {
                let mut ci = null_mut();
                assert_eq!(nvmlGpuInstanceCreateComputeInstance(gi, c, &mut ci), OK);
            }
        }
        let mut migs = Vec::new();
        for i in 0..2 {
            let mut m = null_mut();
            assert_eq!(nvmlDeviceGetMigDeviceHandleByIndex(h100, i, &mut m), OK);
            migs.push(m);
        }
        let st = SimBackend::at(&state).load().unwrap();
        let half = st.gpus[0].instances.iter().find(|i| i.compute_instance_id.is_none()).unwrap();
        Fixture { _lock: lock, state, h100, a100, migs, half_made_uuid: half.uuid.clone() }
    }
}

fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

#[test]
fn handle_by_uuid_finds_gpus_and_mig_devices_only() {
    let f = fixture();
    unsafe {
        let mut h = null_mut();
        assert_eq!(nvmlDeviceGetHandleByUUID(c(&uuid(f.a100)).as_ptr(), &mut h), OK);
        assert_eq!(h, f.a100);
        for m in &f.migs {
            let mut h = null_mut();
            assert_eq!(nvmlDeviceGetHandleByUUID(c(&uuid(*m)).as_ptr(), &mut h), OK);
            assert_eq!(h, *m);
            let mut is_mig = 0;
            assert_eq!(nvmlDeviceIsMigDeviceHandle(h, &mut is_mig), OK);
            assert_eq!(is_mig, 1);
        }
        // A GPU instance without a compute instance is no MIG device (the simulator gives it no
        // UUID at all; should it get one, it must still find nothing).
        if !f.half_made_uuid.is_empty() {
            assert_eq!(nvmlDeviceGetHandleByUUID(c(&f.half_made_uuid).as_ptr(), &mut h), NOT_FOUND);
        }
        assert_eq!(
            nvmlDeviceGetHandleByUUID(c("GPU-00000000-0000-0000-0000-000000000000").as_ptr(), &mut h),
            NOT_FOUND
        );
        assert_eq!(nvmlDeviceGetHandleByUUID(c("").as_ptr(), &mut h), INVALID);
        assert_eq!(nvmlDeviceGetHandleByUUID(std::ptr::null(), &mut h), INVALID);
        assert_eq!(nvmlDeviceGetHandleByUUID(c(&uuid(f.h100)).as_ptr(), null_mut()), INVALID);
        // A destroyed MIG device's UUID finds nothing.
        let gone = uuid(f.migs[1]);
        let (mut gi_id, mut gi) = (0, null_mut());
        assert_eq!(nvmlDeviceGetGpuInstanceId(f.migs[1], &mut gi_id), OK);
        assert_eq!(nvmlDeviceGetGpuInstanceById(f.h100, gi_id, &mut gi), OK);
        let mut ci = null_mut();
        assert_eq!(nvmlGpuInstanceGetComputeInstanceById(gi, 0, &mut ci), OK);
        assert_eq!(nvmlComputeInstanceDestroy(ci), OK);
        assert_eq!(nvmlDeviceGetHandleByUUID(c(&gone).as_ptr(), &mut h), NOT_FOUND);
    }
}

#[test]
fn attributes_answer_mig_devices_and_not_gpus() {
    let f = fixture();
    unsafe {
        let mut a: nvmlDeviceAttributes_t = std::mem::zeroed();
        assert_eq!(nvmlDeviceGetAttributes_v2(f.migs[0], &mut a), OK);
        // H100 80GB 3g.40gb: 3 slices, 40448 MiB, 60 SMs (as read on the board).
        assert_eq!((a.gpuInstanceSliceCount, a.computeInstanceSliceCount), (3, 3));
        assert_eq!((a.memorySizeMB, a.multiprocessorCount), (40448, 60));
        let mut m: nvmlMemory_t = std::mem::zeroed();
        assert_eq!(nvmlDeviceGetMemoryInfo(f.migs[0], &mut m), OK);
        assert_eq!(m.total, a.memorySizeMB * 1024 * 1024, "attributes and memory info agree");
        assert_eq!(nvmlDeviceGetAttributes(f.migs[1], &mut a), OK);
        assert_eq!(a.gpuInstanceSliceCount, 2);
        // nvml.h: "currently only supports MIG device handles".
        assert_eq!(nvmlDeviceGetAttributes_v2(f.h100, &mut a), NOT_SUPPORTED);
        assert_eq!(nvmlDeviceGetAttributes_v2(f.migs[0], null_mut()), INVALID);
        assert_eq!(nvmlDeviceGetAttributes_v2(0x1234 as nvmlDevice_t, &mut a), INVALID);
    }
}

#[test]
fn index_round_trips_through_mig_device_handle_by_index() {
    let f = fixture();
    unsafe {
        let mut i = 99;
        assert_eq!(nvmlDeviceGetIndex(f.a100, &mut i), OK);
        assert_eq!(i, 1);
        for (n, m) in f.migs.iter().enumerate() {
            assert_eq!(nvmlDeviceGetIndex(*m, &mut i), OK);
            assert_eq!(i as usize, n);
            let mut again = null_mut();
            assert_eq!(nvmlDeviceGetMigDeviceHandleByIndex(f.h100, i, &mut again), OK);
            assert_eq!(again, *m);
        }
        assert_eq!(nvmlDeviceGetIndex(f.h100, null_mut()), INVALID);
    }
}

#[test]
fn minor_number_is_the_gpus_and_not_supported_on_mig_devices() {
    let f = fixture();
    unsafe {
        let mut minor = 99;
        assert_eq!(nvmlDeviceGetMinorNumber(f.a100, &mut minor), OK);
        assert_eq!(minor, 1);
        assert_eq!(nvmlDeviceGetMinorNumber(f.migs[0], &mut minor), NOT_SUPPORTED);
        assert_eq!(nvmlDeviceGetMinorNumber(f.h100, null_mut()), INVALID);
    }
}

#[test]
fn cuda_compute_capability_by_architecture_and_parent() {
    let f = fixture();
    unsafe {
        let (mut major, mut minor) = (0, -1);
        assert_eq!(nvmlDeviceGetCudaComputeCapability(f.h100, &mut major, &mut minor), OK);
        assert_eq!((major, minor), (9, 0));
        assert_eq!(nvmlDeviceGetCudaComputeCapability(f.a100, &mut major, &mut minor), OK);
        assert_eq!((major, minor), (8, 0));
        assert_eq!(nvmlDeviceGetCudaComputeCapability(f.migs[1], &mut major, &mut minor), OK);
        assert_eq!((major, minor), (9, 0));
        assert_eq!(nvmlDeviceGetCudaComputeCapability(f.h100, null_mut(), &mut minor), INVALID);
    }
}

#[test]
fn handle_by_pci_bus_id_takes_nvml_h_forms() {
    let f = fixture();
    unsafe {
        let mut pci: nvmlPciInfo_t = std::mem::zeroed();
        assert_eq!(nvmlDeviceGetPciInfo_v3(f.a100, &mut pci), OK);
        let bus_id = CStr::from_ptr(pci.busId.as_ptr()).to_str().unwrap().to_string();
        let legacy = CStr::from_ptr(pci.busIdLegacy.as_ptr()).to_str().unwrap().to_string();
        let short = bus_id.split_once(':').unwrap().1.to_lowercase();
        let no_function = bus_id.rsplit_once('.').unwrap().0.to_string();
        for form in [bus_id.as_str(), &legacy, &short, &no_function] {
            let mut h = null_mut();
            assert_eq!(nvmlDeviceGetHandleByPciBusId_v2(c(form).as_ptr(), &mut h), OK, "{form}");
            assert_eq!(h, f.a100, "{form}");
            let mut h = null_mut();
            assert_eq!(nvmlDeviceGetHandleByPciBusId(c(form).as_ptr(), &mut h), OK, "{form}");
            assert_eq!(h, f.a100, "{form}");
        }
        let mut h = null_mut();
        assert_eq!(nvmlDeviceGetHandleByPciBusId_v2(c("00000000:7F:00.0").as_ptr(), &mut h), NOT_FOUND);
        assert_eq!(nvmlDeviceGetHandleByPciBusId_v2(c("not a bus id").as_ptr(), &mut h), INVALID);
        assert_eq!(nvmlDeviceGetHandleByPciBusId_v2(std::ptr::null(), &mut h), INVALID);
        assert_eq!(nvmlDeviceGetHandleByPciBusId_v2(c(&bus_id).as_ptr(), null_mut()), INVALID);
    }
}

#[test]
fn bus_id_parser_rejects_partial_forms() {
    assert_eq!(parse_bus_id("0000:1b:00.0"), Some((0, 0x1b, 0, 0)));
    assert_eq!(parse_bus_id("1B:00.1"), Some((0, 0x1b, 0, 1)));
    for bad in ["", "1b", "1b:00", ":1b:00.0", "0:1b:00.", "x:1b:00.0", "0:0:1b:00.0"] {
        assert_eq!(parse_bus_id(bad), None, "{bad:?}");
    }
}

#[test]
fn remaining_capacity_counts_what_still_fits() {
    let f = fixture();
    unsafe {
        // Slices 4-7 (3g), 0-1 (2g) and 2 (the half-made 1g) are taken: one 1g.10gb fits, at 3;
        // no 1g.20gb (it starts at even slices only), 2g or 3g.
        let mut n = 99;
        assert_eq!(nvmlDeviceGetGpuInstanceRemainingCapacity(f.h100, 19, &mut n), OK);
        assert_eq!(n, 1);
        for full in [15, 14, 9] {
            assert_eq!(nvmlDeviceGetGpuInstanceRemainingCapacity(f.h100, full, &mut n), OK);
            assert_eq!(n, 0, "profile {full}");
        }
        // Asking creates nothing.
        assert_eq!(nvmlDeviceGetGpuInstanceRemainingCapacity(f.h100, 19, &mut n), OK);
        assert_eq!(n, 1);
        assert_eq!(nvmlDeviceGetGpuInstanceRemainingCapacity(f.a100, 19, &mut n), NOT_SUPPORTED, "MIG off");
        assert_eq!(nvmlDeviceGetGpuInstanceRemainingCapacity(f.h100, 12345, &mut n), INVALID);
        assert_eq!(nvmlDeviceGetGpuInstanceRemainingCapacity(f.h100, 19, null_mut()), INVALID);
        assert_eq!(nvmlDeviceGetGpuInstanceRemainingCapacity(f.migs[0], 19, &mut n), INVALID);
    }
}

#[test]
fn mig_device_calls_gfd_makes() {
    let f = fixture();
    unsafe {
        let mut n = 0;
        assert_eq!(nvmlDeviceGetMaxMigDeviceCount(f.h100, &mut n), OK);
        assert_eq!(n, 7);
        let mut m = null_mut();
        assert_eq!(nvmlDeviceGetMigDeviceHandleByIndex(f.h100, 2, &mut m), NOT_FOUND, "the half-made one");
        let mut parent = null_mut();
        assert_eq!(nvmlDeviceGetDeviceHandleFromMigDeviceHandle(f.migs[0], &mut parent), OK);
        assert_eq!(parent, f.h100);
        assert_eq!(nvmlDeviceGetDeviceHandleFromMigDeviceHandle(f.h100, &mut parent), INVALID);
        let (mut gi, mut ci) = (99, 99);
        assert_eq!(nvmlDeviceGetGpuInstanceId(f.migs[1], &mut gi), OK);
        assert_eq!(nvmlDeviceGetComputeInstanceId(f.migs[1], &mut ci), OK);
        let mut gih = null_mut();
        assert_eq!(nvmlDeviceGetGpuInstanceById(f.h100, gi, &mut gih), OK);
        let mut info: nvmlGpuInstanceInfo_t = std::mem::zeroed();
        assert_eq!(nvmlGpuInstanceGetInfo(gih, &mut info), OK);
        assert_eq!((info.profileId, ci), (14, 0));
        assert_eq!(nvmlDeviceGetGpuInstanceId(f.h100, &mut gi), NOT_SUPPORTED);
        assert_eq!(nvmlDeviceGetComputeInstanceId(f.h100, &mut ci), NOT_SUPPORTED);
        let mut name = [0 as c_char; 96];
        assert_eq!(nvmlDeviceGetName(f.migs[1], name.as_mut_ptr(), 96), OK);
        assert_eq!(CStr::from_ptr(name.as_ptr()).to_str().unwrap(), "NVIDIA H100 80GB HBM3 MIG 2g.20gb");
        assert!(uuid(f.migs[1]).starts_with("MIG-"), "{}", uuid(f.migs[1]));
        assert_ne!(uuid(f.migs[0]), uuid(f.migs[1]));
        assert_eq!(nvmlDeviceGetMaxMigDeviceCount(f.a100, &mut n), OK);
        assert_eq!(n, 0, "MIG off");
    }
}

#[test]
fn event_sets_register_gpus_and_time_out_without_events() {
    let f = fixture();
    unsafe {
        assert_eq!(nvmlEventSetCreate(null_mut()), INVALID);
        let mut set = null_mut();
        assert_eq!(nvmlEventSetCreate(&mut set), OK);
        let mut types = 0;
        assert_eq!(nvmlDeviceGetSupportedEventTypes(f.h100, &mut types), OK);
        assert_eq!(types, SUPPORTED);
        assert_eq!(nvmlDeviceGetSupportedEventTypes(f.migs[0], &mut types), NOT_SUPPORTED);
        assert_eq!(nvmlDeviceGetSupportedEventTypes(f.h100, null_mut()), INVALID);
        assert_eq!(nvmlDeviceRegisterEvents(f.h100, SUPPORTED, set), OK);
        assert_eq!(nvmlDeviceRegisterEvents(f.h100, nvmlEventTypePState as u64, set), NOT_SUPPORTED);
        assert_eq!(nvmlDeviceRegisterEvents(f.migs[0], SUPPORTED, set), NOT_SUPPORTED);
        let mut data: nvmlEventData_t = std::mem::zeroed();
        let start = std::time::Instant::now();
        assert_eq!(nvmlEventSetWait_v2(set, &mut data, 50), nvmlReturn_enum_NVML_ERROR_TIMEOUT);
        assert!(start.elapsed() >= std::time::Duration::from_millis(50), "waited its timeout");
        assert_eq!(nvmlEventSetWait_v2(set, null_mut(), 0), INVALID);
        assert_eq!(nvmlEventSetWait(set, &mut data, 0), nvmlReturn_enum_NVML_ERROR_TIMEOUT, "the v1 wait");
        assert_eq!(nvmlEventSetFree(set), OK);
        assert_eq!(nvmlEventSetFree(set), INVALID, "freed twice");
        assert_eq!(nvmlEventSetWait_v2(set, &mut data, 0), INVALID);
        assert_eq!(nvmlDeviceRegisterEvents(f.a100, SUPPORTED, set), INVALID);
        // A driver restart loses the GPUs: a wait says so instead of timing out.
        let mut set = null_mut();
        assert_eq!(nvmlEventSetCreate(&mut set), OK);
        tessera_node_agent::backend::sim::driver_restart(&f.state).unwrap();
        assert_eq!(nvmlEventSetWait_v2(set, &mut data, 0), nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST);
    }
}

#[test]
fn compute_capability_covers_every_catalog_model() {
    for m in tessera_crds::catalog::MODELS {
        assert!(compute_capability(m.nvml_names[0]).is_some(), "{}", m.name);
    }
}

#[test]
fn system_versions_match_the_simulated_driver() {
    let _f = fixture();
    unsafe {
        let (mut v, mut v2) = (0, 0);
        assert_eq!(crate::system::nvmlSystemGetCudaDriverVersion(&mut v), OK);
        assert_eq!(crate::system::nvmlSystemGetCudaDriverVersion_v2(&mut v2), OK);
        assert_eq!((v, v2), (13000, 13000), "CUDA 13.0, as driver 580 ships");
        assert_eq!(crate::system::nvmlSystemGetCudaDriverVersion(null_mut()), INVALID);
        let (mut nvml, mut driver) = ([0 as c_char; 80], [0 as c_char; 80]);
        assert_eq!(crate::system::nvmlSystemGetNVMLVersion(nvml.as_mut_ptr(), 80), OK);
        assert_eq!(nvmlSystemGetDriverVersion(driver.as_mut_ptr(), 80), OK);
        let nvml = CStr::from_ptr(nvml.as_ptr()).to_str().unwrap();
        let driver = CStr::from_ptr(driver.as_ptr()).to_str().unwrap();
        assert_eq!(nvml, format!("13.{driver}"));
        assert_eq!(crate::system::nvmlSystemGetNVMLVersion(null_mut(), 80), INVALID);
        let mut short = [0 as c_char; 4];
        assert_eq!(
            crate::system::nvmlSystemGetNVMLVersion(short.as_mut_ptr(), 4),
            nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE
        );
    }
}
