//! The CLI crate's one error type.

/// Errors of a command: each ends the process with [`Error::exit_code`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    ReadFile { path: String, source: std::io::Error },
    #[error("unknown GPU product {product:?}; known products: {known}")]
    UnknownProduct { product: String, known: String },
    #[error("{0}")]
    Usage(String),
    #[error("cannot render output: {0}")]
    Render(#[from] serde_json::Error),
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

impl Error {
    /// Process exit status: 2 for usage errors (bad arguments, unknown names, unreadable files).
    pub fn exit_code(&self) -> i32 {
        2
    }
}
