//! Tessera's API (`tessera.dev/v1alpha1`), MIG geometry catalog, layout solver and offline
//! validation. Pure: no I/O, so the operator, the node agent and the CLI share one source of truth.

// kube's `#[kube(printcolumn(type_ = ..), printcolumn(type_ = ..))]` repeats argument names on
// purpose; clippy reads them as duplicated attributes.
#![allow(clippy::duplicated_attributes)]

pub mod activity;
pub mod admission;
pub mod catalog;
pub mod conditions;
pub mod crdgen;
pub mod gate;
pub mod gpunode;
pub mod plan;
pub mod quota;
pub mod solver;
pub mod validate;

pub use gpunode::{GpuNode, GpuNodeSpec, GpuNodeStatus};
pub use plan::{GpuPartitionPlan, GpuPartitionPlanSpec, GpuPartitionPlanStatus};
pub use quota::{TenantGpuQuota, TenantGpuQuotaSpec, TenantGpuQuotaStatus};

/// The API group of every Tessera kind.
pub const GROUP: &str = "tessera.dev";
/// The served and stored version.
pub const VERSION: &str = "v1alpha1";
