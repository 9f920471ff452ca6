//! One tenant namespace's gate and ResourceQuota limits from its share and what it holds
//! ([`plan_namespace`]), and the cluster's class list ([`class_list`]).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use tessera_crds::gate::{GateState, GpuClassListSpec, GpuQuotaGateSpec, MAX_BLOCKED, MAX_OVER, MAX_REASON};

use super::charges::{claim_charges, pod_charges};
use super::{Holder, blocked, over, usage, written_limits};
use crate::dra::GpuDrivers;
use crate::quota::claims::{reaches_gpus, resource_of_class};

/// A namespace's pods that are charged for GPUs, as holders (placed: bound to a node).
pub fn pod_holders<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Vec<Holder> {
    pods.into_iter()
        .map(|p| Holder {
            name: p.metadata.name.clone().unwrap_or_default(),
            created: created(&p.metadata),
            charges: pod_charges(p),
            placed: p.spec.as_ref().is_some_and(|s| s.node_name.as_deref().is_some_and(|n| !n.is_empty())),
        })
        .filter(|h| !h.charges.is_empty())
        .collect()
}

/// A namespace's claims that are charged for GPU classes, as holders (placed: allocated).
/// `gpu_class`: whether a class reaches GPUs (Tessera's included).
pub fn claim_holders<'a>(
    claims: impl IntoIterator<Item = &'a ResourceClaim>,
    gpu_class: impl Fn(&str) -> bool,
) -> Vec<Holder> {
    claims
        .into_iter()
        .map(|c| Holder {
            name: c.metadata.name.clone().unwrap_or_default(),
            created: created(&c.metadata),
            charges: claim_charges(c, &gpu_class),
            placed: c.status.as_ref().is_some_and(|s| s.allocation.is_some()),
        })
        .filter(|h| !h.charges.is_empty())
        .collect()
}

/// The creation time as written (RFC 3339, which sorts as text), for the order only; an object
/// without one (not stored) sorts last.
pub fn created(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    m.creation_timestamp.as_ref().map_or_else(|| "~".to_string(), |t| t.0.to_string())
}

/// What a pass knows of one tenant namespace.
#[derive(Debug, Clone, Copy)]
pub struct NamespaceInputs<'a> {
    /// The TenantGpuQuota claiming it.
    pub quota: &'a str,
    /// Why GPU work is refused here (an invalid or conflicting quota, names taken); `None` when
    /// the quota's share is enforced.
    pub closed: Option<&'a str>,
    /// The share per ResourceQuota key (`requests.<resource>`, `<class>.deviceclass...`).
    pub share: &'a BTreeMap<String, i64>,
    /// The namespace's ResourceQuota's `status.used` (`None`: no status yet).
    pub shown: Option<&'a BTreeMap<String, i64>>,
    pub pods: &'a [Holder],
    pub claims: &'a [Holder],
    /// Tessera's classes the quota grants here.
    pub classes: &'a BTreeSet<String>,
}

/// What to write for one tenant namespace: its gate and its ResourceQuota's limits.
#[derive(Debug, Clone, PartialEq)]
pub struct NamespacePlan {
    pub gate: GpuQuotaGateSpec,
    pub limits: BTreeMap<String, i64>,
}

/// The gate and limits of one tenant namespace (the time-free rule, see the parent module). A
/// closed namespace's ResourceQuota holds every key at 0 and its gate refuses GPU work.
pub fn plan_namespace(i: &NamespaceInputs<'_>) -> NamespacePlan {
    let holders: Vec<&Holder> = i.pods.iter().chain(i.claims).collect();
    let limited: Vec<String> = i.share.keys().filter_map(|k| k.strip_prefix("requests.")).map(String::from).collect();
    if let Some(why) = i.closed {
        // Pods and claims admitted while it was enforced wait too: nothing more is placed.
        let unplaced = |hs: &[Holder]| hs.iter().filter(|h| !h.placed).map(|h| h.name.clone()).collect();
        let (blocked_pods, block_all_bindings) = bounded(unplaced(i.pods));
        let (blocked_claims, block_all_allocations) = bounded(unplaced(i.claims));
        let gate = GpuQuotaGateSpec {
            quota: i.quota.to_string(),
            state: GateState::Closed,
            reason: fit_reason(why.to_string()),
            limited,
            blocked_pods,
            block_all_bindings,
            blocked_claims,
            block_all_allocations,
            ..Default::default()
        };
        return NamespacePlan { gate, limits: i.share.keys().map(|k| (k.clone(), 0)).collect() };
    }
    let used = usage(i.shown, &holders);
    let pods: Vec<&Holder> = i.pods.iter().collect();
    let claims: Vec<&Holder> = i.claims.iter().collect();
    let (blocked_pods, block_all_bindings) = bounded(blocked(i.share, &pods));
    let (blocked_claims, block_all_allocations) = bounded(blocked(i.share, &claims));
    // The share has at most as many keys as the quota lists resources (its schema's bound).
    let over: Vec<String> = over(i.share, &used).into_iter().take(MAX_OVER).collect();
    let mut reason = if over.is_empty() {
        format!("the share of TenantGpuQuota {} is enforced", i.quota)
    } else {
        format!(
            "usage of {} is past the share of TenantGpuQuota {} (objects made before the namespace's limits counted \
             them); nothing more of it until usage falls",
            over.join(", "),
            i.quota
        )
    };
    if block_all_bindings || block_all_allocations {
        reason = format!(
            "more objects made before the namespace's limits counted them wait than a gate can name ({MAX_BLOCKED}), \
             so none of the namespace's pods is bound or claims allocated until they are fewer; {reason}"
        );
    }
    let gate = GpuQuotaGateSpec {
        quota: i.quota.to_string(),
        state: GateState::Enforced,
        reason: fit_reason(reason),
        classes: i.classes.iter().cloned().collect(),
        limited,
        over,
        blocked_pods,
        block_all_bindings,
        blocked_claims,
        block_all_allocations,
    };
    NamespacePlan { gate, limits: written_limits(i.share, i.shown, &holders) }
}

/// The reason cut to what a gate holds ([`MAX_REASON`] bytes, at a character boundary, ending
/// in an ellipsis where cut): a quota's message or many keys past the share must not make the
/// gate unwritable.
pub fn fit_reason(reason: String) -> String {
    if reason.len() <= MAX_REASON {
        return reason;
    }
    let mut end = MAX_REASON - '…'.len_utf8();
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &reason[..end])
}

/// The names, or none and `true` past [`MAX_BLOCKED`] (then everything is blocked).
fn bounded(names: BTreeSet<String>) -> (Vec<String>, bool) {
    if names.len() > MAX_BLOCKED { (Vec::new(), true) } else { (names.into_iter().collect(), false) }
}

/// The class list: classes proven off GPUs, and Tessera's own (by name: a class of Tessera's
/// name whose spec is someone else's is in neither, so closed).
pub fn class_list<'a>(
    classes: impl IntoIterator<Item = &'a DeviceClass>,
    drivers: &GpuDrivers,
    mismatched: &BTreeSet<String>,
) -> GpuClassListSpec {
    let mut out = GpuClassListSpec::default();
    for c in classes {
        let Some(name) = c.metadata.name.clone() else { continue };
        if resource_of_class(&name).is_some() {
            if !mismatched.contains(&name) {
                out.tessera.push(name);
            }
        } else if !reaches_gpus(c, drivers) {
            out.open.push(name);
        }
    }
    out.open.sort();
    out.tessera.sort();
    out
}

#[cfg(test)]
mod tests;
