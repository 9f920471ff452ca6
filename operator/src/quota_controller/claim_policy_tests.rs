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
