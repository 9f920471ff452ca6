//! The GPU DRA drivers' ResourceSlices in the operator (see `dra_slices`): a cache of them, the
//! nodes the rollout refuses (DynamicMIG), the stand-ins that carry their supply to the quota
//! and layout counts, and each GpuNode's `DraInSync` condition, written under its own field
//! manager so neither the agent's status writes nor the rollout's remove it.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tessera_crds::GpuNode;
use tessera_crds::conditions;
use tokio::sync::Notify;
use tracing::warn;

use super::Context;
use super::fleet_cache::FleetCache;
use crate::cache::{Cache, start_cache};
use crate::pass_wakes::Waker;
use crate::writer::{Manager, Write, bodies};
use tessera_planner::dra::GpuDrivers;
use tessera_planner::dra_slices::{self, DRA_IN_SYNC, NodeCondition};
use tessera_planner::rollout::{DraSlices, NodeInput, PlanReport};

pub use crate::writer::DRA_MANAGER;

/// The cached ResourceSlices of the GPU drivers.
pub struct DraWatch {
    store: Store<ResourceSlice>,
    drivers: GpuDrivers,
}

impl DraWatch {
    /// Watches the slices (of the one driver by field selector when there is one), waking
    /// `pass_wakes` on every change. A cluster that does not serve ResourceSlices in
    /// `resource.k8s.io/v1` has none: the cache is ready and empty. One that serves them but
    /// cannot list them (the RBAC rule missing) keeps the cache not ready, and the caller holds
    /// rollouts: planned with no slices, a DynamicMIG node would be drained and carved.
    pub fn start(client: Client, drivers: GpuDrivers, wake: Vec<Arc<Notify>>) -> Arc<Self> {
        let mut config = watcher::Config::default();
        if let [one] = drivers.iter().collect::<Vec<_>>().as_slice() {
            config = config.fields(&format!("spec.driver={one}"));
        }
        let cache = Cache {
            served: Some((
                "resourceslices",
                "resource.k8s.io/v1 ResourceSlices are not served: no GPU DRA driver publishes devices",
            )),
            failed: "ResourceSlice watch error; retrying with backoff",
            ..Cache::waking(wake.into_iter().map(Waker::always).collect())
        };
        let store = start_cache(Api::<ResourceSlice>::all(client), config, cache).0;
        Arc::new(DraWatch { store, drivers })
    }

    /// Slices in `store`, filled by the test.
    #[cfg(test)]
    pub(crate) fn of(store: Store<ResourceSlice>, drivers: GpuDrivers) -> Arc<Self> {
        Arc::new(DraWatch { store, drivers })
    }

    /// Until the first list of slices is in (or the API is known not to serve them). Until then
    /// no rollout pass may run: a DynamicMIG node would not be recognised.
    pub async fn wait_ready(&self) {
        let _ = self.store.wait_until_ready().await;
    }

    pub fn slices(&self) -> Vec<Arc<ResourceSlice>> {
        self.store.state()
    }

    pub fn drivers(&self) -> &GpuDrivers {
        &self.drivers
    }

    /// Stand-in GpuNodes for the slices' supply beyond the agents' reports (`status_of`: a
    /// node's cached GpuNode).
    pub fn supply_nodes(&self, status_of: impl Fn(&str) -> Option<Arc<GpuNode>>) -> Vec<GpuNode> {
        let slices = self.slices();
        let nodes = dra_slices::by_node(slices.iter().map(|s| &**s), &self.drivers);
        dra_slices::supply_nodes(&nodes, status_of)
    }
}

/// The stand-ins of `dra` for the GpuNodes in `store`.
pub fn supply_nodes(dra: &DraWatch, store: &Store<GpuNode>) -> Vec<GpuNode> {
    dra.supply_nodes(|n| store.get(&kube::runtime::reflector::ObjectRef::new(n)))
}

/// Per node position: the node's [`NodeCondition`], from its slices and its cached GpuNode.
fn verdicts(
    slices: &[Arc<ResourceSlice>],
    drivers: &GpuDrivers,
    fleet: &FleetCache,
) -> Vec<(NodeCondition, Option<String>)> {
    let nodes = dra_slices::by_node(slices.iter().map(|s| &**s), drivers);
    fleet
        .nodes
        .iter()
        .map(|cached| {
            let node = nodes.get(cached.name.as_str());
            let status = cached.gpunode.as_ref().and_then(|g| g.status.as_ref());
            (dra_slices::node_condition(status, node), node.and_then(dra_slices::dynamic_mig))
        })
        .collect()
}

/// Names in each plan's report its nodes (by position, `names`) whose slices disagree with the
/// agent, for the plan's `DraInSync`.
fn name_stale(
    reports: &mut BTreeMap<String, PlanReport>,
    verdicts: &[(NodeCondition, Option<String>)],
    names: &[&str],
) {
    for report in reports.values_mut() {
        for &i in &report.nodes {
            if let (Some((NodeCondition::Set(false, conditions::gpunode_reasons::SLICES_STALE, msg), _)), Some(name)) =
                (verdicts.get(i), names.get(i))
            {
                report.dra_stale.push(format!("{name}: {msg}"));
            }
        }
    }
}

/// What the rollout reads of a node's slices (whether to hold its cordon after a change).
fn slices_of(condition: &NodeCondition) -> DraSlices {
    match condition {
        NodeCondition::Absent => DraSlices::None,
        NodeCondition::Keep => DraSlices::Publishing,
        NodeCondition::Set(true, ..) => DraSlices::InSync,
        NodeCondition::Set(false, _, why) => DraSlices::Stale(why.clone()),
    }
}

impl Context {
    /// This pass's DRA verdicts per node; marks refused inputs.
    pub(super) fn dra_verdicts(
        &self,
        fleet: &FleetCache,
        inputs: &mut [NodeInput<'_>],
    ) -> Vec<(NodeCondition, Option<String>)> {
        let dra = &self.caches.dra;
        let verdicts = verdicts(&dra.slices(), dra.drivers(), fleet);
        for (input, (condition, refused)) in inputs.iter_mut().zip(&verdicts) {
            input.dra_refused = refused.clone();
            input.dra_slices = slices_of(condition);
        }
        verdicts
    }

    /// Names each plan's out-of-sync nodes in its report, and writes the GpuNode conditions that
    /// changed. A failed write is logged and retried next pass (the cache still shows the old).
    pub(super) async fn write_dra(
        &self,
        verdicts: &[(NodeCondition, Option<String>)],
        reports: &mut BTreeMap<String, PlanReport>,
        fleet: &FleetCache,
    ) {
        let names: Vec<&str> = fleet.nodes.iter().map(|s| s.name.as_str()).collect();
        name_stale(reports, verdicts, &names);
        let api: Api<GpuNode> = Api::all(self.client.clone());
        for (cached, (want, _)) in fleet.nodes.iter().zip(verdicts) {
            let Some(gn) = &cached.gpunode else { continue };
            let current = gn.status.as_ref().and_then(|s| conditions::find(&s.conditions, DRA_IN_SYNC));
            if !dra_slices::must_write(current, want) {
                continue;
            }
            let conditions = match want {
                NodeCondition::Set(ok, reason, message) => {
                    let status = if *ok { "True" } else { "False" };
                    let since = current
                        .filter(|c| c.status == status)
                        .map_or_else(|| Time(k8s_openapi::jiff::Timestamp::now()), |c| c.last_transition_time.clone());
                    vec![bodies::condition(DRA_IN_SYNC, status, reason, message.clone(), since)]
                }
                NodeCondition::Absent | NodeCondition::Keep => vec![],
            };
            let body = bodies::gpunode_conditions(conditions).named(&gn.name_any());
            let write = Write::apply(Manager::Dra, &body).status();
            // Not sent once the lease may have passed; the next node is checked again.
            if let Ok(Err(e)) = self.writer().send_counted(&api, &gn.name_any(), write).await {
                warn!(node = %cached.name, error = %e, "could not write the DraInSync condition; retrying next pass");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_plan_names_only_its_own_out_of_sync_nodes() {
        let verdicts = vec![
            (NodeCondition::Set(false, "SlicesStale", "lists gpu-0-mig-14-0-2".into()), None),
            (NodeCondition::Set(true, "InSync", "ok".into()), None),
            (NodeCondition::Set(false, "DynamicMig", "counters".into()), Some("counters".into())),
            (NodeCondition::Set(false, "SlicesStale", "misses gpu 0 1g.10gb at 0".into()), None),
        ];
        let mut reports: BTreeMap<String, PlanReport> = [
            ("a".to_string(), PlanReport { nodes: vec![0, 1, 2], ..Default::default() }),
            ("b".to_string(), PlanReport { nodes: vec![3, 9], ..Default::default() }),
        ]
        .into();
        name_stale(&mut reports, &verdicts, &["n0", "n1", "n2", "n3"]);
        assert_eq!(reports["a"].dra_stale, ["n0: lists gpu-0-mig-14-0-2"]);
        assert_eq!(reports["b"].dra_stale, ["n3: misses gpu 0 1g.10gb at 0"], "a position past the pass is skipped");
    }

    /// An API server: discovery of `resource.k8s.io/v1` answers `discovery` (404: not served),
    /// a list of slices answers `list` (one slice of n1) and a watch never answers.
    fn api(discovery: u16, list: u16) -> Client {
        let served = crate::controller::fake_dra_api::Served {
            plural: "resourceslices",
            singular: "resourceslice",
            kind: "ResourceSlice",
            namespaced: false,
            items: json!([{"metadata": {"name": "n1-gpu"}, "spec": {"driver": "gpu.nvidia.com", "nodeName": "n1",
                           "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1}}}]),
        };
        crate::controller::fake_dra_api::api(served, discovery, list)
    }

    #[tokio::test]
    async fn slices_that_cannot_be_listed_hold_the_passes_and_no_api_means_none() {
        let within = |ms: u64| std::time::Duration::from_millis(ms);
        let listed = DraWatch::start(api(200, 200), GpuDrivers::default(), vec![]);
        tokio::time::timeout(within(5000), listed.wait_ready()).await.expect("ready once listed");
        assert_eq!(listed.slices().len(), 1);
        // Served but not listable (the RBAC rule missing): never ready, so no pass plans blind.
        let forbidden = DraWatch::start(api(200, 403), GpuDrivers::default(), vec![]);
        assert!(tokio::time::timeout(within(300), forbidden.wait_ready()).await.is_err());
        // Not served at all: no GPU driver can publish; ready and empty.
        let woken = Arc::new(Notify::new());
        let none = DraWatch::start(api(404, 500), GpuDrivers::default(), vec![woken.clone()]);
        tokio::time::timeout(within(5000), none.wait_ready()).await.expect("ready without the API");
        assert!(none.slices().is_empty());
        tokio::time::timeout(within(5000), woken.notified()).await.expect("the passes are woken");
    }

    #[test]
    fn the_rollout_waits_on_stale_or_publishing_slices_only() {
        assert_eq!(slices_of(&NodeCondition::Absent), DraSlices::None);
        assert_eq!(slices_of(&NodeCondition::Keep), DraSlices::Publishing);
        assert_eq!(slices_of(&NodeCondition::Set(true, "InSync", "ok".into())), DraSlices::InSync);
        let stale = NodeCondition::Set(false, "SlicesStale", "lists gpu-0-mig-14-0-2".into());
        assert_eq!(slices_of(&stale), DraSlices::Stale("lists gpu-0-mig-14-0-2".into()));
    }
}
