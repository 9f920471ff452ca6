//! Checks over every document `validate` read: two TenantGpuQuotas claiming one namespace.

use super::{DocError, Report};

/// The namespaces one TenantGpuQuota document claims.
#[derive(Debug)]
pub(super) struct Claim {
    pub(super) file: String,
    pub(super) doc: usize,
    pub(super) name: String,
    pub(super) namespaces: Vec<String>,
}

impl Report {
    /// The checks over every document read: a namespace that two quotas claim is an error on
    /// both, by the rule the quota controller applies (`quota::namespace_claims`): once applied,
    /// neither quota would be enforced there.
    pub fn finish(&mut self) {
        let claims =
            tessera_planner::quota::namespace_claims(self.claims.iter().map(|c| (c.name.as_str(), &c.namespaces[..])));
        let mut found = Vec::new();
        for c in &self.claims {
            let mut seen = std::collections::BTreeSet::new();
            for (i, ns) in c.namespaces.iter().enumerate() {
                let Some(names) = claims.get(ns.as_str()).filter(|n| n.len() > 1) else { continue };
                if !seen.insert(ns) {
                    continue;
                }
                let others: Vec<String> = self
                    .claims
                    .iter()
                    .filter(|o| o.name != c.name && names.contains(o.name.as_str()) && o.namespaces.contains(ns))
                    .map(|o| format!("{:?} ({}:doc {})", o.name, o.file, o.doc))
                    .collect();
                found.push(DocError {
                    file: c.file.clone(),
                    doc: c.doc,
                    field: format!("spec.namespaces[{i}]"),
                    reason: format!(
                        "namespace {ns:?} is also claimed by TenantGpuQuota {}; once applied, neither quota \
                         is enforced there (condition Conflict)",
                        others.join(", ")
                    ),
                });
            }
        }
        for e in &found {
            for d in self.documents.iter_mut().filter(|d| d.file == e.file && d.doc == e.doc) {
                d.valid = false;
            }
        }
        self.errors.extend(found);
    }
}
