//! Whether the fleet honours the tenants' quotas: one rule for the quota controller's
//! `CapacityAvailable`, an automatic plan's `DemandMet` and `plan suggest`, so that for the same
//! fleet they cannot disagree.
//!
//! A slice serves any tenant (nothing ties a quota to nodes), so every quota's guarantee is
//! counted once against the whole fleet's supply. A plan's `quotaSelector` picks the quotas it
//! adds its headroom to; what the other quotas are guaranteed is theirs and is never counted
//! again as supply for the plan's own.

use std::collections::BTreeMap;

use tessera_crds::TenantGpuQuota;
use tessera_crds::validate::validate_quota_limits;

/// Whether a quota's limits are guaranteed: live (not being deleted) and valid (the quota
/// controller enforces nothing new for an invalid one).
pub fn guaranteed(q: &TenantGpuQuota) -> bool {
    q.metadata.deletion_timestamp.is_none() && validate_quota_limits(&q.spec).is_empty()
}

/// What the fleet must supply, per resource name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Demand {
    /// The selected quotas' `hard` limits summed, plus headroom (rounded up).
    pub selected: BTreeMap<String, i64>,
    /// The other guaranteed quotas' limits (no headroom): supply already spoken for.
    pub others: BTreeMap<String, i64>,
    /// The other quotas that ask for anything, by name.
    pub other_quotas: Vec<String>,
}

impl Demand {
    /// The demand of the guaranteed `quotas`: those `selected` get `headroom_percent` (clamped to
    /// 0..=1000) on their sum, the rest count as they are.
    pub fn of<'a>(
        quotas: impl IntoIterator<Item = &'a TenantGpuQuota>,
        selected: impl Fn(&TenantGpuQuota) -> bool,
        headroom_percent: i64,
    ) -> Self {
        let mut d = Demand::default();
        for q in quotas.into_iter().filter(|q| guaranteed(q)) {
            let mine = selected(q);
            let into = if mine { &mut d.selected } else { &mut d.others };
            for (r, n) in &q.spec.hard {
                let e = into.entry(r.clone()).or_default();
                *e = e.saturating_add((*n).max(0));
            }
            if !mine && q.spec.hard.values().any(|n| *n > 0) {
                d.other_quotas.push(q.metadata.name.clone().unwrap_or_default());
            }
        }
        let headroom = headroom_percent.clamp(0, 1000);
        for v in d.selected.values_mut() {
            *v = v.saturating_add(v.saturating_mul(headroom).saturating_add(99) / 100);
        }
        d
    }

    /// Every guaranteed quota, no headroom: what the quota controller holds the fleet to.
    pub fn every<'a>(quotas: impl IntoIterator<Item = &'a TenantGpuQuota>) -> Self {
        Self::of(quotas, |_| true, 0)
    }

    /// What the fleet must supply in all: the selected demand and the others' guarantees.
    pub fn total(&self) -> BTreeMap<String, i64> {
        let mut out = self.selected.clone();
        for (r, n) in &self.others {
            let e = out.entry(r.clone()).or_default();
            *e = e.saturating_add(*n);
        }
        out
    }

    /// What the quotas not selected add to the total, for a plan's message; `None` when nothing.
    pub fn others_note(&self) -> Option<String> {
        let parts: Vec<String> = self.others.iter().filter(|(_, n)| **n > 0).map(|(r, n)| format!("{n} {r}")).collect();
        if parts.is_empty() {
            return None;
        }
        let names = &self.other_quotas;
        let shown = names.iter().take(10).cloned().collect::<Vec<_>>().join(", ");
        let more = if names.len() > 10 { format!(" and {} more", names.len() - 10) } else { String::new() };
        Some(format!(
            "the demand includes {} guaranteed to quota(s) this plan does not select ({shown}{more}), whose supply is \
             not counted as this plan's",
            parts.join(", ")
        ))
    }
}

/// Per resource, how much `demand` exceeds `supply`; only resources that fall short.
pub fn shortfall(demand: &BTreeMap<String, i64>, supply: &BTreeMap<String, i64>) -> BTreeMap<String, i64> {
    demand
        .iter()
        .filter_map(|(r, d)| {
            let short = d.saturating_sub(supply.get(r).copied().unwrap_or(0));
            (short > 0).then(|| (r.clone(), short))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn quota(name: &str, team: &str, hard: serde_json::Value) -> TenantGpuQuota {
        serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
            "metadata": {"name": name, "labels": {"team": team}}, "spec": {"namespaces": [name], "hard": hard}}))
        .unwrap()
    }

    const MIG1G: &str = "nvidia.com/mig-1g.10gb";

    #[test]
    fn headroom_goes_on_the_selected_quotas_only_and_the_others_count_once() {
        let quotas = [
            quota("a", "ml", json!({MIG1G: 3})),
            quota("b", "ml", json!({MIG1G: 4})),
            quota("c", "web", json!({MIG1G: 2, "nvidia.com/gpu": 0})),
        ];
        let d = Demand::of(&quotas, |q| q.metadata.name.as_deref() != Some("c"), 10);
        assert_eq!(d.selected, [(MIG1G.to_string(), 8)].into(), "7 + 10% rounds up to 8");
        assert_eq!(d.others, [(MIG1G.to_string(), 2), ("nvidia.com/gpu".to_string(), 0)].into());
        assert_eq!(d.total(), [(MIG1G.to_string(), 10), ("nvidia.com/gpu".to_string(), 0)].into());
        assert_eq!(d.other_quotas, vec!["c".to_string()]);
        assert!(
            d.others_note()
                .unwrap()
                .contains("2 nvidia.com/mig-1g.10gb guaranteed to quota(s) this plan does not select (c)")
        );
        assert_eq!(Demand::every(&quotas).total(), [(MIG1G.to_string(), 9), ("nvidia.com/gpu".to_string(), 0)].into());
        assert_eq!(Demand::every(&quotas).others_note(), None);
    }

    #[test]
    fn invalid_and_deleted_quotas_are_not_guaranteed_and_huge_ones_saturate() {
        let mut gone = quota("gone", "ml", json!({MIG1G: 5}));
        gone.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-06-01T00:00:00Z".parse().unwrap()));
        let mut invalid = quota("invalid", "ml", json!({MIG1G: 5}));
        invalid.spec.namespaces.clear();
        let huge = quota("huge", "ml", json!({MIG1G: i64::MAX}));
        assert!(!guaranteed(&gone) && !guaranteed(&invalid) && guaranteed(&huge));
        assert_eq!(Demand::every([&gone, &invalid]).total(), BTreeMap::new());
        assert_eq!(Demand::of([&huge, &huge], |_| true, 1000).total()[MIG1G], i64::MAX);
    }

    #[test]
    fn the_shortfall_names_only_what_falls_short() {
        let demand = [(MIG1G.to_string(), 20), ("nvidia.com/gpu".to_string(), 1), ("x".to_string(), 0)].into();
        let supply = [(MIG1G.to_string(), 18), ("nvidia.com/gpu".to_string(), 3)].into();
        assert_eq!(shortfall(&demand, &supply), [(MIG1G.to_string(), 2)].into());
    }
}
