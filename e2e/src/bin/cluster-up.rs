//! Starts the end-to-end control plane and keeps it up until SIGINT or SIGTERM, printing where
//! its kubeconfigs are: the demo (`make demo`) and poking at the harness by hand use it.

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut cp = tessera_e2e::ControlPlane::start().await?;
    cp.keep_logs();
    tessera_e2e::say!("admin kubeconfig: {}", cp.kubeconfig(tessera_e2e::Identity::Admin).display());
    tessera_e2e::say!("dir: {}", cp.dir.display());
    let pids: Vec<String> = cp.pids().iter().map(ToString::to_string).collect();
    tessera_e2e::say!("pids: {}", pids.join(" "));
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(())
}
