//! Status conditions in the shape kstatus (Flux) and Argo CD understand, and the pure helper that
//! sets one without disturbing `lastTransitionTime` when nothing changed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::{Schema, SchemaGenerator, json_schema};

/// `Ready`: always present; `True` once the object's intent is fully realised.
pub const READY: &str = "Ready";
/// `Reconciling`: present and `True` only while work is in progress (kstatus "InProgress").
pub const RECONCILING: &str = "Reconciling";
/// `Stalled`: present and `True` only when progress needs a human (kstatus "Failed").
pub const STALLED: &str = "Stalled";
/// `Conflict`: another object claims the same thing (plans on one node, quotas on one namespace).
pub const CONFLICT: &str = "Conflict";
/// `CapacityAvailable`: the fleet's applied layouts can honour every tenant's quota at once.
pub const CAPACITY_AVAILABLE: &str = "CapacityAvailable";
/// `DemandMet` (automatic plans): the decided layouts supply the selected quotas' demand.
pub const DEMAND_MET: &str = "DemandMet";

/// Reasons of a `GpuPartitionPlan`'s conditions. Alerts, dashboards and tests match on them, so
/// they are API: rename none.
pub mod plan_reasons {
    // Stalled (and Ready=False while stalled), most fundamental first.
    /// The plan's spec is invalid; it acts on no node until fixed.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// Plans of equal priority match the same node(s); neither acts there.
    pub const CONFLICT: &str = "Conflict";
    /// A desired layout cannot be placed on a matched node's GPUs.
    pub const INVALID_LAYOUT: &str = "InvalidLayout";
    /// A matched node's agent stopped reporting.
    pub const AGENT_NOT_RESPONDING: &str = "AgentNotResponding";
    /// A node needs a GPU reset or reboot to take its layout; it stays cordoned until then.
    pub const RESET_REQUIRED: &str = "ResetRequired";
    /// A node's agent did not report success in time; the node stays cordoned.
    pub const APPLY_TIMEOUT: &str = "ApplyTimeout";
    /// A node's drain did not finish in time.
    pub const DRAIN_TIMEOUT: &str = "DrainTimeout";
    /// A node failed to apply its layout, or failed nodes halt the rollout.
    pub const NODE_FAILED: &str = "NodeFailed";

    // Conflict.
    /// Another plan of the same priority matches some of this plan's nodes.
    pub const EQUAL_PRIORITY: &str = "EqualPriority";

    // Reconciling, and Ready=False while work is in progress.
    /// Nodes are being (or wait to be) changed to the plan's layout.
    pub const ROLLING_OUT: &str = "RollingOut";
    /// The plan is paused: no new node starts.
    pub const PAUSED: &str = "Paused";
    /// An automatic plan waits for the quotas' demand to hold still before it decides.
    pub const STABILIZING: &str = "Stabilizing";

    // Ready.
    /// Every matched node has the plan's (or the decided) layout.
    pub const APPLIED: &str = "Applied";
    /// No GPU node matches the plan; there is nothing to do.
    pub const NO_NODES: &str = "NoNodes";
    /// Matched nodes have no node agent report yet, and nothing else is in progress.
    pub const WAITING_FOR_AGENTS: &str = "WaitingForAgents";

    // DemandMet (automatic plans).
    /// The decided layouts supply the selected quotas' demand, and every node holds them.
    pub const DEMAND_MET: &str = "DemandMet";
    /// The decided layouts fall short of the selected quotas' demand.
    pub const DEMAND_NOT_MET: &str = "DemandNotMet";
    /// No layout decision yet: the layouts are being worked out from the quotas.
    pub const DECIDING: &str = "Deciding";
    /// The decision covers the demand once applied, but some nodes are not done (or failed).
    pub const NOT_YET_APPLIED: &str = "NotYetApplied";

    // DraInSync.
    /// A matched node's DRA driver lists devices other than the agent reports.
    pub const SLICES_STALE: &str = "SlicesStale";
    /// A matched node's GPU DRA driver manages MIG itself (DynamicMIG), so Tessera leaves it alone.
    pub const DYNAMIC_MIG_REFUSED: &str = "DynamicMigRefused";

    /// Every reason above (the README's reason table must list exactly these).
    pub const ALL: &[&str] = &[
        INVALID_SPEC,
        CONFLICT,
        INVALID_LAYOUT,
        AGENT_NOT_RESPONDING,
        RESET_REQUIRED,
        APPLY_TIMEOUT,
        DRAIN_TIMEOUT,
        NODE_FAILED,
        EQUAL_PRIORITY,
        ROLLING_OUT,
        PAUSED,
        STABILIZING,
        APPLIED,
        NO_NODES,
        WAITING_FOR_AGENTS,
        DEMAND_MET,
        DEMAND_NOT_MET,
        DECIDING,
        NOT_YET_APPLIED,
        SLICES_STALE,
        DYNAMIC_MIG_REFUSED,
    ];
}

/// Reasons of a `TenantGpuQuota`'s conditions (planned by the quota planner, `ClaimPolicyBound`
/// and the pod watch's `Ready` by the operator). API as [`plan_reasons`]: rename none.
pub mod quota_reasons {
    // Stalled (and Ready=False while stalled).
    /// The quota's spec is invalid; what was enforced before stays enforced.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// A namespace of the quota is claimed by another quota too (see its `Conflict` condition).
    pub const CONFLICT: &str = "Conflict";
    /// A ResourceQuota of the quota's name exists but is not this quota's; another name is used.
    pub const RESOURCE_QUOTA_NAME_TAKEN: &str = "ResourceQuotaNameTaken";

    // Conflict.
    /// Two quotas claim the same namespace.
    pub const NAMESPACE_CLAIMED_TWICE: &str = "NamespaceClaimedTwice";

    // Ready.
    /// Every ResourceQuota of the quota is in place.
    pub const ENFORCED: &str = "Enforced";
    /// The quota's ResourceQuota was given a scope, so it limits no claim.
    pub const RESOURCE_QUOTA_SCOPED: &str = "ResourceQuotaScoped";
    /// Usage in a namespace exceeds a physical limit of the quota.
    pub const OVER_PHYSICAL_LIMIT: &str = "OverPhysicalLimit";
    /// A namespace of the quota does not exist (yet).
    pub const NAMESPACE_MISSING: &str = "NamespaceMissing";
    /// The operator cannot watch unbound pods, so it cannot refuse early GPU pods.
    pub const POD_WATCH_FAILING: &str = "PodWatchFailing";

    // Ready=False and Reconciling.
    /// Writing (or deleting) a ResourceQuota failed; retried every pass.
    pub const WRITE_FAILED: &str = "WriteFailed";

    // CapacityAvailable.
    /// The fleet's applied layouts supply every tenant's quota at once.
    pub const SUFFICIENT: &str = "Sufficient";
    /// All tenants' limits together exceed what the applied layouts supply.
    pub const OVER_COMMITTED: &str = "OverCommitted";

    // ClaimPolicyBound.
    /// The claim-class policy reads the operator's params and enforces them as shipped.
    pub const BOUND: &str = "Bound";
    /// The claim-class policy's binding does not read the operator's params.
    pub const PARAMS_NOT_READ: &str = "ParamsNotRead";
    /// A shipped policy or binding would not refuse what it must (a closed class, an early pod).
    pub const POLICY_NOT_ENFORCING: &str = "PolicyNotEnforcing";
    /// `Unknown`: a shipped policy or binding could not be read, so whether it enforces is not known.
    pub const POLICY_NOT_READABLE: &str = "PolicyNotReadable";

    /// Every reason above (the README's reason table must list exactly these).
    pub const ALL: &[&str] = &[
        INVALID_SPEC,
        CONFLICT,
        RESOURCE_QUOTA_NAME_TAKEN,
        NAMESPACE_CLAIMED_TWICE,
        ENFORCED,
        RESOURCE_QUOTA_SCOPED,
        OVER_PHYSICAL_LIMIT,
        NAMESPACE_MISSING,
        POD_WATCH_FAILING,
        WRITE_FAILED,
        SUFFICIENT,
        OVER_COMMITTED,
        BOUND,
        PARAMS_NOT_READ,
        POLICY_NOT_ENFORCING,
        POLICY_NOT_READABLE,
    ];
}

/// Reasons of a `GpuNode`'s conditions: `Ready`, `Reconciling` and `Stalled` written by the node
/// agent, `Ready=Unknown` and `DraInSync` by the operator. API as [`plan_reasons`]: rename none.
pub mod gpunode_reasons {
    // Stalled (and Ready=False while stalled).
    /// The intent names a GPU the node does not have.
    pub const GPU_NOT_FOUND: &str = "GpuNotFound";
    /// The intent names a GPU without MIG.
    pub const MIG_NOT_SUPPORTED: &str = "MigNotSupported";
    /// An instance that must go (or the GPU, for a MIG mode change) has processes.
    pub const INSTANCE_IN_USE: &str = "InstanceInUse";
    /// The intent cannot be placed next to the busy instances.
    pub const LAYOUT_DOES_NOT_FIT: &str = "LayoutDoesNotFit";
    /// An instance that must go holds memory no process accounts for; only a reset frees it.
    pub const LEAKED_MEMORY: &str = "LeakedMemory";
    /// A GPU instance is split into smaller compute instances; Tessera leaves the GPU alone.
    pub const SPLIT_COMPUTE_INSTANCES: &str = "SplitComputeInstances";
    /// A MIG mode change needs a GPU reset or a node reboot.
    pub const RESET_REQUIRED: &str = "ResetRequired";

    // Reconciling, and Ready=False while work is in progress.
    /// A driver call failed; the next pass retries (`Reconciling`).
    pub const RETRYING: &str = "Retrying";
    /// A driver call failed; the next pass retries (`Ready=False` beside [`RETRYING`]).
    pub const APPLY_FAILED: &str = "ApplyFailed";
    /// The intent needs the node drained and handed over first.
    pub const AWAITING_DRAIN: &str = "AwaitingDrain";
    /// A MIG mode change waits for the paused GPU client pods to leave.
    pub const STOPPING_GPU_CLIENTS: &str = "StoppingGpuClients";

    // Ready.
    /// Every GPU matches the intent.
    pub const APPLIED: &str = "Applied";
    /// `Ready=Unknown`, by the operator: the agent's heartbeat lease expired.
    pub const AGENT_NOT_RESPONDING: &str = "AgentNotResponding";

    // DraInSync, by the operator.
    /// The GPU DRA driver lists the MIG devices the agent reports.
    pub const IN_SYNC: &str = "InSync";
    /// The GPU DRA driver lists devices other than the agent reports.
    pub const SLICES_STALE: &str = "SlicesStale";
    /// The GPU DRA driver manages MIG itself (DynamicMIG); Tessera refuses the node.
    pub const DYNAMIC_MIG: &str = "DynamicMig";

    /// Every reason above (the README's reason table must list exactly these).
    pub const ALL: &[&str] = &[
        GPU_NOT_FOUND,
        MIG_NOT_SUPPORTED,
        INSTANCE_IN_USE,
        LAYOUT_DOES_NOT_FIT,
        LEAKED_MEMORY,
        SPLIT_COMPUTE_INSTANCES,
        RESET_REQUIRED,
        RETRYING,
        APPLY_FAILED,
        AWAITING_DRAIN,
        STOPPING_GPU_CLIENTS,
        APPLIED,
        AGENT_NOT_RESPONDING,
        IN_SYNC,
        SLICES_STALE,
        DYNAMIC_MIG,
    ];
}

/// Schema for `conditions`: a list-map keyed by `type`, so two writers (operator and node agent,
/// each with its own server-side-apply field manager) can own different conditions of one object.
pub fn conditions_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "required": ["type", "status", "lastTransitionTime", "reason", "message"],
            "properties": {
                "type": {"type": "string", "maxLength": 316},
                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
                "lastTransitionTime": {"type": "string", "format": "date-time"},
                "reason": {"type": "string", "maxLength": 1024, "minLength": 1,
                           "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"},
                "message": {"type": "string", "maxLength": 32768}
            }
        }
    })
}

/// Sets (or replaces) the condition of `type_` in `conditions`. `lastTransitionTime` moves only
/// when `status` changes, as the Kubernetes API conventions require.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: Time,
) {
    let status = if status { "True" } else { "False" };
    set_condition_status(conditions, type_, status, reason, message, observed_generation, now);
}

/// [`set_condition`] with the status as the API spells it: `True`, `False` or `Unknown` (what
/// the operator cannot tell: not `True`, as the API conventions say).
pub fn set_condition_status(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: Time,
) {
    let status = status.to_string();
    let message = message.into();
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = now;
            }
            c.status = status;
            c.reason = reason.to_string();
            c.message = message;
            c.observed_generation = observed_generation;
        }
        None => conditions.push(Condition {
            type_: type_.to_string(),
            status,
            reason: reason.to_string(),
            message,
            observed_generation,
            last_transition_time: now,
        }),
    }
}

/// Removes the condition of `type_` (abnormal-true conditions are absent when not true).
pub fn remove_condition(conditions: &mut Vec<Condition>, type_: &str) {
    conditions.retain(|c| c.type_ != type_);
}

/// The condition of `type_`, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of `type_` is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// The values of the `pub const` lines (other than `ALL`) of module `name` in this file.
    fn declared(name: &str) -> Vec<&'static str> {
        let source = include_str!("conditions.rs");
        let start = source.find(&format!("pub mod {name} {{\n")).expect("the module is in this file");
        let body = &source[start..];
        let body = &body[..body.find("\n}\n").expect("the module ends at a closing brace in column 0")];
        body.lines()
            .map(str::trim)
            .filter(|l| l.starts_with("pub const ") && !l.starts_with("pub const ALL:"))
            .map(|l| l.split('"').nth(1).expect("a reason const is one string literal"))
            .collect()
    }

    /// `ALL` of each module lists every reason const of it, once.
    #[test]
    fn all_lists_every_reason_of_its_module() {
        for (name, all) in [
            ("plan_reasons", super::plan_reasons::ALL),
            ("quota_reasons", super::quota_reasons::ALL),
            ("gpunode_reasons", super::gpunode_reasons::ALL),
        ] {
            let consts = declared(name);
            assert!(!consts.is_empty(), "{name}: no reason const found");
            assert_eq!(all.len(), all.iter().collect::<BTreeSet<_>>().len(), "{name}: ALL repeats a reason");
            assert_eq!(consts.len(), consts.iter().collect::<BTreeSet<_>>().len(), "{name}: two consts, one reason");
            let (all, consts): (BTreeSet<_>, BTreeSet<_>) =
                (all.iter().copied().collect(), consts.into_iter().collect());
            assert_eq!(all, consts, "{name}: ALL and the module's consts differ");
        }
    }
}
