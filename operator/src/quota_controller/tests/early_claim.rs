//! Claims of Tessera's classes made no later than `<ns>.since`
//! (before the namespace's current GPU limits were in force) are refused with their own cause, by
//! the pod policy (`<claim>:<class>,early` in `<ns>.claims`) and at allocation by the claim policy.

use serde_json::{Value, json};

use super::claim_policy::{MADE, status_write};
use super::pod_policy::{NS_UID, evaluate};
use tessera_planner::quota::unallocated::{Pending, policy_claims};

const SINCE: &str = "2026-06-01T11:00:00Z";

fn early(ns: &str, name: &str, class: &str) -> Pending {
    Pending { namespace: ns.into(), name: name.into(), class: class.into(), resource: None, count: 0 }
}

fn admit_pod(claim: &str, data: &Value) -> Option<String> {
    let pod = json!({"spec": {"containers": [{"name": "c"}], "resourceClaims": [
        {"name": "t", "resourceClaimTemplateName": "tpl"}, {"name": "g", "resourceClaimName": claim}]}});
    evaluate("tessera-gpu-pods", &pod, &super::pod_policy::pod_create("x"), data, NS_UID)
}

/// A pod naming `hoard` (class `gpu.tessera.dev`, made before `x`'s ResourceQuota) is not
/// refused with the foreign-claim text ("of a class not Tessera's ... claim through Tessera's
/// classes"), a wrong cause and a wrong fix. Its params entry carries `,early`; the refusal names
/// the field, claim, class, namespace and time, and says to make it again. A class whose name
/// merely holds `early` is not taken for the marker.
#[test]
fn a_pod_naming_a_claim_of_tessera_s_class_made_before_the_limits_is_refused_with_that_cause() {
    let foreign = [early("x", "stash", "early.example.com")];
    let listed = policy_claims(&foreign, &[], &[early("x", "hoard", "gpu.tessera.dev")], ["x"]);
    let mut data = json!({"x.quota": "team-a", "_pending": "", "x.since": SINCE});
    for (k, v) in listed {
        data[k] = json!(v);
    }
    assert_eq!(data["x.claims"], "stash:early.example.com hoard:gpu.tessera.dev,early", "early ones last");
    assert_eq!(
        admit_pod("hoard", &data).as_deref(),
        Some(
            "spec.resourceClaims[1].resourceClaimName: ResourceClaim hoard (class gpu.tessera.dev) of namespace x \
             was made before the namespace's current GPU limits were in force (2026-06-01T11:00:00Z), so \
             TenantGpuQuota team-a never counted it against its share and it will not be allocated; delete the \
             claim and make it again (the same class is fine)"
        )
    );
    let stash = admit_pod("stash", &data).expect("a foreign claim is refused");
    assert!(
        stash.contains("ResourceClaim stash (class early.example.com) is not limited by TenantGpuQuota team-a")
            && stash.contains("of a class not Tessera's"),
        "{stash}"
    );
    assert_eq!(admit_pod("fresh", &data), None, "a claim not listed");
}

/// `_all` (past the `<ns>.claims` cap) refuses a pod naming a claim of Tessera's class made
/// before the limits too, not only claims of classes not Tessera's, so the message names that
/// cause (with the time) as well.
#[test]
fn past_the_claims_cap_the_message_names_both_causes() {
    let data = json!({"x.quota": "team-a", "_pending": "", "x.claims": "_all", "x.since": SINCE});
    assert_eq!(
        admit_pod("mine", &data).as_deref(),
        Some(
            "spec.resourceClaims[1].resourceClaimName: namespace x of TenantGpuQuota team-a holds more unallocated \
             ResourceClaims of GPU classes not Tessera's than the params can list (the quota's Ready condition \
             names them): no pod may name an existing ResourceClaim here until they are deleted; use \
             resourceClaimTemplateName (a claim of Tessera's classes made before the namespace's current GPU limits \
             were in force, 2026-06-01T11:00:00Z, will not be allocated either: delete it and make it again)"
        )
    );
    let no_since = json!({"x.quota": "team-a", "_pending": "", "x.claims": "_all"});
    let refused = admit_pod("mine", &no_since).expect("refused past the cap");
    assert!(refused.ends_with("use resourceClaimTemplateName"), "{refused}");
}

fn data() -> Value {
    json!({"a.quota": "team-a", "a.allowed": "_tessera", "_tessera": "gpu.tessera.dev", "_open": "nic.example.com",
        "_reaching": "gpu.nvidia.com gpu.tessera.dev", "a.hint": "use gpu.tessera.dev", "a.uid": NS_UID,
        "a.since": SINCE})
}

fn allocate(class: &str, d: &Value) -> Option<String> {
    let all = json!([{"name": "r", "exactly": {"deviceClassName": class, "allocationMode": "All"}}]);
    let allocated = json!({"allocation": {"devices": {"results": [{"request": "r", "driver": "gpu.nvidia.com",
        "pool": "node-b", "device": "gpu-0"}]}}});
    status_write(all, json!({}), allocated, "a", d)
}

/// Allocating `stash` of Tessera's class made before `a.since` is refused saying the claim was
/// made before the limits were in force, when, and to make it again; not that the class is
/// closed (it is open) nor to claim through Tessera's classes (it does).
#[test]
fn allocating_a_claim_of_tessera_s_class_made_before_the_limits_says_so() {
    assert!(MADE < SINCE);
    assert_eq!(
        allocate("gpu.tessera.dev", &data()).as_deref(),
        Some(
            "status.allocation: ResourceClaim stash (class gpu.tessera.dev) of namespace a may not be allocated: it \
             was made before the namespace's current GPU limits were in force (2026-06-01T11:00:00Z), so \
             TenantGpuQuota team-a never counted it against its share; delete the claim and the pods using it and \
             make it again"
        )
    );
    // With no `.since` (no ResourceQuota yet) the class is closed for now: the scheduler retries.
    let mut none = data();
    none.as_object_mut().unwrap().remove("a.since");
    let refused = allocate("gpu.tessera.dev", &none).expect("closed for now");
    assert!(refused.ends_with("for now (use gpu.tessera.dev); the scheduler retries"), "{refused}");
}

/// A claim of a foreign class made before the limits keeps its text: its class is closed and
/// the fix is to claim through Tessera's classes.
#[test]
fn allocating_a_claim_of_a_foreign_class_made_before_the_limits_keeps_its_text() {
    assert_eq!(
        allocate("gpu.nvidia.com", &data()).as_deref(),
        Some(
            "status.allocation: ResourceClaim stash (class gpu.nvidia.com) of namespace a may not be allocated: the \
             class is closed in namespaces of TenantGpuQuota team-a (the claim was made before the namespace joined \
             it; allocated, it would take GPUs with no quota check); delete the claim and the pods using it; claim \
             through Tessera's classes; use gpu.tessera.dev"
        )
    );
}
