//! Gates mode's decisions for one pass, from what the quota plan wants written and what the
//! caches show ([`plan_gates`]): each tenant namespace's gate and ResourceQuota limits, the
//! namespace labels to change, and the ResourceQuotas whose finalizer may go. Acting on it is the
//! runtime's (`quota_controller::gates`); the order of the steps keeps every namespace closed or
//! limited, never open:
//! - a namespace is labelled `tenant` only once its ResourceQuota enforces the written limits and
//!   its gate, owned by that ResourceQuota, is the planned one;
//! - a namespace that a quota claims but that is not yet `tenant` loses a `none` label first (GPU
//!   work waits);
//! - a Tessera ResourceQuota being deleted or stale keeps its finalizer (it stays in force)
//!   until the namespace is terminating, no quota claims it and it is labelled `none`, or the
//!   namespace's own ResourceQuota enforces its limits and owns the gate.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use kube_core::ResourceExt;
use tessera_crds::conditions::{CONFLICT, STALLED, find};
use tessera_crds::gate::{GpuQuotaGate, GpuQuotaGateSpec, IN_FORCE_FINALIZER, MARK, MARK_NONE, MARK_TENANT};
use tessera_crds::quota::TenantGpuQuotaStatus;

use super::Holder;
use super::namespace::{NamespaceInputs, plan_namespace};
use crate::quota::claims::{class_of_key, resource_of_class};
use crate::quota::quantity::count;
use crate::quota::stamp::enforces;
use crate::quota::{Apply, Delete, written_by};

/// What the caches show and the quota plan wants, for [`plan_gates`].
pub struct GateInputs<'a> {
    /// The quota plan's ResourceQuotas (their `hard`: each namespace's share).
    pub apply: &'a [Apply],
    /// The quota plan's stale ResourceQuotas.
    pub delete: &'a [Delete],
    /// The quota plan's statuses (a stalled or conflicting quota closes its namespaces).
    pub statuses: &'a BTreeMap<String, TenantGpuQuotaStatus>,
    pub rqs: &'a [ResourceQuota],
    pub gates: &'a [GpuQuotaGate],
    pub namespaces: &'a [Namespace],
    pub pods: &'a BTreeMap<String, Vec<Holder>>,
    pub claims: &'a BTreeMap<String, Vec<Holder>>,
}

/// One tenant namespace's gate: the ResourceQuota that owns it and what it says.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedGate {
    pub namespace: String,
    /// The ResourceQuota (its name) that owns the gate.
    pub owner: String,
    pub spec: GpuQuotaGateSpec,
}

/// What a pass writes in gates mode.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GatePlan {
    /// The limits to write instead of each planned ResourceQuota's `hard`, by (namespace, name).
    pub limits: BTreeMap<(String, String), BTreeMap<String, String>>,
    /// The gates, by namespace.
    pub gates: BTreeMap<String, PlannedGate>,
    /// Namespace labels that must change: `Some(value)` to set, `None` to remove.
    pub labels: BTreeMap<String, Option<&'static str>>,
    /// Tessera ResourceQuotas (namespace, name) to delete and let go of (their finalizer).
    pub releases: Vec<(String, String)>,
}

/// The pass's gate decisions (see the module).
pub fn plan_gates(i: &GateInputs<'_>) -> GatePlan {
    let mut out = GatePlan::default();
    let rq = |ns: &str, name: &str| i.rqs.iter().find(|r| r.namespace().as_deref() == Some(ns) && r.name_any() == name);
    let no_holders = Vec::new();
    for a in i.apply {
        if out.gates.contains_key(&a.namespace) {
            continue; // two quotas claim it: the first names the gate; both are closed (Conflict)
        }
        let share: BTreeMap<String, i64> = a.hard.iter().map(|(k, v)| (k.clone(), count(v).unwrap_or(0))).collect();
        let current = rq(&a.namespace, &a.name);
        let shown = current
            .and_then(|r| r.status.as_ref()?.used.as_ref())
            .map(|used| used.iter().filter_map(|(k, q)| Some((k.clone(), count(&q.0)?))).collect::<BTreeMap<_, _>>());
        // Tessera's classes the share grants any of (one held at 0 stays closed).
        let classes: BTreeSet<String> = share
            .iter()
            .filter(|(_, n)| **n > 0)
            .filter_map(|(k, _)| class_of_key(k))
            .filter(|c| resource_of_class(c).is_some())
            .map(String::from)
            .collect();
        let closed = closed_by(i.statuses.get(&a.quota));
        let planned = plan_namespace(&NamespaceInputs {
            quota: &a.quota,
            closed: closed.as_deref(),
            share: &share,
            shown: shown.as_ref(),
            pods: i.pods.get(&a.namespace).unwrap_or(&no_holders),
            claims: i.claims.get(&a.namespace).unwrap_or(&no_holders),
            classes: &classes,
        });
        let limits = planned.limits.iter().map(|(k, n)| (k.clone(), n.to_string())).collect();
        out.limits.insert((a.namespace.clone(), a.name.clone()), limits);
        out.gates.insert(
            a.namespace.clone(),
            PlannedGate { namespace: a.namespace.clone(), owner: a.name.clone(), spec: planned.gate },
        );
    }
    for ns in i.namespaces.iter().filter(|n| n.metadata.deletion_timestamp.is_none()) {
        let name = ns.name_any();
        let label = ns.labels().get(MARK).map(String::as_str);
        let want = match out.gates.get(&name) {
            None => Some(MARK_NONE),
            Some(g) => {
                let enforced = rq(&name, &g.owner)
                    .zip(out.limits.get(&(name.clone(), g.owner.clone())))
                    .is_some_and(|(r, limits)| enforces(r, limits));
                let gated = gate_is(i.gates, g, rq(&name, &g.owner));
                if (enforced && gated) || label == Some(MARK_TENANT) { Some(MARK_TENANT) } else { None }
            }
        };
        if want != label {
            out.labels.insert(name, want);
        }
    }
    out.releases = releases(i, &out);
    out
}

/// Why a quota's namespaces are closed: it is stalled (an invalid spec) or in conflict.
fn closed_by(status: Option<&TenantGpuQuotaStatus>) -> Option<String> {
    let st = status?;
    [STALLED, CONFLICT]
        .iter()
        .filter_map(|t| find(&st.conditions, t))
        .find(|c| c.status == "True")
        .map(|c| format!("{} ({})", c.message, c.reason))
}

/// Whether a cached gate is the planned one, owned by `owner` (as cached, with its UID).
pub fn gate_is(gates: &[GpuQuotaGate], planned: &PlannedGate, owner: Option<&ResourceQuota>) -> bool {
    let Some(uid) = owner.and_then(|o| o.metadata.uid.as_deref()) else { return false };
    gates.iter().any(|g| {
        g.namespace().as_deref() == Some(&planned.namespace)
            && g.spec == planned.spec
            && g.owner_references().iter().any(|o| o.uid == uid && o.kind == "ResourceQuota")
    })
}

/// Tessera's ResourceQuotas that are stale or being deleted and may go now (see the module).
fn releases(i: &GateInputs<'_>, plan: &GatePlan) -> Vec<(String, String)> {
    let stale: BTreeSet<(&str, &str)> = i.delete.iter().map(|d| (d.namespace.as_str(), d.name.as_str())).collect();
    let mut out = Vec::new();
    for r in i.rqs.iter().filter(|r| written_by(r).is_some()) {
        let (ns, name) = (r.namespace().unwrap_or_default(), r.name_any());
        let deleting = r.metadata.deletion_timestamp.is_some();
        if !deleting && !stale.contains(&(ns.as_str(), name.as_str())) {
            continue;
        }
        let held = r.finalizers().iter().any(|f| f == IN_FORCE_FINALIZER);
        if deleting && !held {
            continue; // nothing of ours holds it
        }
        let namespace = i.namespaces.iter().find(|n| n.name_any() == ns);
        let terminating = namespace.is_none_or(|n| n.metadata.deletion_timestamp.is_some());
        let free = !plan.gates.contains_key(&ns)
            && namespace.and_then(|n| n.labels().get(MARK)).map(String::as_str) == Some(MARK_NONE);
        let replaced = match plan.gates.get(&ns) {
            None => false,
            // The planned one, deleted by hand: released, it is written anew (the gate it owned
            // goes with it, and the namespace stays closed meanwhile: its gate bindings deny).
            Some(g) if g.owner == name => deleting,
            // Another: once the namespace's own ResourceQuota enforces its limits and owns the gate.
            Some(g) => {
                i.rqs.iter().find(|o| o.namespace().as_deref() == Some(&ns) && o.name_any() == g.owner).is_some_and(
                    |o| {
                        o.metadata.deletion_timestamp.is_none()
                            && plan.limits.get(&(ns.clone(), g.owner.clone())).is_some_and(|l| enforces(o, l))
                            && gate_is(i.gates, g, Some(o))
                    },
                )
            }
        };
        if terminating || free || replaced {
            out.push((ns, name));
        }
    }
    out
}

#[cfg(test)]
mod tests;
