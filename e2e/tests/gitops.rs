//! GitOps health: the Argo CD Lua script and the Flux CEL health checks in `config/gitops/`,
//! evaluated against statuses produced by the operator's and the agent's own status functions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};
use tessera_planner::rollout::PlanReport;

fn now() -> Time {
    Time("2026-06-01T00:00:00Z".parse().unwrap())
}

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)).unwrap()
}

/// Runs config/gitops/argocd/health.lua as Argo CD does: the object as global `obj`.
fn argo(obj: &Value) -> (String, String) {
    use mlua::LuaSerdeExt;
    let lua = mlua::Lua::new();
    lua.globals().set("obj", lua.to_value(obj).unwrap()).unwrap();
    let hs: mlua::Table = lua.load(repo_file("config/gitops/argocd/health.lua")).eval().unwrap();
    (hs.get("status").unwrap(), hs.get("message").unwrap())
}

/// Evaluates the Flux healthCheckExprs for the object's kind in Flux's order.
fn flux(obj: &Value) -> &'static str {
    let doc: Value = serde_saphyr::from_str(&repo_file("config/gitops/flux/kustomization.yaml")).unwrap();
    let exprs = doc["spec"]["healthCheckExprs"].as_array().unwrap();
    let e = exprs.iter().find(|e| e["kind"].as_str() == obj["kind"].as_str()).expect("an entry for the kind");
    let mut ctx = cel::Context::default();
    for var in ["status", "metadata", "spec"] {
        ctx.add_variable_from_value(var, cel::to_value(&obj[var]).unwrap());
    }
    let eval = |key: &str| -> bool {
        let src = e[key].as_str().unwrap();
        let program = cel::Program::compile(src).unwrap_or_else(|err| panic!("{key}: {err:?}"));
        match program.execute(&ctx) {
            Ok(cel::Value::Bool(b)) => b,
            other => panic!("{key} did not evaluate to a bool: {other:?}"),
        }
    };
    if eval("inProgress") {
        "InProgress"
    } else if eval("failed") {
        "Failed"
    } else if eval("current") {
        "Current"
    } else {
        "Unknown"
    }
}

fn plan_obj(report: PlanReport, generation: i64, observed: i64, paused: bool) -> Value {
    let status = tessera_planner::status::plan_status(&[], &report, Some(observed), paused, now());
    json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan",
           "metadata": {"name": "p", "generation": generation}, "spec": {"paused": paused}, "status": status})
}

#[test]
fn plan_health_follows_the_operators_conditions() {
    let rolling = PlanReport { matched: 3, updated: 1, in_progress: 1, pending: 1, ..Default::default() };
    let done = PlanReport { matched: 3, updated: 3, ..Default::default() };
    let invalid =
        PlanReport { matched: 1, invalid: vec!["n1: the layout for GPU 0 does not fit".into()], ..Default::default() };
    let timeout = PlanReport {
        matched: 2,
        in_progress: 1,
        updated: 1,
        drain_timeouts: vec!["n2: drain exceeded 600s".into()],
        ..Default::default()
    };
    let paused = PlanReport { matched: 2, updated: 1, pending: 1, ..Default::default() };
    let table = [
        (plan_obj(rolling, 1, 1, false), "Progressing", "InProgress"),
        (plan_obj(done.clone(), 1, 1, false), "Healthy", "Current"),
        (plan_obj(invalid, 1, 1, false), "Degraded", "Failed"),
        (plan_obj(timeout, 1, 1, false), "Degraded", "Failed"),
        (plan_obj(paused, 1, 1, true), "Suspended", "InProgress"),
        (plan_obj(done, 2, 1, false), "Progressing", "InProgress"),
    ];
    for (i, (obj, want_argo, want_flux)) in table.iter().enumerate() {
        let (status, message) = argo(obj);
        assert_eq!(status, *want_argo, "row {i}: {message}");
        assert_eq!(flux(obj), *want_flux, "row {i}");
    }
    let (_, message) = argo(&table[2].0);
    assert!(message.starts_with("InvalidLayout: n1: the layout for GPU 0 does not fit"), "{message}");
}

fn quota_status(spec: Value, fleet_slices: usize) -> Value {
    let q: tessera_crds::TenantGpuQuota =
        serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "metadata": {"name": "q", "generation": 1}, "spec": spec}))
            .unwrap();
    let inst: Vec<Value> = (0..fleet_slices).map(|i| json!({"profile": "1g.10gb", "start": i, "size": 1})).collect();
    let gn: tessera_crds::GpuNode = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": "n"}, "spec": {}, "status": {"gpus": [{"index": 0, "uuid": "u", "product": "NVIDIA H100 80GB HBM3",
        "migEnabled": true, "instances": inst}]}}))
    .unwrap();
    let ns = ["a".to_string()].into_iter().collect();
    let plan = tessera_planner::quota::plan_quotas(std::slice::from_ref(&q), &ns, &[], &[gn], now());
    let mut obj = serde_json::to_value(&q).unwrap();
    obj["status"] = serde_json::to_value(&plan.statuses["q"]).unwrap();
    obj
}

#[test]
fn quota_health_follows_the_operators_conditions() {
    let ok = quota_status(json!({"namespaces": ["a"], "hard": {"nvidia.com/mig-1g.10gb": 4}}), 7);
    assert_eq!(argo(&ok).0, "Healthy");
    assert_eq!(flux(&ok), "Current");
    let over = quota_status(json!({"namespaces": ["a"], "hard": {"nvidia.com/mig-1g.10gb": 9}}), 7);
    let (status, message) = argo(&over);
    assert_eq!(status, "Healthy", "over-commitment is reported, the quota itself is enforced");
    assert_eq!(message, "over-committed: nvidia.com/mig-1g.10gb: quotas 9, fleet 7, short 2");
    let invalid = quota_status(json!({"namespaces": ["a"], "hard": {"nvidia.com/mig-1g.10g": 4}}), 7);
    assert_eq!(argo(&invalid).0, "Degraded");
    assert_eq!(flux(&invalid), "Failed");
}

#[test]
fn gpu_node_health_follows_the_agents_conditions() {
    use tessera_node_agent::report::{GpuOutcome, conditions};
    let obj = |outcomes: &[(u32, GpuOutcome)], generation: i64| {
        let (conds, applied) = conditions(&[], outcomes, Some(generation), Some(generation - 1), now());
        json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "metadata": {"name": "n", "generation": generation},
               "spec": {}, "status": {"observedGeneration": applied, "conditions": conds}})
    };
    assert_eq!(argo(&obj(&[(0, GpuOutcome::InSync)], 2)).0, "Healthy");
    let busy = GpuOutcome::Blocked { reason: "InstanceInUse", message: "pid 7".into() };
    let (status, message) = argo(&obj(&[(0, busy)], 2));
    assert_eq!(status, "Degraded", "a stuck agent shows, although its applied generation lags");
    assert_eq!(message, "InstanceInUse: GPU 0: pid 7");
    let failing = GpuOutcome::Failed { message: "NVML: timeout".into() };
    let (status, message) = argo(&obj(&[(0, failing)], 2));
    assert_eq!(status, "Progressing", "a retried failure is still progress");
    assert!(message.contains("NVML: timeout"), "{message}");
}

#[test]
fn the_argocd_configmap_embeds_the_same_script() {
    let cm: Value = serde_saphyr::from_str(&repo_file("config/gitops/argocd/argocd-cm.yaml")).unwrap();
    let script = repo_file("config/gitops/argocd/health.lua");
    for kind in ["GpuPartitionPlan", "TenantGpuQuota", "GpuNode"] {
        let key = format!("resource.customizations.health.tessera.dev_{kind}");
        assert_eq!(cm["data"][key.as_str()].as_str().map(str::trim), Some(script.trim()), "{kind}");
    }
}
