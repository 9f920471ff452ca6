//! Pure rollout planner: from a snapshot of plans, nodes, `GpuNode`s and the pods of draining
//! nodes, decide what to do next for every node, and what to report per plan. No I/O; the
//! controller executes the actions in order. Intent is always recorded before the act it
//! describes (`Draining` + `cordonedByUs` before the cordon), so a crash between the two is
//! resumed correctly and a node is never left cordoned by us.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use tessera_crds::conditions::{self, READY, STALLED};
use tessera_crds::gpunode::{GpuIntent, GpuState, NodePhase, NodeRollout};
use tessera_crds::plan::GpuPartitionPlanSpec;
use tessera_crds::validate::max_unavailable;
use tessera_crds::{GpuNode, GpuPartitionPlan, catalog, solver};

use crate::drain::{PodVerdict, verdict};
use crate::selector::matches;

/// One Kubernetes node as the planner sees it.
#[derive(Debug, Clone)]
pub struct NodeInput {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub unschedulable: bool,
    pub gpunode: Option<GpuNode>,
    /// Pods on the node; listed only for nodes that are draining.
    pub pods: Vec<Pod>,
}

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
    pub conflicts: Vec<String>,
    pub invalid: Vec<String>,
    pub drain_timeouts: Vec<String>,
    pub drain_blocked: Vec<String>,
    /// Nodes kept cordoned until an admin resets their GPUs or reboots them.
    pub reset_required: Vec<String>,
    /// Matched nodes whose agent has not reported its GPUs yet: work still to do.
    pub waiting_for_agents: i32,
}

fn in_flight(phase: NodePhase) -> bool {
    matches!(phase, NodePhase::Draining | NodePhase::Applying | NodePhase::Uncordoning)
}

/// The intent a plan asks for on a node, from the GPUs its agent reported. `Err` names why the
/// node cannot be acted on (no layout for its product, or a layout that cannot fit it).
pub fn desired_intent(spec: &GpuPartitionPlanSpec, gpus: &[GpuState]) -> Result<Vec<GpuIntent>, String> {
    let same_product = |layout: &str, gpu: &str| match (catalog::lookup(layout), catalog::lookup(gpu)) {
        (Some(a), Some(b)) => a.name == b.name,
        _ => layout.eq_ignore_ascii_case(gpu),
    };
    let mut out = Vec::new();
    for g in gpus {
        let chosen = spec
            .layouts
            .iter()
            .find(|l| {
                same_product(&l.gpu_product, &g.product) && l.gpu_indices.as_ref().is_some_and(|i| i.contains(&g.index))
            })
            .or_else(|| {
                spec.layouts.iter().find(|l| same_product(&l.gpu_product, &g.product) && l.gpu_indices.is_none())
            });
        let Some(layout) = chosen else { continue };
        let profiles: BTreeMap<String, i32> =
            layout.profiles.iter().filter(|(_, n)| **n > 0).map(|(k, n)| (k.clone(), *n)).collect();
        if layout.mig_enabled && !g.mig_capable {
            return Err(format!("GPU {} ({}) is not MIG capable", g.index, g.product));
        }
        if let (true, Some(model)) = (layout.mig_enabled, catalog::lookup(&g.product)) {
            let counts = profiles.iter().map(|(k, n)| (catalog::normalize_profile(k), *n as u32)).collect();
            if let Err(e) = solver::fit(model, &counts) {
                return Err(format!("the layout for GPU {} does not fit: {e}", g.index));
            }
        }
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

fn agent_stalled(gn: &GpuNode) -> Option<String> {
    let st = gn.status.as_ref()?;
    conditions::find(&st.conditions, STALLED)
        .filter(|c| c.status == "True" && c.observed_generation == gn.metadata.generation)
        .map(|c| format!("{}: {}", c.reason, c.message))
}

/// Plans the whole fleet.
pub fn plan_fleet(
    plans: &[GpuPartitionPlan],
    nodes: &[NodeInput],
    now: Timestamp,
) -> (Vec<Action>, BTreeMap<String, PlanReport>) {
    let live: Vec<&GpuPartitionPlan> = plans.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
    let mut reports: BTreeMap<String, PlanReport> =
        plans.iter().map(|p| (p.metadata.name.clone().unwrap_or_default(), PlanReport::default())).collect();
    let mut actions = Vec::new();
    // Ownership: highest priority wins; a tie at the top is a conflict and nobody acts.
    let mut owned: BTreeMap<String, Vec<&NodeInput>> = BTreeMap::new();
    for node in nodes {
        let matching: Vec<&&GpuPartitionPlan> =
            live.iter().filter(|p| matches(&p.spec.node_selector, &node.labels)).collect();
        let top = matching.iter().map(|p| p.spec.priority).max();
        let winners: Vec<&&GpuPartitionPlan> =
            matching.iter().copied().filter(|p| Some(p.spec.priority) == top).collect();
        match winners.as_slice() {
            [] => release(node, &mut actions),
            [one] => owned.entry(one.metadata.name.clone().unwrap_or_default()).or_default().push(node),
            many => {
                for p in many {
                    let r = reports
                        .get_mut(p.metadata.name.as_deref().unwrap_or_default())
                        .expect("every plan has a report");
                    r.conflicts.push(node.name.clone());
                }
                release(node, &mut actions);
            }
        }
    }
    for plan in &live {
        let name = plan.metadata.name.clone().unwrap_or_default();
        let nodes = owned.remove(&name).unwrap_or_default();
        let report = reports.get_mut(&name).expect("every plan has a report");
        plan_one(plan, &nodes, now, &mut actions, report);
    }
    (actions, reports)
}

/// A node no plan owns any more: finish an in-flight apply, uncordon what we cordoned, forget.
fn release(node: &NodeInput, actions: &mut Vec<Action>) {
    let Some(gn) = &node.gpunode else { return };
    let Some(r) = gn.status.as_ref().and_then(|s| s.rollout.clone()) else { return };
    if r.phase == NodePhase::Applying && !applied(gn, &gn.spec.gpus) && agent_stalled(gn).is_none() {
        return; // the agent is reconfiguring a drained node: let it finish first
    }
    if r.cordoned_by_us && node.unschedulable {
        actions.push(Action::Uncordon { node: node.name.clone() });
    }
    actions.push(Action::Rollout { node: node.name.clone(), rollout: None });
}

fn plan_one(
    plan: &GpuPartitionPlan,
    nodes: &[&NodeInput],
    now: Timestamp,
    actions: &mut Vec<Action>,
    report: &mut PlanReport,
) {
    let name = plan.metadata.name.clone().unwrap_or_default();
    let generation = plan.metadata.generation;
    let policy = &plan.spec.rollout;
    let mut candidates = Vec::new();
    for node in nodes {
        let Some(gn) = node.gpunode.as_ref().filter(|g| g.status.as_ref().is_some_and(|s| !s.gpus.is_empty())) else {
            report.skipped.insert(node.name.clone(), "waiting for the node agent to report its GPUs".into());
            report.waiting_for_agents += 1;
            continue;
        };
        match desired_intent(&plan.spec, &gn.status.as_ref().expect("checked").gpus) {
            Ok(desired) => candidates.push((*node, gn, desired)),
            Err(reason) => {
                if reason.contains("does not fit") {
                    report.invalid.push(format!("{}: {reason}", node.name));
                }
                report.skipped.insert(node.name.clone(), reason);
                release(node, actions);
            }
        }
    }
    report.matched = candidates.len() as i32;
    let budget = max_unavailable(&policy.max_unavailable, candidates.len()).unwrap_or(1);
    let mut busy = candidates
        .iter()
        .filter(|(_, gn, _)| gn.status.as_ref().and_then(|s| s.rollout.as_ref()).is_some_and(|r| in_flight(r.phase)))
        .count();
    let timeout = k8s_openapi::jiff::SignedDuration::from_secs(policy.drain_timeout_seconds.max(0));
    for (node, gn, desired) in candidates {
        let n = node.name.clone();
        let mut r = gn.status.as_ref().and_then(|s| s.rollout.clone()).unwrap_or_default();
        let base = NodeRollout { plan: Some(name.clone()), plan_generation: generation, ..r.clone() };
        let event = |reason: &'static str, message: String, warning: bool| Action::Event {
            plan: name.clone(),
            node: n.clone(),
            reason,
            message,
            warning,
        };
        match r.phase {
            NodePhase::Idle | NodePhase::Pending | NodePhase::Failed => {
                if r.phase == NodePhase::Failed && r.cordoned_by_us && node.unschedulable {
                    actions.push(Action::Uncordon { node: n.clone() });
                    r.cordoned_by_us = false;
                    actions.push(Action::Rollout { node: n.clone(), rollout: Some(r.clone()) });
                }
                if applied(gn, &desired) {
                    report.updated += 1;
                    if r.phase != NodePhase::Idle || r.plan.as_deref() != Some(&name) {
                        actions.push(Action::Rollout {
                            node: n.clone(),
                            rollout: Some(NodeRollout { phase: NodePhase::Idle, message: String::new(), ..base }),
                        });
                    }
                    continue;
                }
                if r.phase == NodePhase::Failed && r.plan_generation == generation {
                    report.failed.push((n.clone(), r.message.clone()));
                    continue;
                }
                if gn.spec.gpus == desired && agent_stalled(gn).is_none() {
                    // Already handed over (e.g. GPUs re-applied after a reboot): the agent is on it.
                    report.in_progress += 1;
                    continue;
                }
                if busy < budget && !plan.spec.paused {
                    busy += 1;
                    report.in_progress += 1;
                    let rollout = NodeRollout {
                        phase: NodePhase::Draining,
                        cordoned_by_us: !node.unschedulable,
                        drain_started_at: Some(Time(now)),
                        message: String::new(),
                        ..base
                    };
                    actions.push(Action::Rollout { node: n.clone(), rollout: Some(rollout) });
                    if !node.unschedulable {
                        actions.push(Action::Cordon { node: n.clone() });
                        actions.push(event("Cordoned", format!("cordoned {n} to change its MIG layout"), false));
                    }
                    actions.push(event("DrainStarted", format!("draining GPU pods from {n}"), false));
                } else {
                    report.pending += 1;
                    if r.phase != NodePhase::Pending {
                        actions.push(Action::Rollout {
                            node: n.clone(),
                            rollout: Some(NodeRollout { phase: NodePhase::Pending, ..base }),
                        });
                    }
                }
            }
            NodePhase::Draining => {
                report.in_progress += 1;
                if r.cordoned_by_us && !node.unschedulable {
                    actions.push(Action::Cordon { node: n.clone() });
                }
                let mut evict = Vec::new();
                let mut waiting = 0;
                for p in &node.pods {
                    let ns = p.metadata.namespace.clone().unwrap_or_default();
                    let pod = p.metadata.name.clone().unwrap_or_default();
                    match verdict(p, policy.drain_scope) {
                        PodVerdict::Evict => evict.push((ns, pod)),
                        PodVerdict::Wait => waiting += 1,
                        PodVerdict::Skip(_) => {}
                    }
                }
                if evict.is_empty() && waiting == 0 {
                    actions.push(Action::Intent { node: n.clone(), plan: name.clone(), gpus: desired.clone() });
                    actions.push(Action::Rollout {
                        node: n.clone(),
                        rollout: Some(NodeRollout { phase: NodePhase::Applying, message: String::new(), ..base }),
                    });
                    actions.push(event("Applying", format!("{n} drained; handed to its node agent"), false));
                    continue;
                }
                let started = r.drain_started_at.as_ref().map(|t| t.0).unwrap_or(now);
                let timed_out = policy.drain_timeout_seconds > 0 && now.duration_since(started) > timeout;
                if !r.message.is_empty() {
                    report.drain_blocked.push(format!("{n}: {}", r.message));
                }
                if timed_out && policy.force_after_timeout {
                    for (namespace, pod) in evict {
                        actions.push(Action::ForceDelete { node: n.clone(), namespace, pod });
                    }
                } else {
                    if timed_out {
                        report.drain_timeouts.push(format!(
                            "{n}: drain exceeded {}s with {} pod(s) left{}",
                            policy.drain_timeout_seconds,
                            evict.len() + waiting,
                            if r.message.is_empty() { String::new() } else { format!(" ({})", r.message) }
                        ));
                    }
                    for (namespace, pod) in evict {
                        actions.push(Action::Evict { node: n.clone(), namespace, pod });
                    }
                }
            }
            NodePhase::Applying => {
                if applied(gn, &desired) {
                    report.updated += 1;
                    actions.push(Action::Rollout {
                        node: n.clone(),
                        rollout: Some(NodeRollout { phase: NodePhase::Uncordoning, ..base.clone() }),
                    });
                    if let Some(started) = &r.drain_started_at {
                        let seconds = now.duration_since(started.0).as_secs_f64().max(0.0);
                        actions.push(Action::Completed { node: n.clone(), seconds });
                    }
                    finish(&n, r.cordoned_by_us, base, actions);
                    actions.push(event("Applied", format!("{n} has its new MIG layout"), false));
                } else if let Some(why) =
                    agent_stalled(gn).filter(|w| gn.spec.gpus == desired && w.starts_with("ResetRequired"))
                {
                    // Mid-change GPUs: keep the node cordoned and ask for the reset; the agent
                    // finishes by itself afterwards.
                    report.in_progress += 1;
                    report.reset_required.push(format!("{n}: {why}"));
                } else if let Some(why) = agent_stalled(gn).filter(|_| gn.spec.gpus == desired) {
                    report.failed.push((n.clone(), why.clone()));
                    actions.push(Action::Rollout {
                        node: n.clone(),
                        rollout: Some(NodeRollout { phase: NodePhase::Failed, message: why.clone(), ..base.clone() }),
                    });
                    if r.cordoned_by_us {
                        actions.push(Action::Uncordon { node: n.clone() });
                        actions.push(Action::Rollout {
                            node: n.clone(),
                            rollout: Some(NodeRollout {
                                phase: NodePhase::Failed,
                                cordoned_by_us: false,
                                message: why.clone(),
                                ..base
                            }),
                        });
                    }
                    actions.push(event("Failed", format!("{n}: {why}"), true));
                } else {
                    report.in_progress += 1;
                    if gn.spec.gpus != desired {
                        actions.push(Action::Intent { node: n.clone(), plan: name.clone(), gpus: desired.clone() });
                    }
                }
            }
            NodePhase::Uncordoning => {
                report.updated += 1;
                finish(&n, r.cordoned_by_us, base, actions);
            }
        }
    }
}

/// The last step of a node's rollout: uncordon it if we cordoned it, then forget the drain.
fn finish(node: &str, cordoned_by_us: bool, base: NodeRollout, actions: &mut Vec<Action>) {
    if cordoned_by_us {
        actions.push(Action::Uncordon { node: node.to_string() });
    }
    let idle = NodeRollout {
        phase: NodePhase::Idle,
        cordoned_by_us: false,
        drain_started_at: None,
        message: String::new(),
        ..base
    };
    actions.push(Action::Rollout { node: node.to_string(), rollout: Some(idle) });
}

#[cfg(test)]
mod tests;
