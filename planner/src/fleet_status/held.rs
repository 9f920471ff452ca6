//! What GPU resources a pod holds through the device plugin, as the kubelet counts them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::GPU_RESOURCE;

/// The extended resources a pod holds from the device plugin: `gpu_resources`, less those the
/// scheduler satisfied from DRA devices (KEP-5004), which its claim names exactly.
pub(super) fn extended_held(pod: &Pod) -> BTreeMap<String, i64> {
    let mut held = gpu_resources(pod);
    let ext = pod.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref());
    for m in ext.iter().flat_map(|e| e.request_mappings.iter()) {
        held.remove(&m.resource_name);
    }
    held
}

/// A pod that has not finished (a terminating one still holds its devices).
pub(super) fn holds_devices(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed"))
}

/// GPU resources a pod holds, as the kubelet counts them: the app containers' and native sidecars'
/// (init containers with `restartPolicy: Always`, which keep running) sum, or a plain init
/// container's plus the sidecars started before it when that is more (plain init devices are
/// reused). Limits, else requests; values that are not whole numbers are ignored (the API server
/// rejects them for extended resources).
pub fn gpu_resources(pod: &Pod) -> BTreeMap<String, i64> {
    let Some(spec) = &pod.spec else { return BTreeMap::new() };
    let of = |c: &k8s_openapi::api::core::v1::Container| -> BTreeMap<String, i64> {
        let r = c.resources.as_ref();
        let mut out = BTreeMap::new();
        for map in [r.and_then(|r| r.requests.as_ref()), r.and_then(|r| r.limits.as_ref())].into_iter().flatten() {
            for (k, v) in map {
                if (k == GPU_RESOURCE || k.starts_with("nvidia.com/mig-"))
                    && let Ok(n) = v.0.trim().parse::<i64>()
                {
                    out.insert(k.clone(), n.max(0));
                }
            }
        }
        out
    };
    let add = |into: &mut BTreeMap<String, i64>, from: BTreeMap<String, i64>| {
        for (k, n) in from {
            let e = into.entry(k).or_default();
            *e = e.saturating_add(n);
        }
    };
    let mut sidecars: BTreeMap<String, i64> = BTreeMap::new();
    let mut init_peak: BTreeMap<String, i64> = BTreeMap::new();
    for c in spec.init_containers.iter().flatten() {
        if c.restart_policy.as_deref() == Some("Always") {
            add(&mut sidecars, of(c));
            continue;
        }
        for (k, n) in of(c) {
            let with_sidecars = n.saturating_add(sidecars.get(&k).copied().unwrap_or(0));
            let e = init_peak.entry(k).or_default();
            *e = (*e).max(with_sidecars);
        }
    }
    let mut total: BTreeMap<String, i64> = BTreeMap::new();
    for c in &spec.containers {
        add(&mut total, of(c));
    }
    add(&mut total, sidecars);
    for (k, n) in init_peak {
        let e = total.entry(k).or_default();
        *e = (*e).max(n);
    }
    total.retain(|_, n| *n > 0);
    total
}
