//! NVIDIA's own gpu-feature-discovery (GFD, the pinned build from `tools/build.sh
//! gpu-feature-discovery`, `TESSERA_GFD`) over the simulated `libnvidia-ml.so.1`: a layout the
//! agent's real NVML backend applies is what GFD labels the node with, MIG profile by profile, in
//! `--mig-strategy=mixed`. A third-party NVML client reading our simulator as it reads a driver is
//! the check that the simulator answers the calls NVIDIA's GPU stack makes as NVML does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use tessera_e2e::fixtures::workspace_binary;
use tessera_node_agent::backend::GpuBackend;
use tessera_node_agent::backend::nvml::NvmlBackend;
use tessera_node_agent::backend::sim::{SimBackend, model};

/// The pinned GFD (`TESSERA_GFD`, which `make test` and `make e2e` set).
fn gfd() -> PathBuf {
    let path = std::env::var("TESSERA_GFD")
        .expect("make test sets TESSERA_GFD (`tools/build.sh gpu-feature-discovery` prints it)");
    PathBuf::from(path)
}

/// GFD in one-shot mode over the library in `lib_dir`: its labels file, parsed.
fn run_gfd(lib_dir: &Path, out: &Path) -> BTreeMap<String, String> {
    let output = Command::new(gfd())
        .args(["--oneshot", "--mig-strategy=mixed", "--use-node-feature-api=false", "--no-timestamp"])
        .arg(format!("--output-file={}", out.display()))
        // No driver root or DMI table to read here; GFD then labels gpu.machine empty.
        .args(["--driver-root-ctr-path=/", "--machine-type-file=/dev/null"])
        // go-nvml dlopens libnvidia-ml.so.1: ours, ahead of any installed driver's.
        .env("LD_LIBRARY_PATH", lib_dir)
        // The library's state is the file beside it (where the agent's backend wrote the layout).
        .env_remove("TESSERA_NVML_SIM_STATE")
        .output()
        .expect("running gpu-feature-discovery");
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "gpu-feature-discovery failed: {}\n{log}", output.status);
    let text = std::fs::read_to_string(out).unwrap_or_else(|e| panic!("no labels file ({e}); GFD said:\n{log}"));
    text.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[test]
fn gfd_labels_the_mig_layout_the_agent_applied() {
    let dir = std::env::temp_dir().join(format!("tessera-e2e-gfd-{}", std::process::id()));
    let lib_dir = dir.join("lib");
    std::fs::create_dir_all(&lib_dir).unwrap();
    let lib = lib_dir.join("libnvidia-ml.so.1");
    std::fs::copy(workspace_binary("libnvidia_ml.so"), &lib).unwrap();
    let state = lib_dir.join("nvml-sim.json");
    SimBackend::open(&state, &["H100-80GB".to_string(), "H100-80GB".to_string()]).unwrap();

    // The layout, through the agent's NVML backend over the library (placements are starts on
    // the memory-slice axis).
    let layout: [(u32, &str, u8); 5] =
        [(0, "3g.40gb", 4), (0, "2g.20gb", 0), (0, "1g.10gb", 2), (0, "1g.10gb", 3), (1, "4g.40gb", 0)];
    let mut nvml = NvmlBackend::init(Some(&lib)).unwrap();
    for gpu in [0, 1] {
        nvml.set_mig_mode(gpu, true).unwrap();
    }
    for (gpu, profile, start) in layout {
        nvml.create_instance(gpu, profile, start).unwrap_or_else(|e| panic!("{profile} at {start} on GPU {gpu}: {e}"));
    }
    // A GPU instance whose compute instance was never made is no MIG device: GFD must not count it.
    {
        let sim = SimBackend::at(&state);
        let _lock = sim.lock().unwrap();
        let mut st = sim.load().unwrap();
        model::create_gpu_instance(&mut st, 1, "3g.40gb", 4).unwrap();
        sim.save(&st).unwrap();
    }

    let labels = run_gfd(&lib_dir, &dir.join("labels"));
    assert_eq!(labels.get("nvidia.com/mig.strategy").map(String::as_str), Some("mixed"));
    assert_eq!(labels.get("nvidia.com/mig.capable").map(String::as_str), Some("true"));
    let counts: BTreeMap<&str, &str> = labels
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("nvidia.com/mig-")?.strip_suffix(".count")?, v.as_str())))
        .collect();
    let want: BTreeMap<&str, &str> =
        [("1g.10gb", "2"), ("2g.20gb", "1"), ("3g.40gb", "1"), ("4g.40gb", "1")].into_iter().collect();
    assert_eq!(counts, want, "labels: {labels:#?}");
    // Each profile's shape, as the catalog (and the board) has it.
    let h100 = tessera_crds::catalog::lookup("NVIDIA H100 80GB HBM3").unwrap();
    for profile in want.keys() {
        let spec = h100.profile(profile).unwrap();
        let label = |what: &str| labels.get(&format!("nvidia.com/mig-{profile}.{what}")).cloned();
        assert_eq!(label("slices.gi"), Some(spec.compute_slices.to_string()), "{profile}");
        assert_eq!(label("product"), Some(format!("NVIDIA-H100-80GB-HBM3-MIG-{profile}")), "{profile}");
    }
    assert_eq!(labels.get("nvidia.com/gpu.compute.major").map(String::as_str), Some("9"));
    assert_eq!(labels.get("nvidia.com/cuda.driver-version.full").map(String::as_str), Some("580.159.04"));
    let _ = std::fs::remove_dir_all(&dir);
}
