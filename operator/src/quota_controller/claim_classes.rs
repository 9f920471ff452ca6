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
    BINDINGS, CLAIMS, Checked, NOT_ENFORCING, PODS, QUOTA_NAMES, params_binding_problem, policy_problems, problems,
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
        if self.admission == super::QuotaAdmission::Gates {
            return Ok((failed, stale)); // no params: the gates carry what they said
        }
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

/// What the check of the shipped policies and their bindings found ([`QuotaController::check_policies`]).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum PolicyCheck {
    /// Every shipped policy and binding was read, reads the operator's params and enforces as shipped.
    Enforces,
    /// One or more does not: the reason (`ParamsNotRead` where the claim-class binding reads
    /// other params, else `PolicyNotEnforcing`) and what is wrong with each (and what could not
    /// be read besides).
    Broken(&'static str, String),
    /// None was found broken, but one or more could not be read (RBAC, the API server): which,
    /// and the error. Not `True`: an unread policy may be deleted or edited.
    Unreadable(String),
}

/// What one policy's check found.
enum Found {
    Enforces,
    Broken(&'static str, String),
    Unreadable(String),
}

impl QuotaController {
    /// Reads every shipped policy and its binding ([`CLAIMS`] first, then [`PODS`], [`BINDINGS`]
    /// and [`QUOTA_NAMES`]) and judges them ([`binding_problem`], [`params_binding_problem`],
    /// [`problems`]). Read every pass, so an edit is seen within one. A problem is logged when
    /// it changes and counted every pass (`claim_policy_binding`).
    pub(super) async fn check_policies(&self) -> PolicyCheck {
        let mut found = vec![self.check_claim_policy().await];
        for c in [&PODS, &BINDINGS, &QUOTA_NAMES] {
            found.push(self.check_params_policy(c).await);
        }
        let check = judge(found);
        let problem = match &check {
            PolicyCheck::Enforces => None,
            PolicyCheck::Broken(_, p) | PolicyCheck::Unreadable(p) => Some(p.clone()),
        };
        let mut last = crate::locked(&self.binding_problem);
        if let Some(p) = &problem {
            self.metrics.error("claim_policy_binding");
            if last.as_ref() != Some(p) {
                warn!(problem = %p, "the shipped admission policies are not known to enforce the operator's params");
            }
        }
        *last = problem;
        check
    }

    /// The claim-class policy and binding: its binding must read the operator's params
    /// ([`binding_problem`], `ParamsNotRead`), the policy enforce as shipped ([`policy_problems`]).
    async fn check_claim_policy(&self) -> Found {
        let binding = match Api::<ValidatingAdmissionPolicyBinding>::all(self.client.clone()).get_opt(CLAIMS.name).await
        {
            Ok(b) => b,
            Err(e) => return unreadable("ValidatingAdmissionPolicyBinding", CLAIMS.name, &e),
        };
        if let Some(problem) = binding_problem(binding.as_ref(), &self.namespace) {
            return Found::Broken(tessera_crds::conditions::quota_reasons::PARAMS_NOT_READ, problem);
        }
        let Some(binding) = binding else { unreachable!("binding_problem names a missing binding") };
        let policy = match Api::<ValidatingAdmissionPolicy>::all(self.client.clone()).get_opt(CLAIMS.name).await {
            Ok(p) => p,
            Err(e) => return unreadable("ValidatingAdmissionPolicy", CLAIMS.name, &e),
        };
        broken_if(policy_problems(policy.as_ref(), &binding))
    }

    /// Policy `c` (bound to the operator's params) and its binding ([`params_binding_problem`],
    /// [`problems`]).
    async fn check_params_policy(&self, c: &Checked) -> Found {
        let binding = match Api::<ValidatingAdmissionPolicyBinding>::all(self.client.clone()).get_opt(c.name).await {
            Ok(b) => b,
            Err(e) => return unreadable("ValidatingAdmissionPolicyBinding", c.name, &e),
        };
        if let Some(problem) = params_binding_problem(c, binding.as_ref(), &self.namespace) {
            return Found::Broken(NOT_ENFORCING, problem);
        }
        let Some(binding) = binding else { unreachable!("params_binding_problem names a missing binding") };
        let policy = match Api::<ValidatingAdmissionPolicy>::all(self.client.clone()).get_opt(c.name).await {
            Ok(p) => p,
            Err(e) => return unreadable("ValidatingAdmissionPolicy", c.name, &e),
        };
        broken_if(problems(c, policy.as_ref(), &binding))
    }
}

fn unreadable(kind: &str, name: &str, e: &kube::Error) -> Found {
    debug!(kind, name, error = %e, "could not read a shipped admission object");
    Found::Unreadable(format!(
        "{kind} {name} could not be read ({e}): whether it enforces is not known (the operator's ClusterRole \
         needs get on it; see config/rbac/operator.yaml)"
    ))
}

fn broken_if(problems: Vec<String>) -> Found {
    if problems.is_empty() { Found::Enforces } else { Found::Broken(NOT_ENFORCING, problems.join("; ")) }
}

/// The policies' findings as one: broken where any is (the first broken one's reason, every
/// problem and unread object named), else unreadable where any could not be read, else enforcing.
fn judge(found: Vec<Found>) -> PolicyCheck {
    let (mut reason, mut broken, mut unread) = (None, Vec::new(), Vec::new());
    for f in found {
        match f {
            Found::Enforces => {}
            Found::Broken(r, p) => {
                reason.get_or_insert(r);
                broken.push(p);
            }
            Found::Unreadable(p) => unread.push(p),
        }
    }
    match reason {
        Some(r) => PolicyCheck::Broken(r, broken.into_iter().chain(unread).collect::<Vec<_>>().join("; ")),
        None if !unread.is_empty() => PolicyCheck::Unreadable(unread.join("; ")),
        None => PolicyCheck::Enforces,
    }
}

/// Whether `have` is the class `want` describes ([`spec_matches`]), with our label.
fn is_current(have: &DeviceClass, want: &ClassApply) -> bool {
    let labelled = have.metadata.labels.as_ref().and_then(|l| l.get(MANAGED_BY.0)).is_some_and(|v| v == MANAGED_BY.1);
    labelled && spec_matches(have, want)
}
