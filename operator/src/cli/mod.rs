//! Subcommands usable in a GitOps pipeline. Each returns its exit status: 0 fine, 1 the input is
//! invalid or does not fit, 2 a usage error.

pub mod mig;
pub mod preview;
pub mod suggest;
pub mod validate;

use clap::ValueEnum;

/// `--output`: text for people, JSON for machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Output {
    #[default]
    Text,
    Json,
}
