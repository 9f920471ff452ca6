use serde_json::{Value, json};
use tessera_crds::gpunode::GpuNodeStatus;

use super::*;

const GPU0: &str = "GPU-aaaa";
const GPU1: &str = "GPU-bbbb";

fn mig(name: &str, uuid: Option<&str>, parent: &str, profile: &str) -> Value {
    let mut attrs =
        json!({"type": {"string": "mig"}, "parentUUID": {"string": parent}, "profile": {"string": profile}});
    if let Some(u) = uuid {
        attrs["uuid"] = json!({"string": u});
    }
    json!({"name": name, "attributes": attrs})
}

fn whole(name: &str, uuid: &str) -> Value {
    json!({"name": name, "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid}}})
}

fn slice(name: &str, node: &str, driver: &str, pool: (&str, i64, i64), devices: Vec<Value>) -> ResourceSlice {
    serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": pool.0, "generation": pool.1, "resourceSliceCount": pool.2},
                 "devices": devices}}))
    .unwrap()
}

/// One node's agent report: GPU0 with MIG on and the given instances (uuid, profile, start,
/// size), GPU1 with MIG off.
fn report(instances: &[(&str, &str, i32, i32)]) -> GpuNodeStatus {
    let inst: Vec<Value> =
        instances.iter().map(|(u, p, s, n)| json!({"profile": p, "start": s, "size": n, "uuid": u})).collect();
    serde_json::from_value(json!({"gpus": [
        {"index": 0, "uuid": GPU0, "product": "NVIDIA A100-SXM4-40GB", "migCapable": true, "migEnabled": true,
         "instances": inst},
        {"index": 1, "uuid": GPU1, "product": "NVIDIA A100-SXM4-40GB", "migCapable": true, "migEnabled": false}]}))
    .unwrap()
}

const NV: &str = "gpu.nvidia.com";

fn one<'a>(slices: &'a [ResourceSlice]) -> NodeSlices<'a> {
    by_node(slices, &GpuDrivers::default()).remove("n1").unwrap_or_default()
}

#[test]
fn only_gpu_drivers_newest_generation_counts_and_completeness_needs_every_slice() {
    let slices = [
        slice("old", "n1", NV, ("n1", 1, 1), vec![mig("gpu-0-mig-19-0-1", Some("MIG-old"), GPU0, "1g.5gb")]),
        slice("new-a", "n1", NV, ("n1", 2, 2), vec![mig("gpu-0-mig-19-1-1", Some("MIG-1"), GPU0, "1g.5gb")]),
        slice("nic", "n1", "nic.example.com", ("n1", 1, 1), vec![whole("gpu-9", "GPU-nic")]),
    ];
    let node = one(&slices);
    assert_eq!(node.pools.len(), 1, "another driver's slice is not read");
    assert_eq!(node.pools[0].generation, 2);
    assert!(!node.pools[0].complete(), "1 of 2 slices of generation 2");
    assert!(node.devices().is_empty(), "an incomplete pool supplies nothing");
    let mut more = slices.to_vec();
    more.push(slice("new-b", "n1", NV, ("n1", 2, 2), vec![whole("gpu-1", GPU1)]));
    let node = one(&more);
    assert!(node.all_complete());
    let names: Vec<String> = node.devices().iter().map(|d| d.name().to_string()).collect();
    assert_eq!(names, ["gpu-0-mig-19-1-1", "gpu-1"], "generation 1's device is gone");
}

#[test]
fn supply_counts_each_device_once_and_slices_alone_on_a_node_without_an_agent() {
    // Two drivers (the DRA driver twice over, say) publish the same MIG device: once.
    let drivers = GpuDrivers::new([NV, "gpu2.example.com"]);
    let slices = [
        slice("a", "n1", NV, ("p", 1, 1), vec![mig("gpu-0-mig-19-0-1", Some("MIG-1"), GPU0, "1g.5gb")]),
        slice("b", "n1", "gpu2.example.com", ("p", 1, 1), vec![mig("x", Some("MIG-1"), GPU0, "1g.5gb")]),
        slice("c", "n1", NV, ("q", 1, 1), vec![mig("gpu-0-mig-19-1-1", None, GPU0, "1g.5gb"), whole("gpu-1", GPU1)]),
    ];
    let node = by_node(&slices, &drivers).remove("n1").unwrap();
    let want: BTreeMap<String, i64> =
        [("nvidia.com/mig-1g.5gb".to_string(), 2), ("nvidia.com/gpu".to_string(), 1)].into();
    assert_eq!(extra_supply(None, &node), want, "no agent report: the slices' devices, each once");
    // The agent reports both GPUs: it counts them; the slices add nothing (device plugin + DRA).
    let status = report(&[("MIG-1", "1g.5gb", 0, 1), ("MIG-2", "1g.5gb", 1, 1)]);
    assert_eq!(extra_supply(Some(&status), &node), BTreeMap::new());
    // A GPU the agent does not report is the slices' to count.
    let other = [slice("d", "n1", NV, ("p", 1, 1), vec![mig("gpu-2-mig-9-0-4", Some("MIG-9"), "GPU-cccc", "3g.20gb")])];
    assert_eq!(extra_supply(Some(&status), &one(&other)), [("nvidia.com/mig-3g.20gb".to_string(), 1)].into());
}

#[test]
fn a_stale_driver_is_reported_only_when_its_pools_are_complete() {
    // The layout changed to two 1g instances at 0 and 2; the driver still lists the old 2g at 0.
    let status = report(&[("MIG-1", "1g.5gb", 0, 1), ("MIG-3", "1g.5gb", 2, 1)]);
    let devices = vec![
        mig("gpu-0-mig-14-0-2", Some("MIG-old"), GPU0, "2g.10gb"),
        mig("gpu-0-mig-19-2-1", None, GPU0, "1g.5gb"), // matched by GPU and placement
        whole("gpu-1", GPU1),
    ];
    let slices = [slice("a", "n1", NV, ("n1", 3, 1), devices.clone())];
    let d = compare(&status, &one(&slices));
    assert_eq!(d.stale, ["gpu-0-mig-14-0-2"]);
    assert_eq!(d.missing, ["gpu 0 1g.5gb at 0"]);
    assert!(d.message().contains("gpu-0-mig-14-0-2") && d.message().contains("gpu 0 1g.5gb at 0"));
    // Half a pool (1 of 2 slices) is being published: no verdict yet.
    let half = [slice("a", "n1", NV, ("n1", 3, 2), devices)];
    assert!(compare(&status, &one(&half)).is_empty());
    // In sync: nothing to say.
    let synced = [slice(
        "a",
        "n1",
        NV,
        ("n1", 4, 1),
        vec![
            mig("gpu-0-mig-19-0-1", Some("MIG-1"), GPU0, "1g.5gb"),
            mig("gpu-0-mig-19-2-1", Some("MIG-3"), GPU0, "1g.5gb"),
            whole("gpu-1", GPU1),
        ],
    )];
    assert!(compare(&status, &one(&synced)).is_empty());
}

#[test]
fn a_whole_gpu_listed_after_mig_was_enabled_is_stale_and_one_not_listed_is_missing() {
    let status = report(&[("MIG-1", "1g.5gb", 0, 1)]);
    let slices =
        [slice("a", "n1", NV, ("n1", 1, 1), vec![whole("gpu-0", GPU0), mig("m", Some("MIG-1"), GPU0, "1g.5gb")])];
    let d = compare(&status, &one(&slices));
    assert_eq!(d.stale, ["gpu-0"]);
    assert_eq!(d.missing, ["gpu 1 (whole)"]);
}

#[test]
fn dynamic_mig_is_found_by_shared_counters_or_consuming_devices() {
    let mut counters = slice("counters", "n1", NV, ("n1", 1, 2), vec![]);
    counters.spec.shared_counters = Some(vec![
        serde_json::from_value(json!({"name": "gpu-0-counters", "counters": {"memorySlice0": {"value": "1"}}}))
            .unwrap(),
    ]);
    let mut consumer = mig("gpu-0-mig-19-0-1", None, GPU0, "1g.5gb");
    consumer["consumesCounters"] =
        json!([{"counterSet": "gpu-0-counters", "counters": {"memorySlice0": {"value": "1"}}}]);
    let devices = slice("devices", "n1", NV, ("n1", 1, 2), vec![consumer]);
    let reason = dynamic_mig(&one(std::slice::from_ref(&counters))).expect("shared counters");
    assert!(reason.contains("counters (gpu.nvidia.com)") && reason.contains("DynamicMIG"), "{reason}");
    assert!(dynamic_mig(&one(std::slice::from_ref(&devices))).unwrap().contains("devices (gpu.nvidia.com)"));
    let both = [counters, devices];
    assert!(dynamic_mig(&one(&both)).unwrap().contains("counters (gpu.nvidia.com), devices (gpu.nvidia.com)"));
    // Static MIG devices, and another driver's counters, are no DynamicMIG.
    let static_ = [slice("s", "n1", NV, ("n1", 1, 1), vec![mig("gpu-0-mig-19-0-1", None, GPU0, "1g.5gb")])];
    assert_eq!(dynamic_mig(&one(&static_)), None);
    let mut foreign = slice("f", "n1", "nic.example.com", ("n1", 1, 1), vec![]);
    foreign.spec.shared_counters = both[0].spec.shared_counters.clone();
    assert_eq!(dynamic_mig(&one(std::slice::from_ref(&foreign))), None);
}

#[test]
fn unreadable_devices_are_skipped_not_fatal() {
    let slices = [slice(
        "a",
        "n1",
        NV,
        ("n1", 1, 1),
        vec![
            json!({"name": "no-attrs"}),
            json!({"name": "gpu-0-mig-x", "attributes": {"type": {"string": "mig"}}}), // no profile
            json!({"name": "channel-0", "attributes": {"type": {"string": "channel"}}}),
        ],
    )];
    assert!(one(&slices).devices().is_empty());
    assert_eq!(placement("gpu-0-mig-19-a-1"), None);
    assert_eq!(placement("gpu-3-mig-14-4-2"), Some((4, 2)));
    let zero = [slice("z", "n1", NV, ("n1", 1, 0), vec![whole("gpu-1", GPU1)])];
    assert!(!one(&zero).all_complete(), "resourceSliceCount 0 is no complete pool");
}

#[test]
fn stand_in_gpunodes_carry_the_slices_supply_to_the_quota_and_solver_counts_once() {
    let agent_devices = vec![
        mig("gpu-0-mig-19-0-1", Some("MIG-1"), GPU0, "1g.5gb"),
        mig("gpu-0-mig-19-1-1", Some("MIG-2"), GPU0, "1g.5gb"),
        whole("gpu-1", GPU1),
    ];
    let no_agent = vec![mig("gpu-0-mig-19-0-1", Some("MIG-7"), "GPU-dddd", "1g.5gb"), whole("gpu-1", "GPU-eeee")];
    let slices = [
        slice("a", "with-agent", NV, ("with-agent", 1, 1), agent_devices),
        slice("b", "dra-only", NV, ("dra-only", 1, 1), no_agent),
    ];
    let nodes = by_node(&slices, &GpuDrivers::default());
    let mut reported: tessera_crds::GpuNode = tessera_crds::GpuNode::new("with-agent", Default::default());
    reported.status = Some(report(&[("MIG-1", "1g.5gb", 0, 1), ("MIG-2", "1g.5gb", 1, 1)]));
    let reported = std::sync::Arc::new(reported);
    let stand_ins = supply_nodes(&nodes, |n| (n == "with-agent").then(|| reported.clone()));
    assert_eq!(stand_ins.iter().map(|g| g.metadata.name.clone().unwrap()).collect::<Vec<_>>(), ["dra-slices:dra-only"]);
    let mig1g = "nvidia.com/mig-1g.5gb".to_string();
    let gpu = "nvidia.com/gpu".to_string();
    // The quota controller's count: the agent's 2 + 1 whole, and the DRA-only node's 1 + 1.
    let capacity = crate::quota::Capacity::of(std::iter::once(&*reported).chain(&stand_ins));
    assert_eq!(capacity.supply, [(mig1g.clone(), 3), (gpu.clone(), 2)].into());
    // The solver counts the stand-ins as GPUs it cannot carve: the same figures.
    assert_eq!(crate::automatic_layouts::unseen_supply(&stand_ins), [(mig1g, 1), (gpu, 1)].into());
}

#[test]
fn the_node_condition_follows_refusal_disagreement_and_completeness() {
    let status = report(&[("MIG-1", "1g.5gb", 0, 1)]);
    let synced =
        [slice("a", "n1", NV, ("n1", 1, 1), vec![mig("m", Some("MIG-1"), GPU0, "1g.5gb"), whole("gpu-1", GPU1)])];
    let stale =
        [slice("a", "n1", NV, ("n1", 2, 1), vec![mig("m", Some("MIG-0"), GPU0, "1g.5gb"), whole("gpu-1", GPU1)])];
    let half = [slice("a", "n1", NV, ("n1", 2, 2), vec![])];
    let ok = node_condition(Some(&status), Some(&one(&synced)));
    assert!(matches!(&ok, NodeCondition::Set(true, "InSync", _)), "{ok:?}");
    let bad = node_condition(Some(&status), Some(&one(&stale)));
    assert!(matches!(&bad, NodeCondition::Set(false, "SlicesStale", m) if m.contains("no longer hold: m")), "{bad:?}");
    assert_eq!(node_condition(Some(&status), Some(&one(&half))), NodeCondition::Keep);
    assert_eq!(node_condition(Some(&status), None), NodeCondition::Absent);
    assert_eq!(node_condition(None, Some(&one(&synced))), NodeCondition::Absent, "no report, nothing to compare");
    let mut dynamic = synced[0].clone();
    dynamic.spec.devices.as_mut().unwrap()[0].consumes_counters =
        Some(vec![serde_json::from_value(json!({"counterSet": "c", "counters": {}})).unwrap()]);
    let refused = node_condition(None, Some(&one(std::slice::from_ref(&dynamic))));
    assert!(matches!(refused, NodeCondition::Set(false, "DynamicMig", _)), "refused even without a report");
    // Writes only what changes.
    let cond = |status: &str, reason: &str, message: &str| k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        type_: DRA_IN_SYNC.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-06-01T00:00:00Z".parse().unwrap(),
        ),
        observed_generation: None,
    };
    let NodeCondition::Set(_, _, msg) = &ok else { unreachable!() };
    assert!(!must_write(Some(&cond("True", "InSync", msg)), &ok));
    assert!(must_write(Some(&cond("True", "InSync", msg)), &bad));
    assert!(must_write(Some(&cond("True", "InSync", msg)), &NodeCondition::Absent));
    assert!(!must_write(Some(&cond("False", "SlicesStale", "x")), &NodeCondition::Keep));
    assert!(!must_write(None, &NodeCondition::Absent));
    assert!(must_write(None, &ok));
}
