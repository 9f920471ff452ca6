//! Starts the end-to-end control plane and keeps it up until Ctrl-C, printing the admin
//! kubeconfig: for poking at the harness by hand.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut cp = tessera_e2e::ControlPlane::start().await?;
    cp.keep_logs();
    println!("admin kubeconfig: {}", cp.kubeconfig(tessera_e2e::Identity::Admin).display());
    let pids: Vec<String> = cp.pids().iter().map(ToString::to_string).collect();
    println!("pids: {}", pids.join(" "));
    tokio::signal::ctrl_c().await?;
    Ok(())
}
