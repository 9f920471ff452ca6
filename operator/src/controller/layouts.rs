//! Automatic plans in the control loop: before the rollout is planned, each plan with
//! `spec.layoutsFrom` gets its decision checked (`automatic_layouts::next`) and, when due, worked out again
//! (`automatic_layouts::decide`, off the async workers) and stored in `status.layoutDecision` by its own field
//! manager. The rollout then reads the decision like any other intent. Also the
//! `fragmentedSlices` figure of every plan.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::OnceLock;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp, Unit};
use kube::api::{Api, ListParams};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tessera_crds::gpunode::{GpuState, NodePhase};
use tessera_crds::plan::{ExcludedNode, LayoutDecision, LayoutsFrom};
use tessera_crds::{GpuNode, GpuPartitionPlan, TenantGpuQuota};
use tracing::{info, warn};

use super::Context;
use super::events::Repeats;
use crate::Error;
use crate::writer::bodies::StatusApply;
use crate::writer::{Manager, Write};
use tessera_planner::automatic_layouts::{self, Next};
use tessera_planner::fleet;
use tessera_planner::gpu_use::{ClaimIndex, uses_gpu};
use tessera_planner::liveness::AgentHealth;
use tessera_planner::quota::Capacity;
use tessera_planner::rollout::{NodeInput, contenders};

/// An unmet demand is worked out again this often, in case something changed that the fleet
/// digest does not show (a busy node became idle).
const RETRY_UNMET_SECS: i64 = 300;

/// What the layout step found: per plan, a change waiting to be decided, and API errors.
#[derive(Default)]
pub struct LayoutsPass {
    pub deciding: BTreeMap<String, String>,
    pub errors: BTreeMap<String, Vec<String>>,
}

/// When each plan's current (demand, fleet, generation) was first seen, for stabilization: as
/// an instant (to measure) and as a time (to say when the plan decides, the same every pass).
#[derive(Default)]
pub struct Stability(HashMap<String, (String, Instant, Timestamp)>);

impl Stability {
    /// Seconds `signature` has held for `plan`, and since when.
    fn held(&mut self, plan: &str, signature: String) -> (i64, Timestamp) {
        let now = Instant::now();
        let fresh = |signature| (signature, now, Timestamp::now());
        let entry = self.0.entry(plan.to_string()).or_insert_with(|| fresh(signature.clone()));
        if entry.0 != signature {
            *entry = fresh(signature);
        }
        (now.duration_since(entry.1).as_secs() as i64, entry.2)
    }

    fn retain(&mut self, plans: &BTreeSet<String>) {
        self.0.retain(|k, _| plans.contains(k));
    }
}

/// What every automatic plan of a pass reads of the fleet.
struct Fleet<'a, 'n> {
    quotas: Vec<TenantGpuQuota>,
    /// Every GpuNode, and stand-ins for what the GPU DRA drivers supply beyond them.
    gpunodes: Vec<&'a GpuNode>,
    nodes: &'a [NodeInput<'n>],
    /// The fleet's supply as the quota controller counts it, read once if a plan waits.
    supply: OnceLock<BTreeMap<String, i64>>,
}

/// The nodes an automatic plan owns (no other live plan selects them): names and GpuNodes.
struct Owned<'a> {
    names: BTreeSet<String>,
    gpunodes: Vec<&'a GpuNode>,
}

/// What a pass does with an automatic plan.
enum Due {
    /// Nothing: its decision stands.
    Nothing,
    /// Nothing yet, for the reason given (the plan's status shows it).
    Waits(String),
    /// Work out its layouts again, for the reason given.
    Decide(String),
}

/// Per live plan, the nodes it alone selects.
fn sole_owners(live: &[GpuPartitionPlan], nodes: &[NodeInput<'_>]) -> BTreeMap<String, BTreeSet<String>> {
    let live_refs: Vec<&GpuPartitionPlan> = live.iter().collect();
    let mut owners: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for n in nodes {
        if let [one] = contenders(&live_refs, n.labels).as_slice() {
            owners.entry(one.clone()).or_default().insert(n.name.to_string());
        }
    }
    owners
}

impl Context {
    /// Checks every automatic plan's decision and decides again where due; `plans` is updated
    /// in place with any new decision, so this pass's rollout already follows it.
    pub(super) async fn decide_layouts(&self, plans: &mut [GpuPartitionPlan], nodes: &[NodeInput<'_>]) -> LayoutsPass {
        let mut pass = LayoutsPass::default();
        // Where the plan cache lags our own decision write, the decision as written.
        crate::locked(&self.memory.decision_writes).overlay(plans);
        let live: Vec<GpuPartitionPlan> =
            plans.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).cloned().collect();
        let names: BTreeSet<String> = live.iter().map(|p| p.name_any()).collect();
        crate::locked(&self.memory.stability).retain(&names);
        self.clear_fixed_decisions(plans, &mut pass).await;
        if !live.iter().any(|p| p.spec.layouts_from.is_some()) {
            return pass;
        }
        let quotas: Vec<TenantGpuQuota> = self.caches.quotas.state().iter().map(|q| (**q).clone()).collect();
        // What the GPU DRA drivers supply beyond the agents' reports counts too (`dra_slices`).
        let stand_ins = super::dra::supply_nodes(&self.caches.dra, &self.caches.gpunodes);
        let gpunodes: Vec<&GpuNode> = nodes.iter().filter_map(|n| n.gpunode.as_deref()).chain(&stand_ins).collect();
        let fleet = Fleet { quotas, gpunodes, nodes, supply: OnceLock::new() };
        let mut owners = sole_owners(&live, nodes);
        for plan in plans.iter_mut().filter(|p| p.metadata.deletion_timestamp.is_none()) {
            let Some(from) = plan.spec.layouts_from.clone() else { continue };
            let names = owners.remove(&plan.name_any()).unwrap_or_default();
            let gpunodes = fleet.gpunodes.iter().copied().filter(|g| names.contains(&g.name_any())).collect();
            self.check_plan(plan, &from, &Owned { names, gpunodes }, &fleet, &mut pass).await;
        }
        pass
    }

    /// Removes the decision of every plan switched back to fixed layouts: it must not come back
    /// to life if the plan is switched to automatic again.
    async fn clear_fixed_decisions(&self, plans: &mut [GpuPartitionPlan], pass: &mut LayoutsPass) {
        for plan in plans.iter_mut().filter(|p| p.spec.layouts_from.is_none()) {
            if plan.status.as_ref().is_some_and(|s| s.layout_decision.is_some())
                && let Err(e) = self.clear_decision(plan).await
            {
                pass.errors.entry(plan.name_any()).or_default().push(format!("clearing the old decision: {e}"));
            }
        }
    }

    /// One automatic plan of the pass: decided again where due, else `pass` notes why it waits.
    async fn check_plan(
        &self,
        plan: &mut GpuPartitionPlan,
        from: &LayoutsFrom,
        owned: &Owned<'_>,
        fleet: &Fleet<'_, '_>,
        pass: &mut LayoutsPass,
    ) {
        let name = plan.name_any();
        let demand = automatic_layouts::plan_demand(from, &fleet.quotas);
        let excluded = automatic_layouts::exclusions(plan, owned.gpunodes.iter().copied());
        let why = match self.due(plan, from, &demand, owned, &excluded.lifted, fleet) {
            Due::Nothing => return,
            Due::Waits(msg) => {
                pass.deciding.insert(name, msg);
                return;
            }
            Due::Decide(why) => why,
        };
        let decided =
            self.decide_one(plan, &demand, &fleet.gpunodes, &owned.names, fleet.nodes, excluded.kept, &why).await;
        if let Err(e) = decided {
            self.metrics.error(e.kind());
            warn!(plan = %name, error = %e, "could not work out the plan's layouts; retrying");
            pass.errors.entry(name).or_default().push(format!("working out the layouts: {e}"));
        }
    }

    /// Whether an automatic plan is to be decided now (`automatic_layouts::next`), once its demand, nodes and
    /// generation have held still long enough (`Stability`) and each owned node's agent is judged.
    fn due(
        &self,
        plan: &GpuPartitionPlan,
        from: &LayoutsFrom,
        demand: &automatic_layouts::Demand,
        owned: &Owned<'_>,
        lifted: &[String],
        fleet: &Fleet<'_, '_>,
    ) -> Due {
        let total = demand.total();
        let digest = automatic_layouts::fleet_digest(owned.gpunodes.iter().copied());
        let mine = || fleet.nodes.iter().filter(|n| owned.names.contains(n.name));
        // A node whose cache lags our last write may be mid-change already.
        let in_flight = mine().filter(|n| n.cache_behind || n.gpunode.as_deref().is_some_and(in_flight)).count();
        let blocked = blocked_targets(plan, fleet.nodes);
        let signature = format!("{:?}|{digest}|{:?}|{blocked}|{:?}", total, plan.metadata.generation, lifted);
        let (held, since) = crate::locked(&self.memory.stability).held(&plan.name_any(), signature);
        let why = match automatic_layouts::next(plan, &total, &digest, held, in_flight, blocked, lifted) {
            Next::Keep => match unmet_and_stale(plan) {
                Some(why) if in_flight == 0 => why,
                _ => return Due::Nothing,
            },
            Next::Wait(msg) => return Due::Waits(msg),
            Next::Stabilize { why, .. } => {
                let supply = fleet.supply.get_or_init(|| Capacity::of(fleet.gpunodes.iter().copied()).supply);
                let seconds = from.stabilization_seconds.max(0);
                let at = Time(since.round(Unit::Second).unwrap_or(since) + SignedDuration::from_secs(seconds));
                return Due::Waits(automatic_layouts::stabilizing_message(&why, &total, supply, seconds, &at));
            }
            Next::Decide(why) => why,
        };
        // Just after a start, a failover or a lease-watch outage, agents not yet seen renewing
        // would all count as frozen and the decision would leave the demand short until the
        // next re-check: decide once each owned node's agent is judged (within a lease).
        let unproven = mine().filter(|n| n.agent == AgentHealth::Unproven).count();
        if unproven > 0 {
            return Due::Waits(format!(
                "waiting for {unproven} node agent(s) to be seen renewing their lease before deciding"
            ));
        }
        Due::Decide(why)
    }

    #[allow(clippy::too_many_arguments)]
    async fn decide_one(
        &self,
        plan: &mut GpuPartitionPlan,
        demand: &automatic_layouts::Demand,
        gpunodes: &[&GpuNode],
        owned: &BTreeSet<String>,
        nodes: &[NodeInput<'_>],
        excluded: Vec<ExcludedNode>,
        why: &str,
    ) -> Result<(), Error> {
        let name = plan.name_any();
        let busy = self.nodes_running_gpu_pods(owned).await?;
        // Nodes that cannot take a change now: agent down, mid-change, or failed.
        let frozen: BTreeSet<String> = nodes
            .iter()
            .filter(|n| owned.contains(n.name))
            .filter(|n| {
                n.agent != AgentHealth::Alive || n.gpunode.as_deref().is_some_and(automatic_layouts::frozen_by_rollout)
            })
            .map(|n| n.name.to_string())
            .collect();
        let (p, d, g, o, w) = (
            plan.clone(),
            demand.clone(),
            gpunodes.iter().map(|g| (*g).clone()).collect::<Vec<_>>(),
            owned.clone(),
            why.to_string(),
        );
        let decided = tokio::task::spawn_blocking(move || {
            let refs: Vec<&GpuNode> = g.iter().collect();
            let now = Time(k8s_openapi::jiff::Timestamp::now());
            automatic_layouts::decide(&p, &d, &refs, &o, &busy, &frozen, &excluded, &w, now)
        })
        .await
        .map_err(|e| Error::Usage(format!("the layout solver stopped: {e}")))?
        .map_err(|e| Error::Usage(e.to_string()))?;
        // The solver may have run long: a leader whose lease may have passed writes no decision.
        let written = self.write_decision(&name, json!({"layoutDecision": decided})).await?;
        self.wrote_decision(&name, &written, Some(&decided));
        info!(plan = %name, changed = decided.changed_gpus, message = %decided.message, "layouts decided");
        let warning = !decided.shortfall.is_empty();
        self.publish(&plan.object_ref(&()), "LayoutsDecided", &decided.message, warning, Repeats::EachNew).await;
        plan.status.get_or_insert_with(Default::default).layout_decision = Some(decided);
        Ok(())
    }

    /// Removes `status.layoutDecision` (an empty apply by its field manager drops its fields).
    async fn clear_decision(&self, plan: &mut GpuPartitionPlan) -> Result<(), Error> {
        let written = self.write_decision(&plan.name_any(), json!({})).await?;
        self.wrote_decision(&plan.name_any(), &written, None);
        if let Some(st) = plan.status.as_mut() {
            st.layout_decision = None;
        }
        Ok(())
    }

    /// Applies `status` (the decision, or nothing to drop it) as the plan's layouts manager. Not a
    /// typed `GpuPartitionPlanStatus`: that would send the status's other fields at their defaults
    /// (empty conditions, zero counts), and this manager would take them over.
    async fn write_decision(&self, plan: &str, status: serde_json::Value) -> Result<GpuPartitionPlan, Error> {
        let body = StatusApply::of::<GpuPartitionPlan>(status);
        let plans = Api::<GpuPartitionPlan>::all(self.client.clone());
        self.writer().send(&plans, plan, Write::apply(Manager::Layouts, &body).status()).await
    }

    /// Remembers a decision write until the plan cache shows it (`automatic_layouts::written`).
    fn wrote_decision(&self, plan: &str, written: &GpuPartitionPlan, decision: Option<&LayoutDecision>) {
        let rv = written.metadata.resource_version.as_deref();
        crate::locked(&self.memory.decision_writes).wrote(plan, rv, decision.cloned());
    }

    /// Nodes among `owned` with a GPU pod that has not finished. One paginated list of every
    /// pod: a decision is rare, and a watch of every pod would cost memory on every pass.
    async fn nodes_running_gpu_pods(&self, owned: &BTreeSet<String>) -> Result<BTreeSet<String>, Error> {
        let api: Api<Pod> = Api::all(self.client.clone());
        let claims = self.caches.claims.index();
        let mut out = BTreeSet::new();
        let mut lp = ListParams::default().limit(500);
        loop {
            let page = api.list(&lp).await?;
            out.extend(busy_nodes(&page.items, owned, &claims));
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => lp = lp.continue_token(&token),
                None => return Ok(out),
            }
        }
    }

    /// `fragmentedSlices` per plan: the stranded slices of its nodes' current layouts, against
    /// the demand it serves (an automatic plan's) or every quota's (a fixed plan's). Memoised
    /// per (GPU as reported, demanded profiles): layouts repeat across a fleet, so a pass hashes
    /// each GPU and works out only the layouts it has not seen.
    pub(super) fn fragmented_slices(
        &self,
        plans: &[GpuPartitionPlan],
        reports: &BTreeMap<String, tessera_planner::rollout::PlanReport>,
        nodes: &[NodeInput<'_>],
    ) -> BTreeMap<String, i64> {
        let quotas: Vec<TenantGpuQuota> = self.caches.quotas.state().iter().map(|q| (**q).clone()).collect();
        let everyone = tessera_planner::coverage::Demand::every(&quotas).total();
        let mut memo = crate::locked(&self.memory.stranded_memo);
        let StrandedMemo { by_gpu, by_node } = &mut *memo;
        if by_gpu.len() > 10_000 {
            by_gpu.clear();
        }
        by_node.resize(nodes.len(), None);
        let mut out = BTreeMap::new();
        for plan in plans.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
            let name = plan.name_any();
            let demand = match &plan.spec.layouts_from {
                Some(from) => automatic_layouts::plan_demand(from, &quotas).total(),
                None => everyone.clone(),
            };
            let demanded: Vec<&String> = demand.iter().filter(|(_, n)| **n > 0).map(|(r, _)| r).collect();
            let demanded_key = hash_of(&demanded);
            let mut total: i64 = 0;
            for &i in reports.get(&name).into_iter().flat_map(|r| r.nodes.iter()) {
                let Some(node) = nodes.get(i) else { continue };
                let Some(gn) = node.gpunode.as_ref() else { continue };
                // A GpuNode not written since the last pass counts as it did then.
                let version = node.versions.and_then(|v| v.gpunode);
                if let (Some(version), Some((v, d, n))) = (version, by_node[i])
                    && v == version
                    && d == demanded_key
                {
                    total += n;
                    continue;
                }
                let mut node_total = 0;
                for g in gn.status.iter().flat_map(|s| s.gpus.iter()) {
                    let key = (gpu_key(g), demanded_key);
                    let n = *by_gpu.entry(key).or_insert_with(|| match automatic_layouts::gpu_slot("", g, false) {
                        Some(slot) => fleet::stranded_slices(std::slice::from_ref(&slot), &demand),
                        None => 0,
                    });
                    node_total += i64::from(n);
                }
                by_node[i] = version.map(|v| (v, demanded_key, node_total));
                total += node_total;
            }
            out.insert(name, total);
        }
        out
    }
}

/// Stranded slices remembered across passes: per (GPU, demanded profiles) hash, and per node
/// by its position in the pass (its GpuNode's resourceVersion, demanded profiles hash, its GPUs'
/// total), so a pass only looks again at GpuNodes written since the last one. A version names
/// one write of one object: a node that took over a position is never mistaken for another.
#[derive(Default)]
pub(super) struct StrandedMemo {
    by_gpu: tessera_planner::FastMap<(u64, u64), u32>,
    by_node: Vec<Option<(u64, u64, i64)>>,
}

/// What of a reported GPU decides its stranded slices: board (product and, for a board outside
/// the catalog, its table), MIG mode and instances. Hashed: equal GPUs repeat across a fleet.
fn gpu_key(g: &GpuState) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    (&g.product, g.mig_capable, g.mig_enabled, g.instances.len(), g.profiles.len()).hash(&mut h);
    for i in &g.instances {
        (&i.profile, i.start, i.size).hash(&mut h);
    }
    for p in &g.profiles {
        (&p.name, p.id, p.compute_slices, p.memory_slices, p.max_count, &p.starts).hash(&mut h);
    }
    h.finish()
}

fn hash_of<T: std::hash::Hash>(value: &T) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one(value)
}

/// Nodes among `owned` running a pod that has not finished and uses a GPU, through extended
/// resources or a ResourceClaim (`gpu_use`, the drain scope's rule): a decision leaves them be.
fn busy_nodes(pods: &[Pod], owned: &BTreeSet<String>, claims: &ClaimIndex) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for pod in pods {
        let done = matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"));
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_ref());
        if let (false, Some(node)) = (done, node)
            && owned.contains(node)
            && uses_gpu(pod, claims)
        {
            out.insert(node.clone());
        }
    }
    out
}

fn in_flight(gn: &GpuNode) -> bool {
    gn.status
        .as_ref()
        .and_then(|s| s.rollout.as_ref())
        .is_some_and(|r| matches!(r.phase, NodePhase::Draining | NodePhase::Applying | NodePhase::Uncordoning))
}

/// Targets of the current decision that cannot be changed any more: failed for this plan, or
/// whose agent stopped responding before the target was applied.
fn blocked_targets(plan: &GpuPartitionPlan, nodes: &[NodeInput<'_>]) -> usize {
    let Some(d) = plan.status.as_ref().and_then(|s| s.layout_decision.as_ref()) else { return 0 };
    let name = plan.name_any();
    let by_name: tessera_planner::FastMap<&str, &NodeInput<'_>> = nodes.iter().map(|n| (n.name, n)).collect();
    d.targets
        .iter()
        .filter_map(|t| by_name.get(t.node.as_str()).map(|n| (t, *n)))
        .filter(|(t, n)| {
            let r = n.gpunode.as_ref().and_then(|g| g.status.as_ref()?.rollout.as_ref());
            let failed = r.is_some_and(|r| r.phase == NodePhase::Failed && r.plan.as_deref() == Some(name.as_str()));
            let applied = n.gpunode.as_ref().is_some_and(|g| {
                let want: Vec<tessera_crds::gpunode::GpuIntent> = t.gpus.iter().map(Into::into).collect();
                g.spec.gpus == want && g.status.as_ref().and_then(|s| s.observed_generation) == g.metadata.generation
            });
            // Dead, not merely unproven (after an operator start or a lease watch outage).
            failed || (n.agent.is_not_responding() && !applied)
        })
        .count()
}

/// A decision that did not meet the demand is tried again every few minutes.
fn unmet_and_stale(plan: &GpuPartitionPlan) -> Option<String> {
    let d = plan.status.as_ref()?.layout_decision.as_ref()?;
    let at = d.decided_at.as_ref()?;
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(at.0).as_secs();
    (!d.shortfall.is_empty() && age >= RETRY_UNMET_SECS)
        .then(|| format!("the demand was not met {age}s ago; checking whether anything changed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_whose_pod_holds_a_gpu_claim_is_busy() {
        let pod = |name: &str, node: &str, claim: &str, phase: &str| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ml"},
                "spec": {"nodeName": node, "containers": [{"name": "c"}],
                         "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]},
                "status": {"phase": phase}}))
            .unwrap()
        };
        let claim = |name: &str, driver: &str| -> k8s_openapi::api::resource::v1::ResourceClaim {
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ml"},
                "spec": {"devices": {"requests": []}},
                "status": {"allocation": {"devices": {"results": [
                    {"request": "r", "driver": driver, "pool": "p", "device": "gpu-0-mig-19-0-1"}]}}}}))
            .unwrap()
        };
        let claims = ClaimIndex::new(
            &[claim("mig", "gpu.nvidia.com"), claim("nic", "nic.example.com")],
            &tessera_planner::dra::GpuDrivers::default(),
        );
        let owned: BTreeSet<String> = ["a", "b", "c", "d"].map(String::from).into();
        let pods = [
            pod("p1", "a", "mig", "Running"),
            pod("p2", "b", "nic", "Running"),
            pod("p3", "c", "mig", "Succeeded"),
            pod("p4", "elsewhere", "mig", "Running"),
        ];
        assert_eq!(busy_nodes(&pods, &owned, &claims), ["a".to_string()].into());
    }
}
