//! `tessera-operator validate FILE|DIR...`: checks multi-document YAML of Tessera objects with
//! the same code the operator uses, and prints `file:doc N: field: reason` for every problem.

use serde::Serialize;
use serde::de::DeserializeOwned;
use tessera_crds::validate::strict::{self, Step};
use tessera_crds::validate::{FieldError, validate_plan, validate_quota};
use tessera_crds::{GpuPartitionPlanSpec, TenantGpuQuotaSpec};

use super::Output;
use crate::Error;

/// One problem, located in a file and document (1-based).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DocError {
    pub file: String,
    pub doc: usize,
    pub field: String,
    pub reason: String,
}

impl std::fmt::Display for DocError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:doc {}: {}: {}", self.file, self.doc, self.field, self.reason)
    }
}

/// What one document was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DocSummary {
    pub file: String,
    pub doc: usize,
    pub kind: String,
    pub name: String,
    pub valid: bool,
}

#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub documents: Vec<DocSummary>,
    pub errors: Vec<DocError>,
    /// The namespaces each TenantGpuQuota claims, for [`Report::finish`].
    #[serde(skip)]
    claims: Vec<conflicts::Claim>,
}

/// The documents of YAML text, empty ones left out, each parsed or with why not. After a syntax
/// error the stream ends (later documents cannot be located reliably); after any other error the
/// next document is read. Custom tags (`!thing`) are errors: Kubernetes objects carry none.
pub(crate) fn documents(text: &str) -> impl Iterator<Item = Result<serde_json::Value, serde_saphyr::Error>> + '_ {
    let options = serde_saphyr::options! { reject_unsupported_tags: true };
    let mut bytes = text.as_bytes();
    // `read` borrows its reader; collecting keeps the borrow inside this function.
    serde_saphyr::read_with_options(&mut bytes, options).collect::<Vec<_>>().into_iter()
}

/// Validates YAML text (possibly several documents; `doc N` counts the non-empty ones). Documents
/// of other API groups are listed as skipped: a GitOps directory holds more than Tessera objects.
/// A document that is not a Kubernetes object at all (a scalar, a list, no `apiVersion` or
/// `kind`) is an error: junk must not pass a CI check.
pub fn validate_text(file: &str, text: &str, report: &mut Report) {
    for (i, value) in documents(text).enumerate() {
        let doc = i + 1;
        let value = match value {
            Ok(v) => v,
            Err(e) => {
                report.documents.push(DocSummary {
                    file: file.into(),
                    doc,
                    kind: "(not parsed)".into(),
                    name: String::new(),
                    valid: false,
                });
                report.errors.push(DocError {
                    file: file.into(),
                    doc,
                    field: "(document)".into(),
                    reason: e.to_string(),
                });
                continue;
            }
        };
        let (summary, errs) = check_document(&value);
        let (kind, name) = summary.unwrap_or_else(|| ("(not a Kubernetes object)".into(), String::new()));
        if kind == "TenantGpuQuota" && !name.is_empty() {
            let namespaces = value.pointer("/spec/namespaces").and_then(|n| n.as_array());
            let namespaces = namespaces.into_iter().flatten().filter_map(|n| n.as_str().map(String::from)).collect();
            report.claims.push(conflicts::Claim { file: file.into(), doc, name: name.clone(), namespaces });
        }
        report.documents.push(DocSummary { file: file.into(), doc, kind, name, valid: errs.is_empty() });
        report.errors.extend(errs.into_iter().map(|e| DocError {
            file: file.into(),
            doc,
            field: e.field,
            reason: e.reason,
        }));
    }
}

/// Checks one document: `Some((kind, name))` when it is a Kubernetes object (a mapping with
/// string `apiVersion` and `kind`), with its problems; `None` with the reason otherwise.
fn check_document(json: &serde_json::Value) -> (Option<(String, String)>, Vec<FieldError>) {
    use serde_json::Value as J;
    let what = match json {
        J::Object(_) => None,
        J::Bool(_) => Some("a YAML boolean"),
        J::Number(_) => Some("a YAML number"),
        J::String(_) => Some("a YAML string"),
        J::Array(_) => Some("a YAML list"),
        J::Null => Some("an empty YAML document"),
    };
    if let Some(what) = what {
        let reason = format!("{what} is not a Kubernetes object; expected a mapping with apiVersion and kind");
        return (None, vec![FieldError::new("(document)", reason)]);
    }
    let mut missing = Vec::new();
    for field in ["apiVersion", "kind"] {
        match json.get(field) {
            None | Some(serde_json::Value::Null) => missing.push(FieldError::new(field, "is required")),
            Some(serde_json::Value::String(s)) if s.is_empty() => missing.push(FieldError::new(field, "is required")),
            Some(serde_json::Value::String(_)) => {}
            Some(other) => missing.push(FieldError::new(field, format!("must be a string, not {other}"))),
        }
    }
    if !missing.is_empty() {
        return (None, missing);
    }
    let kind = json["kind"].as_str().unwrap_or_default().to_string();
    let api_version = json["apiVersion"].as_str().unwrap_or_default();
    let name = json.pointer("/metadata/name").and_then(|k| k.as_str()).unwrap_or("").to_string();
    if api_version.split('/').next() != Some(tessera_crds::GROUP) {
        return (Some((format!("{kind} (skipped: not tessera.dev)"), name)), Vec::new());
    }
    let mut errs = Vec::new();
    if api_version != format!("{}/{}", tessera_crds::GROUP, tessera_crds::VERSION) {
        errs.push(FieldError::new("apiVersion", format!("{api_version:?} is not served; use tessera.dev/v1alpha1")));
    }
    errs.extend(check_metadata(json));
    match kind.as_str() {
        "GpuPartitionPlan" | "TenantGpuQuota" => errs.extend(strict::unknown_fields(&kind, json)),
        _ => {}
    }
    match kind.as_str() {
        "GpuPartitionPlan" => errs.extend(check_spec::<GpuPartitionPlanSpec>(&kind, json, validate_plan)),
        "TenantGpuQuota" => errs.extend(check_spec::<TenantGpuQuotaSpec>(&kind, json, validate_quota)),
        "GpuNode" => errs.push(FieldError::new(
            "kind",
            "GpuNode objects are written by the operator and node agents; do not commit them",
        )),
        other => errs.push(FieldError::new(
            "kind",
            format!("{other:?} is not a Tessera kind (GpuPartitionPlan, TenantGpuQuota)"),
        )),
    }
    (Some((kind, name)), errs)
}

fn check_metadata(json: &serde_json::Value) -> Vec<FieldError> {
    let name = json.pointer("/metadata/name").and_then(|n| n.as_str());
    let mut errs = Vec::new();
    match name {
        None => errs.push(FieldError::new("metadata.name", "is required")),
        Some(n) if !is_dns1123_subdomain(n) => errs.push(FieldError::new(
            "metadata.name",
            format!("{n:?} must be lowercase letters, digits, '-' and '.', at most 253 characters"),
        )),
        Some(_) => {}
    }
    if json.pointer("/metadata/namespace").is_some() {
        errs.push(FieldError::new("metadata.namespace", "Tessera kinds are cluster-scoped; remove the namespace"));
    }
    errs
}

/// Deserialises `spec` with the exact path of any type error, then runs the semantic checks.
fn check_spec<T: DeserializeOwned>(
    kind: &str,
    json: &serde_json::Value,
    semantic: fn(&T) -> Vec<FieldError>,
) -> Vec<FieldError> {
    let Some(spec) = json.get("spec") else { return vec![FieldError::new("spec", "is required")] };
    match serde_path_to_error::deserialize::<_, T>(spec) {
        Ok(typed) => semantic(&typed),
        Err(e) => vec![FieldError::new(field_of(kind, Some("spec"), e.path()), e.inner().to_string())],
    }
}

/// A serde error's path (below `root`, when given) in the style of every other message:
/// `spec.layouts[0].profiles["1g.10gb"]`, not serde's `layouts[0].profiles.1g.10gb`.
pub(crate) fn field_of(kind: &str, root: Option<&str>, path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut steps: Vec<Step> = root.map(Step::Key).into_iter().collect();
    steps.extend(path.iter().filter_map(|s| match s {
        Segment::Seq { index } => Some(Step::Index(*index)),
        Segment::Map { key } | Segment::Enum { variant: key } => Some(Step::Key(key)),
        Segment::Unknown => None,
    }));
    match strict::field_path(kind, &steps) {
        p if p.is_empty() => "(document)".into(),
        p => p,
    }
}

fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.')
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
}

/// The files to read: each path, or for a directory the YAML files in it (`.yaml`, `.yml`,
/// `.json`; not its subdirectories), sorted, as `kubectl apply -f DIR` takes them. A directory
/// without any is an error: a CI gate over the wrong path must not pass on nothing.
pub fn expand(paths: &[String]) -> Result<Vec<String>, Error> {
    let mut files = Vec::new();
    for path in paths {
        if !std::path::Path::new(path).is_dir() {
            files.push(path.clone());
            continue;
        }
        let read_error = |source| Error::ReadFile { path: path.clone(), source };
        let mut found = Vec::new();
        for entry in std::fs::read_dir(path).map_err(read_error)? {
            let p = entry.map_err(read_error)?.path();
            let yaml = p.extension().and_then(|e| e.to_str()).is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
            if yaml && p.is_file() {
                found.push(p.to_string_lossy().into_owned());
            }
        }
        if found.is_empty() {
            return Err(Error::Usage(format!("{path} is a directory without YAML files (.yaml, .yml, .json)")));
        }
        found.sort();
        files.extend(found);
    }
    Ok(files)
}

/// `1 document`, `2 documents`.
fn count(n: usize, noun: &str) -> String {
    if n == 1 { format!("1 {noun}") } else { format!("{n} {noun}s") }
}

/// Runs the subcommand over files and directories; returns the exit status.
pub fn run(paths: &[String], output: Output) -> Result<i32, Error> {
    let mut report = Report::default();
    for f in &expand(paths)? {
        let text = std::fs::read_to_string(f).map_err(|source| Error::ReadFile { path: f.clone(), source })?;
        validate_text(f, &text, &mut report);
    }
    report.finish();
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Output::Text => {
            for e in &report.errors {
                println!("{e}");
            }
            let valid = report.documents.iter().filter(|d| d.valid).count();
            let (docs, errors) = (count(report.documents.len(), "document"), count(report.errors.len(), "error"));
            println!("{docs}, {valid} valid, {errors}");
        }
    }
    Ok(if report.errors.is_empty() { 0 } else { 1 })
}

mod conflicts;
#[cfg(test)]
mod tests;
