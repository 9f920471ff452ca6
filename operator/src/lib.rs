//! The Tessera operator: offline CLI checks, and the controllers that roll out
//! `GpuPartitionPlan`s (observe -> pure plan -> act).

pub mod cli;
pub mod drain;
pub mod error;
pub mod rollout;
pub mod selector;
pub mod status;

pub use error::Error;
