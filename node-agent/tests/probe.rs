//! `node-agent probe` over the simulated NVML library prints the tables the real H100 printed
//! (docs/hardware/h100-80gb-hbm3.node-agent-probe.*), UUID aside.

use std::process::Command;

use tessera_node_agent::testutil::nvml_sim;

const HARDWARE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/hardware/h100-80gb-hbm3.node-agent-probe");

fn probe(args: &[&str]) -> String {
    let (lib, _) = nvml_sim(&["H100-80GB"]);
    let out = Command::new(env!("CARGO_BIN_EXE_node-agent"))
        .args(["probe", "--backend", "nvml", "--nvml-library"])
        .arg(&lib)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "probe failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The GPU's UUID is the one thing a simulated board cannot share with the real one.
fn without_uuid(line: &str) -> String {
    match (line.find("(GPU-"), line.find("),")) {
        (Some(a), Some(b)) if a < b => format!("{}(UUID{}", &line[..a], &line[b..]),
        _ => line.to_string(),
    }
}

#[test]
fn probe_over_the_library_prints_the_real_h100_table() {
    let real = std::fs::read_to_string(format!("{HARDWARE}.txt")).unwrap();
    let want: Vec<String> = real.lines().filter(|l| !l.starts_with('#')).map(without_uuid).collect();
    let got: Vec<String> = probe(&[]).lines().map(without_uuid).collect();
    assert_eq!(got, want);
}

#[test]
fn probe_json_over_the_library_matches_the_real_h100_record() {
    let real: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{HARDWARE}.json")).unwrap()).unwrap();
    let mut got: serde_json::Value = serde_json::from_str(&probe(&["--json"])).unwrap();
    got[0]["gpu"]["uuid"] = real[0]["gpu"]["uuid"].clone();
    assert_eq!(got, real);
}

/// `node-agent probe | head -0`: killed by SIGPIPE like `cat`, not a panic with exit 101.
#[test]
fn probe_into_a_closed_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt as _;
    let (lib, _) = nvml_sim(&["H100-80GB"]);
    for json in [false, true] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(env!("CARGO_BIN_EXE_node-agent"))
            .args(["probe", "--backend", "nvml", "--nvml-library"])
            .arg(&lib)
            .args(json.then_some("--json"))
            .env("RUST_BACKTRACE", "1")
            .stdout(writer)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.signal(), Some(13), "json {json}: {:?} {stderr}", out.status);
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
