//! Quotas that select namespaces by label (`spec.namespaceSelector`): each pass reads them as
//! if they named every namespace they select ([`resolve`]), so the rest of the plan (shares,
//! conflicts, gates) sees one list per quota. A namespace selected by two quotas, or named by
//! one and selected by another, is claimed twice: a Conflict on both, as with names.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use tessera_crds::TenantGpuQuota;
use tessera_crds::validate::namespace_selector_errors;

use crate::selector::matches;

/// The quotas with `spec.namespaces` as named plus every live namespace (not terminating) the
/// selector matches, sorted by name after those named (an Even split gives the remainder to the
/// first). A selector that is not valid selects no new namespace, but keeps those where the
/// quota has a ResourceQuota (`rqs`): the quota is refused, and its namespaces stay closed
/// rather than leave it.
pub fn resolve<'a>(
    quotas: Vec<TenantGpuQuota>,
    namespaces: impl IntoIterator<Item = &'a Namespace> + Clone,
    rqs: &[ResourceQuota],
) -> Vec<TenantGpuQuota> {
    quotas
        .into_iter()
        .map(|mut q| {
            let Some(sel) = q.spec.namespace_selector.clone() else { return q };
            if !namespace_selector_errors(&sel).is_empty() {
                let name = q.metadata.name.clone().unwrap_or_default();
                let held: BTreeSet<String> = rqs
                    .iter()
                    .filter(|r| crate::quota::written_by(r) == Some(name.as_str()))
                    .filter_map(|r| r.metadata.namespace.clone())
                    .filter(|ns| !q.spec.namespaces.contains(ns))
                    .collect();
                q.spec.namespaces.extend(held);
                return q;
            }
            let named: BTreeSet<String> = q.spec.namespaces.iter().cloned().collect();
            let selected: BTreeSet<String> = namespaces
                .clone()
                .into_iter()
                .filter(|n| n.metadata.deletion_timestamp.is_none())
                .filter(|n| matches(&sel, n.metadata.labels.as_ref().unwrap_or(&Default::default())))
                .filter_map(|n| n.metadata.name.clone())
                .filter(|n| !named.contains(n))
                .collect();
            q.spec.namespaces.extend(selected);
            q
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ns(name: &str, labels: serde_json::Value, terminating: bool) -> Namespace {
        let mut v = json!({"metadata": {"name": name, "labels": labels}});
        if terminating {
            v["metadata"]["deletionTimestamp"] = json!("2026-12-01T00:00:00Z");
        }
        serde_json::from_value(v).unwrap()
    }

    fn quota(spec: serde_json::Value) -> TenantGpuQuota {
        serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
            "metadata": {"name": "team-a"}, "spec": spec}))
        .unwrap()
    }

    #[test]
    fn a_selector_adds_the_live_namespaces_it_matches_after_those_named() {
        let namespaces = [
            ns("z-team", json!({"team": "a"}), false),
            ns("b-team", json!({"team": "a"}), false),
            ns("gone", json!({"team": "a"}), true),
            ns("other", json!({"team": "b"}), false),
            ns("named", json!({"team": "a"}), false),
        ];
        let q = quota(json!({"namespaces": ["named"], "namespaceSelector": {"matchLabels": {"team": "a"}},
            "hard": {"nvidia.com/gpu": 4}}));
        let got = resolve(vec![q], &namespaces, &[]);
        assert_eq!(got[0].spec.namespaces, ["named", "b-team", "z-team"], "named first, then selected by name, once");
    }

    #[test]
    fn a_selector_that_is_not_valid_selects_nothing() {
        let namespaces = [ns("kube-system", json!({}), false), ns("a", json!({"tessera.dev/gpu-gate": "open"}), false)];
        for sel in [
            json!({}),
            json!({"matchLabels": {"tessera.dev/gpu-gate": "open"}}),
            json!({"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["b"]}]}),
        ] {
            let q = quota(json!({"namespaceSelector": sel, "hard": {"nvidia.com/gpu": 4}}));
            assert!(resolve(vec![q], &namespaces, &[])[0].spec.namespaces.is_empty(), "{sel}");
        }
        // Edited to an invalid one: the namespaces it holds ResourceQuotas in stay claimed (closed).
        let held: ResourceQuota =
            serde_json::from_value(json!({"metadata": {"name": "tessera-team-a", "namespace": "a",
            "labels": {"tessera.dev/quota": "team-a"},
            "ownerReferences": [{"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "name": "team-a",
                "uid": "u", "controller": true}]}}))
            .unwrap();
        let q = quota(json!({"namespaceSelector": {}, "hard": {"nvidia.com/gpu": 4}}));
        assert_eq!(resolve(vec![q], &namespaces, &[held])[0].spec.namespaces, ["a"]);
        // Without a selector, unchanged.
        let q = quota(json!({"namespaces": ["a"], "hard": {"nvidia.com/gpu": 4}}));
        assert_eq!(resolve(vec![q], &namespaces, &[])[0].spec.namespaces, ["a"]);
    }
}
