//! The shipped binding policy `tessera-gpu-bindings` (it refuses binding GPU pods made
//! before their namespace's ResourceQuota), evaluated with the pod policy tests' CEL harness. The
//! real API server and scheduler run it in `e2e/tests/quota_params.rs`.

use serde_json::{Value, json};

use super::pod_policy::{NS_UID, evaluate};

/// The scheduler binding pod `pod` of `ns` to node `n1`, as the API server sees the request.
fn bind(pod: &str, ns: &str, data: &Value) -> Option<String> {
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod, "namespace": ns},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}});
    let request = json!({"namespace": ns, "name": pod, "operation": "CREATE", "subResource": "binding",
        "resource": {"group": "", "version": "v1", "resource": "pods"}});
    evaluate("tessera-gpu-bindings", &binding, &request, data, NS_UID)
}

fn params() -> Value {
    json!({"x.quota": "team-a", "x.since": "2026-06-01T10:00:00Z", "x.pods": "hoard hoard-2",
           "p.quota": "team-b", "p.pods": "early", "_pending": "p",
           "big.quota": "team-c", "big.since": "2026-06-01T10:00:00Z", "big.pods": "_all",
           "y.quota": "team-a", "y.since": "2026-06-01T10:00:00Z"})
}

#[test]
fn a_listed_pod_is_refused_binding_naming_the_quota_the_time_the_cause_and_the_fix() {
    assert_eq!(
        bind("hoard-2", "x", &params()).as_deref(),
        Some(
            "pod hoard-2 of namespace x (TenantGpuQuota team-a) may not be bound: it asks for GPU extended \
             resources and was made no later than 2026-06-01T10:00:00Z, when its ResourceQuota began counting \
             pods (before the namespace's GPU limits were in force); bound, it would take GPUs the quota never \
             counted; delete the pod and create it again (it will be counted)"
        )
    );
    assert_eq!(
        bind("early", "p", &params()).as_deref(),
        Some(
            "pod early of namespace p (TenantGpuQuota team-b) may not be bound: it asks for GPU extended \
             resources and was made before the namespace's ResourceQuota exists (before the namespace's GPU \
             limits were in force); bound, it would take GPUs the quota never counted; delete the pod and \
             create it again (it will be counted)"
        )
    );
}

#[test]
fn unlisted_pods_and_namespaces_without_listed_pods_are_bound() {
    assert_eq!(bind("later", "x", &params()), None, "not listed");
    assert_eq!(bind("hoard", "y", &params()), None, "a tenant namespace listing no pod");
    assert_eq!(bind("hoard", "other", &params()), None, "not a tenant namespace");
    assert_eq!(bind("hoard", "x", &json!({})), None, "empty params");
    assert_eq!(bind("hoar", "x", &params()), None, "a prefix of a listed name is another pod");
    assert!(bind("hoard", "x", &params()).is_some());
}

/// The same write through the `bindings` resource (`POST /api/v1/namespaces/<ns>/bindings`): the
/// request names the pod as the Binding does.
#[test]
fn a_binding_through_the_bindings_resource_is_refused_too() {
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "hoard", "namespace": "x"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}});
    let request = json!({"namespace": "x", "name": "hoard", "operation": "CREATE",
        "resource": {"group": "", "version": "v1", "resource": "bindings"}});
    let got = evaluate("tessera-gpu-bindings", &binding, &request, &params(), NS_UID).unwrap_or_default();
    assert!(got.starts_with("pod hoard of namespace x (TenantGpuQuota team-a) may not be bound"), "{got}");
    let covered = |r: &Value| r["resources"].as_array().unwrap().iter().any(|x| x == "bindings");
    let shipped = shipped("ValidatingAdmissionPolicy");
    assert!(shipped["spec"]["matchConstraints"]["resourceRules"].as_array().unwrap().iter().any(covered));
}

/// As on the API server, a request the policy's `resourceRules` do not select is not evaluated:
/// here, the same Binding of a listed pod is admitted. This keeps the test above from passing
/// for any resource.
#[test]
fn a_request_for_a_resource_the_policy_does_not_match_is_not_evaluated() {
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "hoard", "namespace": "x"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}});
    let run = |group: &str, resource: &str, sub: Option<&str>, operation: &str| {
        let mut request = json!({"namespace": "x", "name": "hoard", "operation": operation,
            "resource": {"group": group, "version": "v1", "resource": resource}});
        if let Some(s) = sub {
            request["subResource"] = json!(s);
        }
        evaluate("tessera-gpu-bindings", &binding, &request, &params(), NS_UID)
    };
    for (group, resource, sub, operation) in [
        ("", "pods", None, "CREATE"),
        ("", "pods", Some("status"), "UPDATE"),
        ("", "pods", Some("eviction"), "CREATE"),
        ("", "pods", Some("binding"), "DELETE"),
        ("", "bindings", None, "UPDATE"),
        ("", "services", None, "CREATE"),
        ("apps", "bindings", None, "CREATE"),
    ] {
        assert_eq!(run(group, resource, sub, operation), None, "{group}/{resource} {sub:?} {operation}");
    }
    assert!(run("", "pods", Some("binding"), "CREATE").is_some());
    assert!(run("", "bindings", None, "CREATE").is_some());
}

#[test]
fn past_the_cap_every_binding_of_the_namespace_is_refused() {
    assert_eq!(
        bind("anything", "big", &params()).as_deref(),
        Some(
            "pod anything of namespace big (TenantGpuQuota team-c) may not be bound: the namespace holds more \
             unbound pods asking for GPU extended resources made no later than 2026-06-01T10:00:00Z, when its \
             ResourceQuota began counting pods (before its GPU limits were in force), than the params can list; \
             no pod of the namespace is bound until they are deleted (a binding does not say whether its pod \
             asks for GPUs); find them with kubectl get pods -n big --field-selector spec.nodeName=, delete \
             them and create them again (they will be counted)"
        )
    );
}

/// The shipped binding policy's document of `kind`.
fn shipped(kind: &str) -> Value {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(include_str!("../../../../config/rbac/claim-classes.yaml")).unwrap();
    docs.into_iter().find(|d| d["kind"] == kind && d["metadata"]["name"] == "tessera-gpu-bindings").unwrap()
}

/// The operator checks the binding policy as it checks the pod policy (`ClaimPolicyBound`): as
/// shipped (and as the chart ships it) it enforces; an edit that stops it is named by its field.
#[test]
fn the_binding_policy_is_checked_like_the_pod_policy() {
    use super::super::policy_check::{BINDINGS, params_binding_problem, problems};
    let policy = |v: Value| serde_json::from_value(v).unwrap();
    let (p, b) = (shipped("ValidatingAdmissionPolicy"), shipped("ValidatingAdmissionPolicyBinding"));
    let binding = serde_json::from_value(b).unwrap();
    assert_eq!(problems(&BINDINGS, Some(&policy(p.clone())), &binding), Vec::<String>::new());
    assert_eq!(params_binding_problem(&BINDINGS, Some(&binding), "tessera-system"), None);
    let chart = include_str!("../../../../config/helm/tessera/templates/claim-classes.yaml");
    let doc = chart
        .split("\n---\n")
        .find(|d| d.contains("name: tessera-gpu-bindings") && d.contains("kind: ValidatingAdmissionPolicy\n"));
    let chart_policy: Value = serde_saphyr::from_str(doc.expect("the chart ships tessera-gpu-bindings")).unwrap();
    assert_eq!(chart_policy, p, "the chart's binding policy is the kustomize one");
    let mut pods_only = p.clone();
    pods_only["spec"]["matchConstraints"]["resourceRules"][0]["resources"] = json!(["pods", "bindings"]);
    let found = problems(&BINDINGS, Some(&policy(pods_only)), &binding);
    assert!(
        found.iter().any(|f| f.contains(
            "tessera-gpu-bindings: spec.matchConstraints.resourceRules do not cover CREATE of pods/binding (v1)"
        )),
        "{found:?}"
    );
    let mut subresource_only = p.clone();
    subresource_only["spec"]["matchConstraints"]["resourceRules"][0]["resources"] = json!(["pods/binding"]);
    let found = problems(&BINDINGS, Some(&policy(subresource_only)), &binding);
    assert!(found.iter().any(|f| f.contains("do not cover CREATE of bindings (v1)")), "{found:?}");
    let mut ignoring = p;
    ignoring["spec"]["failurePolicy"] = json!("Ignore");
    let found = problems(&BINDINGS, Some(&policy(ignoring)), &binding);
    assert!(found.iter().any(|f| f.contains("spec.failurePolicy is Ignore")), "{found:?}");
    let none = params_binding_problem(&BINDINGS, None, "tessera-system").unwrap();
    assert!(none.contains("ValidatingAdmissionPolicyBinding tessera-gpu-bindings not found"), "{none}");
}
