//! Subcommands usable in a GitOps pipeline. Each returns its exit status: 0 fine, 1 the input is
//! invalid or does not fit, 2 a usage error.

pub mod commands;
pub mod connect;
pub mod markdown;
pub mod mig;
pub mod preview;
pub mod snapshot;
pub mod status;
pub mod suggest;
pub mod validate;

use clap::ValueEnum;

use crate::Error;

/// `--output`: text for people, JSON for machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Output {
    #[default]
    Text,
    Json,
}

/// `--output` where a command also writes Markdown (`plan preview`, for pull-request comments).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Format {
    #[default]
    Text,
    Json,
    Markdown,
}

impl Format {
    /// The format for a command without Markdown output: `-o markdown` there is a usage error.
    pub fn plain(self, command: &str) -> Result<Output, Error> {
        match self {
            Format::Text => Ok(Output::Text),
            Format::Json => Ok(Output::Json),
            Format::Markdown => {
                Err(Error::Usage(format!("-o markdown is for `plan preview` only; `{command}` writes text or json")))
            }
        }
    }
}
