use super::*;
use serde_json::json;

mod reserved;

fn pod(ns: &str, node: Option<&str>, claims: serde_json::Value, status: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": ns},
        "spec": {"nodeName": node, "containers": [{"name": "c"}], "resourceClaims": claims},
        "status": status,
    }))
    .unwrap()
}

fn claim(ns: &str, name: &str, results: serde_json::Value) -> ResourceClaim {
    let status = if results.is_null() { json!({}) } else { json!({"allocation": {"devices": {"results": results}}}) };
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": []}},
        "status": status,
    }))
    .unwrap()
}

fn result(driver: &str, device: &str, admin: bool) -> serde_json::Value {
    json!({"request": "r", "driver": driver, "pool": "node-a", "device": device, "adminAccess": admin})
}

fn index(claims: &[ResourceClaim]) -> ClaimIndex {
    ClaimIndex::new(claims, &GpuDrivers::default())
}

fn named(name: &str) -> serde_json::Value {
    json!([{"name": "gpu", "resourceClaimName": name}])
}

#[test]
fn extended_resources_are_gpu_use_as_before() {
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "a"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]},
    }))
    .unwrap();
    assert!(uses_gpu(&p, &ClaimIndex::empty()));
    let cpu: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "a"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "nvidia.com/gpux": "1"}}}]},
    }))
    .unwrap();
    assert!(!uses_gpu(&cpu, &ClaimIndex::empty()));
}

#[test]
fn a_claim_allocated_a_gpu_drivers_device_is_gpu_use_with_the_exact_device() {
    let claims = [claim("a", "c1", json!([result("gpu.nvidia.com", "gpu-0-mig-19-3-1", false)]))];
    let used = gpu_use(&pod("a", Some("n"), named("c1"), json!(null)), &index(&claims));
    assert!(used.any());
    assert_eq!(
        used.devices,
        [AllocatedDevice {
            claim: "c1".into(),
            driver: "gpu.nvidia.com".into(),
            pool: "node-a".into(),
            device: "gpu-0-mig-19-3-1".into()
        }]
    );
    assert!(!used.extended && used.unknown_claims.is_empty());
}

#[test]
fn other_drivers_admin_access_and_unallocated_claims_are_not_gpu_use() {
    let claims = [
        claim("a", "nic", json!([result("nic.example.com", "eth1", false)])),
        claim("a", "watch", json!([result("gpu.nvidia.com", "gpu-0", true)])),
        claim("a", "pending", json!(null)),
    ];
    for name in ["nic", "watch"] {
        let p = pod("a", Some("n"), named(name), json!(null));
        assert!(!uses_gpu(&p, &index(&claims)), "{name}");
    }
    assert!(!uses_gpu(&pod("a", None, named("pending"), json!(null)), &index(&claims)));
}

#[test]
fn a_bound_pod_whose_claim_the_cache_shows_unallocated_counts_as_gpu_use() {
    // The scheduler allocates before it binds: a bound pod's claim shown unallocated means the
    // cache is behind, and skipping the pod would change a GPU under it.
    let claims = [claim("a", "pending", json!(null))];
    let used = gpu_use(&pod("a", Some("n"), named("pending"), json!(null)), &index(&claims));
    assert_eq!(used.unknown_claims, ["pending"]);
}

#[test]
fn the_driver_list_decides_what_is_a_gpu() {
    let claims = [claim("a", "c1", json!([result("gpu.example.com", "d0", false)]))];
    let p = pod("a", Some("n"), named("c1"), json!(null));
    assert!(!uses_gpu(&p, &index(&claims)));
    let mine = ClaimIndex::new(&claims, &GpuDrivers::new(["gpu.example.com"]));
    assert!(uses_gpu(&p, &mine));
}

#[test]
fn a_claim_in_another_namespace_is_not_the_pods() {
    let claims = [claim("b", "c1", json!([result("gpu.nvidia.com", "gpu-0", false)]))];
    let p = pod("a", None, named("c1"), json!(null));
    assert!(!uses_gpu(&p, &index(&claims)));
}

#[test]
fn a_bound_pod_whose_claim_is_unknown_counts_as_gpu_use_and_an_unbound_one_does_not() {
    let bound = gpu_use(&pod("a", Some("n"), named("gone"), json!(null)), &ClaimIndex::empty());
    assert_eq!(bound.unknown_claims, ["gone"]);
    assert!(bound.any());
    assert!(!uses_gpu(&pod("a", None, named("gone"), json!(null)), &ClaimIndex::empty()));
}

#[test]
fn template_claims_are_found_through_the_pods_status() {
    let claims = [claim("a", "p-gpu-x7", json!([result("gpu.nvidia.com", "gpu-1", false)]))];
    let tmpl = json!([{"name": "gpu", "resourceClaimTemplateName": "t"}]);
    let reported = json!({"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x7"}]});
    let used = gpu_use(&pod("a", Some("n"), tmpl.clone(), reported), &index(&claims));
    assert_eq!(used.devices.len(), 1);
    // Not reported yet, bound: unknown, so still GPU use.
    let early = gpu_use(&pod("a", Some("n"), tmpl.clone(), json!(null)), &index(&claims));
    assert_eq!(early.unknown_claims, ["(gpu: claim not created yet)"]);
    // Reported as not needed: no claim at all.
    let none = json!({"resourceClaimStatuses": [{"name": "gpu"}]});
    assert!(!uses_gpu(&pod("a", Some("n"), tmpl, none), &index(&claims)));
}

#[test]
fn the_schedulers_claim_for_dra_backed_extended_resources_counts() {
    let claims = [claim("a", "p-extended-resources-abc", json!([result("gpu.nvidia.com", "gpu-0", false)]))];
    let status = json!({"extendedResourceClaimStatus": {
        "resourceClaimName": "p-extended-resources-abc",
        "requestMappings": [{"containerName": "c", "resourceName": "example.com/gpu", "requestName": "r"}],
    }});
    let used = gpu_use(&pod("a", Some("n"), json!(null), status), &index(&claims));
    assert_eq!(used.devices.len(), 1);
}

#[test]
fn a_shared_claim_makes_every_pod_naming_it_a_gpu_pod() {
    let claims = [claim("a", "shared", json!([result("gpu.nvidia.com", "gpu-0", false)]))];
    let mut second = pod("a", Some("n"), named("shared"), json!(null));
    second.metadata.name = Some("q".into());
    for p in [pod("a", Some("n"), named("shared"), json!(null)), second] {
        assert!(uses_gpu(&p, &index(&claims)));
    }
}

#[test]
fn nvidia_device_names_parse_and_others_do_not() {
    assert_eq!(parse_nvidia_device("gpu-3"), Some(NvidiaDevice::Gpu { minor: 3 }));
    assert_eq!(
        parse_nvidia_device("gpu-0-mig-9-4-4"),
        Some(NvidiaDevice::Mig { parent_minor: 0, gi_profile_id: 9, start: 4, size: Some(4), profile: None })
    );
    assert_eq!(
        parse_nvidia_device("gpu-7-mig-1g10gb-19-0"),
        Some(NvidiaDevice::Mig {
            parent_minor: 7,
            gi_profile_id: 19,
            start: 0,
            size: None,
            profile: Some("1g10gb".into())
        })
    );
    assert_eq!(
        parse_nvidia_device("gpu-7-mig-1g10gb-me-20-6"),
        Some(NvidiaDevice::Mig {
            parent_minor: 7,
            gi_profile_id: 20,
            start: 6,
            size: None,
            profile: Some("1g10gb-me".into())
        })
    );
    for bad in [
        "gpu-",
        "gpu-x",
        "gpu-0-mig-9-4",
        "gpu-0-mig-9-4-4-1",
        "gpu-0-mig--19-0",
        "gpu-0-mig-1g10gb-x-0",
        "mig-0",
        "gpu-+1",
        "gpu-0-mog-9-4-4",
        "",
    ] {
        assert_eq!(parse_nvidia_device(bad), None, "{bad}");
    }
}
