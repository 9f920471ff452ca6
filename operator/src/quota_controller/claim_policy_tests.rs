//! The shipped claim policy `tessera-claim-classes`, evaluated with the same CEL harness as the
//! pod policy (`pod_policy_tests`).

use serde_json::{Value, json};

use super::pod_policy_tests::{NS_UID, evaluate};

fn claim(class: &str) -> Value {
    json!({"metadata": {"name": "c"}, "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": class}}]}}})
}

fn admit(class: &str, ns: &str, data: &Value) -> Option<String> {
    let request = json!({"namespace": ns, "operation": "CREATE", "resource": {"resource": "resourceclaims"}});
    evaluate("tessera-claim-classes", &claim(class), &request, data, NS_UID)
}

/// Review gap: a tenant namespace deleted and created again while the operator is down kept its
/// open classes (the params named the old namespace's). A UID mismatch closes every class but
/// those proven off GPUs, and the message says why.
#[test]
fn a_namespace_created_again_while_the_operator_is_down_closes_its_gpu_classes() {
    let data = |uid: &str| {
        json!({"a.quota": "team-a", "a.allowed": "_tessera", "_tessera": "gpu.tessera.dev", "_open": "nic.example.com",
            "_reaching": "gpu.tessera.dev", "a.hint": "use gpu.tessera.dev", "_pending": "", "a.uid": uid})
    };
    let refused = admit("gpu.tessera.dev", "a", &data("uid-before")).expect("closed in the re-created namespace");
    assert!(
        refused
            .contains("class gpu.tessera.dev reaches GPU devices and is closed in namespaces of TenantGpuQuota team-a")
            && refused.contains("the namespace was deleted and created again"),
        "{refused}"
    );
    assert_eq!(admit("nic.example.com", "a", &data("uid-before")), None, "proven off GPUs");
    assert_eq!(admit("gpu.tessera.dev", "a", &data(NS_UID)), None, "the same namespace");
    let mut older = data("x");
    older.as_object_mut().unwrap().remove("a.uid");
    assert_eq!(admit("gpu.tessera.dev", "a", &older), None, "params of an older operator: not checked");
}

/// Review gap: a TenantGpuQuota deleted and created again under its name while the operator is
/// down found its namespaces described as enforced (its ResourceQuotas garbage-collected). The
/// policy `tessera-quota-names` refuses the create while the params still list the name.
#[test]
fn a_quota_created_again_before_the_operator_saw_its_deletion_is_refused() {
    let create = |name: &str, data: &Value| {
        let quota = json!({"metadata": {"name": name}, "spec": {"namespaces": ["a"], "hard": {}}});
        evaluate("tessera-quota-names", &quota, &json!({"operation": "CREATE"}), data, NS_UID)
    };
    let data = json!({"_quotas": "team-a team-b", "a.quota": "team-a"});
    let refused = create("team-a", &data).expect("team-a is still listed");
    assert_eq!(
        refused,
        "metadata.name: TenantGpuQuota team-a was deleted and the operator has not run since (its namespaces are \
         still described as enforced by it, their ResourceQuotas gone); retry once the operator has run (seconds)"
    );
    assert_eq!(create("team-c", &data), None, "a new name");
    assert_eq!(create("team", &data), None, "names are whole words");
    assert_eq!(create("team-a", &json!({"a.quota": "team-a"})), None, "params of an older operator");
    assert_eq!(create("team-a", &json!({"_quotas": ""})), None, "the operator saw the deletion");
}

/// Issue 24: an admin-access claim of Tessera's classes in a tenant namespace (labelled
/// `resource.kubernetes.io/admin-access`) was admitted, and listed for the pod policy only a
/// pass later; a ResourceClaimTemplate was not stopped at all (its claim is made with the pod).
/// Both are refused at admission for any class not proven off GPUs, naming the field.
#[test]
fn admin_access_claims_and_templates_of_gpu_classes_are_refused_in_tenant_namespaces() {
    let data = json!({"a.quota": "team-a", "a.allowed": "_tessera", "_tessera": "gpu.tessera.dev",
        "_open": "nic.example.com", "_reaching": "gpu.tessera.dev", "a.hint": "use gpu.tessera.dev", "a.uid": NS_UID});
    let devices = |class: &str, admin: bool| {
        json!({"requests": [{"name": "plain", "exactly": {"deviceClassName": "gpu.tessera.dev"}},
            {"name": "watch", "exactly": {"deviceClassName": class, "adminAccess": admin}}]})
    };
    let claim =
        |class: &str, admin: bool| json!({"metadata": {"name": "watch"}, "spec": {"devices": devices(class, admin)}});
    let template = |class: &str, admin: bool| json!({"metadata": {"name": "watchers"}, "spec": {"spec": {"devices": devices(class, admin)}}});
    let run = |object: &Value, resource: &str, operation: &str, ns: &str| {
        let request = json!({"namespace": ns, "operation": operation, "resource": {"resource": resource}});
        evaluate("tessera-claim-classes", object, &request, &data, NS_UID)
    };
    let refused = run(&claim("gpu.tessera.dev", true), "resourceclaims", "CREATE", "a").expect("claim refused");
    assert_eq!(
        refused,
        "spec.devices.requests[1].exactly.adminAccess: ResourceClaim watch asks for admin access to class \
         gpu.tessera.dev in namespace a of TenantGpuQuota team-a: admin access sees the GPUs other tenants hold \
         (no quota limits it); run monitoring outside tenant namespaces"
    );
    let refused =
        run(&template("gpu.tessera.dev", true), "resourceclaimtemplates", "CREATE", "a").expect("template refused");
    assert!(
        refused.starts_with(
            "spec.spec.devices.requests[1].exactly.adminAccess: ResourceClaimTemplate watchers asks for admin access"
        ),
        "{refused}"
    );
    // A class the operator has never seen: not proven off GPUs, refused for admin access.
    let refused = run(&claim("mig.nvidia.com", true), "resourceclaims", "CREATE", "a").expect("unknown class");
    assert!(refused.contains("exactly.adminAccess: ResourceClaim watch asks for admin access to class mig.nvidia.com"));
    assert_eq!(run(&claim("nic.example.com", true), "resourceclaims", "CREATE", "a"), None, "proven off GPUs");
    assert_eq!(run(&claim("gpu.tessera.dev", false), "resourceclaims", "CREATE", "a"), None, "no admin access");
    assert_eq!(run(&claim("gpu.tessera.dev", true), "resourceclaims", "CREATE", "b"), None, "not a tenant's");
}
