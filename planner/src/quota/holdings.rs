//! What a tenant's namespaces already hold, and limits that keep the whole tenant within `hard`
//! when that is not where its shares say: a share moved between namespaces (a namespace added to
//! an `Even` split, `namespaceHard` edited, `hard` lowered) while one holds more than its new
//! share, or a namespace that joined holding devices through GPU classes that are not Tessera's
//! (claimed before it was a tenant's, allocated over their `0` key since).
//!
//! Per resource the rule is: the sum over the tenant's namespaces of max(used, limit) is at most
//! max(hard, sum of used), so no admission can take the tenant past `hard` (a ResourceQuota
//! admits only up to its limit; what a namespace already holds above it stays, and an admitted
//! claim is reused by later pods without a new check). [`spread`] decides the limits from each
//! namespace's share and usage; [`bound`] applies them to the planned ResourceQuotas.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceQuota, ResourceQuotaStatus};
use k8s_openapi::api::resource::v1::{DeviceRequest, ResourceClaim, ResourceSlice};
use tessera_crds::catalog;
use tessera_crds::quota::AllocationPath;
use tessera_crds::validate::GPU_RESOURCE;

use super::claims::{class_of_resource, devices_key, resource_of_class};
use crate::dra::GpuDrivers;
use crate::dra_slices::{SliceDevice, read_device};

/// Devices each namespace holds through allocated claims of GPU-reaching classes that are not
/// Tessera's (e.g. `mig.nvidia.com`), by the resource the device is; `None` for a device whose
/// profile the ResourceSlices do not tell. Keyed by namespace.
pub type Held = BTreeMap<String, BTreeMap<Option<String>, i64>>;

/// One namespace's part of one resource: its share, and what it holds on every path (`None`
/// when its ResourceQuota's status does not show it yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    pub share: i64,
    pub used: Option<i64>,
}

/// Why a namespace's limit is below its share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// At its share.
    None,
    /// The other namespaces hold this much above their own shares.
    Overshoot(i64),
    /// Another namespace's usage is unknown: no new admission here until it is known.
    HeldAtUsage,
    /// Its own usage is unknown (while another's is known): held at 0 until it is.
    Unknown,
}

/// Each part's limit (what all paths together may hold there), in order, and why.
///
/// - Every usage known: what the namespaces hold above their shares (the overshoot) is taken
///   from the headroom (share less usage) of the others, the last listed first (a namespace
///   just added waits for the older ones to free what they hold above their new share); past
///   all headroom every namespace is held at its usage.
/// - Some known, some not (a namespace just added, a ResourceQuota made again): the unknown
///   ones get 0 and the known ones their usage (never above their share): nothing new is
///   admitted anywhere until every status shows what it holds (one pass, as a rule), since an
///   unknown namespace may hold anything. Missing usage is never taken for 0.
/// - None known (the quota's first pass, before any of its ResourceQuotas has a status): the
///   shares. No limit of the quota was ever enforced, so no headroom moves; what a namespace
///   held before the quota existed is counted from the next pass on.
pub fn spread(parts: &[Part]) -> Vec<(i64, Cut)> {
    if parts.iter().all(|p| p.used.is_none()) {
        return parts.iter().map(|p| (p.share, Cut::None)).collect();
    }
    if parts.iter().any(|p| p.used.is_none()) {
        return parts
            .iter()
            .map(|p| match p.used {
                Some(u) if u >= p.share => (p.share, Cut::None),
                Some(u) => (u.max(0), Cut::HeldAtUsage),
                None => (0, Cut::Unknown),
            })
            .collect();
    }
    let used = |p: &Part| p.used.unwrap_or(0);
    let over: i64 = parts.iter().map(|p| (used(p) - p.share).max(0)).sum();
    let mut left = over;
    let mut out: Vec<(i64, Cut)> = parts.iter().map(|p| (p.share, Cut::None)).collect();
    for (i, p) in parts.iter().enumerate().rev() {
        let cut = (p.share - used(p)).max(0).min(left);
        if cut > 0 {
            out[i] = (p.share - cut, Cut::Overshoot(over));
            left -= cut;
        }
    }
    out
}

/// One namespace of a quota as the pass plans it, before its ResourceQuota is applied.
#[derive(Debug, Clone)]
pub struct Planned<'a> {
    pub ns: String,
    pub share: BTreeMap<String, i64>,
    /// Its ResourceQuota's status as cached (`None`: not written yet, or not synced).
    pub status: Option<&'a ResourceQuotaStatus>,
    /// Its ResourceQuota's `spec.hard` as cached (`None`: not written yet).
    pub written: Option<&'a super::phases::Hard>,
    /// The ResourceQuota's `spec.hard` as planned so far.
    pub hard: BTreeMap<String, String>,
    /// Usage by resource, for the quota's status.
    pub used: BTreeMap<String, i64>,
}

/// A namespace of the quota where this pass applies nothing (both ResourceQuota names taken by
/// objects not the quota's): its ResourceQuotas from before stay in force as they are, so what
/// they let it hold counts against the other namespaces' limits ([`kept_reach`]).
#[derive(Debug, Clone)]
pub struct Kept<'a> {
    pub ns: String,
    pub share: BTreeMap<String, i64>,
    /// The quota's own ResourceQuotas there; none: the quota limits nothing there (its status
    /// says so) and what it holds is unknown ([`kept_reach`] of none), so the others are held at
    /// their usage (fail closed: it may hold anything, counting it as 0 gave them full shares).
    pub rqs: Vec<&'a ResourceQuota>,
}

/// What `rqs` let a namespace hold through `keys` together: per key its usage or the limit in
/// force, whichever is more, under the strictest ResourceQuota (admission checks each). `None`
/// (unknown: the others are held at their usage) where no ResourceQuota limits a key or shows
/// its usage: a limit that cannot be lowered here is never taken for 0.
pub fn kept_reach(rqs: &[&ResourceQuota], keys: &[String]) -> Option<i64> {
    let mut total = 0;
    for key in keys {
        let limit = rqs
            .iter()
            .filter_map(|rq| {
                let spec = rq.spec.as_ref().and_then(|s| s.hard.as_ref());
                super::phases::in_force(spec, rq.status.as_ref().and_then(|s| s.hard.as_ref()), key)
            })
            .min()?;
        let used = rqs.iter().filter_map(|rq| shown(rq.status.as_ref(), key)).max()?;
        total += used.max(limit);
    }
    Some(total)
}

/// What `status` shows the namespace holds through `key`: only once `status.hard` carries the
/// key (the quota controller counts only what it limits) and `status.used` counts it.
fn shown(status: Option<&ResourceQuotaStatus>, key: &str) -> Option<i64> {
    let s = status?;
    s.hard.as_ref()?.get(key)?;
    super::quantity::count(&s.used.as_ref()?.get(key)?.0)
}

/// The limit in force for `key` ([`super::phases::in_force`]).
fn shown_hard(p: &Planned<'_>, key: &str) -> Option<i64> {
    super::phases::in_force(p.written, p.status?.hard.as_ref(), key)
}

/// Lowers the planned limits so the tenant stays within `hard` ([`spread`]), and counts what
/// each namespace holds through other GPU classes (`held`) in its usage and against its share:
/// the key this quota's path limits gets the namespace's limit less what the other paths and
/// classes hold there. A device of unknown profile counts against every resource of the share
/// (an upper bound: it may be any of them). Limits only ever go down here. Returns a note per
/// namespace and resource whose limit is below its share, for `Ready`. `kept` ([`Kept`]) count
/// with what their old limits let them hold; nothing is planned for them.
pub fn bound(mode: AllocationPath, planned: &mut [Planned<'_>], kept: &[Kept<'_>], held: &Held) -> Vec<String> {
    let mut notes = Vec::new();
    for p in planned.iter_mut() {
        for (res, n) in held.get(&p.ns).into_iter().flatten() {
            if let Some(res) = res {
                *p.used.entry(res.clone()).or_default() += n;
            }
        }
    }
    let resources: Vec<String> = planned.first().map(|p| p.share.keys().cloned().collect()).unwrap_or_default();
    for res in resources {
        let class = class_of_resource(&res);
        let active = match (&class, mode) {
            (Some(c), AllocationPath::ResourceClaims) => devices_key(c),
            _ => format!("requests.{res}"),
        };
        let keys: Vec<String> =
            std::iter::once(format!("requests.{res}")).chain(class.as_deref().map(devices_key)).collect();
        // Per namespace: (what the other paths hold, shown; what other classes hold; its part).
        let mut rows = Vec::new();
        for p in planned.iter() {
            let share = p.share.get(&res).copied().unwrap_or(0);
            let here = held.get(&p.ns);
            let elsewhere = here.and_then(|h| h.get(&Some(res.clone()))).copied().unwrap_or(0)
                + here.and_then(|h| h.get(&None)).copied().unwrap_or(0);
            // The other path counts once `status.hard` holds it at no more than planned (as the
            // switched path reads it): until then it may still grow.
            let mut inactive = Some(0);
            for k in keys.iter().filter(|k| **k != active) {
                let Some(planned) = p.hard.get(k).and_then(|v| super::quantity::count(v)) else { continue };
                let settled = shown_hard(p, k).is_some_and(|h| h <= planned);
                inactive = inactive.zip(shown(p.status, k).filter(|_| settled)).map(|(a, b)| a + b);
            }
            let own = if p.hard.contains_key(&active) { shown(p.status, &active) } else { Some(0) };
            let used = own.zip(inactive).map(|(a, b)| a + b + elsewhere);
            rows.push((inactive.unwrap_or(0), elsewhere, Part { share, used }));
        }
        // Namespaces left as they were enter last, holding what their old limits let them reach
        // (their own computed limit is not applied: only the others' are).
        let kept_parts = kept.iter().map(|k| {
            let here = held.get(&k.ns);
            let elsewhere = here.and_then(|h| h.get(&Some(res.clone()))).copied().unwrap_or(0)
                + here.and_then(|h| h.get(&None)).copied().unwrap_or(0);
            let share = k.share.get(&res).copied().unwrap_or(0);
            Part { share, used: kept_reach(&k.rqs, &keys).map(|r| r + elsewhere) }
        });
        let parts: Vec<Part> = rows.iter().map(|r| r.2).chain(kept_parts).collect();
        for ((p, (inactive, elsewhere, part)), (limit, why)) in planned.iter_mut().zip(rows).zip(spread(&parts)) {
            let Some(current) = p.hard.get(&active).and_then(|v| super::quantity::count(v)) else { continue };
            let target = (limit - inactive - elsewhere).max(0);
            if target < current {
                p.hard.insert(active.clone(), target.to_string());
            }
            let (ns, share) = (&p.ns, part.share);
            match why {
                _ if limit >= share => {}
                Cut::None => {}
                Cut::Overshoot(o) => notes.push(format!(
                    "namespace {ns}: {res}: share {share} cut to {limit} while the tenant's other namespaces hold {o} \
                     above their shares"
                )),
                Cut::HeldAtUsage => notes.push(format!(
                    "namespace {ns}: {res}: share {share} held at its usage {limit} until every namespace's \
                     ResourceQuota status shows what it holds"
                )),
                Cut::Unknown => notes.push(format!(
                    "namespace {ns}: {res}: share {share} held at 0 until its ResourceQuota's status shows what it holds"
                )),
            }
            if elsewhere > 0 {
                notes.push(format!(
                    "namespace {ns}: {res}: {elsewhere} device(s) allocated (or claimed, not yet allocated) through GPU \
                     classes other than Tessera's count against the share"
                ));
            }
        }
    }
    notes
}

/// The class a claim's allocation result `request` (`<request>` or `<request>/<subrequest>`)
/// was asked through, from the claim's spec.
fn class_of_request<'c>(requests: &'c [DeviceRequest], request: &str) -> Option<&'c str> {
    let (name, sub) = match request.split_once('/') {
        Some((n, s)) => (n, Some(s)),
        None => (request, None),
    };
    let r = requests.iter().find(|r| r.name == name)?;
    match sub {
        None => r.exactly.as_ref().map(|e| e.device_class_name.as_str()),
        Some(s) => r.first_available.iter().flatten().find(|f| f.name == s).map(|f| f.device_class_name.as_str()),
    }
}

/// [`Held`] from the cluster's claims and the GPU drivers' ResourceSlices: each device of a GPU
/// driver (NVIDIA's counts whatever `drivers` says) allocated to a claim, other than through a
/// class named as Tessera's (those the ResourceQuota counts itself) and other than admin access
/// (observes, holds nothing). A result whose class cannot be read counts (an upper bound). A
/// device counts as the resource its slice says (`type: gpu` -> `nvidia.com/gpu`, `type: mig`
/// -> its profile's), or `None` when no slice lists it.
pub fn held_elsewhere<'a>(
    claims: impl IntoIterator<Item = &'a ResourceClaim>,
    slices: impl IntoIterator<Item = &'a ResourceSlice>,
    drivers: &GpuDrivers,
) -> Held {
    let mut devices: BTreeMap<(&str, &str, &str), String> = BTreeMap::new();
    for s in slices {
        let spec = &s.spec;
        for d in spec.devices.iter().flatten() {
            let res = match read_device(d, &spec.driver) {
                Some(SliceDevice::Gpu { .. }) => GPU_RESOURCE.to_string(),
                Some(SliceDevice::Mig { profile, .. }) => catalog::mig_resource_name(&profile),
                None => continue,
            };
            devices.insert((spec.driver.as_str(), spec.pool.name.as_str(), d.name.as_str()), res);
        }
    }
    let gpu_driver = |d: &str| d == crate::dra::NVIDIA_GPU_DRIVER || drivers.contains(d);
    let mut out = Held::new();
    for c in claims {
        let requests = c.spec.as_ref().and_then(|s| s.devices.as_ref()).and_then(|d| d.requests.as_deref());
        let results = c
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_deref())
            .unwrap_or_default();
        for r in results.iter().filter(|r| gpu_driver(&r.driver) && r.admin_access != Some(true)) {
            let class = requests.and_then(|rs| class_of_request(rs, &r.request));
            if class.is_some_and(|c| resource_of_class(c).is_some()) {
                continue;
            }
            let res = devices.get(&(r.driver.as_str(), r.pool.as_str(), r.device.as_str())).cloned();
            let ns = c.metadata.namespace.clone().unwrap_or_default();
            *out.entry(ns).or_default().entry(res).or_default() += 1;
        }
    }
    out
}

#[cfg(test)]
pub(in crate::quota) mod tests;
