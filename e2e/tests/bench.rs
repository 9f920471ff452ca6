//! `make bench` at a small size, so it cannot rot unnoticed: the rollout and quota benches run to
//! the end on the real control plane and write their tables (and the rollout's plot). Their
//! timings are not checked here (a timing on a shared machine says nothing); BENCHMARKS.md has
//! them from `make bench`. The quota bench fails by itself when a pass at rest writes.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A few dozen nodes: enough for several rollout waves at `maxUnavailable: 10%`.
const NODES: usize = 24;
/// Far longer than a run takes (about a minute); past it the bench is taken as hung.
const LIMIT: Duration = Duration::from_secs(900);

/// Runs bench `exe` with `args` into a fresh output folder; returns the folder once it exits 0.
fn run_bench(name: &str, exe: &str, args: &[String], env: &[(&str, &str)]) -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::env::temp_dir().join(format!("tessera-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let mut bench = Command::new(exe)
        .args(args)
        .current_dir(&workspace)
        .env("TESSERA_OPERATOR_BIN", tessera_e2e::fixtures::workspace_binary("tessera-operator"))
        .env("BENCH_OUT", &out)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("{name} starts: {e}"));
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
            panic!("{name} {args:?} still running after {LIMIT:?}: hung");
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let printed = reader.join().unwrap();
    assert!(status.success(), "{name} {args:?} failed ({status}):\n{printed}");
    out
}

/// The table's one row starting with `first` cells, every column filled.
fn one_full_row(table: &str, first: &str) -> Vec<String> {
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with(first)).collect();
    assert_eq!(rows.len(), 1, "one row {first}:\n{table}");
    let cells: Vec<String> = rows[0].trim_matches('|').split('|').map(|c| c.trim().to_string()).collect();
    let columns = table.lines().next().unwrap().trim_matches('|').split('|').count();
    assert_eq!(cells.len(), columns, "the row fills every column:\n{table}");
    cells
}

#[test]
fn the_rollout_bench_runs_to_completion_and_writes_its_table() {
    let out = run_bench("bench-rollout", env!("CARGO_BIN_EXE_bench-rollout"), &[NODES.to_string()], &[]);
    let table = std::fs::read_to_string(out.join("rollout-cost.md")).expect("the table is written");
    one_full_row(&table, &format!("| {NODES} |"));
    let plot = std::fs::read_to_string(out.join("rollout-cost.svg")).expect("the plot is written");
    assert!(plot.contains("<svg") && plot.trim_end().ends_with("</svg>"), "a whole SVG plot: {plot:.200}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn the_quota_bench_runs_to_completion_with_no_writes_at_rest() {
    let args = ["60".to_string(), "6".to_string()];
    // Two periodic passes at rest at least (every 5 s).
    let out = run_bench("bench-quota", env!("CARGO_BIN_EXE_bench-quota"), &args, &[("BENCH_REST_SECONDS", "12")]);
    let table = std::fs::read_to_string(out.join("quota-gates.md")).expect("the table is written");
    let cells = one_full_row(&table, "| 60 | 6 |");
    assert_eq!(cells[6], "0.00", "writes per pass at rest:\n{table}");
    for (i, what) in [(7, "an unclaimed namespace"), (8, "a namespace joining")] {
        let writes: f64 = cells[i].parse().unwrap();
        assert!(writes >= 1.0, "{what} is written for:\n{table}");
    }
    let _ = std::fs::remove_dir_all(&out);
}
