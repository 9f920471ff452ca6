use serde_json::{Value, json};
use tessera_crds::TenantGpuQuota;
use tessera_crds::conditions::find;

use crate::quota_controller::QuotaController;
use crate::quota_controller::test_support::{Requests, store_of};

/// The shipped claim-class manifest's documents, by kind.
fn shipped(kind: &str) -> Value {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(include_str!("../../../../config/rbac/claim-classes.yaml")).unwrap();
    docs.into_iter().find(|d| d["kind"] == kind).unwrap()
}

/// An API server that answers the binding and the policy with what is in `objects` (a 404 where
/// `None`) and accepts every write, recording each request.
fn api(objects: Objects) -> (kube::Client, Requests) {
    api_with(objects, None)
}

/// The binding and the policy an API server answers with (`None`: 404).
type Objects = std::sync::Arc<std::sync::Mutex<(Option<Value>, Option<Value>)>>;

/// [`api`], also answering the pod policy and its binding from `pods` where given.
fn api_with(objects: Objects, pods: Option<Objects>) -> (kube::Client, Requests) {
    api_with_names(objects, pods, None)
}

/// [`api_with`], also answering the quota-name policy and its binding from `names` where given.
fn api_with_names(objects: Objects, pods: Option<Objects>, names: Option<Objects>) -> (kube::Client, Requests) {
    let mut served = vec![("tessera-claim-classes", objects)];
    served.extend(pods.map(|p| ("tessera-gpu-pods", p)));
    served.extend(names.map(|n| ("tessera-quota-names", n)));
    api_serving(served, None)
}

/// The shipped binding and policy named `name`.
fn shipped_pair(name: &str) -> Objects {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(include_str!("../../../../config/rbac/claim-classes.yaml")).unwrap();
    let doc = |kind: &str| docs.iter().find(|d| d["kind"] == kind && d["metadata"]["name"] == name).cloned();
    let pair = (doc("ValidatingAdmissionPolicyBinding"), doc("ValidatingAdmissionPolicy"));
    assert!(pair.0.is_some() && pair.1.is_some(), "{name} is shipped");
    std::sync::Arc::new(std::sync::Mutex::new(pair))
}

/// Every policy the operator checks.
const CHECKED: [&str; 4] = ["tessera-claim-classes", "tessera-gpu-pods", "tessera-gpu-bindings", "tessera-quota-names"];

/// An API server answering each checked policy's binding and policy from `served` (`None`: 404),
/// those not in it as shipped, and every read of the objects named `forbidden` with 403 (no RBAC);
/// it accepts every write, recording each request.
fn api_serving(served: Vec<(&'static str, Objects)>, forbidden: Option<&'static str>) -> (kube::Client, Requests) {
    let mut all: std::collections::BTreeMap<&'static str, Objects> = served.into_iter().collect();
    for name in CHECKED {
        all.entry(name).or_insert_with(|| shipped_pair(name));
    }
    let requests = Requests::default();
    let seen = requests.clone();
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let (seen, all) = (seen.clone(), all.clone());
        async move {
            let (parts, body) = req.into_parts();
            let body: Value = serde_json::from_slice(&body.collect_bytes().await.unwrap()).unwrap_or_default();
            let (method, path) = (parts.method.to_string(), parts.uri.path().to_string());
            seen.lock().unwrap().push((method.clone(), path.clone(), body.clone()));
            let not_found = json!({"kind": "Status", "apiVersion": "v1", "code": 404, "reason": "NotFound"});
            let refused = json!({"kind": "Status", "apiVersion": "v1", "code": 403, "reason": "Forbidden",
                "message": "validatingadmissionpolicies is forbidden: User cannot get resource"});
            let found = |o: Option<Value>| o.map_or((404, not_found.clone()), |o| (200, o));
            let group = "/apis/admissionregistration.k8s.io/v1/";
            let read = path.strip_prefix(group).and_then(|rest| rest.split_once('/'));
            let (code, answer) = match (method.as_str(), read) {
                ("GET", Some((_, name))) if Some(name) == forbidden => (403, refused),
                ("GET", Some((kind, name))) if all.contains_key(name) => {
                    let (binding, policy) = all[name].lock().unwrap().clone();
                    match kind {
                        "validatingadmissionpolicybindings" => found(binding),
                        _ => found(policy),
                    }
                }
                _ if path.ends_with("/status") => (
                    200,
                    json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
                           "metadata": {"name": "q"}, "spec": {"namespaces": [], "hard": {}}}),
                ),
                _ => (200, body),
            };
            let bytes = serde_json::to_vec(&answer).unwrap();
            Ok::<_, std::convert::Infallible>(
                http::Response::builder().status(code).body(kube::client::Body::from(bytes)).unwrap(),
            )
        }
    });
    (kube::Client::new(service, "default"), requests)
}

/// A policy the operator cannot read (RBAC) makes `ClaimPolicyBound` `Unknown`, naming it: not
/// `True`, since it may be deleted or edited. The binding policy was left out of the ClusterRole
/// once, and its check was skipped while the condition said `True`.
#[tokio::test]
async fn a_policy_the_operator_cannot_read_is_reported_unknown_not_bound() {
    let q = quota_b();
    for name in CHECKED {
        let (client, requests) = api_serving(vec![], Some(name));
        let c = QuotaController::from_stores(client, store_of(vec![q.clone()]), store_of(vec![]), store_of(vec![]));
        let _ = c.reconcile().await;
        let (status, reason, message) = last_condition(&requests);
        assert_eq!((status.as_str(), reason.as_str()), ("Unknown", "PolicyNotReadable"), "{name}: {message}");
        assert!(message.contains(&format!(" {name} could not be read")), "{name}: {message}");
    }
    // Every one readable and as shipped: Bound.
    let (client, requests) = api_serving(vec![], None);
    let c = QuotaController::from_stores(client, store_of(vec![q.clone()]), store_of(vec![]), store_of(vec![]));
    let _ = c.reconcile().await;
    let (status, reason, message) = last_condition(&requests);
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Bound"), "{message}");
    // One unreadable and another deleted: False, naming both.
    let gone = shipped_pair("tessera-gpu-bindings");
    gone.lock().unwrap().1 = None;
    let (client, requests) = api_serving(vec![("tessera-gpu-bindings", gone)], Some("tessera-gpu-pods"));
    let c = QuotaController::from_stores(client, store_of(vec![q]), store_of(vec![]), store_of(vec![]));
    let _ = c.reconcile().await;
    let (status, reason, message) = last_condition(&requests);
    assert_eq!((status.as_str(), reason.as_str()), ("False", "PolicyNotEnforcing"), "{message}");
    assert!(message.contains("ValidatingAdmissionPolicy tessera-gpu-bindings not found"), "{message}");
    assert!(message.contains("tessera-gpu-pods could not be read"), "{message}");
}

/// The binding policy is checked on every pass like the others: deleted, the quotas say so.
#[tokio::test]
async fn a_deleted_binding_policy_is_reported_on_the_quotas() {
    let gone = shipped_pair("tessera-gpu-bindings");
    gone.lock().unwrap().1 = None;
    let (client, requests) = api_serving(vec![("tessera-gpu-bindings", gone.clone())], None);
    let c = QuotaController::from_stores(client, store_of(vec![quota_b()]), store_of(vec![]), store_of(vec![]));
    let _ = c.reconcile().await;
    let (status, reason, message) = last_condition(&requests);
    assert_eq!((status.as_str(), reason.as_str()), ("False", "PolicyNotEnforcing"), "{message}");
    assert!(message.contains("ValidatingAdmissionPolicy tessera-gpu-bindings not found"), "{message}");
    *gone.lock().unwrap() = shipped_pair("tessera-gpu-bindings").lock().unwrap().clone();
    let _ = c.reconcile().await;
    let (status, reason, message) = last_condition(&requests);
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Bound"), "{message}");
}

/// The operator's ClusterRole (kustomize and chart) lets it read every policy and binding it checks.
#[test]
fn the_operator_may_read_every_policy_it_checks() {
    for (file, text) in [
        ("config/rbac/operator.yaml", include_str!("../../../../config/rbac/operator.yaml")),
        ("chart rbac-operator.yaml", include_str!("../../../../config/helm/tessera/templates/rbac-operator.yaml")),
    ] {
        let rule = text
            .lines()
            .skip_while(|l| !l.contains("validatingadmissionpolicybindings"))
            .find(|l| l.contains("resourceNames:"))
            .unwrap_or_else(|| panic!("{file}: no resourceNames for the admission policies"));
        for c in [&super::CLAIMS, &super::PODS, &super::BINDINGS, &super::QUOTA_NAMES] {
            assert!(rule.contains(&format!("\"{}\"", c.name)), "{file}: {} is not readable: {rule}", c.name);
        }
    }
}

/// Team B's quota, in ResourceClaims mode.
fn quota_b() -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1",
        "kind": "TenantGpuQuota", "metadata": {"name": "team-b", "uid": "uid-b", "generation": 1},
        "spec": {"namespaces": ["b"], "hard": {"nvidia.com/mig-1g.10gb": 3}, "allocation": "ResourceClaims"}}))
    .unwrap()
}

/// `ClaimPolicyBound` as the last status write of the quota says it.
fn last_condition(requests: &Requests) -> (String, String, String) {
    let requests = requests.lock().unwrap();
    let path = "/apis/tessera.dev/v1alpha1/tenantgpuquotas/team-b/status";
    let (_, _, body) = requests.iter().rev().find(|(m, p, _)| m == "PATCH" && p == path).expect("status written");
    let st: tessera_crds::quota::TenantGpuQuotaStatus = serde_json::from_value(body["status"].clone()).unwrap();
    let c = find(&st.conditions, "ClaimPolicyBound").expect("ClaimPolicyBound").clone();
    (c.status, c.reason, c.message)
}

/// The policy itself edited (`failurePolicy: Ignore`) while its binding still reads our params
/// must not leave `ClaimPolicyBound=True`: the controller reads the policy each pass, so the
/// edit is named, and putting it back turns the condition True again.
#[tokio::test]
async fn an_edited_claim_policy_is_reported_each_pass_and_cleared_when_restored() {
    let q: TenantGpuQuota = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1",
        "kind": "TenantGpuQuota", "metadata": {"name": "team-b", "uid": "uid-b", "generation": 1},
        "spec": {"namespaces": ["b"], "hard": {"nvidia.com/mig-1g.10gb": 3}, "allocation": "ResourceClaims"}}))
    .unwrap();
    let mut ignoring = shipped("ValidatingAdmissionPolicy");
    ignoring["spec"]["failurePolicy"] = json!("Ignore");
    let objects =
        std::sync::Arc::new(std::sync::Mutex::new((Some(shipped("ValidatingAdmissionPolicyBinding")), Some(ignoring))));
    let (client, requests) = api(objects.clone());
    let c = QuotaController::from_stores(client, store_of(vec![q]), store_of(vec![]), store_of(vec![]));
    let _ = c.reconcile().await;
    let (status, reason, message) = last_condition(&requests);
    assert_eq!((status.as_str(), reason.as_str()), ("False", "PolicyNotEnforcing"), "{message}");
    assert!(message.contains("spec.failurePolicy is Ignore"), "{message}");

    objects.lock().unwrap().1 = Some(shipped("ValidatingAdmissionPolicy"));
    let _ = c.reconcile().await;
    let (status, reason, message) = last_condition(&requests);
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Bound"), "{message}");

    objects.lock().unwrap().1 = None;
    let _ = c.reconcile().await;
    let (status, _, message) = last_condition(&requests);
    assert_eq!(status, "False");
    assert!(message.contains("ValidatingAdmissionPolicy tessera-claim-classes not found"), "{message}");
}

fn policy(v: Value) -> k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy {
    serde_json::from_value(v).unwrap()
}

fn binding(v: Value) -> k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding {
    serde_json::from_value(v).unwrap()
}

/// The shipped policy and binding, and the chart's policy, enforce; a cluster's defaults (empty
/// selectors, `scope: "*"`) change nothing.
#[test]
fn the_shipped_policy_enforces_as_the_api_server_returns_it() {
    let (p, b) = (shipped("ValidatingAdmissionPolicy"), shipped("ValidatingAdmissionPolicyBinding"));
    assert_eq!(super::policy_problems(Some(&policy(p.clone())), &binding(b.clone())), Vec::<String>::new());
    let mut defaulted = p.clone();
    defaulted["spec"]["matchConstraints"]["namespaceSelector"] = json!({});
    defaulted["spec"]["matchConstraints"]["objectSelector"] = json!({});
    defaulted["spec"]["matchConstraints"]["resourceRules"][0]["scope"] = json!("*");
    assert_eq!(super::policy_problems(Some(&policy(defaulted)), &binding(b)), Vec::<String>::new());
    // The chart ships the same policy (its first document; the binding's namespace is templated).
    // (Less the `quotaAdmission: params` condition around the file.)
    let chart = include_str!("../../../../config/helm/tessera/templates/claim-classes.yaml");
    let chart: String = chart.lines().filter(|l| !l.starts_with("{{")).map(|l| format!("{l}\n")).collect();
    let first = chart.split("\n---\n").next().unwrap();
    let chart_policy: Value = serde_saphyr::from_str(first).unwrap();
    assert_eq!(chart_policy, p, "the chart's policy is the kustomize one");
}

/// Each edit that stops the policy from refusing a closed class is named by its field.
#[test]
fn each_edit_that_stops_the_policy_enforcing_is_named_by_its_field() {
    type Edit = fn(&mut Value, &mut Value);
    let cases: &[(&str, Edit, &str)] = &[
        ("failurePolicy Ignore", |p, _| p["spec"]["failurePolicy"] = json!("Ignore"), "spec.failurePolicy is Ignore"),
        (
            "Warn only",
            |_, b| b["spec"]["validationActions"] = json!(["Warn", "Audit"]),
            "spec.validationActions is [\"Warn\", \"Audit\"]",
        ),
        ("another policy", |_, b| b["spec"]["policyName"] = json!("other"), "spec.policyName is other"),
        (
            "binding narrowed",
            |_, b| b["spec"]["matchResources"] = json!({"namespaceSelector": {"matchLabels": {"x": "y"}}}),
            "spec.matchResources.namespaceSelector is set",
        ),
        (
            "templates dropped",
            |p, _| p["spec"]["matchConstraints"]["resourceRules"][0]["resources"] = json!(["resourceclaims"]),
            "do not cover CREATE of resourceclaimtemplates, UPDATE of resourceclaimtemplates",
        ),
        (
            "allocations unchecked",
            |p, _| {
                p["spec"]["matchConstraints"]["resourceRules"][0]["resources"] =
                    json!(["resourceclaims", "resourceclaimtemplates"])
            },
            "do not cover CREATE of resourceclaims/status, UPDATE of resourceclaims/status",
        ),
        (
            "updates dropped",
            |p, _| p["spec"]["matchConstraints"]["resourceRules"][0]["operations"] = json!(["CREATE"]),
            "do not cover UPDATE of resourceclaims, UPDATE of resourceclaimtemplates",
        ),
        (
            "one claim name only",
            |p, _| p["spec"]["matchConstraints"]["resourceRules"][0]["resourceNames"] = json!(["x"]),
            "do not cover CREATE of resourceclaims, UPDATE of resourceclaims, CREATE of",
        ),
        (
            "excluded",
            |p, _| {
                p["spec"]["matchConstraints"]["excludeResourceRules"] =
                    p["spec"]["matchConstraints"]["resourceRules"].clone()
            },
            "spec.matchConstraints.excludeResourceRules is set",
        ),
        (
            "exact versions",
            |p, _| p["spec"]["matchConstraints"]["matchPolicy"] = json!("Exact"),
            "matchPolicy is Exact",
        ),
        (
            "validation rewritten",
            |p, _| p["spec"]["validations"][0]["expression"] = json!("true"),
            "spec.validations[0] differs",
        ),
        (
            "validation dropped",
            |p, _| {
                p["spec"]["validations"].as_array_mut().unwrap().pop();
            },
            "spec.validations[3] is missing",
        ),
        (
            "variable rewritten",
            |p, _| p["spec"]["variables"][8]["expression"] = json!("['mig.nvidia.com']"),
            "spec.variables[8] (allowed) differs",
        ),
        (
            "condition added",
            |p, _| {
                p["spec"]["matchConditions"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "never", "expression": "false"}))
            },
            "spec.matchConditions[1] (never) is not in the shipped manifest",
        ),
        ("params of another kind", |p, _| p["spec"]["paramKind"]["kind"] = json!("Secret"), "spec.paramKind differs"),
    ];
    for (what, edit, want) in cases {
        let (mut p, mut b) = (shipped("ValidatingAdmissionPolicy"), shipped("ValidatingAdmissionPolicyBinding"));
        edit(&mut p, &mut b);
        let problems = super::policy_problems(Some(&policy(p)), &binding(b));
        assert_eq!(problems.len(), 1, "{what}: {problems:?}");
        assert!(problems[0].contains(want), "{what}: {problems:?}");
    }
    let missing = super::policy_problems(None, &binding(shipped("ValidatingAdmissionPolicyBinding")));
    assert!(missing[0].contains("ValidatingAdmissionPolicy tessera-claim-classes not found"), "{missing:?}");
}

/// The shipped pod policy's document of `kind` (`tessera-gpu-pods`).
fn shipped_pods(kind: &str) -> Value {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(include_str!("../../../../config/rbac/claim-classes.yaml")).unwrap();
    docs.into_iter().find(|d| d["kind"] == kind && d["metadata"]["name"] == "tessera-gpu-pods").unwrap()
}

/// Pods asking for `nvidia.com/` resources in a tenant namespace whose ResourceQuota
/// is not yet enforced are refused by `tessera-gpu-pods`; the operator checks that policy as it
/// checks the claim-class one. As shipped (and as the chart ships it) it enforces.
#[test]
fn the_shipped_pod_policy_enforces_and_the_chart_ships_the_same() {
    let (p, b) = (shipped_pods("ValidatingAdmissionPolicy"), shipped_pods("ValidatingAdmissionPolicyBinding"));
    assert_eq!(super::problems(&super::PODS, Some(&policy(p.clone())), &binding(b.clone())), Vec::<String>::new());
    assert_eq!(super::params_binding_problem(&super::PODS, Some(&binding(b)), "tessera-system"), None);
    let chart = include_str!("../../../../config/helm/tessera/templates/claim-classes.yaml");
    let docs: Vec<&str> = chart.split("\n---\n").collect();
    let chart_policy =
        docs.iter().find(|d| d.contains("name: tessera-gpu-pods") && d.contains("kind: ValidatingAdmissionPolicy\n"));
    let chart_policy: Value = serde_saphyr::from_str(chart_policy.expect("the chart ships tessera-gpu-pods")).unwrap();
    assert_eq!(chart_policy, p, "the chart's pod policy is the kustomize one");
}

/// Each edit that stops the pod policy from refusing is named by its field; a missing binding
/// or one reading other params is named before the policy is read.
#[test]
fn each_edit_of_the_pod_policy_is_named_by_its_field() {
    type Edit = fn(&mut Value, &mut Value);
    let cases: &[(&str, Edit, &str)] = &[
        ("failurePolicy Ignore", |p, _| p["spec"]["failurePolicy"] = json!("Ignore"), "spec.failurePolicy is Ignore"),
        (
            "UPDATE only",
            |p, _| p["spec"]["matchConstraints"]["resourceRules"][0]["operations"] = json!(["UPDATE"]),
            "do not cover CREATE of pods (v1)",
        ),
        ("Warn only", |_, b| b["spec"]["validationActions"] = json!(["Warn"]), "spec.validationActions is [\"Warn\"]"),
        (
            "a looser condition",
            |p, _| p["spec"]["matchConditions"][0]["expression"] = json!("false"),
            "spec.matchConditions[0] (asks-for-nvidia) differs",
        ),
        (
            "a rewritten rule",
            |p, _| p["spec"]["validations"][0]["expression"] = json!("true"),
            "spec.validations[0] differs",
        ),
    ];
    for (what, edit, want) in cases {
        let (mut p, mut b) =
            (shipped_pods("ValidatingAdmissionPolicy"), shipped_pods("ValidatingAdmissionPolicyBinding"));
        edit(&mut p, &mut b);
        let problems = super::problems(&super::PODS, Some(&policy(p)), &binding(b));
        assert_eq!(problems.len(), 1, "{what}: {problems:?}");
        assert!(problems[0].contains(want), "{what}: {problems:?}");
        assert!(
            problems[0].contains("ValidatingAdmissionPolicy") && problems[0].contains("tessera-gpu-pods"),
            "{what}"
        );
    }
    let b = shipped_pods("ValidatingAdmissionPolicyBinding");
    let missing = super::problems(&super::PODS, None, &binding(b.clone()));
    assert!(missing[0].contains("ValidatingAdmissionPolicy tessera-gpu-pods not found"), "{missing:?}");
    let none = super::params_binding_problem(&super::PODS, None, "tessera-system").unwrap();
    assert!(none.contains("ValidatingAdmissionPolicyBinding tessera-gpu-pods not found"), "{none}");
    let elsewhere = super::params_binding_problem(&super::PODS, Some(&binding(b)), "ops").unwrap();
    assert!(elsewhere.contains("reads params tessera-system/tessera-claim-classes"), "{elsewhere}");
}

/// The pod policy edited (`failurePolicy: Ignore`) or its binding deleted, while the claim
/// policy enforces: `ClaimPolicyBound=False` `PolicyNotEnforcing` names `tessera-gpu-pods` and
/// the field; restored, True again.
#[tokio::test]
async fn an_edited_or_missing_pod_policy_is_reported_on_the_quotas() {
    let q: TenantGpuQuota = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1",
        "kind": "TenantGpuQuota", "metadata": {"name": "team-b", "uid": "uid-b", "generation": 1},
        "spec": {"namespaces": ["b"], "hard": {"nvidia.com/gpu": 3}}}))
    .unwrap();
    let claims = std::sync::Arc::new(std::sync::Mutex::new((
        Some(shipped("ValidatingAdmissionPolicyBinding")),
        Some(shipped("ValidatingAdmissionPolicy")),
    )));
    let mut ignoring = shipped_pods("ValidatingAdmissionPolicy");
    ignoring["spec"]["failurePolicy"] = json!("Ignore");
    let pods = std::sync::Arc::new(std::sync::Mutex::new((
        Some(shipped_pods("ValidatingAdmissionPolicyBinding")),
        Some(ignoring),
    )));
    let (client, requests) = api_with(claims, Some(pods.clone()));
    let c = QuotaController::from_stores(client, store_of(vec![q]), store_of(vec![]), store_of(vec![]));
    let _ = c.reconcile().await;
    let (status, reason, message) = last_condition(&requests);
    assert_eq!((status.as_str(), reason.as_str()), ("False", "PolicyNotEnforcing"), "{message}");
    assert!(message.contains("ValidatingAdmissionPolicy tessera-gpu-pods: spec.failurePolicy is Ignore"), "{message}");

    pods.lock().unwrap().1 = Some(shipped_pods("ValidatingAdmissionPolicy"));
    let _ = c.reconcile().await;
    let (status, reason, message) = last_condition(&requests);
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Bound"), "{message}");

    pods.lock().unwrap().0 = None;
    let _ = c.reconcile().await;
    let (status, _, message) = last_condition(&requests);
    assert_eq!(status, "False");
    assert!(message.contains("ValidatingAdmissionPolicyBinding tessera-gpu-pods not found"), "{message}");
}

/// The shipped quota-name policy's documents, by kind.
fn shipped_names(kind: &str) -> Value {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(include_str!("../../../../config/rbac/claim-classes.yaml")).unwrap();
    docs.into_iter().find(|d| d["kind"] == kind && d["metadata"]["name"] == "tessera-quota-names").unwrap()
}

/// The quota-name policy (`tessera-quota-names`) is checked like the pod policy: as shipped
/// (and as the chart ships it) it enforces; edits that stop it are named by their field.
#[test]
fn the_quota_name_policy_is_checked_like_the_pod_policy() {
    use super::{QUOTA_NAMES, params_binding_problem, problems};
    let (p, b) = (shipped_names("ValidatingAdmissionPolicy"), shipped_names("ValidatingAdmissionPolicyBinding"));
    assert_eq!(problems(&QUOTA_NAMES, Some(&policy(p.clone())), &binding(b.clone())), Vec::<String>::new());
    assert_eq!(params_binding_problem(&QUOTA_NAMES, Some(&binding(b.clone())), "tessera-system"), None);
    let chart = include_str!("../../../../config/helm/tessera/templates/claim-classes.yaml");
    let docs: Vec<&str> = chart.split("\n---\n").collect();
    let chart_policy = docs
        .iter()
        .find(|d| d.contains("name: tessera-quota-names") && d.contains("kind: ValidatingAdmissionPolicy\n"));
    let chart_policy: Value = serde_saphyr::from_str(chart_policy.expect("the chart ships it")).unwrap();
    assert_eq!(chart_policy, p, "the chart's quota-name policy is the kustomize one");
    let mut ignoring = p.clone();
    ignoring["spec"]["failurePolicy"] = json!("Ignore");
    let found = problems(&QUOTA_NAMES, Some(&policy(ignoring)), &binding(b.clone()));
    assert!(found.iter().any(|f| f.contains("tessera-quota-names: spec.failurePolicy is Ignore")), "{found:?}");
    let mut other_version = p.clone();
    other_version["spec"]["matchConstraints"]["resourceRules"][0]["apiVersions"] = json!(["v1beta1"]);
    let found = problems(&QUOTA_NAMES, Some(&policy(other_version)), &binding(b.clone()));
    assert!(
        found.iter().any(|f| f.contains("do not cover CREATE of tenantgpuquotas (tessera.dev/v1alpha1)")),
        "{found:?}"
    );
    let elsewhere = params_binding_problem(&QUOTA_NAMES, Some(&binding(b)), "ops").unwrap();
    assert!(elsewhere.contains("admits every TenantGpuQuota"), "{elsewhere}");
}

/// A pass reports a missing quota-name binding on the quotas (`ClaimPolicyBound=False`); found
/// again, `Bound`.
#[tokio::test]
async fn a_missing_quota_name_binding_is_reported_on_the_quotas() {
    let q: TenantGpuQuota = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1",
        "kind": "TenantGpuQuota", "metadata": {"name": "team-b", "uid": "uid-b", "generation": 1},
        "spec": {"namespaces": ["b"], "hard": {"nvidia.com/gpu": 3}}}))
    .unwrap();
    let pair = |b: Value, p: Value| std::sync::Arc::new(std::sync::Mutex::new((Some(b), Some(p))));
    let claims = pair(shipped("ValidatingAdmissionPolicyBinding"), shipped("ValidatingAdmissionPolicy"));
    let pods = pair(shipped_pods("ValidatingAdmissionPolicyBinding"), shipped_pods("ValidatingAdmissionPolicy"));
    let names = pair(shipped_names("ValidatingAdmissionPolicyBinding"), shipped_names("ValidatingAdmissionPolicy"));
    names.lock().unwrap().0 = None;
    let (client, requests) = api_with_names(claims, Some(pods), Some(names.clone()));
    let c = QuotaController::from_stores(client, store_of(vec![q]), store_of(vec![]), store_of(vec![]));
    let _ = c.reconcile().await;
    let (status, reason, message) = last_condition(&requests);
    assert_eq!((status.as_str(), reason.as_str()), ("False", "PolicyNotEnforcing"), "{message}");
    assert!(message.contains("ValidatingAdmissionPolicyBinding tessera-quota-names not found"), "{message}");
    names.lock().unwrap().0 = Some(shipped_names("ValidatingAdmissionPolicyBinding"));
    let _ = c.reconcile().await;
    let (status, reason, message) = last_condition(&requests);
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Bound"), "{message}");
}
