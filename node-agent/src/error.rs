//! The node agent's one error type.

/// Errors of the node agent. Backend errors mirror NVML's return codes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("in use: {0}")]
    InUse(String),
    #[error("insufficient resources: {0}")]
    InsufficientResources(String),
    #[error("not supported: {0}")]
    NotSupported(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("the NVML library lacks {0} (a driver older than this agent needs?)")]
    MissingSymbol(String),
    #[error("NVML: {0}")]
    Nvml(String),
    #[error("simulated fault after {0} operations")]
    InjectedFault(u64),
    #[error("state file {path}: {reason}")]
    State { path: String, reason: String },
    #[error(transparent)]
    Kube(#[from] kube::Error),
}
