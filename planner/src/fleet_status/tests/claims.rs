//! Holders of devices allocated through ResourceClaims.

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde_json::{Value, json};

use super::super::*;

const H100: &str = "NVIDIA H100 80GB HBM3";

fn gpunode(name: &str, gpus: Vec<Value>) -> GpuNode {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": name}, "spec": {}, "status": {"gpus": gpus}}))
    .unwrap()
}

/// gpu0: three 1g.10gb (A B C, the middle one with its MIG UUID reported) and a 3g.40gb (D);
/// gpu1: MIG off.
fn node() -> GpuNode {
    let inst = |p: &str, start: i32, size: i32, uuid: Option<&str>| json!({"profile": p, "start": start, "size": size, "uuid": uuid, "gpuInstanceId": 0, "computeInstanceId": 0});
    gpunode(
        "n",
        vec![
            json!({"index": 0, "uuid": "GPU-0", "product": H100, "migCapable": true, "migEnabled": true,
               "instances": [inst("1g.10gb", 0, 1, None), inst("1g.10gb", 1, 1, Some("MIG-b")),
                             inst("1g.10gb", 2, 1, None), inst("3g.40gb", 4, 4, None)]}),
            json!({"index": 1, "uuid": "GPU-1", "product": H100, "migCapable": true}),
        ],
    )
}

fn pod(name: &str, claim: Option<&str>, limits: Value) -> Pod {
    let claims = claim.map(|c| json!([{"name": "gpu", "resourceClaimName": c}]));
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ml"},
        "spec": {"nodeName": "n", "containers": [{"name": "c", "resources": {"limits": limits}}],
                 "resourceClaims": claims},
        "status": {"phase": "Running"}}))
    .unwrap()
}

fn claim(name: &str, driver: &str, device: &str) -> ResourceClaim {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ml"}, "spec": {},
        "status": {"allocation": {"devices": {"results": [
            {"request": "r", "driver": driver, "pool": "n", "device": device}]}}}}))
    .unwrap()
}

fn slice(generation: i64, devices: Value) -> ResourceSlice {
    serde_json::from_value(json!({"metadata": {"name": format!("s{generation}")},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "n",
                 "pool": {"name": "n", "generation": generation, "resourceSliceCount": 1}, "devices": devices}}))
    .unwrap()
}

fn attrs(name: &str, a: &[(&str, &str)]) -> Value {
    let map: serde_json::Map<String, Value> = a.iter().map(|(k, v)| (k.to_string(), json!({"string": v}))).collect();
    json!({"name": name, "attributes": map})
}

fn quota() -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": "team-a"}, "spec": {"namespaces": ["ml"], "hard": {}}}))
    .unwrap()
}

fn inputs() -> Inputs {
    Inputs {
        gpunodes: vec![node()],
        quotas: vec![quota()],
        pods: vec![
            // Holds B by its name's placement (start 1, size 1), no slice needed.
            pod("dra", Some("c-mig"), json!({})),
            // Holds gpu1: the name says minor 7, the slice's uuid says GPU-1, and the slice wins.
            pod("whole", Some("c-whole"), json!({})),
            // An extended-resource pod: guessed among the 1g instances the claims left (A, C).
            pod("ext", None, json!({"nvidia.com/mig-1g.10gb": "1"})),
        ],
        claims: vec![claim("c-mig", "gpu.nvidia.com", "gpu-0-mig-19-1-1"), claim("c-whole", "gpu.nvidia.com", "gpu-7")],
        slices: vec![slice(1, json!([attrs("gpu-7", &[("uuid", "GPU-1"), ("type", "gpu")])]))],
        ..Default::default()
    }
}

#[test]
fn a_device_held_through_a_claim_shows_its_exact_holder_and_extended_ones_stay_guesses() {
    let s = inputs().report();
    assert!(s.holders_known);
    let g = &s.nodes[0].gpus;
    let b = &g[0].instances[1];
    assert_eq!(b.holder.as_ref().map(|h| (h.pod.as_str(), h.claim.as_deref())), Some(("ml/dra", Some("c-mig"))));
    assert!(b.exact, "{b:?}");
    let a = &g[0].instances[0];
    assert_eq!(a.holder.as_ref().map(|h| (h.pod.as_str(), h.claim.as_deref())), Some(("ml/ext", None)));
    assert!(!a.exact, "A or C: a guess, as before: {a:?}");
    assert_eq!(g[1].holder.as_ref().and_then(|h| h.claim.as_deref()), Some("c-whole"));
    assert!(g[1].exact);
    assert!(s.nodes[0].unplaced.is_empty(), "{:?}", s.nodes[0].unplaced);
    let held: BTreeMap<String, i64> =
        [("nvidia.com/gpu".to_string(), 1), ("nvidia.com/mig-1g.10gb".to_string(), 2)].into();
    assert_eq!(s.tenants, [("team-a".to_string(), held)].into());

    let plain = text(&s, false);
    assert!(plain.contains("[ABC.DDDD]  A 1g.10gb  B 1g.10gb  C 1g.10gb  D 3g.40gb  (2/4 busy)"), "{plain}");
    assert!(plain.contains("A~ team-a  ml/ext\n"), "{plain}");
    assert!(plain.contains("B  team-a  ml/dra (claim c-mig)\n"), "{plain}");
    assert!(plain.contains("whole GPU   busy  team-a  ml/whole (claim c-whole)"), "{plain}");

    let v = serde_json::to_value(&s).unwrap();
    let inst = &v["nodes"][0]["gpus"][0]["instances"];
    assert_eq!(inst[1]["holder"], json!({"pod": "ml/dra", "tenant": "team-a", "claim": "c-mig"}));
    assert_eq!(inst[1]["exact"], true);
    assert_eq!(inst[0]["holder"], json!({"pod": "ml/ext", "tenant": "team-a"}), "no claim key for extended");
    assert_eq!(inst[0]["exact"], false);
    assert_eq!(v["nodes"][0]["gpus"][1]["holder"]["claim"], "c-whole");
}

#[test]
fn unreadable_claims_make_holders_unknown() {
    let mut i = inputs();
    i.claims.clear();
    i.unreadable = vec![Unreadable { resource: "resourceclaims.resource.k8s.io".into(), error: "forbidden".into() }];
    let s = i.report();
    assert!(!s.holders_known);
    let plain = text(&s, false);
    assert!(plain.contains("(busy: unknown, resource claims unreadable)"), "{plain}");
    assert!(!plain.contains("free"), "{plain}");
    assert_eq!(serde_json::to_value(&s).unwrap()["holdersKnown"], false);
    // Slices only lend attributes: without them the names still place devices.
    let mut i = inputs();
    i.slices.clear();
    i.unreadable = vec![Unreadable { resource: "resourceslices.resource.k8s.io".into(), error: "forbidden".into() }];
    let s = i.report();
    assert!(s.holders_known);
    assert!(s.nodes[0].gpus[0].instances[1].exact);
}

#[test]
fn claim_devices_the_node_does_not_report_or_claims_not_read_are_unplaced() {
    let mut i = inputs();
    i.claims = vec![claim("c-mig", "gpu.nvidia.com", "gpu-0-mig-19-5-1")]; // no instance starts at 5
    let s = i.report();
    let unplaced: Vec<(&str, &str)> =
        s.nodes[0].unplaced.iter().map(|u| (u.holder.pod.as_str(), u.resource.as_str())).collect();
    assert_eq!(unplaced, [("ml/dra", "gpu.nvidia.com/gpu-0-mig-19-5-1"), ("ml/whole", claims::UNKNOWN_DEVICE)]);
    let plain = text(&s, false);
    assert!(
        plain.contains("unplaced: team-a  ml/dra (claim c-mig) holds 1 gpu.nvidia.com/gpu-0-mig-19-5-1 the node"),
        "{plain}"
    );
    assert!(plain.contains("ml/whole (claim c-whole) holds a device of a claim that was not read"), "{plain}");
    assert!(s.nodes[0].gpus[0].instances[1].holder.is_none());
}

#[test]
fn devices_are_located_by_slice_attributes_before_names() {
    let gpus = node().status.unwrap().gpus;
    let dev = |driver: &str, device: &str| crate::gpu_use::AllocatedDevice {
        claim: "c".into(),
        driver: driver.into(),
        pool: "n".into(),
        device: device.into(),
    };
    let none = SliceIndex::default();
    let table: Vec<(&str, AllocatedDevice, SliceIndex, Option<Device>)> = vec![
        ("name: whole GPU by minor", dev("gpu.nvidia.com", "gpu-1"), none.clone(), Some((1, None))),
        ("name: MIG by placement", dev("gpu.nvidia.com", "gpu-0-mig-9-4-4"), none.clone(), Some((0, Some(3)))),
        ("name: MIG device on a GPU with MIG off", dev("gpu.nvidia.com", "gpu-1-mig-19-0-1"), none.clone(), None),
        ("name: whole GPU with MIG on", dev("gpu.nvidia.com", "gpu-0"), none.clone(), None),
        ("another driver's names mean nothing", dev("gpu.example.com", "gpu-1"), none.clone(), None),
        (
            "slice: the MIG UUID",
            dev("gpu.nvidia.com", "odd"),
            SliceIndex::new(&[slice(1, json!([attrs("odd", &[("uuid", "MIG-b")])]))]),
            Some((0, Some(1))),
        ),
        (
            "slice: parentUUID and the name's placement, qualified attribute names",
            dev("gpu.nvidia.com", "gpu-5-mig-19-2-1"),
            SliceIndex::new(&[slice(
                1,
                json!([attrs(
                    "gpu-5-mig-19-2-1",
                    &[("gpu.nvidia.com/uuid", "MIG-x"), ("gpu.nvidia.com/parentUUID", "GPU-0"), ("profile", "1g.10gb")]
                )]),
            )]),
            Some((0, Some(2))),
        ),
        (
            "slice: a profile that disagrees is no match",
            dev("gpu.nvidia.com", "gpu-0-mig-19-2-1"),
            SliceIndex::new(&[slice(
                1,
                json!([attrs("gpu-0-mig-19-2-1", &[("parentUUID", "GPU-0"), ("profile", "2g.20gb")])]),
            )]),
            None,
        ),
        (
            "slice: a UUID the node lacks is not guessed from the name",
            dev("gpu.nvidia.com", "gpu-1"),
            SliceIndex::new(&[slice(1, json!([attrs("gpu-1", &[("uuid", "GPU-elsewhere")])]))]),
            None,
        ),
        (
            "slice: the newest pool generation wins",
            dev("gpu.nvidia.com", "gpu-9"),
            SliceIndex::new(&[
                slice(2, json!([attrs("gpu-9", &[("uuid", "GPU-1")])])),
                slice(1, json!([attrs("gpu-9", &[("uuid", "GPU-0")])])),
            ]),
            Some((1, None)),
        ),
    ];
    for (what, d, slices, want) in table {
        assert_eq!(locate(&d, &gpus, &slices), want, "{what}");
    }
}
