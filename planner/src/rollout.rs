//! Pure rollout planner: from a snapshot of plans, nodes, `GpuNode`s, agent heartbeats and the
//! pods of draining nodes, decide what to do next for every node, and what to report per plan.
//! No I/O; the controller executes the actions in order. Intent is always recorded before the act
//! it describes (`Draining` + `cordonedByUs` before the cordon, `Failed` before the uncordon), so
//! a crash between the two is resumed correctly and a node is never left cordoned by us.
//!
//! The hand-over: the agent may destroy instances or change MIG mode only while the node's phase
//! is `Applying`, which is written only after the drain. Failed nodes, and nodes whose agent is
//! not responding, count against `maxUnavailable` (as a Deployment counts unavailable pods), so a
//! fleet-wide problem stops the rollout instead of churning every node.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use tessera_crds::conditions::{self, READY, STALLED};
use tessera_crds::gpunode::{GpuIntent, NodePhase, NodeRollout};
use tessera_crds::{GpuNode, GpuPartitionPlan};

use crate::gpu_use::ClaimIndex;
use crate::liveness::AgentHealth;

mod dra_wait;
mod intent;
mod kept_verdicts;
mod one_plan;
mod ownership;
mod phases;
pub use dra_wait::{DRA_WAIT_SECS, DraSlices};
use intent::validate;
pub use intent::{Memo, desired_intent, desired_intent_with};
pub use kept_verdicts::{KeptVerdicts, Versions};
use one_plan::{Keep, plan_one};
pub use ownership::contenders;
use ownership::{Owned, Ownership, release};

/// One Kubernetes node as the planner sees it.
#[derive(Debug, Clone)]
pub struct NodeInput<'a> {
    /// Borrowed from the cached Node, as its labels are.
    pub name: &'a str,
    /// Borrowed from the cached Node: a pass copies no labels.
    pub labels: &'a BTreeMap<String, String>,
    pub unschedulable: bool,
    /// Shared with the cache: a pass copies no object.
    pub gpunode: Option<Arc<GpuNode>>,
    /// Pods on the node; listed only for nodes that are draining. `Err`: the list failed, so the
    /// drain cannot be judged complete this pass.
    pub pods: Result<Vec<Pod>, String>,
    /// DaemonSets (namespace, name) known to exist, for the DaemonSet pods among `pods`.
    pub daemonsets: BTreeSet<(String, String)>,
    /// The pass's ResourceClaims (shared by every node): which of `pods` use a GPU through DRA.
    pub claims: Arc<ClaimIndex>,
    /// Draining nodes: per owner (`Kind namespace/name`), how many of its pods that came back
    /// to the cordoned node were evicted (kept in memory: see [`crate::drain::Returns`]).
    pub returns: BTreeMap<String, u32>,
    /// The node agent's heartbeat.
    pub agent: AgentHealth,
    /// When Tessera cordoned the Node, from its [`CORDONED_ANNOTATION`].
    pub cordon_annotated: Option<Timestamp>,
    /// The caches do not show the operator's last write to this node yet (see `expectations`):
    /// nothing is decided on it this pass, and it counts as in flight.
    pub cache_behind: bool,
    /// The versions (resourceVersions) of the cached Node and `GpuNode` this input was built
    /// from: a pass reuses a node's verdict of the pass before while they are the same (see
    /// [`KeptVerdicts`]). `None`: never reused.
    pub versions: Option<Versions>,
    /// Why Tessera must not manage this node's GPUs, from its GPU DRA driver's ResourceSlices
    /// (`dra_slices::dynamic_mig`): the plan hands it nothing and releases it. `None`: eligible.
    pub dra_refused: Option<String>,
    /// What its GPU DRA driver's ResourceSlices say of the agent's report: a node whose driver
    /// publishes is kept cordoned after a change until they list the new devices (see [`DraSlices`]).
    pub dra_slices: DraSlices,
}

/// Set on a Node (to the time) in the same patch as Tessera's cordon and removed with the
/// uncordon, so the cordon can be found and undone even if the `GpuNode` holding the rollout
/// record is lost.
pub const CORDONED_ANNOTATION: &str = "tessera.dev/cordoned-at";
/// How long a cordon without its record must last before it counts as orphaned: the Node and
/// `GpuNode` caches are separate watches, and the Node's may be ahead for a moment.
const ORPHANED_CORDON_AFTER_SECS: i64 = 60;

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Write `status.rollout` of the node's `GpuNode`.
    Rollout {
        node: String,
        rollout: Option<NodeRollout>,
    },
    Cordon {
        node: String,
    },
    Uncordon {
        node: String,
    },
    Evict {
        node: String,
        namespace: String,
        pod: String,
        /// The pod's owner when the pod came to the node after its drain started: evicting it
        /// counts as one more return of that owner ([`crate::drain::came_back`]).
        came_back: Option<String>,
    },
    /// Why the node's drain waits, as its pods show it this pass (empty: nothing holds it). The
    /// controller adds the evictions the API refused and records the whole once on the node
    /// (`status.rollout.message`, an `EvictionBlocked` Event when it changes).
    Blockers {
        node: String,
        reasons: Vec<String>,
    },
    /// Only after the drain timeout, and only when the plan sets `forceAfterTimeout`.
    ForceDelete {
        node: String,
        namespace: String,
        pod: String,
    },
    /// Write the node's intent (`GpuNode.spec`).
    Intent {
        node: String,
        plan: String,
        gpus: Vec<GpuIntent>,
    },
    /// Empty the intent of a node no plan owns (no `spec.plan`, no `spec.gpus`): its GPUs are left
    /// as they are, and nothing names a plan that no longer has it.
    ClearIntent {
        node: String,
    },
    Event {
        plan: String,
        node: String,
        reason: &'static str,
        message: String,
        warning: bool,
    },
    /// A node finished its change, `seconds` after its drain started (for the duration metric).
    Completed {
        node: String,
        seconds: f64,
    },
    /// The agent stopped renewing its lease: mark the `GpuNode` `Ready=Unknown`, as the node
    /// lifecycle controller does for a silent kubelet, so nobody reads a stale `Ready=True`.
    AgentDown {
        node: String,
        message: String,
    },
}

/// What the planner found for one plan; turned into status by `status::plan_status`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlanReport {
    pub matched: i32,
    pub updated: i32,
    pub in_progress: i32,
    pub pending: i32,
    pub failed: Vec<(String, String)>,
    pub skipped: BTreeMap<String, String>,
    /// Node -> the other plans of equal priority that match it.
    pub conflicts: BTreeMap<String, Vec<String>>,
    /// Every field error of the plan itself; an invalid plan acts on no node.
    pub invalid_spec: Vec<String>,
    pub invalid: Vec<String>,
    pub drain_timeouts: Vec<String>,
    pub drain_blocked: Vec<String>,
    /// Nodes kept cordoned until an admin resets their GPUs or reboots them.
    pub reset_required: Vec<String>,
    /// Matched nodes whose agent has not reported its GPUs yet: work still to do.
    pub waiting_for_agents: i32,
    /// Not-yet-updated nodes whose agent stopped renewing its lease, with since when.
    pub unresponsive: Vec<String>,
    /// Nodes handed to their agent for longer than `applyTimeoutSeconds`.
    pub apply_timeouts: Vec<String>,
    /// What agents applying a layout say (a retried driver error, say).
    pub agent_progress: Vec<String>,
    /// API calls that failed this pass (filled in by the controller).
    pub errors: Vec<String>,
    /// Nodes counted against `maxUnavailable` (in flight, failed, or agent not responding), and
    /// the budget: when they meet, no new node starts.
    pub unavailable: i32,
    pub budget: i32,
    /// The nodes this plan owns (their positions among the pass's nodes), to attribute API
    /// errors and stranded slices to it.
    pub nodes: Vec<usize>,
    /// Automatic plans: whether the decision meets the quotas' demand (met, reason, message).
    pub demand: Option<(bool, &'static str, String)>,
    /// Automatic plans: a change seen but not decided on yet (filled in by the controller).
    pub deciding: Option<String>,
    /// Free compute slices of the plan's GPUs that no demanded profile can use (controller).
    pub fragmented_slices: i32,
    /// Nodes refused for their DRA driver (`node: reason`, see [`NodeInput::dra_refused`]).
    pub dra_refused: Vec<String>,
    /// Nodes whose DRA driver's slices disagree with the agent (`node: message`; controller).
    pub dra_stale: Vec<String>,
}

fn in_flight(phase: NodePhase) -> bool {
    matches!(phase, NodePhase::Draining | NodePhase::Applying | NodePhase::Uncordoning)
}

/// Whether the agent has applied exactly `desired`.
fn applied(gn: &GpuNode, desired: &[GpuIntent]) -> bool {
    let Some(st) = &gn.status else { return false };
    gn.spec.gpus == desired
        && st.observed_generation.is_some()
        && st.observed_generation == gn.metadata.generation
        && conditions::is_true(&st.conditions, READY)
}

/// Whether the agent has seen `desired`: the intent is written and its report is of that
/// generation.
fn intent_seen(gn: &GpuNode, desired: &[GpuIntent]) -> bool {
    gn.spec.gpus == desired && gn.status.as_ref().and_then(|st| st.observed_generation) == gn.metadata.generation
}

/// Whether the node holds `desired` with nothing left to change: the agent says so
/// ([`applied`]), or it has seen the intent, its report shows every GPU holding it, and its
/// `Ready` condition says nothing of that generation's layout: the operator's own
/// `AgentNotResponding` marking (liveness, not the GPUs), or a condition of an earlier
/// generation. The agent's own verdicts are a difference: `Ready=False` of this generation, and
/// `Stalled` or `Reconciling` of this generation (which the operator's marking, written over
/// `Ready` only, leaves in place), as is a report with no `Ready` at all. A node is drained only
/// for a difference: not started while it holds its intent, and its drain withdrawn once it is
/// seen to.
fn holds_intent(gn: &GpuNode, desired: &[GpuIntent]) -> bool {
    if applied(gn, desired) {
        return true;
    }
    let Some(st) = &gn.status else { return false };
    let says_nothing = conditions::find(&st.conditions, READY).is_some_and(|c| {
        c.reason == conditions::gpunode_reasons::AGENT_NOT_RESPONDING || c.observed_generation != gn.metadata.generation
    });
    let agent_objects = agent_stalled(gn).is_some() || agent_condition(gn, conditions::RECONCILING).is_some();
    says_nothing && !agent_objects && intent_seen(gn, desired) && reported_holds(gn, desired)
}

/// Whether the agent's last report shows every GPU of `desired` already holding it: MIG mode as
/// asked (no change pending) and exactly the asked instances. A node taken back by a plan after
/// its intent was emptied, or a plan changed back before anything was applied, needs no drain.
/// A stale report is safe: without the hand-over the agent only creates instances in free space,
/// reports what it really found, and the node is then drained as usual.
fn reported_holds(gn: &GpuNode, desired: &[GpuIntent]) -> bool {
    let Some(st) = &gn.status else { return false };
    !desired.is_empty()
        && desired
            .iter()
            .all(|want| st.gpus.iter().find(|g| g.index == want.index).is_some_and(|g| !g.mig_pending && g.holds(want)))
}

/// "reason: message" of the agent's condition `type_` when it is true for the current generation.
fn agent_condition(gn: &GpuNode, type_: &str) -> Option<String> {
    let st = gn.status.as_ref()?;
    conditions::find(&st.conditions, type_)
        .filter(|c| c.status == "True" && c.observed_generation == gn.metadata.generation)
        .map(|c| format!("{}: {}", c.reason, c.message))
}

fn agent_stalled(gn: &GpuNode) -> Option<String> {
    agent_condition(gn, STALLED)
}

/// Plans the whole fleet.
pub fn plan_fleet(
    plans: &[GpuPartitionPlan],
    nodes: &[NodeInput<'_>],
    now: Timestamp,
) -> (Vec<Action>, BTreeMap<String, PlanReport>) {
    plan_fleet_with(plans, nodes, now, &mut KeptVerdicts::default())
}

/// [`plan_fleet`], reusing the verdicts `kept_verdicts` kept from the pass before for nodes whose inputs
/// have not changed, and keeping this pass's for the next. The result is the same.
pub fn plan_fleet_with(
    plans: &[GpuPartitionPlan],
    nodes: &[NodeInput<'_>],
    now: Timestamp,
    carry: &mut KeptVerdicts,
) -> (Vec<Action>, BTreeMap<String, PlanReport>) {
    carry.begin(plans, nodes.len());
    let live: Vec<&GpuPartitionPlan> = plans.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
    let mut reports: BTreeMap<String, PlanReport> =
        plans.iter().map(|p| (p.metadata.name.clone().unwrap_or_default(), PlanReport::default())).collect();
    let mut actions = Vec::new();
    mark_agents_down(nodes, &mut actions);
    undo_orphaned_cordons(nodes, now, &mut actions);
    let ownership = ownership::assign(&live, nodes, carry, &mut reports, &mut actions);
    plan_owned(&live, ownership, now, carry, &mut actions, &mut reports);
    (actions, reports)
}

/// Marks `Ready=Unknown` on the `GpuNode` of each node whose agent stopped renewing its lease,
/// unless it already says so.
fn mark_agents_down(nodes: &[NodeInput<'_>], actions: &mut Vec<Action>) {
    for node in nodes {
        if let (AgentHealth::NotResponding { .. }, Some(gn)) = (&node.agent, &node.gpunode) {
            let ready = gn.status.as_ref().and_then(|s| conditions::find(&s.conditions, READY));
            if ready.is_some_and(|c| c.status != "Unknown") {
                actions.push(Action::AgentDown { node: node.name.to_string(), message: node.agent.describe() });
            }
        }
    }
}

/// Uncordons the nodes Tessera cordoned whose rollout record is gone, once the cordon is older
/// than the caches can lag each other.
fn undo_orphaned_cordons(nodes: &[NodeInput<'_>], now: Timestamp, actions: &mut Vec<Action>) {
    for node in nodes.iter().filter(|n| n.unschedulable && !n.cache_behind) {
        let Some(at) = node.cordon_annotated else { continue };
        let record = node.gpunode.as_ref().and_then(|g| g.status.as_ref()?.rollout.as_ref());
        let old = now.duration_since(at).as_secs() > ORPHANED_CORDON_AFTER_SECS;
        if old && !record.is_some_and(|r| r.cordoned_by_us) {
            // Our cordon, but its record is gone (the GpuNode was deleted or re-registered).
            actions.push(Action::Uncordon { node: node.name.to_string() });
        }
    }
}

/// Checks each live plan against the nodes it matches, then plans the nodes it owns: an invalid
/// plan acts on none of them. One memo serves every plan of the pass.
fn plan_owned<'a>(
    live: &[&'a GpuPartitionPlan],
    ownership: Ownership<'_, 'a, '_>,
    now: Timestamp,
    carry: &mut KeptVerdicts,
    actions: &mut Vec<Action>,
    reports: &mut BTreeMap<String, PlanReport>,
) {
    let Ownership { mut owned, matched } = ownership;
    let mut memo = Memo::default();
    for (index, &plan) in live.iter().enumerate() {
        let name = plan.metadata.name.as_deref().unwrap_or_default();
        let owned = owned.remove(name).unwrap_or_default();
        let report = reports.get_mut(name).expect("every plan has a report");
        report.nodes = owned.iter().map(|(position, _, _)| *position).collect();
        report.invalid_spec = validate(plan, matched.get(name).map(Vec::as_slice).unwrap_or_default(), &mut memo);
        if !report.invalid_spec.is_empty() {
            act_on_none(owned, carry, actions);
            continue;
        }
        plan_one(plan, &owned, now, actions, report, &mut memo, Keep { carry: &mut *carry, plan: index });
    }
}

/// The nodes of an invalid plan: it still owns them (a typo must not hand them to a
/// lower-priority plan), but acts on none: in-flight nodes are released once their agent is done.
fn act_on_none(owned: Vec<Owned<'_, '_>>, carry: &mut KeptVerdicts, actions: &mut Vec<Action>) {
    for (position, node, _) in owned {
        release(node, actions);
        carry.remember(position, node, None);
    }
}

/// A `Failed` record is this plan's failure only if it names this plan and generation: every
/// plan starts at generation 1, so another plan's failure must not hold this one's budget.
fn failed_here(r: &NodeRollout, plan: &str, generation: Option<i64>) -> bool {
    r.plan_generation == generation && r.plan.as_deref() == Some(plan)
}

/// The rollout record of a node at rest: no cordon held, no timers.
fn idle(base: NodeRollout) -> NodeRollout {
    NodeRollout {
        phase: NodePhase::Idle,
        cordoned_by_us: false,
        drain_started_at: None,
        apply_started_at: None,
        dra_wait_started_at: None,
        message: String::new(),
        ..base
    }
}

/// The last step of a node's rollout: uncordon it if we cordoned it, then forget the drain.
fn finish(node: &str, cordoned_by_us: bool, base: NodeRollout, actions: &mut Vec<Action>) {
    if cordoned_by_us {
        actions.push(Action::Uncordon { node: node.to_string() });
    }
    actions.push(Action::Rollout { node: node.to_string(), rollout: Some(idle(base)) });
}

/// The node an action is about.
pub fn node_of(action: &Action) -> &str {
    match action {
        Action::Rollout { node, .. }
        | Action::Cordon { node }
        | Action::Uncordon { node }
        | Action::Evict { node, .. }
        | Action::ForceDelete { node, .. }
        | Action::Intent { node, .. }
        | Action::ClearIntent { node }
        | Action::Event { node, .. }
        | Action::Completed { node, .. }
        | Action::Blockers { node, .. }
        | Action::AgentDown { node, .. } => node,
    }
}

#[cfg(test)]
mod tests;
