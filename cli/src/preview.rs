//! `tessera-operator plan preview FILE`: what applying a plan would do, against the live cluster,
//! without changing anything: nodes that change, pods that would be evicted, and the MIG
//! capacity before and after, per resource name. `-o markdown` writes it as a pull-request
//! comment (`cli::markdown`); `--from` reads the cluster's objects from files instead.

mod budgets;
mod quotas;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde::Serialize;
use tessera_crds::gpunode::{GpuIntent, GpuState};
use tessera_crds::validate::max_unavailable;
use tessera_crds::{GpuNode, GpuPartitionPlan, TenantGpuQuota, catalog};

use super::connect::{self, list_all};
use super::snapshot::Snapshot;
use crate::Error;
pub use budgets::BudgetBlock;
pub use quotas::{QuotaShort, ResourceShort};
use tessera_planner::dra::GpuDrivers;
use tessera_planner::drain::{PodVerdict, verdict_with_claims};
use tessera_planner::fleet_status::clean;
use tessera_planner::gpu_use::ClaimIndex;
use tessera_planner::quota::{Capacity, gpu_supply};
use tessera_planner::rollout::desired_intent;
use tessera_planner::selector::matches;

#[derive(Debug, Default, Serialize, PartialEq)]
pub struct Preview {
    pub plan: String,
    pub changes: Vec<NodeChange>,
    pub unchanged: Vec<String>,
    pub skipped: BTreeMap<String, String>,
    pub capacity_before: BTreeMap<String, i64>,
    pub capacity_after: BTreeMap<String, i64>,
    /// Tenant quotas the fleet would no longer supply once this plan's layouts are applied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quotas_short: Vec<QuotaShort>,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct NodeChange {
    pub node: String,
    pub gpus: Vec<GpuIntent>,
    pub evict: Vec<String>,
    /// Pods the drain would refuse to evict without an opt-in (no controller, emptyDir data, a
    /// DaemonSet that no longer exists).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<String>,
    /// Evictions (of pods in `evict`) a PodDisruptionBudget would refuse.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budget_blocked: Vec<BudgetBlock>,
}

impl NodeChange {
    /// What holds this node's drain: refused pods and budget refusals, one line each.
    pub fn blockers(&self) -> Vec<String> {
        self.refused.iter().cloned().chain(self.budget_blocked.iter().map(ToString::to_string)).collect()
    }
}

/// The cluster a preview reads, besides the plan itself.
pub struct Fleet<'a> {
    /// Every plan, the previewed ones included (they compete with each other).
    pub plans: &'a [GpuPartitionPlan],
    pub nodes: &'a [(Node, Option<GpuNode>)],
    pub pods: &'a [Pod],
    pub budgets: &'a [PodDisruptionBudget],
    /// The DaemonSets (namespace, name) that exist; `None` when they were not read (`--from`
    /// files without any): then every DaemonSet pod counts as managed.
    pub daemonsets: Option<&'a BTreeSet<(String, String)>>,
    pub quotas: &'a [TenantGpuQuota],
    /// What every GpuNode supplies now, as the quota controller reads it.
    pub capacity: &'a Capacity,
    /// The ResourceClaims: pods holding GPUs through DRA are GPU pods too (`gpu_use`).
    pub claims: &'a ClaimIndex,
}

/// The drain's verdict on `pod`, exactly as the rollout reaches it: "uses a GPU" decided by
/// `gpu_use` over the claims read (extended resources and ResourceClaims alike).
fn drain_verdict(
    pod: &Pod,
    policy: &tessera_crds::plan::RolloutPolicy,
    daemonsets: &BTreeSet<(String, String)>,
    claims: &ClaimIndex,
) -> PodVerdict {
    verdict_with_claims(pod, policy, daemonsets, claims)
}

fn supply_after(gpus: &[GpuState], intent: &[GpuIntent], out: &mut BTreeMap<String, i64>) {
    for g in gpus {
        match intent.iter().find(|i| i.index == g.index) {
            Some(i) if i.mig_enabled => {
                for (p, n) in &i.profiles {
                    *out.entry(catalog::mig_resource_name(p)).or_default() += i64::from(*n);
                }
            }
            Some(_) => *out.entry("nvidia.com/gpu".into()).or_default() += 1,
            None => gpu_supply(g, out),
        }
    }
}

/// Pure: the preview of `plan` against `fleet`.
pub fn preview(plan: &GpuPartitionPlan, fleet: &Fleet) -> Preview {
    let mut p = Preview { plan: plan.name_any(), ..Default::default() };
    let daemonsets = known_daemonsets(fleet);
    let pass = Pass { plan, fleet, daemonsets: &daemonsets };
    let mut evicted: Vec<(String, Vec<&Pod>)> = Vec::new();
    for (node, gn) in fleet.nodes {
        if matches(&plan.spec.node_selector, node.labels()) {
            pass.node(&mut p, &mut evicted, node, gn.as_ref());
        }
    }
    pass.budget_blocks(&mut p, &evicted);
    p.quotas_short = quotas_left_short(&p, fleet);
    p
}

/// The DaemonSets that exist. Without them read, those the pods name: their pods then count as
/// managed, as they usually are.
fn known_daemonsets<'a>(fleet: &Fleet<'a>) -> Cow<'a, BTreeSet<(String, String)>> {
    match fleet.daemonsets {
        Some(d) => Cow::Borrowed(d),
        None => Cow::Owned(fleet.pods.iter().filter_map(tessera_planner::drain::daemonset_of).collect()),
    }
}

/// One plan's preview over the fleet: what every node's step reads.
struct Pass<'p, 'a> {
    plan: &'p GpuPartitionPlan,
    fleet: &'p Fleet<'a>,
    daemonsets: &'p BTreeSet<(String, String)>,
}

impl<'a> Pass<'_, 'a> {
    /// One node the plan selects: skipped (with why), unchanged, or a change with the pods its
    /// drain would evict (also pushed to `evicted`, for the budgets).
    fn node(&self, p: &mut Preview, evicted: &mut Vec<(String, Vec<&'a Pod>)>, node: &Node, gn: Option<&GpuNode>) {
        let name = node.name_any();
        if let Some(why) = self.owned_elsewhere(node) {
            p.skipped.insert(name, why);
            return;
        }
        let Some(gpus) = gn.and_then(|g| g.status.as_ref()).map(|s| s.gpus.clone()).filter(|g| !g.is_empty()) else {
            p.skipped.insert(name, "no GPU inventory reported by a node agent".into());
            return;
        };
        gpus.iter().for_each(|g| gpu_supply(g, &mut p.capacity_before));
        if self.plan.spec.layouts_from.is_some() {
            p.skipped.insert(
                name,
                "automatic plan: the operator decides its layouts from the quotas at run time; \
                 `tessera-operator plan suggest` shows what it would change now"
                    .into(),
            );
            gpus.iter().for_each(|g| gpu_supply(g, &mut p.capacity_after));
            return;
        }
        match desired_intent(&self.plan.spec, &gpus) {
            Err(reason) => {
                p.skipped.insert(name, reason);
                gpus.iter().for_each(|g| gpu_supply(g, &mut p.capacity_after));
            }
            Ok(intent) => {
                supply_after(&gpus, &intent, &mut p.capacity_after);
                let current = gn.map(|g| g.spec.gpus.clone()).unwrap_or_default();
                if current == intent {
                    p.unchanged.push(name);
                    return;
                }
                let (evict, refused, pods) = self.drain(&name);
                evicted.push((name.clone(), pods));
                p.changes.push(NodeChange { node: name, gpus: intent, evict, refused, budget_blocked: Vec::new() });
            }
        }
    }

    /// Why another plan selecting `node` keeps it from this one: a higher priority owns it, the
    /// same priority is a conflict.
    fn owned_elsewhere(&self, node: &Node) -> Option<String> {
        let plan = self.plan;
        let rival = self
            .fleet
            .plans
            .iter()
            .filter(|o| o.name_any() != plan.name_any() && matches(&o.spec.node_selector, node.labels()));
        if let Some(o) = rival.clone().find(|o| o.spec.priority > plan.spec.priority) {
            return Some(format!("owned by plan {} (priority {})", o.name_any(), o.spec.priority));
        }
        rival
            .clone()
            .find(|o| o.spec.priority == plan.spec.priority)
            .map(|o| format!("conflict with plan {} (same priority {})", o.name_any(), o.spec.priority))
    }

    /// The drain of the pods on `node`: those evicted (as `namespace/name`, and the pods
    /// themselves) and why the others are refused.
    fn drain(&self, node: &str) -> (Vec<String>, Vec<String>, Vec<&'a Pod>) {
        let (mut evict, mut refused, mut pods) = (Vec::new(), Vec::new(), Vec::new());
        for pod in
            self.fleet.pods.iter().filter(|pod| pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        {
            match drain_verdict(pod, &self.plan.spec.rollout, self.daemonsets, self.fleet.claims) {
                PodVerdict::Evict => {
                    evict.push(format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()));
                    pods.push(pod);
                }
                PodVerdict::Refuse(why) => refused.push(why),
                PodVerdict::Wait | PodVerdict::Skip(_) => {}
            }
        }
        (evict, refused, pods)
    }

    /// Sets each change's budget refusals, counted against the rollout's own slot count:
    /// `maxUnavailable` of the nodes it owns.
    fn budget_blocks(&self, p: &mut Preview, evicted: &[(String, Vec<&Pod>)]) {
        let owned = p.changes.len() + p.unchanged.len();
        let wave = max_unavailable(&self.plan.spec.rollout.max_unavailable, owned).unwrap_or(1);
        let mut blocked = budgets::blocks(evicted, self.fleet.budgets, wave);
        for c in &mut p.changes {
            c.budget_blocked = blocked.remove(&c.node).unwrap_or_default();
        }
    }
}

/// The tenant quotas left short once the plan's nodes supply `capacity_after` instead of
/// `capacity_before`, the rest of the fleet unchanged.
fn quotas_left_short(p: &Preview, fleet: &Fleet) -> Vec<QuotaShort> {
    let mut after = fleet.capacity.clone();
    for (r, n) in &p.capacity_before {
        *after.supply.entry(r.clone()).or_default() -= n;
    }
    for (r, n) in &p.capacity_after {
        *after.supply.entry(r.clone()).or_default() += n;
    }
    quotas::short(fleet.quotas, fleet.capacity, &after)
}

/// The plans of one file, each checked as `validate` checks it; `Ok(false)` when one is
/// invalid (its errors printed).
fn read_plans(file: &str, plans: &mut Vec<GpuPartitionPlan>) -> Result<bool, Error> {
    let text = std::fs::read_to_string(file).map_err(|source| Error::ReadFile { path: file.into(), source })?;
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).map_err(|e| Error::Usage(format!("{file}: {e}")))?;
    let mut valid = true;
    for v in docs {
        if v.get("kind").and_then(|k| k.as_str()) == Some("GpuPartitionPlan") {
            // Unknown fields first: serde drops them, and the plan previewed would not be the one meant.
            let mut errs = tessera_crds::validate::strict::unknown_fields("GpuPartitionPlan", &v);
            let p: GpuPartitionPlan = serde_json::from_value(v).map_err(|e| Error::Usage(format!("{file}: {e}")))?;
            errs.extend(tessera_crds::validate::validate_plan(&p.spec));
            for e in &errs {
                println!("{}", clean(&format!("{file}: {}: {e}", p.name_any())));
            }
            valid &= errs.is_empty();
            plans.push(p);
        }
    }
    Ok(valid)
}

/// The cluster's Nodes, GpuNodes, Pods, plans, PodDisruptionBudgets, DaemonSets, quotas and
/// ResourceClaims; every list must succeed (a preview of part of the fleet would understate what
/// changes: without the claims, pods holding GPUs through DRA would look like CPU pods).
async fn from_cluster(client: Client, limit: Option<Duration>) -> Result<Snapshot, Error> {
    let all = ListParams::default();
    Ok(Snapshot {
        plans: list_all(&Api::<GpuPartitionPlan>::all(client.clone()), &all, limit).await?,
        gpunodes: list_all(&Api::<GpuNode>::all(client.clone()), &all, limit).await?,
        nodes: list_all(&Api::<Node>::all(client.clone()), &all, limit).await?,
        pods: list_all(&Api::<Pod>::all(client.clone()), &all, limit).await?,
        budgets: list_all(&Api::<PodDisruptionBudget>::all(client.clone()), &all, limit).await?,
        daemonsets: Some(list_all(&Api::<DaemonSet>::all(client.clone()), &all, limit).await?),
        quotas: list_all(&Api::<TenantGpuQuota>::all(client.clone()), &all, limit).await?,
        claims: list_all(&Api::<ResourceClaim>::all(client), &all, limit)
            .await
            .map_err(|e| Error::Usage(format!("cannot read resourceclaims.resource.k8s.io: {e} (the preview needs them to see pods holding GPUs through DRA)")))?,
        slices: Vec::new(),
        leases: None,
    })
}

/// Previews every plan of `files` against the cluster (or the `from` files); `None` when a plan
/// is invalid (each error printed): nothing is previewed then.
pub async fn previews(
    files: &[String],
    from: &[String],
    drivers: &GpuDrivers,
    cluster: &connect::ClusterArgs,
) -> Result<Option<Vec<Preview>>, Error> {
    let mut plans = Vec::new();
    let mut valid = true;
    for file in files {
        valid &= read_plans(file, &mut plans)?;
    }
    if !valid {
        return Ok(None);
    }
    if plans.is_empty() {
        return Err(Error::Usage(format!("{} hold(s) no GpuPartitionPlan", files.join(", "))));
    }
    let world = if from.is_empty() {
        from_cluster(connect::client(cluster).await?, cluster.request_limit()).await?
    } else {
        Snapshot::read(from)?
    };
    // The plans under review replace their namesakes in the cluster and compete with each other.
    let mut others: Vec<GpuPartitionPlan> =
        world.plans.into_iter().filter(|o| !plans.iter().any(|p| p.name_any() == o.name_any())).collect();
    others.extend(plans.iter().cloned());
    let capacity = Capacity::of(&world.gpunodes);
    let claims = ClaimIndex::new(&world.claims, drivers);
    let gns: BTreeMap<String, GpuNode> = world.gpunodes.into_iter().map(|g| (g.name_any(), g)).collect();
    let nodes: Vec<(Node, Option<GpuNode>)> = world
        .nodes
        .into_iter()
        .map(|n| {
            let g = gns.get(&n.name_any()).cloned();
            (n, g)
        })
        .collect();
    let daemonsets: Option<BTreeSet<(String, String)>> =
        world.daemonsets.map(|d| d.iter().map(|d| (d.namespace().unwrap_or_default(), d.name_any())).collect());
    let fleet = Fleet {
        plans: &others,
        nodes: &nodes,
        pods: &world.pods,
        budgets: &world.budgets,
        daemonsets: daemonsets.as_ref(),
        quotas: &world.quotas,
        capacity: &capacity,
        claims: &claims,
    };
    Ok(Some(plans.iter().map(|p| preview(p, &fleet)).collect()))
}

/// `gpu0-6=whole gpu7=7x1g.10gb`: consecutive GPUs with the same layout share one entry.
pub fn layout_summary(gpus: &[GpuIntent]) -> String {
    let mut sorted: Vec<&GpuIntent> = gpus.iter().collect();
    sorted.sort_by_key(|g| g.index);
    let label = |g: &GpuIntent| {
        let prof: Vec<String> = g.profiles.iter().map(|(k, v)| format!("{v}x{k}")).collect();
        if g.mig_enabled { prof.join("+") } else { "whole".to_string() }
    };
    let mut runs: Vec<(i32, i32, String)> = Vec::new();
    for g in sorted {
        let l = label(g);
        match runs.last_mut() {
            Some((_, last, prev)) if *prev == l && g.index == last.saturating_add(1) => *last = g.index,
            _ => runs.push((g.index, g.index, l)),
        }
    }
    runs.iter()
        .map(|(a, b, l)| if a == b { format!("gpu{a}={l}") } else { format!("gpu{a}-{b}={l}") })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The text output. Every name and message comes from the plan files or the cluster: cleaned
/// as `kubectl tessera status` cleans them, so none can drive the terminal or fake a line.
pub fn text(previews: &[Preview]) -> String {
    let mut out = String::new();
    // The fixed words hold no control character: cleaning each whole line cleans what it quotes.
    let mut line = |text: String| {
        out.push_str(&clean(&text));
        out.push('\n');
    };
    for p in previews {
        let (changes, unchanged, skipped) = (p.changes.len(), p.unchanged.len(), p.skipped.len());
        line(format!("plan {}: {changes} node(s) change, {unchanged} unchanged, {skipped} skipped", p.plan));
        for c in &p.changes {
            line(format!("  change {}: {}", c.node, layout_summary(&c.gpus)));
            for why in c.blockers() {
                line(format!("    blocks the drain: {why}"));
            }
            for pod in &c.evict {
                line(format!("    evict {pod}"));
            }
        }
        for (n, why) in &p.skipped {
            line(format!("  skip {n}: {why}"));
        }
        for q in &p.quotas_short {
            line(format!("  leaves short {q}"));
        }
        line("  capacity (before -> after):".to_string());
        for (k, b, a) in p.capacity_rows() {
            line(format!("    {k}: {b} -> {a}"));
        }
    }
    out
}

impl Preview {
    /// Every resource on either side: (name, before, after).
    pub fn capacity_rows(&self) -> Vec<(&str, i64, i64)> {
        let keys: std::collections::BTreeSet<&String> =
            self.capacity_before.keys().chain(self.capacity_after.keys()).collect();
        keys.into_iter()
            .map(|k| {
                let b = self.capacity_before.get(k).copied().unwrap_or(0);
                let a = self.capacity_after.get(k).copied().unwrap_or(0);
                (k.as_str(), b, a)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
