//! `status.reservedFor`: which pod a claim is the claim of, and claims whose pod is still being
//! bound to a node (the drain's binding-cycle gap).

use super::super::*;
use serde_json::json;

fn pod(name: &str, uid: &str, node: Option<&str>, claim: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "a", "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "c"}],
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]},
    }))
    .unwrap()
}

/// A claim of `ns` allocated a MIG device of node-a's pool (`driver`), reserved for `reserved`
/// (name, UID), its allocation pinned to `selector_node` when given.
fn claim(ns: &str, name: &str, driver: &str, reserved: &[(&str, &str)], selector_node: Option<&str>) -> ResourceClaim {
    let reserved: Vec<_> =
        reserved.iter().map(|(n, u)| json!({"resource": "pods", "apiGroup": "", "name": n, "uid": u})).collect();
    let mut allocation = json!({"devices": {"results": [
        {"request": "r", "driver": driver, "pool": "node-a", "device": "gpu-0-mig-19-3-1"}]}});
    if let Some(n) = selector_node {
        allocation["nodeSelector"] = json!({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]}]});
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": allocation, "reservedFor": reserved},
    }))
    .unwrap()
}

fn index(claims: &[ResourceClaim]) -> ClaimIndex {
    ClaimIndex::new(claims, &GpuDrivers::default())
}

#[test]
fn a_claim_reserved_for_another_pod_is_not_taken_for_the_pods() {
    // The cache still shows the claim `c` as it was before it was deleted and created again
    // under the same name: reserved for the old pod (uid-old), with the old device.
    let stale = index(&[claim("a", "c", "gpu.nvidia.com", &[("p", "uid-old")], None)]);
    let bound = gpu_use(&pod("p", "uid-new", Some("node-a"), "c"), &stale);
    assert!(bound.devices.is_empty(), "the old claim's device is not the pod's: {bound:?}");
    assert_eq!(bound.unknown_claims, ["c"], "bound: GPU use of an unknown device, never skipped");
    assert!(bound.any());
    // Not bound yet: no device of its own (the reservation comes as it is scheduled).
    let pending = gpu_use(&pod("p", "uid-new", None, "c"), &stale);
    assert!(!pending.any(), "{pending:?}");
}

#[test]
fn a_claim_reserved_for_the_pod_or_for_nobody_yet_is_the_pods() {
    let table = [
        ("reserved for it", vec![("p", "uid-1")]),
        ("shared, it among others", vec![("q", "uid-2"), ("p", "uid-1")]),
        ("allocated, not reserved yet", vec![]),
    ];
    for (case, reserved) in table {
        let claims = index(&[claim("a", "c", "gpu.nvidia.com", &reserved, None)]);
        for node in [Some("node-a"), None] {
            let used = gpu_use(&pod("p", "uid-1", node, "c"), &claims);
            assert_eq!(used.devices.len(), 1, "{case}, {node:?}: {used:?}");
            assert!(used.unknown_claims.is_empty(), "{case}");
        }
    }
}

#[test]
fn a_gpu_claim_on_the_node_reserved_for_a_pod_not_bound_there_holds_the_node() {
    let bound_p = pod("p", "uid-1", Some("node-a"), "c");
    let cases: [(&str, Vec<ResourceClaim>, Vec<Pod>, usize); 6] = [
        // The scheduler reserved `c` for p (PreBind) and has not bound p yet.
        ("binding, pool", vec![claim("a", "c", "gpu.nvidia.com", &[("p", "uid-1")], None)], vec![], 1),
        (
            "binding, node selector",
            vec![claim("a", "c", "gpu.nvidia.com", &[("p", "uid-1")], Some("node-a"))],
            vec![],
            1,
        ),
        (
            "bound: the drain sees it",
            vec![claim("a", "c", "gpu.nvidia.com", &[("p", "uid-1")], None)],
            vec![bound_p],
            0,
        ),
        (
            "a pod of that name, another UID",
            vec![claim("a", "c", "gpu.nvidia.com", &[("p", "uid-1")], None)],
            vec![pod("p", "uid-9", Some("node-a"), "c")],
            1,
        ),
        ("not reserved", vec![claim("a", "c", "gpu.nvidia.com", &[], None)], vec![], 0),
        ("another driver", vec![claim("a", "c", "nic.example.com", &[("p", "uid-1")], None)], vec![], 0),
    ];
    for (case, claims, bound, want) in cases {
        let why = index(&claims).binding_on("node-a", &bound);
        assert_eq!(why.len(), want, "{case}: {why:?}");
        for w in &why {
            assert!(w.starts_with("claim a/c holds a GPU of node-a reserved for pod a/p, which is not bound"), "{w}");
        }
        assert!(index(&claims).binding_on("node-z", &[]).is_empty(), "{case}: another node");
    }
    // The allocation's node selector names the node too (a pool not named after its node).
    let pinned = index(&[claim("a", "c", "gpu.nvidia.com", &[("p", "uid-1")], Some("node-b"))]);
    assert_eq!(pinned.binding_on("node-b", &[]).len(), 1);
}
