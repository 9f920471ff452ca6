//! What kube's quota evaluators charge a pod or a claim, by ResourceQuota key, for the GPU keys
//! only: Tessera's own count of usage, for objects no ResourceQuota counted when they were made.
//! The formulas are the evaluators' (`pkg/quota/v1/evaluator/core/{pods,resource_claims}.go`),
//! so the count is never below what a ResourceQuota would show once it has recounted.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::api::resource::v1::{DeviceSubRequest, ExactDeviceRequest, ResourceClaim};

use crate::quota::claims::devices_key;
use crate::quota::is_gpu_resource;
use crate::quota::quantity::count;
use crate::quota::unallocated::MAX_DEVICES_PER_CLAIM;

/// Amounts by ResourceQuota key (`requests.nvidia.com/gpu`, `<class>.deviceclass.resource.k8s.io/devices`).
pub type Charges = BTreeMap<String, i64>;

/// The key a pod's GPU extended resource is charged under (extended resources are charged as
/// requests only).
pub fn pod_key(resource: &str) -> String {
    format!("requests.{resource}")
}

/// Whether a pod is still charged: not `Succeeded` or `Failed`. A pod being deleted stays
/// charged (the evaluator stops at deletion plus grace period, a time Tessera does not judge:
/// counting it longer only refuses more).
pub fn pod_is_charged(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed"))
}

/// A container's amount of each GPU resource: its request, else its limit (the API server
/// defaults requests of extended resources from limits; an object not yet defaulted says the same).
fn container_gpus(c: &Container) -> BTreeMap<&str, i64> {
    let Some(r) = c.resources.as_ref() else { return BTreeMap::new() };
    let mut out = BTreeMap::new();
    for map in [r.limits.as_ref(), r.requests.as_ref()].into_iter().flatten() {
        for (name, q) in map {
            if is_gpu_resource(name) {
                // A value that is not a whole count (refused by the API server for extended
                // resources) is charged as one: never less than the evaluator would.
                out.insert(name.as_str(), count(&q.0).unwrap_or(1).max(0));
            }
        }
    }
    out
}

/// What a pod is charged for GPUs (KEP-753): per resource, the larger of the app containers plus
/// the sidecars (init containers with `restartPolicy: Always`), and the largest plain init
/// container plus the sidecars started before it. Terminal pods: nothing.
pub fn pod_charges(pod: &Pod) -> Charges {
    let mut out = Charges::new();
    let Some(spec) = pod.spec.as_ref().filter(|_| pod_is_charged(pod)) else { return out };
    let mut running: BTreeMap<&str, i64> = BTreeMap::new();
    for c in &spec.containers {
        for (r, n) in container_gpus(c) {
            *running.entry(r).or_default() += n;
        }
    }
    let mut sidecars: BTreeMap<&str, i64> = BTreeMap::new();
    let mut init_peak: BTreeMap<&str, i64> = BTreeMap::new();
    for c in spec.init_containers.iter().flatten() {
        let gpus = container_gpus(c);
        if c.restart_policy.as_deref() == Some("Always") {
            for (r, n) in gpus {
                *sidecars.entry(r).or_default() += n;
                *running.entry(r).or_default() += n;
            }
            // A sidecar's start is an init step too: it runs beside the ones before it.
            for (r, n) in &sidecars {
                let peak = init_peak.entry(r).or_default();
                *peak = (*peak).max(*n);
            }
            continue;
        }
        let resources: std::collections::BTreeSet<&str> = gpus.keys().chain(sidecars.keys()).copied().collect();
        for r in resources {
            let step = gpus.get(r).copied().unwrap_or(0) + sidecars.get(r).copied().unwrap_or(0);
            let peak = init_peak.entry(r).or_default();
            *peak = (*peak).max(step);
        }
    }
    for (r, n) in running.iter().chain(init_peak.iter()) {
        let total = out.entry(pod_key(r)).or_default();
        *total = (*total).max(*n);
    }
    out.retain(|_, n| *n > 0);
    out
}

/// The most devices one request of `mode` with `count` can be given, as the claim evaluator
/// charges it: `ExactCount` its count (1 unset), `All` the most an allocation may hold, an
/// unknown mode nothing (the evaluator's rule; the API server refuses unknown modes).
fn devices(mode: Option<&str>, count: Option<i64>) -> i64 {
    match mode {
        None | Some("ExactCount") => count.unwrap_or(1).max(0),
        Some("All") => MAX_DEVICES_PER_CLAIM,
        Some(_) => 0,
    }
}

fn exactly(e: &ExactDeviceRequest) -> (String, i64) {
    (e.device_class_name.clone(), devices(e.allocation_mode.as_deref(), e.count))
}

fn sub(s: &DeviceSubRequest) -> (String, i64) {
    (s.device_class_name.clone(), devices(s.allocation_mode.as_deref(), s.count))
}

/// What a claim is charged, per class's devices key: each `exactly` request its devices, each
/// `firstAvailable` request its largest alternative per class (every class it names is charged:
/// any may be the one allocated). Admin access is charged too (the evaluator has no exemption).
/// Charged whatever its allocation, until the claim is deleted. `gpu_class` picks the classes
/// that count (those reaching GPUs).
pub fn claim_charges(claim: &ResourceClaim, gpu_class: impl Fn(&str) -> bool) -> Charges {
    let mut out = Charges::new();
    let requests = claim.spec.as_ref().and_then(|s| s.devices.as_ref()).and_then(|d| d.requests.as_deref());
    for r in requests.unwrap_or_default() {
        let mut per_class: BTreeMap<String, i64> = BTreeMap::new();
        let asks = r.exactly.iter().map(exactly).chain(r.first_available.iter().flatten().map(sub));
        for (class, n) in asks {
            let most = per_class.entry(class).or_default();
            *most = (*most).max(n);
        }
        for (class, n) in per_class.into_iter().filter(|(c, n)| *n > 0 && gpu_class(c)) {
            *out.entry(devices_key(&class)).or_default() += n;
        }
    }
    out
}

#[cfg(test)]
mod tests;
