//! A pod that holds a GPU through a ResourceClaim is drained like one requesting
//! `nvidia.com/*`: evicted through the Eviction API (so a PodDisruptionBudget can refuse it)
//! before its node is handed over (`gpu_use`); a claim reserved for a pod not bound yet holds the
//! hand-over until the pod shows on the node.

use super::*;
use crate::gpu_use::ClaimIndex;

/// A ReplicaSet's pod on n1 with no GPU resource, holding the claim `claim`.
fn claim_pod(name: &str, claim: &str) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ml", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}]},
        "spec": {"nodeName": "n1", "containers": [{"name": "c"}],
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]},
        "status": {"phase": "Running"}}))
    .unwrap()
}

/// `mig`: a MIG device of NVIDIA's DRA driver; `nic`: another driver's device.
fn claims() -> std::sync::Arc<ClaimIndex> {
    let claim = |name: &str, driver: &str| -> k8s_openapi::api::resource::v1::ResourceClaim {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ml"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "r", "driver": driver, "pool": "n1", "device": "gpu-0-mig-9-0-4"}]}}}}))
        .unwrap()
    };
    let all = [claim("mig", "gpu.nvidia.com"), claim("nic", "nic.example.com")];
    std::sync::Arc::new(ClaimIndex::new(&all, &crate::dra::GpuDrivers::default()))
}

fn evicted(actions: &[Action]) -> Vec<&str> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Evict { pod, .. } => Some(pod.as_str()),
            _ => None,
        })
        .collect()
}

fn handed_over(actions: &[Action]) -> bool {
    actions.iter().any(|a| matches!(a, Action::Intent { .. }))
}

#[test]
fn a_pod_holding_a_gpu_claim_is_evicted_before_its_node_is_handed_over() {
    let p = plan("p", 0, json!(1), h100_layout());
    let mut n = node("n1", true, gpunode("n1", json!([]), true, Some(draining("2026-06-01T00:00:00Z"))));
    n.pods = Ok(vec![claim_pod("trainer", "mig"), claim_pod("web", "nic")]);
    n.claims = claims();
    let (actions, _) = plan_fleet(std::slice::from_ref(&p), std::slice::from_ref(&n), now());
    assert_eq!(evicted(&actions), ["trainer"], "the default scope GpuPods: only the GPU claim's pod goes");
    assert!(!handed_over(&actions), "{actions:?}");
    // Once it is gone, the pod holding another driver's device does not hold the node.
    n.pods = Ok(vec![claim_pod("web", "nic")]);
    let (actions, _) = plan_fleet(&[p], &[n], now());
    assert!(handed_over(&actions), "{actions:?}");
}

#[test]
fn a_pdb_refusing_a_claim_pods_eviction_holds_the_drain_like_any_pod() {
    // The record as the controller writes it after the Eviction API refused (see `drain`).
    let status: kube_core::Status = serde_json::from_value(json!({"status": "Failure", "code": 429,
        "message": "Cannot evict pod as it would violate the pod's disruption budget.", "reason": "TooManyRequests",
        "details": {"causes": [{"reason": "DisruptionBudget",
                                "message": "The disruption budget train needs 1 healthy pods and has 1 currently"}]}}))
    .unwrap();
    let mut r = draining("2026-05-31T00:00:00Z");
    r["message"] = json!(crate::drain::message(&[], &[crate::drain::eviction_refused("ml", "trainer", &status)]));
    let mut n = node("n1", true, gpunode("n1", json!([]), true, Some(r)));
    n.pods = Ok(vec![claim_pod("trainer", "mig")]);
    n.claims = claims();
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[n], now());
    // Asked again through the Eviction API (never deleted: no forceAfterTimeout), the node kept.
    assert_eq!(evicted(&actions), ["trainer"]);
    assert!(!actions.iter().any(|a| matches!(a, Action::ForceDelete { .. })), "{actions:?}");
    assert!(!handed_over(&actions), "{actions:?}");
    let timeouts = &reports["p"].drain_timeouts;
    assert!(timeouts.iter().any(|t| t.contains("PodDisruptionBudget ml/train")), "{timeouts:?}");
}

#[test]
fn a_gpu_daemonset_pod_holding_a_claim_holds_the_hand_over() {
    let mut ds = claim_pod("exporter", "mig");
    ds.metadata.owner_references = Some(vec![
        serde_json::from_value(
            json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u", "controller": true}),
        )
        .unwrap(),
    ]);
    let mut n = node("n1", true, gpunode("n1", json!([]), true, Some(draining("2026-06-01T00:00:00Z"))));
    n.pods = Ok(vec![ds]);
    n.daemonsets = [("ml".to_string(), "d".to_string())].into();
    n.claims = claims();
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[n], now());
    assert!(evicted(&actions).is_empty() && !handed_over(&actions), "{actions:?}");
    let blocked = &reports["p"].drain_blocked;
    assert!(blocked.iter().any(|b| b.contains("pod ml/exporter of DaemonSet ml/d uses a GPU")), "{blocked:?}");
}

/// The claim `mig` on n1, reserved (PreBind) for the pod `starting`, which is not bound yet.
fn reserved_for_a_pod_being_bound() -> std::sync::Arc<ClaimIndex> {
    let c: k8s_openapi::api::resource::v1::ResourceClaim =
        serde_json::from_value(json!({"metadata": {"name": "mig", "namespace": "ml"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "r", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0-mig-9-0-4"}]}},
                "reservedFor": [{"resource": "pods", "name": "starting", "uid": "uid-s"}]}}))
        .unwrap();
    std::sync::Arc::new(ClaimIndex::new(&[c], &crate::dra::GpuDrivers::default()))
}

#[test]
fn a_claim_reserved_for_a_pod_in_its_binding_cycle_holds_the_hand_over_until_the_pod_shows() {
    let p = plan("p", 0, json!(1), h100_layout());
    // Drained of its bound pods; the scheduler reserved the claim for `starting` and has not
    // written its Bind: handed over now, `starting` would start on a device the change destroys.
    let mut n = node("n1", true, gpunode("n1", json!([]), true, Some(draining("2026-06-01T00:00:00Z"))));
    n.pods = Ok(vec![claim_pod("web", "nic")]);
    n.claims = reserved_for_a_pod_being_bound();
    let (actions, reports) = plan_fleet(std::slice::from_ref(&p), std::slice::from_ref(&n), now());
    assert!(!handed_over(&actions), "{actions:?}");
    let reason = "claim ml/mig holds a GPU of n1 reserved for pod ml/starting, which is not bound";
    let blocked = &reports["p"].drain_blocked;
    assert!(blocked.iter().any(|b| b.starts_with(&format!("n1: {reason}"))), "{blocked:?}");
    let recorded = actions.iter().any(|a| {
        matches!(a, Action::Blockers { reasons, .. }
        if reasons.iter().any(|r| r.starts_with(reason)))
    });
    assert!(recorded, "named on the node: {actions:?}");
    // Bound now: drained like any claim pod (evicted), then handed over once gone.
    let mut starting = claim_pod("starting", "mig");
    starting.metadata.uid = Some("uid-s".into());
    n.pods = Ok(vec![starting]);
    let (actions, _) = plan_fleet(std::slice::from_ref(&p), std::slice::from_ref(&n), now());
    assert_eq!(evicted(&actions), ["starting"]);
    n.pods = Ok(vec![]);
    n.claims = claims();
    let (actions, _) = plan_fleet(std::slice::from_ref(&p), std::slice::from_ref(&n), now());
    assert!(handed_over(&actions), "{actions:?}");
}

#[test]
fn a_binding_claim_past_the_drain_timeout_stalls_the_plan_and_is_let_go_only_when_forced() {
    // Drain started 2 minutes before `now`; the plan's timeout is 60 s.
    let mut n = node("n1", true, gpunode("n1", json!([]), true, Some(draining("2026-05-31T23:58:00Z"))));
    n.pods = Ok(vec![]);
    n.claims = reserved_for_a_pod_being_bound();
    let strict = plan("p", 0, json!(1), h100_layout());
    let (actions, reports) = plan_fleet(std::slice::from_ref(&strict), std::slice::from_ref(&n), now());
    assert!(!handed_over(&actions), "{actions:?}");
    let timeouts = &reports["p"].drain_timeouts;
    assert!(timeouts.iter().any(|t| t.contains("reserved for pod ml/starting")), "{timeouts:?}");
    let mut forced = strict;
    forced.spec.rollout.force_after_timeout = true;
    let (actions, _) = plan_fleet(&[forced], &[n], now());
    assert!(handed_over(&actions), "the pod has not run: forcing loses no work: {actions:?}");
}
