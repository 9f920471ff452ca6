//! `node-agent probe` over the simulated NVML library prints the tables the real H100 printed
//! (docs/hardware/h100-80gb-hbm3.node-agent-probe.*), UUID aside, and the catalog's table for
//! boards we have no hardware record of.

use std::process::Command;

use tessera_node_agent::testutil::nvml_sim;

const HARDWARE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/hardware/h100-80gb-hbm3.node-agent-probe");

fn probe(args: &[&str]) -> String {
    probe_board("H100-80GB", args)
}

fn probe_board(board: &str, args: &[&str]) -> String {
    let (lib, _) = nvml_sim(&[board]);
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

/// A board only the catalog knows (no hardware record): the library serves its table, graphics
/// and media variants included, and the probe reads every profile back and finds it matches.
#[test]
fn probe_over_the_library_reads_every_rtx_pro_6000_profile() {
    let model = tessera_crds::catalog::lookup("RTX-PRO-6000-96GB").unwrap();
    let out = probe_board(model.name, &[]);
    assert!(out.starts_with("GPU 0 NVIDIA RTX PRO 6000 Blackwell Server Edition ("), "{out}");
    for p in model.profiles {
        let want = format!(
            "  {:<12} id {:>2}  compute {}  memory slices {}  max {}  starts {:?}",
            p.name, p.id, p.compute_slices, p.memory_slices, p.max_count, p.starts
        );
        assert!(out.lines().any(|l| l.starts_with(&want)), "{want:?} missing from\n{out}");
    }
    assert_eq!(out.lines().filter(|l| l.contains(" id ")).count(), model.profiles.len(), "{out}");
    assert!(out.lines().any(|l| l.trim() == "catalog: matches"), "{out}");
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
