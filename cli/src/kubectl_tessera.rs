//! `kubectl-tessera`, the kubectl plugin: `kubectl tessera status` shows the fleet, `idle` the
//! slices pods hold and do not use; `preview`,
//! `validate` and `mig` are `tessera-operator`'s commands of those names. Connects like kubectl
//! (`--kubeconfig`, `--context`, `KUBECONFIG`, the current context).

use clap::{Parser, Subcommand};
use std::io::Write as _;
use tessera_cli::commands::{DraArgs, MigCommand, PreviewArgs, runtime};
use tessera_cli::connect::ClusterArgs;
use tessera_cli::status::Colour;
use tessera_cli::{self as cli, Format};

#[derive(Parser)]
#[command(
    name = "kubectl tessera",
    bin_name = "kubectl tessera",
    version,
    about = "Tessera's MIG fleet from kubectl: status, plan previews, offline checks"
)]
struct Cli {
    /// Output format (`markdown`: `preview` only).
    #[arg(long, short = 'o', value_enum, default_value_t, global = true)]
    output: Format,
    /// Colour the text output: auto (when stdout is a terminal and NO_COLOR is unset), always, never.
    #[arg(long = "color", value_enum, default_value_t, global = true)]
    colour: Colour,
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Every GPU node: rollout phase, MIG slot diagram, busy instances and the tenants holding
    /// them (exit 1 when part of the fleet could not be read; what could is still shown).
    Status {
        /// Read GpuNodes, plans, quotas, pods, ResourceClaims and ResourceSlices from these files
        /// instead of the cluster.
        #[arg(long = "from", value_name = "FILE")]
        from: Vec<String>,
        #[command(flatten)]
        dra: DraArgs,
    },
    /// GPU slices pods hold that sat idle beyond their tenant's `idleAfter` (TenantGpuQuota),
    /// with the memory they hold and since when; and memory on slices no pod holds. Reports;
    /// evicts nothing (exit 1 when part of the fleet could not be read).
    Idle {
        /// Read GpuNodes, quotas, pods, ResourceClaims and ResourceSlices from these files
        /// instead of the cluster.
        #[arg(long = "from", value_name = "FILE")]
        from: Vec<String>,
        #[arg(long, value_enum, default_value_t)]
        sort: cli::idle::SortBy,
        #[command(flatten)]
        dra: DraArgs,
    },
    /// What applying plans would change, against the cluster (`-o markdown` for a pull request).
    Preview(PreviewArgs),
    /// Validate YAML files (or the YAML files in directories) of GpuPartitionPlans and
    /// TenantGpuQuotas offline (exit 1 on any error).
    Validate {
        #[arg(required = true, value_name = "FILE|DIR")]
        files: Vec<String>,
    },
    /// MIG geometry from the built-in catalog.
    Mig {
        #[command(subcommand)]
        command: MigCommand,
    },
}

fn main() {
    let args = Cli::parse();
    // `status` writes its report in one piece and handles a closed pipe itself: it still exits 1
    // when part of the fleet was unreadable (and says which part).
    if !matches!(args.command, Command::Status { .. } | Command::Idle { .. }) {
        cli::die_on_closed_stdout();
    }
    let output = args.output;
    let result = match args.command {
        Command::Status { from, dra } => output.plain("status").and_then(|output| {
            runtime().block_on(cli::status::run(&args.cluster, &from, &dra.drivers(), output, args.colour.enabled()))
        }),
        Command::Idle { from, sort, dra } => output
            .plain("idle")
            .and_then(|output| runtime().block_on(cli::idle::run(&args.cluster, &from, &dra.drivers(), output, sort))),
        Command::Preview(preview) => preview.run(&args.cluster, output),
        Command::Validate { files } => output.plain("validate").and_then(|output| cli::validate::run(&files, output)),
        Command::Mig { command } => output.plain("mig").and_then(|output| command.run(output)),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: {e}"); // a closed stderr is no reason to panic
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
