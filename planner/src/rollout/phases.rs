//! One owned node's step of a rollout pass, one function per phase: `at_rest` (settle,
//! `take_back`, `start` or `wait`), `drain` (then `hand_over`), `apply` (`complete`, `fail` or
//! `wait_for_agent`), `uncordon`, and `release_cordon` for a failed node we still hold. Each
//! pushes its actions in order (intent before the act) and counts the node in the report.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tessera_crds::conditions::RECONCILING;
use tessera_crds::gpunode::{GpuIntent, NodePhase, NodeRollout};
use tessera_crds::{GpuNode, GpuPartitionPlan};

use super::dra_wait::{self, Hold};
use super::{
    Action, NodeInput, PlanReport, agent_condition, agent_stalled, applied, failed_here, finish, holds_intent, idle,
    intent_seen, reported_holds,
};
use crate::drain::{self, PodVerdict, verdict_with_claims};
use crate::liveness::AgentHealth;

/// What every phase of one node's step reads: the plan, the node and the intent it asks for.
pub(super) struct Step<'s> {
    pub plan: &'s GpuPartitionPlan,
    pub name: &'s str,
    pub generation: Option<i64>,
    pub node: &'s NodeInput<'s>,
    pub gn: &'s GpuNode,
    pub desired: &'s [GpuIntent],
    pub now: Timestamp,
    /// The plan's `maxUnavailable`: no node starts while `busy` meets it.
    pub budget: usize,
}

impl Step<'_> {
    fn event(&self, reason: &'static str, message: String, warning: bool) -> Action {
        Action::Event { plan: self.name.to_string(), node: self.node.name.to_string(), reason, message, warning }
    }

    /// The node's record, stamped with this plan and generation.
    fn base(&self, r: &NodeRollout) -> NodeRollout {
        NodeRollout { plan: Some(self.name.to_string()), plan_generation: self.generation, ..r.clone() }
    }

    fn rollout(&self, rollout: NodeRollout) -> Action {
        Action::Rollout { node: self.node.name.to_string(), rollout: Some(rollout) }
    }

    fn intent(&self) -> Action {
        Action::Intent { node: self.node.name.to_string(), plan: self.name.to_string(), gpus: self.desired.to_vec() }
    }

    /// Whether the record already says `Idle` for this plan and generation, with no cordon of
    /// ours left to undo.
    fn recorded_idle(&self, r: &NodeRollout) -> bool {
        r.phase == NodePhase::Idle
            && !r.cordoned_by_us
            && r.plan.as_deref() == Some(self.name)
            && r.plan_generation == self.generation
    }
}

/// Plans one node, from the phase its record shows. `busy` counts the plan's nodes against its
/// budget; a node started here takes a slot.
pub(super) fn plan_node(s: &Step<'_>, busy: &mut usize, actions: &mut Vec<Action>, report: &mut PlanReport) {
    // A node whose cache lags our last write is planned and reported as its cache shows
    // (so the plan's conditions do not flap), but what it would do is thrown away: it is
    // decided again once the caches show the write.
    let mut discarded = Vec::new();
    let actions: &mut Vec<Action> = if s.node.cache_behind { &mut discarded } else { actions };
    let current = s.gn.status.as_ref().and_then(|st| st.rollout.as_ref());
    if current.is_some_and(|c| s.recorded_idle(c)) && applied(s.gn, s.desired) {
        // At rest with this plan's layout, and its record says so: nothing to do or copy.
        report.updated += 1;
        return;
    }
    let r = current.cloned().unwrap_or_default();
    match r.phase {
        NodePhase::Idle | NodePhase::Pending | NodePhase::Failed => at_rest(s, r, busy, actions, report),
        NodePhase::Draining => drain(s, &r, actions, report),
        NodePhase::Applying => apply(s, &r, actions, report),
        NodePhase::Uncordoning => uncordon(s, &r, actions, report),
    }
}

/// `Idle`, `Pending` or `Failed`: settle a node that has the layout, take one back that holds it
/// already, start one when a slot is free, or let it wait. A cordon of ours still recorded (a
/// failure, or a withdrawn drain cut short) is undone first.
fn at_rest(s: &Step<'_>, mut r: NodeRollout, busy: &mut usize, actions: &mut Vec<Action>, report: &mut PlanReport) {
    let (n, gn, desired) = (s.node.name, s.gn, s.desired);
    if r.cordoned_by_us && release_cordon(s, &mut r, actions, report) {
        return;
    }
    // Built after the flag above is cleared: a stale `cordonedByUs` must never be
    // written back (it could later uncordon a node an admin cordoned).
    let base = s.base(&r);
    if holds_intent(gn, desired) {
        count_holding(s, report);
        if !s.recorded_idle(&r) {
            actions.push(s.rollout(idle(base)));
        }
        return;
    }
    if r.phase == NodePhase::Failed && failed_here(&r, s.name, s.generation) {
        report.failed.push((n.to_string(), r.message.clone()));
        return;
    }
    // Once the agent has seen the intent and says why it is not applied (a leak, a reset),
    // or its GPUs do not hold it, the node goes the usual way, drained and handed over.
    if !intent_seen(gn, desired) && reported_holds(gn, desired) && s.node.agent == AgentHealth::Alive {
        take_back(s, &r, base, actions, report);
        return;
    }
    if s.node.agent.is_not_responding() {
        // Never start a node whose agent cannot take the hand-over.
        report.unresponsive.push(format!("{n}: {} (not started)", s.node.agent.describe()));
        return;
    }
    if s.node.agent != AgentHealth::Alive {
        // Not seen renewing yet: it waits, and is judged within a lease duration.
        report.pending += 1;
        return;
    }
    if *busy < s.budget && !s.plan.spec.paused {
        *busy += 1;
        start(s, base, actions, report);
    } else {
        wait(s, &r, base, actions, report);
    }
}

/// Counts a node that holds its intent: updated, unless only its last report says so and its
/// agent is not responding now (nobody vouches for it: reported, never started, as a drain would
/// change nothing).
fn count_holding(s: &Step<'_>, report: &mut PlanReport) {
    if !applied(s.gn, s.desired) && s.node.agent.is_not_responding() {
        let n = s.node.name;
        report.unresponsive.push(format!("{n}: {} (holds its layout as last reported)", s.node.agent.describe()));
    } else {
        report.updated += 1;
    }
}

/// Taken back with the layout already in place: the intent and an `Idle` record, no cordon,
/// no drain; updated once the agent reports it applied.
fn take_back(s: &Step<'_>, r: &NodeRollout, base: NodeRollout, actions: &mut Vec<Action>, report: &mut PlanReport) {
    report.in_progress += 1;
    if s.gn.spec.gpus != *s.desired {
        actions.push(s.intent());
    }
    if !s.recorded_idle(r) {
        actions.push(s.rollout(idle(base)));
    }
}

/// No slot free (or the plan paused): the node waits for one.
fn wait(s: &Step<'_>, r: &NodeRollout, base: NodeRollout, actions: &mut Vec<Action>, report: &mut PlanReport) {
    if s.node.cache_behind {
        // Most likely just started by the write the cache has not shown yet.
        report.in_progress += 1;
    } else {
        report.pending += 1;
        // A node at rest waits without a write: at 5,000 nodes one `Pending` record
        // per waiting node was a tenth of a rollout's requests, all in its first
        // pass. The plan's status counts the waiting nodes. A `Failed` record of an
        // earlier generation is still replaced, so it is not read as this one's.
        if r.phase == NodePhase::Failed {
            let pending = NodeRollout { phase: NodePhase::Pending, message: String::new(), ..base };
            actions.push(s.rollout(pending));
        }
    }
}

/// A node at rest we still hold cordoned (`Failed`, or a withdrawn drain cut short): uncordon
/// it and clear the flag. True when the node is decided for this pass (the uncordon is not seen
/// yet).
fn release_cordon(s: &Step<'_>, r: &mut NodeRollout, actions: &mut Vec<Action>, report: &mut PlanReport) -> bool {
    let n = s.node.name;
    if s.node.unschedulable {
        actions.push(Action::Uncordon { node: n.to_string() });
    }
    r.cordoned_by_us = false;
    actions.push(s.rollout(r.clone()));
    if s.node.unschedulable {
        // Decide on this node again once the uncordon is seen: starting it now
        // would read the stale `unschedulable` and never cordon it.
        if r.phase == NodePhase::Failed && failed_here(r, s.name, s.generation) {
            report.failed.push((n.to_string(), r.message.clone()));
        } else if holds_intent(s.gn, s.desired) {
            count_holding(s, report);
        } else {
            report.pending += 1;
        }
        return true;
    }
    false
}

/// A slot is free: record `Draining` (and whether the cordon is ours), then cordon.
fn start(s: &Step<'_>, base: NodeRollout, actions: &mut Vec<Action>, report: &mut PlanReport) {
    let n = s.node.name;
    report.in_progress += 1;
    let rollout = NodeRollout {
        phase: NodePhase::Draining,
        cordoned_by_us: !s.node.unschedulable,
        drain_started_at: Some(Time(s.now)),
        apply_started_at: None,
        dra_wait_started_at: None,
        message: String::new(),
        ..base
    };
    actions.push(s.rollout(rollout));
    let message = if s.node.unschedulable {
        format!("draining GPU pods from {n} (already cordoned)")
    } else {
        actions.push(Action::Cordon { node: n.to_string() });
        format!("cordoned {n} and draining its GPU pods to change its MIG layout")
    };
    actions.push(s.event("DrainStarted", message, false));
}

/// The pods still on a draining node, by what the drain does with them.
#[derive(Default)]
struct PodsLeft {
    /// (namespace, pod, the owner when it came back after the drain started).
    evict: Vec<(String, String, Option<String>)>,
    waiting: Vec<(String, String)>,
    refused: Vec<String>,
    stuck: Vec<String>,
    /// GPU claims on the node reserved for pods the scheduler has not bound yet
    /// ([`crate::gpu_use::ClaimIndex::binding_on`]): they hold the hand-over, not the evictions.
    binding: Vec<String>,
}

fn pods_left(s: &Step<'_>, pods: &[k8s_openapi::api::core::v1::Pod], started: Option<Timestamp>) -> PodsLeft {
    let mut left = PodsLeft::default();
    for p in pods {
        let ns = p.metadata.namespace.clone().unwrap_or_default();
        let pod = p.metadata.name.clone().unwrap_or_default();
        match verdict_with_claims(p, &s.plan.spec.rollout, &s.node.daemonsets, &s.node.claims) {
            PodVerdict::Evict => left.evict.push((ns, pod, started.and_then(|st| drain::came_back(p, st)))),
            PodVerdict::Wait => {
                left.stuck.extend(drain::stuck_terminating(p, s.now));
                left.waiting.push((ns, pod));
            }
            PodVerdict::Refuse(why) => left.refused.push(why),
            PodVerdict::Skip(_) => {}
        }
    }
    // Past the drain timeout with `forceAfterTimeout`, no longer: those pods have not run yet,
    // so no work is lost (they fail to prepare their device or start on the new layout).
    if !(timed_out(s, started) && s.plan.spec.rollout.force_after_timeout) {
        left.binding = s.node.claims.binding_on(s.node.name, pods);
    }
    left
}

/// Whether the drain started at `started` has run past the plan's `drainTimeoutSeconds`.
fn timed_out(s: &Step<'_>, started: Option<Timestamp>) -> bool {
    let policy = &s.plan.spec.rollout;
    let drain_timeout = SignedDuration::from_secs(policy.drain_timeout_seconds.max(0));
    policy.drain_timeout_seconds > 0 && s.now.duration_since(started.unwrap_or(s.now)) > drain_timeout
}

/// `Draining`: keep the node cordoned, hand it over once empty, else report what holds it and
/// evict (or force) what may go.
fn drain(s: &Step<'_>, r: &NodeRollout, actions: &mut Vec<Action>, report: &mut PlanReport) {
    let n = s.node.name;
    let base = s.base(r);
    if no_longer_needed(s) {
        withdraw(s, r, base, actions, report);
        return;
    }
    report.in_progress += 1;
    let pods = match &s.node.pods {
        Ok(pods) => pods,
        Err(e) => {
            report.drain_blocked.push(format!("{n}: could not list its pods: {e}"));
            return;
        }
    };
    let started = r.drain_started_at.as_ref().map(|t| t.0);
    let left = pods_left(s, pods, started);
    if !s.node.unschedulable {
        // Never hand over a schedulable node: someone uncordoned it mid-drain (or our
        // view is stale). Cordon it (again) as ours and decide next pass.
        let ours = NodeRollout { cordoned_by_us: true, ..base };
        actions.push(s.rollout(ours));
        actions.push(Action::Cordon { node: n.to_string() });
        return;
    }
    if left.evict.is_empty() && left.waiting.is_empty() && left.refused.is_empty() && left.binding.is_empty() {
        hand_over(s, base, actions, report);
        return;
    }
    if s.node.agent.is_not_responding() {
        // Nobody could take the hand-over: evicting more pods now disrupts them for nothing.
        // The node stays cordoned and the drain goes on once the agent is back.
        report.unresponsive.push(format!("{n}: {} (draining paused until the agent is back)", s.node.agent.describe()));
        return;
    }
    evict(s, r, started, left, actions, report);
}

/// Whether a drain started for this node has nothing left to do: the node holds its intent
/// (see [`holds_intent`]), or its GPUs already hold what the plan asks (taken back, as
/// `take_back` does at rest). Whatever started the drain (a plan changed back, a report read
/// while the agent was judged dead), it is withdrawn, whatever the agent's health now: the drain
/// would evict pods for no change, and an intent the GPUs already hold changes nothing (without
/// the hand-over an agent only creates instances in free space).
fn no_longer_needed(s: &Step<'_>) -> bool {
    let (gn, desired) = (s.gn, s.desired);
    holds_intent(gn, desired) || (!intent_seen(gn, desired) && reported_holds(gn, desired))
}

/// A drain no longer needed, withdrawn before the hand-over: the intent written where it differs
/// (taken back), the record `Idle` still naming our cordon, then the uncordon and the flag
/// cleared (record before act, as `fail` does: a crash in between leaves an `Idle` record whose
/// cordon `at_rest` undoes, never a cordon we forget), and an Event that says why. Pods already
/// evicted are not brought back.
fn withdraw(s: &Step<'_>, r: &NodeRollout, base: NodeRollout, actions: &mut Vec<Action>, report: &mut PlanReport) {
    let n = s.node.name;
    if holds_intent(s.gn, s.desired) {
        count_holding(s, report);
    } else {
        report.in_progress += 1;
    }
    if s.gn.spec.gpus != *s.desired {
        actions.push(s.intent());
    }
    let withdrawn = NodeRollout { cordoned_by_us: r.cordoned_by_us, ..idle(base) };
    actions.push(s.rollout(withdrawn.clone()));
    if r.cordoned_by_us {
        actions.push(Action::Uncordon { node: n.to_string() });
        actions.push(s.rollout(NodeRollout { cordoned_by_us: false, ..withdrawn }));
    }
    let uncordoned = if r.cordoned_by_us { "; uncordoned" } else { "" };
    let message = format!("{n} already holds its MIG layout as its node agent reports it: drain withdrawn{uncordoned}");
    actions.push(s.event("DrainWithdrawn", message, false));
}

/// A drained node: handed to an agent alive now, the intent written before the `Applying` record.
fn hand_over(s: &Step<'_>, base: NodeRollout, actions: &mut Vec<Action>, report: &mut PlanReport) {
    let n = s.node.name;
    if s.node.agent != AgentHealth::Alive {
        // Handed over only to an agent alive now: a dead one would leave the
        // node `Applying`, cordoned, with nobody to apply. It stays drained.
        if s.node.agent.is_not_responding() {
            report
                .unresponsive
                .push(format!("{n}: {} (drained; not handed over until the agent is back)", s.node.agent.describe()));
        }
        return;
    }
    actions.push(s.intent());
    let applying =
        NodeRollout { phase: NodePhase::Applying, apply_started_at: Some(Time(s.now)), message: String::new(), ..base };
    actions.push(s.rollout(applying));
    actions.push(s.event("Applying", format!("{n} drained; handed to its node agent"), false));
}

/// Pods still on a draining node: report what holds it, then evict what may go (or force
/// everything, past the timeout when the plan says so). Nothing is evicted while a pod refuses.
fn evict(
    s: &Step<'_>,
    r: &NodeRollout,
    started: Option<Timestamp>,
    left: PodsLeft,
    actions: &mut Vec<Action>,
    report: &mut PlanReport,
) {
    let (n, policy) = (s.node.name, &s.plan.spec.rollout);
    let PodsLeft { evict, waiting, refused, stuck, binding } = left;
    let timed_out = timed_out(s, started);
    // What holds the drain, as the pods show it: recorded on the node by the
    // controller (with the evictions the API refuses), so it reads the same there.
    let returning = s.node.returns.iter().filter_map(|(owner, n)| drain::keeps_coming_back(owner, *n));
    let blockers: Vec<String> =
        refused.iter().cloned().chain(stuck).chain(binding.iter().cloned()).chain(returning).collect();
    // The plan says what the node's record says, and what the record does not say yet.
    if !r.message.is_empty() {
        report.drain_blocked.push(format!("{n}: {}", r.message));
    }
    for why in blockers.iter().filter(|b| !r.message.contains(b.as_str())) {
        report.drain_blocked.push(format!("{n}: {why}"));
    }
    actions.push(Action::Blockers { node: n.to_string(), reasons: blockers });
    if !refused.is_empty() {
        // Like kubectl drain: evict nothing while a pod refuses, since the drain
        // cannot finish (and force must not break other pods' budgets for nothing).
        if timed_out {
            report.drain_timeouts.push(format!(
                "{n}: drain exceeded {}s with {} pod(s) left ({})",
                policy.drain_timeout_seconds,
                evict.len() + waiting.len() + refused.len(),
                refused.join("; ")
            ));
        }
        return;
    }
    let force = timed_out && policy.force_after_timeout;
    if timed_out && !force {
        report.drain_timeouts.push(format!(
            "{n}: drain exceeded {}s with {} pod(s) left{}",
            policy.drain_timeout_seconds,
            evict.len() + waiting.len(),
            match (binding.is_empty(), r.message.is_empty()) {
                (false, _) => format!(" ({})", binding.join("; ")),
                (true, false) => format!(" ({})", r.message),
                (true, true) => String::new(),
            }
        ));
    }
    if force {
        // Terminating pods too: a long grace period or a dead kubelet must not hold
        // a drain the plan asked to force.
        for (namespace, pod) in evict.into_iter().map(|(ns, pod, _)| (ns, pod)).chain(waiting) {
            actions.push(Action::ForceDelete { node: n.to_string(), namespace, pod });
        }
    } else {
        for (namespace, pod, came_back) in evict {
            actions.push(Action::Evict { node: n.to_string(), namespace, pod, came_back });
        }
    }
}

/// `Applying`: the agent applied the layout (complete), asks for a GPU reset (keep the node),
/// stalled (fail), or is still at it (wait for the agent).
fn apply(s: &Step<'_>, r: &NodeRollout, actions: &mut Vec<Action>, report: &mut PlanReport) {
    let (n, gn, desired) = (s.node.name, s.gn, s.desired);
    let base = s.base(r);
    if applied(gn, desired) {
        complete(s, base, actions, report);
    } else if let Some(why) = agent_stalled(gn).filter(|w| gn.spec.gpus == *desired && w.starts_with("ResetRequired")) {
        // Mid-change GPUs: keep the node cordoned and ask for the reset; the agent
        // finishes by itself afterwards.
        report.in_progress += 1;
        report.reset_required.push(format!("{n}: {why}"));
    } else if let Some(why) = agent_stalled(gn).filter(|_| gn.spec.gpus == *desired) {
        fail(s, r, base, why, actions, report);
    } else {
        wait_for_agent(s, r, base, actions, report);
    }
}

/// The agent applied the layout: record `Uncordoning`, then uncordon, unless the node's GPU DRA
/// driver has not re-published yet (see [`uncordon`]); the record says so in the same write.
fn complete(s: &Step<'_>, base: NodeRollout, actions: &mut Vec<Action>, report: &mut PlanReport) {
    let next = NodeRollout { phase: NodePhase::Uncordoning, dra_wait_started_at: None, ..base };
    uncordon_from(s, &next, false, actions, report);
}

/// The agent stalled on the layout: record `Failed`, then uncordon what we cordoned.
fn fail(
    s: &Step<'_>,
    r: &NodeRollout,
    base: NodeRollout,
    why: String,
    actions: &mut Vec<Action>,
    report: &mut PlanReport,
) {
    let n = s.node.name;
    // Withdraw the hand-over (phase Failed) before the uncordon: from here the
    // agent changes nothing disruptive on this schedulable node.
    report.failed.push((n.to_string(), why.clone()));
    let failed = NodeRollout { phase: NodePhase::Failed, message: why.clone(), ..base };
    actions.push(s.rollout(failed.clone()));
    if r.cordoned_by_us {
        actions.push(Action::Uncordon { node: n.to_string() });
        let released = NodeRollout { cordoned_by_us: false, ..failed };
        actions.push(s.rollout(released));
    }
    actions.push(s.event("Failed", format!("{n}: {why}"), true));
}

/// The agent is still applying: keep the intent as asked, stamp the start of the apply, and
/// report an unresponsive agent, a timeout or what the agent says.
fn wait_for_agent(
    s: &Step<'_>,
    r: &NodeRollout,
    base: NodeRollout,
    actions: &mut Vec<Action>,
    report: &mut PlanReport,
) {
    let (n, gn, policy, now) = (s.node.name, s.gn, &s.plan.spec.rollout, s.now);
    report.in_progress += 1;
    if gn.spec.gpus != *s.desired {
        actions.push(s.intent());
    }
    let since = match &r.apply_started_at {
        Some(t) => t.0,
        None => {
            let stamped = NodeRollout { apply_started_at: Some(Time(now)), ..base };
            actions.push(s.rollout(stamped));
            now
        }
    };
    let apply_timeout = SignedDuration::from_secs(policy.apply_timeout_seconds.max(0));
    // What the agent says while it works (a retried driver error, say).
    let progress = agent_condition(gn, RECONCILING);
    if s.node.agent.is_not_responding() {
        report.unresponsive.push(format!(
            "{n}: {} (applying since {since}; the node stays cordoned until the agent is back)",
            s.node.agent.describe()
        ));
    } else if policy.apply_timeout_seconds > 0 && now.duration_since(since) > apply_timeout {
        report.apply_timeouts.push(format!(
            "{n}: applying since {since}, over {}s{}",
            policy.apply_timeout_seconds,
            progress.as_ref().map(|p| format!("; the agent says {p}")).unwrap_or_default()
        ));
    } else if let Some(p) = progress {
        report.agent_progress.push(format!("{n}: {p}"));
    }
}

/// `Uncordoning`: the change is done; uncordon what we cordoned and record `Idle`.
fn uncordon(s: &Step<'_>, r: &NodeRollout, actions: &mut Vec<Action>, report: &mut PlanReport) {
    uncordon_from(s, &s.base(r), true, actions, report);
}

/// From the `Uncordoning` record `r` (`recorded`: as the cache shows it; else still to write):
/// keep our cordon while the node's slices do not list the new layout (bounded, see
/// `dra_wait`), else uncordon, record `Idle`, and count the change once that is written.
fn uncordon_from(s: &Step<'_>, r: &NodeRollout, recorded: bool, actions: &mut Vec<Action>, report: &mut PlanReport) {
    let n = s.node.name;
    match dra_wait::hold(n, &s.node.dra_slices, r, s.node.unschedulable, s.now) {
        Hold::Wait { since, why } => {
            report.in_progress += 1;
            let message = dra_wait::waiting_message(since, &why);
            if !recorded || r.dra_wait_started_at.is_none() || r.message != message {
                let waiting = NodeRollout { dra_wait_started_at: Some(Time(since)), message, ..r.clone() };
                actions.push(s.rollout(waiting));
            }
        }
        Hold::Finish(late) => {
            report.updated += 1;
            if !recorded {
                actions.push(s.rollout(r.clone()));
            }
            finish(n, r.cordoned_by_us, r.clone(), actions);
            // After the `Idle` write: a pass that fails before it does not count the change.
            if let Some(started) = &r.drain_started_at {
                let seconds = s.now.duration_since(started.0).as_secs_f64().max(0.0);
                actions.push(Action::Completed { node: n.to_string(), seconds });
            }
            if let Some(warning) = late {
                actions.push(s.event("DraSlicesStale", warning, true));
            }
            actions.push(s.event("Applied", format!("{n} has its new MIG layout"), false));
        }
    }
}
