//! Acts on `quota::plan_quotas`: server-side-applies one owned, labelled ResourceQuota per tenant
//! namespace (drift is overwritten on the next pass), deletes stale ones, writes quota status.
//! Deleting a TenantGpuQuota removes its ResourceQuotas through their owner references (garbage
//! collector) and through the stale-object sweep here.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tessera_crds::{GpuNode, TenantGpuQuota};
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::Error;
use crate::controller::{MANAGER, watch_into_store};
use crate::metrics::Metrics;
use crate::quota::{QUOTA_LABEL, QUOTA_NAME_ANNOTATION, plan_quotas, quota_label_value, resource_quota_name};

pub struct QuotaController {
    client: Client,
    metrics: Arc<Metrics>,
    quotas: Store<TenantGpuQuota>,
    rqs: Store<ResourceQuota>,
    namespaces: Store<Namespace>,
    gpunodes: Store<GpuNode>,
    changed: Arc<Notify>,
}

impl QuotaController {
    pub fn start(client: Client, metrics: Arc<Metrics>) -> Arc<Self> {
        let changed = Arc::new(Notify::new());
        let d = watcher::Config::default;
        Arc::new(Self {
            quotas: watch_into_store(Api::all(client.clone()), d(), changed.clone()),
            // Every ResourceQuota, not only ours: a user's own one with our name must be seen, so
            // it is never adopted by a force-apply.
            rqs: watch_into_store(Api::all(client.clone()), d(), changed.clone()),
            namespaces: watch_into_store(Api::all(client.clone()), d(), changed.clone()),
            gpunodes: watch_into_store(Api::all(client.clone()), d(), changed.clone()),
            client,
            metrics,
            changed,
        })
    }

    pub async fn wait_ready(&self) {
        let _ = tokio::join!(
            self.quotas.wait_until_ready(),
            self.rqs.wait_until_ready(),
            self.namespaces.wait_until_ready(),
            self.gpunodes.wait_until_ready()
        );
    }

    pub async fn run(self: Arc<Self>) {
        self.wait_ready().await;
        loop {
            if let Err(e) = self.reconcile().await {
                if !matches!(e, Error::PartialPass(_)) {
                    self.metrics.error(e.kind());
                }
                warn!(error = %e, "quota pass failed; retrying");
            }
            tokio::select! {
                _ = self.changed.notified() => tokio::time::sleep(Duration::from_millis(100)).await,
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            }
        }
    }

    pub async fn reconcile(&self) -> Result<(), Error> {
        let quotas: Vec<TenantGpuQuota> = self.quotas.state().iter().map(|q| (**q).clone()).collect();
        let rqs: Vec<ResourceQuota> = self.rqs.state().iter().map(|q| (**q).clone()).collect();
        let namespaces: BTreeSet<String> = self
            .namespaces
            .state()
            .iter()
            .filter(|n| n.metadata.deletion_timestamp.is_none())
            .map(|n| n.name_any())
            .collect();
        let gpunodes: Vec<GpuNode> = self.gpunodes.state().iter().map(|g| (**g).clone()).collect();
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let plan = plan_quotas(&quotas, &namespaces, &rqs, &gpunodes, now.clone());
        // One failing write fails only its quota's part of the pass; the rest goes on, and the
        // failure is reported in that quota's status.
        let mut failures: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for (ns, quota, hard) in &plan.apply {
            let Some(owner) = quotas.iter().find(|q| q.name_any() == *quota) else { continue };
            let name = resource_quota_name(quota);
            let current = rqs.iter().find(|r| r.metadata.namespace.as_deref() == Some(ns) && r.name_any() == name);
            let same = current.and_then(|r| r.spec.as_ref()?.hard.as_ref()).is_some_and(|h| {
                h.len() == hard.len() && hard.iter().all(|(k, v)| h.get(k).is_some_and(|q| q.0 == *v))
            });
            if same {
                continue;
            }
            let body = json!({
                "apiVersion": "v1", "kind": "ResourceQuota",
                "metadata": {"name": name, "namespace": ns,
                    "labels": {QUOTA_LABEL: quota_label_value(quota), "app.kubernetes.io/managed-by": "tessera"},
                    "annotations": {QUOTA_NAME_ANNOTATION: quota},
                    "ownerReferences": [owner.controller_owner_ref(&()).expect("a stored object has a name and uid")]},
                "spec": {"hard": hard}
            });
            info!(namespace = %ns, quota = %quota, "applying ResourceQuota");
            if let Err(e) = Api::<ResourceQuota>::namespaced(self.client.clone(), ns)
                .patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&body))
                .await
            {
                self.metrics.error("kube");
                warn!(namespace = %ns, quota = %quota, error = %e, "could not apply a ResourceQuota");
                failures.entry(quota.clone()).or_default().push(format!("ResourceQuota {name} in {ns}: {e}"));
            }
        }
        let mut failed_deletes = 0;
        // Where an apply failed this pass, delete nothing: the stale ResourceQuota may be the
        // only limit left in that namespace.
        let failed_namespaces: BTreeSet<&str> =
            plan.apply.iter().filter(|(_, q, _)| failures.contains_key(q)).map(|(ns, _, _)| ns.as_str()).collect();
        for (ns, name) in plan.delete.iter().filter(|(ns, _)| !failed_namespaces.contains(ns.as_str())) {
            info!(namespace = %ns, name = %name, "deleting stale ResourceQuota");
            match Api::<ResourceQuota>::namespaced(self.client.clone(), ns).delete(name, &DeleteParams::default()).await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    self.metrics.error("kube");
                    warn!(namespace = %ns, name = %name, error = %e, "could not delete a stale ResourceQuota; retrying");
                    failed_deletes += 1;
                }
            }
        }
        for q in &quotas {
            let Some(planned) = plan.statuses.get(&q.name_any()) else { continue };
            let mut status = planned.clone();
            if let Some(errs) = failures.get(&q.name_any()) {
                let msg = format!("retrying: {}", errs.join("; "));
                let g = q.metadata.generation;
                tessera_crds::conditions::set_condition(
                    &mut status.conditions,
                    tessera_crds::conditions::READY,
                    false,
                    "WriteFailed",
                    &msg,
                    g,
                    now.clone(),
                );
                tessera_crds::conditions::set_condition(
                    &mut status.conditions,
                    tessera_crds::conditions::RECONCILING,
                    true,
                    "WriteFailed",
                    msg,
                    g,
                    now.clone(),
                );
            } else {
                tessera_crds::conditions::remove_condition(
                    &mut status.conditions,
                    tessera_crds::conditions::RECONCILING,
                );
            }
            if q.status.as_ref() == Some(&status) {
                continue;
            }
            let body = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "status": status});
            if let Err(e) = Api::<TenantGpuQuota>::all(self.client.clone())
                .patch_status(&q.name_any(), &PatchParams::apply(MANAGER).force(), &Patch::Apply(&body))
                .await
            {
                self.metrics.error("kube");
                warn!(quota = %q.name_any(), error = %e, "could not write the quota's status; retrying");
                failed_deletes += 1;
            }
        }
        match failures.values().map(Vec::len).sum::<usize>() + failed_deletes {
            0 => Ok(()),
            n => Err(Error::PartialPass(n)),
        }
    }
}
