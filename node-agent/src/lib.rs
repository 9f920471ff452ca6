//! Tessera's node agent: applies the MIG layout its node's `GpuNode` asks for, with the fewest
//! changes, and reports what the GPUs really hold.

pub mod agent;
pub mod backend;
pub mod error;
pub mod planner;
pub mod report;

#[cfg(test)]
mod testutil;

pub use error::Error;
