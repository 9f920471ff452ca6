use serde_json::{Value, json};

use super::*;

mod claims;

const H100: &str = "NVIDIA H100 80GB HBM3";
const A30: &str = "NVIDIA A30";

fn inst(profile: &str, start: i32, size: i32) -> Value {
    json!({"profile": profile, "start": start, "size": size})
}

fn mig(index: i32, product: &str, instances: Vec<Value>) -> Value {
    json!({"index": index, "uuid": format!("GPU-{index}"), "product": product, "migCapable": true,
           "migEnabled": true, "instances": instances})
}

fn whole(index: i32, product: &str, mig_capable: bool) -> Value {
    json!({"index": index, "uuid": format!("GPU-{index}"), "product": product, "migCapable": mig_capable})
}

fn gpunode(name: &str, gpus: Vec<Value>) -> GpuNode {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": name}, "spec": {}, "status": {"gpus": gpus}}))
    .unwrap()
}

fn pod(ns: &str, name: &str, node: &str, resources: Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": resources}}]},
        "status": {"phase": "Running"}}))
    .unwrap()
}

fn quota(name: &str, namespaces: &[&str]) -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": name}, "spec": {"namespaces": namespaces, "hard": {}}}))
    .unwrap()
}

fn one_gpu(g: Value) -> GpuStatus {
    let s = fleet_status(&[gpunode("n", vec![g])], &[], &[], &[]);
    s.nodes.into_iter().next().unwrap().gpus.into_iter().next().unwrap()
}

#[test]
fn slot_diagrams_of_known_layouts() {
    type Row = (&'static str, Value, &'static str, &'static str, Vec<(char, &'static str)>);
    let table: Vec<Row> = vec![
        (
            "H100 2+2+3, listed out of order",
            mig(0, H100, vec![inst("3g.40gb", 4, 4), inst("2g.20gb", 0, 2), inst("2g.20gb", 2, 2)]),
            "mig",
            "AABBCCCC",
            vec![('C', "3g.40gb"), ('A', "2g.20gb"), ('B', "2g.20gb")],
        ),
        (
            "H100 seven 1g leave the last slot free",
            mig(0, H100, (0..7).map(|s| inst("1g.10gb", s, 1)).collect()),
            "mig",
            "ABCDEFG.",
            vec![
                ('A', "1g.10gb"),
                ('B', "1g.10gb"),
                ('C', "1g.10gb"),
                ('D', "1g.10gb"),
                ('E', "1g.10gb"),
                ('F', "1g.10gb"),
                ('G', "1g.10gb"),
            ],
        ),
        (
            "A30 has four slots",
            mig(0, A30, vec![inst("2g.12gb", 0, 2), inst("1g.6gb", 2, 1), inst("1g.6gb", 3, 1)]),
            "mig",
            "AABC",
            vec![('A', "2g.12gb"), ('B', "1g.6gb"), ('C', "1g.6gb")],
        ),
        ("A30 one 4g", mig(0, A30, vec![inst("4g.24gb", 0, 4)]), "mig", "AAAA", vec![('A', "4g.24gb")]),
        ("MIG on, no instances", mig(0, H100, vec![]), "mig", "........", vec![]),
        ("MIG off", whole(0, H100, true), "whole", "", vec![]),
        ("no MIG on the board", whole(0, "Tesla T4", false), "no-mig", "", vec![]),
        (
            "an unknown board is drawn as far as its instances reach",
            mig(0, "NVIDIA Z100", vec![inst("1g.9gb", 1, 1), inst("2g.18gb", 2, 2)]),
            "mig",
            ".ABB",
            vec![('A', "1g.9gb"), ('B', "2g.18gb")],
        ),
        (
            "a hostile report cannot make the diagram huge or panic",
            mig(0, "NVIDIA Z100", vec![inst("1g.9gb", -5, 99), inst("1g.9gb", 1_000_000, 3)]),
            "mig",
            "AAAAAAAAAAAAAAAA",
            vec![('A', "1g.9gb"), ('B', "1g.9gb")],
        ),
    ];
    for (what, g, mode, slots, letters) in table {
        let got = one_gpu(g);
        assert_eq!(got.mode, mode, "{what}");
        assert_eq!(got.slots, slots, "{what}");
        let got_letters: Vec<(char, &str)> = got.instances.iter().map(|i| (i.letter, i.profile.as_str())).collect();
        assert_eq!(got_letters, letters, "{what}");
    }
}

#[test]
fn busy_instances_are_attributed_to_the_tenant_of_the_pods_namespace() {
    let nodes = [
        gpunode("a", vec![mig(0, H100, vec![inst("2g.20gb", 0, 2), inst("2g.20gb", 2, 2), inst("3g.40gb", 4, 4)])]),
        gpunode("b", vec![whole(0, H100, true), whole(1, H100, true)]),
    ];
    let quotas = [quota("team-a", &["ml", "ml-batch"]), quota("team-b", &["web"])];
    let pods = [
        pod("ml-batch", "train", "a", json!({"nvidia.com/mig-3g.40gb": "1"})),
        pod("web", "serve", "a", json!({"nvidia.com/mig-2g.20gb": "1"})),
        pod("scratch", "x", "b", json!({"nvidia.com/gpu": "1"})),
    ];
    let s = fleet_status(&nodes, &[], &quotas, &pods);
    let a = &s.nodes[0].gpus[0];
    let holder = |i: usize| a.instances[i].holder.as_ref().map(|h| (h.pod.as_str(), h.tenant.as_deref()));
    assert_eq!(holder(2), Some(("ml-batch/train", Some("team-a"))), "the only 3g.40gb");
    assert!(a.instances[2].exact, "one 3g.40gb, held: no doubt which");
    assert_eq!(holder(0), Some(("web/serve", Some("team-b"))), "lowest slot first");
    assert_eq!(holder(1), None);
    assert!(!a.instances[0].exact && !a.instances[1].exact, "one of two 2g.20gb: the API does not say which");
    let b = &s.nodes[1].gpus;
    assert_eq!(b[0].holder.as_ref().map(|h| (h.pod.as_str(), h.tenant.clone())), Some(("scratch/x", None)));
    assert!(b[1].holder.is_none());
    assert!(!b[0].exact);
    assert_eq!(s.tenants["team-a"], [("nvidia.com/mig-3g.40gb".to_string(), 1)].into());
    assert_eq!(s.tenants["team-b"], [("nvidia.com/mig-2g.20gb".to_string(), 1)].into());
    assert_eq!(s.tenants[""], [("nvidia.com/gpu".to_string(), 1)].into(), "no quota claims scratch");
}

#[test]
fn attribution_is_exact_when_all_or_none_are_held_by_one_pod() {
    let node = || gpunode("a", vec![mig(0, H100, vec![inst("2g.20gb", 0, 2), inst("2g.20gb", 2, 2)])]);
    let exact = |pods: &[Pod]| -> Vec<bool> {
        fleet_status(&[node()], &[], &[], pods).nodes[0].gpus[0].instances.iter().map(|i| i.exact).collect()
    };
    let two = json!({"nvidia.com/mig-2g.20gb": "2"});
    let one = json!({"nvidia.com/mig-2g.20gb": "1"});
    assert_eq!(exact(&[]), [true, true], "all free");
    assert_eq!(exact(&[pod("x", "p", "a", two)]), [true, true], "one pod holds both");
    assert_eq!(
        exact(&[pod("x", "p", "a", one.clone()), pod("y", "q", "a", one.clone())]),
        [false, false],
        "two pods, two instances: which holds which is unknown"
    );
    assert_eq!(exact(&[pod("x", "p", "b", one)]), [true, true], "a pod on another node");
}

#[test]
fn pods_holding_what_the_node_does_not_report_are_listed_not_drawn() {
    let nodes = [gpunode("a", vec![mig(0, H100, vec![inst("3g.40gb", 4, 4)])])];
    let pods = [
        pod("ml", "big", "a", json!({"nvidia.com/mig-3g.40gb": "2"})),
        pod("ml", "old", "a", json!({"nvidia.com/mig-1g.10gb": "1"})),
    ];
    let s = fleet_status(&nodes, &[], &[], &pods);
    let n = &s.nodes[0];
    assert_eq!(n.gpus[0].instances[0].holder.as_ref().unwrap().pod, "ml/big");
    let unplaced: Vec<(&str, &str, i64)> =
        n.unplaced.iter().map(|u| (u.holder.pod.as_str(), u.resource.as_str(), u.count)).collect();
    assert_eq!(unplaced, [("ml/big", "nvidia.com/mig-3g.40gb", 1), ("ml/old", "nvidia.com/mig-1g.10gb", 1)]);
}

#[test]
fn finished_pods_and_pods_without_gpus_hold_nothing() {
    let nodes = [gpunode("a", vec![whole(0, H100, true)])];
    let mut done = pod("ml", "done", "a", json!({"nvidia.com/gpu": "1"}));
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    let cpu = pod("ml", "cpu", "a", json!({"cpu": "2"}));
    let pending: Pod = serde_json::from_value(json!({"metadata": {"name": "unbound", "namespace": "ml"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}))
    .unwrap();
    let s = fleet_status(&nodes, &[], &[], &[done, cpu, pending]);
    assert!(s.nodes[0].gpus[0].holder.is_none());
    assert!(s.tenants.is_empty());
}

#[test]
fn gpu_resources_count_like_the_kubelet() {
    let p: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {
        "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "3"}}}],
        "containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "2"}}},
            {"name": "b", "resources": {"requests": {"nvidia.com/gpu": "1"}}},
            {"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "lots", "memory": "1Gi"}}}]}}))
    .unwrap();
    let got = gpu_resources(&p);
    assert_eq!(got, [("nvidia.com/gpu".to_string(), 3), ("nvidia.com/mig-1g.10gb".to_string(), 2)].into());
}

#[test]
fn phase_readiness_plan_and_target_come_from_the_gpunode() {
    let gn: GpuNode = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": "n"},
        "spec": {"plan": "training", "gpus": [
            {"index": 0, "migEnabled": true, "profiles": {"1g.10gb": 7}},
            {"index": 1, "migEnabled": false}]},
        "status": {"gpus": [whole(0, H100, true), whole(1, H100, true)],
            "conditions": [{"type": "Ready", "status": "False", "reason": "Applying", "message": "creating instances",
                            "lastTransitionTime": "2026-06-01T00:00:00Z"}],
            "rollout": {"phase": "Applying", "plan": "training"}}}))
    .unwrap();
    let s = fleet_status(&[gn, gpunode("fresh", vec![])], &[], &[], &[]);
    let n = &s.nodes[1];
    assert_eq!((n.name.as_str(), n.phase.as_str(), n.ready.as_str()), ("n", "Applying", "False"));
    assert_eq!(n.plan.as_deref(), Some("training"));
    assert_eq!(n.message, "creating instances");
    assert_eq!(n.gpus[0].target.as_deref(), Some("7x1g.10gb"));
    assert_eq!(n.gpus[1].target, None, "already whole");
    let fresh = &s.nodes[0];
    assert_eq!((fresh.phase.as_str(), fresh.ready.as_str(), fresh.plan.as_deref()), ("-", "Unknown", None));
}

#[test]
fn plans_are_summarised_from_their_status() {
    let p: GpuPartitionPlan = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1",
        "kind": "GpuPartitionPlan", "metadata": {"name": "p"},
        "spec": {"paused": true, "layouts": [{"gpuProduct": "A30", "profiles": {"4g.24gb": 1}}]},
        "status": {"matchedNodes": 4, "updatedNodes": 1, "inProgressNodes": 1, "failedNodes": 1, "conditions": [
            {"type": "Ready", "status": "False", "reason": "NodeFailed", "message": "n3: apply failed",
             "lastTransitionTime": "2026-06-01T00:00:00Z"}]}}))
    .unwrap();
    let s = fleet_status(&[], &[p], &[], &[]);
    let got = &s.plans[0];
    assert_eq!((got.matched, got.updated, got.in_progress, got.failed, got.paused), (4, 1, 1, 1, true));
    assert_eq!((got.ready.as_str(), got.reason.as_str()), ("False", "NodeFailed"));
    let text = text(&s, false);
    assert!(
        text.contains("p  ready False  1/4 updated, 1 in progress, 1 failed (paused)  NodeFailed: n3: apply failed"),
        "{text}"
    );
}

fn sample() -> FleetStatus {
    let nodes = [
        gpunode("a", vec![mig(0, H100, vec![inst("2g.20gb", 0, 2), inst("2g.20gb", 2, 2), inst("3g.40gb", 4, 4)])]),
        gpunode("b", vec![whole(0, H100, true)]),
    ];
    let pods = [
        pod("ml", "train", "a", json!({"nvidia.com/mig-3g.40gb": "1"})),
        pod("ml", "serve", "a", json!({"nvidia.com/mig-2g.20gb": "1"})),
    ];
    fleet_status(&nodes, &[], &[quota("team-a", &["ml"])], &pods)
}

#[test]
fn plain_text_has_no_escape_codes_and_colour_has() {
    let s = sample();
    let plain = text(&s, false);
    assert!(!plain.contains('\x1b'), "{plain}");
    assert!(plain.contains("  gpu0  H100-80GB  [AABBCCCC]  A 2g.20gb  B 2g.20gb  C 3g.40gb  (2/3 busy)"), "{plain}");
    assert!(plain.contains("A~ team-a  ml/serve"), "{plain}");
    assert!(plain.contains("C  team-a  ml/train"), "{plain}");
    assert!(plain.contains("  gpu0  H100-80GB  whole GPU  free"), "{plain}");
    assert!(plain.contains("~ the API does not say which device a pod got"), "{plain}");
    assert!(plain.contains("team-a  nvidia.com/mig-2g.20gb=1 nvidia.com/mig-3g.40gb=1"), "{plain}");
    let colour = text(&s, true);
    assert!(colour.contains("\x1b[31mC\x1b[0m"), "busy instance letters are red: {colour}");
    assert!(colour.contains("\x1b[32mB\x1b[0m"), "free ones green: {colour}");
    let stripped = strip_ansi(&colour);
    assert_eq!(stripped, plain, "colour adds escape codes and nothing else");
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn json_names_every_field_in_camel_case() {
    let v = serde_json::to_value(sample()).unwrap();
    let g = &v["nodes"][0]["gpus"][0];
    assert_eq!(g["slots"], "AABBCCCC");
    assert_eq!(
        g["instances"][2],
        json!({"letter": "C", "profile": "3g.40gb", "start": 4, "size": 4,
        "holder": {"pod": "ml/train", "tenant": "team-a"}, "exact": true})
    );
    assert_eq!(v["nodes"][1]["gpus"][0]["mode"], "whole");
    assert_eq!(v["nodes"][1]["gpus"][0]["exact"], true);
    assert!(v["nodes"][1]["gpus"][0].get("holder").is_none(), "free");
    assert!(v.get("unreadable").is_none(), "absent when everything was read");
}

#[test]
fn huge_gpu_counts_saturate_instead_of_overflowing() {
    const MAX: &str = "9223372036854775807";
    let two_containers: Pod = serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ml"}, "spec": {
        "nodeName": "a",
        "containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": MAX}}},
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": MAX}}}]},
        "status": {"phase": "Running"}}))
    .unwrap();
    assert_eq!(gpu_resources(&two_containers)["nvidia.com/gpu"], i64::MAX, "containers of one pod");
    let pods = [
        pod("ml", "x", "a", json!({"nvidia.com/gpu": MAX})),
        pod("ml", "y", "a", json!({"nvidia.com/gpu": MAX})),
        two_containers,
    ];
    let s = fleet_status(&[gpunode("a", vec![whole(0, H100, true)])], &[], &[quota("t", &["ml"])], &pods);
    assert_eq!(s.tenants["t"]["nvidia.com/gpu"], i64::MAX, "a tenant's total across pods");
    assert_eq!(s.nodes[0].unplaced.len(), 3, "all three hold more than the node has");
}

#[test]
fn terminal_escapes_and_line_breaks_in_reported_strings_are_neutralised_in_text() {
    let hostile = "\x1b]0;pwned\x07";
    let mut g = mig(0, &format!("Evil{hostile}GPU"), vec![inst(&format!("1g\x1b[2J.{hostile}"), 0, 1)]);
    g["product"] = json!(format!("Evil{hostile}GPU"));
    let gn: GpuNode = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": "n"}, "spec": {"plan": "p\x1b[31m"},
        "status": {"gpus": [g], "rollout": {"phase": "Failed", "message": "line one\nFAKE-NODE  phase Idle\r\u{9b}2J"}}}))
    .unwrap();
    let p: GpuPartitionPlan = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1",
        "kind": "GpuPartitionPlan", "metadata": {"name": "p"},
        "spec": {"layouts": [{"gpuProduct": "A30", "profiles": {"4g.24gb": 1}}]},
        "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Bad\x07",
            "message": "first\nsecond\u{9d}0;x\x07", "lastTransitionTime": "2026-06-01T00:00:00Z"}]}}))
    .unwrap();
    let pods = [pod("ml\x1b[1m", "x\ny", "n", json!({"nvidia.com/mig-1g.9gb": "1", "nvidia.com/gpu": "1"}))];
    let s = fleet_status(&[gn], &[p], &[quota("t\x1b[0m", &["ml\x1b[1m"])], &pods);
    for colour in [false, true] {
        let out = text(&s, colour);
        let stripped = if colour { strip_ansi(&out) } else { out.clone() };
        for bad in ['\x1b', '\x07', '\r', '\u{9b}', '\u{9d}'] {
            assert!(!stripped.contains(bad), "{bad:?} in {stripped:?}");
        }
        assert!(!out.contains("\x1b]") && !out.contains("\x07"), "{out:?}");
        assert!(!stripped.contains("\nFAKE-NODE"), "a message stays on its line: {stripped}");
        assert!(stripped.contains("line one FAKE-NODE"), "{stripped}");
        assert!(stripped.contains("first second"), "{stripped}");
        assert!(stripped.contains("Evil?]0;pwned?GPU"), "{stripped}");
    }
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["nodes"][0]["gpus"][0]["product"], format!("Evil{hostile}GPU"), "JSON stays exact");
}

#[test]
fn when_pods_cannot_be_read_busy_state_is_unknown_not_free() {
    let inputs = Inputs {
        gpunodes: vec![
            gpunode("a", vec![mig(0, H100, vec![inst("2g.20gb", 0, 2), inst("3g.40gb", 4, 4)])]),
            gpunode("b", vec![whole(0, H100, true)]),
        ],
        unreadable: vec![Unreadable { resource: "pods".into(), error: "forbidden".into() }],
        ..Default::default()
    };
    let s = inputs.report();
    assert!(!s.holders_known);
    let plain = text(&s, false);
    assert!(plain.contains("[AA..BBBB]  A 2g.20gb  B 3g.40gb  (busy: unknown, pods unreadable)"), "{plain}");
    assert!(plain.contains("  gpu0  H100-80GB  whole GPU  busy: unknown"), "{plain}");
    assert!(!plain.contains("free") && !plain.contains("0/2 busy"), "{plain}");
    let colour = text(&s, true);
    assert!(!colour.contains("\x1b[32m"), "nothing is green (free): {colour}");
    assert_eq!(strip_ansi(&colour), plain);
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(v["holdersKnown"], false);
    assert_eq!(serde_json::to_value(sample()).unwrap()["holdersKnown"], true);
    let known = Inputs {
        unreadable: vec![Unreadable { resource: "tenantgpuquotas.tessera.dev".into(), error: "x".into() }],
        ..Default::default()
    };
    assert!(known.report().holders_known, "only unreadable pods make holders unknown");
}

#[test]
fn a_namespace_claimed_by_two_quotas_names_both() {
    type Row = (&'static str, Vec<TenantGpuQuota>, Option<&'static str>);
    let table: Vec<Row> = vec![
        ("one quota", vec![quota("a", &["ml"])], Some("a")),
        ("none", vec![quota("a", &["web"])], None),
        ("two, listed b first", vec![quota("b", &["ml"]), quota("a", &["ml", "web"])], Some("a|b (conflict)")),
        ("one quota naming it twice", vec![quota("a", &["ml", "ml"])], Some("a")),
    ];
    let nodes = [gpunode("n", vec![whole(0, H100, true)])];
    for (what, quotas, want) in table {
        let s = fleet_status(&nodes, &[], &quotas, &[pod("ml", "p", "n", json!({"nvidia.com/gpu": "1"}))]);
        let holder = s.nodes[0].gpus[0].holder.clone().unwrap();
        assert_eq!(holder.tenant.as_deref(), want, "{what}");
        assert_eq!(s.tenants.keys().next().map(String::as_str), Some(want.unwrap_or("")), "{what}");
    }
}

#[test]
fn native_sidecars_add_to_app_containers_as_the_kubelet_counts() {
    let gpu = |n: u32| json!({"limits": {"nvidia.com/gpu": n.to_string()}});
    let sidecar = |n: u32| json!({"name": "s", "restartPolicy": "Always", "resources": gpu(n)});
    let init = |n: u32| json!({"name": "i", "resources": gpu(n)});
    type Row = (&'static str, Vec<Value>, u32, i64);
    let table: Vec<Row> = vec![
        ("a sidecar runs beside the app", vec![sidecar(1)], 1, 2),
        ("a plain init container is reused", vec![init(1)], 1, 1),
        ("a large plain init container", vec![init(3)], 1, 3),
        ("an init container after a sidecar runs beside it", vec![sidecar(1), init(3)], 1, 4),
        ("an init container before a sidecar does not", vec![init(3), sidecar(1)], 1, 3),
        ("two sidecars and the app", vec![sidecar(1), sidecar(2)], 2, 5),
    ];
    for (what, init_containers, app, want) in table {
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {
            "initContainers": init_containers,
            "containers": [{"name": "a", "resources": gpu(app)}]}}))
        .unwrap();
        assert_eq!(gpu_resources(&p).get("nvidia.com/gpu").copied(), Some(want), "{what}");
    }
}
