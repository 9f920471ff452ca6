//! `tessera-operator`: offline checks for GitOps pipelines (`validate`, `mig ...`).

use clap::{Parser, Subcommand};
use std::io::Write as _;
use tessera_cli::commands::{DraArgs, MigCommand, PreviewArgs, runtime};
use tessera_cli::connect::ClusterArgs;
use tessera_cli::{self as cli, Format};

#[derive(Parser)]
#[command(name = "tessera-operator", version, about = "Declarative MIG partitioning and GPU quotas for Kubernetes")]
struct Cli {
    /// Output format (`markdown`: `plan preview` only).
    #[arg(long, short = 'o', value_enum, default_value_t, global = true)]
    output: Format,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate YAML files (or the YAML files in directories) of GpuPartitionPlans and
    /// TenantGpuQuotas offline (exit 1 on any error).
    Validate {
        #[arg(required = true, value_name = "FILE|DIR")]
        files: Vec<String>,
    },
    /// Run the controllers (in a cluster, or with KUBECONFIG).
    Run {
        /// Address of /livez, /readyz and /metrics.
        #[arg(long, default_value = "0.0.0.0:8080")]
        listen: String,
        /// Elect a leader through a Lease so several replicas can run.
        #[arg(long)]
        leader_elect: bool,
        #[arg(long, env = "POD_NAMESPACE", default_value = "tessera-system")]
        lease_namespace: String,
        /// This replica's identity (the pod name).
        #[arg(long, env = "POD_NAME", default_value = "tessera-operator")]
        identity: String,
        /// DRA drivers whose devices are GPUs: pods holding ResourceClaims allocated from them
        /// are GPU pods (drained, counted, held to quota).
        #[arg(long, value_delimiter = ',', default_value = tessera_planner::dra::NVIDIA_GPU_DRIVER)]
        gpu_dra_drivers: Vec<String>,
        /// How quota admission is held: `params`, one ConfigMap for every tenant namespace (as
        /// shipped); or `gates`, a GpuQuotaGate per tenant namespace (docs/design/quota-gates.md,
        /// being built: install config/rbac/quota-gates.yaml with it).
        #[arg(long, env = "TESSERA_QUOTA_ADMISSION", default_value = "params", value_parser = ["params", "gates"])]
        quota_admission: String,
        /// Gates mode: the namespaces no TenantGpuQuota claims where GPU work is not limited,
        /// comma-separated names, each optionally ending in `*` (a prefix). Every other unclaimed
        /// namespace is closed to new GPU pods and claims, so a tenant that may make namespaces
        /// cannot make one outside its quota. `*` opens every unclaimed namespace.
        #[arg(long, env = "TESSERA_GPU_OPEN_NAMESPACES", default_value = tessera_planner::quota::gates::open::DEFAULT_OPEN,
              value_parser = tessera_planner::quota::gates::open::OpenNamespaces::parse)]
        gpu_open_namespaces: tessera_planner::quota::gates::open::OpenNamespaces,
    },
    /// Plans against the live cluster (KUBECONFIG), changing nothing.
    Plan {
        #[command(subcommand)]
        command: PlanCommand,
    },
    /// MIG geometry from the built-in catalog.
    Mig {
        #[command(subcommand)]
        command: MigCommand,
    },
}

#[derive(Subcommand)]
enum PlanCommand {
    /// Which nodes would change, which pods would be evicted, and MIG capacity before and after
    /// (`-o markdown`: as a pull-request comment).
    Preview {
        #[command(flatten)]
        args: PreviewArgs,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// The plans that make the fleet's MIG supply cover every tenant quota, changing as few GPUs
    /// as possible (exit 1 when the demand cannot be met; the closest answer is printed).
    Suggest {
        /// Read TenantGpuQuotas, GpuNodes, Nodes, plans, Pods and ResourceClaims from these files
        /// instead of the cluster.
        #[arg(long = "from", value_name = "FILE")]
        from: Vec<String>,
        /// Only GPUs of nodes with these labels may change (key=value,...).
        #[arg(long)]
        selector: Option<String>,
        /// Extra supply to aim for, in percent of the demand (rounded up).
        #[arg(long, default_value_t = 0)]
        headroom_percent: u32,
        /// Suggest what this automatic plan (spec.layoutsFrom) would decide now: its quotas,
        /// headroom and nodes, and the other quotas' guarantees.
        #[arg(long, value_name = "NAME", conflicts_with_all = ["selector", "headroom_percent"])]
        plan: Option<String>,
        #[command(flatten)]
        dra: DraArgs,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

fn main() {
    let args = Cli::parse();
    if let Command::Run {
        listen,
        leader_elect,
        lease_namespace,
        identity,
        gpu_dra_drivers,
        quota_admission,
        gpu_open_namespaces,
    } = args.command
    {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
            .init();
        // One thread: the operator waits on the API server almost all the time, and measured at
        // 5,000 nodes a fifth of its CPU went to two workers waking and stealing from each
        // other. A pass plans in tens of milliseconds; the solver runs on the blocking pool.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        let opts = tessera_operator::run::RunOptions {
            listen,
            leader_elect,
            lease_namespace,
            identity,
            gpu_drivers: tessera_planner::dra::GpuDrivers::new(gpu_dra_drivers),
            quota_admission: match quota_admission.as_str() {
                "gates" => tessera_operator::quota_controller::QuotaAdmission::Gates,
                _ => tessera_operator::quota_controller::QuotaAdmission::Params,
            },
            gpu_open_namespaces,
        };
        if let Err(e) = rt.block_on(tessera_operator::run::run(opts)) {
            let _ = writeln!(std::io::stderr(), "error: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    cli::die_on_closed_stdout();
    let output = args.output;
    let result = match args.command {
        Command::Run { .. } => unreachable!("handled above"),
        Command::Plan { command: PlanCommand::Preview { args, cluster } } => args.run(&cluster, output),
        Command::Plan { command: PlanCommand::Suggest { from, selector, headroom_percent, plan, dra, cluster } } => {
            output.plain("plan suggest").and_then(|output| {
                runtime().block_on(cli::suggest::run(
                    &from,
                    selector.as_deref(),
                    headroom_percent,
                    plan.as_deref(),
                    &cluster,
                    &dra.drivers(),
                    output,
                ))
            })
        }
        Command::Validate { files } => output.plain("validate").and_then(|output| cli::validate::run(&files, output)),
        Command::Mig { command } => output.plain("mig").and_then(|output| command.run(output)),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: {e}");
            std::process::exit(e.exit_code());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
