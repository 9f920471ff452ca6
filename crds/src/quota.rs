//! `TenantGpuQuota`: a tenant's GPU and MIG limits over its namespaces, enforced by materialising
//! native `ResourceQuota` objects, so the API server's own admission does the counting.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::conditions::conditions_schema;

const RESOURCE_MAP_RULE: &str = r"self.all(k, (k == 'nvidia.com/gpu' || k.matches('^nvidia\\.com/mig-[0-9]+g\\.[0-9]+gb(\\.me|\\.me\\.all|\\.gfx|-me)?$')) && self[k] >= 0)";
const RESOURCE_MAP_MESSAGE: &str =
    "keys must be nvidia.com/gpu or nvidia.com/mig-<profile> (e.g. nvidia.com/mig-1g.10gb), values >= 0";

/// GPU and MIG limits for one tenant over one or more namespaces.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "tessera.dev",
    version = "v1alpha1",
    kind = "TenantGpuQuota",
    status = "TenantGpuQuotaStatus",
    shortname = "tgq",
    category = "tessera",
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(
        name = "Capacity",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"CapacityAvailable\")].status"
    ),
    printcolumn(name = "Namespaces", type_ = "string", json_path = ".spec.namespaces", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new(NAMESPACES_RULE).message(NAMESPACES_MESSAGE))]
pub struct TenantGpuQuotaSpec {
    /// The tenant's namespaces by name. A namespace may belong to one quota only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 4096, "items" = {"type": "string", "maxLength": 63}))]
    pub namespaces: Vec<String>,
    /// The tenant's namespaces by label, besides those named: every namespace whose labels
    /// match, followed as namespaces come, go and are relabelled. A namespace matched by two
    /// quotas is a Conflict on both. Select by a label tenants cannot set on namespaces (one
    /// their platform sets, e.g. Capsule's or a vCluster host's): whoever can label a namespace
    /// can move it into the quota. Not with `split: Explicit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    /// Hard limits for the whole tenant: `nvidia.com/gpu` and `nvidia.com/mig-<profile>` counts.
    #[x_kube(validation = kube::core::Rule::new(RESOURCE_MAP_RULE).message(RESOURCE_MAP_MESSAGE))]
    #[schemars(extend("maxProperties" = 64))]
    pub hard: BTreeMap<String, i64>,
    /// How `hard` is divided among the namespaces.
    #[serde(default)]
    pub split: SplitPolicy,
    /// With `split: Explicit`, each namespace's share; the shares of a resource may not add up to
    /// more than `hard`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub namespace_hard: BTreeMap<String, BTreeMap<String, i64>>,
    /// Optional limits in physical units over all profiles, checked and reported by the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physical: Option<PhysicalLimits>,
    /// GPU resources `hard` does not list: `Unlimited` (Kubernetes' own rule for a ResourceQuota)
    /// or `Zero` (each namespace's ResourceQuota holds 0 of them, so a tenant gets only what
    /// `hard` grants).
    #[serde(default, skip_serializing_if = "UnlistedPolicy::is_unlimited")]
    pub unlisted: UnlistedPolicy,
    /// Which path the limits apply to. A ResourceQuota cannot add two keys up, so a quota picks
    /// one: the device plugin's extended resources (claims for GPUs refused in its namespaces),
    /// or DRA ResourceClaims of Tessera's DeviceClasses (extended resources held at 0).
    #[serde(default, skip_serializing_if = "AllocationPath::is_extended_resources")]
    pub allocation: AllocationPath,
    /// How long a device the tenant holds must stay idle before Tessera reports it idle
    /// (`30m`, `1h`, `2h30m`, `1d`); 1h when absent. Per tenant: notebooks idle between cells,
    /// batch jobs should not idle at all. Tessera reports; it evicts nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxLength" = 32, "pattern" = "^([0-9]+[smhd])+$"))]
    pub idle_after: Option<String>,
}

/// The longest `idleAfter`: a month; a longer wait reports nothing useful.
pub const MAX_IDLE_AFTER_SECS: u64 = 30 * 24 * 3600;

/// Parses an `idleAfter` duration: one or more `<whole number><unit>`, unit `s`, `m`, `h` or
/// `d` (`90s`, `1h30m`); more than 0 and at most 30 days.
pub fn parse_idle_after(s: &str) -> Result<u64, String> {
    let bad = || format!("{s:?} is not a duration like 30m, 1h or 1h30m (units s, m, h, d)");
    let (mut total, mut digits) = (0u64, String::new());
    for c in s.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86400,
            _ => return Err(bad()),
        };
        let n: u64 = digits.parse().map_err(|_| bad())?;
        total = n.checked_mul(unit).and_then(|v| total.checked_add(v)).ok_or_else(bad)?;
        digits.clear();
    }
    if !digits.is_empty() || s.is_empty() {
        return Err(bad());
    }
    if total == 0 || total > MAX_IDLE_AFTER_SECS {
        return Err(format!("{s:?} must be more than 0 and at most 30d"));
    }
    Ok(total)
}

/// The path through which a quota's GPUs reach pods.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AllocationPath {
    /// `nvidia.com/gpu` and `nvidia.com/mig-<profile>` requests of pods; every DeviceClass that
    /// reaches GPUs gets 0 devices in the tenant's namespaces.
    #[default]
    ExtendedResources,
    /// ResourceClaims of Tessera's per-profile DeviceClasses (`mig-<profile>.tessera.dev`,
    /// `gpu.tessera.dev`); the extended resources and every other GPU-reaching class get 0.
    ResourceClaims,
}

impl AllocationPath {
    pub fn is_extended_resources(&self) -> bool {
        *self == AllocationPath::ExtendedResources
    }
}

/// What a quota grants of the GPU resources its `hard` does not name.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum UnlistedPolicy {
    /// Not limited by this quota (a ResourceQuota limits only what it lists).
    #[default]
    Unlimited,
    /// 0 in every namespace: `nvidia.com/gpu` and every `nvidia.com/mig-<profile>` of the catalog
    /// and of the fleet's reported profiles.
    Zero,
}

impl UnlistedPolicy {
    pub fn is_unlimited(&self) -> bool {
        *self == UnlistedPolicy::Unlimited
    }
}

/// How a tenant-wide limit becomes per-namespace `ResourceQuota`s.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SplitPolicy {
    /// Each namespace gets `floor(hard / n)`; the remainder goes to the first namespaces in the
    /// order listed, so the shares add up to exactly `hard`.
    #[default]
    Even,
    /// Shares come from `namespaceHard`; a resource missing there gets 0 in that namespace.
    Explicit,
}

/// Limits in compute slices and GPU memory, summed over every MIG profile and whole GPU.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PhysicalLimits {
    /// SM slices: a `3g.40gb` counts 3, a whole GPU counts 7 (4 on A30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self >= 0").message("computeSlices must be >= 0"))]
    pub compute_slices: Option<i64>,
    /// GPU memory in GB as profile names state it: a `3g.40gb` counts 40.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self >= 0").message("memoryGB must be >= 0"))]
    #[serde(rename = "memoryGB")]
    pub memory_gb: Option<i64>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct TenantGpuQuotaStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default)]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Per resource: hard, used and remaining over all namespaces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<ResourceUsage>,
    /// Per namespace: the share applied and what is used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<NamespaceUsage>,
    /// Allocated versus used: the devices the tenant's pods hold and how many sit idle, from
    /// the node agents' activity (absent until the operator has read pods and activity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activity: Option<TenantActivity>,
}

/// The most idle holders a quota's status lists (the oldest first); `kubectl tessera idle`
/// lists them all.
pub const MAX_IDLE_HOLDERS: usize = 20;

/// A tenant's devices, allocated versus used.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct TenantActivity {
    /// The threshold applied (`spec.idleAfter`, else `1h`).
    pub idle_after: String,
    /// Devices (MIG instances or whole GPUs) the tenant's pods hold.
    pub allocated: i64,
    /// Held devices measured busy, or idle for less than `idleAfter`.
    pub active: i64,
    /// Held devices idle for at least `idleAfter`.
    pub idle: i64,
    /// Held devices no agent reported a figure for (never counted idle).
    #[serde(default)]
    pub unmeasured: i64,
    /// The oldest idle holders, at most 20.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 20))]
    pub idle_holders: Vec<IdleSlice>,
    /// Nodes holding its devices whose agents are not reporting (their heartbeat ran out): the
    /// devices there count `unmeasured`, as the agent's last figures say nothing of now. At
    /// most 20.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 20))]
    pub not_reporting: Vec<AgentNotReporting>,
}

/// A node whose agent's activity figures were set aside.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AgentNotReporting {
    pub node: String,
    /// The agent's last heartbeat (its Lease's `renewTime`); absent when it never had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
}

/// One idle device and the pod holding it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IdleSlice {
    /// `namespace/name`.
    pub pod: String,
    pub node: String,
    pub gpu: i32,
    /// The MIG profile, or `whole`.
    pub profile: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<i32>,
    pub memory_used_mib: i64,
    pub idle_since: Time,
    /// False when the holder is a guess (extended resources of one profile shared by several
    /// pods on a node).
    pub exact: bool,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ResourceUsage {
    pub name: String,
    pub hard: i64,
    pub used: i64,
    pub remaining: i64,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceUsage {
    pub namespace: String,
    #[serde(default)]
    pub hard: BTreeMap<String, i64>,
    #[serde(default)]
    pub used: BTreeMap<String, i64>,
}

/// A quota names at least one namespace or selects them by label.
pub const NAMESPACES_RULE: &str = "(has(self.namespaces) && size(self.namespaces) > 0) || has(self.namespaceSelector)";
pub const NAMESPACES_MESSAGE: &str = "at least one namespace (spec.namespaces) or a spec.namespaceSelector is required";
