//! The shipped pod policy `tessera-gpu-pods`, evaluated with a CEL interpreter: match constraints
//! (resource rules) and conditions, variables in order, then each validation and its message.
//! The real API server runs it in `e2e/tests/quota.rs`.

use std::collections::HashMap;
use std::sync::Arc;

use cel::common::types::{CelInt, DYN_TYPE, LIST_TYPE};
use cel::common::value::CowVal;
use serde_json::{Value, json};

use super::policy_match::constrained_to;

fn to_cel(v: &Value) -> cel::Value {
    match v {
        Value::Number(n) => cel::Value::Int(n.as_i64().expect("test numbers are integers")),
        Value::Object(o) => cel::Value::from(o.iter().map(|(k, v)| (k.clone(), to_cel(v))).collect::<HashMap<_, _>>()),
        Value::Array(a) => cel::Value::List(Arc::new(a.iter().map(to_cel).collect())),
        other => cel::to_value(other).unwrap(),
    }
}

/// Kubernetes' list `indexOf` (the interpreter has only the strings one): the first index of
/// an element equal to the argument, or -1.
fn list_index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, cel::ExecutionError> {
    let [list, item] = args.as_slice() else {
        return Err(cel::ExecutionError::invalid_argument_count(2, args.len()));
    };
    let mut items =
        list.as_ref().as_iterable().ok_or_else(|| cel::ExecutionError::function_error("indexOf", "not a list"))?.iter();
    let mut i = 0;
    while let Some(x) = items.next() {
        if x.equals(item.as_ref()) {
            return Ok(CowVal::owned(CelInt::from(i)));
        }
        i += 1;
    }
    Ok(CowVal::owned(CelInt::from(-1)))
}

/// The shipped policy `name` (`tessera-gpu-pods` or `tessera-claim-classes`).
pub(super) fn shipped_policy(name: &str) -> Value {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(include_str!("../../../../config/rbac/claim-classes.yaml")).unwrap();
    let p = docs.into_iter().find(|d| d["kind"] == "ValidatingAdmissionPolicy" && d["metadata"]["name"] == name);
    p.unwrap_or_else(|| panic!("the manifest ships {name}"))
}

/// The UID of every namespace the tests admit into (unless a test says otherwise).
pub(super) const NS_UID: &str = "uid-now";

/// `None`: admitted (not matched, or every validation holds); `Some(message)`: refused.
fn admit(pod: &Value, ns: &str, data: &Value) -> Option<String> {
    evaluate("tessera-gpu-pods", pod, &pod_create(ns), data, NS_UID)
}

/// The API server's request to create a pod in `ns`.
pub(super) fn pod_create(ns: &str) -> Value {
    json!({"namespace": ns, "operation": "CREATE", "resource": {"group": "", "version": "v1", "resource": "pods"}})
}

/// Runs policy `name` on `object` as the API server would for `request` in a namespace whose
/// UID is `ns_uid`, with params `data`.
pub(super) fn evaluate(name: &str, object: &Value, request: &Value, data: &Value, ns_uid: &str) -> Option<String> {
    evaluate_update(name, object, &Value::Null, request, data, ns_uid)
}

/// [`evaluate`] with `oldObject` (an UPDATE's object before the write; `Null` for a CREATE).
pub(super) fn evaluate_update(
    name: &str,
    object: &Value,
    old: &Value,
    request: &Value,
    data: &Value,
    ns_uid: &str,
) -> Option<String> {
    evaluate_spec(&shipped_policy(name)["spec"], object, old, request, data, ns_uid)
}

/// [`evaluate_update`] of a policy's `spec`.
fn evaluate_spec(
    spec: &Value,
    object: &Value,
    old: &Value,
    request: &Value,
    data: &Value,
    ns_uid: &str,
) -> Option<String> {
    let mut env = cel::Env::stdlib();
    env.add_extension(cel::extensions::strings).unwrap();
    env.add_member_overload("indexOf", "list_index_of", LIST_TYPE, vec![DYN_TYPE], list_index_of).unwrap();
    let env = Arc::new(env);
    let namespace = json!({"metadata": {"name": request["namespace"].clone(), "uid": ns_uid}});
    let context = |vars: &HashMap<String, cel::Value>| {
        let mut ctx = cel::Context::with_env(env.clone());
        ctx.add_variable_from_value("object", to_cel(object));
        ctx.add_variable_from_value("oldObject", to_cel(old));
        ctx.add_variable_from_value("request", to_cel(request));
        ctx.add_variable_from_value("namespaceObject", to_cel(&namespace));
        ctx.add_variable_from_value("params", to_cel(&json!({"data": data})));
        ctx.add_variable_from_value("variables", cel::Value::from(vars.clone()));
        ctx
    };
    if !constrained_to(spec, request) {
        return None;
    }
    let mut vars: HashMap<String, cel::Value> = HashMap::new();
    for c in spec["matchConditions"].as_array().into_iter().flatten() {
        let expr = c["expression"].as_str().unwrap();
        let program = env.compile(expr).unwrap_or_else(|e| panic!("{e}: {expr}"));
        let got = program.execute(&context(&vars)).unwrap_or_else(|e| panic!("{e:?}: {expr} on {object}"));
        if got != cel::Value::Bool(true) {
            return None;
        }
    }
    // A variable that fails to evaluate is left out of `variables` and its error kept: as on the
    // API server (variables are lazy), only an expression that reads it fails, with that error.
    let mut failed: Vec<(String, String)> = Vec::new();
    for v in spec["variables"].as_array().into_iter().flatten() {
        let expr = v["expression"].as_str().unwrap();
        let program = env.compile(expr).unwrap_or_else(|e| panic!("{e}: {expr}"));
        let name = v["name"].as_str().unwrap().to_string();
        match program.execute(&context(&vars)) {
            Ok(value) => {
                vars.insert(name, value);
            }
            Err(e) => failed.push((name, format!("{e:?}"))),
        }
    }
    let run = |expr: &str| {
        let program = env.compile(expr).unwrap_or_else(|e| panic!("{e}: {expr}"));
        program.execute(&context(&vars)).map_err(|e| evaluation_error(&e, &failed, expr, object))
    };
    for v in spec["validations"].as_array().unwrap() {
        let held = run(v["expression"].as_str().unwrap()).unwrap_or_else(|e| panic!("{e}"));
        if held != cel::Value::Bool(true) {
            return Some(match run(v["messageExpression"].as_str().unwrap()) {
                Ok(cel::Value::String(s)) => s.to_string(),
                Ok(other) => panic!("a message must be a string, got {other:?}"),
                Err(e) => panic!("{e}"),
            });
        }
    }
    None
}

/// The error of `expr`, naming the variables that failed before it (what it read of them).
fn evaluation_error(e: &cel::ExecutionError, failed: &[(String, String)], expr: &str, object: &Value) -> String {
    let causes: Vec<String> = failed.iter().map(|(n, err)| format!("variables.{n} failed: {err}")).collect();
    format!("{e:?} (after {causes:?}): {expr} on {object}")
}

fn pod(resources: &[&str]) -> Value {
    let requests: serde_json::Map<String, Value> = resources.iter().map(|r| (r.to_string(), json!("1"))).collect();
    json!({"spec": {"containers": [{"name": "c", "resources": {"requests": requests}}]}})
}

/// The pod policy gates only GPU resources (`quota::is_gpu_resource`), not every `nvidia.com/`
/// one, so a pending tenant namespace still admits RDMA pods (`nvidia.com/hostdev`, Network
/// Operator pools).
#[test]
fn the_pod_policy_gates_gpu_resources_only() {
    let pending = json!({"a.quota": "team-a", "_pending": "a"});
    for r in ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/gpu-mps", "nvidia.com/mig-1g.10gb"] {
        assert!(tessera_planner::quota::is_gpu_resource(r), "{r}");
        let refused = admit(&pod(&[r]), "a", &pending).unwrap_or_else(|| panic!("{r} admitted while pending"));
        let want = format!(
            "spec.containers[0].resources.requests[{r}]: namespace a of TenantGpuQuota team-a: its GPU limits \
             (ResourceQuota) are not yet enforced; retry in a few seconds"
        );
        assert_eq!(refused, want);
    }
    for r in ["nvidia.com/hostdev", "nvidia.com/rdma_shared_device_a", "nvidia.com/gpus", "example.com/gpu"] {
        assert!(!tessera_planner::quota::is_gpu_resource(r), "{r}");
        assert_eq!(admit(&pod(&[r]), "a", &pending), None, "{r} is no GPU resource");
    }
    assert_eq!(admit(&pod(&["nvidia.com/gpu"]), "a", &json!({"a.quota": "team-a", "_pending": ""})), None);
}

/// `stash` (class `gpu.nvidia.com`, `All`, unallocated, made before `x` joined `team-a`) is
/// counted, and a pod naming it would get every GPU of a node with no quota check: the pod
/// policy refuses such pods, naming the field, claim, class and quota.
#[test]
fn a_pod_naming_a_listed_claim_is_refused() {
    let data = json!({"x.quota": "team-a", "_pending": "", "x.claims": "stash:gpu.nvidia.com other:c"});
    let naming = |name: &str| {
        json!({"spec": {"containers": [{"name": "c"}], "resourceClaims": [
            {"name": "t", "resourceClaimTemplateName": "tpl"}, {"name": "g", "resourceClaimName": name}]}})
    };
    let refused = admit(&naming("stash"), "x", &data).expect("a pod naming stash is refused");
    assert!(
        refused.contains("ResourceClaim stash (class gpu.nvidia.com) is not limited by TenantGpuQuota team-a")
            && refused.contains("delete the claim; claim through Tessera's classes"),
        "{refused}"
    );
    assert_eq!(admit(&naming("mine"), "x", &data), None, "a claim not listed");
    assert_eq!(admit(&naming("stash"), "y", &data), None, "another namespace");
    assert_eq!(admit(&naming("stash"), "x", &json!({"x.quota": "team-a", "_pending": ""})), None, "none listed");
    // A claim-only pod in a pending namespace is the claim policy's business, not refused here.
    let pending = json!({"x.quota": "team-a", "_pending": "x"});
    assert_eq!(admit(&naming("mine"), "x", &pending), None);
    let refused = admit(&pod(&["nvidia.com/gpu"]), "x", &pending).expect("a GPU pod while pending");
    assert!(refused.starts_with("spec.containers[0].resources.requests[nvidia.com/gpu]: namespace x of"), "{refused}");
}

/// Under `unlisted: Zero` a GPU resource no node advertises yet (time-slicing not yet enabled, a
/// MIG profile of a board outside the catalog) has no ResourceQuota key, so a pod asking for it
/// would be admitted and bound once nodes advertised it. It is refused where the params list the
/// quota's limited resources (`<quota>.resources`).
#[test]
fn under_unlisted_zero_a_gpu_resource_no_resource_quota_limits_is_refused() {
    let data =
        json!({"x.quota": "team-b", "_pending": "", "team-b.resources": "nvidia.com/gpu nvidia.com/mig-1g.10gb"});
    let refused = admit(&pod(&["nvidia.com/gpu.shared"]), "x", &data).expect("gpu.shared is limited by nothing");
    assert!(
        refused.contains(
            "spec.containers[0].resources.requests[nvidia.com/gpu.shared]: namespace x of TenantGpuQuota team-b \
             (unlisted: Zero)"
        ),
        "{refused}"
    );
    let init = json!({"spec": {"containers": [{"name": "c"}],
        "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/mig-7g.80gb": "1"}}}]}});
    let refused = admit(&init, "x", &data).expect("mig-7g.80gb is limited by nothing");
    assert!(
        refused.starts_with("spec.initContainers[0].resources.limits[nvidia.com/mig-7g.80gb]: namespace x of"),
        "{refused}"
    );
    for ok in [&["nvidia.com/gpu"][..], &["nvidia.com/mig-1g.10gb", "nvidia.com/hostdev"], &["example.com/x"]] {
        assert_eq!(admit(&pod(ok), "x", &data), None, "{ok:?}");
    }
    let unlimited = json!({"x.quota": "team-b", "_pending": ""});
    assert_eq!(admit(&pod(&["nvidia.com/gpu.shared"]), "x", &unlimited), None, "not Zero: unlimited");
}

/// A tenant namespace deleted and created again while the operator is down has no
/// ResourceQuota, though the params still call it enforced. The params carry its UID: a
/// mismatch with the namespace's UID refuses GPU pods, naming the cause. Params with
/// no `<ns>.uid` (an older operator's) are not checked.
#[test]
fn a_namespace_created_again_while_the_operator_is_down_refuses_gpu_pods() {
    let old = json!({"a.quota": "team-a", "_pending": "", "a.uid": "uid-before"});
    let refused = admit(&pod(&["nvidia.com/gpu"]), "a", &old).expect("the re-created namespace is pending");
    assert!(
        refused.contains("namespace a of TenantGpuQuota team-a: the namespace was deleted and created again")
            && refused.contains("retry once the operator has run"),
        "{refused}"
    );
    // The tombstone of a namespace gone from the operator's cache (`pod_gate::tombstone`).
    let gone = json!({"a.quota": "team-a", "_pending": "", "a.uid": tessera_planner::quota::pod_gate::ABSENT});
    let refused = admit(&pod(&["nvidia.com/gpu"]), "a", &gone).expect("created under a tombstone: pending");
    assert!(refused.contains("the namespace was deleted and created again"), "{refused}");
    let current = json!({"a.quota": "team-a", "_pending": "", "a.uid": NS_UID});
    assert_eq!(admit(&pod(&["nvidia.com/gpu"]), "a", &current), None, "the same namespace");
    assert_eq!(admit(&pod(&["nvidia.com/gpu"]), "a", &json!({"a.quota": "team-a", "_pending": ""})), None, "no key");
    assert_eq!(admit(&pod(&["nvidia.com/hostdev"]), "a", &old), None, "no GPU resource");
    assert_eq!(admit(&pod(&["nvidia.com/gpu"]), "b", &old), None, "another namespace");
}

/// With two quotas claiming `x` (`<ns>.quota` is `team-b team-c`), or an invalid quota (its
/// `<quota>.resources` dropped), the Zero check finds no key, so `<ns>.limited` answers per
/// namespace, first: GPU resources no ResourceQuota limits are refused.
#[test]
fn a_conflicted_or_invalid_namespace_refuses_gpu_resources_no_resource_quota_limits() {
    let conflict = json!({"x.quota": "team-b team-c", "_pending": "", "team-b.resources": "nvidia.com/gpu.shared",
        "x.limited": "nvidia.com/gpu nvidia.com/mig-1g.10gb"});
    let refused = admit(&pod(&["nvidia.com/gpu.shared"]), "x", &conflict).expect("gpu.shared is limited by nothing");
    assert!(
        refused.contains(
            "spec.containers[0].resources.requests[nvidia.com/gpu.shared]: namespace x of TenantGpuQuota team-b team-c \
             (unlisted: Zero in a conflict, or an invalid quota): no ResourceQuota limits this GPU resource"
        ),
        "{refused}"
    );
    assert_eq!(admit(&pod(&["nvidia.com/mig-1g.10gb"]), "x", &conflict), None);
    let nothing = json!({"x.quota": "team-b", "_pending": "", "x.limited": ""});
    let refused = admit(&pod(&["nvidia.com/gpu"]), "x", &nothing).expect("no GPU resource limited: all refused");
    assert!(refused.starts_with("spec.containers[0].resources.requests[nvidia.com/gpu]: namespace x"), "{refused}");
    assert!(refused.contains("no ResourceQuota limits this GPU resource"), "{refused}");
    assert_eq!(admit(&pod(&["nvidia.com/hostdev"]), "x", &nothing), None);
}

/// A namespace pending because both ResourceQuota names are taken does not say "retry in a few
/// seconds", which never helps: `<ns>.pending` holds the cause; the message names it.
#[test]
fn a_namespace_pending_for_taken_names_says_why() {
    let why = "ResourceQuotas tessera-team-a and tessera-team-a-12345678 there are not TenantGpuQuota team-a's";
    let data = json!({"a.quota": "team-a", "_pending": "a", "a.pending": why});
    let refused = admit(&pod(&["nvidia.com/gpu"]), "a", &data).expect("pending");
    assert!(refused.ends_with(&format!("namespace a of TenantGpuQuota team-a: {why}")), "{refused}");
    let waiting = admit(&pod(&["nvidia.com/gpu"]), "a", &json!({"a.quota": "team-a", "_pending": "a"})).unwrap();
    assert!(waiting.ends_with("not yet enforced; retry in a few seconds"), "{waiting}");
}

/// `<ns>.claims` is capped (past 1 MiB every params write fails). Past the cap the params say
/// `_all`: every pod naming an existing ResourceClaim there is refused, saying why.
#[test]
fn past_the_claims_cap_every_pod_naming_a_claim_is_refused() {
    let data = json!({"x.quota": "team-a", "_pending": "", "x.claims": "_all"});
    let naming = json!({"spec": {"containers": [{"name": "c"}],
        "resourceClaims": [{"name": "g", "resourceClaimName": "mine"}]}});
    let refused = admit(&naming, "x", &data).expect("refused past the cap");
    assert!(
        refused.contains("namespace x of TenantGpuQuota team-a holds more unallocated ResourceClaims")
            && refused.contains("no pod may name an existing ResourceClaim here"),
        "{refused}"
    );
    let template = json!({"spec": {"containers": [{"name": "c"}],
        "resourceClaims": [{"name": "g", "resourceClaimTemplateName": "t"}]}});
    assert_eq!(admit(&template, "x", &data), None, "a template makes a new claim: the claim policy checks it");
    assert_eq!(admit(&naming, "y", &data), None, "another namespace");
}

/// A pod naming an admin-access claim of a GPU class, made before its namespace joined the
/// quota, would see GPUs other tenants hold. Listed in `<ns>.claims` by the operator, it is
/// refused, the message naming the claim and the cause.
#[test]
fn a_pod_naming_an_admin_access_claim_of_a_gpu_class_is_refused() {
    let watch: k8s_openapi::api::resource::v1::ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "watch", "namespace": "x"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "mig.nvidia.com",
                                                                    "adminAccess": true}}]}}}))
    .unwrap();
    let view = tessera_planner::quota::claims::ClassView::default();
    let listed = tessera_planner::quota::unallocated::admin_access([&watch], &view);
    let mut data = json!({"x.quota": "team-a", "_pending": ""});
    for (k, v) in tessera_planner::quota::unallocated::policy_claims(&[], &listed, &[], ["x"]) {
        data[k] = json!(v);
    }
    let pod = json!({"spec": {"containers": [{"name": "c"}], "resourceClaims": [
        {"name": "g", "resourceClaimName": "watch"}]}});
    let refused = admit(&pod, "x", &data).expect("a pod naming watch is refused");
    assert!(
        refused.contains(
            "ResourceClaim watch (class mig.nvidia.com,adminAccess) of namespace x (TenantGpuQuota team-a) asks \
             for admin access to GPU devices"
        ),
        "{refused}"
    );
}

/// A listed admin-access claim does not get the unallocated claim's message ("made before the
/// namespace joined it ... it would be allocated with no quota check"), which is not its cause
/// and asks for a Tessera class no admin could use. It has its own: the claim sees GPUs other
/// tenants hold. The claim's params entry (`<claim>:<class>,adminAccess`) stays in the message.
#[test]
fn an_admin_access_claim_is_refused_with_its_own_cause() {
    let data = json!({"x.quota": "team-a", "_pending": "", "x.claims": "stash:gpu.nvidia.com watch:mig.nvidia.com,adminAccess"});
    let naming = |name: &str| {
        json!({"spec": {"containers": [{"name": "c"}], "resourceClaims": [
            {"name": "t", "resourceClaimTemplateName": "tpl"}, {"name": "g", "resourceClaimName": name}]}})
    };
    let refused = admit(&naming("watch"), "x", &data).expect("a pod naming watch is refused");
    assert_eq!(
        refused,
        "spec.resourceClaims[1].resourceClaimName: ResourceClaim watch (class mig.nvidia.com,adminAccess) of \
         namespace x (TenantGpuQuota team-a) asks for admin access to GPU devices: a pod using it would see GPUs \
         other tenants hold; delete the claim, or ask an administrator"
    );
    let stash = admit(&naming("stash"), "x", &data).expect("a pod naming stash is refused");
    assert!(stash.contains("it would be allocated with no quota check") && !stash.contains("admin access"), "{stash}");
}

/// Found on the real API server (1.37): it types `namespaceObject` with a fixed schema whose UID
/// field is `UID`, while the value it evaluates is the namespace's JSON (`uid`). So
/// `namespaceObject.metadata.uid` is refused at creation (undefined field) and
/// `namespaceObject.metadata.UID` fails every request at runtime (no such key): with
/// failurePolicy Fail, every GPU pod refused. The interpreter here sees neither; this guards
/// each shipped expression: the UID only through `dyn(namespaceObject)`, other fields only
/// where the declared name is the JSON one.
#[test]
fn shipped_policies_read_the_namespace_uid_the_way_the_api_server_types_it() {
    // Kubernetes' BuildNamespaceType metadata fields whose name is also the JSON key.
    const TYPED: [&str; 11] = [
        "name",
        "generateName",
        "namespace",
        "labels",
        "annotations",
        "creationTimestamp",
        "deletionGracePeriodSeconds",
        "deletionTimestamp",
        "generation",
        "resourceVersion",
        "finalizers",
    ];
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(include_str!("../../../../config/rbac/claim-classes.yaml")).unwrap();
    let mut exprs = Vec::new();
    for d in docs.iter().filter(|d| d["kind"] == "ValidatingAdmissionPolicy") {
        let spec = &d["spec"];
        for list in ["matchConditions", "variables", "validations"] {
            for e in spec[list].as_array().into_iter().flatten() {
                for key in ["expression", "messageExpression"] {
                    if let Some(s) = e[key].as_str() {
                        exprs.push((d["metadata"]["name"].as_str().unwrap().to_string(), s.to_string()));
                    }
                }
            }
        }
    }
    let mut uid_reads = 0;
    for (policy, expr) in &exprs {
        uid_reads += expr.matches("dyn(namespaceObject).metadata.uid").count();
        for (at, _) in expr.match_indices("namespaceObject.metadata.") {
            if at >= 4 && &expr[at - 4..at] == "dyn(" {
                continue;
            }
            let field: String = expr[at + "namespaceObject.metadata.".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            assert!(TYPED.contains(&field.as_str()), "{policy}: namespaceObject.metadata.{field} in {expr}");
        }
    }
    assert_eq!(uid_reads, 2, "both policies compare the namespace's UID");
}

/// An expression reading a variable that failed to evaluate fails with its error, as on the API
/// server; one that does not read it is unaffected (variables are lazy there too). Read as the
/// string `"<name>"`, `size(variables.asks) > 0` would hold on a broken expression and the
/// policy "refuse" for the wrong reason.
#[test]
fn a_variable_that_fails_fails_what_reads_it() {
    let spec = |validation: &str| {
        json!({"variables": [{"name": "broken", "expression": "object.spec.nope.missing"}],
               "validations": [{"expression": validation, "messageExpression": "'refused'"}]})
    };
    let run = |validation: &str| {
        let spec = spec(validation);
        std::panic::catch_unwind(|| {
            evaluate_spec(&spec, &json!({"spec": {}}), &Value::Null, &json!({}), &json!({}), NS_UID)
        })
    };
    let read = run("size(variables.broken) == 0").expect_err("reading the broken variable must fail");
    let why = read.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(why.contains("variables.broken failed"), "{why}");
    assert_eq!(run("true").ok(), Some(None), "a validation not reading it holds");
    assert_eq!(run("false").ok(), Some(Some("refused".to_string())));
}
