use serde_json::json;
use tessera_crds::{GpuNode, TenantGpuQuota};

use super::*;

const NOW: &str = "2026-06-01T12:00:00Z";

fn now() -> Timestamp {
    NOW.parse().unwrap()
}

/// Node `n1`: an H100 cut 3g.40gb@0 + 3g.40gb@4, both measured idle, @4 holding more memory for
/// longer; node `n2`: a whole GPU with 2 GiB on it and no pod.
fn inputs(pods: Vec<serde_json::Value>) -> Inputs {
    let act = |start: i32, since: &str, mib: i64| {
        json!({"gpuIndex": 0, "profile": "3g.40gb", "start": start, "source": "Gpm", "idleSince": since,
               "memoryUsedMib": mib, "processes": 1})
    };
    let n1: GpuNode = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": "n1"}, "spec": {}, "status": {
            "gpus": [{"index": 0, "uuid": "GPU-0", "product": "NVIDIA H100 80GB HBM3", "migCapable": true,
                      "migEnabled": true, "instances": [{"profile": "3g.40gb", "start": 0, "size": 4},
                                                        {"profile": "3g.40gb", "start": 4, "size": 4}]}],
            "activity": {"devices": [act(0, "2026-06-01T09:00:00Z", 100), act(4, "2026-05-31T00:00:00Z", 9000)]}}}))
    .unwrap();
    let n2: GpuNode = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": "n2"}, "spec": {}, "status": {
            "gpus": [{"index": 0, "uuid": "GPU-9", "product": "NVIDIA H100 80GB HBM3", "migCapable": true}],
            "activity": {"devices": [{"gpuIndex": 0, "source": "Gpm", "memoryUsedMib": 2048, "processes": 0}]}}}))
    .unwrap();
    let quotas: Vec<TenantGpuQuota> = ["ml", "web"]
        .iter()
        .map(|t| {
            serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
                "metadata": {"name": t}, "spec": {"namespaces": [t], "hard": {}}}))
            .unwrap()
        })
        .collect();
    Inputs {
        gpunodes: vec![n1, n2],
        quotas,
        pods: pods.into_iter().map(|p| serde_json::from_value(p).unwrap()).collect(),
        ..Inputs::default()
    }
}

fn pod(ns: &str, name: &str, n: i64, annotations: serde_json::Value) -> serde_json::Value {
    json!({"metadata": {"name": name, "namespace": ns, "annotations": annotations},
           "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/mig-3g.40gb": n}}}]},
           "status": {"phase": "Running"}})
}

#[test]
fn holders_sort_by_idle_since_memory_or_tenant() {
    // Two pods share the profile: ml/z is placed on @0, web/a on @4 (guesses, by pod order).
    let i = inputs(vec![pod("ml", "z", 1, json!({})), pod("web", "a", 1, json!({}))]);
    let starts = |sort| -> Vec<Option<i32>> { report(&i, now(), sort).idle.into_iter().map(|h| h.start).collect() };
    assert_eq!(starts(SortBy::IdleSince), vec![Some(4), Some(0)], "longest idle first");
    assert_eq!(starts(SortBy::Memory), vec![Some(4), Some(0)], "most memory first");
    let tenants: Vec<String> =
        report(&i, now(), SortBy::Tenant).idle.into_iter().map(|h| h.tenant.unwrap_or_default()).collect();
    assert_eq!(tenants, vec!["ml", "web"]);
    // Memory and idle time disagree: the memory order follows memory.
    let mut r = report(&i, now(), SortBy::IdleSince);
    r.idle[1].memory_used_mib = 99999;
    sort_holders(&mut r.idle, SortBy::Memory);
    assert_eq!(r.idle[0].memory_used_mib, 99999);
    sort_holders(&mut r.idle, SortBy::IdleSince);
    assert_eq!(r.idle[0].start, Some(4));
}

#[test]
fn the_table_marks_guesses_names_virtual_pods_and_lists_leaked_memory() {
    let vc = json!({"vcluster.loft.sh/object-name": "nb-0", "vcluster.loft.sh/object-namespace": "team-a"});
    let i = inputs(vec![pod("ml", "nb-0-x-team-a-x-vc", 1, vc)]);
    let r = report(&i, now(), SortBy::IdleSince);
    let t = text(&r, now(), true);
    assert!(t.starts_with("TENANT"), "{t}");
    assert!(t.contains("~ml/nb-0-x-team-a-x-vc (vcluster team-a/nb-0)"), "{t}");
    assert!(t.contains("3g.40gb@0") && t.contains("100 MiB") && t.contains("3h0m"), "{t}");
    assert!(t.contains("~ guessed holder"), "{t}");
    assert!(t.contains("leaked: n2 GPU 0 whole: 2048 MiB, 0 process(es), no pod holds it"), "{t}");
    assert!(t.contains("leaked: n1 GPU 0 3g.40gb@4: 9000 MiB"), "the free, used instance: {t}");
}

#[test]
fn no_idle_slices_is_said_and_unknown_holders_are_not_called_none() {
    let r = report(&inputs(vec![]), now(), SortBy::IdleSince);
    assert!(text(&r, now(), true).starts_with("No idle slices."));
    let unknown = text(&r, now(), false);
    assert!(unknown.starts_with("(idle slices and leaked memory unknown"), "{unknown}");
    assert!(!unknown.contains("leaked:"), "without holders every device looks free: {unknown}");
}

#[test]
fn unreadable_pods_list_no_leaked_memory_in_json_either() {
    let mut i = inputs(vec![]);
    assert!(!report(&i, now(), SortBy::IdleSince).leaked.is_empty(), "n2's memory is leaked while pods are read");
    i.unreadable =
        vec![tessera_planner::fleet_status::Unreadable { resource: "pods".into(), error: "forbidden".into() }];
    let r = report(&i, now(), SortBy::IdleSince);
    assert!(r.leaked.is_empty(), "{:?}", r.leaked);
    let v: serde_json::Value = serde_json::from_str(&json_body(&r, &i)).unwrap();
    assert_eq!(v["holdersKnown"], false);
    assert!(v.get("leaked").is_none(), "{v}");
}

#[test]
fn an_agent_whose_lease_ran_out_is_named_and_its_figures_are_not_read() {
    let i = inputs(vec![pod("ml", "p", 2, json!({}))]);
    assert_eq!(report(&i, now(), SortBy::IdleSince).idle.len(), 2, "read while no lease says otherwise");
    let lease = |node: &str, renewed: &str| -> k8s_openapi::api::coordination::v1::Lease {
        serde_json::from_value(json!({"metadata": {"name": node, "namespace": "tessera-node-leases"},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": renewed}}))
        .unwrap()
    };
    // n1's agent last renewed at 10:00; n2's is alive.
    let i = Inputs {
        leases: Some(vec![lease("n1", "2026-06-01T10:00:00.000000Z"), lease("n2", "2026-06-01T11:59:50.000000Z")]),
        ..i
    };
    let r = report(&i, now(), SortBy::IdleSince);
    assert!(r.idle.is_empty(), "{r:?}");
    assert_eq!(r.tenants["ml"].unmeasured, 2);
    let t = text(&r, now(), true);
    assert!(t.starts_with("No idle slices."), "{t}");
    assert!(
        t.contains(
            "not measured: n1: node agent not reporting since 2026-06-01T10:00:00Z; its 2 held device(s) count as unmeasured"
        ),
        "{t}"
    );
    assert!(t.contains("leaked: n2 GPU 0 whole"), "n2's agent is alive: {t}");
    assert!(!t.contains("leaked: n1"), "a dead agent's memory figures are not read either: {t}");
}

#[test]
fn json_carries_tenants_holders_and_leaks() {
    let i = inputs(vec![pod("ml", "p", 2, json!({}))]);
    let r = report(&i, now(), SortBy::IdleSince);
    let v: serde_json::Value = serde_json::from_str(&json_body(&r, &i)).unwrap();
    assert_eq!(v["holdersKnown"], true);
    assert_eq!(v["tenants"]["ml"], json!({"allocated": 2, "active": 0, "idle": 2, "unmeasured": 0}));
    assert_eq!(v["idle"][0]["pod"], "ml/p");
    assert_eq!(v["idle"][0]["idleSince"], "2026-05-31T00:00:00Z");
    assert_eq!(v["idle"][0]["exact"], true, "one pod holds both instances");
    assert_eq!(v["leaked"][0]["node"], "n2");
    assert!(v.get("unreadable").is_none());
}
