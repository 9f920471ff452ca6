//! Gates mode's pass (`--quota-admission=gates`, `docs/design/quota-gates.md`): the quota plan
//! as in params mode, then what `quota::gates::pass` decides, acted on in this order:
//! Tessera's DeviceClasses and the class list; the ResourceQuotas (their limits the share less
//! what they do not count yet, held by a finalizer); the gates (owned by their ResourceQuota);
//! the namespace labels; the held ResourceQuotas let go; the gates no longer wanted; the params
//! mode's policies, once the gates hold everything ([`super::retire_params`]); the statuses.
//! Each step writes only what differs from the cache, through the writer's tenure check. A
//! failed write fails its quota's part of the pass (or, for what all quotas share, every
//! quota's) and is retried next pass: the order keeps a namespace closed or limited whatever
//! step fails or the process dies after.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use serde_json::json;
use tessera_crds::gate::{CLASS_LIST_NAME, GATE_NAME, GpuClassList, GpuQuotaGate, IN_FORCE_FINALIZER, MARK};
use tessera_planner::quota::claims::resource_of_class;
use tessera_planner::quota::gates::namespace::{claim_holders, class_list};
use tessera_planner::quota::gates::pass::{GateInputs, GatePlan, PlannedGate, gate_is, plan_gates};
use tracing::{info, warn};

use super::{Inputs, QuotaController, gpu_pods, writes};
use crate::Error;
use crate::writer::{Manager, Write};

impl QuotaController {
    /// One gates-mode pass (see the module).
    pub(super) async fn reconcile_gates(&self) -> Result<(), Error> {
        let inputs = self.observe();
        let mut plan = self.plan(&inputs);
        // The cached gates, read once: the plan and the writes judge against the same copy.
        let cached: Vec<GpuQuotaGate> = self.gates.state().iter().map(|g| (**g).clone()).collect();
        let gates = self.plan_gates(&inputs, &plan, &cached);
        // The share is what the plan computed; the ResourceQuota is written with less while it
        // does not count objects made before. The params mode's in-force stamps are still
        // written: no gate decision reads them, but the quota plan's stale-ResourceQuota list
        // does (`pod_gate::enforced`), until params mode goes.
        for a in &mut plan.apply {
            if let Some(limits) = gates.limits.get(&(a.namespace.clone(), a.name.clone())) {
                a.hard = limits.clone();
            }
        }
        let (mut shared, _) = self.write_claim_classes(&plan, &inputs.classes).await?;
        shared.extend(self.write_class_list(&inputs).await?);
        let mut failures = writes::Failures::new();
        self.apply_resource_quotas(&inputs, &plan, &mut failures).await?;
        self.write_gates(&inputs, &gates, &cached, &mut failures).await?;
        let unlabelled = self.write_labels(&gates).await?;
        shared.extend(unlabelled);
        self.release(&inputs, &gates, &mut failures).await?;
        shared.extend(self.delete_stale_gates(&gates).await?);
        let idle = self.idle_report(&inputs.quotas).await;
        let policies = self.check_gate_policies().await;
        let failed = shared.len() + failures.values().map(Vec::len).sum::<usize>();
        shared.extend(self.retire_params(&gates, &policies, failed).await?);
        let reports = writes::Reports { shared: &shared, failures: &failures, policies: &policies, idle: &idle };
        let unsent = self.write_statuses(&inputs, &plan, &reports).await?;
        match shared.len() + failures.values().map(Vec::len).sum::<usize>() + unsent {
            0 => Ok(()),
            n => Err(Error::PartialPass(n)),
        }
    }

    /// The pass's gate decisions from the plan and the caches.
    fn plan_gates(&self, i: &Inputs, plan: &tessera_planner::quota::QuotaPlan, gates: &[GpuQuotaGate]) -> GatePlan {
        let namespaces: Vec<Namespace> = self.namespaces.state().iter().map(|n| (**n).clone()).collect();
        let pods = gpu_pods::holders(&self.gpu_pods);
        let gpu_class = |c: &str| i.dra.classes.reaching.contains(c) || resource_of_class(c).is_some();
        let mut claims: BTreeMap<String, Vec<_>> = BTreeMap::new();
        for c in self.claims.claims() {
            let ns = c.namespace().unwrap_or_default();
            claims.entry(ns).or_default().extend(claim_holders([&*c], gpu_class));
        }
        plan_gates(&GateInputs {
            apply: &plan.apply,
            delete: &plan.delete,
            statuses: &plan.statuses,
            claimed: &claimed(&i.quotas),
            open: &self.open,
            rqs: &i.rqs,
            gates,
            namespaces: &namespaces,
            pods: &pods,
            claims: &claims,
        })
    }

    /// Applies the class list where it differs; a failure concerns every quota.
    async fn write_class_list(&self, i: &Inputs) -> Result<Option<String>, Error> {
        let spec = class_list(i.classes.iter().map(|c| &**c), &self.drivers, &i.dra.classes.mismatched);
        let api = Api::<GpuClassList>::all(self.client.clone());
        let cached = self.class_list_cache(&api).await;
        if cached.as_ref() == Some(&spec) {
            return Ok(None);
        }
        let body = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuClassList",
            "metadata": {"name": CLASS_LIST_NAME}, "spec": spec});
        info!("applying the GPU class list");
        let sent = self.writer().send_counted(&api, CLASS_LIST_NAME, Write::apply(Manager::Operator, &body)).await?;
        Ok(sent.err().map(|e| format!("GpuClassList {CLASS_LIST_NAME}: {e}")))
    }

    /// The class list as stored (read each pass: one small object, so an edit or a deletion is
    /// undone within a pass); `None` when it cannot be read or does not exist.
    async fn class_list_cache(&self, api: &Api<GpuClassList>) -> Option<tessera_crds::gate::GpuClassListSpec> {
        api.get_opt(CLASS_LIST_NAME).await.ok().flatten().map(|l| l.spec)
    }

    /// Applies each planned gate whose cached one differs, owned by its ResourceQuota as cached
    /// (none yet: next pass, once the ResourceQuota's creation is seen), or by nothing where the
    /// plan names no owner.
    async fn write_gates(
        &self,
        i: &Inputs,
        plan: &GatePlan,
        cached: &[GpuQuotaGate],
        failures: &mut writes::Failures,
    ) -> Result<(), Error> {
        for g in plan.gates.values() {
            let owner = match &g.owner {
                None => None,
                Some(name) => {
                    let cached =
                        i.rqs.iter().find(|r| r.namespace().as_deref() == Some(&g.namespace) && &r.name_any() == name);
                    let Some(owner) = cached.filter(|o| o.metadata.uid.is_some()) else { continue };
                    Some(owner)
                }
            };
            if gate_is(cached, g, owner) {
                continue;
            }
            let body = gate_body(g, owner);
            let api = Api::<GpuQuotaGate>::namespaced(self.client.clone(), &g.namespace);
            info!(namespace = %g.namespace, quota = %g.spec.quota, "applying the namespace's GPU quota gate");
            if let Err(e) = self.writer().send_counted(&api, GATE_NAME, Write::apply(Manager::Operator, &body)).await? {
                warn!(namespace = %g.namespace, error = %e, "could not apply a GPU quota gate; retrying");
                let msg = format!("GpuQuotaGate {GATE_NAME} in {}: {e}", g.namespace);
                failures.entry(g.spec.quota.clone()).or_default().push(msg);
            }
        }
        Ok(())
    }

    /// Deletes the gates no quota wants any more (their namespace labelled open or closed);
    /// returns what failed (a gate left behind admits nothing the label does not).
    async fn delete_stale_gates(&self, plan: &GatePlan) -> Result<Vec<String>, Error> {
        let mut failed = Vec::new();
        for ns in &plan.stale_gates {
            let api = Api::<GpuQuotaGate>::namespaced(self.client.clone(), ns);
            info!(namespace = %ns, "deleting a GPU quota gate no quota wants");
            if let Err(e) = self.writer().delete_counted(&api, GATE_NAME, &DeleteParams::default()).await? {
                let gone = matches!(&e, kube::Error::Api(s) if s.code == 404);
                if !gone {
                    failed.push(format!("deleting GpuQuotaGate {GATE_NAME} in {ns}: {e}"));
                }
            }
        }
        Ok(failed)
    }

    /// Sets the namespace labels the plan changes; returns what failed (for every quota's status:
    /// the labels say which namespaces are enforced). A merge patch, not an apply: a namespace
    /// deleted meanwhile must not be made again.
    async fn write_labels(&self, plan: &GatePlan) -> Result<Vec<String>, Error> {
        let mut failed = Vec::new();
        for (ns, value) in &plan.labels {
            let body = json!({"metadata": {"labels": {MARK: value}}});
            let api = Api::<Namespace>::all(self.client.clone());
            info!(namespace = %ns, label = %value, "labelling the namespace for GPU admission");
            if let Err(e) = self.writer().send_counted(&api, ns, Write::merge(&body)).await? {
                warn!(namespace = %ns, error = %e, "could not label a namespace; retrying");
                failed.push(format!("Namespace {ns} label {MARK}: {e}"));
            }
        }
        Ok(failed)
    }

    /// Lets go of the held ResourceQuotas the plan releases (their finalizer), then deletes
    /// those not yet deleted. In this order each write is sent against the version read: the
    /// finalizer patch carries its resourceVersion, so one another controller added since is not
    /// dropped, and a delete sent first would change that version. A crash between the two
    /// leaves a stale ResourceQuota without the finalizer, which the next pass deletes (it is
    /// still in force until then).
    async fn release(&self, i: &Inputs, plan: &GatePlan, failures: &mut writes::Failures) -> Result<(), Error> {
        for (ns, name) in &plan.releases {
            let Some(rq) = i.rqs.iter().find(|r| r.namespace().as_deref() == Some(ns) && &r.name_any() == name) else {
                continue;
            };
            let quota = tessera_planner::quota::written_by(rq).unwrap_or_default().to_string();
            let api = Api::<ResourceQuota>::namespaced(self.client.clone(), ns);
            info!(namespace = %ns, name = %name, "letting go of a held ResourceQuota");
            // Gone once ours is off and it is deleted: remembered, so a lagging cache that still
            // shows it is not taken for a ResourceQuota in force ([`super::deleted`]).
            let last = rq.finalizers().iter().all(|f| f == IN_FORCE_FINALIZER);
            if rq.finalizers().iter().any(|f| f == IN_FORCE_FINALIZER) {
                let kept: Vec<&String> = rq.finalizers().iter().filter(|f| *f != IN_FORCE_FINALIZER).collect();
                let body = json!({"metadata": {"finalizers": kept, "resourceVersion": rq.resource_version()}});
                if let Err(e) = self.writer().send_counted(&api, name, Write::merge(&body)).await? {
                    if !matches!(&e, kube::Error::Api(s) if s.code == 404) {
                        failures.entry(quota).or_default().push(format!("releasing ResourceQuota {name} in {ns}: {e}"));
                    }
                    continue;
                }
            }
            let deleted = match rq.metadata.deletion_timestamp {
                Some(_) => true,
                None => match self.writer().delete_counted(&api, name, &DeleteParams::default()).await? {
                    Ok(_) => true,
                    Err(kube::Error::Api(s)) if s.code == 404 => true,
                    Err(e) => {
                        failures.entry(quota).or_default().push(format!("deleting ResourceQuota {name} in {ns}: {e}"));
                        false
                    }
                },
            };
            if deleted && last {
                self.deleted.remember(rq);
            }
        }
        Ok(())
    }
}

/// Each namespace a quota names, by the first quota (by name) naming it; quotas being deleted
/// claim nothing (their ResourceQuotas are held until the namespace's new limits are in force).
fn claimed(quotas: &[tessera_crds::TenantGpuQuota]) -> BTreeMap<String, String> {
    let live = quotas.iter().filter(|q| q.metadata.deletion_timestamp.is_none());
    let names = live.map(|q| (q.metadata.name.as_deref().unwrap_or_default(), &q.spec.namespaces[..]));
    tessera_planner::quota::namespace_claims(names)
        .into_iter()
        .filter_map(|(ns, qs)| Some((ns.to_string(), qs.first()?.to_string())))
        .collect()
}

/// An ownerless gate is applied with no ownerReferences: the apply drops those it set before.
fn gate_body(g: &PlannedGate, owner: Option<&ResourceQuota>) -> serde_json::Value {
    let owners: Vec<serde_json::Value> = owner
        .map(|o| {
            json!({"apiVersion": "v1", "kind": "ResourceQuota", "name": o.name_any(),
                "uid": o.metadata.uid, "blockOwnerDeletion": false})
        })
        .into_iter()
        .collect();
    json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuQuotaGate",
        "metadata": {"name": GATE_NAME, "namespace": g.namespace,
            "labels": {"app.kubernetes.io/managed-by": "tessera"},
            "ownerReferences": owners},
        "spec": g.spec})
}
