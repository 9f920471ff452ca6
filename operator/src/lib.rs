//! The Tessera operator: offline CLI checks now; the rollout and quota controllers build on them.

pub mod cli;
pub mod error;

pub use error::Error;
