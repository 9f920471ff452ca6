//! The operator crate's one error type.

/// Errors of the runtime (the CLI's are `tessera_cli::Error`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Usage(String),
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
    /// Every label `kind` can return, plus `kube` (failed watches and list calls outside a pass'
    /// error type): the metrics start each at zero, so dashboards and `rate()` see the series
    /// before the first error.
    pub const KINDS: [&'static str; 5] = ["api", "client", "usage", "partial", "kube"];

    /// A short, low-cardinality label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(_)) => "api",
            Error::Kube(_) | Error::NotLeader => "client",
            Error::Usage(_) => "usage",
            Error::PartialPass(_) => "partial",
        }
    }
}
