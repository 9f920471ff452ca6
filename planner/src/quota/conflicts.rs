//! Where the usual share cannot be written: a namespace claimed by two quotas, and the
//! namespaces of an invalid quota. Both fail closed. Each quota writes its own ResourceQuota
//! there, never another's (`steps::enforce` applies a valid quota's share whether or not the
//! namespace is claimed twice): the API server's quota admission checks every ResourceQuota of
//! a namespace, so per key the stricter of the two holds natively, with no object shared between
//! owners and nothing to undo when the conflict ends. A typo in either quota lifts no limit: the
//! other's ResourceQuota stays. An invalid quota, whose limits cannot be read, holds every GPU
//! key at 0 where it enforced nothing yet ([`closed_hard`]) and keeps what it enforced elsewhere.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ResourceQuota;
use tessera_crds::TenantGpuQuota;
use tessera_crds::quota::AllocationPath;

use super::claims::{ClassView, claim_keys};
use super::steps::{Pass, Wanted, rq_name};
use super::{Apply, QuotaPlan, owned_by};

/// Every GPU key at 0: both paths (`requests.<resource>` and the devices key of Tessera's class)
/// of each resource of `resources`, every GPU-reaching class, and the extended resources of
/// KEP-5004 classes. For a quota whose limits cannot be read: whatever its `allocation` says.
pub(super) fn closed_hard(resources: &BTreeSet<String>, view: &ClassView) -> BTreeMap<String, String> {
    let zero: BTreeMap<String, i64> = resources.iter().map(|r| (r.clone(), 0)).collect();
    let mut hard: BTreeMap<String, String> = resources.iter().map(|r| (format!("requests.{r}"), "0".into())).collect();
    let none = BTreeSet::new();
    claim_keys(AllocationPath::ExtendedResources, &zero, &none, &none, view, &mut hard);
    hard
}

/// For an invalid quota: each namespace it lists that exists and holds no ResourceQuota of its
/// own yet gets one with [`closed_hard`]; one it wrote so before ([`is_closed`]) is kept current
/// (a GPU-reaching class made since gets its 0). Returns those namespaces and why a name was
/// taken, for the status.
pub(super) fn hold_invalid_at_zero(
    p: &Pass<'_>,
    q: &TenantGpuQuota,
    plan: &mut QuotaPlan,
    wanted: &mut Wanted,
) -> (Vec<String>, Vec<String>) {
    let name = q.metadata.name.clone().unwrap_or_default();
    let resources = p.capacity.gpu_resources();
    let (mut held, mut taken) = (Vec::new(), Vec::new());
    let listed: BTreeSet<&String> = q.spec.namespaces.iter().collect();
    for ns in listed.into_iter().filter(|ns| p.existing_namespaces.contains(*ns)) {
        let owned: Vec<&ResourceQuota> = p
            .resource_quotas
            .iter()
            .filter(|rq| rq.metadata.namespace.as_ref() == Some(ns) && owned_by(rq, q))
            .collect();
        let (rq, cached) = match owned[..] {
            [] => (rq_name(p, q, &name, ns, &mut taken), None),
            [one] if is_closed(one) => (one.metadata.name.clone(), Some(one)),
            _ => (None, None), // a share it enforced while valid: kept as it was (`steps::invalid`)
        };
        let Some(rq) = rq else { continue };
        let hard = closed_hard(&resources, p.classes);
        let (in_force_since, in_force_keys) = super::stamp::planned_both(cached, &hard, &name, p.stored, &p.now);
        let (namespace, quota) = (ns.clone(), name.clone());
        plan.apply.push(Apply { namespace, quota, name: rq.clone(), hard, in_force_since, in_force_keys });
        wanted.insert((ns.clone(), rq));
        held.push(ns.clone());
    }
    (held, taken)
}

/// Whether `rq` holds every GPU key at 0 as [`closed_hard`] writes it: only 0s, among them
/// `nvidia.com/gpu` and every MIG resource of the catalog (what a valid quota writes only with
/// `unlisted: Zero` and nothing granted, where the same 0s are its share anyway).
fn is_closed(rq: &ResourceQuota) -> bool {
    let Some(hard) = rq.spec.as_ref().and_then(|s| s.hard.as_ref()) else { return false };
    let every = super::gpu_resources(&BTreeMap::new());
    hard.values().all(|v| v.0 == "0") && every.iter().all(|r| hard.contains_key(&format!("requests.{r}")))
}

#[cfg(test)]
mod tests;
