//! `tessera-operator plan preview FILE`: what applying a plan would do, against the live cluster,
//! without changing anything: nodes that change, pods that would be evicted, and the MIG
//! capacity before and after, per resource name. `-o markdown` writes it as a pull-request
//! comment (`cli::markdown`); `--from` reads the cluster's objects from files instead.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde::Serialize;
use tessera_crds::gpunode::{GpuIntent, GpuState};
use tessera_crds::{GpuNode, GpuPartitionPlan, catalog};

use super::Format;
use super::commands::PreviewArgs;
use super::connect::{self, list_all};
use super::snapshot::Snapshot;
use crate::Error;
use crate::drain::{PodVerdict, verdict};
use crate::quota::gpu_supply;
use crate::rollout::desired_intent;
use crate::selector::matches;

#[derive(Debug, Default, Serialize, PartialEq)]
pub struct Preview {
    pub plan: String,
    pub changes: Vec<NodeChange>,
    pub unchanged: Vec<String>,
    pub skipped: BTreeMap<String, String>,
    pub capacity_before: BTreeMap<String, i64>,
    pub capacity_after: BTreeMap<String, i64>,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct NodeChange {
    pub node: String,
    pub gpus: Vec<GpuIntent>,
    pub evict: Vec<String>,
    /// Pods the drain would refuse to evict without an opt-in (no controller, emptyDir data).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<String>,
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

/// Pure: the preview of `plan` given the other plans and the cluster's nodes and pods.
pub fn preview(
    plan: &GpuPartitionPlan,
    others: &[GpuPartitionPlan],
    nodes: &[(Node, Option<GpuNode>)],
    pods: &[Pod],
) -> Preview {
    let mut p = Preview { plan: plan.name_any(), ..Default::default() };
    for (node, gn) in nodes {
        let name = node.name_any();
        if !matches(&plan.spec.node_selector, node.labels()) {
            continue;
        }
        let rival =
            others.iter().filter(|o| o.name_any() != plan.name_any() && matches(&o.spec.node_selector, node.labels()));
        if let Some(o) = rival.clone().find(|o| o.spec.priority > plan.spec.priority) {
            p.skipped.insert(name, format!("owned by plan {} (priority {})", o.name_any(), o.spec.priority));
            continue;
        }
        if let Some(o) = rival.clone().find(|o| o.spec.priority == plan.spec.priority) {
            p.skipped.insert(name, format!("conflict with plan {} (same priority {})", o.name_any(), o.spec.priority));
            continue;
        }
        let Some(gpus) = gn.as_ref().and_then(|g| g.status.as_ref()).map(|s| s.gpus.clone()).filter(|g| !g.is_empty())
        else {
            p.skipped.insert(name, "no GPU inventory reported by a node agent".into());
            continue;
        };
        gpus.iter().for_each(|g| gpu_supply(g, &mut p.capacity_before));
        if plan.spec.layouts_from.is_some() {
            p.skipped.insert(
                name,
                "automatic plan: the operator decides its layouts from the quotas at run time; \
                 `tessera-operator plan suggest` shows what it would change now"
                    .into(),
            );
            gpus.iter().for_each(|g| gpu_supply(g, &mut p.capacity_after));
            continue;
        }
        // A preview does not look DaemonSets up: their pods count as managed, as usual.
        let daemonsets: std::collections::BTreeSet<(String, String)> =
            pods.iter().filter_map(crate::drain::daemonset_of).collect();
        match desired_intent(&plan.spec, &gpus) {
            Err(reason) => {
                p.skipped.insert(name, reason);
                gpus.iter().for_each(|g| gpu_supply(g, &mut p.capacity_after));
            }
            Ok(intent) => {
                supply_after(&gpus, &intent, &mut p.capacity_after);
                let current = gn.as_ref().map(|g| g.spec.gpus.clone()).unwrap_or_default();
                if current == intent {
                    p.unchanged.push(name);
                    continue;
                }
                let (mut evict, mut refused) = (Vec::new(), Vec::new());
                for pod in pods
                    .iter()
                    .filter(|pod| pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name.as_str()))
                {
                    match verdict(pod, &plan.spec.rollout, &daemonsets) {
                        PodVerdict::Evict => {
                            evict.push(format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()))
                        }
                        PodVerdict::Refuse(why) => refused.push(why),
                        PodVerdict::Wait | PodVerdict::Skip(_) => {}
                    }
                }
                p.changes.push(NodeChange { node: name, gpus: intent, evict, refused });
            }
        }
    }
    p
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
                println!("{file}: {}: {e}", p.name_any());
            }
            valid &= errs.is_empty();
            plans.push(p);
        }
    }
    Ok(valid)
}

/// The cluster's Nodes, GpuNodes, Pods and plans; every list must succeed (a preview of part of
/// the fleet would understate what changes).
async fn from_cluster(client: Client, limit: Option<Duration>) -> Result<Snapshot, Error> {
    let all = ListParams::default();
    Ok(Snapshot {
        plans: list_all(&Api::<GpuPartitionPlan>::all(client.clone()), &all, limit).await?,
        gpunodes: list_all(&Api::<GpuNode>::all(client.clone()), &all, limit).await?,
        nodes: list_all(&Api::<Node>::all(client.clone()), &all, limit).await?,
        pods: list_all(&Api::<Pod>::all(client), &all, limit).await?,
        quotas: Vec::new(),
    })
}

/// Previews every plan of `args.files` against the cluster (or `--from` files). Exit 1 when a
/// plan is invalid; nothing is previewed then.
pub async fn run(args: &PreviewArgs, cluster: &connect::ClusterArgs, format: Format) -> Result<i32, Error> {
    let mut plans = Vec::new();
    let mut valid = true;
    for file in &args.files {
        valid &= read_plans(file, &mut plans)?;
    }
    if !valid {
        return Ok(1);
    }
    if plans.is_empty() {
        return Err(Error::Usage(format!("{} hold(s) no GpuPartitionPlan", args.files.join(", "))));
    }
    let world = if args.from.is_empty() {
        from_cluster(connect::client(cluster).await?, cluster.request_limit()).await?
    } else {
        Snapshot::read(&args.from)?
    };
    // The plans under review replace their namesakes in the cluster and compete with each other.
    let mut others: Vec<GpuPartitionPlan> =
        world.plans.into_iter().filter(|o| !plans.iter().any(|p| p.name_any() == o.name_any())).collect();
    others.extend(plans.iter().cloned());
    let gns: BTreeMap<String, GpuNode> = world.gpunodes.into_iter().map(|g| (g.name_any(), g)).collect();
    let nodes: Vec<(Node, Option<GpuNode>)> = world
        .nodes
        .into_iter()
        .map(|n| {
            let g = gns.get(&n.name_any()).cloned();
            (n, g)
        })
        .collect();
    let previews: Vec<Preview> = plans.iter().map(|p| preview(p, &others, &nodes, &world.pods)).collect();
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&previews)?),
        Format::Markdown => print!("{}", super::markdown::preview(&previews)),
        Format::Text => print_text(&previews),
    }
    Ok(0)
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

fn print_text(previews: &[Preview]) {
    for p in previews {
        println!(
            "plan {}: {} node(s) change, {} unchanged, {} skipped",
            p.plan,
            p.changes.len(),
            p.unchanged.len(),
            p.skipped.len()
        );
        for c in &p.changes {
            println!("  change {}: {}", c.node, layout_summary(&c.gpus));
            for why in &c.refused {
                println!("    blocks the drain: {why}");
            }
            for pod in &c.evict {
                println!("    evict {pod}");
            }
        }
        for (n, why) in &p.skipped {
            println!("  skip {n}: {why}");
        }
        println!("  capacity (before -> after):");
        for (k, b, a) in p.capacity_rows() {
            println!("    {k}: {b} -> {a}");
        }
    }
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
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn preview_lists_changes_evictions_and_capacity() {
        let plan: GpuPartitionPlan =
            serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan",
            "metadata": {"name": "p"}, "spec": {"nodeSelector": {"matchLabels": {"pool": "a"}},
            "layouts": [{"gpuProduct": "H100-80GB", "profiles": {"3g.40gb": 2}}]}}))
            .unwrap();
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1", "labels": {"pool": "a"}}})).unwrap();
        let other: Node = serde_json::from_value(json!({"metadata": {"name": "n2", "labels": {"pool": "b"}}})).unwrap();
        let gn: GpuNode = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "metadata": {"name": "n1"},
            "spec": {}, "status": {"gpus": [{"index": 0, "uuid": "u", "product": "NVIDIA H100 80GB HBM3", "migCapable": true}]}})).unwrap();
        let pod = |name: &str, node: &str, gpu: bool| -> Pod {
            let res = if gpu { json!({"limits": {"nvidia.com/gpu": "1"}}) } else { json!({}) };
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ml", "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u", "controller": true}]},
                "spec": {"nodeName": node, "containers": [{"name": "c", "resources": res}]}, "status": {"phase": "Running"}})).unwrap()
        };
        let mut notebook = pod("notebook", "n1", true);
        notebook.metadata.owner_references = None;
        let pods = [pod("train", "n1", true), pod("web", "n1", false), pod("far", "n2", true), notebook];
        let p = preview(&plan, &[], &[(node, Some(gn)), (other, None)], &pods);
        assert_eq!(p.changes.len(), 1);
        assert_eq!(p.changes[0].evict, vec!["ml/train"]);
        assert_eq!(p.changes[0].refused.len(), 1);
        assert!(p.changes[0].refused[0].contains("pod ml/notebook has no controller"), "{:?}", p.changes[0].refused);
        assert_eq!(p.capacity_before, [("nvidia.com/gpu".to_string(), 1)].into());
        assert_eq!(p.capacity_after, [("nvidia.com/mig-3g.40gb".to_string(), 2)].into());
    }
}
