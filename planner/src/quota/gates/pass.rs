//! Gates mode's decisions for one pass, from what the quota plan wants written and what the
//! caches show ([`plan_gates`]): each claimed namespace's gate and ResourceQuota limits, the
//! namespace labels to change, the ResourceQuotas whose finalizer may go and the gates no longer
//! wanted. Acting on it is the runtime's (`quota_controller::gates`); the order of the steps
//! keeps every claimed namespace closed or limited, never open:
//! - a namespace a quota claims goes straight to `joining` from whatever it was (no new GPU
//!   object; its gate, Deny while missing, decides bindings and allocations), and its first gate
//!   binds and allocates nothing until the pass after the label is seen (the pod cache may not
//!   yet hold a pod made a moment before);
//! - a namespace is labelled `tenant` only from `joining`, once its ResourceQuota enforces the
//!   written limits and its gate, owned by that ResourceQuota, is the planned one;
//! - a claimed namespace whose quota writes no ResourceQuota there (invalid, names taken) gets a
//!   Closed gate of its own (no owner) and is never labelled open;
//! - a namespace no quota claims is labelled `open` (on the open list) or `closed`; its gate is
//!   deleted once that label is seen;
//! - a Tessera ResourceQuota being deleted or stale keeps its finalizer (it stays in force)
//!   until the namespace is terminating, no quota claims it and its label says so, or the
//!   namespace's gate in force no longer needs it: the new ResourceQuota enforces and owns it,
//!   the namespace's ownerless Closed gate is in force, or (the planned one deleted by hand) the
//!   gate it owns has been written Closed.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use kube_core::ResourceExt;
use tessera_crds::conditions::{CONFLICT, STALLED, find};
use tessera_crds::gate::{
    GateState, GpuQuotaGate, GpuQuotaGateSpec, IN_FORCE_FINALIZER, MARK, MARK_CLOSED, MARK_JOINING, MARK_OPEN,
    MARK_TENANT,
};
use tessera_crds::quota::TenantGpuQuotaStatus;

use super::Holder;
use super::namespace::{NamespaceInputs, NamespacePlan, plan_namespace};
use super::open::OpenNamespaces;
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
    /// Every namespace a quota names, by the first quota (by name) naming it: invalid quotas and
    /// quotas whose ResourceQuota names are taken included, so their namespaces stay closed.
    pub claimed: &'a BTreeMap<String, String>,
    /// The namespaces no quota claims that stay open to GPU work.
    pub open: &'a OpenNamespaces,
    pub rqs: &'a [ResourceQuota],
    pub gates: &'a [GpuQuotaGate],
    pub namespaces: &'a [Namespace],
    pub pods: &'a BTreeMap<String, Vec<Holder>>,
    pub claims: &'a BTreeMap<String, Vec<Holder>>,
}

/// One claimed namespace's gate: the ResourceQuota that owns it and what it says.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedGate {
    pub namespace: String,
    /// The ResourceQuota (its name) that owns the gate; `None` for the Closed gate of a
    /// namespace whose quota writes no ResourceQuota there (the operator deletes it).
    pub owner: Option<String>,
    pub spec: GpuQuotaGateSpec,
}

/// What a pass writes in gates mode.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GatePlan {
    /// The limits to write instead of each planned ResourceQuota's `hard`, by (namespace, name).
    pub limits: BTreeMap<(String, String), BTreeMap<String, String>>,
    /// The gates, by namespace.
    pub gates: BTreeMap<String, PlannedGate>,
    /// Namespace labels that must change, to the value given (the operator never removes one).
    pub labels: BTreeMap<String, &'static str>,
    /// Tessera ResourceQuotas (namespace, name) to let go of (their finalizer) and delete.
    pub releases: Vec<(String, String)>,
    /// Namespaces whose gate is no longer wanted (no quota claims them; their label says so).
    pub stale_gates: Vec<String>,
    /// Whether the gates alone already hold every namespace as this plan wants: each live
    /// namespace carries its mark ([`marks_settled`]) and each planned gate is cached as planned,
    /// owned as planned (so it was written by an earlier pass, from an earlier look at the pods).
    /// What was admitted in the meantime by another mechanism may go then (the upgrade).
    pub settled: bool,
}

/// The pass's gate decisions (see the module).
pub fn plan_gates(i: &GateInputs<'_>) -> GatePlan {
    let mut out = GatePlan::default();
    let live = |ns: &str| i.namespaces.iter().find(|n| n.name_any() == ns && n.metadata.deletion_timestamp.is_none());
    let label = |ns: &str| live(ns).and_then(|n| n.labels().get(MARK)).map(String::as_str);
    let no_holders = Vec::new();
    for a in i.apply {
        if out.gates.contains_key(&a.namespace) {
            continue; // two quotas claim it: the first names the gate; both are closed (Conflict)
        }
        let (limits, gate) = plan_applied(i, a, label(&a.namespace));
        out.limits.insert((a.namespace.clone(), a.name.clone()), limits);
        out.gates.insert(a.namespace.clone(), gate);
    }
    for (ns, quota) in i.claimed {
        if out.gates.contains_key(ns) || live(ns).is_none() {
            continue;
        }
        let why = closed_by(i.statuses.get(quota)).unwrap_or_else(|| {
            format!("TenantGpuQuota {quota} names the namespace but writes no ResourceQuota in it (see its status)")
        });
        let planned = plan_namespace(&NamespaceInputs {
            quota,
            closed: Some(&why),
            share: &BTreeMap::new(),
            shown: None,
            pods: i.pods.get(ns).unwrap_or(&no_holders),
            claims: i.claims.get(ns).unwrap_or(&no_holders),
            classes: &BTreeSet::new(),
        });
        let spec = joined(planned, label(ns), quota);
        out.gates.insert(ns.clone(), PlannedGate { namespace: ns.clone(), owner: None, spec });
    }
    out.labels = labels(i, &out);
    out.releases = releases(i, &out);
    out.stale_gates = i
        .gates
        .iter()
        .filter_map(|g| g.namespace())
        .filter(|ns| !out.gates.contains_key(ns))
        .filter(|ns| matches!(label(ns), Some(MARK_OPEN | MARK_CLOSED)))
        .collect();
    out.settled = marks_settled(i.namespaces, &out) && every_gate_cached(i, &out);
    out
}

/// The limits and gate of a namespace the quota plan writes a ResourceQuota in (its cached
/// label `label`).
fn plan_applied(i: &GateInputs<'_>, a: &Apply, label: Option<&str>) -> (BTreeMap<String, String>, PlannedGate) {
    let rq = |ns: &str, name: &str| resource_quota(i.rqs, ns, name);
    let no_holders = Vec::new();
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
    // Deleted by hand: its gate is closed before it is let go (it is written anew after).
    let deleting = current
        .is_some_and(|r| r.metadata.deletion_timestamp.is_some())
        .then(|| format!("its ResourceQuota {} is being deleted; GPU work waits until it is written anew", a.name));
    let closed = closed_by(i.statuses.get(&a.quota)).or(deleting);
    let inputs = NamespaceInputs {
        quota: &a.quota,
        closed: closed.as_deref(),
        share: &share,
        shown: shown.as_ref(),
        pods: i.pods.get(&a.namespace).unwrap_or(&no_holders),
        claims: i.claims.get(&a.namespace).unwrap_or(&no_holders),
        classes: &classes,
    };
    let planned = plan_namespace(&inputs);
    let limits = planned.limits.iter().map(|(k, n)| (k.clone(), n.to_string())).collect();
    // Its ResourceQuota not seen yet (being made, or deleted without our finalizer): a
    // Closed gate of its own meanwhile, so a gate left from before, or an Enforced one the
    // garbage collector has not taken yet, never decides alone.
    let (planned, owner) = match current {
        Some(_) => (planned, Some(a.name.clone())),
        None => {
            let why = format!("its ResourceQuota {} is not in force yet", a.name);
            (plan_namespace(&NamespaceInputs { closed: Some(&why), shown: None, ..inputs }), None)
        }
    };
    let spec = joined(planned, label, &a.quota);
    (limits, PlannedGate { namespace: a.namespace.clone(), owner, spec })
}

/// The labels that must change (see the module): unclaimed namespaces open or closed, claimed
/// ones joining, tenant only from joining once in force.
fn labels(i: &GateInputs<'_>, plan: &GatePlan) -> BTreeMap<String, &'static str> {
    let mut labels = BTreeMap::new();
    for ns in i.namespaces.iter().filter(|n| n.metadata.deletion_timestamp.is_none()) {
        let name = ns.name_any();
        let label = ns.labels().get(MARK).map(String::as_str);
        let want = match plan.gates.get(&name) {
            None if i.open.contains(&name) => MARK_OPEN,
            None => MARK_CLOSED,
            Some(_) if label == Some(MARK_TENANT) => MARK_TENANT,
            Some(g) if label == Some(MARK_JOINING) && in_force(i, g, plan) => MARK_TENANT,
            Some(_) => MARK_JOINING,
        };
        if Some(want) != label {
            labels.insert(name, want);
        }
    }
    labels
}

/// The planned gate as written for a namespace labelled `label`: one not yet seen joining (or in
/// force) binds and allocates nothing.
fn joined(planned: NamespacePlan, label: Option<&str>, quota: &str) -> GpuQuotaGateSpec {
    let mut gate = planned.gate;
    if !matches!(label, Some(MARK_JOINING | MARK_TENANT)) {
        gate.block_all_bindings = true;
        gate.block_all_allocations = true;
        gate.reason = super::namespace::fit_reason(format!(
            "the namespace is joining TenantGpuQuota {quota}: nothing is bound or allocated until the operator has \
             seen it join (a pass); then {}",
            gate.reason
        ));
    }
    gate
}

/// Whether a namespace's ResourceQuota enforces the written limits and its gate is the planned
/// one, owned by it: its limits are in force.
fn in_force(i: &GateInputs<'_>, g: &PlannedGate, plan: &GatePlan) -> bool {
    let Some(owner) = &g.owner else { return false };
    let Some(r) = resource_quota(i.rqs, &g.namespace, owner) else { return false };
    plan.limits.get(&(g.namespace.clone(), owner.clone())).is_some_and(|l| enforces(r, l))
        && gate_is(i.gates, g, Some(r))
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

/// Whether a cached gate is the planned one, owned by `owner` as cached (with its UID), or by
/// nothing where the plan names no owner.
pub fn gate_is(gates: &[GpuQuotaGate], planned: &PlannedGate, owner: Option<&ResourceQuota>) -> bool {
    cached_gate(gates, planned, owner).is_some_and(|g| g.spec == planned.spec)
}

/// The namespace's cached gate, where its owner is the planned one (see [`gate_is`]).
fn cached_gate<'g>(
    gates: &'g [GpuQuotaGate],
    planned: &PlannedGate,
    owner: Option<&ResourceQuota>,
) -> Option<&'g GpuQuotaGate> {
    let uid = match (&planned.owner, owner) {
        (None, _) => None,
        (Some(_), Some(o)) => Some(o.metadata.uid.as_deref()?),
        (Some(_), None) => return None,
    };
    gates.iter().find(|g| {
        let owners = g.owner_references();
        g.namespace().as_deref() == Some(&planned.namespace)
            && match uid {
                Some(uid) => owners.iter().any(|o| o.uid == uid && o.kind == "ResourceQuota"),
                None => owners.is_empty(),
            }
    })
}

/// Whether the cached gate says what the planned one says about admission (its quota, state,
/// classes and resources): its lists of blocked objects and keys past the share may lag, as
/// pods come and go, without keeping a held ResourceQuota.
fn gate_holds(gates: &[GpuQuotaGate], planned: &PlannedGate, owner: Option<&ResourceQuota>) -> bool {
    cached_gate(gates, planned, owner).is_some_and(|g| {
        let (c, p) = (&g.spec, &planned.spec);
        c.quota == p.quota && c.state == p.state && c.classes == p.classes && c.limited == p.limited
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
        let label = namespace.and_then(|n| n.labels().get(MARK)).map(String::as_str);
        let free = !plan.gates.contains_key(&ns) && matches!(label, Some(MARK_OPEN | MARK_CLOSED));
        let replaced = match plan.gates.get(&ns) {
            None => false,
            // The planned one, deleted by hand: let go once the gate it owns is written Closed
            // (its share is written anew after; the namespace stays closed meanwhile).
            Some(g) if g.owner.as_deref() == Some(name.as_str()) => {
                deleting && g.spec.state == GateState::Closed && gate_holds(i.gates, g, Some(r))
            }
            // The namespace's ownerless Closed gate in force, where the quota writes no
            // ResourceQuota (nothing is admitted there). Where it does and the new one is only
            // not seen yet, the held one stays: its limits hold until the new ones are in force.
            Some(g) if g.owner.is_none() => !plan.limits.keys().any(|(n, _)| n == &ns) && gate_holds(i.gates, g, None),
            // Another: once the namespace's own ResourceQuota enforces its limits and owns the gate.
            Some(g) => {
                let owner = g.owner.as_deref().unwrap_or_default();
                resource_quota(i.rqs, &ns, owner).is_some_and(|o| {
                    o.metadata.deletion_timestamp.is_none()
                        && plan.limits.get(&(ns.clone(), owner.to_string())).is_some_and(|l| enforces(o, l))
                        && gate_holds(i.gates, g, Some(o))
                })
            }
        };
        if terminating || free || replaced {
            out.push((ns, name));
        }
    }
    out
}

/// Whether each planned gate is cached just as planned, owned by its planned ResourceQuota.
fn every_gate_cached(i: &GateInputs<'_>, plan: &GatePlan) -> bool {
    plan.gates.values().all(|g| match &g.owner {
        None => gate_is(i.gates, g, None),
        Some(name) => resource_quota(i.rqs, &g.namespace, name).is_some_and(|rq| gate_is(i.gates, g, Some(rq))),
    })
}

/// The cached ResourceQuota `name` of namespace `ns`.
fn resource_quota<'a>(rqs: &'a [ResourceQuota], ns: &str, name: &str) -> Option<&'a ResourceQuota> {
    rqs.iter().find(|r| r.namespace().as_deref() == Some(ns) && r.name_any() == name)
}

/// Whether the gates alone now hold every namespace as the plan wants: each live namespace
/// carries the mark, and the only relabel still planned is `joining` to `tenant` (a joining
/// namespace is already closed to new GPU work and its gate decides bindings). Then the params
/// mode's policies, left from an upgrade, hold nothing the gates do not, and may go.
pub fn marks_settled(namespaces: &[Namespace], plan: &GatePlan) -> bool {
    let label = |ns: &str| {
        namespaces.iter().find(|n| n.name_any() == ns).and_then(|n| n.labels().get(MARK)).map(String::as_str)
    };
    plan.labels.iter().all(|(ns, want)| *want == MARK_TENANT && label(ns) == Some(MARK_JOINING))
}

#[cfg(test)]
mod tests;
