//! `GpuPartitionPlan`: the desired MIG layouts for the nodes a selector matches, and how to roll
//! them out.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::conditions::conditions_schema;

pub use crate::gpunode::{MAX_GPUS_PER_NODE, MAX_PROFILES_PER_GPU, PROFILE_MAP_RULE};

const PROFILE_MAP_MESSAGE: &str =
    "profile names must look like 3g.40gb, 1g.10gb+me or 1g.24gb+gfx, and counts must be >= 0";

/// Desired MIG layouts for every node its `nodeSelector` matches, rolled out a few nodes at a time.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "tessera.dev",
    version = "v1alpha1",
    kind = "GpuPartitionPlan",
    status = "GpuPartitionPlanStatus",
    shortname = "gpp",
    shortname = "gpuplan",
    category = "tessera",
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Matched", type_ = "integer", json_path = ".status.matchedNodes"),
    printcolumn(name = "Updated", type_ = "integer", json_path = ".status.updatedNodes"),
    printcolumn(name = "In-Progress", type_ = "integer", json_path = ".status.inProgressNodes"),
    printcolumn(name = "Failed", type_ = "integer", json_path = ".status.failedNodes"),
    printcolumn(name = "Priority", type_ = "integer", json_path = ".spec.priority", priority = 1),
    printcolumn(name = "Paused", type_ = "boolean", json_path = ".spec.paused", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new(LAYOUTS_XOR_RULE).message(LAYOUTS_XOR_MESSAGE))]
pub struct GpuPartitionPlanSpec {
    /// Nodes this plan manages. An empty selector matches every node that has GPUs.
    #[serde(default)]
    pub node_selector: LabelSelector,
    /// When several plans match one node the highest priority owns it; equal priorities conflict
    /// and neither acts on that node.
    #[serde(default)]
    pub priority: i32,
    /// Stops nodes from starting a change; nodes already in flight finish.
    #[serde(default)]
    pub paused: bool,
    /// Layouts keyed by GPU product; optionally narrowed to some GPU indices on each node.
    /// Exactly one of `layouts` and `layoutsFrom` is set.
    #[serde(default)]
    #[schemars(extend("maxItems" = 32))]
    pub layouts: Vec<GpuLayout>,
    /// Automatic mode: the operator works out the layouts of this plan's GPUs from tenant quotas
    /// (changing as few GPUs as it can, never a node running GPU pods) and rolls them out with
    /// `rollout`. Exactly one of `layouts` and `layoutsFrom` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layouts_from: Option<LayoutsFrom>,
    #[serde(default)]
    pub rollout: RolloutPolicy,
}

/// One MIG layout for the GPUs of one product.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
// The API server refuses layouts that cannot fit the catalog product they name.
#[schemars(transform = crate::admission::add_layout_rules)]
pub struct GpuLayout {
    /// GPU product: a catalog name (`H100-80GB`), the NVML product name (`NVIDIA H100 80GB HBM3`) or
    /// the GPU Feature Discovery label value (`NVIDIA-H100-80GB-HBM3`). Case-insensitive.
    #[x_kube(validation = kube::core::Rule::new("size(self) > 0").message("gpuProduct must not be empty"))]
    #[schemars(extend("maxLength" = 128))]
    pub gpu_product: String,
    /// Whether MIG mode is on. `false` means whole GPUs, and `profiles` must be empty.
    #[serde(default = "default_true")]
    pub mig_enabled: bool,
    /// Instances per GPU: profile name -> count, e.g. `{3g.40gb: 1, 2g.20gb: 2}`.
    #[serde(default)]
    #[x_kube(validation = kube::core::Rule::new(PROFILE_MAP_RULE).message(PROFILE_MAP_MESSAGE))]
    #[schemars(extend("maxProperties" = MAX_PROFILES_PER_GPU))]
    pub profiles: BTreeMap<String, i32>,
    /// GPU indices on each node this layout applies to; absent means every GPU of the product.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self.all(i, i >= 0)").message("GPU indices must be >= 0"))]
    #[schemars(extend("maxItems" = MAX_GPUS_PER_NODE))]
    pub gpu_indices: Option<Vec<i32>>,
}

/// One of `layouts` and `layoutsFrom`, never both or neither.
pub const LAYOUTS_XOR_RULE: &str = "(has(self.layouts) && size(self.layouts) > 0) != has(self.layoutsFrom)";
const LAYOUTS_XOR_MESSAGE: &str =
    "set exactly one of spec.layouts (fixed layouts) and spec.layoutsFrom (layouts derived from quotas)";

/// Where an automatic plan takes its demand from.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct LayoutsFrom {
    /// The TenantGpuQuotas to satisfy (by label); empty selects every quota. Their `hard` limits
    /// are summed per resource. The other quotas' limits count too, without headroom: the supply
    /// they are guaranteed is not counted as this plan's.
    #[serde(default)]
    pub quota_selector: LabelSelector,
    /// Extra supply on top of the quotas, in percent of each resource (rounded up).
    #[serde(default)]
    #[x_kube(validation = kube::core::Rule::new("self >= 0 && self <= 1000").message("headroomPercent must be between 0 and 1000"))]
    pub headroom_percent: i32,
    /// How long a changed demand must hold still before the layouts are worked out again, so a
    /// burst of quota edits (a GitOps sync) causes one change, not several.
    #[serde(default = "default_stabilization")]
    #[x_kube(validation = kube::core::Rule::new("self >= 0").message("stabilizationSeconds must be >= 0"))]
    pub stabilization_seconds: i64,
}

fn default_stabilization() -> i64 {
    30
}

fn default_true() -> bool {
    true
}

/// Which pods a drain evicts.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DrainScope {
    /// Only pods that request `nvidia.com/gpu` or `nvidia.com/mig-*`; the rest keep running.
    #[default]
    GpuPods,
    /// Every pod kubectl drain would evict.
    AllPods,
}

/// How fast and how forcefully a plan rolls out.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RolloutPolicy {
    /// Nodes changed at once: an integer >= 1 or a percentage of matched nodes (`25%`, rounded
    /// down, at least 1).
    #[serde(default = "default_max_unavailable")]
    #[x_kube(validation = kube::core::Rule::new(
        r"type(self) == int ? self >= 1 : self.matches('^(100|[1-9][0-9]?)%$')"
    ).message("maxUnavailable must be an integer >= 1 or a percentage from 1% to 100%"))]
    pub max_unavailable: IntOrString,
    /// How long a drain may take before the node is reported `Stalled`.
    #[serde(default = "default_drain_timeout")]
    #[x_kube(validation = kube::core::Rule::new("self >= 0").message("drainTimeoutSeconds must be >= 0"))]
    pub drain_timeout_seconds: i64,
    #[serde(default)]
    pub drain_scope: DrainScope,
    /// After the drain timeout, delete the remaining pods (terminating ones included, with a zero
    /// grace period) instead of stalling. Off by default: a PodDisruptionBudget is never
    /// overridden unless asked for. Pods refused for lack of an opt-in below stay refused.
    #[serde(default)]
    pub force_after_timeout: bool,
    /// Evict pods that no controller will recreate (no controller owner, or a DaemonSet that no
    /// longer exists), like `kubectl drain --force`. Off by default: such pods are gone for good.
    #[serde(default)]
    pub evict_unmanaged_pods: bool,
    /// Evict pods with `emptyDir` volumes, whose data is lost, like `kubectl drain
    /// --delete-emptydir-data`. Off by default.
    #[serde(default)]
    pub delete_empty_dir_data: bool,
    /// How long the node agent may take to apply a drained node's layout before the plan is
    /// reported `Stalled` (`ApplyTimeout`). The node stays cordoned and the rollout resumes by
    /// itself once the agent reports success. 0 disables the timeout.
    #[serde(default = "default_apply_timeout")]
    #[x_kube(validation = kube::core::Rule::new("self >= 0").message("applyTimeoutSeconds must be >= 0"))]
    pub apply_timeout_seconds: i64,
}

fn default_max_unavailable() -> IntOrString {
    IntOrString::Int(1)
}

fn default_drain_timeout() -> i64 {
    600
}

fn default_apply_timeout() -> i64 {
    600
}

impl Default for RolloutPolicy {
    fn default() -> Self {
        Self {
            max_unavailable: default_max_unavailable(),
            drain_timeout_seconds: default_drain_timeout(),
            drain_scope: DrainScope::default(),
            force_after_timeout: false,
            evict_unmanaged_pods: false,
            delete_empty_dir_data: false,
            apply_timeout_seconds: default_apply_timeout(),
        }
    }
}

/// What the operator reports about a plan.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct GpuPartitionPlanStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default)]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    #[serde(default)]
    pub matched_nodes: i32,
    #[serde(default)]
    pub updated_nodes: i32,
    #[serde(default)]
    pub in_progress_nodes: i32,
    #[serde(default)]
    pub failed_nodes: i32,
    /// Nodes matched but not acted on, with the reason (conflict, no layout for the product...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub skipped_nodes: BTreeMap<String, String>,
    /// Free compute slices on this plan's GPUs that no profile the tenants' quotas ask for can
    /// use (stranded capacity); 0 when nothing is wasted.
    #[serde(default)]
    pub fragmented_slices: i32,
    /// Automatic mode: what the operator decided, for which demand, and why. Written by its own
    /// field manager, separately from the rest of the status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout_decision: Option<LayoutDecision>,
}

/// The layouts an automatic plan decided on. Only GPUs that change are listed; every other GPU
/// keeps what it has.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct LayoutDecision {
    /// The plan generation the decision was made for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// The demand it was worked out for, per resource: the selected quotas plus headroom, and
    /// the other quotas' limits.
    #[serde(default)]
    pub demand: BTreeMap<String, i64>,
    /// Fleet supply per resource when decided, and once the targets are applied.
    #[serde(default)]
    pub supply_before: BTreeMap<String, i64>,
    #[serde(default)]
    pub supply_after: BTreeMap<String, i64>,
    /// Demand no layout of this plan's idle GPUs can meet, per resource (empty when met).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shortfall: BTreeMap<String, i64>,
    #[serde(default)]
    pub changed_gpus: i32,
    #[serde(default)]
    pub destroyed_instances: i32,
    /// A digest of the plan's nodes and GPUs when decided: the decision is worked out again when
    /// they change.
    #[serde(default)]
    pub fleet: String,
    /// Nodes that must change, with the new state of each GPU that changes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<NodeTarget>,
    /// Nodes left alone because GPU pods run there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept_busy: Vec<String>,
    /// Nodes left out because their agent could not apply a layout this plan asked of them.
    /// Kept out (and carried from decision to decision) until the agent's report changes, the
    /// plan's generation changes, or the `GpuNode`'s `tessera.dev/retry` annotation changes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excluded: Vec<ExcludedNode>,
    #[serde(default)]
    pub message: String,
}

/// A node an automatic plan leaves out: its agent said it cannot apply what the plan asked.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ExcludedNode {
    pub node: String,
    /// The reason of the agent's `Stalled` condition (`LeakedMemory`, `InstanceInUse`...): the
    /// node stays out while the agent reports it.
    pub reason: String,
    /// What the agent said.
    #[serde(default)]
    pub message: String,
    /// The `GpuNode`'s `tessera.dev/retry` annotation when the node was left out: another value
    /// is an admin asking for the node to be tried again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<String>,
}

/// The new state of the GPUs of one node that an automatic plan changes.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeTarget {
    pub node: String,
    /// Same shape as `GpuNode.spec.gpus` (without its validation rules: a status is never
    /// validated by CEL, and rules in an unbounded list would exceed the API server's budget).
    pub gpus: Vec<GpuTarget>,
}

/// The new state of one GPU.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct GpuTarget {
    pub index: i32,
    pub mig_enabled: bool,
    #[serde(default)]
    pub profiles: BTreeMap<String, i32>,
}

impl From<&GpuTarget> for crate::gpunode::GpuIntent {
    fn from(t: &GpuTarget) -> Self {
        Self { index: t.index, mig_enabled: t.mig_enabled, profiles: t.profiles.clone() }
    }
}
