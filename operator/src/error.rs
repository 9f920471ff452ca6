//! The operator crate's one error type.

/// Errors of the operator and its CLI.
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
    /// Some API calls of a pass failed (each already logged, counted and reported on its plan).
    #[error("{0} part(s) of the pass failed; the rest went on")]
    PartialPass(usize),
    /// The leader lease may have run out (no renewal seen): no write until one is (see `leader`).
    #[error("not written: the leader lease may have passed to another replica (no renewal seen)")]
    NotLeader,
}

impl Error {
    /// Process exit status: 2 for usage errors (bad arguments, unknown names, unreadable files).
    pub fn exit_code(&self) -> i32 {
        2
    }

    /// Every label `kind` can return, plus `kube` (failed watches and list calls outside a pass'
    /// error type): the metrics start each at zero, so dashboards and `rate()` see the series
    /// before the first error.
    pub const KINDS: [&'static str; 5] = ["api", "client", "usage", "partial", "kube"];

    /// A short, low-cardinality label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(_)) => "api",
            Error::Kube(_) | Error::NotLeader => "client",
            Error::ReadFile { .. } | Error::UnknownProduct { .. } | Error::Usage(_) | Error::Render(_) => "usage",
            Error::PartialPass(_) => "partial",
        }
    }
}
