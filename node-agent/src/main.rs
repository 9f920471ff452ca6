//! `node-agent`: run the agent, probe the GPUs read-only, or drive simulated GPUs.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use tessera_node_agent::agent::Agent;
use tessera_node_agent::backend::nvml::NvmlBackend;
use tessera_node_agent::backend::sim::{self, Fault, SimBackend};
use tessera_node_agent::backend::{GpuBackend, catalog_differences};

#[derive(Parser)]
#[command(name = "node-agent", version, about = "Tessera node agent: applies MIG layouts and reports GPU state")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum BackendKind {
    Nvml,
    Sim,
}

#[derive(clap::Args)]
struct BackendArgs {
    #[arg(long, value_enum, default_value = "nvml", env = "TESSERA_BACKEND")]
    backend: BackendKind,
    /// NVML: the library to load (default: the system's libnvidia-ml.so). The simulated one is
    /// built by `cargo build -p tessera-nvml-sim`.
    #[arg(long, env = "TESSERA_NVML_LIBRARY")]
    nvml_library: Option<PathBuf>,
    /// Simulated GPUs: state file (created on first use).
    #[arg(long, env = "TESSERA_SIM_STATE", default_value = "/var/lib/tessera/sim-gpus.json")]
    sim_state: PathBuf,
    /// Simulated GPUs: products, comma-separated (used when the state file is new); a
    /// `:passthrough` suffix makes a GPU passed through to a VM (Ampere MIG mode changes then
    /// wait for a reset).
    #[arg(long, env = "TESSERA_SIM_GPUS", value_delimiter = ',', default_value = "H100-80GB")]
    sim_gpus: Vec<String>,
    /// Simulated GPUs: latency of every driver operation, in milliseconds.
    #[arg(long, env = "TESSERA_SIM_LATENCY_MS", default_value_t = 0)]
    sim_latency_ms: u64,
    /// Simulated GPUs: fail every operation after the k-th.
    #[arg(long, env = "TESSERA_SIM_FAIL_AFTER")]
    sim_fail_after: Option<u64>,
    /// Simulated GPUs: abort the process right after the k-th operation.
    #[arg(long, env = "TESSERA_SIM_CRASH_AFTER")]
    sim_crash_after: Option<u64>,
}

impl BackendArgs {
    fn open(&self) -> anyhow::Result<Box<dyn GpuBackend>> {
        Ok(match self.backend {
            BackendKind::Nvml => Box::new(NvmlBackend::init(self.nvml_library.as_deref())?),
            BackendKind::Sim => {
                let fault = match (self.sim_fail_after, self.sim_crash_after) {
                    (Some(k), _) => Some(Fault::FailAfter(k)),
                    (None, Some(k)) => Some(Fault::CrashAfter(k)),
                    _ => None,
                };
                Box::new(
                    SimBackend::open(&self.sim_state, &self.sim_gpus)?
                        .with_latency(Duration::from_millis(self.sim_latency_ms))
                        .with_fault(fault),
                )
            }
        })
    }
}

#[derive(Subcommand)]
enum Command {
    /// Reconcile this node's GpuNode until stopped.
    Run {
        /// This node's name (from the downward API).
        #[arg(long, env = "NODE_NAME")]
        node_name: String,
        #[command(flatten)]
        backend: BackendArgs,
        #[arg(long, default_value_t = 30)]
        resync_seconds: u64,
        /// Advertise nvidia.com/mig-* on the Node like the device plugin (default: with --backend sim).
        #[arg(long)]
        advertise_resources: Option<bool>,
        /// Label selector of GPU client pods on this node to restart after a change.
        #[arg(long, env = "TESSERA_GPU_CLIENT_SELECTOR")]
        gpu_client_selector: Option<String>,
        /// Label selector of NVIDIA's DRA kubelet plugin pods on this node, restarted with the GPU
        /// clients so its ResourceSlices list the new MIG devices. Empty: none.
        #[arg(long, env = "TESSERA_DRA_PLUGIN_SELECTOR",
              default_value = tessera_node_agent::gpu_clients::DRA_KUBELET_PLUGIN_SELECTOR)]
        dra_plugin_selector: String,
        /// Validity of the heartbeat lease the operator watches; renewed four times per period.
        #[arg(long, default_value_t = 40)]
        lease_duration_seconds: u64,
        /// Where to serve the devices' activity as Prometheus metrics (`/metrics`); empty: not
        /// served. A port already taken is logged and the agent runs on without it.
        #[arg(long, env = "TESSERA_METRICS_ADDR", default_value = "0.0.0.0:9402")]
        metrics_addr: String,
        /// How often each MIG device's (or whole GPU's) activity is sampled.
        #[arg(long, default_value_t = 30)]
        activity_sample_seconds: u64,
        /// At most one write of GpuNode.status.activity per this many seconds (and only on a
        /// meaningful change).
        #[arg(long, default_value_t = 300)]
        activity_write_interval_seconds: u64,
    },
    /// Read-only: print the inventory and the NVML profile/placement table, and any difference
    /// from the built-in catalog.
    Probe {
        #[command(flatten)]
        backend: BackendArgs,
        #[arg(long)]
        json: bool,
    },
    /// Drive simulated GPUs (tests and the demo).
    Sim {
        #[command(subcommand)]
        command: SimCommand,
    },
}

#[derive(Subcommand)]
enum SimCommand {
    /// Start a simulated process on a MIG device (or a whole GPU).
    RunProcess {
        #[arg(long)]
        state: PathBuf,
        #[arg(long)]
        gpu: u32,
        #[arg(long)]
        mig_uuid: Option<String>,
        #[arg(long)]
        pid: u32,
        #[arg(long, default_value = "python")]
        name: String,
        /// Device memory it holds, in MiB.
        #[arg(long)]
        used_mib: Option<u64>,
    },
    /// Stop a simulated process.
    StopProcess {
        #[arg(long)]
        state: PathBuf,
        #[arg(long)]
        pid: u32,
    },
    /// Simulate a node reboot: instances are lost, pending MIG modes apply.
    Reboot {
        #[arg(long)]
        state: PathBuf,
    },
    /// Simulate a driver restart: a reboot's effect on the GPUs, and NVML sessions of the
    /// simulated library opened before it see their GPUs lost.
    DriverRestart {
        #[arg(long)]
        state: PathBuf,
    },
    /// A client starts (or with --release stops) holding a GPU's device open without a compute
    /// process: a MIG mode change then reports IN_USE.
    HoldDevice {
        #[arg(long)]
        state: PathBuf,
        #[arg(long)]
        gpu: u32,
        #[arg(long)]
        name: String,
        #[arg(long)]
        release: bool,
    },
    /// Memory held in a MIG device by a context with no process (a zombie).
    LeakMemory {
        #[arg(long)]
        state: PathBuf,
        #[arg(long)]
        gpu: u32,
        #[arg(long)]
        mig_uuid: String,
        #[arg(long)]
        mib: u64,
    },
    /// The SM activity GPM reports for a MIG device (or, without --mig-uuid, a whole GPU with MIG
    /// off), percent.
    SetActivity {
        #[arg(long)]
        state: PathBuf,
        #[arg(long)]
        gpu: u32,
        #[arg(long)]
        mig_uuid: Option<String>,
        #[arg(long)]
        percent: f64,
    },
    /// Make the simulated NVML library fail (or abort in) the n-th call of the functions whose
    /// name starts with a prefix.
    FailCall {
        #[arg(long)]
        state: PathBuf,
        /// Function name prefix, e.g. nvmlGpuInstanceCreateComputeInstance (empty: every call).
        #[arg(long, default_value = "")]
        function: String,
        /// Which matching call, counted from now (1 = the next one).
        #[arg(long, default_value_t = 1)]
        nth: u64,
        /// The NVML return code, e.g. 999 (UNKNOWN), 19 (IN_USE).
        #[arg(long, default_value_t = 999)]
        code: u32,
        /// Abort the calling process instead (a kill between two driver calls).
        #[arg(long)]
        crash: bool,
    },
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let command = Cli::parse().command;
    if !matches!(command, Command::Run { .. }) {
        die_on_closed_stdout();
    }
    match command {
        Command::Run {
            node_name,
            backend,
            resync_seconds,
            advertise_resources,
            gpu_client_selector,
            dra_plugin_selector,
            lease_duration_seconds,
            activity_sample_seconds,
            activity_write_interval_seconds,
            metrics_addr,
        } => {
            let advertise = advertise_resources.unwrap_or(backend.backend == BackendKind::Sim);
            let backend = backend.open()?;
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
            rt.block_on(async move {
                let client = kube::Client::try_default().await.context("connecting to the API server")?;
                let agent = Agent {
                    backend,
                    client,
                    node: node_name,
                    advertise_resources: advertise,
                    gpu_client_selector,
                    dra_plugin_selector: Some(dra_plugin_selector),
                    lease_duration: Duration::from_secs(lease_duration_seconds.max(4)),
                    activity: tessera_node_agent::activity::writer::Writer {
                        sample_interval: Duration::from_secs(activity_sample_seconds.max(1)),
                        write_interval: k8s_openapi::jiff::SignedDuration::from_secs(
                            activity_write_interval_seconds as i64,
                        ),
                        ..Default::default()
                    },
                };
                if !metrics_addr.is_empty() {
                    match tokio::net::TcpListener::bind(&metrics_addr).await {
                        Ok(l) => {
                            let text = agent.activity.metrics.clone();
                            tokio::spawn(tessera_node_agent::activity::metrics::serve(l, text));
                        }
                        Err(e) => tracing::warn!(%metrics_addr, error = %e, "cannot serve /metrics; running without"),
                    }
                }
                tokio::select! {
                    r = agent.run(Duration::from_secs(resync_seconds)) => r.map_err(anyhow::Error::from),
                    _ = tokio::signal::ctrl_c() => Ok(()),
                }
            })
        }
        Command::Probe { backend, json } => probe(backend.open()?, json),
        Command::Sim { command } => {
            match command {
                SimCommand::RunProcess { state, gpu, mig_uuid, pid, name, used_mib } => {
                    sim::run_process(&state, gpu, mig_uuid.as_deref(), pid, &name, used_mib)?
                }
                SimCommand::DriverRestart { state } => sim::driver_restart(&state)?,
                SimCommand::HoldDevice { state, gpu, name, release } => sim::hold_device(&state, gpu, &name, !release)?,
                SimCommand::LeakMemory { state, gpu, mig_uuid, mib } => sim::leak_memory(&state, gpu, &mig_uuid, mib)?,
                SimCommand::SetActivity { state, gpu, mig_uuid, percent } => {
                    sim::set_activity(&state, gpu, mig_uuid.as_deref(), percent)?
                }
                SimCommand::FailCall { state, function, nth, code, crash } => {
                    sim::add_call_fault(&state, sim::CallFault { function, nth, code, crash, seen: 0 })?
                }
                SimCommand::StopProcess { state, pid } => sim::stop_process(&state, pid)?,
                SimCommand::Reboot { state } => sim::reboot(&state)?,
            }
            Ok(())
        }
    }
}

/// `node-agent probe | head` ends as `cat` does, killed by SIGPIPE, not with a panic on the
/// failed write (Rust ignores SIGPIPE). Not for `run`: the agent keeps Rust's default.
fn die_on_closed_stdout() {
    // SAFETY: SIG_DFL is a valid disposition, and signal(2) has no other precondition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn probe(mut backend: Box<dyn GpuBackend>, json: bool) -> anyhow::Result<()> {
    let mut report = Vec::new();
    for gpu in backend.inventory()? {
        let profiles = if gpu.mig_capable { backend.profiles(gpu.index)? } else { vec![] };
        let instances = if gpu.mig_enabled { backend.instances(gpu.index)? } else { vec![] };
        let diffs = catalog_differences(&gpu.product, &profiles);
        if !json {
            println!(
                "GPU {} {} ({}), {} MiB, MIG capable {}, enabled {}, pending {:?}",
                gpu.index, gpu.product, gpu.uuid, gpu.memory_mib, gpu.mig_capable, gpu.mig_enabled, gpu.mig_pending
            );
            for p in &profiles {
                println!(
                    "  {:<12} id {:>2}  compute {}  memory slices {}  max {}  starts {:?}  {} MiB",
                    p.name, p.id, p.compute_slices, p.memory_slices, p.max_count, p.starts, p.memory_mib
                );
            }
            for i in &instances {
                println!("  instance {} at {}:{} gi {} {}", i.profile, i.start, i.size, i.gpu_instance_id, i.uuid);
            }
            if diffs.is_empty() {
                println!("  catalog: matches");
            }
            for d in &diffs {
                println!("  catalog difference: {d}");
            }
        }
        report.push(
            serde_json::json!({"gpu": gpu, "profiles": profiles, "instances": instances, "catalogDifferences": diffs}),
        );
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_restarts_nvidias_dra_kubelet_plugin_by_default_and_can_be_told_not_to() {
        let selector = |args: &[&str]| match Cli::try_parse_from(args).unwrap().command {
            Command::Run { dra_plugin_selector, .. } => dra_plugin_selector,
            _ => unreachable!(),
        };
        let run = ["node-agent", "run", "--node-name", "n1"];
        assert_eq!(selector(&run), "nvidia-dra-driver-gpu-component=kubelet-plugin");
        assert_eq!(selector(&[&run[..], &["--dra-plugin-selector", ""]].concat()), "");
    }
}
