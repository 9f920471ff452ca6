//! Pure label-selector matching (`matchLabels` and `matchExpressions`), as the API server does it.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

pub fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = selector.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
            "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
            "Exists" => labels.contains_key(&e.key),
            "DoesNotExist" => !labels.contains_key(&e.key),
            _ => false, // refused by validation; never matches
        }
    });
    labels_ok && exprs_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selectors_match_like_the_api_server() {
        let labels: BTreeMap<String, String> =
            [("pool", "inference"), ("zone", "a")].iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let sel = |v: serde_json::Value| -> LabelSelector { serde_json::from_value(v).unwrap() };
        assert!(matches(&sel(json!({})), &labels), "empty selects everything");
        assert!(matches(&sel(json!({"matchLabels": {"pool": "inference"}})), &labels));
        assert!(!matches(&sel(json!({"matchLabels": {"pool": "training"}})), &labels));
        assert!(matches(
            &sel(json!({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]})),
            &labels
        ));
        assert!(!matches(
            &sel(json!({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]})),
            &labels
        ));
        assert!(matches(&sel(json!({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]})), &labels));
        assert!(!matches(&sel(json!({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]})), &labels));
        assert!(!matches(&sel(json!({"matchExpressions": [{"key": "zone", "operator": "Bogus"}]})), &labels));
    }
}
