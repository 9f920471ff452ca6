//! `tessera-operator plan suggest`: the GpuPartitionPlans that make the fleet's MIG supply cover
//! every tenant's quota (plus headroom), changing as few GPUs as possible (`fleet::solve`).
//! Reads the live cluster, or files of TenantGpuQuotas, GpuNodes and Nodes (for CI), and prints
//! plans ready to commit: one per group of nodes that change the same way, each narrowed to the
//! GPU indices that change (the others are left alone), with a summary as YAML comments.
//!
//! Which instances are busy is not in the API (the device plugin assigns them), so a node with a
//! running GPU pod is never changed: the suggestion evicts nothing.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde::Serialize;
use serde_json::json;
use tessera_crds::{GpuNode, GpuPartitionPlan, TenantGpuQuota};

use super::Output;
use crate::Error;
use crate::drain::uses_gpu;
use crate::fleet::{self, FleetAnswer, GpuSlot, Layout};
use crate::selector::matches;

/// What the suggestion is computed from.
#[derive(Debug, Default)]
pub struct Inputs {
    pub quotas: Vec<TenantGpuQuota>,
    pub gpunodes: Vec<GpuNode>,
    /// Node labels by name (for `--selector`); nodes absent here have none.
    pub labels: BTreeMap<String, BTreeMap<String, String>>,
    /// Nodes running a GPU pod: never changed.
    pub busy_nodes: BTreeMap<String, Vec<String>>,
    /// Priority of the existing plans (the suggestion must win over them).
    pub max_priority: i32,
}

#[derive(Debug, Serialize)]
pub struct Suggestion {
    pub demand: BTreeMap<String, i64>,
    pub answer: FleetAnswer,
    pub plans: Vec<serde_json::Value>,
    /// Nodes left alone because GPU pods run there, with the pods.
    pub kept_busy: BTreeMap<String, Vec<String>>,
}

/// The tenants' demand per resource: every quota's `hard`, plus `headroom_percent`, rounded up.
pub fn demand(quotas: &[TenantGpuQuota], headroom_percent: u32) -> BTreeMap<String, i64> {
    crate::auto::demand(quotas, i64::from(headroom_percent))
}

/// The solver's view of the reported GPUs: those of nodes the selector matches and that run no
/// GPU pod may change.
pub fn slots(inputs: &Inputs, selector: &LabelSelector) -> Vec<GpuSlot> {
    let empty = BTreeMap::new();
    let changeable = |node: &str| {
        matches(selector, inputs.labels.get(node).unwrap_or(&empty)) && !inputs.busy_nodes.contains_key(node)
    };
    crate::auto::gpu_slots(&inputs.gpunodes, &changeable)
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

/// Pure: the whole suggestion.
pub fn suggest(inputs: &Inputs, selector: &LabelSelector, headroom: u32) -> Result<Suggestion, Error> {
    let demand = demand(&inputs.quotas, headroom);
    let answer = fleet::solve(&slots(inputs, selector), &demand).map_err(|e| Error::Usage(e.to_string()))?;
    let plans = plans(&answer, inputs.max_priority.saturating_add(10));
    Ok(Suggestion { demand, answer, plans, kept_busy: inputs.busy_nodes.clone() })
}

/// Reads TenantGpuQuotas, GpuNodes and Nodes from YAML files.
fn from_files(files: &[String]) -> Result<Inputs, Error> {
    let mut inputs = Inputs::default();
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
                Some("GpuPartitionPlan") => {
                    let p: GpuPartitionPlan = serde_json::from_value(v).map_err(bad)?;
                    inputs.max_priority = inputs.max_priority.max(p.spec.priority);
                }
                _ => {}
            }
        }
    }
    Ok(inputs)
}

async fn from_cluster() -> Result<Inputs, Error> {
    let client = Client::try_default().await.map_err(|e| Error::Usage(format!("connecting to the cluster: {e}")))?;
    let lp = ListParams::default();
    let mut inputs = Inputs {
        quotas: Api::<TenantGpuQuota>::all(client.clone()).list(&lp).await?.items,
        gpunodes: Api::<GpuNode>::all(client.clone()).list(&lp).await?.items,
        ..Default::default()
    };
    for n in Api::<Node>::all(client.clone()).list(&lp).await?.items {
        inputs.labels.insert(n.name_any(), n.labels().clone());
    }
    for p in Api::<GpuPartitionPlan>::all(client.clone()).list(&lp).await?.items {
        inputs.max_priority = inputs.max_priority.max(p.spec.priority);
    }
    for pod in Api::<Pod>::all(client).list(&lp).await?.items {
        let running = !matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"));
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        if let (true, true, Some(node)) = (running, uses_gpu(&pod), node) {
            inputs.busy_nodes.entry(node).or_default().push(format!(
                "{}/{}",
                pod.namespace().unwrap_or_default(),
                pod.name_any()
            ));
        }
    }
    Ok(inputs)
}

pub async fn run(files: &[String], selector: Option<&str>, headroom: u32, output: Output) -> Result<i32, Error> {
    let selector = parse_selector(selector)?;
    let inputs = if files.is_empty() { from_cluster().await? } else { from_files(files)? };
    let s = suggest(&inputs, &selector, headroom)?;
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
    for (r, n) in &a.shortfall {
        println!("# SHORT: {r} by {n}: no layout of the changeable GPUs covers it; this is the closest answer");
    }
    for p in &s.plans {
        println!("---");
        print!("{}", serde_saphyr::to_string(p).unwrap_or_default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggested_plans_validate_and_cover_the_quotas() {
        let gn = |name: &str, instances: serde_json::Value| -> GpuNode {
            serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
                "metadata": {"name": name}, "spec": {}, "status": {"gpus": [
                    {"index": 0, "uuid": "a", "product": "NVIDIA H100 80GB HBM3", "migCapable": true, "migEnabled": true, "instances": instances},
                    {"index": 1, "uuid": "b", "product": "NVIDIA H100 80GB HBM3", "migCapable": true, "migEnabled": false}]}}))
            .unwrap()
        };
        let q: TenantGpuQuota = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
            "metadata": {"name": "t"}, "spec": {"namespaces": ["t"], "hard": {"nvidia.com/mig-1g.10gb": 10, "nvidia.com/gpu": 1}}}))
        .unwrap();
        let seven = json!([{"profile": "7g.80gb", "start": 0, "size": 8}]);
        let inputs = Inputs {
            quotas: vec![q],
            gpunodes: vec![gn("n1", seven.clone()), gn("n2", seven.clone()), gn("busy", seven)],
            busy_nodes: [("busy".to_string(), vec!["t/p".to_string()])].into(),
            max_priority: 5,
            ..Default::default()
        };
        let s = suggest(&inputs, &LabelSelector::default(), 0).unwrap();
        assert!(s.answer.shortfall.is_empty(), "{:?}", s.answer);
        // Ten 1g need two GPUs; the whole GPUs already give nvidia.com/gpu.
        assert_eq!(s.answer.changed, 2);
        assert!(
            s.answer.gpus.iter().filter(|g| g.node == "busy").all(|g| !g.changed),
            "a node with GPU pods is left alone"
        );
        for p in &s.plans {
            let plan: GpuPartitionPlan = serde_json::from_value(p.clone()).unwrap();
            assert_eq!(plan.spec.priority, 15);
            let errs = tessera_crds::validate::validate_plan(&plan.spec);
            assert!(errs.is_empty(), "{errs:?}");
        }
        assert_eq!(demand(&inputs.quotas, 25)["nvidia.com/mig-1g.10gb"], 13, "headroom rounds up");
    }
}
