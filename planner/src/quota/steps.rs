//! The steps of a quota pass, each rule in one place: reject an invalid quota (`invalid`), find
//! the namespaces claimed twice (`conflicts`), apply each namespace's share (`enforce`) under a
//! name the quota owns (`rq_name`) with its limits (`hard`), set the status conditions, and
//! delete what no quota wants any more (`sweep_stale`).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tessera_crds::TenantGpuQuota;
use tessera_crds::conditions::quota_reasons as reasons;
use tessera_crds::conditions::{CAPACITY_AVAILABLE, CONFLICT, READY, STALLED, remove_condition, set_condition};
use tessera_crds::quota::{NamespaceUsage, ResourceUsage, TenantGpuQuotaStatus, UnlistedPolicy};
use tessera_crds::validate::validate_quota_limits;

use super::{
    Apply, Capacity, Delete, QUOTA_LABEL, QuotaPlan, fallback_resource_quota_name, owned_by, physical,
    quota_label_value, resource_quota_name, shares, unlisted_gpu_resources, used_in, written_by,
};

/// What every quota's steps read: the pass's inputs and the fleet-wide facts.
pub(super) struct Pass<'p> {
    pub existing_namespaces: &'p BTreeSet<String>,
    pub resource_quotas: &'p [ResourceQuota],
    /// The quotas claiming each namespace ([`super::namespace_claims`]).
    pub claims: BTreeMap<&'p str, BTreeSet<&'p str>>,
    pub capacity: &'p Capacity,
    /// The cluster's DeviceClasses, for the claim keys.
    pub classes: &'p super::claims::ClassView,
    /// Devices the namespaces hold through GPU classes that are not Tessera's.
    pub held: &'p super::holdings::Held,
    /// Unallocated claims of those classes (counted in `held` too), for the notes.
    pub pending: &'p [super::unallocated::Pending],
    /// What every quota asks for, and how much of it the fleet does not supply.
    pub demand: BTreeMap<String, i64>,
    pub short: BTreeMap<String, i64>,
    /// The params as stored ([`super::DraInputs::stored_params`]).
    pub stored: &'p BTreeMap<String, String>,
    pub now: Time,
}

/// The ResourceQuotas to keep: (namespace, name).
pub(super) type Wanted = BTreeSet<(String, String)>;

impl<'p> Pass<'p> {
    fn claimed_twice(&self, ns: &str) -> bool {
        self.claims.get(ns).is_some_and(|c| c.len() > 1)
    }

    /// Where nothing new can be applied, what this quota enforced there stays; returns it.
    fn keep_enforced(&self, q: &TenantGpuQuota, ns: &str, wanted: &mut Wanted) -> Vec<&'p ResourceQuota> {
        let kept: Vec<&'p ResourceQuota> = self
            .resource_quotas
            .iter()
            .filter(|rq| owned_by(rq, q) && rq.metadata.namespace.as_deref() == Some(ns))
            .collect();
        for rq in &kept {
            wanted.insert((ns.to_string(), rq.metadata.name.clone().unwrap_or_default()));
        }
        kept
    }
}

/// An invalid quota: `Stalled` and not `Ready`, and what it applied before is kept. False when
/// the quota is valid (nothing done).
pub(super) fn invalid(p: &Pass<'_>, q: &TenantGpuQuota, plan: &mut QuotaPlan, wanted: &mut Wanted) -> bool {
    let errors = validate_quota_limits(&q.spec);
    if errors.is_empty() {
        return false;
    }
    let name = q.metadata.name.clone().unwrap_or_default();
    let mut st = q.status.clone().unwrap_or_default();
    st.observed_generation = q.metadata.generation;
    let g = q.metadata.generation;
    let mut msg = errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
    // Fail closed where nothing of this quota's is enforced yet (see `conflicts`).
    let (held, taken) = super::conflicts::hold_invalid_at_zero(p, q, plan, wanted);
    if !held.is_empty() {
        msg.push_str(&format!(
            "; every GPU resource is held at 0 in namespace(s) {} (limits that cannot be read grant nothing) \
             until the spec is fixed; the ResourceQuotas it applied before stay as they were",
            held.join(", ")
        ));
    }
    taken.iter().for_each(|t| msg.push_str(&format!("; {t}")));
    set_condition(&mut st.conditions, STALLED, true, reasons::INVALID_SPEC, &msg, g, p.now.clone());
    set_condition(&mut st.conditions, READY, false, reasons::INVALID_SPEC, msg, g, p.now.clone());
    plan.statuses.insert(name, st);
    // Keep what was applied before: an invalid edit never removes enforcement.
    for rq in p.resource_quotas.iter().filter(|rq| owned_by(rq, q)) {
        wanted
            .insert((rq.metadata.namespace.clone().unwrap_or_default(), rq.metadata.name.clone().unwrap_or_default()));
    }
    true
}

/// Plans one valid quota: its ResourceQuotas to apply, and its status.
pub(super) fn plan_quota(p: &Pass<'_>, q: &TenantGpuQuota, plan: &mut QuotaPlan, wanted: &mut Wanted) {
    let name = q.metadata.name.clone().unwrap_or_default();
    let g = q.metadata.generation;
    let mut st = q.status.clone().unwrap_or_default();
    st.observed_generation = g;
    let conflicts = conflicts(p, q, &name);
    let missing: Vec<&String> = q.spec.namespaces.iter().filter(|ns| !p.existing_namespaces.contains(*ns)).collect();
    st.namespaces.clear();
    let (used_total, taken, reduced) = enforce(p, q, &name, plan, wanted, &mut st.namespaces);
    st.resources = q
        .spec
        .hard
        .iter()
        .map(|(r, &hard)| {
            let used = used_total.get(r).copied().unwrap_or(0);
            ResourceUsage { name: r.clone(), hard, used, remaining: (hard - used).max(0) }
        })
        .collect();
    set_conflict_and_stalled(p, &mut st, &conflicts, &taken, g);
    set_capacity(p, &mut st, g);
    let mut notes = notes(p, q, &missing, &used_total);
    notes.extend(reduced);
    let over_physical = notes.iter().any(|n| n.contains("over the physical limit"));
    let scoped = scoped(p, q, &name, &plan.apply);
    let ready = conflicts.is_empty() && taken.is_empty() && scoped.is_empty() && missing.is_empty() && !over_physical;
    let (reason, msg) = if !conflicts.is_empty() {
        (reasons::CONFLICT, "see the Conflict condition".to_string())
    } else if !taken.is_empty() {
        (reasons::RESOURCE_QUOTA_NAME_TAKEN, taken.join("; "))
    } else if !scoped.is_empty() {
        (reasons::RESOURCE_QUOTA_SCOPED, scoped.join("; "))
    } else if over_physical {
        (reasons::OVER_PHYSICAL_LIMIT, notes.join("; "))
    } else if !missing.is_empty() {
        (reasons::NAMESPACE_MISSING, notes.join("; "))
    } else {
        let msg = if notes.is_empty() { "ResourceQuotas are in place".to_string() } else { notes.join("; ") };
        (reasons::ENFORCED, msg)
    };
    set_condition(&mut st.conditions, READY, ready, reason, msg, g, p.now.clone());
    plan.statuses.insert(name, st);
}

/// Where this quota's planned ResourceQuota carries a scope ([`super::pod_gate::scoped`]): it
/// limits only pods in that scope and no claim, so the namespace stays pending, its classes
/// closed ([`super::pod_gate::enforcing`]); the status names the object and the field.
fn scoped(p: &Pass<'_>, q: &TenantGpuQuota, name: &str, applies: &[Apply]) -> Vec<String> {
    let mine = applies.iter().filter(|a| a.quota == name);
    mine.filter_map(|a| {
        let rq = p.resource_quotas.iter().find(|rq| {
            rq.metadata.namespace.as_deref() == Some(a.namespace.as_str())
                && rq.metadata.name.as_deref() == Some(a.name.as_str())
                && owned_by(rq, q)
        })?;
        let field = super::pod_gate::scoped(rq)?;
        Some(format!(
            "namespace {}: ResourceQuota {} has {field} set (not by Tessera): it counts only pods in its scope and \
             no ResourceClaim, so its limits are not in force; GPU pods and Tessera's classes stay refused there until \
             {field} is removed",
            a.namespace, a.name
        ))
    })
    .collect()
}

/// The quota's namespaces that another quota claims too, each with who else claims it.
fn conflicts(p: &Pass<'_>, q: &TenantGpuQuota, name: &str) -> Vec<String> {
    q.spec
        .namespaces
        .iter()
        .filter(|ns| p.claimed_twice(ns))
        .map(|ns| {
            format!(
                "{ns} (also claimed by {})",
                p.claims[ns.as_str()].iter().filter(|c| **c != name).cloned().collect::<Vec<_>>().join(", ")
            )
        })
        .collect()
}

/// Applies the quota's share in each namespace it lists that exists, also where another quota
/// claims it (both ResourceQuotas apply, so the stricter holds: [`super::conflicts`]); returns the
/// usage summed over them, why a share could not go under its usual name, and where a share is
/// cut while the other allocation path still holds devices ([`super::claims::reduce_for_other_path`]).
fn enforce(
    p: &Pass<'_>,
    q: &TenantGpuQuota,
    name: &str,
    plan: &mut QuotaPlan,
    wanted: &mut Wanted,
    namespaces: &mut Vec<NamespaceUsage>,
) -> (BTreeMap<String, i64>, Vec<String>, Vec<String>) {
    let mut used_total: BTreeMap<String, i64> = BTreeMap::new();
    let (mut taken, mut reduced): (Vec<String>, Vec<String>) = Default::default();
    let (mut planned, mut rq_names, mut kept) = (Vec::new(), Vec::new(), Vec::new());
    for (ns, share) in shares(&q.spec) {
        if !p.existing_namespaces.contains(&ns) {
            continue;
        }
        let Some(rq_name) = rq_name(p, q, name, &ns, &mut taken) else {
            let rqs = p.keep_enforced(q, &ns, wanted);
            kept.push(super::holdings::Kept { ns, share, rqs });
            continue;
        };
        let mut hard = hard(p, q, &share);
        let rq = p.resource_quotas.iter().find(|rq| {
            rq.metadata.namespace.as_deref() == Some(ns.as_str()) && rq.metadata.name.as_deref() == Some(&rq_name)
        });
        let status = rq.and_then(|rq| rq.status.as_ref());
        let written = rq.and_then(|rq| rq.spec.as_ref()?.hard.as_ref());
        let cut = super::claims::reduce_for_other_path(q.spec.allocation, &share, status, p.classes, &mut hard);
        reduced.extend(cut.into_iter().map(|c| format!("namespace {ns}: {c}")));
        let used = used_in(p.resource_quotas, &ns, &rq_name);
        planned.push(super::holdings::Planned { ns, share, status, written, hard, used });
        rq_names.push((rq_name, rq));
    }
    // Across namespaces: what one holds above its share comes off the others' limits.
    reduced.extend(super::holdings::bound(q.spec.allocation, &mut planned, &kept, p.held));
    reduced.extend(super::unallocated::notes(p.pending, planned.iter().map(|pl| pl.ns.as_str())));
    // Across namespaces in time: a raise waits for the lowerings it takes from ([`super::phases`]).
    reduced.extend(super::phases::hold_raises(&mut planned));
    for (pl, (rq_name, rq)) in planned.into_iter().zip(rq_names) {
        let ns = pl.ns;
        let (in_force_since, in_force_keys) = super::stamp::planned_both(rq, &pl.hard, name, p.stored, &p.now);
        let (quota, hard) = (name.to_string(), pl.hard);
        let (namespace, rq) = (ns.clone(), rq_name.clone());
        plan.apply.push(Apply { namespace, quota, name: rq, hard, in_force_since, in_force_keys });
        wanted.insert((ns.clone(), rq_name));
        for (r, n) in &pl.used {
            *used_total.entry(r.clone()).or_default() += n;
        }
        namespaces.push(NamespaceUsage { namespace: ns, hard: pl.share, used: pl.used });
    }
    (used_total, taken, reduced)
}

/// The name of the quota's ResourceQuota in `ns`: [`resource_quota_name`], or the fallback when
/// a ResourceQuota the quota does not own holds it (said in `taken`); `None` when both do.
pub(super) fn rq_name(
    p: &Pass<'_>,
    q: &TenantGpuQuota,
    name: &str,
    ns: &str,
    taken: &mut Vec<String>,
) -> Option<String> {
    let primary = resource_quota_name(name);
    let fallback = fallback_resource_quota_name(name, q.metadata.uid.as_deref().unwrap_or_default());
    // A ResourceQuota this quota does not own is never overwritten (a force-apply would
    // adopt it); the share goes under the fallback name instead.
    let foreign = |rq_name: &str| {
        p.resource_quotas.iter().any(|rq| {
            rq.metadata.namespace.as_deref() == Some(ns)
                && rq.metadata.name.as_deref() == Some(rq_name)
                && !owned_by(rq, q)
        })
    };
    let Some(rq_name) = [&primary, &fallback].into_iter().find(|n| !foreign(n)).cloned() else {
        taken.push(format!(
            "namespace {ns}: ResourceQuotas {primary} and {fallback} exist and are not this quota's; they \
             are left as they are and this quota's share is NOT enforced there (rename or delete one)"
        ));
        return None;
    };
    if rq_name != primary {
        taken.push(format!(
            "namespace {ns}: ResourceQuota {primary} exists and is not this quota's (no controller owner \
             reference to it with label {QUOTA_LABEL}={}); it is left as it is and the share is enforced \
             as {rq_name} until it is renamed or deleted",
            quota_label_value(name)
        ));
    }
    Some(rq_name)
}

/// A share's `spec.hard`: `requests.<resource>` per resource, 0 for the fleet's other GPU
/// resources when the quota says `unlisted: Zero`, and the claim keys of its allocation path.
fn hard(p: &Pass<'_>, q: &TenantGpuQuota, share: &BTreeMap<String, i64>) -> BTreeMap<String, String> {
    let mut hard: BTreeMap<String, String> =
        share.iter().map(|(r, n)| (format!("requests.{r}"), n.to_string())).collect();
    let mut unlisted = BTreeSet::new();
    if q.spec.unlisted == UnlistedPolicy::Zero {
        unlisted = unlisted_gpu_resources(&q.spec, p.capacity);
        for r in &unlisted {
            hard.insert(format!("requests.{r}"), "0".into());
        }
    }
    let mut unlimited = p.capacity.gpu_resources();
    if q.spec.unlisted == UnlistedPolicy::Zero {
        unlimited.clear();
    }
    unlimited.retain(|r| !q.spec.hard.contains_key(r));
    super::claims::claim_keys(q.spec.allocation, share, &unlisted, &unlimited, p.classes, &mut hard);
    hard
}

/// `Conflict` while a namespace is claimed twice; `Stalled` while that, or a taken name, holds
/// a share.
fn set_conflict_and_stalled(
    p: &Pass<'_>,
    st: &mut TenantGpuQuotaStatus,
    conflicts: &[String],
    taken: &[String],
    g: Option<i64>,
) {
    let t = || p.now.clone();
    if conflicts.is_empty() {
        remove_condition(&mut st.conditions, CONFLICT);
    } else {
        let msg = format!(
            "namespace(s) claimed by more than one quota: each quota applies its own ResourceQuota there (0 \
             for every GPU resource from one that is invalid) and the API server enforces both, so per \
             resource the stricter limit holds, and no GPU class is open to claims, until one quota lets go: {}",
            conflicts.join("; ")
        );
        set_condition(&mut st.conditions, CONFLICT, true, reasons::NAMESPACE_CLAIMED_TWICE, &msg, g, t());
    }
    let mut stalled = taken.to_vec();
    if !conflicts.is_empty() {
        stalled.insert(0, format!("namespace(s) claimed by another quota: {}", conflicts.join("; ")));
    }
    if stalled.is_empty() {
        remove_condition(&mut st.conditions, STALLED);
    } else {
        let reason = if conflicts.is_empty() { reasons::RESOURCE_QUOTA_NAME_TAKEN } else { reasons::CONFLICT };
        set_condition(&mut st.conditions, STALLED, true, reason, stalled.join("; "), g, t());
    }
}

/// `CapacityAvailable`: whether the fleet's applied layouts supply every quota at once.
fn set_capacity(p: &Pass<'_>, st: &mut TenantGpuQuotaStatus, g: Option<i64>) {
    let supply = &p.capacity.supply;
    let shortfalls: Vec<String> = p
        .short
        .iter()
        .map(|(r, n)| format!("{r}: quotas {}, fleet {}, short {n}", p.demand[r], supply.get(r).copied().unwrap_or(0)))
        .collect();
    if shortfalls.is_empty() {
        set_condition(
            &mut st.conditions,
            CAPACITY_AVAILABLE,
            true,
            reasons::SUFFICIENT,
            "the fleet's applied layouts supply every tenant's quota at once",
            g,
            p.now.clone(),
        );
    } else {
        set_condition(
            &mut st.conditions,
            CAPACITY_AVAILABLE,
            false,
            reasons::OVER_COMMITTED,
            format!("over-committed: {}", shortfalls.join("; ")),
            g,
            p.now.clone(),
        );
    }
}

/// What `Ready` says besides: namespaces not found yet, and the physical limits.
fn notes(p: &Pass<'_>, q: &TenantGpuQuota, missing: &[&String], used_total: &BTreeMap<String, i64>) -> Vec<String> {
    let whole_gpu_gb = p.capacity.whole_gpu_gb;
    let mut notes = Vec::new();
    if !missing.is_empty() {
        notes.push(format!(
            "namespace(s) not found yet: {}",
            missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
        ));
    }
    if let Some(ph) = &q.spec.physical {
        let (c_allowed, m_allowed) = physical(&q.spec.hard, whole_gpu_gb);
        let (c_used, m_used) = physical(used_total, whole_gpu_gb);
        for (what, limit, allowed, used) in
            [("compute slices", ph.compute_slices, c_allowed, c_used), ("GB", ph.memory_gb, m_allowed, m_used)]
        {
            let Some(limit) = limit else { continue };
            if used > limit {
                notes.push(format!("uses {used} {what}, over the physical limit {limit}"));
            } else if allowed > limit {
                notes.push(format!(
                    "per-profile limits allow {allowed} {what}, more than the physical limit {limit}; usage is {used}"
                ));
            }
        }
    }
    notes
}

/// Every ResourceQuota Tessera wrote that no quota wants any more is deleted.
pub(super) fn sweep_stale(resource_quotas: &[ResourceQuota], wanted: &Wanted, delete: &mut Vec<Delete>) {
    for rq in resource_quotas {
        let key = (rq.metadata.namespace.clone().unwrap_or_default(), rq.metadata.name.clone().unwrap_or_default());
        if let Some(quota) = written_by(rq).filter(|_| !wanted.contains(&key)) {
            delete.push(Delete { namespace: key.0, name: key.1, quota: quota.to_string() });
        }
    }
}
