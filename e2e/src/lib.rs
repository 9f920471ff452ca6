//! End-to-end harness: a real control plane on loopback (see `ControlPlane`) and fixtures that
//! install Tessera's CRDs and create fake GPU nodes managed by kwok.

pub mod controlplane;
pub mod fixtures;
pub mod identity;
mod pki;
pub mod plot;
pub mod process;
pub mod render;

pub use controlplane::ControlPlane;
pub use identity::Identity;

use std::path::PathBuf;

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
