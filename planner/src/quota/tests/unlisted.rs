//! `unlisted: Zero` and the `nvidia.com/` resources nodes advertise beyond Tessera's supply.

use k8s_openapi::api::core::v1::Node;
use serde_json::json;

use super::super::*;

fn node(allocatable: serde_json::Value) -> Node {
    serde_json::from_value(json!({"metadata": {"name": "n"}, "status": {"allocatable": allocatable}})).unwrap()
}

fn quota(spec: serde_json::Value) -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": "team-b", "generation": 1, "uid": "uid-team-b"}, "spec": spec}))
    .unwrap()
}

/// NVIDIA's device plugin renames time-sliced or MPS GPUs (`nvidia.com/gpu.shared`), a name in
/// no list, so under `unlisted: Zero` every GPU resource ([`is_gpu_resource`]) a node advertises
/// is held at 0 (and stays unlimited under `Unlimited`, as any resource `hard` does not list).
/// Only GPU resources: NVIDIA Network Operator's `nvidia.com/hostdev` and RDMA pools, which
/// `hard` cannot name, held at 0 would refuse RDMA pods forever.
#[test]
fn unlisted_zero_holds_every_nvidia_resource_nodes_advertise_at_zero() {
    let nodes = [
        node(json!({"cpu": "8", "nvidia.com/gpu.shared": "16", "example.com/fpga": "1"})),
        node(json!({"nvidia.com/gpu-mps": "4", "nvidia.com/mig-1g.10gb.shared": "7"})),
        node(json!({"nvidia.com/hostdev": "4", "nvidia.com/rdma_shared_device_a": "63", "nvidia.com/gpus": "1"})),
    ];
    let capacity = Capacity { advertised: advertised(&nodes), ..Default::default() };
    let spec = json!({"namespaces": ["b"], "hard": {"nvidia.com/gpu": 2}});
    let nss: BTreeSet<String> = ["b".to_string()].into();
    let now = Time("2026-06-01T00:00:00Z".parse().unwrap());
    let mut strict = spec.clone();
    strict["unlisted"] = json!("Zero");
    let p = plan_quotas_with(&[quota(strict)], &nss, &[], &capacity, now.clone());
    let hard = &p.apply[0].hard;
    for r in ["requests.nvidia.com/gpu.shared", "requests.nvidia.com/gpu-mps", "requests.nvidia.com/mig-1g.10gb.shared"]
    {
        assert_eq!(hard.get(r).map(String::as_str), Some("0"), "{r} in {hard:?}");
    }
    for r in ["requests.nvidia.com/hostdev", "requests.nvidia.com/rdma_shared_device_a", "requests.nvidia.com/gpus"] {
        assert!(!hard.contains_key(r), "{r} is no GPU resource: {hard:?}");
    }
    assert!(!hard.keys().any(|k| k.contains("example.com") || k.contains("cpu")), "only nvidia.com/: {hard:?}");
    assert!(p.device_classes.is_empty() && hard["requests.nvidia.com/gpu"] == "2", "{hard:?}");

    let plain = plan_quotas_with(&[quota(spec)], &nss, &[], &capacity, now);
    assert!(!plain.apply[0].hard.contains_key("requests.nvidia.com/gpu.shared"), "{:?}", plain.apply[0].hard);
}
