//! The namespaces no quota claims that keep GPU work unlimited: the operator's open list
//! (`--gpu-open-namespaces`). Every other namespace no quota claims is closed to new GPU work,
//! so a tenant allowed to make namespaces cannot make itself one outside its quota. The list is
//! the operator's configuration, which only whoever deploys the operator writes; a namespace's
//! own labels cannot open it.

use std::collections::BTreeSet;

/// The open list when none is given: kube-system only, which no tenant can make. Add the GPU
/// Operator's namespace (its validators ask for GPUs) and NVIDIA's DRA driver's: a namespace
/// on the list that does not exist yet could be made by a tenant allowed to make namespaces and
/// be open, so the default names none that may be missing.
pub const DEFAULT_OPEN: &str = "kube-system";

/// Namespace names, and prefixes (an entry ending in `*`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OpenNamespaces {
    names: BTreeSet<String>,
    prefixes: Vec<String>,
}

impl OpenNamespaces {
    /// Parses a comma-separated list of namespace names, each optionally ending in `*` (every
    /// namespace whose name starts with the rest). An empty list opens none. `Err` names the
    /// entry and why it is not one.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut out = Self::default();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (stem, prefix) = match entry.strip_suffix('*') {
                Some(stem) => (stem, true),
                None => (entry, false),
            };
            let valid = stem.len() <= 63
                && stem.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !stem.starts_with('-')
                && (prefix || (!stem.is_empty() && !stem.ends_with('-')));
            if !valid {
                return Err(format!(
                    "{entry:?} is not a namespace name (lowercase letters, digits and '-', at most 63) or a name \
                     prefix ending in '*'"
                ));
            }
            if prefix {
                out.prefixes.push(stem.to_string());
            } else {
                out.names.insert(stem.to_string());
            }
        }
        Ok(out)
    }

    /// Whether the list names `namespace`.
    pub fn contains(&self, namespace: &str) -> bool {
        self.names.contains(namespace) || self.prefixes.iter().any(|p| namespace.starts_with(p.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_prefixes_open_exactly_what_they_say() {
        let open = OpenNamespaces::parse("kube-system, gpu-*,").unwrap();
        assert!(open.contains("kube-system"));
        assert!(open.contains("gpu-operator"));
        assert!(!open.contains("kube-system-2"), "a name is not a prefix");
        assert!(!open.contains("team-a"));
        assert!(!OpenNamespaces::parse("").unwrap().contains("kube-system"), "an empty list opens none");
        assert!(OpenNamespaces::parse("*").unwrap().contains("anything"), "`*` opens every unclaimed namespace");
        let default = OpenNamespaces::parse(DEFAULT_OPEN).unwrap();
        assert!(default.contains("kube-system") && !default.contains("gpu-operator") && !default.contains("default"));
    }

    #[test]
    fn a_bad_entry_is_refused_with_its_text() {
        for bad in ["Team-A", "a b", "-x", "x-", "a*b", &"a".repeat(64)] {
            let err = OpenNamespaces::parse(&format!("kube-system,{bad}")).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
        }
    }
}
