//! The shipped claim policy `tessera-claim-classes`, evaluated with the same CEL harness as the
//! pod policy (`pod_policy_tests`).

use serde_json::{Value, json};

use super::pod_policy::{NS_UID, evaluate};

fn claim(class: &str) -> Value {
    json!({"metadata": {"name": "c"}, "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": class}}]}}})
}

fn admit(class: &str, ns: &str, data: &Value) -> Option<String> {
    let request = json!({"namespace": ns, "operation": "CREATE", "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"}});
    evaluate("tessera-claim-classes", &claim(class), &request, data, NS_UID)
}

/// A tenant namespace deleted and created again while the operator is down must not keep its
/// open classes (the params name the old namespace's): a UID mismatch closes every class but
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
    let tombstone = admit("gpu.tessera.dev", "a", &data(tessera_planner::quota::pod_gate::ABSENT));
    assert!(tombstone.is_some_and(|r| r.contains("the namespace was deleted and created again")), "a tombstone");
    assert_eq!(admit("gpu.tessera.dev", "a", &data(NS_UID)), None, "the same namespace");
    let mut older = data("x");
    older.as_object_mut().unwrap().remove("a.uid");
    assert_eq!(admit("gpu.tessera.dev", "a", &older), None, "params of an older operator: not checked");
}

/// A TenantGpuQuota deleted and created again under its name while the operator is down would
/// find its namespaces described as enforced (its ResourceQuotas garbage-collected), so the
/// policy `tessera-quota-names` refuses the create while the params still list the name.
#[test]
fn a_quota_created_again_before_the_operator_saw_its_deletion_is_refused() {
    let create = |name: &str, data: &Value| {
        let quota = json!({"metadata": {"name": name}, "spec": {"namespaces": ["a"], "hard": {}}});
        evaluate(
            "tessera-quota-names",
            &quota,
            &json!({"operation": "CREATE",
            "resource": {"group": "tessera.dev", "version": "v1alpha1", "resource": "tenantgpuquotas"}}),
            data,
            NS_UID,
        )
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

/// An admin-access claim of Tessera's classes in a tenant namespace (labelled
/// `resource.kubernetes.io/admin-access`), and a ResourceClaimTemplate (its claim is made with
/// the pod), are refused at admission for any class not proven off GPUs, naming the field:
/// listing them for the pod policy a pass later would come too late.
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
        let request = json!({"namespace": ns, "operation": operation, "resource": {"group": "resource.k8s.io", "version": "v1", "resource": resource}});
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

/// When [`status_write`]'s claim was made.
pub(super) const MADE: &str = "2026-06-01T10:00:00Z";

/// The scheduler's write of `status.allocation` on `requests` (claim `stash`) in namespace `ns`;
/// `before`/`after`: the claim's status before and after the write.
pub(super) fn status_write(requests: Value, before: Value, after: Value, ns: &str, data: &Value) -> Option<String> {
    let at = |status: Value| json!({"metadata": {"name": "stash", "creationTimestamp": MADE}, "spec": {"devices": {"requests": requests.clone()}}, "status": status});
    let request = json!({"namespace": ns, "operation": "UPDATE", "subResource": "status",
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"}});
    super::pod_policy::evaluate_update("tessera-claim-classes", &at(after), &at(before), &request, data, NS_UID)
}

/// A claim of a GPU class not Tessera's made before its namespace joined a quota could be
/// allocated later (for a pod created after, or pending since before) with no quota check, were
/// only spec writes checked. So the scheduler's allocation (`resourceclaims/status`) of a
/// claim that had none is refused when a request names a class closed there; other status writes
/// (the driver's `status.devices`, deallocation, `reservedFor`) are not.
#[test]
fn allocating_a_claim_of_a_closed_class_is_refused_in_a_tenant_namespace() {
    let data = json!({"a.quota": "team-a", "a.allowed": "_tessera", "_tessera": "gpu.tessera.dev",
        "_open": "nic.example.com", "_reaching": "gpu.nvidia.com gpu.tessera.dev", "a.hint": "use gpu.tessera.dev",
        "a.uid": NS_UID, "a.since": "2026-06-01T09:00:00Z"});
    let all = |class: &str| json!([{"name": "r", "exactly": {"deviceClassName": class, "allocationMode": "All"}}]);
    let allocated = json!({"allocation": {"devices": {"results": [{"request": "r", "driver": "gpu.nvidia.com",
        "pool": "node-b", "device": "gpu-0"}]}}, "reservedFor": [{"resource": "pods", "name": "p2", "uid": "u"}]});
    let refused = status_write(all("gpu.nvidia.com"), json!({}), allocated.clone(), "a", &data).expect("refused");
    assert_eq!(
        refused,
        "status.allocation: ResourceClaim stash (class gpu.nvidia.com) of namespace a may not be allocated: the class \
         is closed in namespaces of TenantGpuQuota team-a (the claim was made before the namespace joined it; \
         allocated, it would take GPUs with no quota check); delete the claim and the pods using it; claim through \
         Tessera's classes; use gpu.tessera.dev"
    );
    // No status at all before (a claim never touched since its creation).
    assert!(
        super::pod_policy::evaluate_update(
            "tessera-claim-classes",
            &json!({"metadata": {"name": "stash"}, "spec": {"devices": {"requests": all("gpu.nvidia.com")}}, "status": allocated}),
            &json!({"metadata": {"name": "stash"}, "spec": {"devices": {"requests": all("gpu.nvidia.com")}}}),
            &json!({"namespace": "a", "operation": "UPDATE", "subResource": "status", "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"}}),
            &data,
            NS_UID,
        )
        .is_some_and(|m| m.starts_with("status.allocation: ResourceClaim stash (class gpu.nvidia.com)")),
        "an old object without status"
    );
    // A closed sub-request of `firstAvailable`, and admin access to Tessera's class.
    let first = json!([{"name": "r", "firstAvailable": [{"name": "s0", "deviceClassName": "gpu.tessera.dev"},
        {"name": "s1", "deviceClassName": "gpu.nvidia.com"}]}]);
    let refused = status_write(first, json!({}), allocated.clone(), "a", &data).expect("firstAvailable");
    assert!(
        refused.starts_with("status.allocation: ResourceClaim stash (class gpu.nvidia.com) of namespace a"),
        "{refused}"
    );
    let admin = json!([{"name": "r", "exactly": {"deviceClassName": "gpu.tessera.dev", "adminAccess": true}}]);
    let refused = status_write(admin, json!({}), allocated.clone(), "a", &data).expect("admin access");
    assert!(
        refused.starts_with("status.allocation: ResourceClaim stash (class gpu.tessera.dev, admin access)"),
        "{refused}"
    );
    // A namespace created again since the operator wrote its limits: Tessera's class closed too.
    let recreated = {
        let mut d = data.clone();
        d["a.uid"] = json!("uid-before");
        d
    };
    let refused =
        status_write(all("gpu.tessera.dev"), json!({}), allocated.clone(), "a", &recreated).expect("recreated");
    assert!(refused.contains("(class gpu.tessera.dev)") && refused.contains("deleted and created again"), "{refused}");

    // Admitted: Tessera's class (the claim made after the ResourceQuota), an open class, a namespace not a tenant's, and status writes
    // that do not allocate (the driver's devices, deallocation, `reservedFor` only).
    assert_eq!(status_write(all("gpu.tessera.dev"), json!({}), allocated.clone(), "a", &data), None, "Tessera's");
    assert_eq!(status_write(all("nic.example.com"), json!({}), allocated.clone(), "a", &data), None, "open");
    assert_eq!(status_write(all("gpu.nvidia.com"), json!({}), allocated.clone(), "b", &data), None, "not a tenant's");
    let mut with_devices = allocated.clone();
    with_devices["devices"] = json!([{"driver": "gpu.nvidia.com", "pool": "node-b", "device": "gpu-0"}]);
    assert_eq!(status_write(all("gpu.nvidia.com"), allocated.clone(), with_devices, "a", &data), None, "devices");
    assert_eq!(status_write(all("gpu.nvidia.com"), allocated.clone(), json!({}), "a", &data), None, "deallocated");
    let reserved = json!({"reservedFor": [{"resource": "pods", "name": "p2", "uid": "u"}]});
    assert_eq!(status_write(all("gpu.nvidia.com"), json!({}), reserved, "a", &data), None, "no allocation");
}

/// A claim of Tessera's class made before its namespace joined a quota (so before its
/// ResourceQuota, which counts claims from their creation) would be allocated later with no
/// limit: all GPUs of a node for a share of 1. Allocating a claim made no later than
/// `<ns>.since` is refused in every class not in `_open` (the same second too); with no `.since`
/// (no ResourceQuota yet) every such allocation waits. A class of Tessera's closed for a while
/// says so, and that the scheduler retries, with no advice to delete the claim.
#[test]
fn allocating_a_claim_made_before_the_namespace_s_resource_quota_is_refused_in_tessera_s_classes_too() {
    let data = |since: Option<&str>| {
        let mut d = json!({"a.quota": "team-a", "a.allowed": "_tessera", "_tessera": "gpu.tessera.dev",
            "_open": "nic.example.com", "_reaching": "gpu.tessera.dev", "a.hint": "use gpu.tessera.dev", "a.uid": NS_UID});
        if let Some(s) = since {
            d["a.since"] = json!(s);
        }
        d
    };
    let all = |class: &str| json!([{"name": "r", "exactly": {"deviceClassName": class, "allocationMode": "All"}}]);
    let allocated = json!({"allocation": {"devices": {"results": [{"request": "r", "driver": "gpu.tessera.dev",
        "pool": "node-b", "device": "gpu-0"}]}}});
    let write = |class: &str, d: &Value| status_write(all(class), json!({}), allocated.clone(), "a", d);
    let before = |since: &str| {
        format!(
            "status.allocation: ResourceClaim stash (class gpu.tessera.dev) of namespace a may not be allocated: it \
             was made before the namespace's current GPU limits were in force ({since}), so TenantGpuQuota team-a \
             never counted it against its share; delete the claim and the pods using it and make it again"
        )
    };
    let since = "2026-06-01T11:00:00Z";
    assert_eq!(write("gpu.tessera.dev", &data(Some(since))), Some(before(since)));
    assert_eq!(write("gpu.tessera.dev", &data(Some(MADE))), Some(before(MADE)), "the same second");
    assert_eq!(
        write("gpu.tessera.dev", &data(None)).as_deref(),
        Some(
            "status.allocation: ResourceClaim stash (class gpu.tessera.dev) of namespace a may not be allocated: the \
             class is closed in namespaces of TenantGpuQuota team-a for now (use gpu.tessera.dev); the scheduler \
             retries"
        ),
        "no ResourceQuota yet"
    );
    assert_eq!(write("gpu.tessera.dev", &data(Some("2026-06-01T09:59:59Z"))), None, "made after");
    assert_eq!(write("nic.example.com", &data(Some("2026-06-01T11:00:00Z"))), None, "open");
    assert_eq!(write("nic.example.com", &data(None)), None, "open, no ResourceQuota yet");
    // Tessera's class closed for a while (a lowered limit not yet in force), the claim made after.
    let mut closed = data(Some("2026-06-01T09:00:00Z"));
    closed["a.allowed"] = json!("");
    closed["a.hint"] = json!("the tenant's ResourceQuota is still being written; retry shortly (use gpu.tessera.dev)");
    let refused = write("gpu.tessera.dev", &closed).expect("closed for now");
    assert!(
        refused.ends_with(
            "TenantGpuQuota team-a for now (the tenant's ResourceQuota is still being written; retry shortly \
             (use gpu.tessera.dev)); the scheduler retries"
        ) && !refused.contains("delete"),
        "{refused}"
    );
    // Creating a claim is not what `.since` guards (the ResourceQuota counts it).
    assert_eq!(admit("gpu.tessera.dev", "a", &data(None)), None, "a new claim");
}

/// A claim made while its resource was unlimited (`unlisted: Unlimited`, the key not in `hard`)
/// must not escape once the key comes into force, though `<ns>.since` is older than the claim:
/// `<ns>.since.<class>` (the key's own stamp, written only where later than `<ns>.since`)
/// refuses the allocation of a claim made no later than it that names the class, exactly or as
/// any `firstAvailable` alternative, and the refusal names that time; a claim of another class
/// made at the same time is allocated.
#[test]
fn allocating_a_claim_made_before_its_class_s_own_stamp_is_refused() {
    let later = "2026-06-01T10:45:00Z";
    let data = json!({"a.quota": "team-a", "a.allowed": "_tessera",
        "_tessera": "gpu.tessera.dev mig-1g.10gb.tessera.dev", "_open": "", "_reaching": "",
        "a.hint": "use gpu.tessera.dev or mig-1g.10gb.tessera.dev", "a.uid": NS_UID,
        "a.since": "2026-06-01T09:00:00Z", "a.since.gpu.tessera.dev": later});
    let exactly = |class: &str| json!([{"name": "r", "exactly": {"deviceClassName": class, "allocationMode": "All"}}]);
    let first = json!([{"name": "r", "firstAvailable": [{"name": "mig", "deviceClassName": "mig-1g.10gb.tessera.dev"},
        {"name": "gpu", "deviceClassName": "gpu.tessera.dev"}]}]);
    let allocated = json!({"allocation": {"devices": {"results": [{"request": "r", "driver": "gpu.tessera.dev",
        "pool": "node-b", "device": "gpu-0"}]}}});
    let write = |requests: Value, d: &Value| status_write(requests, json!({}), allocated.clone(), "a", d);
    let refused = |class: &str| {
        format!(
            "status.allocation: ResourceClaim stash (class {class}) of namespace a may not be allocated: it was \
             made before the namespace's current GPU limits were in force ({later}), so TenantGpuQuota team-a \
             never counted it against its share; delete the claim and the pods using it and make it again"
        )
    };
    assert_eq!(write(exactly("gpu.tessera.dev"), &data), Some(refused("gpu.tessera.dev")));
    assert_eq!(write(exactly("mig-1g.10gb.tessera.dev"), &data), None, "another class, made at the same time");
    assert_eq!(write(first.clone(), &data), Some(refused("mig-1g.10gb.tessera.dev")), "one alternative's class");
    let mut made_after = data.clone();
    made_after["a.since.gpu.tessera.dev"] = json!("2026-06-01T09:59:59Z");
    assert_eq!(write(exactly("gpu.tessera.dev"), &made_after), None, "made after the class's stamp");
    assert_eq!(write(first, &made_after), None);
}
