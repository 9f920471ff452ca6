//! Which evictions a plan's drain would have refused by PodDisruptionBudgets, read the way the
//! Eviction API decides: the budget's `status.disruptionsAllowed` against how many of its pods
//! the plan evicts at once (`maxUnavailable` nodes drain together, every pod of a node at once).

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use serde::Serialize;

use tessera_planner::selector::matches;

/// One eviction a PodDisruptionBudget (or the Eviction API's own rule about them) refuses.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BudgetBlock {
    /// `namespace/name` of the pod.
    pub pod: String,
    /// `namespace/name` of the PodDisruptionBudget(s) refusing it.
    pub budget: String,
    pub why: String,
}

impl fmt::Display for BudgetBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pod {}: PodDisruptionBudget {} {}", self.pod, self.budget, self.why)
    }
}

fn name_of(o: &impl ResourceExt) -> String {
    format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any())
}

/// A pod not running yet: the Eviction API deletes it without looking at any budget.
fn pending(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending")
}

/// Whether the Eviction API checks `pdb`'s allowance for `pod`: not for a pod reported not
/// Ready that the budget lets go (`AlwaysAllow`, or `IfHealthyBudget` while the budget is
/// healthy). A pod without a Ready condition counts as ready: a preview rather over-reports a
/// blocker than misses one.
fn checked(pod: &Pod, pdb: &PodDisruptionBudget) -> bool {
    let unready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "False");
    if !unready {
        return true;
    }
    let policy = pdb.spec.as_ref().and_then(|s| s.unhealthy_pod_eviction_policy.as_deref());
    let healthy = pdb.status.as_ref().is_some_and(|s| {
        let (current, desired) = (s.current_healthy.unwrap_or(0), s.desired_healthy.unwrap_or(0));
        current >= desired && desired > 0
    });
    !(policy == Some("AlwaysAllow") || healthy)
}

/// The budgets in `pod`'s namespace whose selector selects it (a budget without a selector
/// selects nothing, as in `policy/v1`).
fn selecting(pod: &Pod, budgets: &[PodDisruptionBudget]) -> Vec<usize> {
    (0..budgets.len())
        .filter(|&i| budgets[i].namespace() == pod.namespace())
        .filter(|&i| {
            let selector = budgets[i].spec.as_ref().and_then(|s| s.selector.as_ref());
            selector.is_some_and(|s| matches(s, pod.labels()))
        })
        .collect()
}

/// The evictions refused, per node. `evicted` holds each changing node (in rollout order) with
/// the pods its drain evicts; `wave` is how many nodes drain at once (`maxUnavailable`).
pub fn blocks(
    evicted: &[(String, Vec<&Pod>)],
    budgets: &[PodDisruptionBudget],
    wave: usize,
) -> BTreeMap<String, Vec<BudgetBlock>> {
    let mut out: BTreeMap<String, Vec<BudgetBlock>> = BTreeMap::new();
    // Per budget (by its index in `budgets`): per node, the pods of it that this plan evicts.
    let mut per_budget: BTreeMap<usize, Vec<(usize, Vec<String>)>> = BTreeMap::new();
    for (n, (node, pods)) in evicted.iter().enumerate() {
        for pod in pods.iter().filter(|p| !pending(p)) {
            let name = name_of(*pod);
            let mine = selecting(pod, budgets);
            if mine.len() > 1 {
                let names: Vec<String> = mine.iter().map(|&i| name_of(&budgets[i])).collect();
                out.entry(node.clone()).or_default().push(BudgetBlock {
                    pod: name,
                    budget: names.join(", "),
                    why: "select it together: the Eviction API refuses a pod with more than one budget".into(),
                });
                continue;
            }
            let Some(&index) = mine.first().filter(|&&i| checked(pod, &budgets[i])) else { continue };
            let nodes = per_budget.entry(index).or_default();
            match nodes.last_mut() {
                Some((last, names)) if *last == n => names.push(name),
                _ => nodes.push((n, vec![name])),
            }
        }
    }
    for (index, nodes) in per_budget {
        let b = &budgets[index];
        let budget = name_of(b);
        let status = b.status.as_ref();
        let allowed = status.and_then(|s| s.disruptions_allowed).unwrap_or(0).max(0) as usize;
        let stale = match (status.and_then(|s| s.observed_generation), b.metadata.generation) {
            (Some(seen), Some(current)) => seen < current,
            _ => false,
        };
        let mut refuse = |node: usize, pod: &str, why: String| {
            out.entry(evicted[node].0.clone()).or_default().push(BudgetBlock {
                pod: pod.to_string(),
                budget: budget.clone(),
                why,
            });
        };
        let Some(s) = status.filter(|_| !stale) else {
            let why = "has no status for its current generation yet: the Eviction API refuses until it has";
            nodes.iter().for_each(|(n, pods)| pods.iter().for_each(|p| refuse(*n, p, why.into())));
            continue;
        };
        if allowed == 0 {
            let why = format!(
                "allows 0 disruptions now ({} healthy, {} needed): the drain waits until it allows one, or \
                 until drainTimeoutSeconds",
                s.current_healthy.unwrap_or(0),
                s.desired_healthy.unwrap_or(0)
            );
            nodes.iter().for_each(|(n, pods)| pods.iter().for_each(|p| refuse(*n, p, why.clone())));
            continue;
        }
        // The worst case: the `wave` nodes holding most of its pods drain together.
        let mut busiest: Vec<&(usize, Vec<String>)> = nodes.iter().collect();
        busiest.sort_by_key(|(n, pods)| (std::cmp::Reverse(pods.len()), *n));
        busiest.truncate(wave.max(1));
        busiest.sort_by_key(|(n, _)| *n);
        let at_once: usize = busiest.iter().map(|(_, pods)| pods.len()).sum();
        if at_once <= allowed {
            continue;
        }
        let why = format!(
            "allows {allowed} disruption(s) now and this plan evicts up to {at_once} of its pods at once \
             (maxUnavailable {wave} node(s)): this eviction waits for a replacement to be ready, or until \
             drainTimeoutSeconds"
        );
        let over = busiest.iter().flat_map(|(n, pods)| pods.iter().map(move |p| (*n, p))).skip(allowed);
        over.for_each(|(n, p)| refuse(n, p, why.clone()));
    }
    out
}
