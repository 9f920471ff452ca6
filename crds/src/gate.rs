//! `GpuQuotaGate`: what the API server's admission policies read in one tenant namespace (the
//! namespace of the request), written by the operator only. `GpuClassList`: the DeviceClasses
//! proven off GPUs and Tessera's own, one small cluster-scoped object. Design:
//! `docs/design/quota-gates.md`.
//!
//! Typed fields, so the policies read lists, not strings split in CEL. Nothing here grows with
//! the number of namespaces; a gate's lists are bounded ([`MAX_BLOCKED`]).

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// The name of the gate in each tenant namespace, and the name the policies' bindings read.
pub const GATE_NAME: &str = "gpu";
/// The name of the one class list.
pub const CLASS_LIST_NAME: &str = "tessera";
/// The label on a Namespace saying how the operator has classified it. Only the operator may
/// set, change or remove it; a namespace without it is closed to new GPU work (unclassified).
/// - [`MARK_OPEN`]: no quota claims it and the operator's open list names it (the GPU
///   Operator's, kube-system): GPU work is not limited.
/// - [`MARK_CLOSED`]: no quota claims it and the open list does not name it (a namespace a
///   tenant made for itself): no new GPU pod or claim.
/// - [`MARK_JOINING`]: a quota claims it but its limits are not in force yet: no new GPU pod or
///   claim, and its gate decides which pods are bound and claims allocated (all of them wait
///   while the gate is missing).
/// - [`MARK_TENANT`]: its gate and ResourceQuota are in force.
pub const MARK: &str = "tessera.dev/gpu-gate";
pub const MARK_TENANT: &str = "tenant";
pub const MARK_JOINING: &str = "joining";
pub const MARK_OPEN: &str = "open";
pub const MARK_CLOSED: &str = "closed";
/// The longest `reason` a gate holds (its schema's bound).
pub const MAX_REASON: usize = 1024;
/// The most keys a gate lists in `over` (its schema's bound).
pub const MAX_OVER: usize = 128;
/// The finalizer on Tessera's ResourceQuotas: one being deleted (its quota deleted or renamed,
/// or by hand) stays in force until the namespace's new limits are.
pub const IN_FORCE_FINALIZER: &str = "tessera.dev/in-force";
/// The most pods (and claims) a gate names as blocked; past it, the gate blocks every binding
/// (allocation) of the namespace: a Binding carries no pod spec to tell GPU pods from others.
pub const MAX_BLOCKED: usize = 256;

/// One tenant namespace's admission state for GPU work.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[kube(
    group = "tessera.dev",
    version = "v1alpha1",
    kind = "GpuQuotaGate",
    namespaced,
    category = "tessera",
    printcolumn(name = "Quota", type_ = "string", json_path = ".spec.quota"),
    printcolumn(name = "State", type_ = "string", json_path = ".spec.state"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct GpuQuotaGateSpec {
    /// The TenantGpuQuota whose share this namespace holds.
    #[schemars(extend("maxLength" = 253))]
    pub quota: String,
    /// Whether GPU work is admitted here within the share (`Enforced`) or refused (`Closed`).
    pub state: GateState,
    /// Why, in words the refusals repeat (`Closed`), or what holds (`Enforced`).
    #[schemars(extend("maxLength" = 1024))]
    pub reason: String,
    /// Tessera's DeviceClasses claims may name here (the quota's resources on the claims path).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 128, "items" = {"type": "string", "maxLength": 253}))]
    pub classes: Vec<String>,
    /// The GPU extended resources the namespace's ResourceQuota limits; pods asking for any other
    /// GPU resource are refused (no ResourceQuota would count it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 128, "items" = {"type": "string", "maxLength": 253}))]
    pub limited: Vec<String>,
    /// ResourceQuota keys whose usage (the larger of the ResourceQuota's and Tessera's count) is
    /// past the share: new pods and claims asking for them are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 128, "items" = {"type": "string", "maxLength": 317}))]
    pub over: Vec<String>,
    /// Unbound GPU pods that may not be bound: made before the namespace's limits counted them,
    /// past the share.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 256, "items" = {"type": "string", "maxLength": 253}))]
    pub blocked_pods: Vec<String>,
    /// More pods are blocked than `blockedPods` holds: no pod of the namespace is bound.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub block_all_bindings: bool,
    /// Unallocated claims that may not be allocated, for the same reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 256, "items" = {"type": "string", "maxLength": 253}))]
    pub blocked_claims: Vec<String>,
    /// More claims are blocked than `blockedClaims` holds: no claim of the namespace is allocated.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub block_all_allocations: bool,
}

/// A gate's state.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GateState {
    /// GPU work is refused here (an invalid or conflicting quota, names taken): `reason` says why.
    #[default]
    Closed,
    /// GPU work is admitted within the share the namespace's ResourceQuota holds.
    Enforced,
}

/// The DeviceClasses the claim policies sort by: a class in neither list is closed in tenant
/// namespaces, so one created a moment ago is closed before any pass has seen it.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[kube(group = "tessera.dev", version = "v1alpha1", kind = "GpuClassList", category = "tessera")]
#[serde(rename_all = "camelCase")]
pub struct GpuClassListSpec {
    /// Classes proven not to reach GPU devices (pinned to a driver that is not a GPU driver).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 1024, "items" = {"type": "string", "maxLength": 253}))]
    pub open: Vec<String>,
    /// Tessera's own per-profile classes (which of them a namespace may use, its gate says).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 128, "items" = {"type": "string", "maxLength": 253}))]
    pub tessera: Vec<String>,
}
