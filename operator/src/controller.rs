//! The operator's control loop: observe (reflector caches, read again only for the nodes the
//! watches saw change (`fleet_cache`), plus the pods of draining nodes), plan (`rollout::plan_fleet_with`,
//! pure, reusing the verdicts of unchanged nodes), act (the small executor in `actions`), then
//! one status write per plan. Level-triggered: a pass runs on every change it reads (see `pass_wakes`)
//! and at least every two seconds, and every decision is re-derived from the API objects (what
//! passes keep between them is an exact shortcut, checked by version), so a restarted operator
//! resumes where it stopped.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
pub use tessera_planner::rollout::node_of;
pub use tessera_planner::trimmed::{trim_metadata, trim_node};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams};
use kube::runtime::events::{Recorder, Reporter};
use serde_json::json;
use tessera_crds::gpunode::{NodePhase, NodeRollout};
use tokio::sync::Notify;

mod actions;
pub(crate) mod claims;
pub mod dra;
mod events;
mod eviction;
#[cfg(test)]
pub(crate) mod fake_dra_api;
mod finalizers;
mod fleet_cache;
mod layouts;
mod leases;
mod pass;
mod pass_memory;
mod takeover;
mod watch;

use actions::EVICTION_TIMED_OUT;
pub use finalizers::{FINALIZER, holds_deletion};
use fleet_cache::{Dirty, FleetCache};
use pass_memory::PassMemory;
pub(crate) use watch::Caches;

use crate::Error;
use crate::control_loop::{Loop, Passes};
use crate::expectations::{Fence, Written};
use crate::metrics::Metrics;
use crate::writer::{Expecting, Manager, Write, Writer};
use tessera_planner::trimmed::SlimGpuNode;

pub use crate::writer::{LIVENESS_MANAGER, MANAGER};
/// Changes are batched for this long before a pass. A pass plans the whole fleet, but borrows
/// its objects and memoises its look-ups, so it costs little next to its API requests; each
/// rollout wave takes three passes, so this pause is paid three times per wave. Measured at
/// 1,000 nodes, waiting only for a 40 ms lull instead made the rollout slower (57 s against
/// 43 s, 79 passes against 46): a pass that starts before the cache has the whole wave acts on
/// part of it, and the rest waits for that pass's requests to finish.
const DEBOUNCE: Duration = Duration::from_millis(200);
/// Nodes whose actions (and pod lists) run at once within a pass. A node's requests run one
/// after another, so a pass is bound by their latency more than by the API server: measured at
/// 1,000 nodes, 64 took 34 s against 40 s with 32 (and 40 s with 128).
const NODES_IN_PARALLEL: usize = 64;

/// What the passes share: the clients, the shared caches (read only), this replica's tenure, and
/// what one pass keeps for the next.
pub struct Context {
    pub client: Client,
    /// kube retries 429 by default; evictions must see a PDB refusal at once.
    pub evict_client: Client,
    pub recorder: Recorder,
    /// This replica's identity, as `reportingInstance` of the Events it creates itself.
    instance: String,
    pub metrics: Arc<Metrics>,
    /// Until when this replica may write as the leader (see `leader`): checked before each write.
    pub tenure: Arc<crate::leader::Tenure>,
    /// The caches of the fleet, shared with the quota controller: read only here.
    pub(crate) caches: Caches,
    /// What one pass keeps for the next (in memory only).
    pub(crate) memory: PassMemory,
}

/// The rollout controller over `caches` (started by `run`, shared with the quota controller);
/// its passes wake on `caches.changed` (see [`Context::run`]).
pub(crate) fn start(
    client: Client,
    evict_client: Client,
    metrics: Arc<Metrics>,
    instance: String,
    caches: &Caches,
) -> Arc<Context> {
    let recorder =
        Recorder::new(client.clone(), Reporter { controller: MANAGER.into(), instance: Some(instance.clone()) });
    Arc::new(Context::new(client, evict_client, recorder, instance, metrics, caches))
}

impl Context {
    /// A context over started caches, with nothing yet kept from a pass.
    fn new(
        client: Client,
        evict_client: Client,
        recorder: Recorder,
        instance: String,
        metrics: Arc<Metrics>,
        caches: &Caches,
    ) -> Self {
        Context {
            client,
            evict_client,
            recorder,
            instance,
            metrics,
            tenure: Default::default(),
            caches: caches.clone(),
            memory: PassMemory::default(),
        }
    }

    pub async fn wait_ready(&self) {
        let _ = tokio::join!(
            self.caches.plans.wait_until_ready(),
            self.caches.gpunodes.wait_until_ready(),
            self.caches.nodes.wait_until_ready(),
            self.caches.leases.wait_until_ready(),
            self.caches.quotas.wait_until_ready(),
            self.caches.claims.wait_ready()
        );
        // A pass never plans on slices not listed yet.
        self.caches.dra.wait_ready().await;
    }

    /// Forgets what passes kept between them: the cached fleet, the kept verdicts and the stranded slices.
    /// The next pass reads the whole fleet from the caches. Agents' heartbeats stay as observed
    /// (an agent silent all along is still judged silent, not given a new grace period).
    pub fn forget_passes(&self) {
        *crate::locked(&self.memory.fleet) = FleetCache::default();
        *crate::locked(&self.memory.kept) = Default::default();
        *crate::locked(&self.memory.stranded_memo) = Default::default();
        // The idle report's verdicts too: a new tenure's passes publish their own.
        self.memory.not_reporting.forget();
    }

    /// Runs passes until the future is dropped. Started when the lease is ours: the first pass
    /// waits until the caches show the fleet as read after that (see `takeover`).
    pub async fn run(self: Arc<Self>, changed: Arc<Notify>) {
        let passes = Loop { wakes: vec![(changed, DEBOUNCE)], period: Duration::from_secs(2) };
        passes.run(&*self).await;
    }

    /// One pass over the fleet. A failing API call fails only its node's or its plan's part of
    /// the pass: the rest goes on, and the failure is reported in the plan's status and metrics.
    /// The cached objects are borrowed (`Arc`), never copied, and read again only for the nodes
    /// the watches saw change (see `fleet_cache`): with fixed-layout plans a pass costs the nodes that
    /// changed, and a step of a few nanoseconds for the rest (an automatic plan's decision still
    /// reads every node it owns).
    pub async fn reconcile(&self) -> Result<(), Error> {
        // Owned by the pass while it runs: a pass dropped half-way leaves none, and the next one
        // reads the whole fleet again.
        let mut fleet = std::mem::take(&mut *crate::locked(&self.memory.fleet));
        let result = self.pass(&mut fleet).await;
        *crate::locked(&self.memory.fleet) = fleet;
        result
    }

    /// Nodes with a `GpuNode`, by the phase of its rollout record (a `GpuNode` whose Node is gone
    /// is no node of the fleet, and not counted).
    fn set_phase_metrics(&self, fleet: &FleetCache) {
        // A handful of phases: counted in a short list, named once each.
        let mut counts: Vec<(NodePhase, i64)> = Vec::new();
        for phase in fleet.nodes.iter().filter(|s| s.gpunode.is_some()).map(|s| s.phase) {
            match counts.iter_mut().find(|(p, _)| *p == phase) {
                Some((_, n)) => *n += 1,
                None => counts.push((phase, 1)),
            }
        }
        let phases: BTreeMap<String, i64> = counts.into_iter().map(|(p, n)| (format!("{p:?}"), n)).collect();
        self.metrics.set_phases(&phases);
    }

    /// The pods on a draining node, and which of their DaemonSets exist (a DaemonSet pod is
    /// skipped only while its DaemonSet exists). A DaemonSet that cannot be read counts as
    /// existing: when in doubt, delete nothing.
    async fn pods_on(&self, node: &str) -> (Result<Vec<Pod>, String>, std::collections::BTreeSet<(String, String)>) {
        let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let pods = match Api::<Pod>::all(self.client.clone()).list(&lp).await {
            Ok(list) => list.items,
            Err(e) => {
                self.metrics.error("kube");
                return (Err(e.to_string()), Default::default());
            }
        };
        let mut existing = std::collections::BTreeSet::new();
        let wanted: std::collections::BTreeSet<(String, String)> =
            pods.iter().filter_map(tessera_planner::drain::daemonset_of).collect();
        for (ns, name) in wanted {
            match Api::<DaemonSet>::namespaced(self.client.clone(), &ns).get_opt(&name).await {
                Ok(None) => {}
                Ok(Some(_)) | Err(_) => {
                    existing.insert((ns, name));
                }
            }
        }
        (Ok(pods), existing)
    }

    /// Writes a node's `status.rollout` (the operator's only status field there); `None`
    /// removes it. A JSON merge patch naming every field ([`rollout_patch`]): the same result as
    /// a server-side apply of the record, at a fraction of the API server's CPU, and this write
    /// is four of a node's eight requests.
    async fn write_rollout(&self, node: &str, rollout: Option<&NodeRollout>) -> Result<(), Error> {
        let patch = rollout_patch(rollout);
        let write = Write::merge_as(Manager::Operator, &patch).status().expected(Written::GpuNode);
        self.writer().send(&Api::<SlimGpuNode>::all(self.client.clone()), node, write).await?;
        if let Some(plan) = rollout.and_then(|r| r.plan.as_deref()) {
            crate::locked(&self.memory.expectations).named(node, plan);
        }
        Ok(())
    }

    /// The rollout's writes: checked against its tenure, remembered until its caches show them.
    fn writer(&self) -> Writer<'_> {
        let expecting = Expecting {
            expectations: &self.memory.expectations,
            gpunodes_written: &self.caches.gpunodes_written,
            nodes_written: &self.caches.nodes_written,
        };
        Writer::new(&self.client, Some(&self.tenure), &self.metrics).expecting(expecting)
    }
}

/// The rollout's passes in the shared loop: the first waits for the fence (see `takeover`).
impl Passes for Context {
    /// The fleet as read after the lease became ours, until the caches show it.
    type Gate = Option<Fence>;
    const FAILED: &'static str = "reconcile pass failed; retrying";

    async fn ready(&self) -> Option<Fence> {
        self.wait_ready().await;
        Some(self.read_fence().await)
    }

    fn may_pass(&self, fence: &mut Option<Fence>) -> bool {
        if fence.as_ref().is_some_and(|f| self.fence_shown(f)) {
            *fence = None;
        }
        // A leader that has not seen its lease renewed in time skips the pass (see `leader`).
        fence.is_none() && self.tenure.holds(std::time::SystemTime::now())
    }

    async fn pass(&self) -> Result<(), Error> {
        let started = Instant::now();
        let result = self.reconcile().await;
        self.metrics.reconciled(started.elapsed());
        result
    }

    fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}

/// The merge patch that makes `status.rollout` exactly `rollout`: unset fields are sent as null,
/// so a field of the previous record (a drain start, a message) never survives the write.
pub fn rollout_patch(rollout: Option<&NodeRollout>) -> serde_json::Value {
    let Some(r) = rollout else { return json!({"status": {"rollout": null}}) };
    let mut record = json!({"plan": null, "planGeneration": null, "drainStartedAt": null, "applyStartedAt": null,
                            "draWaitStartedAt": null, "message": null});
    if let (Some(all), Ok(serde_json::Value::Object(set))) = (record.as_object_mut(), serde_json::to_value(r)) {
        all.extend(set);
    }
    json!({"status": {"rollout": record}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn a_rollout_patch_names_every_field_so_nothing_stale_survives() {
        let full = NodeRollout {
            phase: NodePhase::Draining,
            plan: Some("p".into()),
            plan_generation: Some(3),
            cordoned_by_us: true,
            drain_started_at: Some(Time("2026-06-01T00:00:00Z".parse().unwrap())),
            apply_started_at: Some(Time("2026-06-01T00:01:00Z".parse().unwrap())),
            dra_wait_started_at: Some(Time("2026-06-01T00:02:00Z".parse().unwrap())),
            message: "blocked".into(),
        };
        let all = rollout_patch(Some(&full))["status"]["rollout"].clone();
        let back: NodeRollout = serde_json::from_value(all.clone()).unwrap();
        assert_eq!(back, full);
        let fields: Vec<&String> = all.as_object().unwrap().keys().collect();
        // At rest: every field the full record has is still named, unset ones as null.
        let idle = rollout_patch(Some(&NodeRollout { plan: Some("p".into()), ..Default::default() }));
        let idle = idle["status"]["rollout"].as_object().unwrap();
        for f in fields {
            assert!(idle.contains_key(f), "{f} missing from the patch of a record at rest");
        }
        assert_eq!(idle["phase"], "Idle");
        assert!(idle["drainStartedAt"].is_null() && idle["message"].is_null() && idle["applyStartedAt"].is_null());
        assert_eq!(rollout_patch(None), json!({"status": {"rollout": null}}));
    }
}
