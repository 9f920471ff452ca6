//! Which tenant namespaces still refuse pods asking for `nvidia.com/` extended resources (the
//! policy `tessera-gpu-pods`, params key [`PENDING`]). A namespace created after its quota lists
//! it (or while the operator is down) has no ResourceQuota at first: extended resources are
//! unlimited there until the operator writes one and the controller manager syncs its
//! `status.hard`. The params list the namespace as pending from the pass that first lists it
//! until that ResourceQuota enforces every planned `requests.nvidia.com/...` key at no more than
//! planned and carries its in-force stamp (`super::stamp`; the gate the claim classes use,
//! `claims::allowed_classes`), so the window is closed.

use k8s_openapi::api::core::v1::ResourceQuota;
use tessera_crds::TenantGpuQuota;

use super::Apply;
use super::quantity::count;

/// The params key: space-separated tenant namespaces whose limits are not enforced yet. A
/// list of the few pending ones keeps the ConfigMap small with thousands of tenant namespaces.
pub const PENDING: &str = "_pending";

/// The ResourceQuota keys that limit pods' `nvidia.com/` extended resources.
const GPU_KEY_PREFIX: &str = "requests.nvidia.com/";

/// Whether pods may ask for extended resources in `ns`, claimed by `quotas`: each quota's planned
/// ResourceQuota there (`applies`) is in `rqs` (owned by it) with `status.hard` carrying each
/// planned `requests.nvidia.com/` key at no more than planned. A quota that plans nothing there
/// (invalid, or both names taken) counts where a ResourceQuota it owns there has a synced
/// `status.hard` (kept as it enforced). No quota enforcing anything: not enforced.
pub fn enforced(ns: &str, quotas: &[&TenantGpuQuota], rqs: &[ResourceQuota], applies: &[Apply]) -> bool {
    let mut any = false;
    for q in quotas {
        let name = q.metadata.name.as_deref().unwrap_or_default();
        let mut owned = rqs.iter().filter(|rq| rq.metadata.namespace.as_deref() == Some(ns) && super::owned_by(rq, q));
        let Some(a) = applies.iter().find(|a| a.namespace == ns && a.quota == name) else {
            any |= owned.any(|rq| rq.status.as_ref().and_then(|s| s.hard.as_ref()).is_some());
            continue;
        };
        // No planned pod limit (`hard: {}`, physical limits only): nothing to wait for.
        if !a.hard.keys().any(|k| k.starts_with(GPU_KEY_PREFIX)) {
            any = true;
            continue;
        }
        let Some(rq) = owned.find(|rq| rq.metadata.name.as_deref() == Some(a.name.as_str())) else {
            return false;
        };
        let Some(hard) = rq.status.as_ref().and_then(|s| s.hard.as_ref()) else {
            return false;
        };
        // Pending until the stamp is cached, as the classes are closed (`claims::allowed_classes`).
        if super::stamp::stamp_of(rq).is_none() {
            return false;
        }
        let spec = rq.spec.as_ref().and_then(|s| s.hard.as_ref());
        let limited = a.hard.iter().filter(|(k, _)| k.starts_with(GPU_KEY_PREFIX)).all(|(k, want)| {
            // Each key's own stamp cached (`super::stamp::keys`), as for the classes.
            if super::stamp::keys::key_stamp(rq, k).is_none() {
                return false;
            }
            let have = super::phases::in_force(spec, Some(hard), k);
            have.zip(count(want)).is_some_and(|(h, w)| h <= w)
        });
        if !limited {
            return false;
        }
        any = true;
    }
    any
}

/// Each namespace's UID and creation time, by name, for [`uid_key`] and
/// [`of_current_namespaces`]. Terminating namespaces included: dropping the UID of one whose
/// ResourceQuota is still cached left it out of both the UID check and [`PENDING`]; re-created
/// while the operator is down it admitted GPU pods with no ResourceQuota. Kept, the old UID
/// mismatches the new namespace's, which the policies refuse until a pass runs.
pub fn namespace_facts<'a>(
    namespaces: impl IntoIterator<Item = &'a k8s_openapi::api::core::v1::Namespace>,
) -> (
    std::collections::BTreeMap<String, String>,
    std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
) {
    let (mut uids, mut created) = (std::collections::BTreeMap::new(), std::collections::BTreeMap::new());
    for n in namespaces {
        let Some(name) = n.metadata.name.clone() else { continue };
        if let Some(uid) = n.metadata.uid.clone() {
            uids.insert(name.clone(), uid);
        }
        if let Some(t) = n.metadata.creation_timestamp.clone() {
            created.insert(name, t);
        }
    }
    (uids, created)
}

/// `rqs` less those cached from a previous namespace of the same name: created before the
/// namespace that now holds the name (`created`, by name). A namespace deleted and created again
/// has none of the old one's ResourceQuotas, but a lagging ResourceQuota watch (or a cache filled
/// before the re-creation) still shows them; taken as enforced they would keep the new namespace
/// out of [`PENDING`], open its classes and skip the write. Timestamps have second granularity:
/// one created in the namespace's second is kept (a re-creation within the second of the old
/// ResourceQuota's creation is not told apart). A namespace not in `created` keeps its own here;
/// the plan counts none of them as enforcing ([`enforcing`]).
pub fn of_current_namespaces(
    rqs: Vec<ResourceQuota>,
    created: &std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
) -> Vec<ResourceQuota> {
    rqs.into_iter()
        .filter(|rq| {
            let ns = rq.metadata.namespace.as_deref().and_then(|ns| created.get(ns));
            match (ns, rq.metadata.creation_timestamp.as_ref()) {
                (Some(ns), Some(rq)) => rq.0 >= ns.0,
                // Unknown creation time: cannot be told stale.
                _ => true,
            }
        })
        .collect()
}

/// `<ns>.uid` of a tenant namespace the namespace cache does not show (deleted, or not seen yet):
/// the UID the params last held for it (`last`), or [`ABSENT`] where a ResourceQuota is still
/// cached there (a lagging ResourceQuota watch: the namespace existed). Either mismatches any
/// namespace created under that name later, which both policies refuse until a pass has run
/// (the operator may stop first). None for one never seen: it has no ResourceQuota and is pending.
pub fn tombstone<'a>(ns: &str, last: Option<&'a str>, rqs: &[ResourceQuota]) -> Option<&'a str> {
    last.or_else(|| rqs.iter().any(|rq| rq.metadata.namespace.as_deref() == Some(ns)).then_some(ABSENT))
}

/// The `<ns>.uid` of a namespace gone from the cache with no UID known: no UID equals it.
pub const ABSENT: &str = "absent";

/// The ResourceQuotas that may count as enforcing (`_pending`, the classes a namespace opens):
/// `rqs` less those in a namespace the namespace cache does not show (`known`: deleted, its
/// ResourceQuota watch lagging; a namespace created again under its name has none of them), and
/// less Tessera's with a `spec.scopes` or `spec.scopeSelector` ([`scoped`]). Borrowed when none
/// is dropped (the usual pass copies nothing).
pub fn enforcing<'a>(rqs: &'a [ResourceQuota], known: impl Fn(&str) -> bool) -> std::borrow::Cow<'a, [ResourceQuota]> {
    let counts = |rq: &ResourceQuota| {
        rq.metadata.namespace.as_deref().is_some_and(&known)
            && !(super::written_by(rq).is_some() && scoped(rq).is_some())
    };
    if rqs.iter().all(counts) {
        return std::borrow::Cow::Borrowed(rqs);
    }
    std::borrow::Cow::Owned(rqs.iter().filter(|rq| counts(rq)).cloned().collect())
}

/// The scope field set on a ResourceQuota (`spec.scopes` or `spec.scopeSelector`), if any. Tessera
/// applies only `spec.hard`; a webhook or another field manager may add a scope, and then the
/// ResourceQuota counts only pods in that scope and no ResourceClaim: its limits do not hold.
pub fn scoped(rq: &ResourceQuota) -> Option<&'static str> {
    let spec = rq.spec.as_ref()?;
    if spec.scopes.as_ref().is_some_and(|s| !s.is_empty()) {
        return Some("spec.scopes");
    }
    // Any selector, even one with no expression: failing closed costs only a pending namespace.
    spec.scope_selector.is_some().then_some("spec.scopeSelector")
}

/// The params key listing the GPU resources the ResourceQuotas of an `unlisted: Zero` quota
/// limit. Under `Zero` a GPU resource ([`super::is_gpu_resource`]) no node advertises yet
/// (`nvidia.com/gpu.shared` before time-slicing is enabled, a MIG profile of a board outside the
/// catalog) has no ResourceQuota key: a pod asking for it would be admitted and bind once nodes
/// advertise it. The pod policy refuses, in the quota's namespaces, GPU resources not listed
/// here. Per quota, not per namespace: the ConfigMap stays small with thousands of namespaces.
pub fn resources_key(quota: &str) -> String {
    format!("{quota}.resources")
}

/// [`resources_key`] of each valid `unlisted: Zero` quota: the GPU resources of its planned
/// ResourceQuotas' `requests.` keys, space-separated. A quota whose key would pass the 253
/// characters a ConfigMap key may have gets none (its namespaces keep only the ResourceQuota).
pub fn zero_resources(valid: &[&TenantGpuQuota], applies: &[Apply]) -> std::collections::BTreeMap<String, String> {
    let zero = valid.iter().filter(|q| q.spec.unlisted == tessera_crds::quota::UnlistedPolicy::Zero);
    zero.filter_map(|q| {
        let name = q.metadata.name.as_deref()?;
        let key = resources_key(name);
        let keys = applies.iter().filter(|a| a.quota == name).flat_map(|a| a.hard.keys());
        let res: std::collections::BTreeSet<&str> =
            keys.filter_map(|k| k.strip_prefix("requests.")).filter(|r| super::is_gpu_resource(r)).collect();
        (key.len() <= 253).then(|| (key, res.into_iter().collect::<Vec<_>>().join(" ")))
    })
    .collect()
}

#[cfg(test)]
mod tests;

/// The params key listing every TenantGpuQuota the operator last saw (space-separated names).
/// The policy `tessera-quota-names` refuses creating a quota under a listed name: one deleted and
/// created again before the operator saw the deletion (it was down) would otherwise find its
/// namespaces described as enforced, their ResourceQuotas already garbage-collected.
pub const QUOTAS: &str = "_quotas";

/// The params key holding tenant namespace `ns`'s UID as the operator last saw it. Both
/// policies compare it with the namespace's UID: a namespace deleted and created
/// again while the operator is down has no ResourceQuota, yet the params still call the old one
/// enforced; a mismatch is pending (GPU pods refused) and closed (GPU classes refused). Written
/// for every tenant namespace that exists; a namespace the operator has not seen has no key
/// and is pending anyway (no ResourceQuota of its quota there). Params of an older operator
/// have none: not checked (no refusal at upgrade; the new operator writes them its first pass).
pub fn uid_key(ns: &str) -> String {
    format!("{ns}.uid")
}

/// The params key saying why `ns` is pending when waiting will not end it (both ResourceQuota
/// names taken): the pod policy's message names it instead of "retry in a few seconds".
pub fn reason_key(ns: &str) -> String {
    format!("{ns}.pending")
}

/// The params key listing, per namespace, the GPU resources some ResourceQuota of a quota
/// claiming it limits (planned or kept). Written where [`resources_key`] cannot answer: the
/// namespace is claimed by two quotas and one is `unlisted: Zero` (`<ns>.quota` holds both
/// names), or a quota claiming it is invalid (its key is dropped; it keeps what it enforced).
/// The pod policy prefers it to [`resources_key`]: fails closed, a GPU resource no
/// ResourceQuota there limits is refused.
pub fn limited_key(ns: &str) -> String {
    format!("{ns}.limited")
}

/// [`uid_key`], [`reason_key`] and [`limited_key`] of tenant namespace `ns` claimed by `quotas`
/// (`valid` names the valid ones); `uid` is its UID where it exists.
pub fn namespace_keys(
    ns: &str,
    quotas: &[&TenantGpuQuota],
    valid: &std::collections::BTreeSet<&str>,
    rqs: &[ResourceQuota],
    applies: &[Apply],
    uid: Option<&str>,
) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    if let Some(uid) = uid {
        out.insert(uid_key(ns), uid.to_string());
    }
    let name = |q: &TenantGpuQuota| q.metadata.name.clone().unwrap_or_default();
    let taken: Vec<String> = quotas.iter().filter_map(|q| names_taken(ns, q, rqs, applies)).collect();
    if !taken.is_empty() {
        out.insert(reason_key(ns), taken.join("; "));
    }
    let zero = quotas.iter().any(|q| q.spec.unlisted == tessera_crds::quota::UnlistedPolicy::Zero);
    let invalid = quotas.iter().any(|q| !valid.contains(name(q).as_str()));
    if (quotas.len() > 1 && zero) || invalid {
        let planned = applies.iter().filter(|a| a.namespace == ns && quotas.iter().any(|q| name(q) == a.quota));
        let kept = rqs
            .iter()
            .filter(|rq| rq.metadata.namespace.as_deref() == Some(ns) && quotas.iter().any(|q| super::owned_by(rq, q)));
        let kept_keys = kept.flat_map(|rq| {
            let spec = rq.spec.as_ref().and_then(|s| s.hard.as_ref()).into_iter().flat_map(|h| h.keys());
            spec.chain(rq.status.as_ref().and_then(|s| s.hard.as_ref()).into_iter().flat_map(|h| h.keys()))
        });
        let res: std::collections::BTreeSet<&str> = planned
            .flat_map(|a| a.hard.keys())
            .chain(kept_keys)
            .filter_map(|k| k.strip_prefix("requests."))
            .filter(|r| super::is_gpu_resource(r))
            .collect();
        out.insert(limited_key(ns), res.into_iter().collect::<Vec<_>>().join(" "));
    }
    out
}

/// Why `q` enforces nothing in `ns` though it could: it plans no ResourceQuota there and both of
/// its names are held by ResourceQuotas it does not own (`steps::rq_name`).
fn names_taken(ns: &str, q: &TenantGpuQuota, rqs: &[ResourceQuota], applies: &[Apply]) -> Option<String> {
    let name = q.metadata.name.as_deref().unwrap_or_default();
    if applies.iter().any(|a| a.namespace == ns && a.quota == name) {
        return None;
    }
    let primary = super::resource_quota_name(name);
    let fallback = super::fallback_resource_quota_name(name, q.metadata.uid.as_deref().unwrap_or_default());
    let foreign = |n: &str| {
        rqs.iter().any(|rq| {
            rq.metadata.namespace.as_deref() == Some(ns)
                && rq.metadata.name.as_deref() == Some(n)
                && !super::owned_by(rq, q)
        })
    };
    (foreign(&primary) && foreign(&fallback)).then(|| {
        format!(
            "ResourceQuotas {primary} and {fallback} there are not TenantGpuQuota {name}'s, so its limits cannot \
             be written (rename or delete one; see TenantGpuQuota {name} status)"
        )
    })
}
