//! Writes what `quota::claims` plans besides ResourceQuotas: Tessera's DeviceClasses
//! (server-side apply, labelled managed-by tessera; never deleted, claims may use them) and the
//! params ConfigMap the claim-class ValidatingAdmissionPolicy reads. A failed write is retried
//! next pass; the ResourceQuota keys written meanwhile hold the limits either way.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::api::Api;
use serde_json::json;
use tracing::{debug, info, warn};

use super::QuotaController;
use super::policy_check::{
    BINDINGS, Checked, NOT_ENFORCING, PODS, QUOTA_NAMES, params_binding_problem, policy_problems, problems,
};
use crate::Error;
use crate::writer::{Manager, Write};
use tessera_planner::quota::QuotaPlan;
use tessera_planner::quota::claims::{ClassApply, POLICY_PARAMS, binding_problem, spec_matches};

const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "tessera");

impl QuotaController {
    /// Applies the planned classes that differ from the cluster's and the policy params when
    /// they changed; returns what failed (reported on every quota's status: the params serve all
    /// tenant namespaces), and whether the params stayed unwritten (stale: the pass must delete
    /// no ResourceQuota, the stale params may still describe it as the namespace's limit).
    /// [`Error::NotLeader`] before any write once the lease may have passed.
    pub(super) async fn write_claim_classes(
        &self,
        plan: &QuotaPlan,
        classes: &[Arc<DeviceClass>],
    ) -> Result<(Vec<String>, bool), Error> {
        let mut failed = Vec::new();
        for c in &plan.device_classes {
            if classes.iter().any(|have| is_current(have, c)) {
                continue;
            }
            self.writer().may_write()?;
            let body = json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": c.name, "labels": {MANAGED_BY.0: MANAGED_BY.1}},
                "spec": {"selectors": [{"cel": {"expression": c.expression}}]}});
            info!(class = %c.name, "applying DeviceClass");
            let api = Api::<DeviceClass>::all(self.client.clone());
            if let Err(e) = self.writer().send_counted(&api, &c.name, Write::apply(Manager::Operator, &body)).await? {
                warn!(class = %c.name, error = %e, "could not apply a DeviceClass; retrying");
                failed.push(format!("DeviceClass {}: {e}", c.name));
            }
        }
        let have = self.policy_params.state().first().and_then(|cm| cm.data.clone()).unwrap_or_default();
        let mut stale = false;
        if have != plan.policy
            && let Err(e) = self.write_policy(&plan.policy).await?
        {
            failed.push(format!("claim-class policy params ConfigMap {}/{POLICY_PARAMS}: {e}", self.namespace));
            stale = true;
        }
        Ok((failed, stale))
    }

    /// Applies the policy params ConfigMap; a failure is counted, logged and handed back inside,
    /// [`Error::NotLeader`] outside (nothing sent).
    async fn write_policy(&self, data: &BTreeMap<String, String>) -> Result<kube::Result<()>, Error> {
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": POLICY_PARAMS, "namespace": self.namespace,
                "labels": {MANAGED_BY.0: MANAGED_BY.1}},
            "data": data});
        let api = Api::<ConfigMap>::namespaced(self.client.clone(), &self.namespace);
        let written = self.writer().send_counted(&api, POLICY_PARAMS, Write::apply(Manager::Operator, &body)).await?;
        Ok(written.map(|_| ()).inspect_err(|e| {
            warn!(namespace = %self.namespace, error = %e, "could not write the claim-class policy params; retrying");
        }))
    }
}

impl QuotaController {
    /// Reads the claim-class policy's binding and the policy: `Some((reason, problem))`
    /// ([`binding_problem`]: `ParamsNotRead`; [`policy_problems`]: `PolicyNotEnforcing`), or
    /// `None` where either cannot be read (no RBAC for them: not checked). Read every pass, so
    /// an edit is seen within one. A problem is logged when it changes and counted every pass
    /// (`claim_policy_binding`).
    pub(super) async fn check_binding(&self) -> Option<Option<(&'static str, String)>> {
        let api = Api::<ValidatingAdmissionPolicyBinding>::all(self.client.clone());
        let binding = match api.get_opt(POLICY_PARAMS).await {
            Ok(b) => b,
            Err(e) => {
                debug!(error = %e, "could not read the claim-class policy binding; not checked");
                return None;
            }
        };
        let found = match (binding_problem(binding.as_ref(), &self.namespace), binding) {
            (Some(problem), _) => Some((tessera_crds::conditions::quota_reasons::PARAMS_NOT_READ, problem)),
            (None, None) => None, // `binding_problem` names a missing binding
            (None, Some(binding)) => {
                let api = Api::<ValidatingAdmissionPolicy>::all(self.client.clone());
                let policy = match api.get_opt(POLICY_PARAMS).await {
                    Ok(p) => p,
                    Err(e) => {
                        debug!(error = %e, "could not read the claim-class policy; not checked");
                        return None;
                    }
                };
                let problems = policy_problems(policy.as_ref(), &binding);
                (!problems.is_empty()).then(|| (NOT_ENFORCING, problems.join("; ")))
            }
        };
        // The pod policy (`tessera-gpu-pods`) too, reported the same way.
        let found = match (found, self.check_pod_policy().await) {
            (f, None) => f,
            (None, Some(p)) => Some((NOT_ENFORCING, p)),
            (Some((reason, f)), Some(p)) => Some((reason, format!("{f}; {p}"))),
        };
        let mut last = crate::locked(&self.binding_problem);
        if let Some((_, p)) = &found {
            self.metrics.error("claim_policy_binding");
            if last.as_ref() != Some(p) {
                warn!(problem = %p, "the claim-class policy does not enforce the operator's params");
            }
        }
        *last = found.as_ref().map(|(_, p)| p.clone());
        Some(found)
    }
}

impl QuotaController {
    /// What keeps the pod, binding or quota-name policy from enforcing, joined; `None` when
    /// each enforces or cannot be read (not checked).
    async fn check_pod_policy(&self) -> Option<String> {
        let mut found = Vec::new();
        for c in [&PODS, &BINDINGS, &QUOTA_NAMES] {
            found.extend(self.check_params_policy(c).await);
        }
        (!found.is_empty()).then(|| found.join("; "))
    }

    /// What keeps policy `c` (bound to the operator's params) from enforcing
    /// ([`params_binding_problem`], [`problems`]), joined; `None` when it enforces or cannot be
    /// read (not checked).
    async fn check_params_policy(&self, c: &Checked) -> Option<String> {
        let binding = match Api::<ValidatingAdmissionPolicyBinding>::all(self.client.clone()).get_opt(c.name).await {
            Ok(b) => b,
            Err(e) => {
                debug!(policy = c.name, error = %e, "could not read the policy binding; not checked");
                return None;
            }
        };
        if let Some(problem) = params_binding_problem(c, binding.as_ref(), &self.namespace) {
            return Some(problem);
        }
        let policy = match Api::<ValidatingAdmissionPolicy>::all(self.client.clone()).get_opt(c.name).await {
            Ok(p) => p,
            Err(e) => {
                debug!(policy = c.name, error = %e, "could not read the policy; not checked");
                return None;
            }
        };
        let problems = problems(c, policy.as_ref(), binding.as_ref()?);
        (!problems.is_empty()).then(|| problems.join("; "))
    }
}

/// Whether `have` is the class `want` describes ([`spec_matches`]), with our label.
fn is_current(have: &DeviceClass, want: &ClassApply) -> bool {
    let labelled = have.metadata.labels.as_ref().and_then(|l| l.get(MANAGED_BY.0)).is_some_and(|v| v == MANAGED_BY.1);
    labelled && spec_matches(have, want)
}
