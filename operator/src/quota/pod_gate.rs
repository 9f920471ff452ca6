//! Which tenant namespaces still refuse pods asking for `nvidia.com/` extended resources (the
//! policy `tessera-gpu-pods`, params key [`PENDING`]). A namespace created after its quota lists
//! it (or while the operator is down) has no ResourceQuota at first: extended resources are
//! unlimited there until the operator writes one and the controller manager syncs its
//! `status.hard`. The params list the namespace as pending from the pass that first lists it
//! until that ResourceQuota enforces every planned `requests.nvidia.com/...` key at no more than
//! planned (the gate the claim classes use, `claims::allowed_classes`), so the window is closed.

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
        let spec = rq.spec.as_ref().and_then(|s| s.hard.as_ref());
        let limited = a.hard.iter().filter(|(k, _)| k.starts_with(GPU_KEY_PREFIX)).all(|(k, want)| {
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

#[cfg(test)]
mod tests;
