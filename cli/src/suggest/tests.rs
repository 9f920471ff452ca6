use serde_json::json;

use super::*;
use tessera_planner::quota::plan_quotas;

const MIG1G: &str = "nvidia.com/mig-1g.10gb";

/// A node of H100s with the given instances (profile, start) per GPU; MIG off where `None`.
fn gpunode(name: &str, gpus: &[Option<&[(&str, i32)]>]) -> GpuNode {
    let h = tessera_crds::catalog::lookup("H100-80GB").unwrap();
    let gpus: Vec<serde_json::Value> = gpus
        .iter()
        .enumerate()
        .map(|(i, inst)| {
            let instances: Vec<serde_json::Value> = inst
                .unwrap_or_default()
                .iter()
                .map(|(p, s)| json!({"profile": p, "start": s, "size": h.profile(p).unwrap().memory_slices}))
                .collect();
            json!({"index": i, "uuid": format!("GPU-{name}-{i}"), "product": "NVIDIA H100 80GB HBM3",
                   "migCapable": true, "migEnabled": inst.is_some(), "instances": instances})
        })
        .collect();
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": name}, "spec": {}, "status": {"gpus": gpus}}))
    .unwrap()
}

fn quota(name: &str, team: &str, hard: serde_json::Value) -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": name, "labels": {"team": team}}, "spec": {"namespaces": [name], "hard": hard}}))
    .unwrap()
}

fn plan(v: serde_json::Value) -> GpuPartitionPlan {
    serde_json::from_value(v).unwrap()
}

fn now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-06-01T00:00:00Z".parse().unwrap())
}

#[test]
fn suggested_plans_validate_and_cover_the_quotas() {
    let q = quota("t", "ml", json!({MIG1G: 10, "nvidia.com/gpu": 1}));
    let seven: &[(&str, i32)] = &[("7g.80gb", 0)];
    let fixed = plan(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan",
        "metadata": {"name": "fixed"}, "spec": {"priority": 5, "nodeSelector": {"matchLabels": {"x": "y"}},
        "layouts": [{"gpuProduct": "NVIDIA H100 80GB HBM3", "profiles": {"7g.80gb": 1}}]}}));
    let inputs = Inputs {
        quotas: vec![q],
        gpunodes: vec![
            gpunode("n1", &[Some(seven), None]),
            gpunode("n2", &[Some(seven), None]),
            gpunode("busy", &[Some(seven), None]),
        ],
        busy_nodes: [("busy".to_string(), vec!["t/p".to_string()])].into(),
        plans: vec![fixed],
        ..Default::default()
    };
    let s = suggest(&inputs, &Scope::Fleet { selector: LabelSelector::default(), headroom: 0 }).unwrap();
    assert!(s.answer.shortfall.is_empty(), "{:?}", s.answer);
    // Ten 1g need two GPUs; the whole GPUs already give nvidia.com/gpu.
    assert_eq!(s.answer.changed, 2);
    assert!(
        s.answer.gpus.iter().filter(|g| g.node == "busy").all(|g| !g.changed),
        "a node with GPU pods is left alone"
    );
    for p in &s.plans {
        let plan: GpuPartitionPlan = serde_json::from_value(p.clone()).unwrap();
        assert_eq!(plan.spec.priority, 15, "wins over the existing plans");
        let errs = tessera_crds::validate::validate_plan(&plan.spec);
        assert!(errs.is_empty(), "{errs:?}");
    }
    let headroom = suggest(&inputs, &Scope::Fleet { selector: LabelSelector::default(), headroom: 25 }).unwrap();
    assert_eq!(headroom.demand[MIG1G], 13, "headroom rounds up");
}

/// `plan suggest --plan` and the automatic plan decide the same on the same fleet, and
/// the quota controller agrees with both once the decision is applied. The plan selects team-a
/// and team-b (18 slices); team-c (2) is not selected and holds slices on a GPU outside it.
#[test]
fn suggest_for_a_plan_decides_what_the_plan_does_and_the_quotas_agree() {
    let seven: &[(&str, i32)] = &[("7g.80gb", 0)];
    let outside: &[(&str, i32)] = &[("1g.10gb", 0), ("1g.10gb", 1), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4)];
    let auto = plan(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan",
        "metadata": {"name": "auto", "generation": 1},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "ml"}},
                 "layoutsFrom": {"quotaSelector": {"matchLabels": {"team": "ml"}}}}}));
    let pool = |v: &str| -> BTreeMap<String, String> { [("pool".to_string(), v.to_string())].into() };
    let inputs = Inputs {
        quotas: vec![
            quota("team-a", "ml", json!({MIG1G: 9})),
            quota("team-b", "ml", json!({MIG1G: 9})),
            quota("team-c", "web", json!({MIG1G: 2})),
        ],
        gpunodes: vec![gpunode("p1", &[Some(seven)]), gpunode("p2", &[Some(seven)]), gpunode("o", &[Some(outside)])],
        labels: [("p1".to_string(), pool("ml")), ("p2".to_string(), pool("ml")), ("o".to_string(), pool("web"))].into(),
        plans: vec![auto.clone()],
        ..Default::default()
    };
    let s = suggest(&inputs, &Scope::Plan("auto".into())).unwrap();

    // The controller's path: the plan's demand, its owned nodes, the fleet's GPUs.
    let from = auto.spec.layouts_from.as_ref().unwrap();
    let refs: Vec<&GpuNode> = inputs.gpunodes.iter().collect();
    let owned: BTreeSet<String> = ["p1".to_string(), "p2".to_string()].into();
    let d = tessera_planner::automatic_layouts::decide(
        &auto,
        &tessera_planner::automatic_layouts::plan_demand(from, &inputs.quotas),
        &refs,
        &owned,
        &BTreeSet::new(),
        &BTreeSet::new(),
        &[],
        "t",
        now(),
    )
    .unwrap();
    assert_eq!(s.demand, d.demand);
    assert_eq!(s.demand[MIG1G], 20, "team-c's 2 are counted once, as theirs");
    assert_eq!(s.not_selected, [(MIG1G.to_string(), 2)].into());
    assert_eq!((&s.answer.supply_before, &s.answer.supply_after), (&d.supply_before, &d.supply_after));
    assert_eq!(s.answer.shortfall, d.shortfall);
    assert_eq!(d.shortfall, [(MIG1G.to_string(), 2)].into(), "14 carved + 4 outside of 20: {d:#?}");
    let changed: Vec<(String, i32)> =
        s.answer.gpus.iter().filter(|g| g.changed).map(|g| (g.node.clone(), g.index)).collect();
    let targets: Vec<(String, i32)> =
        d.targets.iter().flat_map(|t| t.gpus.iter().map(|g| (t.node.clone(), g.index))).collect();
    assert_eq!(changed, targets);
    assert!(d.message.contains("guaranteed to quota(s) this plan does not select (team-c)"), "{}", d.message);

    // The fleet once the decision is applied: the quota controller names the same shortfall.
    let full: Vec<(&str, i32)> = (0..7).map(|s| ("1g.10gb", s)).collect();
    let after = [gpunode("p1", &[Some(&full)]), gpunode("p2", &[Some(&full)]), gpunode("o", &[Some(outside)])];
    let namespaces = ["team-a", "team-b", "team-c"].map(String::from).into();
    let quotas = plan_quotas(&inputs.quotas, &namespaces, &[], &after, now());
    assert_eq!(quotas.shortfall[MIG1G], d.shortfall[MIG1G]);
    assert_eq!(tessera_planner::quota::fleet_supply(&after), d.supply_after);
}

/// `plan suggest --plan` leaves out the nodes the plan leaves out (their agent cannot
/// apply), as the controller does.
#[test]
fn suggest_for_a_plan_leaves_out_the_nodes_the_plan_excluded() {
    let seven: &[(&str, i32)] = &[("7g.80gb", 0)];
    let decision = json!({"planGeneration": 1, "excluded": [{"node": "p1", "reason": "LeakedMemory"}]});
    let auto = plan(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan",
        "metadata": {"name": "auto", "generation": 1},
        "spec": {"layoutsFrom": {"quotaSelector": {"matchLabels": {"team": "ml"}}}},
        "status": {"layoutDecision": decision}}));
    let mut p1 = gpunode("p1", &[Some(seven)]);
    p1.metadata.generation = Some(2);
    p1.status.as_mut().unwrap().conditions = serde_json::from_value(json!([{"type": "Stalled", "status": "True",
        "reason": "LeakedMemory", "message": "m", "observedGeneration": 2,
        "lastTransitionTime": "2026-06-01T00:00:00Z"}]))
    .unwrap();
    let inputs = Inputs {
        quotas: vec![quota("team-a", "ml", json!({MIG1G: 14}))],
        gpunodes: vec![p1, gpunode("p2", &[Some(seven)])],
        plans: vec![auto],
        ..Default::default()
    };
    let s = suggest(&inputs, &Scope::Plan("auto".into())).unwrap();
    let changed: Vec<&str> = s.answer.gpus.iter().filter(|g| g.changed).map(|g| g.node.as_str()).collect();
    assert_eq!(changed, ["p2"], "{:?}", s.answer);
    assert_eq!(s.answer.shortfall, [(MIG1G.to_string(), 7)].into());
}

#[test]
fn suggest_for_a_plan_refuses_an_unknown_or_fixed_plan() {
    let fixed = plan(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan",
        "metadata": {"name": "fixed"}, "spec": {"nodeSelector": {},
        "layouts": [{"gpuProduct": "NVIDIA H100 80GB HBM3", "profiles": {"7g.80gb": 1}}]}}));
    let inputs = Inputs { quotas: vec![quota("a", "ml", json!({MIG1G: 1}))], plans: vec![fixed], ..Default::default() };
    let err = suggest(&inputs, &Scope::Plan("nope".into())).unwrap_err().to_string();
    assert_eq!(err, "--plan nope: no GpuPartitionPlan of that name");
    let err = suggest(&inputs, &Scope::Plan("fixed".into())).unwrap_err().to_string();
    assert!(err.contains("--plan fixed: the plan has fixed layouts (spec.layouts)"), "{err}");
}

#[test]
fn an_export_without_quotas_is_refused_naming_where_it_came_from() {
    let inputs = Inputs { gpunodes: vec![gpunode("n", &[None])], ..Default::default() };
    let err = check_quotas(&inputs, "--from export.yaml").unwrap_err().to_string();
    assert!(err.starts_with("no TenantGpuQuota in --from export.yaml: there is no demand to plan for"), "{err}");
    let mut invalid = quota("a", "ml", json!({MIG1G: 1}));
    invalid.spec.namespaces.clear();
    let inputs = Inputs { quotas: vec![invalid], ..Default::default() };
    let err = check_quotas(&inputs, "the cluster").unwrap_err().to_string();
    assert!(err.starts_with("none of the 1 TenantGpuQuota(s) in the cluster is valid"), "{err}");
    let inputs = Inputs { quotas: vec![quota("a", "ml", json!({MIG1G: 1}))], ..Default::default() };
    assert!(check_quotas(&inputs, "the cluster").is_ok());
}

/// Every key of the JSON output is camelCase (maps keyed by resource, node or profile names
/// included: those have no capitals or underscores either).
#[test]
fn json_output_is_camel_case() {
    fn keys(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => m.iter().for_each(|(k, v)| {
                out.push(k.clone());
                keys(v, out)
            }),
            serde_json::Value::Array(a) => a.iter().for_each(|v| keys(v, out)),
            _ => {}
        }
    }
    let seven: &[(&str, i32)] = &[("7g.80gb", 0)];
    let inputs = Inputs {
        quotas: vec![quota("a", "ml", json!({MIG1G: 7}))],
        gpunodes: vec![gpunode("n1", &[Some(seven), None])],
        busy_nodes: [("n2".to_string(), vec!["a/p".to_string()])].into(),
        ..Default::default()
    };
    let s = suggest(&inputs, &Scope::Fleet { selector: LabelSelector::default(), headroom: 0 }).unwrap();
    let v = serde_json::to_value(&s).unwrap();
    let mut all = Vec::new();
    keys(&v, &mut all);
    for k in ["supplyBefore", "supplyAfter", "keptBusy", "mig"] {
        assert!(all.iter().any(|a| a == k), "{k} missing in {v:#}");
    }
    let bad: Vec<&String> =
        all.iter().filter(|k| k.contains('_') || k.starts_with(|c: char| c.is_ascii_uppercase())).collect();
    assert!(bad.is_empty(), "not camelCase: {bad:?} in {v:#}");
}

/// A node running a pod that holds a GPU through a ResourceClaim is busy, as the
/// controller's automatic layouts treat it; a claim of another driver's device is no GPU. Read
/// from `--from` files, as CI passes them.
#[test]
fn a_node_with_a_pod_holding_a_gpu_through_a_claim_is_busy() {
    let seven: &[(&str, i32)] = &[("7g.80gb", 0)];
    let claim_pod = |name: &str, node: &str, claim: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ml"},
            "spec": {"nodeName": node, "containers": [{"name": "c"}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]},
            "status": {"phase": "Running"}})
    };
    let claim = |name: &str, driver: &str, pool: &str, device: &str| {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ml"}, "spec": {},
            "status": {"allocation": {"devices": {"results": [
                {"request": "r", "driver": driver, "pool": pool, "device": device}]}}}})
    };
    let docs = [
        serde_json::to_value(quota("t", "ml", json!({MIG1G: 7}))).unwrap(),
        serde_json::to_value(gpunode("n1", &[Some(seven)])).unwrap(),
        serde_json::to_value(gpunode("n2", &[Some(seven)])).unwrap(),
        claim_pod("trainer", "n2", "c-gpu"),
        claim("c-gpu", "gpu.nvidia.com", "n2", "gpu-0-mig-0-0-8"),
        claim_pod("web", "n1", "c-nic"),
        claim("c-nic", "nic.example.com", "n1", "eth-0"),
    ];
    let text: Vec<String> = docs.iter().map(|d| serde_json::to_string(d).unwrap()).collect();
    let dir = std::env::temp_dir().join(format!("tessera-suggest-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("claims.yaml");
    std::fs::write(&file, text.join("\n---\n")).unwrap();
    let inputs = from_files(&[file.to_string_lossy().into_owned()], &GpuDrivers::default()).unwrap();
    assert_eq!(inputs.busy_nodes, [("n2".to_string(), vec!["ml/trainer".to_string()])].into());
    let s = suggest(&inputs, &Scope::Fleet { selector: LabelSelector::default(), headroom: 0 }).unwrap();
    assert!(s.answer.gpus.iter().filter(|g| g.node == "n2").all(|g| !g.changed), "{:?}", s.answer.gpus);
    assert!(s.answer.gpus.iter().any(|g| g.node == "n1" && g.changed), "{:?}", s.answer.gpus);
    assert_eq!(s.kept_busy, inputs.busy_nodes);
}
