//! One pass of the rollout controller, in steps run in turn: read the fleet (`read_fleet`,
//! `node_inputs`, `list_draining_pods`), plan it (`plan`), run each node's actions in order
//! (`act_per_node`), record what they came to (`record_outcomes`), then write each plan's status
//! (`write_statuses`).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use tessera_crds::GpuPartitionPlan;
use tessera_crds::gpunode::NodePhase;
use tracing::warn;

use super::fleet_cache::FleetCache;
use super::{Context, EVICTION_TIMED_OUT, NODES_IN_PARALLEL, node_of};
use crate::Error;
use crate::expectations::Progress;
use crate::writer::bodies::StatusApply;
use crate::writer::{Manager, Write};
use tessera_planner::events::NodeEvent;
use tessera_planner::liveness::AgentHealth;
use tessera_planner::rollout::{self, Action, NodeInput, PlanReport};
use tessera_planner::status::plan_status;

/// What one node's actions of a pass came to.
struct GroupResult {
    node: String,
    /// Why evictions were refused.
    refused: Vec<String>,
    /// What the planner found holding its drain (`Action::Blockers`), if it is draining.
    blockers: Option<Vec<String>>,
    /// The Events its actions reached (published aggregated after the pass).
    events: Vec<NodeEvent>,
    /// The failure that stopped its actions.
    error: Option<Error>,
}

impl Context {
    /// One pass over the fleet: the steps in turn. A failed call is reported and the pass goes
    /// on; the pass fails (partially) with the number of them.
    pub(super) async fn pass(&self, fleet: &mut FleetCache) -> Result<(), Error> {
        let mut plans: Vec<GpuPartitionPlan> = self.caches.plans.state().iter().map(|p| (**p).clone()).collect();
        let mut plan_errors: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (plan, e) in self.ensure_finalizers(&plans).await? {
            plan_errors.entry(plan).or_default().push(format!("adding the finalizer: {e}"));
        }
        let (now, agents, behind) = self.read_fleet(fleet);
        let mut inputs = self.node_inputs(fleet, agents, behind);
        let dra = self.dra_verdicts(fleet, &mut inputs);
        self.list_draining_pods(fleet, &mut inputs).await;
        let (actions, mut reports) = self.plan(&mut plans, &inputs, now, &mut plan_errors).await;
        // The nodes by position (as the reports name them), borrowed from the cached Nodes.
        let names: Vec<&str> = inputs.iter().map(|n| n.name).collect();
        drop(inputs);
        let results = self.act_per_node(actions).await;
        let node_errors = self.record_outcomes(results, &plans).await;
        self.set_phase_metrics(fleet);
        attribute_errors(&mut reports, &names, &node_errors);
        // The lease ran out mid-pass: what follows would be written after it (see `leader`).
        self.writer().may_write()?;
        self.write_dra(&dra, &mut reports, fleet).await;
        let failed = self.write_statuses(&plans, &mut reports, plan_errors, now, fleet).await;
        match node_errors.len() + failed {
            0 => Ok(()),
            n => Err(Error::PartialPass(n)),
        }
    }

    /// Brings the fleet up to date with what the watches saw change; returns the pass's time,
    /// each node's agent health, and which nodes' caches do not show our last write yet.
    fn read_fleet(&self, fleet: &mut FleetCache) -> (Timestamp, Vec<AgentHealth>, Vec<bool>) {
        // Read before the caches are: each snapshot below is at least this far along.
        let progress = Progress {
            gpunodes: self.caches.gpunodes_progress.load(Ordering::Acquire),
            nodes: self.caches.nodes_progress.load(Ordering::Acquire),
        };
        // Read before the names are taken: a re-list it counts has named every lease.
        let lease_watch = *crate::locked(&self.caches.lease_watch);
        // What changed is taken before the caches are read: a change after this is read again
        // next pass (and may already be read now).
        let changed = self.caches.dirty.take();
        let refreshed = fleet.refresh(changed, &self.caches.nodes, &self.caches.gpunodes, &self.caches.leases);
        let now = Timestamp::now();
        let mut behind = vec![false; fleet.nodes.len()];
        let mut liveness = crate::locked(&self.memory.liveness);
        let mut expectations = crate::locked(&self.memory.expectations);
        fleet.forget_gone(&refreshed, &mut liveness);
        // Only the few nodes with a write not seen yet are looked at.
        if !expectations.is_empty() {
            expectations.retain(|n| fleet.position(n).is_some());
            for name in expectations.nodes() {
                let Some(i) = fleet.position(&name) else { continue };
                let cached = &fleet.nodes[i];
                let gpunode_rv = cached.gpunode.as_ref().and_then(|g| g.metadata.resource_version.as_deref());
                let node_rv = cached.node.metadata.resource_version.as_deref();
                behind[i] = !expectations.caught_up(&name, gpunode_rv, node_rv, progress);
            }
        }
        let agents = fleet.judge_agents(&mut liveness, now, lease_watch);
        let judged = fleet.nodes.iter().zip(&agents).map(|(s, h)| (s.name.as_str(), h, s.lease.as_deref()));
        self.memory.not_reporting.publish(judged, now, lease_watch);
        (now, agents, behind)
    }

    /// Each node as the planner sees it, borrowed from the fleet (pods are listed after).
    fn node_inputs<'s>(
        &self,
        fleet: &'s FleetCache,
        agents: Vec<AgentHealth>,
        behind: Vec<bool>,
    ) -> Vec<NodeInput<'s>> {
        let inputs: Vec<NodeInput<'s>> = fleet
            .nodes
            .iter()
            .zip(agents)
            .zip(behind)
            .map(|((cached, agent), cache_behind)| NodeInput {
                name: &cached.name,
                labels: cached.node.labels(),
                unschedulable: cached.unschedulable,
                gpunode: cached.gpunode.clone(),
                pods: Ok(vec![]),
                daemonsets: Default::default(),
                claims: Default::default(),
                returns: Default::default(),
                agent,
                cordon_annotated: cached.cordon_annotated,
                cache_behind,
                versions: cached.versions,
                dra_refused: None,
                dra_slices: Default::default(),
            })
            .collect();
        let behind = inputs.iter().filter(|n| n.cache_behind).count();
        self.metrics.nodes_cache_behind(behind);
        inputs
    }

    /// The pods of draining nodes, listed concurrently (one request per draining node), with
    /// the pods that came back to each.
    async fn list_draining_pods(&self, fleet: &FleetCache, inputs: &mut [NodeInput<'_>]) {
        let draining: Vec<usize> = (0..inputs.len())
            .filter(|&i| !inputs[i].cache_behind && fleet.nodes[i].phase == NodePhase::Draining)
            .collect();
        let listed: Vec<(usize, _)> = futures::stream::iter(draining)
            .map(|i| {
                let name = inputs[i].name.to_string();
                async move { (i, self.pods_on(&name).await) }
            })
            .buffer_unordered(NODES_IN_PARALLEL)
            .collect()
            .await;
        // Read after the pods, so the cache has had the longest to show their claims; a claim it
        // does not hold yet counts as GPU use (`gpu_use`: a bound pod's unknown claim).
        let claims =
            std::sync::Arc::new(if listed.is_empty() { Default::default() } else { self.caches.claims.index() });
        let mut returns = crate::locked(&self.memory.returns);
        returns.retain(|node| fleet.position(node).is_some_and(|i| fleet.nodes[i].phase == NodePhase::Draining));
        for (i, (pods, daemonsets)) in listed {
            inputs[i].pods = pods;
            inputs[i].daemonsets = daemonsets;
            inputs[i].claims = claims.clone();
            inputs[i].returns = returns.of(inputs[i].name);
        }
    }

    /// Automatic plans decide their layouts, then the fleet is planned; each report gets what
    /// the layout step found, and its errors go to `plan_errors`.
    async fn plan(
        &self,
        plans: &mut [GpuPartitionPlan],
        inputs: &[NodeInput<'_>],
        now: Timestamp,
        plan_errors: &mut BTreeMap<String, Vec<String>>,
    ) -> (Vec<Action>, BTreeMap<String, PlanReport>) {
        let mut layouts = self.decide_layouts(plans, inputs).await;
        let (cordoned_since, cordon_limit) = crate::alert_metrics::cordons(inputs, plans);
        self.metrics.set_cordons(&cordoned_since, &cordon_limit);
        // While an automatic plan waits to decide again, no new node starts on the old decision
        // (as if paused; nodes in flight finish).
        let (actions, mut reports) = {
            let mut kept = crate::locked(&self.memory.kept);
            let planned = if layouts.deciding.is_empty() {
                rollout::plan_fleet_with(plans, inputs, now, &mut kept)
            } else {
                let mut held = plans.to_vec();
                held.iter_mut()
                    .filter(|p| layouts.deciding.contains_key(&p.name_any()))
                    .for_each(|p| p.spec.paused = true);
                rollout::plan_fleet_with(&held, inputs, now, &mut kept)
            };
            self.metrics.nodes_planned(kept.planned, kept.reused);
            planned
        };
        let fragmented = self.fragmented_slices(plans, &reports, inputs);
        self.metrics.set_fragmented(&fragmented);
        for (name, report) in reports.iter_mut() {
            report.deciding = layouts.deciding.remove(name);
            report.fragmented_slices = fragmented.get(name).copied().unwrap_or(0).clamp(0, i64::from(i32::MAX)) as i32;
            plan_errors.entry(name.clone()).or_default().extend(layouts.errors.remove(name).unwrap_or_default());
        }
        (actions, reports)
    }

    /// One node's actions run in order (intent before act) and stop at its first failure;
    /// different nodes run concurrently, and one node's failure does not stop the others.
    async fn act_per_node(&self, actions: Vec<Action>) -> Vec<GroupResult> {
        let mut groups: Vec<(String, Vec<Action>)> = Vec::new();
        let mut index: BTreeMap<String, usize> = BTreeMap::new();
        for action in actions {
            let node = node_of(&action).to_string();
            match index.get(&node) {
                Some(&i) => groups[i].1.push(action),
                None => {
                    index.insert(node.clone(), groups.len());
                    groups.push((node, vec![action]));
                }
            }
        }
        futures::stream::iter(groups)
            .map(|(node, list)| self.act_in_order(node, list))
            .buffer_unordered(NODES_IN_PARALLEL)
            .collect()
            .await
    }

    /// One node's actions, in order, until the first failure.
    async fn act_in_order(&self, node: String, list: Vec<Action>) -> GroupResult {
        let mut done = GroupResult { node, refused: Vec::new(), blockers: None, events: Vec::new(), error: None };
        for action in list {
            if let Action::Event { plan, node, reason, message, warning } = action {
                // Reached: every action before it succeeded. Published after the pass.
                done.events.push(NodeEvent { plan, node, reason, message, warning });
                continue;
            }
            if let Action::Blockers { reasons, .. } = action {
                done.blockers = Some(reasons); // recorded after the pass, with the refusals
                continue;
            }
            match self.act(action).await {
                Ok(r) => done.refused.extend(r.map(|(_, why)| why)),
                Err(e) => {
                    done.error = Some(e);
                    break;
                }
            }
        }
        done
    }

    /// Publishes the Events the actions reached and records each draining node's blockers;
    /// returns the failures by node.
    async fn record_outcomes(&self, results: Vec<GroupResult>, plans: &[GpuPartitionPlan]) -> BTreeMap<String, String> {
        let (mut found, mut blocked) = (BTreeMap::new(), BTreeMap::new());
        let mut node_errors: BTreeMap<String, String> = BTreeMap::new();
        let mut reached = Vec::new();
        for GroupResult { node, refused, blockers, events, error } in results {
            reached.extend(events);
            // A node whose actions stopped at an error saw only part of its refusals: its record
            // keeps what it said until a whole pass says otherwise (no flapping message, no
            // Warning per swing). An eviction that timed out is the API's latency, not a blocker:
            // it is not persisted on the node, but reported like a failed call (the plan's message).
            let (timed_out, refused): (Vec<String>, Vec<String>) =
                refused.into_iter().partition(|r| r.contains(EVICTION_TIMED_OUT));
            if let Some(first) = timed_out.into_iter().next() {
                node_errors.entry(node.clone()).or_insert(first);
            }
            if error.is_none() {
                if let Some(b) = blockers {
                    found.insert(node.clone(), b);
                }
                if !refused.is_empty() {
                    blocked.insert(node.clone(), refused);
                }
            }
            if let Some(e) = error {
                self.metrics.error(e.kind());
                warn!(%node, error = %e, "an action failed; the rest of the pass goes on");
                node_errors.insert(node, e.to_string());
            }
        }
        self.publish_events(reached, plans).await;
        for (node, e) in self.record_drain_messages(&found, &blocked).await {
            node_errors.entry(node).or_insert(e);
        }
        node_errors
    }

    /// Releases deleted plans and writes the others' status where it changed; returns how many
    /// of those writes failed.
    async fn write_statuses(
        &self,
        plans: &[GpuPartitionPlan],
        reports: &mut BTreeMap<String, PlanReport>,
        mut plan_errors: BTreeMap<String, Vec<String>>,
        now: Timestamp,
        fleet: &FleetCache,
    ) -> usize {
        let mut failed = 0;
        let mut statuses: BTreeMap<String, tessera_crds::GpuPartitionPlanStatus> = BTreeMap::new();
        for plan in plans {
            let name = plan.name_any();
            if plan.metadata.deletion_timestamp.is_some() {
                if crate::locked(&self.memory.expectations).names(&name) {
                    continue; // a record naming the plan is newer than the cache shows
                }
                if let Err(e) = self.finish_deletion(plan, fleet).await {
                    self.metrics.error(e.kind());
                    warn!(plan = %name, error = %e, "could not release a deleted plan; retrying");
                    failed += 1;
                }
                continue;
            }
            let Some(report) = reports.get_mut(&name) else { continue };
            report.errors.extend(plan_errors.remove(&name).unwrap_or_default());
            let (status, written) = self.write_status(plan, &name, report, now).await;
            statuses.insert(name, status);
            failed += usize::from(!written);
        }
        self.metrics.set_stalled_plans(&crate::alert_metrics::stalled_plans(
            statuses.iter().map(|(name, status)| (name.as_str(), status)),
        ));
        failed
    }

    /// A plan's status from its report, written when it changed; returns it, and false when
    /// the write failed.
    async fn write_status(
        &self,
        plan: &GpuPartitionPlan,
        name: &str,
        report: &PlanReport,
        now: Timestamp,
    ) -> (tessera_crds::GpuPartitionPlanStatus, bool) {
        let previous = plan.status.clone().unwrap_or_default();
        let mut status =
            plan_status(&previous.conditions, report, plan.metadata.generation, plan.spec.paused, Time(now));
        // The decision has its own field manager; this write neither carries nor compares it.
        status.layout_decision = previous.layout_decision.clone();
        let kept = status.clone();
        if status != previous {
            status.layout_decision = None;
            let body = StatusApply::of::<GpuPartitionPlan>(&status);
            let api = Api::<GpuPartitionPlan>::all(self.client.clone());
            // Each write checks the tenure, not once per loop: a status write can be slow, and
            // the lease may pass.
            match self.writer().send_counted(&api, name, Write::apply(Manager::Operator, &body).status()).await {
                Ok(Ok(_)) => {}
                Err(_) => return (kept, false), // not sent: the lease may have passed
                Ok(Err(e)) => {
                    warn!(plan = %name, error = %e, "could not write the plan's status; retrying");
                    return (kept, false);
                }
            }
        }
        (kept, true)
    }
}

/// Each plan's report names the failures on the nodes it owns.
fn attribute_errors(
    reports: &mut BTreeMap<String, PlanReport>,
    names: &[&str],
    node_errors: &BTreeMap<String, String>,
) {
    for report in reports.values_mut() {
        if node_errors.is_empty() {
            continue;
        }
        for node in report.nodes.iter().filter_map(|&i| names.get(i)) {
            if let Some(e) = node_errors.get(*node) {
                report.errors.push(format!("{node}: {e}"));
            }
        }
    }
}
