//! Helpers shared by the agent's unit tests.

use std::path::PathBuf;

/// A fresh temp dir per call (removed by the OS; tests write only small state files).
pub fn temp_dir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tessera-agent-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The simulated NVML library (`tessera-nvml-sim`), built once per test process into this
/// target directory (cargo does not build another package's cdylib for our tests).
pub fn nvml_sim_library() -> PathBuf {
    use std::sync::OnceLock;
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        // target/<profile>/deps/<test binary>
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.parent().and_then(|d| d.parent()).unwrap().to_path_buf();
        let target_dir = profile_dir.parent().unwrap();
        let status = std::process::Command::new(env!("CARGO"))
            .args(["build", "-p", "tessera-nvml-sim", "--target-dir"])
            .arg(target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("running cargo to build tessera-nvml-sim");
        assert!(status.success(), "cargo build -p tessera-nvml-sim failed");
        let lib = profile_dir.join("libnvidia_ml.so");
        assert!(lib.exists(), "{} was not built", lib.display());
        lib
    })
    .clone()
}

/// A private copy of the simulated NVML library (its own loaded instance and state) with GPUs of
/// `products`: returns the library path and its state file.
pub fn nvml_sim(products: &[&str]) -> (PathBuf, PathBuf) {
    let dir = temp_dir("nvml");
    let lib = dir.join("libnvidia-ml.so.1");
    std::fs::copy(nvml_sim_library(), &lib).unwrap();
    let state = dir.join("nvml-sim.json");
    let products: Vec<String> = products.iter().map(|s| s.to_string()).collect();
    crate::backend::sim::SimBackend::open(&state, &products).unwrap();
    (lib, state)
}
