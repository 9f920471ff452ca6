//! A quota pass's writes of ResourceQuotas (applied, stale ones deleted) and quota statuses
//! (Tessera's DeviceClasses and the policy params: `claim_classes`). Each write goes through the
//! controller's `Writer`, which first checks the tenure: once the lease may have passed, the pass
//! ends ([`Error::NotLeader`]).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ResourceQuota;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use tessera_crds::TenantGpuQuota;
use tessera_crds::quota::TenantGpuQuotaStatus;
use tessera_planner::quota::{QuotaPlan, report_write_failures};
use tracing::{info, warn};

use super::{Inputs, QuotaController, is_current, pending_pods, report_policies};
use crate::Error;
use crate::writer::bodies::StatusApply;
use crate::writer::{Manager, Write};

/// Errors per quota (by name), for its status.
pub(super) type Failures = BTreeMap<String, Vec<String>>;

/// What each quota's status reports besides its plan.
pub(super) struct Reports<'a> {
    /// Failed writes that concern every quota (Tessera's classes, the policy params).
    pub shared: &'a [String],
    pub failures: &'a Failures,
    /// The shipped policies' and bindings' check ([`QuotaController::check_policies`]).
    pub policies: &'a super::PolicyCheck,
    pub idle: &'a tessera_planner::idle::Outcome,
}

impl QuotaController {
    /// Applies each planned ResourceQuota the cache does not show as current; a failed one is
    /// recorded for its quota. Returns the namespaces where one failed.
    pub(super) async fn apply_resource_quotas<'p>(
        &self,
        i: &Inputs,
        plan: &'p QuotaPlan,
        failures: &mut Failures,
    ) -> Result<BTreeSet<&'p str>, Error> {
        let mut unwritten = BTreeSet::new();
        for a in &plan.apply {
            let Some(owner) = i.quotas.iter().find(|q| q.name_any() == a.quota) else { continue };
            let current =
                i.rqs.iter().find(|r| r.metadata.namespace.as_ref() == Some(&a.namespace) && r.name_any() == a.name);
            if current.is_some_and(|rq| is_current(rq, a, self.admission == super::QuotaAdmission::Gates)) {
                continue;
            }
            if let Err(e) = self.apply(owner, a).await? {
                warn!(namespace = %a.namespace, quota = %a.quota, error = %e, "could not apply a ResourceQuota");
                failures
                    .entry(a.quota.clone())
                    .or_default()
                    .push(format!("ResourceQuota {} in {}: {e}", a.name, a.namespace));
                unwritten.insert(a.namespace.as_str());
            }
        }
        Ok(unwritten)
    }

    /// Deletes the planned stale ResourceQuotas, none while the params are `stale_params` nor
    /// in a namespace where a write failed (`unwritten`); a failed delete is recorded for its quota.
    pub(super) async fn delete_stale_resource_quotas(
        &self,
        i: &Inputs,
        plan: &QuotaPlan,
        stale_params: bool,
        unwritten: &BTreeSet<&str>,
        failures: &mut Failures,
    ) -> Result<(), Error> {
        for d in &plan.delete {
            if stale_params {
                // The params write failed: they may still name the quota of this ResourceQuota
                // (a namespace moving from A to B, not pending) while B's new one enforces
                // nothing yet. Deleting it would leave the namespace unlimited; next pass.
                warn!(namespace = %d.namespace, name = %d.name, "policy params not written: stale ResourceQuota kept");
                continue;
            }
            if unwritten.contains(d.namespace.as_str()) {
                // A write failed in this namespace: a stale ResourceQuota may be the only limit
                // left there (its replacement, or another quota's share, was not written).
                continue;
            }
            self.writer().may_write()?;
            info!(namespace = %d.namespace, name = %d.name, "deleting stale ResourceQuota");
            let api = Api::<ResourceQuota>::namespaced(self.client.clone(), &d.namespace);
            let cached =
                i.rqs.iter().find(|r| r.metadata.namespace.as_ref() == Some(&d.namespace) && r.name_any() == d.name);
            // Deleted, or found already gone: hidden while the cache still shows it.
            match self.writer().delete_counted(&api, &d.name, &DeleteParams::default()).await? {
                Ok(()) => cached.into_iter().for_each(|r| self.deleted.remember(r)),
                Err(e) => {
                    warn!(namespace = %d.namespace, name = %d.name, error = %e, "could not delete a stale ResourceQuota");
                    let msg = format!("deleting stale ResourceQuota {} in {}: {e}", d.name, d.namespace);
                    failures.entry(d.quota.clone()).or_default().push(msg);
                }
            }
        }
        Ok(())
    }

    /// Writes each planned quota status, with its activity and what the pass reports, where it
    /// differs from the cached one. Returns how many writes failed.
    pub(super) async fn write_statuses(&self, i: &Inputs, plan: &QuotaPlan, r: &Reports<'_>) -> Result<usize, Error> {
        let thresholds = tessera_planner::idle::idle_thresholds(&i.quotas);
        let mut failed = 0;
        for q in &i.quotas {
            let Some(planned) = plan.statuses.get(&q.name_any()) else { continue };
            let status = status_of(q, planned.clone(), i, r, &thresholds);
            if q.status.as_ref() == Some(&status) {
                continue;
            }
            let body = StatusApply::of::<TenantGpuQuota>(&status);
            let api = Api::<TenantGpuQuota>::all(self.client.clone());
            let write = Write::apply(Manager::Operator, &body).status();
            if let Err(e) = self.writer().send_counted(&api, &q.name_any(), write).await? {
                warn!(quota = %q.name_any(), error = %e, "could not write the quota's status; retrying");
                failed += 1;
            }
        }
        Ok(failed)
    }
}

/// `q`'s `planned` status with its activity, the pass's failed writes (its own and the shared
/// ones), the claim-class policy's check and whether the unbound pods are listed.
fn status_of(
    q: &TenantGpuQuota,
    mut status: TenantGpuQuotaStatus,
    i: &Inputs,
    r: &Reports<'_>,
    thresholds: &BTreeMap<String, k8s_openapi::jiff::SignedDuration>,
) -> TenantGpuQuotaStatus {
    let previous = q.status.as_ref().and_then(|s| s.activity.as_ref());
    status.activity = tessera_planner::idle::status_activity(r.idle, previous, &q.name_any(), thresholds);
    let mut errors = r.failures.get(&q.name_any()).cloned().unwrap_or_default();
    errors.extend(r.shared.iter().cloned());
    report_write_failures(&mut status, &errors, q.metadata.generation, &i.now);
    report_policies(&mut status, r.policies, q.metadata.generation, &i.now);
    pending_pods::report_pod_watch(&mut status, !i.dra.pods_unknown, q.metadata.generation, &i.now);
    status
}
