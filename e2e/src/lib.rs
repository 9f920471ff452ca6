//! End-to-end harness: a real control plane on loopback (see `ControlPlane`) and fixtures that
//! install Tessera's CRDs and create fake GPU nodes managed by kwok.

pub mod bench;
pub mod controlplane;
pub mod dra;
pub mod fixtures;
pub mod identity;
mod pki;
pub mod plot;
pub mod process;
pub mod render;

pub use controlplane::ControlPlane;
pub use identity::Identity;

use std::path::PathBuf;

/// `println!` for the harness's binaries: a reader that went away (`bench-fleet | head -3`) ends
/// nothing, where `println!` would panic. The run goes on: its files are still written and its
/// control plane is still stopped, not left running by a panic or a SIGPIPE.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::write_line(format_args!($($arg)*))
    };
}

/// `eprintln!` that never panics: a closed stderr (`bench 2>&1 | head`) loses the line, nothing more.
#[macro_export]
macro_rules! tell {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// One line to stdout; a closed pipe is not an error (see [`say!`]), any other failure is told
/// on stderr.
pub fn write_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(line).and_then(|()| out.write_all(b"\n"))
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        let _ = writeln!(std::io::stderr(), "cannot write to stdout: {e}");
    }
}

/// Errors of the harness.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("generating certificates: {0}")]
    Pki(String),
    #[error("building the control plane: {0}")]
    Build(String),
    #[error("{name} exited ({status}); see {}", log.display())]
    ComponentExited { name: String, status: String, log: PathBuf },
    #[error("timed out: {0}")]
    Timeout(String),
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("YAML: {0}")]
    Yaml(#[from] serde_saphyr::Error),
}

impl Error {
    pub(crate) fn io(what: &str, source: std::io::Error) -> Self {
        Error::Io { what: what.to_string(), source }
    }
}
