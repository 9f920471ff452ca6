//! Several processes calling the simulated NVML library at once (an agent beside `node-agent sim`
//! commands, or several NVML clients): real NVML serialises their calls, so must the stand-in.
//! Each child process creates a MIG device on its own free slot; all must succeed and all must
//! remain.

use std::path::Path;
use std::process::Command;

use tessera_node_agent::backend::GpuBackend;
use tessera_node_agent::backend::nvml::NvmlBackend;
use tessera_node_agent::backend::sim::{self, SimBackend};
use tessera_node_agent::testutil::nvml_sim;

const CHILD: &str = "TESSERA_TEST_CHILD_START";
const LIB: &str = "TESSERA_TEST_CHILD_LIB";
const STATE: &str = "TESSERA_TEST_CHILD_STATE";
const TEST: &str = "concurrent_processes_each_create_an_instance_and_none_is_lost";

/// In a child: one NVML client creating a 1g.10gb at its start, then reading the GPU back.
fn child(start: u8) {
    let lib = std::env::var_os(LIB).unwrap();
    let mut b = NvmlBackend::init(Some(Path::new(&lib))).expect("nvmlInit");
    let made = b.create_instance(0, "1g.10gb", start).expect("create_instance");
    assert!(b.instances(0).expect("list").iter().any(|i| i.uuid == made.uuid));
}

/// In a child: `node-agent sim` style writers (hold/release the device) beside the NVML clients.
fn writer(state: &Path) {
    for n in 0..20 {
        sim::hold_device(state, 0, &format!("w{n}"), true).expect("hold");
        sim::hold_device(state, 0, &format!("w{n}"), false).expect("release");
    }
}

#[test]
fn concurrent_processes_each_create_an_instance_and_none_is_lost() {
    if let Ok(v) = std::env::var(CHILD) {
        let state = std::env::var_os(STATE).unwrap();
        match v.as_str() {
            "writer" => writer(Path::new(&state)),
            s => child(s.parse().unwrap()),
        }
        return;
    }
    let exe = std::env::current_exe().unwrap();
    for round in 0..4 {
        let (lib, state) = nvml_sim(&["H100-80GB"]);
        let mut st = SimBackend::at(&state).load().unwrap();
        st.gpus[0].info.mig_enabled = true;
        SimBackend::at(&state).save(&st).unwrap();
        let roles: Vec<String> = (0..7).map(|s| s.to_string()).chain(["writer".to_string()]).collect();
        let children: Vec<_> = roles
            .iter()
            .map(|role| {
                let c = Command::new(&exe)
                    .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
                    .env(CHILD, role)
                    .env(LIB, &lib)
                    .env(STATE, &state)
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                (role, c)
            })
            .collect();
        for (role, c) in children {
            let out = c.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "round {round}, child {role} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let st = SimBackend::at(&state).load().unwrap();
        let mut starts: Vec<u8> = st.gpus[0].instances.iter().map(|i| i.start).collect();
        starts.sort();
        assert_eq!(starts, (0..7).collect::<Vec<u8>>(), "round {round}: instances lost");
        assert!(st.gpus[0].instances.iter().all(|i| i.compute_instance_id.is_some()), "round {round}");
        assert!(st.gpus[0].holders.is_empty(), "round {round}: {:?}", st.gpus[0].holders);
    }
}
