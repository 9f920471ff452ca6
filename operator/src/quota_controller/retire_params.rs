//! The last step of the upgrade from params mode to gates mode: the params mode's policies,
//! their bindings and their params ConfigMap are deleted once the gates hold everything they
//! held. Until then they stay in force beside the gate policies (each request must pass both, so
//! the pair never admits more than either), and the ConfigMap is no longer written: stale params
//! may refuse what the gates admit, never admit what they refuse.
//!
//! Due while the params ConfigMap is cached (deleted last, so a crash part-way is finished next
//! pass); done once the gate policies enforce as shipped ([`super::gate_policies`]), the pass
//! has failed nothing so far, and the gates are settled ([`GatePlan::settled`]): every namespace
//! carries its mark and every planned gate is cached as planned, so it was written in an earlier
//! pass (a namespace labelled `tenant` by hand before the guard existed still gets a gate
//! computed from a full look at its pods before the params go). Bindings go before their
//! policies and the ConfigMap last: a policy with its binding but no params would admit every
//! request its `parameterNotFoundAction: Allow` lets through.

use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams};
use tessera_planner::quota::claims::POLICY_PARAMS;
use tessera_planner::quota::gates::pass::GatePlan;
use tracing::info;

use super::QuotaController;
use super::claim_classes::PolicyCheck;
use super::policy_check::{BINDINGS, CLAIMS, PODS, QUOTA_NAMES};
use crate::Error;

/// The params mode's policies (each with a binding of the same name).
pub(super) const PARAMS_POLICIES: [&str; 4] = [CLAIMS.name, PODS.name, BINDINGS.name, QUOTA_NAMES.name];

/// Whether the params mode's objects may go now (see the module); `failed`: what the pass has
/// failed so far.
pub(super) fn due(params_cached: bool, policies: &PolicyCheck, failed: usize, plan: &GatePlan) -> bool {
    params_cached && matches!(policies, PolicyCheck::Enforces) && failed == 0 && plan.settled
}

impl QuotaController {
    /// Deletes the params mode's bindings, policies and ConfigMap when [`due`]; returns what
    /// failed (for every quota's status: the stale params may refuse what the gates admit).
    pub(super) async fn retire_params(
        &self,
        plan: &GatePlan,
        policies: &PolicyCheck,
        failed: usize,
    ) -> Result<Vec<String>, Error> {
        if !due(!self.policy_params.state().is_empty(), policies, failed, plan) {
            return Ok(Vec::new());
        }
        info!("the gates hold every namespace: deleting the params mode's admission policies and their params");
        let dp = DeleteParams::default();
        let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(self.client.clone());
        for name in PARAMS_POLICIES {
            if let Err(e) = self.writer().delete_counted(&bindings, name, &dp).await? {
                return Ok(vec![retire_failed("ValidatingAdmissionPolicyBinding", name, &e)]);
            }
        }
        let policies = Api::<ValidatingAdmissionPolicy>::all(self.client.clone());
        for name in PARAMS_POLICIES {
            if let Err(e) = self.writer().delete_counted(&policies, name, &dp).await? {
                return Ok(vec![retire_failed("ValidatingAdmissionPolicy", name, &e)]);
            }
        }
        let params = Api::<ConfigMap>::namespaced(self.client.clone(), &self.namespace);
        if let Err(e) = self.writer().delete_counted(&params, POLICY_PARAMS, &dp).await? {
            return Ok(vec![retire_failed("ConfigMap", POLICY_PARAMS, &e)]);
        }
        Ok(Vec::new())
    }
}

fn retire_failed(kind: &str, name: &str, e: &kube::Error) -> String {
    format!(
        "deleting the params mode's {kind} {name} (the upgrade to gates mode; RBAC: delete on it): {e}; until it \
         goes it may refuse what the gates admit"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_params_go_only_with_the_gate_policies_in_force_nothing_failed_and_the_gates_settled() {
        let settled = GatePlan { settled: true, ..Default::default() };
        assert!(due(true, &PolicyCheck::Enforces, 0, &settled));
        assert!(!due(false, &PolicyCheck::Enforces, 0, &settled), "nothing left to retire");
        for unsure in [PolicyCheck::Unreadable("x".into()), PolicyCheck::Broken("PolicyNotEnforcing", "y".into())] {
            assert!(!due(true, &unsure, 0, &settled), "{unsure:?}: the gates may not hold");
        }
        assert!(!due(true, &PolicyCheck::Enforces, 1, &settled), "a write of the pass failed");
        assert!(!due(true, &PolicyCheck::Enforces, 0, &GatePlan::default()), "the gates are not settled");
    }

    #[test]
    fn every_shipped_params_policy_and_binding_is_retired_and_the_operator_may_delete_them() {
        let docs = |text: &str| -> Vec<serde_json::Value> { serde_saphyr::from_multiple(text).unwrap() };
        let shipped = docs(include_str!("../../../config/rbac/claim-classes.yaml"));
        for kind in ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] {
            let mut names: Vec<&str> =
                shipped.iter().filter(|d| d["kind"] == kind).filter_map(|d| d["metadata"]["name"].as_str()).collect();
            names.sort_unstable();
            let mut retired = PARAMS_POLICIES.to_vec();
            retired.sort_unstable();
            assert_eq!(names, retired, "{kind}");
        }
        let rbac = docs(include_str!("../../../config/rbac/operator.yaml"));
        let grants = |resource: &str, name: &str| {
            rbac.iter().filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role").any(|role| {
                role["rules"].as_array().into_iter().flatten().any(|r| {
                    let has = |field: &str, v: &str| r[field].as_array().is_some_and(|a| a.iter().any(|x| x == v));
                    has("resources", resource) && has("resourceNames", name) && has("verbs", "delete")
                })
            })
        };
        for name in PARAMS_POLICIES {
            assert!(grants("validatingadmissionpolicies", name), "{name}");
            assert!(grants("validatingadmissionpolicybindings", name), "{name}");
        }
        assert!(grants("configmaps", POLICY_PARAMS));
    }
}
