//! The tenant quotas a plan's layouts could no longer honour: the quota controller's own
//! capacity check ([`plan_quotas_with`], which writes `CapacityAvailable`) run on the fleet's
//! supply before and after the plan, so a preview and the controller cannot disagree.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Serialize;
use tessera_crds::TenantGpuQuota;
use tessera_crds::conditions::CAPACITY_AVAILABLE;
use tessera_crds::validate::validate_quota_limits;

use tessera_planner::quota::{Capacity, QuotaPlan, plan_quotas_with};

/// A quota whose `CapacityAvailable` the plan turns `False` (or leaves `False` and makes worse
/// on a resource the quota asks for).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct QuotaShort {
    pub quota: String,
    /// The resources the plan leaves shorter than before.
    pub resources: Vec<ResourceShort>,
    /// `CapacityAvailable` before the plan: `True`, or `False` when it was short already.
    pub capacity_available_before: String,
}

/// One resource all quotas together ask more of than the fleet would supply.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ResourceShort {
    pub resource: String,
    /// What the valid quotas ask for together.
    pub quotas: i64,
    /// What the fleet's layouts supply before and after the plan.
    pub fleet_before: i64,
    pub fleet_after: i64,
    /// `quotas - fleet_after`.
    pub short: i64,
}

impl fmt::Display for QuotaShort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.capacity_available_before.as_str() {
            "True" => write!(f, "quota {}: CapacityAvailable True -> False:", self.quota)?,
            _ => write!(f, "quota {}: CapacityAvailable False already, and shorter:", self.quota)?,
        }
        for (i, r) in self.resources.iter().enumerate() {
            let sep = if i == 0 { " " } else { "; " };
            write!(
                f,
                "{sep}{}: quotas ask {}, fleet {} -> {}, short {}",
                r.resource, r.quotas, r.fleet_before, r.fleet_after, r.short
            )?;
        }
        Ok(())
    }
}

fn capacity_available(plan: &QuotaPlan, quota: &str) -> Option<String> {
    let st = plan.statuses.get(quota)?;
    st.conditions.iter().find(|c| c.type_ == CAPACITY_AVAILABLE).map(|c| c.status.clone())
}

/// The quotas the fleet honours before (`before`) but not after (`after`) the plan, or honours
/// less on a resource they ask for.
pub fn short(quotas: &[TenantGpuQuota], before: &Capacity, after: &Capacity) -> Vec<QuotaShort> {
    // Only the capacity verdict is read: namespaces and ResourceQuotas do not enter it.
    let (none, now) = (BTreeSet::new(), Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    let was = plan_quotas_with(quotas, &none, &[], before, now.clone());
    let will = plan_quotas_with(quotas, &none, &[], after, now);
    let supply = |c: &Capacity, r: &str| c.supply.get(r).copied().unwrap_or(0);
    let worse: BTreeMap<&str, ResourceShort> = will
        .shortfall
        .iter()
        .filter(|(r, s)| **s > was.shortfall.get(*r).copied().unwrap_or(0))
        .map(|(r, &s)| {
            let fleet_after = supply(after, r);
            let row = ResourceShort {
                resource: r.clone(),
                quotas: fleet_after + s,
                fleet_before: supply(before, r),
                fleet_after,
                short: s,
            };
            (r.as_str(), row)
        })
        .collect();
    if worse.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    // An invalid quota asks for nothing (the controller leaves its conditions as they were).
    for q in quotas.iter().filter(|q| validate_quota_limits(&q.spec).is_empty()) {
        let name = q.metadata.name.clone().unwrap_or_default();
        let (then, now) = (capacity_available(&was, &name), capacity_available(&will, &name));
        if now.as_deref() != Some("False") {
            continue;
        }
        let resources: Vec<ResourceShort> = if then.as_deref() == Some("True") {
            worse.values().cloned().collect()
        } else {
            worse.values().filter(|r| q.spec.hard.contains_key(&r.resource)).cloned().collect()
        };
        if !resources.is_empty() {
            let capacity_available_before = then.unwrap_or_default();
            out.push(QuotaShort { quota: name, resources, capacity_available_before });
        }
    }
    out
}
