//! Where the usual share cannot be written: a namespace claimed by two quotas, and the
//! namespaces of an invalid quota. Both fail closed. Each quota writes its own ResourceQuota
//! there (never another's): the API server's quota admission checks every ResourceQuota of a
//! namespace, so per key the stricter of the two holds with no object shared between owners.
//! A quota whose share was enforced before the conflict only makes it stricter ([`stricter`]);
//! an invalid quota, whose limits cannot be read, holds every GPU key at 0 where it enforced
//! nothing yet ([`closed_hard`]) and keeps what it enforced elsewhere.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tessera_crds::TenantGpuQuota;
use tessera_crds::quota::AllocationPath;

use super::claims::{ClassView, claim_keys};
use super::steps::{Pass, Wanted, rq_name};
use super::{Apply, QuotaPlan, owned_by};

/// Makes `hard` (a planned `spec.hard`) no looser than each of `enforced` (the quota's own
/// ResourceQuotas' `spec.hard` in the namespace): per key the least; a key only `enforced` has
/// stays (no limit is dropped while the conflict lasts); a value that is no plain integer
/// counts as 0.
pub(super) fn stricter<'a>(
    hard: &mut BTreeMap<String, String>,
    enforced: impl IntoIterator<Item = &'a BTreeMap<String, Quantity>>,
) {
    let num = |v: &str| v.parse::<i64>().ok().filter(|n| *n >= 0).unwrap_or(0);
    for have in enforced {
        for (k, v) in have {
            let n = match hard.get(k) {
                Some(want) => num(want).min(num(&v.0)),
                None => num(&v.0),
            };
            hard.insert(k.clone(), n.to_string());
        }
    }
    for v in hard.values_mut() {
        *v = num(v).to_string();
    }
}

/// The `spec.hard` of every ResourceQuota `q` owns in `ns` (by owner UID, any name).
fn enforced_by<'p>(
    rqs: &'p [ResourceQuota],
    q: &TenantGpuQuota,
    ns: &str,
) -> impl Iterator<Item = &'p BTreeMap<String, Quantity>> {
    let q = q.clone();
    let ns = ns.to_string();
    rqs.iter()
        .filter(move |rq| rq.metadata.namespace.as_deref() == Some(ns.as_str()) && owned_by(rq, &q))
        .filter_map(|rq| rq.spec.as_ref()?.hard.as_ref())
}

/// A conflicted namespace's planned `hard` for `q`, made no looser than what `q` enforces there.
pub(super) fn in_conflict(p: &Pass<'_>, q: &TenantGpuQuota, ns: &str, hard: &mut BTreeMap<String, String>) {
    stricter(hard, enforced_by(p.resource_quotas, q, ns));
}

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
/// own yet gets one with [`closed_hard`]. Returns those namespaces and why a name was taken,
/// for the status.
pub(super) fn hold_invalid_at_zero(
    p: &Pass<'_>,
    q: &TenantGpuQuota,
    plan: &mut QuotaPlan,
    wanted: &mut Wanted,
) -> (Vec<String>, Vec<String>) {
    let name = q.metadata.name.clone().unwrap_or_default();
    let resources = super::gpu_resources(&p.capacity.supply);
    let (mut held, mut taken) = (Vec::new(), Vec::new());
    let listed: BTreeSet<&String> = q.spec.namespaces.iter().collect();
    for ns in listed.into_iter().filter(|ns| p.existing_namespaces.contains(*ns)) {
        if p.resource_quotas.iter().any(|rq| rq.metadata.namespace.as_ref() == Some(ns) && owned_by(rq, q)) {
            continue; // what it enforced there is kept (`steps::invalid`)
        }
        let Some(rq) = rq_name(p, q, &name, ns, &mut taken) else { continue };
        let hard = closed_hard(&resources, p.classes);
        plan.apply.push(Apply { namespace: ns.clone(), quota: name.clone(), name: rq.clone(), hard });
        wanted.insert((ns.clone(), rq));
        held.push(ns.clone());
    }
    (held, taken)
}

#[cfg(test)]
mod tests;
