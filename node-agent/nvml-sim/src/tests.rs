//! The library's own contract with nvml.h, called as C would call it.

use std::ptr::null_mut;

use nvml_wrapper_sys::bindings::*;
use tessera_node_agent::backend::sim::SimBackend;

use crate::compute_instances::*;
use crate::exports::*;
use crate::gpu_instances::*;

mod gpm;
mod mig;

/// `src/stubs.rs` is what `gen-stubs.sh` makes from the bindings and `exports.rs` today.
#[test]
fn stubs_are_current() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let fresh = std::env::temp_dir().join(format!("tessera-nvml-stubs-{}.rs", std::process::id()));
    let status = std::process::Command::new("bash").arg(format!("{dir}/gen-stubs.sh")).arg(&fresh).status().unwrap();
    assert!(status.success());
    let want = std::fs::read_to_string(&fresh).unwrap();
    let have = std::fs::read_to_string(format!("{dir}/src/stubs.rs")).unwrap();
    let _ = std::fs::remove_file(&fresh);
    assert!(want == have, "src/stubs.rs is stale: run node-agent/nvml-sim/gen-stubs.sh");
}

/// nvml.h with comments removed.
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("/*") {
            rest = r.find("*/").map(|i| &r[i + 2..]).unwrap_or("");
        } else if let Some(r) = rest.strip_prefix("//") {
            rest = r.find('\n').map(|i| &r[i..]).unwrap_or("");
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// Functions nvml.h declares: the `nvml*` identifier before the `(` of each `DECLDIR`
/// declaration, however many lines it spans (`#define DECLDIR` lines have none).
fn declared(header: &str) -> std::collections::BTreeSet<String> {
    let text = strip_comments(header);
    let mut names = std::collections::BTreeSet::new();
    for decl in text.split("DECLDIR").skip(1) {
        let head = &decl[..decl.find(['(', ';', '#']).unwrap_or(decl.len())];
        if !decl[head.len()..].starts_with('(') {
            continue;
        }
        let ident = head.trim_end().rsplit(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap_or("");
        if ident.starts_with("nvml") {
            names.insert(ident.to_string());
        }
    }
    names
}

/// Functions this library exports: `fn nvml*` / `nvml_fn!(nvml*` in its sources, and stubs.rs.
fn exported(dir: &str) -> Vec<String> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(format!("{dir}/src")).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_str().unwrap().to_string();
        // The tests (`tests.rs`, and the `tests/` folder) export nothing.
        if path.is_dir() || file == "tests.rs" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for line in text.lines() {
            let line = line.trim();
            if file == "stubs.rs" {
                if let Some(n) = line.strip_suffix(',').filter(|n| n.starts_with("nvml")) {
                    names.push(n.to_string());
                }
                continue;
            }
            for marker in ["extern \"C\" fn nvml", "nvml_fn!(nvml"] {
                if let Some(i) = line.find(marker) {
                    let name = &line[i + marker.len() - 4..];
                    let end = name.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(name.len());
                    names.push(name[..end].to_string());
                }
            }
        }
    }
    names
}

/// The drift check: the library exports exactly the functions nvml.h declares, each once (a new
/// nvml.h, or a function implemented without regenerating the stubs, fails here).
#[test]
fn exports_equal_nvml_h() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let want = declared(&std::fs::read_to_string(format!("{dir}/nvml.h")).unwrap());
    assert!(want.len() > 390, "nvml.h parsed to {} functions", want.len());
    // Ones whose declarations span several lines in nvml.h, and one not returning nvmlReturn_t.
    for f in ["nvmlDeviceGetGpuInstanceRemainingCapacity", "nvmlDevicePowerSmoothingSetState", "nvmlErrorString"] {
        assert!(want.contains(f), "{f} not found in nvml.h");
    }
    let list = exported(dir);
    let have: std::collections::BTreeSet<String> = list.iter().cloned().collect();
    assert_eq!(have.len(), list.len(), "a function is exported twice");
    let missing: Vec<_> = want.difference(&have).collect();
    let extra: Vec<_> = have.difference(&want).collect();
    assert!(missing.is_empty() && extra.is_empty(), "not exported: {missing:?}; not in nvml.h: {extra:?}");
}

fn v2() -> nvmlGpuInstanceProfileInfo_v2_t {
    // SAFETY: a plain C struct; all-zero is valid.
    let mut info: nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
    info.version = std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as u32 | (2 << 24);
    info
}

/// One test owns the process's session (the library keeps one, as NVML does).
#[test]
fn versions_sizes_and_codes_follow_nvml_h() {
    let _session = crate::tests::mig::SESSION_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let dir = std::env::temp_dir().join(format!("tessera-nvml-contract-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("state.json");
    SimBackend::open(&state, &["H100-80GB".to_string(), "A100-40GB".to_string()]).unwrap();
    // SAFETY: no other thread reads the environment while this test runs (the other test in
    // this binary starts a process, which reads it only at spawn).
    unsafe { std::env::set_var("TESSERA_NVML_SIM_STATE", &state) };
    unsafe {
        let mut count = 0;
        assert_eq!(nvmlDeviceGetCount_v2(&mut count), nvmlReturn_enum_NVML_ERROR_UNINITIALIZED);
        assert_eq!(nvmlInit_v2(), nvmlReturn_enum_NVML_SUCCESS);
        assert_eq!(nvmlDeviceGetCount_v2(&mut count), nvmlReturn_enum_NVML_SUCCESS);
        assert_eq!(count, 2);
        let mut dev = null_mut();
        assert_eq!(nvmlDeviceGetHandleByIndex_v2(2, &mut dev), nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
        assert_eq!(nvmlDeviceGetHandleByIndex_v2(0, &mut dev), nvmlReturn_enum_NVML_SUCCESS);

        // Struct versions: v2 and v3 are accepted, anything else is a version mismatch.
        let mut info = v2();
        assert_eq!(nvmlDeviceGetGpuInstanceProfileInfoV(dev, 0, &mut info), nvmlReturn_enum_NVML_SUCCESS);
        assert_eq!((info.id, info.sliceCount, info.instanceCount, info.memorySizeMB), (19, 1, 7, 9984));
        let mut v3: nvmlGpuInstanceProfileInfo_v3_t = std::mem::zeroed();
        v3.version = std::mem::size_of::<nvmlGpuInstanceProfileInfo_v3_t>() as u32 | (3 << 24);
        let rc = nvmlDeviceGetGpuInstanceProfileInfoV(dev, 9, (&mut v3 as *mut nvmlGpuInstanceProfileInfo_v3_t).cast());
        assert_eq!((rc, v3.id, v3.memorySizeMB), (nvmlReturn_enum_NVML_SUCCESS, 15, 20096));
        let mut bad = v2();
        bad.version = std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as u32 | (1 << 24);
        let rc = nvmlDeviceGetGpuInstanceProfileInfoV(dev, 0, &mut bad);
        assert_eq!(rc, nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        // Profiles the board lacks, and enums past NVML's count.
        assert_eq!(nvmlDeviceGetGpuInstanceProfileInfoV(dev, 5, &mut v2()), nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED);
        assert_eq!(
            nvmlDeviceGetGpuInstanceProfileInfoV(dev, 99, &mut v2()),
            nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );

        // Placements: a null array asks for the count; a short one is INSUFFICIENT_SIZE.
        let mut n = 0;
        assert_eq!(nvmlDeviceGetGpuInstancePossiblePlacements_v2(dev, 19, null_mut(), &mut n), 0);
        assert_eq!(n, 7);
        let mut two = [nvmlGpuInstancePlacement_t { start: 0, size: 0 }; 2];
        let mut n = 2;
        let rc = nvmlDeviceGetGpuInstancePossiblePlacements_v2(dev, 19, two.as_mut_ptr(), &mut n);
        assert_eq!(rc, nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE);

        // GPU-instance calls need MIG mode; activation is immediate on an idle H100.
        let at = nvmlGpuInstancePlacement_t { start: 0, size: 8 };
        let mut gi = null_mut();
        let rc = nvmlDeviceCreateGpuInstanceWithPlacement(dev, 0, &at, &mut gi);
        assert_eq!(rc, nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED);
        let mut status = 99;
        assert_eq!(nvmlDeviceSetMigMode(dev, 1, &mut status), 0);
        assert_eq!(status, nvmlReturn_enum_NVML_SUCCESS);
        assert_eq!(nvmlDeviceCreateGpuInstanceWithPlacement(dev, 0, &at, &mut gi), 0);
        // A GPU instance with a compute instance cannot be destroyed (IN_USE), nor MIG disabled.
        let mut ci = null_mut();
        assert_eq!(nvmlGpuInstanceCreateComputeInstance(gi, 4, &mut ci), 0);
        assert_eq!(nvmlGpuInstanceDestroy(gi), nvmlReturn_enum_NVML_ERROR_IN_USE);
        assert_eq!(nvmlDeviceSetMigMode(dev, 0, &mut status), nvmlReturn_enum_NVML_ERROR_IN_USE);
        assert_eq!(nvmlComputeInstanceDestroy(ci), 0);
        assert_eq!(nvmlGpuInstanceDestroy(gi), 0);
        // Stale handles are invalid arguments.
        assert_eq!(nvmlGpuInstanceDestroy(gi), nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);

        // Without a placement the driver picks from the highest start down; ids follow the
        // placement (1g at 6:1 is GPU instance 13) and come back after a destroy.
        let placed = |gi: nvmlGpuInstance_t| {
            let mut info: nvmlGpuInstanceInfo_t = std::mem::zeroed();
            assert_eq!(nvmlGpuInstanceGetInfo(gi, &mut info), 0);
            (info.id, info.placement.start)
        };
        let (mut a, mut b) = (null_mut(), null_mut());
        assert_eq!(nvmlDeviceCreateGpuInstance(dev, 19, &mut a), 0);
        assert_eq!(nvmlDeviceCreateGpuInstance(dev, 19, &mut b), 0);
        assert_eq!((placed(a), placed(b)), ((13, 6), (12, 5)));
        assert_eq!(nvmlGpuInstanceDestroy(a), 0);
        assert_eq!(nvmlDeviceCreateGpuInstance(dev, 19, &mut a), 0);
        assert_eq!(placed(a), (13, 6));
        assert_eq!(nvmlDeviceCreateGpuInstance(dev, 9, &mut gi), 0);
        assert_eq!(placed(gi), (1, 0), "3g: 4:4 is taken by the 1g instances, so 0:4");
        for h in [a, b, gi] {
            assert_eq!(nvmlGpuInstanceDestroy(h), 0);
        }

        // Compute instances smaller than their GPU instance (nvidia-smi mig -cci): three 1c in a 3g
        // are listed and counted, and leave no room for the full-size one.
        assert_eq!(
            nvmlDeviceCreateGpuInstanceWithPlacement(
                dev,
                9,
                &nvmlGpuInstancePlacement_t { start: 0, size: 4 },
                &mut gi
            ),
            0
        );
        let mut one: nvmlComputeInstanceProfileInfo_t = std::mem::zeroed();
        assert_eq!(nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 0, 0, &mut one), 0);
        assert_eq!((one.id, one.sliceCount, one.instanceCount, one.multiprocessorCount), (0, 1, 3, 20));
        let left = |p: u32| {
            let mut n = 99;
            assert_eq!(nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, p, &mut n), 0);
            n
        };
        assert_eq!((left(0), left(1), left(2)), (3, 1, 1));
        let mut cis = [null_mut(); 3];
        for c in &mut cis {
            assert_eq!(nvmlGpuInstanceCreateComputeInstance(gi, 0, c), 0);
        }
        assert_eq!((left(0), left(1), left(2)), (0, 0, 0));
        assert_eq!(
            nvmlGpuInstanceCreateComputeInstance(gi, 0, &mut ci),
            nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES
        );
        assert_eq!(
            nvmlGpuInstanceCreateComputeInstance(gi, 2, &mut ci),
            nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES
        );
        let mut listed = [null_mut(); 3];
        let mut n = 0;
        assert_eq!(nvmlGpuInstanceGetComputeInstances(gi, 0, listed.as_mut_ptr(), &mut n), 0);
        assert_eq!((n, listed), (3, cis));
        let mut info: nvmlComputeInstanceInfo_t = std::mem::zeroed();
        assert_eq!(nvmlComputeInstanceGetInfo_v2(cis[2], &mut info), 0);
        assert_eq!((info.id, info.profileId, info.placement.start, info.placement.size), (2, 0, 2, 1));
        assert_eq!(nvmlGpuInstanceDestroy(gi), nvmlReturn_enum_NVML_ERROR_IN_USE);
        for c in cis {
            assert_eq!(nvmlComputeInstanceDestroy(c), 0);
        }
        assert_eq!(nvmlComputeInstanceDestroy(cis[0]), nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT, "stale");
        assert_eq!(nvmlGpuInstanceDestroy(gi), 0);

        // Engines and SMs per profile as the boards report them (H100: read on the board; A100:
        // the MIG user guide's table), A100 memory as the driver reports it.
        let mut h7: nvmlGpuInstanceProfileInfo_v3_t = std::mem::zeroed();
        h7.version = std::mem::size_of::<nvmlGpuInstanceProfileInfo_v3_t>() as u32 | (3 << 24);
        assert_eq!(
            nvmlDeviceGetGpuInstanceProfileInfoV(dev, 4, (&mut h7 as *mut nvmlGpuInstanceProfileInfo_v3_t).cast()),
            0
        );
        let got = (h7.multiprocessorCount, h7.copyEngineCount, h7.decoderCount, h7.jpegCount, h7.ofaCount);
        assert_eq!(got, (132, 8, 7, 7, 1));
        let mut a100 = null_mut();
        assert_eq!(nvmlDeviceGetHandleByIndex_v2(1, &mut a100), 0);
        let row = |e: u32| {
            let mut i: nvmlGpuInstanceProfileInfo_t = std::mem::zeroed();
            assert_eq!(nvmlDeviceGetGpuInstanceProfileInfo(a100, e, &mut i), 0);
            (i.memorySizeMB, i.multiprocessorCount, i.copyEngineCount, i.decoderCount, i.jpegCount, i.ofaCount)
        };
        assert_eq!(row(0), (4864, 14, 1, 0, 0, 0), "1g.5gb");
        assert_eq!(row(7), (4864, 14, 1, 1, 1, 1), "1g.5gb+me");
        assert_eq!(row(2), (19968, 42, 3, 2, 0, 0), "3g.20gb");
        assert_eq!(row(4), (40192, 98, 7, 5, 1, 1), "7g.40gb");
        assert_eq!(nvmlShutdown(), 0);
        assert_eq!(nvmlShutdown(), nvmlReturn_enum_NVML_ERROR_UNINITIALIZED);
    }
}
