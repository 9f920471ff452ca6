use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use serde_json::json;
use tessera_crds::gate::{GateState, MAX_BLOCKED};

use super::{NamespaceInputs, claim_holders, class_list, plan_namespace, pod_holders};
use crate::dra::GpuDrivers;

const KEY: &str = "requests.nvidia.com/mig-1g.10gb";

fn gpu_pod(name: &str, second: u32, node: Option<&str>) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "a",
            "creationTimestamp": format!("2026-12-01T00:{:02}:{:02}Z", second / 60, second % 60)},
        "spec": {"nodeName": node, "schedulingGates": [{"name": "wait"}],
            "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]}}))
    .unwrap()
}

fn share(n: i64) -> BTreeMap<String, i64> {
    [(KEY.to_string(), n)].into()
}

fn inputs<'a>(
    share: &'a BTreeMap<String, i64>,
    pods: &'a [super::Holder],
    classes: &'a BTreeSet<String>,
) -> NamespaceInputs<'a> {
    NamespaceInputs { quota: "team-a", closed: None, share, shown: None, pods, claims: &[], classes }
}

/// The done-when case: twenty gated GPU pods made before the namespace joined, a share of 2.
#[test]
fn twenty_gated_pods_made_before_joining_get_two_through_and_the_key_is_over() {
    let pods: Vec<Pod> = (0..20).map(|i| gpu_pod(&format!("p{i:02}"), i, None)).collect();
    let holders = pod_holders(&pods);
    let classes = BTreeSet::new();
    let share = share(2);
    let mut i = inputs(&share, &holders, &classes);
    let shown: BTreeMap<String, i64> = [(KEY.to_string(), 20)].into();
    i.shown = Some(&shown);
    let plan = plan_namespace(&i);
    assert_eq!(plan.gate.state, GateState::Enforced);
    assert_eq!(plan.gate.blocked_pods.len(), 18, "{:?}", plan.gate.blocked_pods);
    assert!(
        !plan.gate.blocked_pods.contains(&"p00".to_string()) && !plan.gate.blocked_pods.contains(&"p01".to_string())
    );
    assert_eq!(plan.gate.over, vec![KEY.to_string()]);
    assert!(plan.gate.reason.contains("past the share"), "{}", plan.gate.reason);
    assert_eq!(plan.gate.limited, vec!["nvidia.com/mig-1g.10gb".to_string()]);
    assert_eq!(plan.limits[KEY], 2, "the ResourceQuota counts them all: the share is written");
}

#[test]
fn pods_the_resource_quota_does_not_count_yet_come_off_its_limit() {
    let pods = vec![gpu_pod("early", 0, Some("n1"))];
    let holders = pod_holders(&pods);
    let classes = BTreeSet::new();
    let share = share(3);
    let mut i = inputs(&share, &holders, &classes);
    let shown: BTreeMap<String, i64> = [(KEY.to_string(), 0)].into();
    i.shown = Some(&shown);
    assert_eq!(plan_namespace(&i).limits[KEY], 2);
}

#[test]
fn past_the_bound_every_binding_is_blocked() {
    let pods: Vec<Pod> = (0..(MAX_BLOCKED as u32 + 2)).map(|i| gpu_pod(&format!("p{i:04}"), i, None)).collect();
    let holders = pod_holders(&pods);
    let classes = BTreeSet::new();
    let share = share(1);
    let plan = plan_namespace(&inputs(&share, &holders, &classes));
    assert!(plan.gate.block_all_bindings);
    assert!(plan.gate.blocked_pods.is_empty());
    assert!(plan.gate.reason.contains("than a gate can name (256)"), "the refusal says why: {}", plan.gate.reason);
    // At the bound exactly, names are listed.
    let pods: Vec<Pod> = (0..(MAX_BLOCKED as u32 + 1)).map(|i| gpu_pod(&format!("p{i:04}"), i, None)).collect();
    let holders = pod_holders(&pods);
    let plan = plan_namespace(&inputs(&share, &holders, &classes));
    assert!(!plan.gate.block_all_bindings);
    assert_eq!(plan.gate.blocked_pods.len(), MAX_BLOCKED);
}

#[test]
fn a_long_reason_is_cut_to_what_a_gate_holds() {
    use tessera_crds::gate::MAX_REASON;
    let classes = BTreeSet::new();
    let share = share(1);
    let mut i = inputs(&share, &[], &classes);
    // Multi-byte characters across the cut: it lands on a character boundary.
    let why = "é".repeat(MAX_REASON);
    i.closed = Some(&why);
    let reason = plan_namespace(&i).gate.reason;
    assert!(reason.len() <= MAX_REASON, "{}", reason.len());
    assert!(reason.ends_with('…') && reason.starts_with("éé"), "{reason}");
    // One that fits is kept whole.
    i.closed = Some("short");
    assert_eq!(plan_namespace(&i).gate.reason, "short");
    assert_eq!(super::fit_reason("x".repeat(MAX_REASON)).len(), MAX_REASON, "exactly the bound is kept");
}

#[test]
fn a_closed_namespace_holds_every_key_at_zero_and_says_why() {
    let classes: BTreeSet<String> = ["mig-1g.10gb.tessera.dev".to_string()].into();
    let share = share(4);
    let pods = [gpu_pod("waiting", 0, None), gpu_pod("running", 1, Some("n1"))];
    let holders = pod_holders(&pods);
    let mut i = inputs(&share, &holders, &classes);
    i.closed = Some("namespace a is claimed by TenantGpuQuota team-b too");
    let plan = plan_namespace(&i);
    assert_eq!(plan.gate.state, GateState::Closed);
    assert_eq!(plan.gate.blocked_pods, vec!["waiting".to_string()], "an unbound pod admitted before waits too");
    assert_eq!(plan.gate.reason, "namespace a is claimed by TenantGpuQuota team-b too");
    assert!(plan.gate.classes.is_empty(), "no class open while closed");
    assert_eq!(plan.limits[KEY], 0);
}

#[test]
fn an_unallocated_all_claim_is_blocked_and_allocated_claims_count() {
    let claim = |name: &str, mode: &str, allocated: bool| -> ResourceClaim {
        let mut v = json!({"metadata": {"name": name, "namespace": "a", "creationTimestamp": "2026-12-01T00:00:00Z"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "mig.nvidia.com", "allocationMode": mode}}]}}});
        if allocated {
            v["status"] = json!({"allocation": {"devices": {"results": []}}});
        }
        serde_json::from_value(v).unwrap()
    };
    let claims = [claim("all", "All", false), claim("held", "ExactCount", true)];
    let holders = claim_holders(&claims, |_| true);
    let key = "mig.nvidia.com.deviceclass.resource.k8s.io/devices";
    let share: BTreeMap<String, i64> = [(key.to_string(), 2)].into();
    let classes = BTreeSet::new();
    let i = NamespaceInputs {
        quota: "q",
        closed: None,
        share: &share,
        shown: None,
        pods: &[],
        claims: &holders,
        classes: &classes,
    };
    let plan = plan_namespace(&i);
    assert_eq!(plan.gate.blocked_claims, vec!["all".to_string()]);
    assert_eq!(plan.gate.over, vec![key.to_string()], "32 + 1 counted against 2");
    assert!(plan.gate.limited.is_empty(), "claim keys are not extended resources");
}

#[test]
fn the_class_list_sorts_classes_by_what_they_reach() {
    let class = |name: &str, expr: &str| -> DeviceClass {
        serde_json::from_value(
            json!({"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expr}}]}}),
        )
        .unwrap()
    };
    let classes = [
        class("fpga.example.com", "device.driver == 'fpga.example.com'"),
        class("mig.nvidia.com", "device.driver == 'gpu.nvidia.com'"),
        class("anything.example.com", "true"),
        class("mig-1g.10gb.tessera.dev", "device.driver == 'gpu.nvidia.com'"),
        class("gpu.tessera.dev", "true"),
    ];
    let mismatched: BTreeSet<String> = ["gpu.tessera.dev".to_string()].into();
    let list = class_list(&classes, &GpuDrivers::default(), &mismatched);
    assert_eq!(list.open, vec!["fpga.example.com".to_string()]);
    assert_eq!(list.tessera, vec!["mig-1g.10gb.tessera.dev".to_string()], "a mismatched one of our names is closed");
}
