//! What the bench binaries read from the operator they measure: its CPU time and peak memory
//! (`/proc`), its own counters (`/metrics`), and the machine's load (other work skews wall time).

use std::time::Duration;

use crate::fixtures::{http_get, wait_for};
use crate::process::Component;
use crate::{ControlPlane, Identity};

/// The process's CPU seconds (user and system) and its peak resident memory in KiB.
pub fn proc_stat(pid: u32) -> (f64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    let cpu = (ticks(11) + ticks(12)) / 100.0; // utime + stime, USER_HZ = 100
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    (cpu, hwm)
}

/// A value from the operator's /metrics (first line starting with `name`).
pub fn metric(port: u16, name: &str) -> f64 {
    let m = http_get(port, "/metrics").unwrap_or_default();
    m.lines().find(|l| l.starts_with(name)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0.0)
}

/// The operator binary the benches run (`TESSERA_OPERATOR_BIN`, default the release build);
/// an error saying how to build it where it is missing.
pub fn operator_binary() -> std::io::Result<std::path::PathBuf> {
    let operator = std::path::PathBuf::from(
        std::env::var("TESSERA_OPERATOR_BIN").unwrap_or_else(|_| "target/release/tessera-operator".into()),
    );
    if !operator.exists() {
        let msg = format!("{} missing: run `cargo build --release -p tessera-operator`", operator.display());
        return Err(std::io::Error::new(std::io::ErrorKind::NotFound, msg));
    }
    Ok(operator)
}

/// Where the benches write their tables (`BENCH_OUT`, default `docs/bench`).
pub fn output_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(std::env::var("BENCH_OUT").unwrap_or_else(|_| "docs/bench".into()))
}

/// The machine's 1-minute load average.
pub fn load() -> f64 {
    std::fs::read_to_string("/proc/loadavg").ok().and_then(|l| l.split_whitespace().next()?.parse().ok()).unwrap_or(0.0)
}

/// Runs `operator run` (with `extra` arguments) as the operator identity, logging to the control
/// plane's log folder; returns it with its metrics port once `/readyz` answers (and two seconds
/// more). A component (killed when dropped, and when the bench dies), so a failed or killed run
/// leaves no operator behind.
pub async fn start_operator(
    cp: &ControlPlane,
    operator: &std::path::Path,
    extra: &[&str],
) -> Result<(Component, u16), crate::Error> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| crate::Error::io("port", e))?;
    let mut args = vec!["run".to_string(), "--listen".into(), format!("127.0.0.1:{port}")];
    args.extend(extra.iter().map(|a| a.to_string()));
    let env =
        [("KUBECONFIG", cp.kubeconfig(Identity::Operator).display().to_string()), ("RUST_LOG", "warn".to_string())];
    let op = Component::spawn_with_env("operator-bench", operator, &args, &env, &cp.dir.join("logs"))?;
    wait_for("operator ready", Duration::from_secs(120), || async {
        http_get(port, "/readyz").ok().filter(|r| r.starts_with("HTTP/1.1 200")).map(|_| ())
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok((op, port))
}
