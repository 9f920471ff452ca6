//! Gates mode's `ClaimPolicyBound`: whether every policy and binding of
//! `config/rbac/quota-gates.yaml` (compiled in) is in the cluster as shipped. A live object
//! enforces as shipped when it [`covers`] the shipped one: every field shipped is there with the
//! same value, and what it adds is only what the API server defaults (an empty selector, scope
//! `*`, `matchPolicy: Equivalent`). So an edit that narrows a policy (a match condition, a
//! selector, `failurePolicy: Ignore`, `Warn` instead of `Deny`, another paramRef) is found.

use std::sync::LazyLock;

use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use kube::Api;
use serde_json::Value;

use super::QuotaController;
use super::claim_classes::PolicyCheck;
use super::policy_check::NOT_ENFORCING;

/// The shipped policies and bindings: (kind, name, spec).
static SHIPPED: LazyLock<Vec<(String, String, Value)>> = LazyLock::new(|| {
    let docs: Vec<Value> = serde_saphyr::from_multiple(include_str!("../../../config/rbac/quota-gates.yaml"))
        .expect("config/rbac/quota-gates.yaml parses (a test pins it)");
    docs.into_iter()
        .filter(|d| d["kind"].as_str().is_some_and(|k| k.starts_with("ValidatingAdmissionPolicy")))
        .filter_map(|d| {
            Some((d["kind"].as_str()?.to_string(), d["metadata"]["name"].as_str()?.to_string(), d["spec"].clone()))
        })
        .collect()
});

/// The names of the shipped gate policies (and of their bindings), for the operator's RBAC.
#[cfg(test)]
fn shipped_names() -> Vec<&'static str> {
    SHIPPED.iter().map(|(_, n, _)| n.as_str()).collect()
}

/// The operator's service account as the shipped file names it (installed in `tessera-system`).
const SHIPPED_OPERATOR: &str = "system:serviceaccount:tessera-system:tessera-operator";

/// A shipped spec as installed in the operator's namespace `namespace` (the chart writes the
/// release namespace into the guard; the file is edited so for another namespace).
fn as_installed(spec: &Value, namespace: &str) -> Value {
    let text = spec.to_string();
    let ours = format!("system:serviceaccount:{namespace}:tessera-operator");
    serde_json::from_str(&text.replace(SHIPPED_OPERATOR, &ours)).unwrap_or_else(|_| spec.clone())
}

/// Where `live` differs from `shipped` in a way that may narrow what it enforces, as paths (`""`: none).
pub(super) fn covers(shipped: &Value, live: &Value, at: &str, out: &mut Vec<String>) {
    match (shipped, live) {
        (Value::Object(s), Value::Object(l)) => {
            for (k, sv) in s {
                let path = format!("{at}.{k}");
                match l.get(k) {
                    Some(lv) => covers(sv, lv, &path, out),
                    None => out.push(format!("{path} missing")),
                }
            }
            for (k, lv) in l.iter().filter(|(k, _)| !s.contains_key(*k)) {
                let defaulted = match lv {
                    Value::Object(m) => m.is_empty(),
                    Value::Array(a) => a.is_empty(),
                    Value::String(v) => v == "*" || v == "Equivalent",
                    Value::Null => true,
                    _ => false,
                };
                if !defaulted {
                    out.push(format!("{at}.{k} added"));
                }
            }
        }
        (Value::Array(s), Value::Array(l)) if s.len() == l.len() => {
            for (i, (sv, lv)) in s.iter().zip(l).enumerate() {
                covers(sv, lv, &format!("{at}[{i}]"), out);
            }
        }
        (Value::Array(_), Value::Array(_)) => out.push(format!("{at} has other entries")),
        _ if shipped == live => {}
        _ => out.push(format!("{at} changed")),
    }
}

impl QuotaController {
    /// Reads each shipped gate policy and binding and judges it ([`covers`]); read every pass.
    pub(super) async fn check_gate_policies(&self) -> PolicyCheck {
        let (mut broken, mut unread) = (Vec::new(), Vec::new());
        for (kind, name, spec) in SHIPPED.iter() {
            let live = if kind == "ValidatingAdmissionPolicy" {
                let api = Api::<ValidatingAdmissionPolicy>::all(self.client.clone());
                api.get_opt(name).await.map(|o| o.map(|o| serde_json::to_value(o.spec).unwrap_or_default()))
            } else {
                let api = Api::<ValidatingAdmissionPolicyBinding>::all(self.client.clone());
                api.get_opt(name).await.map(|o| o.map(|o| serde_json::to_value(o.spec).unwrap_or_default()))
            };
            match live {
                Err(e) => unread.push(format!("{kind} {name} could not be read: {e}")),
                Ok(None) => broken.push(format!(
                    "{kind} {name} not found: GPU work is not held to the gates (install config/rbac/quota-gates.yaml or \
                     the chart with quotaAdmission: gates)"
                )),
                Ok(Some(live)) => {
                    let mut diff = Vec::new();
                    covers(&as_installed(spec, &self.namespace), &live, "spec", &mut diff);
                    if !diff.is_empty() {
                        broken.push(format!(
                            "{kind} {name} is not as shipped ({}): it may admit GPU work past the gates (re-apply \
                             config/rbac/quota-gates.yaml or the chart)",
                            diff.join(", ")
                        ));
                    }
                }
            }
        }
        match (broken.is_empty(), unread.is_empty()) {
            (true, true) => PolicyCheck::Enforces,
            (true, false) => PolicyCheck::Unreadable(unread.join("; ")),
            (false, _) => {
                PolicyCheck::Broken(NOT_ENFORCING, broken.into_iter().chain(unread).collect::<Vec<_>>().join("; "))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn diff(shipped: Value, live: Value) -> Vec<String> {
        let mut out = Vec::new();
        covers(&shipped, &live, "spec", &mut out);
        out
    }

    #[test]
    fn defaults_the_api_server_adds_are_covered_and_narrowing_edits_are_named() {
        let shipped =
            json!({"failurePolicy": "Fail", "matchConstraints": {"resourceRules": [{"resources": ["pods"]}]}});
        let defaulted = json!({"failurePolicy": "Fail", "matchConstraints": {"matchPolicy": "Equivalent",
            "namespaceSelector": {}, "objectSelector": {}, "resourceRules": [{"resources": ["pods"], "scope": "*"}]}});
        assert!(diff(shipped.clone(), defaulted).is_empty());
        let ignore =
            json!({"failurePolicy": "Ignore", "matchConstraints": {"resourceRules": [{"resources": ["pods"]}]}});
        assert_eq!(diff(shipped.clone(), ignore), ["spec.failurePolicy changed"]);
        let narrowed = json!({"failurePolicy": "Fail", "matchConditions": [{"name": "x", "expression": "false"}],
            "matchConstraints": {"objectSelector": {"matchLabels": {"a": "b"}}, "resourceRules": [{"resources": ["pods"]}]}});
        assert_eq!(
            diff(shipped.clone(), narrowed),
            ["spec.matchConstraints.objectSelector added", "spec.matchConditions added"]
        );
        let fewer = json!({"failurePolicy": "Fail", "matchConstraints": {"resourceRules": []}});
        assert_eq!(diff(shipped.clone(), fewer), ["spec.matchConstraints.resourceRules has other entries"]);
        assert_eq!(diff(shipped, json!({"failurePolicy": "Fail"})), ["spec.matchConstraints missing"]);
    }

    #[test]
    fn the_operator_may_read_every_gate_policy_it_checks() {
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(include_str!("../../../config/rbac/quota-gates.yaml")).unwrap();
        let role = docs
            .iter()
            .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "tessera-operator-gates")
            .unwrap();
        for kind in ["validatingadmissionpolicies", "validatingadmissionpolicybindings"] {
            let rule = role["rules"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["resources"].as_array().unwrap().iter().any(|x| x == kind))
                .unwrap_or_else(|| panic!("no rule for {kind}"));
            assert!(rule["verbs"].as_array().unwrap().iter().any(|v| v == "get"));
            for n in shipped_names() {
                assert!(rule["resourceNames"].as_array().unwrap().iter().any(|x| x == n), "{kind} {n}");
            }
        }
    }

    #[test]
    fn the_guard_is_judged_with_the_operator_of_its_own_namespace() {
        let (_, _, guard) =
            SHIPPED.iter().find(|(k, n, _)| k == "ValidatingAdmissionPolicy" && n == "tessera-gpu-gate-guard").unwrap();
        let elsewhere = as_installed(guard, "gpu-platform");
        let text = elsewhere.to_string();
        assert!(
            text.contains("system:serviceaccount:gpu-platform:tessera-operator") && !text.contains(SHIPPED_OPERATOR),
            "{text}"
        );
        let mut out = Vec::new();
        covers(&elsewhere, &elsewhere, "spec", &mut out);
        assert!(out.is_empty());
        covers(guard, &elsewhere, "spec", &mut out);
        assert_eq!(out, ["spec.variables[0].expression changed"], "the shipped text itself names tessera-system");
    }

    #[test]
    fn every_shipped_gate_policy_and_binding_is_compiled_in() {
        let names = shipped_names();
        for n in [
            "tessera-gpu-unclassified",
            "tessera-gpu-classes",
            "tessera-gpu-gate-pods",
            "tessera-gpu-gate-claims",
            "tessera-gpu-gate-bindings",
            "tessera-gpu-gate-guard",
        ] {
            assert_eq!(names.iter().filter(|m| **m == n).count(), 2, "{n}: its policy and its binding");
        }
    }
}
