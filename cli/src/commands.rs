//! Subcommand definitions shared by `tessera-operator` and the kubectl plugin `kubectl-tessera`,
//! so both spell their flags alike and run the same code.

use clap::{Args, Subcommand};

use super::connect::ClusterArgs;
use super::{Format, Output, markdown, mig, preview};
use crate::Error;

/// `mig profiles|fit|layouts`.
#[derive(Subcommand, Debug)]
pub enum MigCommand {
    /// Print the profile table of a GPU product.
    Profiles {
        #[arg(long)]
        gpu: String,
    },
    /// Check whether PROFILE=COUNT... fits on one GPU (exit 0 fits, 1 does not, 2 usage error).
    Fit {
        #[arg(long)]
        gpu: String,
        #[arg(required = true, value_name = "PROFILE=COUNT")]
        profiles: Vec<String>,
    },
    /// List every maximal layout of a GPU product, optionally using only some profiles.
    Layouts {
        #[arg(long)]
        gpu: String,
        #[arg(long = "only", value_name = "PROFILE")]
        only: Vec<String>,
    },
}

impl MigCommand {
    pub fn run(&self, output: Output) -> Result<i32, Error> {
        match self {
            MigCommand::Profiles { gpu } => mig::profiles(gpu, output),
            MigCommand::Fit { gpu, profiles } => mig::fit(gpu, profiles, output),
            MigCommand::Layouts { gpu, only } => mig::layouts(gpu, only, output),
        }
    }
}

/// `plan preview` (`kubectl tessera preview`).
#[derive(Args, Debug)]
pub struct PreviewArgs {
    /// YAML files holding the GpuPartitionPlans to preview (other kinds are ignored).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<String>,
    /// Read Nodes, GpuNodes, Pods, the other plans, TenantGpuQuotas, PodDisruptionBudgets and
    /// DaemonSets and ResourceClaims from these files (e.g. `kubectl get ... -o yaml`) instead of
    /// the cluster.
    #[arg(long = "from", value_name = "FILE")]
    pub from: Vec<String>,
    #[command(flatten)]
    pub dra: DraArgs,
}

/// `--gpu-dra-drivers`, as the operator's `run` spells it: whose ResourceClaim allocations are
/// GPUs, so the commands count the pods holding them as GPU pods.
#[derive(Args, Debug, Clone)]
pub struct DraArgs {
    /// DRA drivers whose devices are GPUs: pods holding ResourceClaims allocated from them are
    /// GPU pods (comma-separated).
    #[arg(long = "gpu-dra-drivers", value_name = "DRIVER", value_delimiter = ',', default_value = tessera_planner::dra::NVIDIA_GPU_DRIVER)]
    pub gpu_dra_drivers: Vec<String>,
}

impl DraArgs {
    pub fn drivers(&self) -> tessera_planner::dra::GpuDrivers {
        tessera_planner::dra::GpuDrivers::new(&self.gpu_dra_drivers)
    }
}

impl PreviewArgs {
    /// Previews the plans and writes them in `format`: exit 1 when a plan is invalid.
    pub fn run(&self, cluster: &ClusterArgs, format: Format) -> Result<i32, Error> {
        let previews = runtime().block_on(preview::previews(&self.files, &self.from, &self.dra.drivers(), cluster))?;
        let Some(previews) = previews else { return Ok(1) };
        match format {
            Format::Json => println!("{}", serde_json::to_string_pretty(&previews)?),
            Format::Markdown => print!("{}", markdown::preview(&previews)),
            Format::Text => print!("{}", preview::text(&previews)),
        }
        Ok(0)
    }
}

/// A single-threaded runtime: the CLI makes a handful of requests.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime")
}
