//! Tessera's node agent: applies the MIG layout its node's `GpuNode` asks for, with the fewest
//! changes, and reports what the GPUs really hold.

pub mod activity;
pub mod agent;
pub mod backend;
pub mod error;
pub mod gpu_clients;
pub mod planner;
pub mod pods;
pub mod report;

/// Helpers for this crate's tests (unit and integration): temp dirs, the simulated NVML library.
#[doc(hidden)]
pub mod testutil;

pub use error::Error;
