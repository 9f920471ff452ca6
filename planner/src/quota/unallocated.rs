//! Claims of GPU-reaching classes that are not Tessera's, made in a tenant namespace but not
//! allocated: typically made before the namespace joined a quota (or in any window where it was
//! not a tenant's), when that class was not yet held at 0. A ResourceQuota admits a claim once,
//! at its creation; a pod may use it later and the scheduler then allocates it without any quota
//! check, and after the pod it is deallocated and can be used again. So such a claim is counted
//! from now on, at the most it can take ([`Pending::count`]), against the resources it can reach,
//! and the quota's `Ready` message names it (delete it; claim through Tessera's classes). Claims
//! of Tessera's classes are admitted by the ResourceQuota only if made after it: one made before
//! (`<ns>.since` in the params) is refused allocation by the claim policy and listed for the pod
//! policy ([`early`], marked [`EARLY_MARK`]); the ResourceQuota's `status.used` already counts it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use tessera_crds::validate::GPU_RESOURCE;

use super::claims::{ClassView, compared_literal, conjuncts, pinned_driver, resource_of_class};
use super::holdings::Held;
use crate::dra::GpuDrivers;

/// The most devices one claim can be allocated (`resource.k8s.io` `AllocationResultsMaxSize`):
/// what `allocationMode: All` counts as, as the ResourceQuota counts it.
pub const MAX_DEVICES_PER_CLAIM: i64 = 32;

/// One request of an unallocated claim that counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub namespace: String,
    pub name: String,
    /// The class (for `firstAvailable`, the sub-requests' classes that count, joined by `|`).
    pub class: String,
    /// What it can take: `nvidia.com/gpu` for a whole-GPU class, `None` for any GPU resource.
    pub resource: Option<String>,
    /// The most devices it can be allocated: `count` (default 1), or
    /// [`MAX_DEVICES_PER_CLAIM`] for `All` (or a mode not known here).
    pub count: i64,
}

/// Whether `class` matches only whole GPUs: one of its selectors is a conjunction with
/// `device.driver == 'D'` and `device.attributes['D'].type == 'gpu'`, D a GPU driver.
pub fn pins_whole_gpus(class: &DeviceClass, drivers: &GpuDrivers) -> bool {
    let gpu_driver = |d: &str| d == crate::dra::NVIDIA_GPU_DRIVER || drivers.contains(d);
    let selectors = class.spec.as_ref().and_then(|s| s.selectors.as_ref());
    selectors.into_iter().flatten().filter_map(|s| s.cel.as_ref()).any(|cel| {
        let (Some(d), Some(terms)) = (pinned_driver(&cel.expression), conjuncts(&cel.expression)) else {
            return false;
        };
        let lhs = [format!("device.attributes['{d}'].type"), format!("device.attributes[\"{d}\"].type")];
        gpu_driver(&d) && terms.iter().any(|t| lhs.iter().any(|l| compared_literal(t, l).is_some_and(|v| v == "gpu")))
    })
}

/// Whether a request through `class` counts: a class not named as Tessera's and not proven
/// to reach no GPU (a class that cannot be read counts: an upper bound).
fn counts(class: &str, view: &ClassView) -> bool {
    resource_of_class(class).is_none() && !view.open.contains(class)
}

/// The most devices a request in `mode` with `count` can be allocated.
fn at_most(mode: Option<&str>, count: Option<i64>) -> i64 {
    match mode {
        None | Some("ExactCount") => count.unwrap_or(1).clamp(1, MAX_DEVICES_PER_CLAIM),
        _ => MAX_DEVICES_PER_CLAIM,
    }
}

/// Every request that counts of every claim without an allocation (admin access holds nothing).
/// A `firstAvailable` request counts once, at its largest sub-request that counts, against
/// `nvidia.com/gpu` only when every such sub-request's class is whole-GPU.
pub fn unallocated<'a>(claims: impl IntoIterator<Item = &'a ResourceClaim>, view: &ClassView) -> Vec<Pending> {
    let mut out = Vec::new();
    for c in claims {
        if c.status.as_ref().is_some_and(|s| s.allocation.is_some()) {
            continue;
        }
        let requests = c.spec.as_ref().and_then(|s| s.devices.as_ref()).and_then(|d| d.requests.as_deref());
        // (class, whole GPU, count) per request that counts.
        let mut asks: Vec<(String, bool, i64)> = Vec::new();
        for r in requests.unwrap_or_default() {
            if let Some(e) = r.exactly.as_ref() {
                if e.admin_access != Some(true) && counts(&e.device_class_name, view) {
                    let n = at_most(e.allocation_mode.as_deref(), e.count);
                    asks.push((e.device_class_name.clone(), view.whole_gpu.contains(&e.device_class_name), n));
                }
                continue;
            }
            let subs: Vec<_> =
                r.first_available.iter().flatten().filter(|s| counts(&s.device_class_name, view)).collect();
            if let Some(n) = subs.iter().map(|s| at_most(s.allocation_mode.as_deref(), s.count)).max() {
                let class = subs.iter().map(|s| s.device_class_name.as_str()).collect::<Vec<_>>().join("|");
                let whole = subs.iter().all(|s| view.whole_gpu.contains(&s.device_class_name));
                asks.push((class, whole, n));
            }
        }
        for (class, whole, count) in asks {
            out.push(Pending {
                namespace: c.metadata.namespace.clone().unwrap_or_default(),
                name: c.metadata.name.clone().unwrap_or_default(),
                class,
                resource: whole.then(|| GPU_RESOURCE.to_string()),
                count,
            });
        }
    }
    out
}

/// A claim asking for admin access to devices of a GPU class (any class not proven off GPUs,
/// Tessera's included). Kubernetes admits one only in a namespace labelled
/// `resource.kubernetes.io/admin-access`, and it takes no device (so it counts toward nothing),
/// but a pod using it sees the GPUs other tenants hold: one made before its namespace joined a
/// quota is listed for the pod policy (allocated or not), as [`Pending`] claims are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminAccess {
    pub namespace: String,
    pub name: String,
    /// Its first admin-access request's class.
    pub class: String,
}

/// Every claim with an admin-access request of a GPU class (see [`AdminAccess`]).
pub fn admin_access<'a>(claims: impl IntoIterator<Item = &'a ResourceClaim>, view: &ClassView) -> Vec<AdminAccess> {
    let mut out = Vec::new();
    for c in claims {
        let requests = c.spec.as_ref().and_then(|s| s.devices.as_ref()).and_then(|d| d.requests.as_deref());
        let admin = requests
            .unwrap_or_default()
            .iter()
            .filter_map(|r| r.exactly.as_ref())
            .find(|e| e.admin_access == Some(true) && !view.open.contains(&e.device_class_name));
        if let Some(e) = admin {
            out.push(AdminAccess {
                namespace: c.metadata.namespace.clone().unwrap_or_default(),
                name: c.metadata.name.clone().unwrap_or_default(),
                class: e.device_class_name.clone(),
            });
        }
    }
    out
}

/// `held` plus what `pending` may take: counted like devices held, so [`super::holdings::bound`]
/// takes them off the namespace's limits (and through its usage off the others').
pub fn with_pending(held: &Held, pending: &[Pending]) -> Held {
    let mut out = held.clone();
    for p in pending {
        *out.entry(p.namespace.clone()).or_default().entry(p.resource.clone()).or_default() += p.count;
    }
    out
}

/// The params key listing the unallocated claims of other GPU classes in `ns` (only where there
/// are some: the ConfigMap stays small). Counting them is not enough: a pod naming one
/// (`spec.resourceClaims[].resourceClaimName`) is allocated it with no quota check, so the pod
/// policy `tessera-gpu-pods` refuses such pods.
pub fn claims_key(ns: &str) -> String {
    format!("{ns}.claims")
}

/// The most characters one namespace's [`claims_key`] may hold: about 20 claims of usual names
/// (`<claim>:<class>`, 30 to 50 characters each). Past it the value is [`ALL_CLAIMS`].
pub const CLAIMS_CAP: usize = 1024;

/// The most characters all [`claims_key`] values together may hold: a quarter of the
/// ConfigMap's 1 MiB, leaving the rest for the per-namespace keys (a few hundred characters per
/// tenant namespace: thousands of them). Namespaces past it (in name order) get [`ALL_CLAIMS`].
pub const CLAIMS_BUDGET: usize = 256 * 1024;

/// The [`claims_key`] value past the caps: the pod policy then refuses every pod naming an
/// existing ResourceClaim in that namespace (a claim name never starts with `_`). One
/// namespace's thousands of leftover claims cannot make every params write fail.
pub const ALL_CLAIMS: &str = "_all";

/// The marker after an early claim's class in [`claims_key`] (`<claim>:<class>,early`): a claim
/// of Tessera's classes made no later than `<ns>.since` ([`early`]), refused with its own cause.
/// A class name (a DNS subdomain) holds no `,`, so no class reads as a marker.
pub const EARLY_MARK: &str = ",early";

/// [`claims_key`] per namespace of `tenants` holding pending, admin-access or early claims:
/// space-separated `<claim>:<class>` (names and classes hold no `:` or space); an admin-access
/// claim's class is followed by `,adminAccess`, an early one's by [`EARLY_MARK`], so the policy's
/// refusal names the cause. A claim listed twice is listed once: pending first, then admin
/// access, then early. Pending and admin-access claims must be listed (a pod naming one would
/// be allocated it with no quota check, or see other tenants' GPUs): past [`CLAIMS_CAP`] or
/// [`CLAIMS_BUDGET`] the value is [`ALL_CLAIMS`]. Early claims are refused allocation by the
/// claim policy anyway (their entry only gives the pod a clear refusal at creation), so they take
/// only the room left after every namespace's other claims, and never make a value [`ALL_CLAIMS`]:
/// one past the room is left out, and a pod naming it stays pending with the allocation refusal.
pub fn policy_claims<'a>(
    pending: &[Pending],
    admin: &[AdminAccess],
    early: &[Pending],
    tenants: impl IntoIterator<Item = &'a str>,
) -> BTreeMap<String, String> {
    let mut by_ns: BTreeMap<&str, BTreeMap<&str, String>> = BTreeMap::new();
    pending.iter().for_each(|p| {
        by_ns.entry(p.namespace.as_str()).or_default().entry(p.name.as_str()).or_insert_with(|| p.class.clone());
    });
    admin.iter().for_each(|a| {
        let class = || format!("{},adminAccess", a.class);
        by_ns.entry(a.namespace.as_str()).or_default().entry(a.name.as_str()).or_insert_with(class);
    });
    let mut tenants: Vec<&str> = tenants.into_iter().collect();
    tenants.sort_unstable();
    let mut used = 0;
    let mut out: BTreeMap<&str, String> = BTreeMap::new();
    for &ns in &tenants {
        let Some(claims) = by_ns.get(ns) else { continue };
        let list: Vec<String> = claims.iter().map(|(name, class)| format!("{name}:{class}")).collect();
        let list = list.join(" ");
        if list.len() > CLAIMS_CAP || used + list.len() > CLAIMS_BUDGET {
            out.insert(ns, ALL_CLAIMS.to_string());
            continue;
        }
        used += list.len();
        out.insert(ns, list);
    }
    let mut early_by_ns: BTreeMap<&str, BTreeMap<&str, &str>> = BTreeMap::new();
    early.iter().for_each(|e| {
        early_by_ns.entry(e.namespace.as_str()).or_default().entry(e.name.as_str()).or_insert(e.class.as_str());
    });
    for &ns in &tenants {
        let Some(claims) = early_by_ns.get(ns) else { continue };
        let listed = by_ns.get(ns);
        let value = out.entry(ns).or_default();
        if value == ALL_CLAIMS {
            continue;
        }
        for (name, class) in claims.iter().filter(|(name, _)| !listed.is_some_and(|l| l.contains_key(*name))) {
            let entry = format!("{}{name}:{class}{EARLY_MARK}", if value.is_empty() { "" } else { " " });
            if value.len() + entry.len() <= CLAIMS_CAP && used + entry.len() <= CLAIMS_BUDGET {
                used += entry.len();
                value.push_str(&entry);
            }
        }
    }
    out.into_iter().filter(|(_, v)| !v.is_empty()).map(|(ns, v)| (claims_key(ns), v)).collect()
}

/// A note per pending claim in `namespaces`, for `Ready`.
pub fn notes<'a>(pending: &[Pending], namespaces: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut by_ns: BTreeMap<&str, Vec<&Pending>> = BTreeMap::new();
    pending.iter().for_each(|p| by_ns.entry(p.namespace.as_str()).or_default().push(p));
    let mut out = Vec::new();
    for ns in namespaces {
        for p in by_ns.get(ns).into_iter().flatten() {
            let what = p.resource.as_deref().unwrap_or("every GPU resource of the share");
            out.push(format!(
                "ResourceClaim {ns}/{} (class {}) is not allocated and may take up to {} device(s) of {what} \
                 without a quota check when a pod uses it: counted against the share until it is deleted \
                 (delete it; claim through Tessera's classes)",
                p.name, p.class, p.count
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests;

/// An unallocated claim asking for one of Tessera's classes (not admin access), with its
/// creation time: listed for the pod policy where it predates `<ns>.since` ([`early`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ours {
    pub namespace: String,
    pub name: String,
    /// Its first request's (or sub-request's) class of Tessera's.
    pub class: String,
    /// Every class of Tessera's its requests and sub-requests name (each has its own
    /// `<ns>.since.<class>` where its key came into force later).
    pub classes: BTreeSet<String>,
    pub created: Option<k8s_openapi::jiff::Timestamp>,
}

/// Every unallocated claim with a request of Tessera's classes (see [`Ours`]).
pub fn ours<'a>(claims: impl IntoIterator<Item = &'a ResourceClaim>) -> Vec<Ours> {
    let mut out = Vec::new();
    for c in claims {
        if c.status.as_ref().is_some_and(|s| s.allocation.is_some()) {
            continue;
        }
        let requests = c.spec.as_ref().and_then(|s| s.devices.as_ref()).and_then(|d| d.requests.as_deref());
        let class = requests.unwrap_or_default().iter().find_map(|r| match r.exactly.as_ref() {
            Some(e) => (e.admin_access != Some(true) && resource_of_class(&e.device_class_name).is_some())
                .then(|| e.device_class_name.clone()),
            None => r
                .first_available
                .iter()
                .flatten()
                .map(|s| &s.device_class_name)
                .find(|c| resource_of_class(c).is_some())
                .cloned(),
        });
        let classes = requests
            .unwrap_or_default()
            .iter()
            .flat_map(|r| {
                let exactly = r.exactly.as_ref().map(|e| e.device_class_name.clone());
                exactly.into_iter().chain(r.first_available.iter().flatten().map(|s| s.device_class_name.clone()))
            })
            .filter(|c| resource_of_class(c).is_some())
            .collect();
        if let Some(class) = class {
            out.push(Ours {
                classes,
                namespace: c.metadata.namespace.clone().unwrap_or_default(),
                name: c.metadata.name.clone().unwrap_or_default(),
                class,
                created: c.metadata.creation_timestamp.as_ref().map(|t| t.0),
            });
        }
    }
    out
}

/// Claims of Tessera's classes made no later than their namespace's `<ns>.since`
/// (in the params `policy`): the ResourceQuota never counted them at creation and the claim
/// policy refuses their allocation, so a pod naming one is refused too (listed in `<ns>.claims`
/// by [`policy_claims`], marked [`EARLY_MARK`]: both refusals say to make it again, not to claim
/// through Tessera's classes). Not counted against the share: the ResourceQuota's `status.used`
/// already counts every existing claim of its classes. A claim of unknown creation time is listed.
pub fn early(ours: &[Ours], policy: &BTreeMap<String, String>) -> Vec<Pending> {
    ours.iter()
        .filter(|o| {
            let at = |key: String| policy.get(&key).and_then(|s| s.parse::<k8s_openapi::jiff::Timestamp>().ok());
            let before = |s: k8s_openapi::jiff::Timestamp| o.created.is_none_or(|c| c <= s);
            // Per class: `<ns>.since.<class>` where its key came into force later (`stamp::keys`).
            at(format!("{}.since", o.namespace)).is_some_and(|s| {
                before(s) || o.classes.iter().filter_map(|c| at(format!("{}.since.{c}", o.namespace))).any(before)
            })
        })
        .map(|o| Pending {
            namespace: o.namespace.clone(),
            name: o.name.clone(),
            class: o.class.clone(),
            resource: None,
            count: 0,
        })
        .collect()
}
