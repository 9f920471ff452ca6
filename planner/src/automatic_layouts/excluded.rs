//! Targets an automatic plan must not choose again: a node whose agent said it cannot apply what
//! the plan asked (`Failed`: `LeakedMemory`, an instance held by a process outside Kubernetes)
//! is released, and without a record of that the next decision would pick it again, cordoning
//! and draining it every few minutes for nothing. The record is the decision's `excluded` list
//! (in the plan's status, so it survives a restart), renewed from what persists: the node's
//! `Failed` record while it exists, then the agent's `Stalled` condition. It is lifted when
//! the agent's report changes, the plan's generation changes (a new decision starts afresh), or
//! an admin sets a new value of the `tessera.dev/retry` annotation on the `GpuNode`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube_core::ResourceExt;
use tessera_crds::conditions::{self, STALLED};
use tessera_crds::gpunode::{NodePhase, NodeRollout};
use tessera_crds::plan::ExcludedNode;
use tessera_crds::{GpuNode, GpuPartitionPlan};

/// On a `GpuNode`: a new value asks an automatic plan to try a node it left out again.
pub const RETRY_ANNOTATION: &str = "tessera.dev/retry";

/// What the plan's nodes say about being left out.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Exclusions {
    /// Nodes the next decision leaves out, and why.
    pub kept: Vec<ExcludedNode>,
    /// Nodes the stored decision left out that may be tried again, each with what changed.
    pub lifted: Vec<String>,
}

/// The exclusions of `plan` over its nodes `owned` (nodes it does not own are dropped). A node
/// whose record says it failed for this plan and generation is out; one the stored decision
/// (of this generation) left out stays out while its agent reports `Stalled` for the same reason
/// and its `tessera.dev/retry` annotation is as it was.
pub fn exclusions<'a>(plan: &GpuPartitionPlan, owned: impl IntoIterator<Item = &'a GpuNode>) -> Exclusions {
    let stored: &[ExcludedNode] = plan
        .status
        .as_ref()
        .and_then(|s| s.layout_decision.as_ref())
        .filter(|d| d.plan_generation == plan.metadata.generation)
        .map_or(&[], |d| d.excluded.as_slice());
    let mut out = Exclusions::default();
    for gn in owned {
        let node = gn.name_any();
        let before = stored.iter().find(|e| e.node == node);
        let stalled = stalled(gn);
        if let Some(r) = failed_here(gn, plan) {
            // The record's message is the agent's "reason: message" when it failed.
            let (reason, message) = match (stalled, r.message.split_once(": ")) {
                (Some(c), _) => (c.reason.clone(), c.message.clone()),
                (None, Some((reason, message))) => (reason.to_string(), message.to_string()),
                (None, None) => ("Failed".to_string(), r.message.clone()),
            };
            // An admin's request made while the record is still there counts once it is gone.
            let retry = before.map_or_else(|| retry(gn), |e| e.retry.clone());
            out.kept.push(ExcludedNode { node, reason, message, retry });
            continue;
        }
        let Some(before) = before else { continue };
        let changed = match stalled {
            None => Some(format!("its agent no longer reports {}", before.reason)),
            Some(c) if c.reason != before.reason => {
                Some(format!("its agent reports {} instead of {}", c.reason, before.reason))
            }
            Some(_) if retry(gn) != before.retry => Some(format!("{RETRY_ANNOTATION} changed")),
            Some(c) => {
                out.kept.push(ExcludedNode { message: c.message.clone(), ..before.clone() });
                None
            }
        };
        if let Some(why) = changed {
            out.lifted.push(format!("{node} ({why})"));
        }
    }
    out.kept.sort_by(|a, b| a.node.cmp(&b.node));
    out
}

/// The agent's `Stalled` condition, when true for the intent the `GpuNode` holds now.
fn stalled(gn: &GpuNode) -> Option<&Condition> {
    let st = gn.status.as_ref()?;
    conditions::find(&st.conditions, STALLED)
        .filter(|c| c.status == "True" && c.observed_generation == gn.metadata.generation)
}

fn retry(gn: &GpuNode) -> Option<String> {
    gn.annotations().get(RETRY_ANNOTATION).cloned()
}

/// The node's rollout record when it says the node failed for this plan and generation.
fn failed_here<'a>(gn: &'a GpuNode, plan: &GpuPartitionPlan) -> Option<&'a NodeRollout> {
    let r = gn.status.as_ref()?.rollout.as_ref()?;
    (r.phase == NodePhase::Failed
        && r.plan.as_deref() == plan.metadata.name.as_deref()
        && r.plan_generation == plan.metadata.generation)
        .then_some(r)
}
