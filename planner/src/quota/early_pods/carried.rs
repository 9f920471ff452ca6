//! `<ns>.pods` while the unbound-pod cache is not listed (an upgrade that replaced the image but
//! not the ClusterRole: `watch pods` is missing). The quota passes go on (a namespace added to a
//! quota gets its ResourceQuota, lowered limits are written) with the stored params' `<ns>.pods`
//! carried unchanged: pods listed stay refused (fails closed); no namespace gets a new list.

use std::collections::BTreeMap;

use super::{ALL_PODS, PODS_CAP, pods_key};

/// The stored params' (`stored`) `<ns>.pods` of each tenant namespace of `policy`
/// (`<ns>.quota`), unchanged; within [`PODS_CAP`] and the shared `budget` (in namespace order)
/// as [`super::policy_pods`] counts them, else [`ALL_PODS`]. A namespace no quota claims any
/// more keeps none (the binding policy reads no key there).
pub fn carried(
    stored: &BTreeMap<String, String>,
    policy: &BTreeMap<String, String>,
    budget: usize,
) -> BTreeMap<String, String> {
    let mut used = 0;
    stored
        .iter()
        .filter_map(|(k, v)| {
            let ns = k.strip_suffix(".pods").filter(|ns| !ns.contains('.'))?;
            policy.contains_key(&format!("{ns}.quota")).then_some((ns, v))
        })
        .map(|(ns, list)| {
            if list.len() > PODS_CAP || used + list.len() > budget {
                return (pods_key(ns), ALL_PODS.to_string());
            }
            used += list.len();
            (pods_key(ns), list.clone())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_stored_lists_of_tenant_namespaces_are_carried_within_the_budget() {
        let stored = map(&[
            ("x.pods", "a b"),
            ("y.pods", "_all"),
            ("gone.pods", "z"),
            ("x.since", "2026-06-01T10:00:00Z"),
            ("w.pods", "0123456789"),
        ]);
        let policy = map(&[("x.quota", "q"), ("y.quota", "q"), ("w.quota", "q"), ("new.quota", "q")]);
        let got = carried(&stored, &policy, usize::MAX);
        assert_eq!(got, map(&[("x.pods", "a b"), ("y.pods", "_all"), ("w.pods", "0123456789")]));
        // In name order: `w` (10 characters) spends the budget, `x` (3) does not fit.
        let got = carried(&stored, &policy, 12);
        assert_eq!(got, map(&[("w.pods", "0123456789"), ("x.pods", ALL_PODS), ("y.pods", "_all")]));
    }
}
