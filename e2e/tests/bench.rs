//! `make bench` at a small size, so it cannot rot unnoticed: the rollout bench runs to the end on
//! the real control plane and writes its table and plot. Its figures are not checked here (a
//! timing on a shared machine says nothing); BENCHMARKS.md has them from `make bench`.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A few dozen nodes: enough for several rollout waves at `maxUnavailable: 10%`.
const NODES: usize = 24;
/// Far longer than the run takes (about a minute); past it the bench is taken as hung.
const LIMIT: Duration = Duration::from_secs(900);

#[test]
fn the_rollout_bench_runs_to_completion_and_writes_its_table() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::env::temp_dir().join(format!("tessera-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let mut bench = Command::new(env!("CARGO_BIN_EXE_bench-rollout"))
        .arg(NODES.to_string())
        .current_dir(&workspace)
        .env("TESSERA_OPERATOR_BIN", tessera_e2e::fixtures::workspace_binary("tessera-operator"))
        .env("BENCH_OUT", &out)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("bench-rollout starts");
    // Read as it is printed, so a full pipe never stalls the bench.
    let mut stdout = bench.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut printed = String::new();
        let _ = stdout.read_to_string(&mut printed);
        printed
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = bench.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > LIMIT {
            let _ = bench.kill();
            let _ = bench.wait();
            panic!("bench-rollout {NODES} still running after {LIMIT:?}: hung");
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let printed = reader.join().unwrap();
    assert!(status.success(), "bench-rollout {NODES} failed ({status}):\n{printed}");
    let table = std::fs::read_to_string(out.join("rollout-cost.md")).expect("the table is written");
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with(&format!("| {NODES} |"))).collect();
    assert_eq!(rows.len(), 1, "one row for {NODES} nodes:\n{table}");
    let cells = rows[0].trim_matches('|').split('|').count();
    let columns = table.lines().next().unwrap().trim_matches('|').split('|').count();
    assert_eq!(cells, columns, "the row fills every column:\n{table}");
    let plot = std::fs::read_to_string(out.join("rollout-cost.svg")).expect("the plot is written");
    assert!(plot.contains("<svg") && plot.trim_end().ends_with("</svg>"), "a whole SVG plot: {plot:.200}");
    let _ = std::fs::remove_dir_all(&out);
}
