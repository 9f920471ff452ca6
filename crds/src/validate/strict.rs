//! Unknown fields, checked as the API server's strict field validation checks them (what
//! `kubectl apply` does by default): against the CRD's structural schema, and `metadata` against
//! ObjectMeta's. serde drops unknown fields silently, so without this a typo such as
//! `nodeSelectr` passes offline as a plan without a selector, one that matches every node.
//! The CRD types themselves stay lenient: the operator decodes what the API server serves.

use std::sync::LazyLock;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::CustomResourceExt;
use serde_json::Value;

use super::FieldError;
use crate::{GpuNode, GpuPartitionPlan, TenantGpuQuota};

/// One step of a path into a document: a key of a mapping or an index of a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// Every field of `object` (a whole document of `kind`) that the schema does not know, each
/// named by its path. Empty for a kind that is not Tessera's: its schema is not ours to know.
pub fn unknown_fields(kind: &str, object: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let (Some(schema), Value::Object(fields)) = (schema_of(kind), object) {
        for (key, value) in fields {
            match key.as_str() {
                "apiVersion" | "kind" => {}
                "metadata" => walk(&OBJECT_META, value, "metadata", &mut errs),
                _ => child(schema, key, value, "", &mut errs),
            }
        }
    }
    errs
}

/// The path of `steps` into a document of `kind` in the style of every other message:
/// `spec.layouts[0].profiles["1g.10gb"]`: fields after a dot, map keys quoted in brackets.
pub fn field_path(kind: &str, steps: &[Step<'_>]) -> String {
    let mut path = String::new();
    let mut schema = schema_of(kind);
    for (i, step) in steps.iter().enumerate() {
        match *step {
            Step::Index(n) => {
                path.push_str(&format!("[{n}]"));
                schema = schema.and_then(|s| s.get("items"));
            }
            Step::Key(k) => {
                let field = if i == 0 && k == "metadata" {
                    Some(&*OBJECT_META)
                } else {
                    schema.and_then(|s| s.get("properties")?.get(k))
                };
                let map = schema.and_then(|s| s.get("additionalProperties")).filter(|s| s.is_object());
                // Where the schema says nothing, a name like a field is taken for one.
                let like_a_field = k.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                    && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if field.is_some() || (map.is_none() && like_a_field) {
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(k);
                    schema = field;
                } else {
                    path.push_str(&format!("[{k:?}]"));
                    schema = map;
                }
            }
        }
    }
    path
}

/// The openAPIV3Schema the API server serves for `kind`.
fn schema_of(kind: &str) -> Option<&'static Value> {
    match kind {
        "GpuPartitionPlan" => Some(&PLAN),
        "TenantGpuQuota" => Some(&QUOTA),
        "GpuNode" => Some(&NODE),
        _ => None,
    }
}

fn served_schema(
    crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Value {
    let schema = crd.spec.versions.into_iter().next().and_then(|v| v.schema).and_then(|s| s.open_api_v3_schema);
    serde_json::to_value(schema).unwrap_or(Value::Null)
}

static PLAN: LazyLock<Value> = LazyLock::new(|| served_schema(GpuPartitionPlan::crd()));
static QUOTA: LazyLock<Value> = LazyLock::new(|| served_schema(TenantGpuQuota::crd()));
static NODE: LazyLock<Value> = LazyLock::new(|| served_schema(GpuNode::crd()));
static OBJECT_META: LazyLock<Value> = LazyLock::new(|| {
    let generator =
        schemars::generate::SchemaSettings::openapi3().with(|s| s.inline_subschemas = true).into_generator();
    generator.into_root_schema_for::<ObjectMeta>().to_value()
});

/// Checks `value` against `schema`. Conservative where the schema says nothing: an object
/// schema without `properties` (or with `$ref`s left in it) accepts any field, so nothing the
/// API server takes is ever reported.
fn walk(schema: &Value, value: &Value, path: &str, errs: &mut Vec<FieldError>) {
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        return;
    }
    match value {
        Value::Object(fields) => {
            for (key, v) in fields {
                child(schema, key, v, path, errs);
            }
        }
        Value::Array(items) => {
            if let Some(item) = schema.get("items").filter(|s| s.is_object()) {
                for (i, v) in items.iter().enumerate() {
                    walk(item, v, &format!("{path}[{i}]"), errs);
                }
            }
        }
        _ => {}
    }
}

/// Checks the field `key` of an object at `path` whose schema is `schema`.
fn child(schema: &Value, key: &str, value: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let properties = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties");
    let field = if path.is_empty() { key.to_string() } else { format!("{path}.{key}") };
    if let Some(s) = properties.and_then(|p| p.get(key)) {
        walk(s, value, &field, errs);
    } else if let Some(s) = additional.filter(|s| s.is_object()) {
        walk(s, value, &format!("{path}[{key:?}]"), errs);
    } else if let Some(known) = properties.filter(|_| additional != Some(&Value::Bool(true))) {
        let mut names: Vec<&str> = known.keys().map(String::as_str).collect();
        if path.is_empty() {
            names.extend(["apiVersion", "kind", "metadata"]);
        }
        names.sort_unstable();
        errs.push(FieldError::new(
            field,
            format!(
                "unknown field (kubectl apply refuses it; with --validate=warn the API server drops it); \
                 known fields here: {}",
                names.join(", ")
            ),
        ));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn fields(kind: &str, doc: Value) -> Vec<String> {
        let mut f: Vec<String> = unknown_fields(kind, &doc).into_iter().map(|e| e.field).collect();
        f.sort();
        f
    }

    #[test]
    fn typos_are_named_at_every_depth() {
        let plan = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan", "specs": {},
            "metadata": {"name": "p", "labls": {"a": "b"}, "labels": {"any-key": "v"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "n", "uid": "u", "contrler": true}]},
            "spec": {"nodeSelectr": {"matchLabels": {"pool": "a"}},
                     "nodeSelector": {"matchExpressions": [{"key": "k", "operater": "In", "values": ["v"]}]},
                     "layouts": [{"gpuProduct": "H100-80GB", "profiles": {"1g.10gb": 7}, "migEnabld": true}],
                     "rollout": {"maxUnavailble": 1, "maxUnavailable": "50%"}}});
        assert_eq!(
            fields("GpuPartitionPlan", plan),
            [
                "metadata.labls",
                "metadata.ownerReferences[0].contrler",
                "spec.layouts[0].migEnabld",
                "spec.nodeSelector.matchExpressions[0].operater",
                "spec.nodeSelectr",
                "spec.rollout.maxUnavailble",
                "specs",
            ]
        );
        let quota = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "metadata": {"name": "q"},
            "spec": {"namespacs": ["a"], "namespaces": ["a"], "hard": {"nvidia.com/gpu": 1},
                     "namespaceHard": {"a": {"nvidia.com/gpu": 1}}, "physical": {"computeSlice": 3}}});
        assert_eq!(fields("TenantGpuQuota", quota), ["spec.namespacs", "spec.physical.computeSlice"]);
    }

    #[test]
    fn the_message_says_why_and_lists_the_known_fields() {
        let errs = unknown_fields("GpuPartitionPlan", &json!({"spec": {"rollout": {"maxUnavailble": 1}}}));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].reason.starts_with("unknown field (kubectl apply refuses it"), "{}", errs[0].reason);
        assert!(errs[0].reason.contains("known fields here: "), "{}", errs[0].reason);
        assert!(errs[0].reason.contains("maxUnavailable"), "{}", errs[0].reason);
    }

    #[test]
    fn other_kinds_are_not_checked() {
        assert!(unknown_fields("ConfigMap", &json!({"dta": {}})).is_empty());
    }

    #[test]
    fn paths_quote_map_keys_and_dot_fields() {
        let steps =
            [Step::Key("spec"), Step::Key("layouts"), Step::Index(0), Step::Key("profiles"), Step::Key("1g.10gb")];
        assert_eq!(field_path("GpuPartitionPlan", &steps), r#"spec.layouts[0].profiles["1g.10gb"]"#);
        let steps = [Step::Key("spec"), Step::Key("namespaceHard"), Step::Key("a"), Step::Key("nvidia.com/gpu")];
        assert_eq!(field_path("TenantGpuQuota", &steps), r#"spec.namespaceHard["a"]["nvidia.com/gpu"]"#);
        assert_eq!(field_path("GpuPartitionPlan", &[Step::Key("metadata"), Step::Key("name")]), "metadata.name");
        let labels = [Step::Key("metadata"), Step::Key("labels"), Step::Key("pool")];
        assert_eq!(field_path("TenantGpuQuota", &labels), r#"metadata.labels["pool"]"#);
    }
}
