//! Whether the claim-class policy (`tessera-claim-classes`) still enforces what it ships with.
//! Its binding reading the operator's params is not enough (`quota::claims::binding_problem`):
//! an edited policy (`failurePolicy: Ignore`, a narrower match, a rewritten CEL rule) or binding
//! (Warn-only actions, a `matchResources`) lets every class through while the params are read.
//! The parts that decide enforcement are compared with the manifest compiled in
//! (`config/rbac/claim-classes.yaml`; the chart ships the same policy). The pod policy
//! (`tessera-gpu-pods`, same params) is checked the same way ([`PODS`]), and so is the quota-name
//! policy (`tessera-quota-names`, [`QUOTA_NAMES`]), and the binding policy
//! (`tessera-gpu-bindings`, [`BINDINGS`]).

use std::sync::LazyLock;

use k8s_openapi::api::admissionregistration::v1::{
    MatchResources, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::Serialize;
use serde_json::Value;

use tessera_planner::quota::claims::POLICY_PARAMS;

/// The condition reason for a policy or binding that would not refuse a closed class.
pub(crate) const NOT_ENFORCING: &str = tessera_crds::conditions::quota_reasons::POLICY_NOT_ENFORCING;

/// One shipped policy the operator checks: its name (and its binding's), what its match must
/// cover (API group, resources and operations, version `v1`), and what is lost when it does not.
pub(crate) struct Checked {
    pub name: &'static str,
    group: &'static str,
    /// The version the match must cover (`matchPolicy: Equivalent` converts the others).
    version: &'static str,
    /// The resources' scope (a rule's `scope` must be `*` or this).
    scope: &'static str,
    /// What the policy admits when its binding finds no params.
    admits: &'static str,
    resources: &'static [&'static str],
    operations: &'static [&'static str],
    loses: &'static str,
    install: &'static str,
}

/// The claim-class policy.
pub(crate) const CLAIMS: Checked = Checked {
    name: POLICY_PARAMS,
    group: "resource.k8s.io",
    version: "v1",
    scope: "Namespaced",
    admits: "every claim",
    // `resourceclaims/status`: the scheduler's allocation of a claim made before its namespace joined.
    resources: &["resourceclaims", "resourceclaimtemplates", "resourceclaims/status"],
    operations: &["CREATE", "UPDATE"],
    loses: "claims of closed classes may be admitted",
    install: "nothing refuses claims of a DeviceClass created between two quota passes",
};

/// The pod policy: pods asking for `nvidia.com/` resources wait for the tenant's ResourceQuota.
pub(crate) const PODS: Checked = Checked {
    name: "tessera-gpu-pods",
    group: "",
    version: "v1",
    scope: "Namespaced",
    admits: "every pod",
    resources: &["pods"],
    operations: &["CREATE"],
    loses: "pods asking for nvidia.com/ resources may be admitted in a tenant namespace before its ResourceQuota \
            enforces the share",
    install: "nothing refuses pods asking for nvidia.com/ resources in a tenant namespace whose ResourceQuota is \
              not yet enforced (a namespace created after its quota lists it)",
};

/// The quota-name policy: a quota deleted while the operator was down is not created again
/// under its name before the operator saw the deletion.
pub(crate) const QUOTA_NAMES: Checked = Checked {
    name: "tessera-quota-names",
    group: "tessera.dev",
    version: "v1alpha1",
    scope: "Cluster",
    admits: "every TenantGpuQuota",
    resources: &["tenantgpuquotas"],
    operations: &["CREATE"],
    loses: "a quota deleted while the operator is down may be created again under its name while its namespaces \
            are still described as enforced",
    install: "nothing refuses creating a quota under the name of one deleted while the operator is down (its \
              namespaces still described as enforced)",
};

/// The binding policy: GPU pods made before their namespace's ResourceQuota (`<ns>.pods`) are
/// not bound.
pub(crate) const BINDINGS: Checked = Checked {
    name: "tessera-gpu-bindings",
    group: "",
    version: "v1",
    scope: "Namespaced",
    admits: "every binding",
    resources: &["pods/binding", "bindings"],
    operations: &["CREATE"],
    loses: "GPU pods made before their namespace joined a quota may be scheduled past its share",
    install: "nothing refuses scheduling GPU pods made before their namespace joined a quota (gated or \
              unschedulable until then): they take GPUs the quota never counted",
};

/// The shipped manifest's policies; empty only if it cannot be read (a test proves it can).
static SHIPPED: LazyLock<Vec<ValidatingAdmissionPolicy>> = LazyLock::new(|| {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(include_str!("../../../config/rbac/claim-classes.yaml")).unwrap_or_default();
    docs.into_iter()
        .filter(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .filter_map(|d| serde_json::from_value(d).ok())
        .collect()
});

/// What keeps the policy from refusing claims of closed classes, each naming the field and how
/// it differs; empty when it enforces. `policy` is `None` when it does not exist.
pub(crate) fn policy_problems(
    policy: Option<&ValidatingAdmissionPolicy>,
    binding: &ValidatingAdmissionPolicyBinding,
) -> Vec<String> {
    problems(&CLAIMS, policy, binding)
}

/// [`policy_problems`] for the policy `c` describes.
pub(crate) fn problems(
    c: &Checked,
    policy: Option<&ValidatingAdmissionPolicy>,
    binding: &ValidatingAdmissionPolicyBinding,
) -> Vec<String> {
    let name = c.name;
    let b = |what: String| format!("ValidatingAdmissionPolicyBinding {name}: {what}");
    let mut out: Vec<String> = binding_enforces(c, binding).into_iter().map(b).collect();
    let Some(policy) = policy else {
        out.push(format!(
            "ValidatingAdmissionPolicy {name} not found: {} (install config/rbac/claim-classes.yaml or the chart)",
            c.install
        ));
        return out;
    };
    let p = |what: String| {
        format!(
            "ValidatingAdmissionPolicy {name}: {what}; {} (re-apply config/rbac/claim-classes.yaml or the chart)",
            c.loses
        )
    };
    out.extend(policy_enforces(c, policy).into_iter().map(p));
    out
}

/// What is wrong with the binding of policy `c` (the pod or quota-name policy) before the policy
/// is read: missing, or reading params other than the operator's (`parameterNotFoundAction:
/// Allow`: everything admitted).
pub(crate) fn params_binding_problem(
    c: &Checked,
    binding: Option<&ValidatingAdmissionPolicyBinding>,
    namespace: &str,
) -> Option<String> {
    let name = c.name;
    let Some(b) = binding else {
        return Some(format!(
            "ValidatingAdmissionPolicyBinding {name} not found: {} (install config/rbac/claim-classes.yaml or the chart)",
            c.install
        ));
    };
    let r = b.spec.param_ref.as_ref();
    let (params, ns) = (r.and_then(|r| r.name.as_deref()), r.and_then(|r| r.namespace.as_deref()));
    (params != Some(POLICY_PARAMS) || ns != Some(namespace)).then(|| {
        format!(
            "ValidatingAdmissionPolicyBinding {name} reads params {}/{} but the operator writes \
             {namespace}/{POLICY_PARAMS}: the policy finds no params and admits {}; set its \
             spec.paramRef to {namespace}/{POLICY_PARAMS}",
            ns.unwrap_or("<unset>"),
            params.unwrap_or("<unset>"),
            c.admits
        )
    })
}

/// The binding's part: it names the policy, denies, and narrows nothing.
fn binding_enforces(c: &Checked, binding: &ValidatingAdmissionPolicyBinding) -> Vec<String> {
    let mut out = Vec::new();
    let spec = &binding.spec;
    if spec.policy_name != c.name {
        out.push(format!("spec.policyName is {}, not {}", spec.policy_name, c.name));
    }
    let actions = &spec.validation_actions;
    if !actions.iter().any(|a| a == "Deny") {
        out.push(format!("spec.validationActions is {actions:?}: without Deny nothing is refused"));
    }
    if let Some(m) = &spec.match_resources {
        out.extend(narrows(m, "spec.matchResources"));
        if !m.resource_rules.as_ref().is_none_or(Vec::is_empty) {
            out.push("spec.matchResources.resourceRules is set: it narrows what the policy checks".into());
        }
    }
    out
}

/// The policy's part: `failurePolicy: Fail`, a match covering every write `c` names, and the
/// shipped params, conditions, variables and validations.
fn policy_enforces(c: &Checked, policy: &ValidatingAdmissionPolicy) -> Vec<String> {
    let Some(spec) = policy.spec.as_ref() else { return vec!["spec is unset".into()] };
    let mut out = Vec::new();
    if let Some(f) = spec.failure_policy.as_deref().filter(|f| *f != "Fail") {
        out.push(format!("spec.failurePolicy is {f}: a policy error admits the claim (must be Fail)"));
    }
    match &spec.match_constraints {
        None => out.push("spec.matchConstraints is unset".into()),
        Some(m) => {
            out.extend(narrows(m, "spec.matchConstraints"));
            if let Some(mp) = m.match_policy.as_deref().filter(|mp| *mp != "Equivalent") {
                out.push(format!(
                    "spec.matchConstraints.matchPolicy is {mp}: writes through other versions are not checked"
                ));
            }
            let uncovered: Vec<String> = c
                .resources
                .iter()
                .flat_map(|r| c.operations.iter().map(move |op| (*r, *op)))
                .filter(|(r, op)| !covers(m, c, r, op))
                .map(|(r, op)| format!("{op} of {r}"))
                .collect();
            if !uncovered.is_empty() {
                out.push(format!(
                    "spec.matchConstraints.resourceRules do not cover {} ({}{})",
                    uncovered.join(", "),
                    if c.group.is_empty() { String::new() } else { format!("{}/", c.group) },
                    c.version
                ));
            }
        }
    }
    let shipped = SHIPPED.iter().find(|p| p.metadata.name.as_deref() == Some(c.name));
    let Some(want) = shipped.and_then(|s| s.spec.as_ref()) else {
        out.push("the shipped manifest could not be read to compare with".into());
        return out;
    };
    out.extend(differs("spec.paramKind", &spec.param_kind, &want.param_kind));
    out.extend(differs("spec.matchConditions", &spec.match_conditions, &want.match_conditions));
    out.extend(differs("spec.variables", &spec.variables, &want.variables));
    out.extend(differs("spec.validations", &spec.validations, &want.validations));
    out
}

/// A selector or exclusion that leaves some namespaces or objects unchecked.
fn narrows(m: &MatchResources, at: &str) -> Vec<String> {
    let set = |s: &Option<LabelSelector>| {
        s.as_ref().is_some_and(|s| {
            !s.match_labels.as_ref().is_none_or(|l| l.is_empty())
                || !s.match_expressions.as_ref().is_none_or(Vec::is_empty)
        })
    };
    let mut out = Vec::new();
    if set(&m.namespace_selector) {
        out.push(format!("{at}.namespaceSelector is set: namespaces it does not select are not checked"));
    }
    if set(&m.object_selector) {
        out.push(format!("{at}.objectSelector is set: objects it does not select are not checked"));
    }
    if !m.exclude_resource_rules.as_ref().is_none_or(Vec::is_empty) {
        out.push(format!("{at}.excludeResourceRules is set: what it names is not checked"));
    }
    out
}

/// Whether a rule of `m` matches every `op` of `resource` in `c`'s group, version and scope.
fn covers(m: &MatchResources, c: &Checked, resource: &str, op: &str) -> bool {
    let has = |list: &Option<Vec<String>>, v: &str| list.iter().flatten().any(|x| x == v || x == "*");
    m.resource_rules.iter().flatten().any(|r| {
        has(&r.api_groups, c.group)
            && has(&r.api_versions, c.version)
            && has(&r.operations, op)
            && has(&r.resources, resource)
            && r.resource_names.as_ref().is_none_or(Vec::is_empty)
            && r.scope.as_deref().is_none_or(|s| s == "*" || s == c.scope)
    })
}

/// `field` compared with the shipped value: `None` when equal, else which part differs (the
/// first differing entry of a list, by index and name).
fn differs<T: Serialize>(field: &str, have: &T, want: &T) -> Option<String> {
    let (have, want) = (serde_json::to_value(have).ok()?, serde_json::to_value(want).ok()?);
    if have == want {
        return None;
    }
    let shipped = "differs from the shipped manifest";
    let (Value::Array(h), Value::Array(w)) = (&have, &want) else {
        return Some(format!("{field} {shipped}"));
    };
    let Some(i) = (0..h.len().max(w.len())).find(|i| h.get(*i) != w.get(*i)) else {
        return Some(format!("{field} {shipped}"));
    };
    let name = h.get(i).or(w.get(i)).and_then(|e| e["name"].as_str()).map(|n| format!(" ({n})")).unwrap_or_default();
    Some(match (h.get(i), w.get(i)) {
        (None, _) => format!("{field}[{i}]{name} is missing ({} entries, shipped {})", h.len(), w.len()),
        (_, None) => format!("{field}[{i}]{name} is not in the shipped manifest"),
        _ => format!("{field}[{i}]{name} {shipped}"),
    })
}

#[cfg(test)]
mod tests;
