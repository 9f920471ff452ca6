//! What the API server dropped from a write: an agent newer than the installed CRD sends
//! `status.activity` fields (or the whole summary) the CRD's schema lacks, and the server prunes
//! them without an error. The answer to the write is the stored object, so comparing it with
//! what was sent tells a pruned summary from a stored one (see [`super::writer`]).

use std::collections::BTreeSet;

use serde_json::Value;

/// The paths (`path` and below, list indices as `[]`) whose value `sent` has but `got` lacks or
/// holds otherwise, sorted; empty when everything sent came back.
pub fn dropped(sent: &Value, got: &Value, path: &str) -> Vec<String> {
    let mut out = BTreeSet::new();
    walk(sent, got, path, &mut out);
    out.into_iter().collect()
}

fn walk(sent: &Value, got: &Value, path: &str, out: &mut BTreeSet<String>) {
    match (sent, got) {
        (Value::Object(s), Value::Object(g)) => {
            for (k, v) in s {
                walk(v, g.get(k).unwrap_or(&Value::Null), &format!("{path}.{k}"), out);
            }
        }
        (Value::Array(s), Value::Array(g)) if s.len() == g.len() => {
            for (v, w) in s.iter().zip(g) {
                walk(v, w, &format!("{path}[]"), out);
            }
        }
        (s, g) if s != g => {
            out.insert(path.to_string());
        }
        _ => {}
    }
}
