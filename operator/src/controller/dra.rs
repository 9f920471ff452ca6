//! The GPU DRA drivers' ResourceSlices in the operator (see `dra_slices`): a cache of them, the
//! nodes the rollout refuses (DynamicMIG), the stand-ins that carry their supply to the quota
//! and layout counts, and each GpuNode's `DraInSync` condition, written under its own field
//! manager so neither the agent's status writes nor the rollout's remove it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use tessera_crds::GpuNode;
use tessera_crds::conditions;
use tokio::sync::Notify;
use tracing::warn;

use super::Context;
use super::slots::Slots;
use crate::dra::GpuDrivers;
use crate::dra_slices::{self, DRA_IN_SYNC, NodeCondition};
use crate::rollout::{NodeInput, PlanReport};
use crate::wake::Waker;

/// Field manager of the `DraInSync` conditions on GpuNodes.
pub const DRA_MANAGER: &str = "tessera-operator-dra";

/// The cached ResourceSlices of the GPU drivers.
pub struct DraWatch {
    store: Store<ResourceSlice>,
    drivers: GpuDrivers,
}

impl DraWatch {
    /// Watches the slices (of the one driver by field selector when there is one), waking
    /// `wake` on every change. A cluster without `resource.k8s.io/v1` keeps the cache empty and
    /// the watch retrying: nothing is refused or counted from it.
    pub fn start(client: Client, drivers: GpuDrivers, wake: Vec<Arc<Notify>>) -> Arc<Self> {
        let mut config = watcher::Config::default();
        if let [one] = drivers.iter().collect::<Vec<_>>().as_slice() {
            config = config.fields(&format!("spec.driver={one}"));
        }
        let wakers = wake.into_iter().map(Waker::always).collect();
        let api = Api::<ResourceSlice>::all(client);
        let (store, _) =
            super::watch_into_store_waking(api, config, wakers, super::trim_metadata, Default::default(), None);
        Arc::new(DraWatch { store, drivers })
    }

    /// Waits for the first list, at most `limit` (it may never come: no DRA API). Until it
    /// comes, a DynamicMIG node is not recognised; the bound keeps the operator starting.
    pub async fn wait_ready_for(&self, limit: Duration) -> bool {
        tokio::time::timeout(limit, self.store.wait_until_ready()).await.is_ok_and(|r| r.is_ok())
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

/// The stand-ins of `dra` (none without it) for the GpuNodes in `store`.
pub fn supply_nodes(dra: Option<&Arc<DraWatch>>, store: &Store<GpuNode>) -> Vec<GpuNode> {
    dra.map(|d| d.supply_nodes(|n| store.get(&kube::runtime::reflector::ObjectRef::new(n)))).unwrap_or_default()
}

/// Per node position: the node's [`NodeCondition`], from its slices and its cached GpuNode.
fn verdicts(
    slices: &[Arc<ResourceSlice>],
    drivers: &GpuDrivers,
    slots: &Slots,
) -> Vec<(NodeCondition, Option<String>)> {
    let nodes = dra_slices::by_node(slices.iter().map(|s| &**s), drivers);
    slots
        .slots
        .iter()
        .map(|slot| {
            let node = nodes.get(slot.name.as_str());
            let status = slot.gpunode.as_ref().and_then(|g| g.status.as_ref());
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
            if let (Some((NodeCondition::Set(false, "SlicesStale", msg), _)), Some(name)) =
                (verdicts.get(i), names.get(i))
            {
                report.dra_stale.push(format!("{name}: {msg}"));
            }
        }
    }
}

impl Context {
    /// This pass's DRA verdicts per node (empty without a DRA cache); marks refused inputs.
    pub(super) fn dra_verdicts(
        &self,
        slots: &Slots,
        inputs: &mut [NodeInput<'_>],
    ) -> Vec<(NodeCondition, Option<String>)> {
        let Some(dra) = self.dra.get() else { return Vec::new() };
        let verdicts = verdicts(&dra.slices(), dra.drivers(), slots);
        for (input, (_, refused)) in inputs.iter_mut().zip(&verdicts) {
            input.dra_refused = refused.clone();
        }
        verdicts
    }

    /// Names each plan's out-of-sync nodes in its report, and writes the GpuNode conditions that
    /// changed. A failed write is logged and retried next pass (the cache still shows the old).
    pub(super) async fn write_dra(
        &self,
        verdicts: &[(NodeCondition, Option<String>)],
        reports: &mut BTreeMap<String, PlanReport>,
        slots: &Slots,
    ) {
        let names: Vec<&str> = slots.slots.iter().map(|s| s.name.as_str()).collect();
        name_stale(reports, verdicts, &names);
        let api: Api<GpuNode> = Api::all(self.client.clone());
        for (slot, (want, _)) in slots.slots.iter().zip(verdicts) {
            let Some(gn) = &slot.gpunode else { continue };
            let current = gn.status.as_ref().and_then(|s| conditions::find(&s.conditions, DRA_IN_SYNC));
            if !dra_slices::must_write(current, want) || self.may_write().is_err() {
                continue;
            }
            let conditions = match want {
                NodeCondition::Set(ok, reason, message) => {
                    let status = if *ok { "True" } else { "False" };
                    let since = current
                        .filter(|c| c.status == status)
                        .map_or_else(|| Time(k8s_openapi::jiff::Timestamp::now()), |c| c.last_transition_time.clone());
                    vec![json!({"type": DRA_IN_SYNC, "status": status, "reason": reason, "message": message,
                                "lastTransitionTime": since})]
                }
                NodeCondition::Absent | NodeCondition::Keep => vec![],
            };
            let body = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
                              "metadata": {"name": gn.name_any()}, "status": {"conditions": conditions}});
            let pp = PatchParams::apply(DRA_MANAGER).force();
            if let Err(e) = api.patch_status(&gn.name_any(), &pp, &Patch::Apply(&body)).await {
                self.metrics.error("kube");
                warn!(node = %slot.name, error = %e, "could not write the DraInSync condition; retrying next pass");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
