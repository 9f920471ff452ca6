//! `GpuNode`: one per Kubernetes node, named after it. The operator writes the intent (`spec`) and
//! the rollout bookkeeping (`status.rollout`); the node agent writes what the GPUs really hold
//! (`status.gpus`, `status.observedGeneration`, its conditions). Each uses its own field manager.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

pub use crate::catalog::GpuProfileInfo;
use crate::conditions::conditions_schema;

/// CEL rule shared by every profile-count map: names of the form `<G>g.<M>gb` with an optional
/// NVML suffix (`+me`, `+me.all`, `+gfx`, `-me`: [`crate::catalog::PROFILE_SUFFIXES`]), counts >= 0.
pub const PROFILE_MAP_RULE: &str =
    r"self.all(k, k.matches('^[0-9]+g\\.[0-9]+gb(\\+me|\\+me\\.all|\\+gfx|-me)?$') && self[k] >= 0)";
/// Bounds that keep the CEL rules within the API server's cost budget: no board has more than
/// nine profiles, and no node more than 16 GPUs.
pub const MAX_PROFILES_PER_GPU: usize = 12;
pub const MAX_GPUS_PER_NODE: usize = 16;

/// The MIG layout one node's GPUs should have.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "tessera.dev",
    version = "v1alpha1",
    kind = "GpuNode",
    status = "GpuNodeStatus",
    shortname = "gn",
    category = "tessera",
    printcolumn(name = "Plan", type_ = "string", json_path = ".spec.plan"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.rollout.phase"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Applied-Gen", type_ = "integer", json_path = ".status.observedGeneration", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct GpuNodeSpec {
    /// The plan this intent comes from (informational; the operator keeps it current).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// Desired state per GPU index. GPUs not listed are left as they are.
    #[serde(default)]
    #[schemars(extend("maxItems" = MAX_GPUS_PER_NODE))]
    pub gpus: Vec<GpuIntent>,
}

/// Desired state of one GPU.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct GpuIntent {
    #[x_kube(validation = kube::core::Rule::new("self >= 0").message("index must be >= 0"))]
    pub index: i32,
    pub mig_enabled: bool,
    #[serde(default)]
    #[x_kube(validation = kube::core::Rule::new(PROFILE_MAP_RULE).message("profile names must look like 3g.40gb, counts >= 0"))]
    #[schemars(extend("maxProperties" = MAX_PROFILES_PER_GPU))]
    pub profiles: BTreeMap<String, i32>,
}

impl GpuIntent {
    /// The instances asked for, per normalised profile name (counts of 0 left out).
    pub fn profile_counts(&self) -> BTreeMap<String, i32> {
        self.profiles.iter().filter(|(_, n)| **n > 0).map(|(p, n)| (crate::catalog::normalize_profile(p), *n)).collect()
    }
}

/// Observed state, written by the node agent (and `rollout` by the operator).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct GpuNodeStatus {
    /// The `metadata.generation` of the spec the agent last applied successfully.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuState>,
    #[serde(default)]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<NodeRollout>,
    /// Allocated versus used: each device's recent activity, from the node agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activity: Option<crate::activity::NodeActivity>,
}

/// Inventory and applied layout of one GPU.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct GpuState {
    pub index: i32,
    pub uuid: String,
    /// NVML product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub product: String,
    #[serde(default)]
    pub memory_mib: i64,
    #[serde(default)]
    pub mig_capable: bool,
    #[serde(default)]
    pub mig_enabled: bool,
    /// MIG mode after the next reset or reboot, when it differs from the current one.
    #[serde(default)]
    pub mig_pending: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<MigInstance>,
    /// The GPU-instance profile table as the driver reports it (NVML), so the operator can check
    /// layouts for boards missing from the built-in catalog.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 32))]
    pub profiles: Vec<GpuProfileInfo>,
}

impl GpuState {
    /// The instances reported, per normalised profile name.
    pub fn profile_counts(&self) -> BTreeMap<String, i32> {
        let mut have = BTreeMap::new();
        for i in &self.instances {
            *have.entry(crate::catalog::normalize_profile(&i.profile)).or_default() += 1;
        }
        have
    }

    /// Whether the reported GPU holds `want`: MIG mode as asked and, with MIG on, exactly the
    /// instances asked for. The one rule behind `kubectl tessera status`'s target and the
    /// rollout's "already in place".
    pub fn holds(&self, want: &GpuIntent) -> bool {
        self.mig_enabled == want.mig_enabled && (!want.mig_enabled || self.profile_counts() == want.profile_counts())
    }
}

/// One MIG device: a GPU instance and its full-size compute instance.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MigInstance {
    pub profile: String,
    pub start: i32,
    pub size: i32,
    /// The MIG device UUID (`MIG-...`) that the device plugin advertises.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default)]
    pub gpu_instance_id: i32,
    #[serde(default)]
    pub compute_instance_id: i32,
}

/// Where a node stands in its plan's rollout; written only by the operator.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum NodePhase {
    /// The node's layout matches its plan.
    #[default]
    Idle,
    /// Waiting for a rollout slot.
    Pending,
    /// Cordoned; evicting pods.
    Draining,
    /// Handed to the node agent; waiting for its report of the new generation. This phase is the
    /// hand-over: only while it holds may the agent destroy instances or change MIG mode.
    Applying,
    /// Applied; uncordoning (only if we cordoned it).
    Uncordoning,
    /// The change failed; the hand-over is withdrawn, the node uncordoned and the reason is in the
    /// message. It counts against `maxUnavailable` until the plan changes.
    Failed,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeRollout {
    pub phase: NodePhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// The plan generation this rollout works towards (a failed node is retried when it changes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_generation: Option<i64>,
    /// Whether Tessera cordoned the node: it uncordons only what it cordoned.
    #[serde(default)]
    pub cordoned_by_us: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_started_at: Option<Time>,
    /// When the node was handed to its agent (`Applying`), for `applyTimeoutSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apply_started_at: Option<Time>,
    /// When the agent's report of the new layout was seen on a node whose GPU DRA driver
    /// publishes ResourceSlices (`Uncordoning`): the cordon is held until the slices list the new
    /// devices, or for a bounded time after this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dra_wait_started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// Namespace of the node agents' heartbeat Leases, one per node, named after it (as the kubelet's
/// leases live in `kube-node-lease`): the agent renews it; the operator reads it.
pub const AGENT_LEASE_NAMESPACE: &str = "tessera-node-leases";

/// Annotation of an agent's heartbeat Lease: since when (RFC 3339) the agent has not kept its
/// `GpuNode.status.activity` current (sampling or writing keeps failing) though it is alive.
/// Set and removed by the agent's own Lease renewal (no extra request); the operator then sets
/// the node's activity summary aside as it does a dead agent's.
pub const ACTIVITY_FAILING_SINCE: &str = "tessera.dev/activity-failing-since";

/// Annotation of an agent's heartbeat Lease: until when (RFC 3339) its `GpuNode.status.activity`
/// is known current: the last pass of a run that seeded from the stored summary and left it
/// current; a run that has not (NVML not ready, killed before its first pass) copies the value it
/// found through, so `renewTime` alone never makes a report current. `unknown` when nothing is
/// known. Read by the next run to tell whether an idle stretch may span the restart.
pub const ACTIVITY_CURRENT_UNTIL: &str = "tessera.dev/activity-current-until";
