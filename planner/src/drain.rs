//! Pure drain filters with kubectl drain's semantics, and the scope Tessera adds: by default only
//! pods that use GPU resources are evicted, so the rest of the node keeps running. Like kubectl,
//! pods whose loss cannot be undone (no controller to recreate them, `emptyDir` data) are refused
//! unless the plan opts in, and a DaemonSet pod is skipped only while its DaemonSet exists. A
//! DaemonSet pod that uses a GPU is neither evicted nor skipped: it holds the hand-over.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use tessera_crds::plan::{DrainScope, RolloutPolicy};

use crate::gpu_use::{self, ClaimIndex};

mod blockers;
pub use blockers::{
    RETURNS_REPORTED, Returns, came_back, eviction_refused, keeps_coming_back, message, records, stuck_terminating,
};
mod throttle;
pub use throttle::{MAX_RETRY_AFTER, NotBefore, retry_after};

/// What to do with one pod on a node being drained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodVerdict {
    /// Evict it through the Eviction API (PodDisruptionBudgets apply).
    Evict,
    /// Already being deleted: wait for it to go (or force it after the timeout, if asked).
    Wait,
    /// Left alone: DaemonSet pod using no GPU, mirror pod, finished, or outside the drain scope.
    Skip(&'static str),
    /// Holds the drain: evicting it would lose something the plan did not opt in to losing.
    Refuse(String),
}

/// Whether a pod requests or is limited to any `nvidia.com/gpu` or `nvidia.com/mig-*` resource:
/// [`gpu_use::uses_extended_gpu`], kept for callers that do not read claims yet. Decisions ask
/// [`gpu_use::uses_gpu`], which also sees ResourceClaims.
pub fn uses_gpu(pod: &Pod) -> bool {
    gpu_use::uses_extended_gpu(pod)
}

/// The `(namespace, name)` of the DaemonSet controlling a pod, if any.
pub fn daemonset_of(pod: &Pod) -> Option<(String, String)> {
    let owner = pod.metadata.owner_references.iter().flatten().find(|o| o.controller == Some(true))?;
    (owner.kind == "DaemonSet").then(|| (pod.metadata.namespace.clone().unwrap_or_default(), owner.name.clone()))
}

/// [`verdict_with_claims`] without the cluster's claims: a bound pod naming any claim counts as
/// using a GPU (see `gpu_use`), so nothing is under-evicted where claims are not read.
pub fn verdict(pod: &Pod, policy: &RolloutPolicy, existing_daemonsets: &BTreeSet<(String, String)>) -> PodVerdict {
    verdict_with_claims(pod, policy, existing_daemonsets, &ClaimIndex::empty())
}

/// `existing_daemonsets` holds the DaemonSets (namespace, name) known to exist; `claims` the
/// ResourceClaims that say which pods use a GPU through DRA ([`gpu_use::uses_gpu`]).
pub fn verdict_with_claims(
    pod: &Pod,
    policy: &RolloutPolicy,
    existing_daemonsets: &BTreeSet<(String, String)>,
    claims: &ClaimIndex,
) -> PodVerdict {
    let meta = &pod.metadata;
    if meta.annotations.as_ref().is_some_and(|a| a.contains_key("kubernetes.io/config.mirror")) {
        return PodVerdict::Skip("mirror pod");
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded") | Some("Failed")) {
        return PodVerdict::Skip("finished");
    }
    let daemonset = daemonset_of(pod);
    let live_daemonset = daemonset.as_ref().filter(|ds| existing_daemonsets.contains(*ds));
    let gpu = gpu_use::uses_gpu(pod, claims);
    if live_daemonset.is_some() && !gpu {
        return PodVerdict::Skip("DaemonSet pod");
    }
    if policy.drain_scope == DrainScope::GpuPods && !gpu {
        return PodVerdict::Skip("uses no GPU");
    }
    if meta.deletion_timestamp.is_some() {
        return PodVerdict::Wait;
    }
    let name =
        format!("{}/{}", meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default());
    if let Some((ns, ds)) = live_daemonset {
        // Not evicted (its DaemonSet tolerates the cordon and recreates it at once) and not
        // deleted at the hand-over either: the replacement would be given a device of the old
        // layout before the agent changes it. No opt-in overrides this.
        return PodVerdict::Refuse(format!(
            "pod {name} of DaemonSet {ns}/{ds} uses a GPU: the node is not handed to its node agent while it \
             runs, as the change could destroy the instance it holds (keep the DaemonSet off this node until the \
             change is done, e.g. with a node affinity, or delete the DaemonSet)"
        ));
    }
    if !policy.evict_unmanaged_pods {
        if let Some((_, ds)) = &daemonset {
            return PodVerdict::Refuse(format!(
                "pod {name} belongs to DaemonSet {ds}, which no longer exists (set spec.rollout.evictUnmanagedPods \
                 to evict it)"
            ));
        }
        if !meta.owner_references.iter().flatten().any(|o| o.controller == Some(true)) {
            return PodVerdict::Refuse(format!(
                "pod {name} has no controller and would be gone for good (set spec.rollout.evictUnmanagedPods to \
                 evict it)"
            ));
        }
    }
    let empty_dir =
        pod.spec.as_ref().and_then(|s| s.volumes.as_ref()).into_iter().flatten().any(|v| v.empty_dir.is_some());
    if empty_dir && !policy.delete_empty_dir_data {
        return PodVerdict::Refuse(format!(
            "pod {name} has emptyDir data that eviction deletes (set spec.rollout.deleteEmptyDirData to evict it)"
        ));
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
        json!({"metadata": {"name": "p", "namespace": "ml", "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}]},
            "spec": {"containers": [{"name": "c",
            "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]}, "status": {"phase": "Running"}})
    }

    fn policy(scope: DrainScope) -> RolloutPolicy {
        RolloutPolicy { drain_scope: scope, ..Default::default() }
    }

    fn existing() -> BTreeSet<(String, String)> {
        [("ml".to_string(), "d".to_string())].into()
    }

    fn ds_gpu() -> serde_json::Value {
        let mut ds = gpu_pod();
        ds["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u", "controller": true}]);
        ds
    }

    #[test]
    fn a_daemonset_pod_using_a_gpu_holds_the_hand_over_naming_itself_in_every_scope() {
        // Evicting it is useless (its DaemonSet recreates it on the cordoned node at once), and
        // handing the node over would let the agent destroy the instance it holds.
        let lenient = RolloutPolicy {
            evict_unmanaged_pods: true,
            delete_empty_dir_data: true,
            force_after_timeout: true,
            ..Default::default()
        };
        for scope in [DrainScope::GpuPods, DrainScope::AllPods] {
            for p in [policy(scope), RolloutPolicy { drain_scope: scope, ..lenient.clone() }] {
                match verdict(&pod(ds_gpu()), &p, &existing()) {
                    PodVerdict::Refuse(why) => assert!(
                        why.starts_with("pod ml/p of DaemonSet ml/d uses a GPU")
                            && why.contains("not handed to its node agent"),
                        "{why}"
                    ),
                    other => panic!("{scope:?}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn pods_whose_loss_cannot_be_undone_are_refused_unless_the_plan_opts_in() {
        let mut bare = gpu_pod();
        bare["metadata"].as_object_mut().unwrap().remove("ownerReferences");
        let mut scratch = gpu_pod();
        scratch["spec"]["volumes"] = json!([{"name": "tmp", "emptyDir": {}}]);
        let mut orphan_ds = gpu_pod();
        orphan_ds["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "gone", "uid": "u", "controller": true}]);
        let strict = policy(DrainScope::GpuPods);
        let refused = |p: &serde_json::Value, want: &str| match verdict(&pod(p.clone()), &strict, &existing()) {
            PodVerdict::Refuse(why) => assert!(why.contains(want), "{why}"),
            other => panic!("{other:?}"),
        };
        refused(&bare, "pod ml/p has no controller");
        refused(&scratch, "emptyDir");
        refused(&orphan_ds, "DaemonSet gone, which no longer exists");
        let lenient = RolloutPolicy { evict_unmanaged_pods: true, delete_empty_dir_data: true, ..strict };
        for p in [bare, scratch, orphan_ds] {
            assert_eq!(verdict(&pod(p), &lenient, &existing()), PodVerdict::Evict);
        }
    }

    #[test]
    fn verdicts_follow_kubectl_drain_and_the_gpu_scope() {
        let mut plain = gpu_pod();
        plain["spec"] = json!({"containers": [{"name": "c"}]});
        let mut ds = plain.clone();
        ds["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u", "controller": true}]);
        let mut ds_gpu_leaving = ds_gpu();
        ds_gpu_leaving["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
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
            (ds_gpu_leaving, DrainScope::GpuPods, PodVerdict::Wait),
            (mirror, DrainScope::AllPods, PodVerdict::Skip("mirror pod")),
            (done, DrainScope::GpuPods, PodVerdict::Skip("finished")),
            (deleting, DrainScope::GpuPods, PodVerdict::Wait),
            (init_gpu, DrainScope::GpuPods, PodVerdict::Evict),
        ];
        for (i, (p, scope, want)) in table.into_iter().enumerate() {
            assert_eq!(verdict(&pod(p), &policy(scope), &existing()), want, "row {i}");
        }
    }

    fn claim(name: &str, driver: &str) -> k8s_openapi::api::resource::v1::ResourceClaim {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ml"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "r", "driver": driver, "pool": "n1", "device": "gpu-0-mig-19-0-1"}]}}}}))
        .unwrap()
    }

    /// `base` with no GPU resource, bound to n1 and naming the claim `name`.
    fn with_claim(mut base: serde_json::Value, name: &str) -> serde_json::Value {
        base["spec"] = json!({"nodeName": "n1", "containers": [{"name": "c"}],
                              "resourceClaims": [{"name": "gpu", "resourceClaimName": name}]});
        base
    }

    #[test]
    fn a_pod_holding_a_gpu_drivers_claim_is_in_the_gpu_scope_and_another_drivers_is_not() {
        let claims = ClaimIndex::new(
            &[claim("mig", "gpu.nvidia.com"), claim("nic", "nic.example.com")],
            &crate::dra::GpuDrivers::default(),
        );
        let gpu_scope = policy(DrainScope::GpuPods);
        let judge = |p: serde_json::Value| verdict_with_claims(&pod(p), &gpu_scope, &existing(), &claims);
        assert_eq!(judge(with_claim(gpu_pod(), "mig")), PodVerdict::Evict);
        assert_eq!(judge(with_claim(gpu_pod(), "nic")), PodVerdict::Skip("uses no GPU"));
        // A DaemonSet pod holding a MIG device through its claim holds the hand-over, as one
        // requesting `nvidia.com/mig-*` does; one holding another driver's device is skipped.
        match judge(with_claim(ds_gpu(), "mig")) {
            PodVerdict::Refuse(why) => assert!(why.starts_with("pod ml/p of DaemonSet ml/d uses a GPU"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(judge(with_claim(ds_gpu(), "nic")), PodVerdict::Skip("DaemonSet pod"));
        // Without the claims (a caller that reads none), the claim is unknown: counted as a GPU.
        assert_eq!(verdict(&pod(with_claim(gpu_pod(), "nic")), &gpu_scope, &existing()), PodVerdict::Evict);
    }
}
