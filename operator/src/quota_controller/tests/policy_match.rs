//! Which requests a policy's `matchConstraints` select, for the CEL harness (`tests::pod_policy`):
//! the API server evaluates nothing else (a harness that evaluated every request would let no
//! test of a resource the policy does not match fail).

use serde_json::{Value, json};

/// Whether `request` is one `spec.matchConstraints.resourceRules` selects, as the API server
/// decides before any match condition: a rule lists (or `*`) its operation, `resource.group`,
/// `resource.version` and `resource.resource` (with `/<subResource>` where the request has one:
/// `pods` does not match a `pods/binding` request, nor `pods/binding` a `pods` one; `*/x`,
/// `x/*` and `*/*` as the API server reads them). A request without `resource` matches nothing.
/// A spec with no `matchConstraints` (a test's own) matches every request.
pub(super) fn constrained_to(spec: &Value, request: &Value) -> bool {
    let Some(rules) = spec["matchConstraints"].get("resourceRules") else { return spec["matchConstraints"].is_null() };
    let r = &request["resource"];
    let (Some(group), Some(version), Some(resource)) =
        (r["group"].as_str(), r["version"].as_str(), r["resource"].as_str())
    else {
        return false;
    };
    let sub = request["subResource"].as_str().unwrap_or_default();
    let operation = request["operation"].as_str().unwrap_or_default();
    let lists = |rule: &Value, field: &str, want: &str| {
        rule[field].as_array().into_iter().flatten().any(|v| v == "*" || v.as_str() == Some(want))
    };
    let names = |entry: &str| {
        let (res, entry_sub) = entry.split_once('/').unwrap_or((entry, ""));
        match (res, entry_sub) {
            ("*", "*") => true,
            ("*", "") => sub.is_empty(),
            ("*", s) => s == sub,
            (res, "*") => res == resource && !sub.is_empty(),
            (res, s) => res == resource && s == sub,
        }
    };
    rules.as_array().into_iter().flatten().any(|rule| {
        lists(rule, "operations", operation)
            && lists(rule, "apiGroups", group)
            && lists(rule, "apiVersions", version)
            && rule["resources"].as_array().into_iter().flatten().filter_map(Value::as_str).any(names)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    /// The harness selects requests by `matchConstraints.resourceRules` as the API
    /// server does, wildcards included.
    #[test]
    fn the_harness_selects_requests_by_resource_rules() {
        let spec = |resources: Value| {
            json!({"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": resources}]}})
        };
        let req = |resource: &str, sub: &str| {
            let mut r =
                json!({"operation": "CREATE", "resource": {"group": "", "version": "v1", "resource": resource}});
            if !sub.is_empty() {
                r["subResource"] = json!(sub);
            }
            r
        };
        for (resources, resource, sub, selected) in [
            (json!(["pods"]), "pods", "", true),
            (json!(["pods"]), "pods", "binding", false),
            (json!(["pods/binding"]), "pods", "", false),
            (json!(["pods/binding"]), "pods", "binding", true),
            (json!(["*"]), "services", "", true),
            (json!(["*"]), "pods", "status", false),
            (json!(["*/status"]), "pods", "status", true),
            (json!(["*/status"]), "pods", "", false),
            (json!(["pods/*"]), "pods", "binding", true),
            (json!(["pods/*"]), "pods", "", false),
            (json!(["*/*"]), "pods", "binding", true),
        ] {
            assert_eq!(
                constrained_to(&spec(resources.clone()), &req(resource, sub)),
                selected,
                "{resources} {resource}/{sub}"
            );
        }
        assert!(!constrained_to(&spec(json!(["pods"])), &json!({"operation": "CREATE"})), "no resource in the request");
        let mut update = req("pods", "");
        update["operation"] = json!("UPDATE");
        assert!(!constrained_to(&spec(json!(["pods"])), &update));
        assert!(constrained_to(&json!({}), &json!({})), "a test's own spec without constraints");
    }
}
