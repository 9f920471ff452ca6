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
    let status = if status { "True" } else { "False" }.to_string();
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
