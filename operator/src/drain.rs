//! Pure drain filters with kubectl drain's semantics, and the scope Tessera adds: by default only
//! pods that use GPU resources are evicted, so the rest of the node keeps running.

use k8s_openapi::api::core::v1::Pod;
use tessera_crds::plan::DrainScope;

/// What to do with one pod on a node being drained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodVerdict {
    /// Evict it through the Eviction API (PodDisruptionBudgets apply).
    Evict,
    /// Already being deleted: wait for it to go.
    Wait,
    /// Left alone: DaemonSet or mirror pod, finished, or outside the drain scope.
    Skip(&'static str),
}

/// Whether a pod requests or is limited to any `nvidia.com/gpu` or `nvidia.com/mig-*` resource.
pub fn uses_gpu(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else { return false };
    spec.containers.iter().chain(spec.init_containers.iter().flatten()).any(|c| {
        let r = c.resources.as_ref();
        let names = r
            .and_then(|r| r.requests.as_ref())
            .into_iter()
            .flatten()
            .chain(r.and_then(|r| r.limits.as_ref()).into_iter().flatten())
            .map(|(k, _)| k.as_str());
        names.into_iter().any(|k| k == "nvidia.com/gpu" || k.starts_with("nvidia.com/mig-"))
    })
}

pub fn verdict(pod: &Pod, scope: DrainScope) -> PodVerdict {
    let meta = &pod.metadata;
    if meta.annotations.as_ref().is_some_and(|a| a.contains_key("kubernetes.io/config.mirror")) {
        return PodVerdict::Skip("mirror pod");
    }
    if meta.owner_references.iter().flatten().any(|o| o.kind == "DaemonSet" && o.controller == Some(true)) {
        return PodVerdict::Skip("DaemonSet pod");
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded") | Some("Failed")) {
        return PodVerdict::Skip("finished");
    }
    if scope == DrainScope::GpuPods && !uses_gpu(pod) {
        return PodVerdict::Skip("uses no GPU");
    }
    if meta.deletion_timestamp.is_some() {
        return PodVerdict::Wait;
    }
    PodVerdict::Evict
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn gpu_pod() -> serde_json::Value {
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c",
            "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]}, "status": {"phase": "Running"}})
    }

    #[test]
    fn verdicts_follow_kubectl_drain_and_the_gpu_scope() {
        let plain =
            json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Running"}});
        let mut ds = gpu_pod();
        ds["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u", "controller": true}]);
        let mut mirror = gpu_pod();
        mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "x"});
        let mut done = gpu_pod();
        done["status"]["phase"] = json!("Succeeded");
        let mut deleting = gpu_pod();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        let mut init_gpu = plain.clone();
        init_gpu["spec"]["initContainers"] = json!([{"name": "i", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]);
        let table = [
            (gpu_pod(), DrainScope::GpuPods, PodVerdict::Evict),
            (plain.clone(), DrainScope::GpuPods, PodVerdict::Skip("uses no GPU")),
            (plain, DrainScope::AllPods, PodVerdict::Evict),
            (ds, DrainScope::AllPods, PodVerdict::Skip("DaemonSet pod")),
            (mirror, DrainScope::AllPods, PodVerdict::Skip("mirror pod")),
            (done, DrainScope::GpuPods, PodVerdict::Skip("finished")),
            (deleting, DrainScope::GpuPods, PodVerdict::Wait),
            (init_gpu, DrainScope::GpuPods, PodVerdict::Evict),
        ];
        for (i, (p, scope, want)) in table.into_iter().enumerate() {
            assert_eq!(verdict(&pod(p), scope), want, "row {i}");
        }
    }
}
