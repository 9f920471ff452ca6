//! Helpers shared by the agent's unit tests.

use std::path::PathBuf;

/// A fresh temp dir per call, under one root per test process. Nothing removes /tmp on its own
/// and each simulated library copy is ~14 MB, so the first call sweeps the roots of test processes
/// that have exited (their PID gone from /proc).
pub fn temp_dir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(sweep_exited_roots);
    let dir = process_root(std::process::id()).join(format!("{tag}-{}", N.fetch_add(1, Ordering::Relaxed)));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const ROOT_PREFIX: &str = "tessera-agent-tests-";

fn process_root(pid: u32) -> PathBuf {
    std::env::temp_dir().join(format!("{ROOT_PREFIX}{pid}"))
}

/// Removes the temp roots of test processes no longer running (best effort: errors are ignored).
fn sweep_exited_roots() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(ROOT_PREFIX)).and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_roots_of_exited_test_processes_are_swept_and_live_ones_kept() {
        // A PID above the kernel's maximum (2^22) belongs to no process.
        let dead = process_root(4_194_305);
        std::fs::create_dir_all(dead.join("nvml-0")).unwrap();
        let live = temp_dir("live");
        sweep_exited_roots();
        assert!(!dead.exists(), "the root of an exited process is removed");
        assert!(live.exists(), "this process's own dirs are kept");
    }
}
