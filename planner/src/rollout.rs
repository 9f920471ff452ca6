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
use std::rc::Rc;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use tessera_crds::catalog::GpuModel;
use tessera_crds::conditions::{self, READY, STALLED};
use tessera_crds::gpunode::{GpuIntent, GpuState, NodePhase, NodeRollout};
use tessera_crds::plan::{GpuLayout, GpuPartitionPlanSpec};
use tessera_crds::validate::{max_unavailable, validate_plan_with};
use tessera_crds::{GpuNode, GpuPartitionPlan, catalog, solver};

use crate::auto::Ask;
use crate::gpu_use::ClaimIndex;
use crate::liveness::AgentHealth;
use crate::selector::matches;

mod carry;
mod dra_wait;
mod phases;
use carry::Verdict;
pub use carry::{Carry, Versions};
pub use dra_wait::{DRA_WAIT_SECS, DraSlices};

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
    /// [`Carry`]). `None`: never reused.
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

/// Product names compared loosely: case, spaces and underscores do not matter.
fn product_key(s: &str) -> String {
    s.trim().to_ascii_lowercase().replace([' ', '_'], "-")
}

/// Catalog look-ups and layout fits of one planning pass, shared by all its nodes: a fleet has a
/// few boards and many nodes, and repeating these per node made them most of a pass's cost.
#[derive(Default)]
pub struct Memo<'a> {
    products: crate::FastMap<&'a str, Option<&'static GpuModel>>,
    same: crate::FastMap<(&'a str, &'a str), bool>,
    /// Keyed by the addresses of a `&'static` model and of a layout borrowed for `'a`.
    fits: crate::FastMap<(usize, usize), Result<(), String>>,
    /// A plan's intent per node shape: keyed by the hash of (plan spec address, each GPU's index,
    /// product and MIG capability), holding those parts to compare (no collision is trusted).
    /// Nodes of a fleet share a few shapes, and building the intent allocated per node.
    desired: crate::FastMap<u64, Vec<DesiredEntry<'a>>>,
}

/// One remembered intent: the plan spec's address, the GPUs' parts, the intent.
type DesiredEntry<'a> = (usize, Vec<(i32, &'a str, bool)>, Result<Rc<Vec<GpuIntent>>, String>);

impl<'a> Memo<'a> {
    fn lookup(&mut self, product: &'a str) -> Option<&'static GpuModel> {
        *self.products.entry(product).or_insert_with(|| catalog::lookup(product))
    }

    /// Whether a layout's `gpuProduct` names this GPU's board (catalog names, else loosely).
    fn same_product(&mut self, layout: &'a str, gpu: &'a str) -> bool {
        if let Some(same) = self.same.get(&(layout, gpu)) {
            return *same;
        }
        let same = match (self.lookup(layout), self.lookup(gpu)) {
            (Some(a), Some(b)) => a.name == b.name,
            _ => product_key(layout) == product_key(gpu),
        };
        self.same.insert((layout, gpu), same);
        same
    }

    /// The geometry of a reported GPU: the catalog's, or else the table its agent read from NVML.
    fn model_of(&mut self, g: &'a GpuState) -> Option<&'static GpuModel> {
        self.lookup(&g.product)
            .or_else(|| (!g.profiles.is_empty()).then(|| catalog::model_from_table(&g.product, &g.profiles)))
    }

    /// [`desired_intent_with`], shared by the nodes whose GPUs look the same to the layouts. Only
    /// for boards in the catalog: another board's geometry is read from its own profile table.
    fn desired(&mut self, spec: &'a GpuPartitionPlanSpec, gpus: &'a [GpuState]) -> Result<Rc<Vec<GpuIntent>>, String> {
        if !gpus.iter().all(|g| self.lookup(&g.product).is_some()) {
            return desired_intent_with(spec, gpus, self).map(Rc::new);
        }
        let address = std::ptr::from_ref(spec) as usize;
        let key = {
            use std::hash::{BuildHasher, Hash, Hasher};
            let mut h = foldhash::fast::FixedState::default().build_hasher();
            address.hash(&mut h);
            for g in gpus {
                (g.index, g.product.as_str(), g.mig_capable).hash(&mut h);
            }
            h.finish()
        };
        let same = |parts: &[(i32, &str, bool)]| {
            parts.len() == gpus.len()
                && parts.iter().zip(gpus).all(|(p, g)| p.0 == g.index && p.1 == g.product && p.2 == g.mig_capable)
        };
        if let Some((_, _, known)) =
            self.desired.get(&key).and_then(|b| b.iter().find(|(a, parts, _)| *a == address && same(parts)))
        {
            return known.clone();
        }
        let intent = desired_intent_with(spec, gpus, self).map(Rc::new);
        let parts = gpus.iter().map(|g| (g.index, g.product.as_str(), g.mig_capable)).collect();
        self.desired.entry(key).or_default().push((address, parts, intent.clone()));
        intent
    }

    fn fit(&mut self, model: &'static GpuModel, layout: &'a GpuLayout) -> Result<(), String> {
        let key = (std::ptr::from_ref(model) as usize, std::ptr::from_ref(layout) as usize);
        self.fits
            .entry(key)
            .or_insert_with(|| {
                let counts = layout
                    .profiles
                    .iter()
                    .filter(|(_, n)| **n > 0)
                    .map(|(k, n)| (catalog::normalize_profile(k), *n as u32))
                    .collect();
                solver::fit(model, &counts).map(|_| ()).map_err(|e| e.to_string())
            })
            .clone()
    }
}

/// The intent a plan asks for on a node, from the GPUs its agent reported. `Err` names why the
/// node cannot be acted on (no layout for its product, or a layout that cannot fit it).
pub fn desired_intent(spec: &GpuPartitionPlanSpec, gpus: &[GpuState]) -> Result<Vec<GpuIntent>, String> {
    desired_intent_with(spec, gpus, &mut Memo::default())
}

/// [`desired_intent`] with the look-ups of a pass shared across its nodes.
pub fn desired_intent_with<'a>(
    spec: &'a GpuPartitionPlanSpec,
    gpus: &'a [GpuState],
    memo: &mut Memo<'a>,
) -> Result<Vec<GpuIntent>, String> {
    let mut out = Vec::new();
    for g in gpus {
        let mut chosen = None;
        for l in &spec.layouts {
            if l.gpu_indices.as_ref().is_some_and(|i| i.contains(&g.index))
                && memo.same_product(&l.gpu_product, &g.product)
            {
                chosen = Some(l);
                break;
            }
        }
        if chosen.is_none() {
            for l in &spec.layouts {
                if l.gpu_indices.is_none() && memo.same_product(&l.gpu_product, &g.product) {
                    chosen = Some(l);
                    break;
                }
            }
        }
        let Some(layout) = chosen else { continue };
        if layout.mig_enabled && !g.mig_capable {
            return Err(format!("GPU {} ({}) is not MIG capable", g.index, g.product));
        }
        if let (true, Some(model)) = (layout.mig_enabled, memo.model_of(g))
            && let Err(e) = memo.fit(model, layout)
        {
            return Err(format!("the layout for GPU {} does not fit: {e}", g.index));
        }
        let profiles: BTreeMap<String, i32> =
            layout.profiles.iter().filter(|(_, n)| **n > 0).map(|(k, n)| (k.clone(), *n)).collect();
        out.push(GpuIntent { index: g.index, mig_enabled: layout.mig_enabled, profiles });
    }
    if out.is_empty() {
        let products: Vec<&str> = gpus.iter().map(|g| g.product.as_str()).collect();
        return Err(format!("the plan has no layout for this node's GPUs ({})", products.join(", ")));
    }
    Ok(out)
}

/// Whether the agent has applied exactly `desired`.
fn applied(gn: &GpuNode, desired: &[GpuIntent]) -> bool {
    let Some(st) = &gn.status else { return false };
    gn.spec.gpus == desired
        && st.observed_generation.is_some()
        && st.observed_generation == gn.metadata.generation
        && conditions::is_true(&st.conditions, READY)
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

/// Checks a plan as `tessera-operator validate` does; a product missing from the catalog is
/// checked against the profile table an agent of a matched node reports for it.
fn validate<'a>(plan: &GpuPartitionPlan, nodes: &[&'a NodeInput<'_>], memo: &mut Memo<'a>) -> Vec<String> {
    let mut reported: BTreeMap<String, &'static GpuModel> = BTreeMap::new();
    for node in nodes {
        let gpus = node.gpunode.as_ref().and_then(|g| g.status.as_ref()).map(|s| s.gpus.as_slice()).unwrap_or(&[]);
        for g in gpus.iter().filter(|g| memo.lookup(&g.product).is_none() && catalog::valid_table(&g.profiles)) {
            reported.insert(product_key(&g.product), catalog::model_from_table(&g.product, &g.profiles));
        }
    }
    validate_plan_with(&plan.spec, &|product| reported.get(&product_key(product)).copied())
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// Plans the whole fleet.
pub fn plan_fleet(
    plans: &[GpuPartitionPlan],
    nodes: &[NodeInput<'_>],
    now: Timestamp,
) -> (Vec<Action>, BTreeMap<String, PlanReport>) {
    plan_fleet_with(plans, nodes, now, &mut Carry::default())
}

/// [`plan_fleet`], reusing the verdicts `carry` kept from the pass before for nodes whose inputs
/// have not changed, and keeping this pass's for the next. The result is the same.
pub fn plan_fleet_with(
    plans: &[GpuPartitionPlan],
    nodes: &[NodeInput<'_>],
    now: Timestamp,
    carry: &mut Carry,
) -> (Vec<Action>, BTreeMap<String, PlanReport>) {
    carry.begin(plans, nodes.len());
    let live: Vec<&GpuPartitionPlan> = plans.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
    let mut reports: BTreeMap<String, PlanReport> =
        plans.iter().map(|p| (p.metadata.name.clone().unwrap_or_default(), PlanReport::default())).collect();
    let mut actions = Vec::new();
    for node in nodes {
        if let (AgentHealth::NotResponding { .. }, Some(gn)) = (&node.agent, &node.gpunode) {
            let ready = gn.status.as_ref().and_then(|s| conditions::find(&s.conditions, READY));
            if ready.is_some_and(|c| c.status != "Unknown") {
                actions.push(Action::AgentDown { node: node.name.to_string(), message: node.agent.describe() });
            }
        }
    }
    for node in nodes.iter().filter(|n| n.unschedulable && !n.cache_behind) {
        let Some(at) = node.cordon_annotated else { continue };
        let record = node.gpunode.as_ref().and_then(|g| g.status.as_ref()?.rollout.as_ref());
        let old = now.duration_since(at).as_secs() > ORPHANED_CORDON_AFTER_SECS;
        if old && !record.is_some_and(|r| r.cordoned_by_us) {
            // Our cordon, but its record is gone (the GpuNode was deleted or re-registered).
            actions.push(Action::Uncordon { node: node.name.to_string() });
        }
    }
    // Ownership: highest priority wins; a tie at the top is a conflict and nobody acts.
    let mut owned: BTreeMap<&str, Vec<Owned<'_, '_>>> = BTreeMap::new();
    // Every node each plan's selector matches (its own or not), for checking the plan. A node
    // with a kept verdict is left out: it reports only boards of the catalog, which `validate`
    // does not look at.
    let mut matched: BTreeMap<&str, Vec<&NodeInput<'_>>> = BTreeMap::new();
    for (position, node) in nodes.iter().enumerate() {
        let kept = carry.verdict(position, node);
        match kept {
            Some(Verdict::Unowned) => {
                carry.reused += 1;
                continue;
            }
            Some(Verdict::Updated(p) | Verdict::Waiting(p)) => {
                if let Some(plan) = live.get(p) {
                    owned
                        .entry(plan.metadata.name.as_deref().unwrap_or_default())
                        .or_default()
                        .push((position, node, kept));
                    continue;
                }
            }
            None => {}
        }
        let mut top: Option<i32> = None;
        let mut winners: Vec<&str> = Vec::new();
        for p in live.iter().filter(|p| matches(&p.spec.node_selector, node.labels)) {
            let name = p.metadata.name.as_deref().unwrap_or_default();
            matched.entry(name).or_default().push(node);
            match top {
                Some(t) if p.spec.priority < t => continue,
                Some(t) if p.spec.priority == t => winners.push(name),
                _ => {
                    top = Some(p.spec.priority);
                    winners = vec![name];
                }
            }
        }
        match winners.as_slice() {
            [] => {
                let before = actions.len();
                release(node, &mut actions);
                if actions.len() == before {
                    clear_intent(node, &mut actions);
                }
                carry.remember(position, node, (actions.len() == before).then_some(Verdict::Unowned));
            }
            [one] => owned.entry(*one).or_default().push((position, node, None)),
            many => {
                for p in many {
                    let others = many.iter().filter(|o| *o != p).map(|o| o.to_string()).collect();
                    reports
                        .get_mut(*p)
                        .expect("every plan has a report")
                        .conflicts
                        .insert(node.name.to_string(), others);
                }
                release(node, &mut actions);
                carry.remember(position, node, None);
            }
        }
    }
    let mut memo = Memo::default();
    for (index, plan) in live.iter().enumerate() {
        let name = plan.metadata.name.as_deref().unwrap_or_default();
        let owned = owned.remove(name).unwrap_or_default();
        let report = reports.get_mut(name).expect("every plan has a report");
        report.nodes = owned.iter().map(|(position, _, _)| *position).collect();
        report.invalid_spec = validate(plan, matched.get(name).map(Vec::as_slice).unwrap_or_default(), &mut memo);
        if !report.invalid_spec.is_empty() {
            // It still owns its nodes (a typo must not hand them to a lower-priority plan), but
            // acts on none: in-flight nodes are released once their agent is done.
            for (position, node, _) in owned {
                release(node, &mut actions);
                carry.remember(position, node, None);
            }
            continue;
        }
        plan_one(plan, &owned, now, &mut actions, report, &mut memo, Keep { carry: &mut *carry, plan: index });
    }
    (actions, reports)
}

/// A node a plan owns (its position among the pass's nodes, the node), with the verdict kept
/// for it from the pass before.
type Owned<'n, 'a> = (usize, &'n NodeInput<'a>, Option<Verdict>);

/// Where a plan's pass keeps its nodes' verdicts: the carry, and the plan's index among the live.
struct Keep<'c> {
    carry: &'c mut Carry,
    plan: usize,
}

/// A node a plan may change this pass.
enum Candidate<'n, 'a> {
    /// Kept from the pass before: at rest with the plan's layout.
    Updated,
    /// Kept from the pass before: waiting for a slot (its position, the node).
    Waiting(usize, &'n NodeInput<'a>),
    /// Planned in full: its position, the node, its `GpuNode`, the intent the plan asks for.
    Full(usize, &'n NodeInput<'a>, &'n Arc<GpuNode>, Rc<Vec<GpuIntent>>),
}

/// The live plans of top priority that match a node: one owns it; several conflict.
pub fn contenders(live: &[&GpuPartitionPlan], labels: &BTreeMap<String, String>) -> Vec<String> {
    let matching: Vec<&&GpuPartitionPlan> = live.iter().filter(|p| matches(&p.spec.node_selector, labels)).collect();
    let top = matching.iter().map(|p| p.spec.priority).max();
    matching
        .iter()
        .filter(|p| Some(p.spec.priority) == top)
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect()
}

/// A node no plan acts on any more: finish an in-flight apply, uncordon what we cordoned, forget.
/// Forgetting the rollout withdraws the hand-over, so the agent changes nothing disruptive after.
fn release(node: &NodeInput<'_>, actions: &mut Vec<Action>) {
    if node.cache_behind {
        return; // decided on the next pass, from a view that shows our last write
    }
    let Some(gn) = &node.gpunode else { return };
    let Some(r) = gn.status.as_ref().and_then(|s| s.rollout.as_ref()) else { return };
    // An agent not proven yet (the operator just started) may be mid-change: wait to know.
    let agent_working = !node.agent.is_not_responding() && !applied(gn, &gn.spec.gpus) && agent_stalled(gn).is_none();
    if r.phase == NodePhase::Applying && agent_working {
        return; // the agent is reconfiguring a drained node: let it finish first
    }
    if r.cordoned_by_us && node.unschedulable {
        if r.phase == NodePhase::Applying {
            // Withdraw the hand-over before the uncordon, so a late agent changes nothing.
            let withdrawn = NodeRollout { phase: NodePhase::Pending, ..r.clone() };
            actions.push(Action::Rollout { node: node.name.to_string(), rollout: Some(withdrawn) });
        }
        actions.push(Action::Uncordon { node: node.name.to_string() });
    }
    actions.push(Action::Rollout { node: node.name.to_string(), rollout: None });
}

/// A node that no plan matches, released (no rollout record left): its intent is emptied, once.
/// What it held came from a plan that was deleted or no longer selects it; kept, it named that
/// plan (`kubectl get gpunodes`, `kubectl tessera status`) and had the agent re-create, in free
/// space, instances an admin removed by hand. Empty, the agent leaves the GPUs as they are.
/// Nodes of an invalid plan, or claimed by plans in conflict, keep theirs: a plan still owns them.
fn clear_intent(node: &NodeInput<'_>, actions: &mut Vec<Action>) {
    if node.cache_behind {
        return;
    }
    let Some(gn) = &node.gpunode else { return };
    let released = gn.status.as_ref().and_then(|s| s.rollout.as_ref()).is_none();
    if released && (gn.spec.plan.is_some() || !gn.spec.gpus.is_empty()) {
        actions.push(Action::ClearIntent { node: node.name.to_string() });
    }
}

/// Whether a node counts against `maxUnavailable` for `plan_generation`: in flight, failed for
/// this generation, or not updated while its agent is not responding.
fn unavailable(node: &NodeInput<'_>, gn: &GpuNode, desired: &[GpuIntent], plan: &str, generation: Option<i64>) -> bool {
    let r = gn.status.as_ref().and_then(|s| s.rollout.as_ref());
    let phase = r.map(|r| r.phase).unwrap_or_default();
    let failed_now = phase == NodePhase::Failed && r.is_some_and(|r| failed_here(r, plan, generation));
    in_flight(phase) || ((failed_now || node.agent != AgentHealth::Alive) && !applied(gn, desired))
}

/// A `Failed` record is this plan's failure only if it names this plan and generation: every
/// plan starts at generation 1, so another plan's failure must not hold this one's budget.
fn failed_here(r: &NodeRollout, plan: &str, generation: Option<i64>) -> bool {
    r.plan_generation == generation && r.plan.as_deref() == Some(plan)
}

/// Whether every GPU of the node is a board of the catalog (`validate` reads only the others).
fn catalogued<'a>(gn: &'a GpuNode, memo: &mut Memo<'a>) -> bool {
    gn.status.iter().flat_map(|s| s.gpus.iter()).all(|g| memo.lookup(&g.product).is_some())
}

/// What a plan wants of a node it owns.
enum Want<'a> {
    /// A change to plan: the node's `GpuNode` and the intent.
    Change(&'a Arc<GpuNode>, Rc<Vec<GpuIntent>>),
    /// Nothing: an automatic plan's decision leaves the node as it is.
    LeftAlone,
    /// Nothing it can do (no report yet, no layout that fits): reported, and the node released.
    Skipped,
}

fn want<'a>(
    plan: &'a GpuPartitionPlan,
    targets: &crate::FastMap<&str, &tessera_crds::plan::NodeTarget>,
    node: &'a NodeInput<'_>,
    actions: &mut Vec<Action>,
    report: &mut PlanReport,
    memo: &mut Memo<'a>,
) -> Want<'a> {
    if let Some(reason) = &node.dra_refused {
        refuse(plan, node, reason, actions, report);
        return Want::Skipped;
    }
    let Some(gn) = node.gpunode.as_ref().filter(|g| g.status.as_ref().is_some_and(|s| !s.gpus.is_empty())) else {
        report.skipped.insert(node.name.to_string(), "waiting for the node agent to report its GPUs".into());
        report.waiting_for_agents += 1;
        return Want::Skipped;
    };
    let wanted = match &plan.spec.layouts_from {
        None => memo.desired(&plan.spec, &gn.status.as_ref().expect("checked").gpus).map(Some),
        Some(_) => match crate::auto::desired_from(targets, node.name, gn) {
            Ask::Target(d) | Ask::Finish(d) => Ok(Some(Rc::new(d))),
            Ask::LeaveAlone => Ok(None),
            Ask::Release => {
                release(node, actions);
                Ok(None)
            }
        },
    };
    match wanted {
        Ok(Some(desired)) => Want::Change(gn, desired),
        Ok(None) => Want::LeftAlone,
        Err(reason) => {
            if reason.contains("does not fit") {
                report.invalid.push(format!("{}: {reason}", node.name));
            }
            report.skipped.insert(node.name.to_string(), reason);
            release(node, actions);
            Want::Skipped
        }
    }
}

/// A node whose DRA driver manages MIG itself (DynamicMIG): released and its intent emptied, so
/// its agent is handed nothing and creates nothing; a Warning Event when that changes anything.
fn refuse(
    plan: &GpuPartitionPlan,
    node: &NodeInput<'_>,
    reason: &str,
    actions: &mut Vec<Action>,
    report: &mut PlanReport,
) {
    report.skipped.insert(node.name.to_string(), format!("refused: {reason}"));
    report.dra_refused.push(format!("{}: {reason}", node.name));
    let before = actions.len();
    release(node, actions);
    if actions.len() == before {
        clear_intent(node, actions);
    }
    if actions.len() > before {
        actions.push(Action::Event {
            plan: plan.metadata.name.clone().unwrap_or_default(),
            node: node.name.to_string(),
            reason: "DraRefused",
            message: format!("not managed by Tessera: {reason}"),
            warning: true,
        });
    }
}

/// Plans a plan's owned nodes: picks the candidates, counts the budget, then plans each node
/// from its phase (see [`phases`]) and keeps the verdicts that can be reused.
fn plan_one<'a>(
    plan: &'a GpuPartitionPlan,
    nodes: &[Owned<'a, '_>],
    now: Timestamp,
    actions: &mut Vec<Action>,
    report: &mut PlanReport,
    memo: &mut Memo<'a>,
    keep: Keep<'_>,
) {
    let Keep { carry, plan: index } = keep;
    let name = plan.metadata.name.clone().unwrap_or_default();
    let generation = plan.metadata.generation;
    let policy = &plan.spec.rollout;
    // Nodes whose cached objects lag our own last write: in flight until the caches catch up.
    let targets = crate::auto::targets_of(plan);
    let (candidates, untouched, others_in_flight) = candidates(plan, &targets, nodes, actions, report, memo, carry);
    report.matched = (candidates.len() + untouched) as i32;
    report.updated += untouched as i32;
    report.demand = crate::auto::demand_condition(plan);
    let budget = max_unavailable(&policy.max_unavailable, candidates.len() + untouched).unwrap_or(1);
    // A node whose cache lags our last write counts as in flight whatever the cache shows. A
    // kept verdict is of a node at rest, which does not count.
    let mut busy = others_in_flight
        + candidates
            .iter()
            .filter(|c| match c {
                Candidate::Full(_, node, gn, desired) => {
                    node.cache_behind || unavailable(node, gn, desired, &name, generation)
                }
                Candidate::Updated | Candidate::Waiting(..) => false,
            })
            .count();
    report.budget = budget as i32;
    for candidate in candidates {
        let (position, node, gn, desired) = match candidate {
            Candidate::Updated => {
                report.updated += 1;
                carry.reused += 1;
                continue;
            }
            Candidate::Waiting(..) if busy >= budget || plan.spec.paused => {
                report.pending += 1;
                carry.reused += 1;
                continue;
            }
            // A slot is free: the waiting node is planned in full.
            Candidate::Waiting(position, node) => match want(plan, &targets, node, actions, report, memo) {
                Want::Change(gn, desired) => (position, node, gn, desired),
                // Not expected (its inputs made it a candidate before); planned in full next pass.
                Want::LeftAlone | Want::Skipped => {
                    carry.remember(position, node, None);
                    continue;
                }
            },
            Candidate::Full(position, node, gn, desired) => (position, node, gn, desired),
        };
        let before = (actions.len(), report.updated, report.pending, report.in_progress);
        let step = phases::Step { plan, name: &name, generation, node, gn, desired: &desired, now, budget };
        phases::plan_node(&step, &mut busy, actions, report);
        // Kept for the next pass: a verdict with no action, at rest (updated) or waiting.
        let quiet = actions.len() == before.0 && report.in_progress == before.3 && catalogued(gn, memo);
        let verdict = match (report.updated - before.1, report.pending - before.2) {
            (1, 0) if quiet => Some(Verdict::Updated(index)),
            (0, 1) if quiet => Some(Verdict::Waiting(index)),
            _ => None,
        };
        carry.remember(position, node, verdict);
    }
    report.unavailable = busy as i32;
}

/// The nodes a plan may change this pass (kept verdicts reused, the rest planned in full), how
/// many an automatic plan leaves alone, and how many owned nodes that are neither are in flight.
fn candidates<'a, 'i>(
    plan: &'a GpuPartitionPlan,
    targets: &crate::FastMap<&str, &tessera_crds::plan::NodeTarget>,
    nodes: &[Owned<'a, 'i>],
    actions: &mut Vec<Action>,
    report: &mut PlanReport,
    memo: &mut Memo<'a>,
    carry: &mut Carry,
) -> (Vec<Candidate<'a, 'i>>, usize, usize) {
    let mut candidates = Vec::new();
    let mut is_candidate = vec![true; nodes.len()];
    let mut untouched = 0;
    for (i, &(position, node, kept)) in nodes.iter().enumerate() {
        match kept {
            Some(Verdict::Updated(_)) => {
                candidates.push(Candidate::Updated);
                continue;
            }
            Some(Verdict::Waiting(_)) => {
                candidates.push(Candidate::Waiting(position, node));
                continue;
            }
            Some(Verdict::Unowned) | None => {}
        }
        let want = want(plan, targets, node, actions, report, memo);
        if let Want::Change(gn, desired) = want {
            candidates.push(Candidate::Full(position, node, gn, desired));
            continue;
        }
        // An automatic plan leaves alone the nodes its decision does not change.
        untouched += usize::from(matches!(want, Want::LeftAlone));
        is_candidate[i] = false;
        carry.remember(position, node, None);
    }
    // Owned nodes that are not candidates (no report, no layout that fits any more) still count
    // while in flight: they are still cordoned.
    let others_in_flight = nodes
        .iter()
        .zip(&is_candidate)
        .filter(|(_, candidate)| !**candidate)
        .filter(|((_, n, _), _)| {
            n.gpunode.as_ref().and_then(|g| g.status.as_ref()?.rollout.as_ref()).is_some_and(|r| in_flight(r.phase))
        })
        .count();
    (candidates, untouched, others_in_flight)
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
