//! Tessera's runtime: the caches and watches, the controllers' passes (observe, call the planner,
//! act), every write to the API server, leader election, metrics and the health server. What to
//! do is decided in `tessera-planner`; this crate observes the cluster into the planner's inputs
//! and carries out what it returns.

pub mod alert_metrics;
pub mod controller;
pub mod error;
pub mod expectations;
pub mod leader;
pub mod metrics;
pub mod quota_controller;
pub mod run;
pub mod server;
pub mod wake;

pub use error::Error;
