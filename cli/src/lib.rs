//! Tessera's one-shot commands, usable in a GitOps pipeline and as the kubectl plugin. They read
//! files or the cluster once and decide through `tessera-planner`; nothing here runs a controller.
//!
//! Subcommands usable in a GitOps pipeline. Each returns its exit status: 0 fine, 1 the input is
//! invalid or does not fit, 2 a usage error.

pub mod commands;
pub mod connect;
pub mod error;
pub mod idle;
pub mod markdown;
pub mod mig;
pub mod preview;
pub mod snapshot;
pub mod status;
pub mod suggest;
pub mod validate;

use clap::ValueEnum;

pub use error::Error;

/// Lets a closed stdout end the process as it ends `cat` and kubectl: killed by SIGPIPE, with
/// nothing on stderr. Rust ignores SIGPIPE, so after `cmd | head` closes the pipe a write fails
/// and `println!` panics (exit 101, a backtrace). For the short-lived commands only: the
/// controllers keep Rust's default, so a peer that goes away is an error they handle, never a kill.
pub fn die_on_closed_stdout() {
    #[cfg(unix)]
    // SAFETY: SIG_DFL is a valid disposition, and signal(2) has no other precondition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

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
