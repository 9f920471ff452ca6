use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceSlice;
use tessera_crds::catalog;
use tessera_crds::gpunode::{GpuNodeStatus, GpuProfileInfo, GpuState, MigInstance};

use super::devices::canonical_quantity;
use super::slice::{DEVICES_DIGEST, Observed, ObservedNode, digest};
use super::*;

const H100: &str = "NVIDIA H100 80GB HBM3";

/// The profile table an agent reports for an H100 (the catalog's, which matches the hardware).
fn table() -> Vec<GpuProfileInfo> {
    catalog::lookup(H100)
        .unwrap()
        .profiles
        .iter()
        .map(|p| GpuProfileInfo {
            name: p.name.into(),
            id: p.id,
            compute_slices: p.compute_slices,
            memory_slices: p.memory_slices,
            max_count: p.max_count,
            starts: p.starts.to_vec(),
        })
        .collect()
}

fn inst(profile: &str, start: i32, size: i32, uuid: Option<&str>) -> MigInstance {
    MigInstance { profile: profile.into(), start, size, uuid: uuid.map(Into::into), ..Default::default() }
}

fn gpu(index: i32, mig: bool, instances: Vec<MigInstance>) -> GpuState {
    GpuState {
        index,
        uuid: format!("GPU-{index}"),
        product: H100.into(),
        memory_mib: 81920,
        mig_capable: true,
        mig_enabled: mig,
        instances,
        profiles: table(),
        ..Default::default()
    }
}

fn report(gpus: Vec<GpuState>) -> GpuNodeStatus {
    GpuNodeStatus { gpus, ..Default::default() }
}

fn attr(d: &k8s_openapi::api::resource::v1::Device, name: &str) -> Option<String> {
    let a = d.attributes.as_ref()?.get(name)?;
    a.string.clone().or_else(|| a.version.clone())
}

fn cap(d: &k8s_openapi::api::resource::v1::Device, name: &str) -> Option<String> {
    Some(d.capacity.as_ref()?.get(name)?.value.0.clone())
}

#[test]
fn a_mig_gpu_publishes_its_instances_with_nvidias_names_attributes_and_capacities() {
    let r =
        report(vec![gpu(1, true, vec![inst("1g.10gb", 6, 1, Some("MIG-a")), inst("3g.40gb", 0, 4, Some("MIG-b"))])]);
    let out = node_devices(&r);
    assert_eq!(out.skipped, vec![]);
    let names: Vec<&str> = out.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["gpu-1-mig-1g10gb-19-6", "gpu-1-mig-3g40gb-9-0"]);
    let small = &out.devices[0];
    assert_eq!(attr(small, "type").as_deref(), Some("mig"));
    assert_eq!(attr(small, "uuid").as_deref(), Some("MIG-a"));
    assert_eq!(attr(small, "parentUUID").as_deref(), Some("GPU-1"));
    assert_eq!(attr(small, "profile").as_deref(), Some("1g.10gb"));
    assert_eq!(attr(small, "productName").as_deref(), Some(H100));
    assert_eq!(attr(small, "architecture").as_deref(), Some("Hopper"));
    assert_eq!(attr(small, "cudaComputeCapability").as_deref(), Some("9.0.0"));
    assert_eq!(cap(small, "memory").as_deref(), Some("10Gi"), "an eighth of 80Gi");
    assert_eq!(cap(small, "memorySlice6").as_deref(), Some("1"));
    assert_eq!(cap(small, "multiprocessors").as_deref(), Some("16"));
    let slots: Vec<&String> =
        small.capacity.as_ref().unwrap().keys().filter(|k| k.starts_with("memorySlice")).collect();
    assert_eq!(slots, ["memorySlice6"]);
    let big = &out.devices[1];
    assert_eq!(cap(big, "memory").as_deref(), Some("40Gi"));
    let slots: Vec<&String> = big.capacity.as_ref().unwrap().keys().filter(|k| k.starts_with("memorySlice")).collect();
    assert_eq!(slots, ["memorySlice0", "memorySlice1", "memorySlice2", "memorySlice3"]);
}

#[test]
fn a_gpu_with_mig_off_is_one_whole_gpu_device_and_a_mig_gpu_is_not() {
    let out = node_devices(&report(vec![gpu(0, false, vec![]), gpu(1, true, vec![])]));
    assert_eq!(out.devices.len(), 1);
    let d = &out.devices[0];
    assert_eq!(d.name, "gpu-0");
    assert_eq!(attr(d, "type").as_deref(), Some("gpu"));
    assert_eq!(attr(d, "uuid").as_deref(), Some("GPU-0"));
    assert_eq!(cap(d, "memory").as_deref(), Some("80Gi"));
}

#[test]
fn media_extension_profiles_get_rfc1123_names_and_boards_without_a_table_use_the_catalog() {
    let mut g = gpu(2, true, vec![inst("1g.10gb+me", 3, 1, Some("MIG-m"))]);
    g.profiles.clear();
    let out = node_devices(&report(vec![g]));
    assert_eq!(out.skipped, vec![]);
    assert_eq!(out.devices[0].name, "gpu-2-mig-1g10gb-me-20-3");
    assert_eq!(attr(&out.devices[0], "profile").as_deref(), Some("1g.10gb+me"));
    assert_eq!(cap(&out.devices[0], "jpegEngines").as_deref(), Some("1"));
}

#[test]
fn what_cannot_be_published_is_skipped_with_its_field_and_the_rest_is_kept() {
    let mut no_uuid_gpu = gpu(3, false, vec![]);
    no_uuid_gpu.uuid = " ".into();
    let mut unknown_board = gpu(4, true, vec![inst("1g.10gb", 0, 1, Some("MIG-x"))]);
    unknown_board.product = "NVIDIA Z9".into();
    unknown_board.profiles.clear();
    let r = report(vec![
        gpu(
            0,
            true,
            vec![
                inst("1g.10gb", 0, 1, None),
                inst("9g.99gb", 1, 1, Some("MIG-1")),
                inst("1g.10gb", 7, 2, Some("MIG-2")),
                inst("1g.10gb", -1, 1, Some("MIG-3")),
                inst("1g.10gb", 5, 1, Some("MIG-4")),
                inst("1g.10gb", 5, 1, Some("MIG-5")),
            ],
        ),
        gpu(-1, false, vec![]),
        no_uuid_gpu,
        unknown_board,
    ]);
    let out = node_devices(&r);
    let names: Vec<&str> = out.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["gpu-0-mig-1g10gb-19-5"]);
    let paths: Vec<&str> = out.skipped.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "status.gpus[0].instances[0].uuid",
            "status.gpus[0].instances[1].profile",
            "status.gpus[0].instances[2].start",
            "status.gpus[0].instances[3].start",
            "status.gpus[0].instances[5]",
            "status.gpus[1].index",
            "status.gpus[2].uuid",
            "status.gpus[3].instances[0].profile",
        ]
    );
    assert!(out.skipped[1].reason.contains("9g.99gb"), "{:?}", out.skipped[1]);
    assert!(out.skipped[4].reason.contains("gpu-0-mig-1g10gb-19-5"), "{:?}", out.skipped[4]);
}

#[test]
fn quantities_are_written_as_the_api_server_stores_them() {
    for (n, want) in [(0, "0"), (1, "1"), (1023, "1023"), (1024, "1Ki"), (1536, "1536"), (10 << 30, "10Gi")] {
        assert_eq!(canonical_quantity(n).0, want, "{n}");
    }
    assert_eq!(canonical_quantity(9856 << 20).0, "9856Mi");
}

#[test]
fn the_device_classes_are_nvidias() {
    let classes = device_classes();
    let by_name: BTreeMap<String, String> = classes
        .iter()
        .map(|c| {
            let sel = c.spec.as_ref().unwrap().selectors.as_ref().unwrap()[0].cel.as_ref().unwrap().expression.clone();
            (c.metadata.name.clone().unwrap(), sel)
        })
        .collect();
    assert_eq!(
        by_name["mig.nvidia.com"],
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
    );
    assert_eq!(
        by_name["gpu.nvidia.com"],
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
    );
    assert_eq!(classes[0].spec.as_ref().unwrap().extended_resource_name.as_deref(), Some("nvidia.com/gpu"));
}

fn observed(nodes: &[(&str, bool, Option<GpuNodeStatus>)], slices: Vec<ResourceSlice>) -> Observed {
    Observed {
        nodes: nodes
            .iter()
            .map(|(n, opted_in, report)| {
                (n.to_string(), ObservedNode { uid: format!("uid-{n}"), opted_in: *opted_in, report: report.clone() })
            })
            .collect(),
        slices: slices.into_iter().map(|s| (s.metadata.name.clone().unwrap(), s)).collect(),
    }
}

fn applied(actions: &[SliceAction]) -> Vec<&ResourceSlice> {
    actions.iter().filter_map(|a| if let SliceAction::Apply(s) = a { Some(&**s) } else { None }).collect()
}

#[test]
fn a_new_slice_starts_at_generation_one_and_an_unchanged_one_is_left_alone() {
    let r = report(vec![gpu(0, true, vec![inst("1g.10gb", 0, 1, Some("MIG-a"))])]);
    let first = plan(&observed(&[("n1", true, Some(r.clone()))], vec![]));
    let slices = applied(&first.actions);
    assert_eq!(slices.len(), 1);
    let s = slices[0].clone();
    assert_eq!(s.metadata.name.as_deref(), Some("n1-gpu.nvidia.com"));
    assert_eq!(s.spec.driver, "gpu.nvidia.com");
    assert_eq!(s.spec.node_name.as_deref(), Some("n1"));
    assert_eq!((s.spec.pool.name.as_str(), s.spec.pool.generation, s.spec.pool.resource_slice_count), ("n1", 1, 1));
    assert_eq!(s.metadata.owner_references.as_ref().unwrap()[0].uid, "uid-n1");
    let again = plan(&observed(&[("n1", true, Some(r))], vec![s]));
    assert_eq!(again.actions, vec![], "an up-to-date slice is not written again");
}

#[test]
fn a_changed_report_bumps_the_pool_generation() {
    let old = report(vec![gpu(0, true, vec![inst("1g.10gb", 0, 1, Some("MIG-a"))])]);
    let new = report(vec![gpu(0, true, vec![inst("3g.40gb", 0, 4, Some("MIG-b"))])]);
    let mut existing = applied(&plan(&observed(&[("n1", true, Some(old))], vec![])).actions)[0].clone();
    existing.spec.pool.generation = 7;
    let p = plan(&observed(&[("n1", true, Some(new.clone()))], vec![existing]));
    let s = applied(&p.actions)[0];
    assert_eq!(s.spec.pool.generation, 8);
    assert_eq!(device_names(s), ["gpu-0-mig-3g40gb-9-0"]);
    let want = digest(&node_devices(&new).devices);
    assert_eq!(s.metadata.annotations.as_ref().unwrap()[DEVICES_DIGEST], want);
}

#[test]
fn slices_of_nodes_opted_out_gone_or_unreported_are_deleted_and_skips_are_reported() {
    let r = report(vec![gpu(0, true, vec![inst("1g.10gb", 0, 1, None)])]);
    let slice_of = |n: &str| applied(&plan(&observed(&[(n, true, Some(report(vec![])))], vec![])).actions)[0].clone();
    let p = plan(&observed(
        &[("out", false, Some(r.clone())), ("unreported", true, None), ("kept", true, Some(r))],
        vec![slice_of("out"), slice_of("unreported"), slice_of("gone")],
    ));
    let mut deleted: Vec<&str> =
        p.actions.iter().filter_map(|a| if let SliceAction::Delete(n) = a { Some(n.as_str()) } else { None }).collect();
    deleted.sort();
    assert_eq!(deleted, ["gone-gpu.nvidia.com", "out-gpu.nvidia.com", "unreported-gpu.nvidia.com"]);
    let kept = applied(&p.actions);
    assert_eq!(kept.len(), 1);
    assert_eq!(device_names(kept[0]), Vec::<String>::new(), "an instance without a UUID is not published");
    assert_eq!(p.skipped.len(), 1);
    assert_eq!(p.skipped[0].0, "kept");
    assert_eq!(p.skipped[0].1.path, "status.gpus[0].instances[0].uuid");
}

#[test]
fn pods_name_their_claim_and_the_claim_selects_the_profile() {
    let t = claim_template("ns", "t", MIG_CLASS, Some(&profile_selector("1g.10gb")), 1);
    let req = &t.spec.as_ref().unwrap().spec.as_ref().unwrap().devices.as_ref().unwrap().requests.as_ref().unwrap()[0];
    let exactly = req.exactly.as_ref().unwrap();
    assert_eq!(exactly.device_class_name, "mig.nvidia.com");
    assert_eq!(
        exactly.selectors.as_ref().unwrap()[0].cel.as_ref().unwrap().expression,
        "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"
    );
    let pod = pod_with_claim_template("ns", "p", "t");
    assert_eq!(pod_claim_name(&pod, CLAIM_REF), None, "no claim before the controller makes one");
    assert_eq!(pod_claim_name(&pod_with_claim("ns", "p", "c"), CLAIM_REF).as_deref(), Some("c"));
}

#[test]
fn a_pod_can_be_kept_to_a_node_and_the_quota_key_is_the_device_class_s() {
    let pod = on_node(pod_with_claim("ns", "p", "c"), "gpu-a");
    let selector = pod.spec.as_ref().unwrap().node_selector.as_ref().unwrap();
    assert_eq!(selector["kubernetes.io/hostname"], "gpu-a");
    assert_eq!(device_quota_key(MIG_CLASS), "mig.nvidia.com.deviceclass.resource.k8s.io/devices");
}
