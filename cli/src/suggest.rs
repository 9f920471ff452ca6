//! `tessera-operator plan suggest`: the GpuPartitionPlans that make the fleet's MIG supply cover
//! every tenant's quota (plus headroom), changing as few GPUs as possible (`fleet::solve`).
//! Reads the live cluster, or files of TenantGpuQuotas, GpuNodes and Nodes (for CI), and prints
//! plans ready to commit: one per group of nodes that change the same way, each narrowed to the
//! GPU indices that change (the others are left alone), with a summary as YAML comments.
//!
//! Which instances are busy is not in the API (the device plugin assigns them), so a node with a
//! running GPU pod (extended resources or ResourceClaims, `gpu_use`) is never changed: the
//! suggestion evicts nothing.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde::Serialize;
use serde_json::json;
use tessera_crds::{GpuNode, GpuPartitionPlan, TenantGpuQuota};

use super::Output;
use super::connect::{self, ClusterArgs, list_all};
use crate::Error;
use tessera_planner::coverage::{self, Demand};
use tessera_planner::dra::GpuDrivers;
use tessera_planner::fleet::{FleetAnswer, Layout};
use tessera_planner::gpu_use::{ClaimIndex, uses_gpu};
use tessera_planner::rollout::contenders;
use tessera_planner::selector::matches;

/// What the suggestion is computed from.
#[derive(Debug, Default)]
pub struct Inputs {
    pub quotas: Vec<TenantGpuQuota>,
    pub gpunodes: Vec<GpuNode>,
    /// Node labels by name (for `--selector` and a plan's nodeSelector); nodes absent here have none.
    pub labels: BTreeMap<String, BTreeMap<String, String>>,
    /// Nodes running a GPU pod: never changed.
    pub busy_nodes: BTreeMap<String, Vec<String>>,
    /// The existing plans: `--plan` names one, and the suggestion must win over them all.
    pub plans: Vec<GpuPartitionPlan>,
}

/// What to suggest for.
#[derive(Debug, Clone)]
pub enum Scope {
    /// Every quota, plus `headroom` percent on each; GPUs of nodes `selector` matches may change.
    Fleet { selector: LabelSelector, headroom: u32 },
    /// What the automatic plan of this name would decide now: the quotas it selects plus its
    /// headroom and the other quotas' guarantees; GPUs of the nodes it owns may change.
    Plan(String),
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Suggestion {
    /// The automatic plan suggested for (`--plan`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// What the fleet must supply in all, per resource.
    pub demand: BTreeMap<String, i64>,
    /// Of `demand`, what quotas the plan does not select are guaranteed (`--plan` only).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub not_selected: BTreeMap<String, i64>,
    pub answer: FleetAnswer,
    pub plans: Vec<serde_json::Value>,
    /// Nodes left alone because GPU pods run there, with the pods.
    pub kept_busy: BTreeMap<String, Vec<String>>,
}

/// Refuses inputs without a quota to plan for (an export without its TenantGpuQuotas would
/// otherwise print an empty table); `source` names where they were read from.
pub fn check_quotas(inputs: &Inputs, source: &str) -> Result<(), Error> {
    if inputs.quotas.is_empty() {
        return Err(Error::Usage(format!(
            "no TenantGpuQuota in {source}: there is no demand to plan for (export the quotas too: kubectl get \
             tenantgpuquotas -o yaml)"
        )));
    }
    if !inputs.quotas.iter().any(coverage::guaranteed) {
        return Err(Error::Usage(format!(
            "none of the {} TenantGpuQuota(s) in {source} is valid and not being deleted: there is no demand to plan \
             for (tessera-operator validate names what is wrong)",
            inputs.quotas.len()
        )));
    }
    Ok(())
}

/// The nodes plan `name` owns: those it matches at the top priority alone (as the controller
/// decides ownership).
fn owned_by(inputs: &Inputs, name: &str) -> BTreeSet<String> {
    let live: Vec<&GpuPartitionPlan> =
        inputs.plans.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
    let empty = BTreeMap::new();
    inputs
        .gpunodes
        .iter()
        .map(|g| g.name_any())
        .filter(|n| contenders(&live, inputs.labels.get(n).unwrap_or(&empty)) == [name])
        .collect()
}

/// The demand and which nodes may change, for `scope`.
fn scoped(inputs: &Inputs, scope: &Scope) -> Result<(Demand, BTreeSet<String>), Error> {
    let empty = BTreeMap::new();
    match scope {
        Scope::Fleet { selector, headroom } => {
            let demand = Demand::of(&inputs.quotas, |_| true, i64::from(*headroom));
            let nodes = inputs.gpunodes.iter().map(|g| g.name_any());
            Ok((demand, nodes.filter(|n| matches(selector, inputs.labels.get(n).unwrap_or(&empty))).collect()))
        }
        Scope::Plan(name) => {
            let plan = inputs
                .plans
                .iter()
                .find(|p| p.name_any() == *name && p.metadata.deletion_timestamp.is_none())
                .ok_or_else(|| Error::Usage(format!("--plan {name}: no GpuPartitionPlan of that name")))?;
            let from = plan.spec.layouts_from.as_ref().ok_or_else(|| {
                Error::Usage(format!(
                    "--plan {name}: the plan has fixed layouts (spec.layouts); --plan takes an automatic plan \
                     (spec.layoutsFrom)"
                ))
            })?;
            Ok((tessera_planner::automatic_layouts::plan_demand(from, &inputs.quotas), owned_by(inputs, name)))
        }
    }
}

/// Pure: the whole suggestion. For a plan, the same computation as the controller's decision
/// (`automatic_layouts::solve_for`): nodes running GPU pods, mid-change, failed or left out by the plan
/// (their agent cannot apply) are left alone.
pub fn suggest(inputs: &Inputs, scope: &Scope) -> Result<Suggestion, Error> {
    let (demand, may_change) = scoped(inputs, scope)?;
    let mut frozen: BTreeSet<String> = inputs
        .gpunodes
        .iter()
        .filter(|g| tessera_planner::automatic_layouts::frozen_by_rollout(g))
        .map(|g| g.name_any())
        .collect();
    // The nodes the plan leaves out because their agent cannot apply (`automatic_layouts::exclusions`).
    if let Scope::Plan(name) = scope
        && let Some(plan) =
            inputs.plans.iter().find(|p| p.name_any() == *name && p.metadata.deletion_timestamp.is_none())
    {
        let owned = inputs.gpunodes.iter().filter(|g| may_change.contains(&g.name_any()));
        frozen.extend(tessera_planner::automatic_layouts::exclusions(plan, owned).kept.into_iter().map(|e| e.node));
    }
    let changeable = |n: &str| may_change.contains(n) && !inputs.busy_nodes.contains_key(n) && !frozen.contains(n);
    let answer = tessera_planner::automatic_layouts::solve_for(&demand, &inputs.gpunodes, &changeable)
        .map_err(|e| Error::Usage(e.to_string()))?;
    let max_priority = inputs.plans.iter().map(|p| p.spec.priority).max().unwrap_or(0);
    let plans = plans(&answer, max_priority.saturating_add(10));
    Ok(Suggestion {
        plan: match scope {
            Scope::Plan(name) => Some(name.clone()),
            Scope::Fleet { .. } => None,
        },
        demand: demand.total(),
        not_selected: demand.others.into_iter().filter(|(_, n)| *n > 0).collect(),
        answer,
        plans,
        kept_busy: inputs.busy_nodes.clone(),
    })
}

/// Plans that realise the answer: nodes that change the same way share one plan, selected by
/// `kubernetes.io/hostname`, with one layout per group of GPU indices.
pub fn plans(answer: &FleetAnswer, priority: i32) -> Vec<serde_json::Value> {
    let mut per_node: BTreeMap<&str, BTreeMap<String, (serde_json::Value, Vec<i32>)>> = BTreeMap::new();
    for g in answer.gpus.iter().filter(|g| g.changed) {
        let layout = match &g.layout {
            Layout::Whole => json!({"gpuProduct": g.product, "migEnabled": false}),
            Layout::Mig(_) => json!({"gpuProduct": g.product, "profiles": g.layout.profiles()}),
        };
        let entry = per_node.entry(&g.node).or_default().entry(layout.to_string()).or_insert((layout, vec![]));
        entry.1.push(g.index);
    }
    let mut groups: BTreeMap<String, (Vec<serde_json::Value>, Vec<&str>)> = BTreeMap::new();
    for (node, layouts) in per_node {
        let list: Vec<serde_json::Value> = layouts
            .into_values()
            .map(|(mut l, mut indices)| {
                indices.sort();
                l["gpuIndices"] = json!(indices);
                l
            })
            .collect();
        let key = serde_json::to_string(&list).unwrap_or_default();
        groups.entry(key).or_insert((list, vec![])).1.push(node);
    }
    groups
        .into_values()
        .enumerate()
        .map(|(i, (layouts, nodes))| {
            json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan",
                "metadata": {"name": format!("tessera-suggested-{}", i + 1)},
                "spec": {"priority": priority,
                         "nodeSelector": {"matchExpressions": [
                             {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]},
                         "layouts": layouts}})
        })
        .collect()
}

/// The nodes running a pod that uses a GPU (`gpu_use`: extended resources or ResourceClaims)
/// and has not finished, with those pods: the controller's busy check for automatic layouts.
pub fn busy_nodes(pods: &[Pod], claims: &ClaimIndex) -> BTreeMap<String, Vec<String>> {
    let mut busy: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pod in pods {
        let running = !matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"));
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty());
        if let (true, Some(node)) = (running, node)
            && uses_gpu(pod, claims)
        {
            busy.entry(node).or_default().push(format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()));
        }
    }
    busy
}

/// Reads TenantGpuQuotas, GpuNodes, Nodes, plans, Pods and ResourceClaims from YAML files.
fn from_files(files: &[String], drivers: &GpuDrivers) -> Result<Inputs, Error> {
    let mut inputs = Inputs::default();
    let (mut pods, mut claims): (Vec<Pod>, Vec<ResourceClaim>) = (Vec::new(), Vec::new());
    for file in files {
        let text = std::fs::read_to_string(file).map_err(|source| Error::ReadFile { path: file.clone(), source })?;
        let docs: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(&text).map_err(|e| Error::Usage(format!("{file}: {e}")))?;
        for v in docs {
            let bad = |e: serde_json::Error| Error::Usage(format!("{file}: {e}"));
            match v.get("kind").and_then(|k| k.as_str()) {
                Some("TenantGpuQuota") => inputs.quotas.push(serde_json::from_value(v).map_err(bad)?),
                Some("GpuNode") => inputs.gpunodes.push(serde_json::from_value(v).map_err(bad)?),
                Some("Node") => {
                    let n: Node = serde_json::from_value(v).map_err(bad)?;
                    inputs.labels.insert(n.name_any(), n.labels().clone());
                }
                Some("GpuPartitionPlan") => inputs.plans.push(serde_json::from_value(v).map_err(bad)?),
                Some("Pod") => pods.push(serde_json::from_value(v).map_err(bad)?),
                Some("ResourceClaim") => claims.push(serde_json::from_value(v).map_err(bad)?),
                _ => {}
            }
        }
    }
    inputs.busy_nodes = busy_nodes(&pods, &ClaimIndex::new(&claims, drivers));
    Ok(inputs)
}

/// The cluster as `plan preview` reaches it (`--kubeconfig`, `--context`, `--request-timeout`),
/// every list read in pages.
async fn from_cluster(cluster: &ClusterArgs, drivers: &GpuDrivers) -> Result<Inputs, Error> {
    let client = connect::client(cluster).await?;
    let (lp, limit) = (ListParams::default(), cluster.request_limit());
    let mut inputs = Inputs {
        quotas: list_all(&Api::<TenantGpuQuota>::all(client.clone()), &lp, limit).await?,
        gpunodes: list_all(&Api::<GpuNode>::all(client.clone()), &lp, limit).await?,
        ..Default::default()
    };
    for n in list_all(&Api::<Node>::all(client.clone()), &lp, limit).await? {
        inputs.labels.insert(n.name_any(), n.labels().clone());
    }
    inputs.plans = list_all(&Api::<GpuPartitionPlan>::all(client.clone()), &lp, limit).await?;
    let pods = list_all(&Api::<Pod>::all(client.clone()), &lp, limit).await?;
    // Unread claims would make pods holding GPUs through DRA look idle: no suggestion then.
    let claims = list_all(&Api::<ResourceClaim>::all(client), &lp, limit).await.map_err(|e| {
        Error::Usage(format!(
            "cannot read resourceclaims.resource.k8s.io: {e} (needed to see pods holding GPUs through DRA)"
        ))
    })?;
    inputs.busy_nodes = busy_nodes(&pods, &ClaimIndex::new(&claims, drivers));
    Ok(inputs)
}

pub async fn run(
    files: &[String],
    selector: Option<&str>,
    headroom: u32,
    plan: Option<&str>,
    cluster: &ClusterArgs,
    drivers: &GpuDrivers,
    output: Output,
) -> Result<i32, Error> {
    let scope = match plan {
        Some(name) => Scope::Plan(name.to_string()),
        None => Scope::Fleet { selector: parse_selector(selector)?, headroom },
    };
    let (inputs, source) = if files.is_empty() {
        (from_cluster(cluster, drivers).await?, "the cluster".to_string())
    } else {
        (from_files(files, drivers)?, format!("--from {}", files.join(", ")))
    };
    check_quotas(&inputs, &source)?;
    let s = suggest(&inputs, &scope)?;
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&s)?),
        Output::Text => print_text(&s),
    }
    Ok(if s.answer.shortfall.is_empty() { 0 } else { 1 })
}

/// `key=value,key2=value2` (equality only, as kubectl's simplest form).
fn parse_selector(s: Option<&str>) -> Result<LabelSelector, Error> {
    let mut labels = BTreeMap::new();
    for part in s.unwrap_or_default().split(',').filter(|p| !p.is_empty()) {
        let (k, v) =
            part.split_once('=').ok_or_else(|| Error::Usage(format!("--selector: {part:?} is not key=value")))?;
        labels.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(LabelSelector { match_labels: (!labels.is_empty()).then_some(labels), ..Default::default() })
}

fn print_text(s: &Suggestion) {
    let a = &s.answer;
    println!("# tessera-operator plan suggest");
    match &s.plan {
        Some(plan) => println!(
            "# as plan {plan} would decide now: the quotas it selects plus its headroom, and every other quota's guarantee"
        ),
        None => println!("# for every quota"),
    }
    println!(
        "# GPUs that change: {}; instances destroyed: {}; fragmentation after: {} compute slice(s)",
        a.changed, a.destroyed, a.fragmentation
    );
    println!("# pods evicted: none (nodes running GPU pods are left alone)");
    if !a.optimal {
        println!("# the search hit its time limit: this is the best answer found, not proven the fewest changes");
    }
    for (node, pods) in &s.kept_busy {
        println!("#   left alone: {node} ({})", pods.join(", "));
    }
    println!("# {:<28} {:>7} {:>7} {:>7}", "resource", "demand", "before", "after");
    let mut names: Vec<&String> = s.demand.keys().chain(a.supply_before.keys()).chain(a.supply_after.keys()).collect();
    names.sort();
    names.dedup();
    for r in names {
        let get = |m: &BTreeMap<String, i64>| m.get(r).copied().unwrap_or(0);
        println!("# {:<28} {:>7} {:>7} {:>7}", r, get(&s.demand), get(&a.supply_before), get(&a.supply_after));
    }
    if !s.not_selected.is_empty() {
        let parts: Vec<String> = s.not_selected.iter().map(|(r, n)| format!("{n} {r}")).collect();
        println!("# the demand includes {} guaranteed to quotas the plan does not select", parts.join(", "));
    }
    for (r, n) in &a.shortfall {
        println!("# SHORT: {r} by {n}: no layout of the changeable GPUs covers it; this is the closest answer");
    }
    for p in &s.plans {
        println!("---");
        print!("{}", serde_saphyr::to_string(p).unwrap_or_default());
    }
}

#[cfg(test)]
mod tests;
