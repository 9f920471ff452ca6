//! TenantGpuQuota over DRA ResourceClaims on the real control plane: claims of a GPU-reaching
//! class are refused in tenant namespaces (the claim-class policy names the field and the class),
//! and in `allocation: ResourceClaims` the API server's quota admission holds claims of Tessera's
//! per-profile class to the share under concurrent creates; a pod naming a leftover claim (of a
//! GPU class not Tessera's, or an admin-access one, made before its namespace joined) is refused.
//! The scheduler's allocation of such a claim (for a pod made before joining) is refused too.
//! (Claims the resource-claim controller makes from ResourceClaimTemplates: `dra_rollout.rs`.)

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ResourceQuota, ServiceAccount};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tessera_crds::TenantGpuQuota;
use tessera_e2e::dra::scheduling_messages;
use tessera_e2e::fixtures::{
    FakeGpuNode, apply_file, create_gpu_nodes, create_namespace, install_crds, spawn_operator, wait_for,
};
use tessera_e2e::process::Component;
use tessera_e2e::{ControlPlane, Identity};

const T: Duration = Duration::from_secs(60);
const DEV: &str = ".deviceclass.resource.k8s.io/devices";

async fn setup(namespaces: &[&str]) -> (ControlPlane, Client, Component) {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    install_crds(&admin).await.unwrap();
    for f in ["config/base/namespace.yaml", "config/rbac/operator.yaml", "config/rbac/claim-classes.yaml"] {
        apply_file(&admin, f).await.unwrap();
    }
    for ns in namespaces {
        create_namespace(&admin, ns).await.unwrap();
    }
    // NVIDIA's DRA driver's MIG class, and a class of another driver (open everywhere).
    let classes: Api<DeviceClass> = Api::all(admin.clone());
    for (name, expr) in [
        ("mig.nvidia.com", "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"),
        ("fpga.example.com", "device.driver == 'fpga.example.com'"),
    ] {
        classes.create(&PostParams::default(), &class(name, expr)).await.unwrap();
    }
    let (op, _) = spawn_operator(&cp, "op").unwrap();
    (cp, admin, op)
}

fn class(name: &str, expr: &str) -> DeviceClass {
    serde_json::from_value(
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expr}}]}}),
    )
    .unwrap()
}

fn quota(name: &str, spec: serde_json::Value) -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "metadata": {"name": name}, "spec": spec}))
        .unwrap()
}

/// A quota sent as written (a value the Rust type would not hold).
fn quota_value(name: &str, spec: serde_json::Value) -> kube::api::DynamicObject {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": name}, "spec": spec}))
    .unwrap()
}

/// A claim with one single-device request per class.
fn claim(name: &str, classes: &[&str]) -> ResourceClaim {
    let reqs: Vec<_> = classes
        .iter()
        .enumerate()
        .map(|(i, c)| json!({"name": format!("r{i}"), "exactly": {"deviceClassName": c}}))
        .collect();
    serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name}, "spec": {"devices": {"requests": reqs}}}))
    .unwrap()
}

/// Waits until the operator's policy params list `ns` and `_reaching` has `class`.
async fn wait_policy(admin: &Client, ns: &str, class: &str) {
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "tessera-system");
    wait_for(&format!("policy params for {ns}"), T, || async {
        let data = cms.get("tessera-claim-classes").await.ok()?.data?;
        (data.contains_key(&format!("{ns}.quota")) && data.get("_reaching")?.split(' ').any(|c| c == class))
            .then_some(())
    })
    .await
    .unwrap();
}

/// Waits until our ResourceQuota in `ns` holds `key` at `hard`, in spec and status.
async fn wait_key(admin: &Client, ns: &str, quota: &str, key: &str, hard: &str) {
    let rqs: Api<ResourceQuota> = Api::namespaced(admin.clone(), ns);
    let name = tessera_planner::quota::resource_quota_name(quota);
    wait_for(&format!("{ns}/{name} {key}={hard}"), T, || async {
        let rq = rqs.get(&name).await.ok()?;
        let spec_ok = rq.spec.as_ref()?.hard.as_ref()?.get(key).map(|q| q.0.as_str()) == Some(hard);
        let status_ok = rq.status.as_ref()?.hard.as_ref()?.get(key).map(|q| q.0.as_str()) == Some(hard);
        (spec_ok && status_ok).then_some(())
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_of_a_gpu_reaching_class_is_refused_in_a_tenant_namespace_naming_the_field_and_class() {
    let (_cp, admin, _op) = setup(&["team-a", "elsewhere"]).await;
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    let spec = json!({"namespaces": ["team-a"], "hard": {"nvidia.com/mig-1g.10gb": 2}});
    quotas.create(&PostParams::default(), &quota("team-a", spec)).await.unwrap();
    wait_policy(&admin, "team-a", "mig.nvidia.com").await;
    wait_key(&admin, "team-a", "team-a", &format!("mig.nvidia.com{DEV}"), "0").await;
    // The policy as the API server stores it (defaults filled in, CEL as parsed) is the shipped one.
    let bound = wait_for("ClaimPolicyBound on team-a", T, || async {
        let st = quotas.get("team-a").await.ok()?.status?;
        st.conditions.into_iter().find(|c| c.type_ == "ClaimPolicyBound")
    })
    .await
    .unwrap();
    assert_eq!((bound.status.as_str(), bound.reason.as_str()), ("True", "Bound"), "{}", bound.message);
    // Every shipped policy is checked with the operator's own RBAC: the binding policy deleted is
    // named (its check was once skipped on a 403 while the condition stayed True), and re-applied
    // the condition is True again.
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(admin.clone());
    policies.delete("tessera-gpu-bindings", &Default::default()).await.unwrap();
    let policy_condition = |status: &'static str| {
        let quotas = quotas.clone();
        async move {
            wait_for(&format!("ClaimPolicyBound={status} on team-a"), T, || async {
                let st = quotas.get("team-a").await.ok()?.status?;
                st.conditions.into_iter().find(|c| c.type_ == "ClaimPolicyBound" && c.status == status)
            })
            .await
            .unwrap()
        }
    };
    let broken = policy_condition("False").await;
    assert_eq!(broken.reason, "PolicyNotEnforcing", "{}", broken.message);
    assert!(broken.message.contains("ValidatingAdmissionPolicy tessera-gpu-bindings not found"), "{}", broken.message);
    apply_file(&admin, "config/rbac/claim-classes.yaml").await.unwrap();
    let bound = policy_condition("True").await;
    assert_eq!(bound.reason, "Bound", "{}", bound.message);

    let claims: Api<ResourceClaim> = Api::namespaced(admin.clone(), "team-a");
    let err = claims
        .create(&PostParams::default(), &claim("c1", &["fpga.example.com", "mig.nvidia.com"]))
        .await
        .expect_err("a claim of NVIDIA's MIG class in a tenant namespace");
    let msg = err.to_string();
    assert!(
        msg.contains(
            "spec.devices.requests[1].exactly.deviceClassName: class mig.nvidia.com reaches GPU devices and is \
             closed in namespaces of TenantGpuQuota team-a"
        ),
        "{msg}"
    );
    assert!(msg.contains("nvidia.com/mig-<profile>"), "says what to use instead: {msg}");
    // A class pinned to another driver is open; outside tenant namespaces nothing is closed.
    claims.create(&PostParams::default(), &claim("fpga", &["fpga.example.com"])).await.unwrap();
    let elsewhere: Api<ResourceClaim> = Api::namespaced(admin.clone(), "elsewhere");
    elsewhere.create(&PostParams::default(), &claim("mig", &["mig.nvidia.com"])).await.unwrap();

    // A class created just now (no 0 written for it yet) is refused too.
    let classes: Api<DeviceClass> = Api::all(admin.clone());
    classes.create(&PostParams::default(), &class("brand-new.example.com", "true")).await.unwrap();
    let msg = claims.create(&PostParams::default(), &claim("new", &["brand-new.example.com"])).await.unwrap_err();
    assert!(
        msg.to_string().contains("spec.devices.requests[0].exactly.deviceClassName: class brand-new.example.com"),
        "{msg}"
    );

    // The params are written again when deleted (level-triggered).
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "tessera-system");
    cms.delete("tessera-claim-classes", &Default::default()).await.unwrap();
    wait_policy(&admin, "team-a", "mig.nvidia.com").await;

    // Templates: the field under spec.spec, firstAvailable alternatives each checked.
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(admin.clone(), "team-a");
    let t: ResourceClaimTemplate = serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate", "metadata": {"name": "t"}, "spec": {"spec": {"devices": {"requests": [
            {"name": "r", "firstAvailable": [{"name": "a", "deviceClassName": "fpga.example.com"},
                                              {"name": "b", "deviceClassName": "mig.nvidia.com"}]}]}}}}))
    .unwrap();
    let msg = templates.create(&PostParams::default(), &t).await.unwrap_err().to_string();
    assert!(
        msg.contains("spec.spec.devices.requests[0].firstAvailable[1].deviceClassName: class mig.nvidia.com reaches"),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_resource_claims_mode_concurrent_claims_get_exactly_the_share_and_usage_counts_them() {
    let (_cp, admin, _op) = setup(&["team-b"]).await;
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    // A bad value is refused by the CRD's schema, naming the field.
    let raw: Api<kube::api::DynamicObject> =
        Api::all_with(admin.clone(), &kube::api::ApiResource::erase::<TenantGpuQuota>(&()));
    let bad = json!({"namespaces": ["team-b"], "hard": {}, "allocation": "Claims"});
    let err = raw.create(&PostParams::default(), &quota_value("bad", bad)).await.unwrap_err().to_string();
    assert!(err.contains("spec.allocation") && err.contains("Claims"), "{err}");
    let spec = json!({"namespaces": ["team-b"], "hard": {"nvidia.com/mig-1g.10gb": 3}, "allocation": "ResourceClaims"});
    quotas.create(&PostParams::default(), &quota("team-b", spec)).await.unwrap();
    let ours = "mig-1g.10gb.tessera.dev";
    wait_policy(&admin, "team-b", ours).await;
    wait_key(&admin, "team-b", "team-b", &format!("{ours}{DEV}"), "3").await;
    wait_key(&admin, "team-b", "team-b", "requests.nvidia.com/mig-1g.10gb", "0").await;
    // The class opens once the stamp is cached and the operator's clock reaches it (a pass or two
    // after the sync: `stamp::MARGIN_SECS`).
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "tessera-system");
    wait_for("Tessera's class open in team-b", T, || async {
        let data = cms.get("tessera-claim-classes").await.ok()?.data?;
        let allowed = data.get("team-b.allowed")?;
        (allowed == "_tessera" || allowed.split(' ').any(|c| c == ours)).then_some(())
    })
    .await
    .unwrap();
    let made = Api::<DeviceClass>::all(admin.clone()).get(ours).await.unwrap();
    let expr = made.spec.unwrap().selectors.unwrap()[0].cel.clone().unwrap().expression;
    assert!(expr.contains("profile == '1g.10gb'"), "{expr}");

    let claims: Api<ResourceClaim> = Api::namespaced(admin.clone(), "team-b");
    let results = futures::future::join_all((0..50).map(|i| {
        let claims = claims.clone();
        async move { claims.create(&PostParams::default(), &claim(&format!("c{i}"), &[ours])).await }
    }))
    .await;
    let errs: Vec<String> = results.iter().filter_map(|r| r.as_ref().err().map(ToString::to_string)).take(2).collect();
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 3, "exactly the share is admitted: {errs:?}");
    let refusals: Vec<String> = results.iter().filter_map(|r| r.as_ref().err().map(ToString::to_string)).collect();
    assert!(refusals.iter().any(|m| m.contains("exceeded quota: tessera-team-b")), "{refusals:?}");

    // NVIDIA's broad class stays closed, and the refusal says which class to use.
    let msg = claims.create(&PostParams::default(), &claim("broad", &["mig.nvidia.com"])).await.unwrap_err();
    assert!(msg.to_string().contains("TenantGpuQuota team-b; use mig-1g.10gb.tessera.dev"), "{msg}");

    let st = wait_for("usage through claims reported", T, || async {
        let st = quotas.get("team-b").await.ok()?.status?;
        (st.resources.first()?.used == 3).then_some(st)
    })
    .await
    .unwrap();
    assert_eq!((st.resources[0].name.as_str(), st.resources[0].remaining), ("nvidia.com/mig-1g.10gb", 0));
}

/// A pod naming the claim `claim` (`spec.resourceClaims[0].resourceClaimName`).
fn claim_pod(name: &str, claim: &str) -> Pod {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "g"}]}}],
                 "resourceClaims": [{"name": "g", "resourceClaimName": claim}]}}))
    .unwrap()
}

/// `stash` (NVIDIA's MIG class, unallocated) and `watch` (admin access to MIG devices) were made
/// in `team-c` before it joined a quota (it carried the admin-access label). Once the quota lists
/// it, the operator's params list both in `team-c.claims`, and the API server refuses a pod naming
/// either, naming the field, the claim and (through its class) the cause; a claim not listed is
/// still usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_naming_a_claim_made_before_its_namespace_joined_is_refused_by_the_api_server() {
    let (_cp, admin, _op) = setup(&["team-c"]).await;
    let label = json!({"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}});
    Api::<Namespace>::all(admin.clone()).patch("team-c", &PatchParams::default(), &Patch::Merge(&label)).await.unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(admin.clone(), "team-c");
    claims.create(&PostParams::default(), &claim("stash", &["mig.nvidia.com"])).await.unwrap();
    let mut watch = claim("watch", &["mig.nvidia.com"]);
    let devices = watch.spec.as_mut().unwrap().devices.as_mut().unwrap();
    devices.requests.as_mut().unwrap()[0].exactly.as_mut().unwrap().admin_access = Some(true);
    claims.create(&PostParams::default(), &watch).await.unwrap();
    claims.create(&PostParams::default(), &claim("fpga", &["fpga.example.com"])).await.unwrap();

    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    let spec = json!({"namespaces": ["team-c"], "hard": {"nvidia.com/mig-1g.10gb": 2}});
    quotas.create(&PostParams::default(), &quota("team-c", spec)).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "tessera-system");
    let listed = wait_for("team-c.claims in the params", T, || async {
        let data = cms.get("tessera-claim-classes").await.ok()?.data?;
        let listed = data.get("team-c.claims")?.clone();
        listed.contains("watch:").then_some(listed)
    })
    .await
    .unwrap();
    assert_eq!(listed, "stash:mig.nvidia.com watch:mig.nvidia.com,adminAccess");

    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "team-c");
    wait_for("team-c's default service account", T, || async { sas.get_opt("default").await.ok()?.map(|_| ()) })
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "team-c");
    let msg = pods.create(&PostParams::default(), &claim_pod("p1", "stash")).await.unwrap_err().to_string();
    assert!(
        msg.contains(
            "spec.resourceClaims[0].resourceClaimName: ResourceClaim stash (class mig.nvidia.com) is not limited by \
             TenantGpuQuota team-c of namespace team-c"
        ) && msg.contains("delete the claim"),
        "{msg}"
    );
    let msg = pods.create(&PostParams::default(), &claim_pod("p2", "watch")).await.unwrap_err().to_string();
    assert!(
        msg.contains(
            "spec.resourceClaims[0].resourceClaimName: ResourceClaim watch (class mig.nvidia.com,adminAccess)"
        ),
        "{msg}"
    );
    pods.create(&PostParams::default(), &claim_pod("p3", "fpga")).await.unwrap();
}

/// `stash` (NVIDIA's whole-GPU class) and the gated pod `p` using it, and the gated pod
/// `q` whose claim is made from the template `tpl` (same class), were made in `team-d` before it
/// joined a quota; once the quota is enforced and the gates removed, the scheduler finds node-b's
/// two GPUs and tries to allocate the claims: the claim-class policy refuses each allocation
/// (`resourceclaims/status`), so the claims stay unallocated and the pods unbound, the refusal in
/// their scheduling condition or events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocating_a_claim_made_before_its_namespace_joined_is_refused_and_the_pod_stays_pending() {
    let (_cp, admin, _op) = setup(&["team-d"]).await;
    let gpu = class(
        "gpu.nvidia.com",
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
    );
    Api::<DeviceClass>::all(admin.clone()).create(&PostParams::default(), &gpu).await.unwrap();
    create_gpu_nodes(&admin, &[FakeGpuNode::new("node-b", "NVIDIA-H100-80GB-HBM3", 2)]).await.unwrap();
    let slice: ResourceSlice = serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "node-b-gpu"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "node-b", "pool": {"name": "node-b", "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}},
                             {"name": "gpu-1", "attributes": {"type": {"string": "gpu"}}}]}}))
    .unwrap();
    Api::<ResourceSlice>::all(admin.clone()).create(&PostParams::default(), &slice).await.unwrap();

    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "team-d");
    wait_for("team-d's default service account", T, || async { sas.get_opt("default").await.ok()?.map(|_| ()) })
        .await
        .unwrap();
    // One GPU each (not `All`): with both claims being allocated, neither leaves the other none.
    let stash = claim("stash", &["gpu.nvidia.com"]);
    let claims: Api<ResourceClaim> = Api::namespaced(admin.clone(), "team-d");
    claims.create(&PostParams::default(), &stash).await.unwrap();
    let mut p = claim_pod("p", "stash");
    p.spec.as_mut().unwrap().scheduling_gates =
        Some(vec![k8s_openapi::api::core::v1::PodSchedulingGate { name: "example.com/later".into() }]);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "team-d");
    pods.create(&PostParams::default(), &p).await.unwrap();
    // The second form: a gated pod whose claim the resource-claim controller makes from a
    // template, before the namespace joins.
    let tpl: ResourceClaimTemplate = serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate", "metadata": {"name": "tpl"},
        "spec": {"spec": {"devices": {"requests": [{"name": "r0", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}}))
    .unwrap();
    Api::<ResourceClaimTemplate>::namespaced(admin.clone(), "team-d")
        .create(&PostParams::default(), &tpl)
        .await
        .unwrap();
    let mut q = claim_pod("q", "unused");
    q.spec.as_mut().unwrap().resource_claims.as_mut().unwrap()[0] =
        serde_json::from_value(json!({"name": "g", "resourceClaimTemplateName": "tpl"})).unwrap();
    q.spec.as_mut().unwrap().scheduling_gates =
        Some(vec![k8s_openapi::api::core::v1::PodSchedulingGate { name: "example.com/later".into() }]);
    pods.create(&PostParams::default(), &q).await.unwrap();
    let q_claim = wait_for("q's claim made from tpl", T, || async {
        let st = pods.get("q").await.ok()?.status?.resource_claim_statuses?;
        st.first()?.resource_claim_name.clone()
    })
    .await
    .unwrap();

    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    let spec = json!({"namespaces": ["team-d"], "hard": {"nvidia.com/gpu": 1}});
    quotas.create(&PostParams::default(), &quota("team-d", spec)).await.unwrap();
    wait_policy(&admin, "team-d", "gpu.nvidia.com").await;
    wait_key(&admin, "team-d", "team-d", &format!("gpu.nvidia.com{DEV}"), "0").await;

    let ungate = json!({"spec": {"schedulingGates": []}});
    pods.patch("p", &PatchParams::default(), &Patch::Merge(&ungate)).await.unwrap();
    let seen = wait_for("the allocation's refusal in p's scheduling status", T, || async {
        let m = scheduling_messages(&admin, "team-d", "p").await;
        m.contains("status.allocation: ResourceClaim stash (class gpu.nvidia.com) of namespace team-d").then_some(m)
    })
    .await
    .unwrap();
    assert!(seen.contains("TenantGpuQuota team-d") && seen.contains("delete the claim"), "{seen}");
    // Still refused some seconds on (the scheduler retries): nothing allocated, nothing bound.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let c = claims.get("stash").await.unwrap();
    assert!(c.status.as_ref().and_then(|s| s.allocation.as_ref()).is_none(), "{:?}", c.status);
    let p = pods.get("p").await.unwrap();
    assert_eq!(p.spec.and_then(|s| s.node_name), None, "p stays pending");
    pods.patch("q", &PatchParams::default(), &Patch::Merge(&ungate)).await.unwrap();
    let want = format!("status.allocation: ResourceClaim {q_claim} (class gpu.nvidia.com) of namespace team-d");
    let found = wait_for("the allocation's refusal in q's scheduling status", T, || async {
        scheduling_messages(&admin, "team-d", "q").await.contains(&want).then_some(())
    })
    .await;
    let last = scheduling_messages(&admin, "team-d", "q").await;
    assert!(found.is_ok(), "{want} not in q's: {last}");
    let c = claims.get(&q_claim).await.unwrap();
    assert!(c.status.as_ref().and_then(|s| s.allocation.as_ref()).is_none(), "{:?}", c.status);
    assert_eq!(pods.get("q").await.unwrap().spec.and_then(|s| s.node_name), None, "q stays pending");
}

/// `gpu.tessera.dev` exists (quota `team-x` allocates through claims elsewhere);
/// `hoard` (that class) and the gated pod `p` using it are made in `team-e` before it joins a
/// quota. Once `team-e`'s ResourceQuota enforces the class, `team-e.since` is written, a new pod
/// naming `hoard` is refused at creation (`team-e.claims`, marked `,early`), and ungated `p`
/// stays pending: the scheduler's allocation of `hoard` is refused (made before the
/// ResourceQuota). Both refusals say so and to make the claim again. A claim made after is
/// allocated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocating_a_claim_of_tessera_s_class_made_before_its_namespace_joined_is_refused_too() {
    let (_cp, admin, _op) = setup(&["team-e", "team-x"]).await;
    create_gpu_nodes(&admin, &[FakeGpuNode::new("node-e", "NVIDIA-H100-80GB-HBM3", 2)]).await.unwrap();
    let slice: ResourceSlice = serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "node-e-gpu"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "node-e", "pool": {"name": "node-e", "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}},
                             {"name": "gpu-1", "attributes": {"type": {"string": "gpu"}}}]}}))
    .unwrap();
    Api::<ResourceSlice>::all(admin.clone()).create(&PostParams::default(), &slice).await.unwrap();
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    let other = json!({"namespaces": ["team-x"], "hard": {"nvidia.com/gpu": 1}, "allocation": "ResourceClaims"});
    quotas.create(&PostParams::default(), &quota("team-x", other)).await.unwrap();
    let ours = "gpu.tessera.dev";
    let classes: Api<DeviceClass> = Api::all(admin.clone());
    wait_for("gpu.tessera.dev made", T, || async { classes.get_opt(ours).await.ok()?.map(|_| ()) }).await.unwrap();

    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "team-e");
    wait_for("team-e's default service account", T, || async { sas.get_opt("default").await.ok()?.map(|_| ()) })
        .await
        .unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(admin.clone(), "team-e");
    claims.create(&PostParams::default(), &claim("hoard", &[ours])).await.unwrap();
    let mut p = claim_pod("p", "hoard");
    p.spec.as_mut().unwrap().scheduling_gates =
        Some(vec![k8s_openapi::api::core::v1::PodSchedulingGate { name: "example.com/later".into() }]);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "team-e");
    pods.create(&PostParams::default(), &p).await.unwrap();

    // Share 2: `hoard` (1, counted by the ResourceQuota's usage) and one claim made after.
    let spec = json!({"namespaces": ["team-e"], "hard": {"nvidia.com/gpu": 2}, "allocation": "ResourceClaims"});
    quotas.create(&PostParams::default(), &quota("team-e", spec)).await.unwrap();
    wait_key(&admin, "team-e", "team-e", &format!("{ours}{DEV}"), "2").await;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "tessera-system");
    wait_for("team-e open, its since and claims written", T, || async {
        let data = cms.get("tessera-claim-classes").await.ok()?.data?;
        let open = data.get("team-e.allowed")? == "_tessera" && data.contains_key("team-e.since");
        (open && data.get("team-e.claims")? == "hoard:gpu.tessera.dev,early").then_some(())
    })
    .await
    .unwrap();
    // `since` is the ResourceQuota's in-force stamp, not its creation (quota admission counts
    // nothing until `status.hard` syncs).
    let data = cms.get("tessera-claim-classes").await.unwrap().data.unwrap();
    let rq = Api::<ResourceQuota>::namespaced(admin.clone(), "team-e").get("tessera-team-e").await.unwrap();
    let stamp = rq.metadata.annotations.as_ref().and_then(|a| a.get("tessera.dev/limits-in-force-since"));
    assert_eq!(stamp, data.get("team-e.since"), "{:?}", rq.metadata);
    let stamp: k8s_openapi::jiff::Timestamp = stamp.unwrap().parse().unwrap();
    assert!(stamp >= rq.metadata.creation_timestamp.unwrap().0, "stamped no earlier than created");
    let msg = pods.create(&PostParams::default(), &claim_pod("p2", "hoard")).await.unwrap_err().to_string();
    assert!(
        msg.contains(
            "spec.resourceClaims[0].resourceClaimName: ResourceClaim hoard (class gpu.tessera.dev) of namespace \
             team-e was made before the namespace's current GPU limits were in force ("
        ) && msg.contains(
            "never counted it against its share and it will not be allocated; delete the claim and make it again"
        ),
        "{msg}"
    );

    let ungate = json!({"spec": {"schedulingGates": []}});
    pods.patch("p", &PatchParams::default(), &Patch::Merge(&ungate)).await.unwrap();
    let seen = wait_for("the allocation's refusal in p's scheduling status", T, || async {
        let m = scheduling_messages(&admin, "team-e", "p").await;
        m.contains("status.allocation: ResourceClaim hoard (class gpu.tessera.dev) of namespace team-e").then_some(m)
    })
    .await
    .unwrap();
    assert!(
        seen.contains("it was made before the namespace's current GPU limits were in force (")
            && seen.contains("delete the claim and the pods using it and make it again")
            && !seen.contains("claim through Tessera's classes"),
        "{seen}"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let c = claims.get("hoard").await.unwrap();
    assert!(c.status.as_ref().and_then(|s| s.allocation.as_ref()).is_none(), "{:?}", c.status);
    assert_eq!(pods.get("p").await.unwrap().spec.and_then(|s| s.node_name), None, "p stays pending");

    // A claim made after the ResourceQuota: allocated, its pod bound.
    claims.create(&PostParams::default(), &claim("fresh", &[ours])).await.unwrap();
    pods.create(&PostParams::default(), &claim_pod("p3", "fresh")).await.unwrap();
    let bound = wait_for("fresh allocated", T, || async {
        let c = claims.get("fresh").await.ok()?;
        c.status?.allocation.map(|_| ())
    })
    .await;
    let last = scheduling_messages(&admin, "team-e", "p3").await;
    assert!(bound.is_ok(), "fresh not allocated: {last}");
}
