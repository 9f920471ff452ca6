//! Pods asking for GPU extended resources made before their namespace's ResourceQuota
//! counted them, still not bound. A ResourceQuota checks a pod once, at its creation: a tenant
//! that made many gated (`schedulingGates`) or unschedulable GPU pods before its namespace joined
//! a quota would have them all scheduled afterwards, past its share (`status.used` counts them,
//! so only new pods are refused). The params list them in `<ns>.pods` ([`policy_pods`]) and the
//! policy `tessera-gpu-bindings` refuses the scheduler's binding of each; deleted and made again,
//! a pod is counted. The rule is the claims' ([`super::unallocated::early`]): made no later than
//! `<ns>.since` (same second included: second granularity), or of unknown creation time.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

/// Per namespace, the GPU keys stamped after its `<ns>.since` ([`super::stamp::keys::later_keys`]).
pub type Later = BTreeMap<String, BTreeMap<String, Timestamp>>;

/// The params key listing `ns`'s early pods (only where there are some).
pub fn pods_key(ns: &str) -> String {
    format!("{ns}.pods")
}

/// The most characters one namespace's [`pods_key`] may hold: about 100 pods of usual names
/// (generated names of 30 to 40 characters). Past it the value is [`ALL_PODS`].
pub const PODS_CAP: usize = 4096;

/// The [`pods_key`] value past the caps: the binding policy then refuses every binding in that
/// namespace (a Binding carries no pod spec to tell GPU pods from others; a pod name never
/// starts with `_`). Failing closed: listing only some would let the rest be scheduled past
/// the share. The tenant unblocks its namespace by deleting its early pods.
pub const ALL_PODS: &str = "_all";

/// What the planner reads of a pod: the pod watch keeps only unbound pods asking for GPU
/// extended resources ([`unbound_gpu_pod`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingPod {
    pub namespace: String,
    pub name: String,
    pub created: Option<Timestamp>,
    /// The GPU extended resources it asks for: each has its own time where its key came into
    /// force after `<ns>.since` (`super::stamp::keys::later_keys`).
    pub resources: BTreeSet<String>,
}

/// Whether any container or init container of `pod` asks for a GPU extended resource
/// ([`super::is_gpu_resource`], the pod policy's rule; requests or limits).
pub fn asks_for_gpu(pod: &Pod) -> bool {
    !gpu_resources(pod).is_empty()
}

/// The GPU extended resources ([`super::is_gpu_resource`]) any container or init container of
/// `pod` asks for (requests or limits).
pub fn gpu_resources(pod: &Pod) -> BTreeSet<String> {
    let Some(spec) = pod.spec.as_ref() else { return BTreeSet::new() };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| {
            let r = c.resources.as_ref();
            r.and_then(|r| r.requests.as_ref()).into_iter().chain(r.and_then(|r| r.limits.as_ref()))
        })
        .flat_map(|m| m.keys())
        .filter(|k| super::is_gpu_resource(k))
        .cloned()
        .collect()
}

/// `pod` as the planner reads it, where it asks for GPU extended resources, is not bound
/// (`spec.nodeName` empty) and not finished (phase `Succeeded` or `Failed`); else `None`.
pub fn unbound_gpu_pod(pod: &Pod) -> Option<PendingPod> {
    let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let resources = gpu_resources(pod);
    if bound || matches!(phase, Some("Succeeded" | "Failed")) || resources.is_empty() {
        return None;
    }
    Some(PendingPod {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
        resources,
    })
}

/// Whether something made at `created` in `ns` predates the namespace's ResourceQuota, as
/// [`super::unallocated::early`] compares: made no later than `<ns>.since` (unknown creation
/// counts as early). With no `.since` (no ResourceQuota of its one quota yet): early while the
/// namespace is pending (`_pending`; no key counts as pending, as the pod policy reads it),
/// where no GPU pod can be created, so every unbound one predates it. A conflicted namespace
/// has a `.since` once every claiming quota's ResourceQuota is stamped (`claims::since`). A
/// resource whose key came into force later (`later`: `requests.<resource>` by namespace) counts
/// from then.
fn early(p: &PendingPod, policy: &BTreeMap<String, String>, later: &Later) -> bool {
    let (ns, created) = (p.namespace.as_str(), p.created);
    let before = |s: Timestamp| created.is_none_or(|c| c <= s);
    match policy.get(&format!("{ns}.since")) {
        Some(s) => s.parse::<Timestamp>().ok().is_some_and(|s| {
            let keys = later.get(ns);
            before(s) || p.resources.iter().filter_map(|r| keys?.get(&format!("requests.{r}")).copied()).any(before)
        }),
        None => policy.get(super::pod_gate::PENDING).is_none_or(|p| p.split(' ').any(|n| n == ns)),
    }
}

/// [`pods_key`] per tenant namespace (`<ns>.quota` in `policy`) holding early pods: their names,
/// sorted, space-separated. Past [`PODS_CAP`], or past `budget` characters for all namespaces
/// together (in name order), the value is [`ALL_PODS`].
pub fn policy_pods(
    pods: &[PendingPod],
    policy: &BTreeMap<String, String>,
    later: &Later,
    budget: usize,
) -> BTreeMap<String, String> {
    let mut by_ns: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for p in pods {
        let tenant = policy.contains_key(&format!("{}.quota", p.namespace));
        if tenant && early(p, policy, later) {
            by_ns.entry(p.namespace.as_str()).or_default().insert(p.name.as_str());
        }
    }
    let mut used = 0;
    by_ns
        .into_iter()
        .map(|(ns, names)| {
            let list = names.into_iter().collect::<Vec<_>>().join(" ");
            if list.len() > PODS_CAP || used + list.len() > budget {
                return (pods_key(ns), ALL_PODS.to_string());
            }
            used += list.len();
            (pods_key(ns), list)
        })
        .collect()
}

pub mod carried;

#[cfg(test)]
mod tests;
