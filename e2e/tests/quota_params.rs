//! The quota admission params on the real control plane: what the operator writes
//! into `tessera-claim-classes` for cases only a restart or a second quota reveals, enforced by
//! the API server running the shipped policies. A namespace deleted and created again while the
//! operator is down (`<ns>.uid`), a quota deleted and created again under its name meanwhile
//! (`_quotas`, policy `tessera-quota-names`), two quotas claiming one namespace, one
//! `unlisted: Zero` (`<ns>.limited`), both ResourceQuota names taken (`<ns>.pending`), more
//! leftover claims than the params list (`<ns>.claims: _all`), a gated GPU pod made before its
//! namespace joined (`<ns>.pods`, policy `tessera-gpu-bindings`, with the real scheduler); and
//! the policies type-check there without warnings.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, PodSchedulingGate, ResourceQuota, ServiceAccount};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tessera_crds::TenantGpuQuota;
use tessera_e2e::dra::scheduling_messages;
use tessera_e2e::fixtures::{
    FakeGpuNode, apply_file, create_gpu_nodes, create_namespace, install_crds, spawn_operator, wait_for,
};
use tessera_e2e::process::Component;
use tessera_e2e::{ControlPlane, Identity};

const T: Duration = Duration::from_secs(60);
const GPU: &str = "requests.nvidia.com/gpu";

/// The control plane with the CRDs, the operator's RBAC, the shipped policies and `namespaces`,
/// and the operator running.
async fn setup(namespaces: &[&str]) -> (ControlPlane, Client, Component) {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    install_crds(&admin).await.unwrap();
    for f in ["config/base/namespace.yaml", "config/rbac/operator.yaml", "config/rbac/claim-classes.yaml"] {
        apply_file(&admin, f).await.unwrap();
    }
    for ns in namespaces {
        create_namespace(&admin, ns).await.unwrap();
        wait_service_account(&admin, ns).await;
    }
    let (op, _) = spawn_operator(&cp, "op").unwrap();
    (cp, admin, op)
}

/// Pods are admitted into `ns` once its default service account exists.
async fn wait_service_account(admin: &Client, ns: &str) {
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    wait_for(&format!("{ns}'s default service account"), T, || async {
        sas.get_opt("default").await.ok()?.map(|_| ())
    })
    .await
    .unwrap();
}

fn quota(name: &str, spec: serde_json::Value) -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "metadata": {"name": name}, "spec": spec}))
        .unwrap()
}

/// A pod asking for one of `resource`.
fn gpu_pod(name: &str, resource: &str) -> Pod {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "x",
            "resources": {"requests": {resource: "1"}, "limits": {resource: "1"}}}]}}))
    .unwrap()
}

/// Waits until the ResourceQuota of `quota` in `ns` enforces `hard` of `key` (spec and status:
/// the API server's quota admission reads the status).
async fn wait_enforced(admin: &Client, ns: &str, quota: &str, key: &str, hard: &str) {
    let rqs: Api<ResourceQuota> = Api::namespaced(admin.clone(), ns);
    let name = tessera_planner::quota::resource_quota_name(quota);
    wait_for(&format!("{ns}/{name} enforced"), T, || async {
        let rq = rqs.get(&name).await.ok()?;
        let spec_ok = rq.spec.as_ref()?.hard.as_ref()?.get(key).map(|q| q.0.as_str()) == Some(hard);
        let status_ok = rq.status.as_ref()?.hard.as_ref()?.get(key).map(|q| q.0.as_str()) == Some(hard);
        (spec_ok && status_ok).then_some(())
    })
    .await
    .unwrap();
}

/// Waits until the operator's params satisfy `ok`; returns them.
async fn wait_params(
    admin: &Client,
    what: &str,
    ok: impl Fn(&BTreeMap<String, String>) -> bool,
) -> BTreeMap<String, String> {
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "tessera-system");
    wait_for(what, T, || async {
        let data = cms.get("tessera-claim-classes").await.ok()?.data?;
        ok(&data).then_some(data)
    })
    .await
    .unwrap()
}

fn pending(data: &BTreeMap<String, String>, ns: &str) -> bool {
    data.get("_pending").is_none_or(|p| p.split(' ').any(|n| n == ns))
}

async fn namespace_uid(admin: &Client, ns: &str) -> String {
    Api::<Namespace>::all(admin.clone()).get(ns).await.unwrap().metadata.uid.unwrap()
}

/// A tenant namespace deleted and created again while the operator is down has no
/// ResourceQuota, yet the params still describe the old one as enforced. The API server
/// compares the params' `a.uid` with the new namespace's UID: GPU pods and claims of GPU classes
/// are refused naming the re-creation; once the operator has run, `a` gets its ResourceQuota
/// and no more than the share is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_created_again_while_the_operator_is_down_refuses_gpu_pods_until_it_has_run() {
    let (cp, admin, mut op) = setup(&["a"]).await;
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    let spec = json!({"namespaces": ["a"], "hard": {"nvidia.com/gpu": 2}});
    quotas.create(&PostParams::default(), &quota("team-a", spec)).await.unwrap();
    wait_enforced(&admin, "a", "team-a", GPU, "2").await;
    let old = namespace_uid(&admin, "a").await;
    wait_params(&admin, "a's UID written, a enforced", |d| d.get("a.uid") == Some(&old) && !pending(d, "a")).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "a");
    pods.create(&PostParams::default(), &gpu_pod("before", "nvidia.com/gpu")).await.unwrap();

    // The operator is down while `a` is deleted (its ResourceQuota with it) and created again.
    op.stop_now();
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    namespaces.delete("a", &DeleteParams::default()).await.unwrap();
    wait_for("a deleted", T, || async { namespaces.get_opt("a").await.ok()?.is_none().then_some(()) }).await.unwrap();
    create_namespace(&admin, "a").await.unwrap();
    wait_service_account(&admin, "a").await;
    assert_ne!(namespace_uid(&admin, "a").await, old);
    let rqs: Api<ResourceQuota> = Api::namespaced(admin.clone(), "a");
    assert!(rqs.get_opt("tessera-team-a").await.unwrap().is_none(), "nothing limits the new a");

    let msg = pods.create(&PostParams::default(), &gpu_pod("early", "nvidia.com/gpu")).await.unwrap_err().to_string();
    assert!(
        msg.contains(
            "spec.containers[0].resources.requests[nvidia.com/gpu]: namespace a of TenantGpuQuota team-a: the \
             namespace was deleted and created again since the operator last wrote its limits"
        ) && msg.contains("retry once the operator has run"),
        "{msg}"
    );
    let claim: ResourceClaim = serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c"}, "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}))
    .unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(admin.clone(), "a");
    let msg = claims.create(&PostParams::default(), &claim).await.unwrap_err().to_string();
    assert!(
        msg.contains("spec.devices.requests[0].exactly.deviceClassName: class gpu.nvidia.com")
            && msg.contains("the namespace was deleted and created again since the operator last wrote its limits"),
        "{msg}"
    );
    let plain: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cpu"},
        "spec": {"containers": [{"name": "c", "image": "x"}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &plain).await.unwrap();

    // The operator back: the new UID and ResourceQuota are written, then exactly the share.
    let (_op2, _) = spawn_operator(&cp, "op2").unwrap();
    let new = namespace_uid(&admin, "a").await;
    wait_enforced(&admin, "a", "team-a", GPU, "2").await;
    wait_params(&admin, "a's new UID written, a enforced", |d| d.get("a.uid") == Some(&new) && !pending(d, "a")).await;
    for p in ["p0", "p1"] {
        pods.create(&PostParams::default(), &gpu_pod(p, "nvidia.com/gpu")).await.unwrap();
    }
    let msg = pods.create(&PostParams::default(), &gpu_pod("p2", "nvidia.com/gpu")).await.unwrap_err().to_string();
    assert!(msg.contains("exceeded quota: tessera-team-a"), "{msg}");
}

/// A TenantGpuQuota deleted while the operator is down and created again under its
/// name would find its namespaces described as enforced (params), their ResourceQuotas
/// garbage-collected. `tessera-quota-names` refuses the create while `_quotas` lists the name;
/// another name is not held back; once the operator has run, the name is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_created_again_under_its_name_while_the_operator_is_down_is_refused_until_it_has_run() {
    let (cp, admin, mut op) = setup(&["a"]).await;
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    let spec = json!({"namespaces": ["a"], "hard": {"nvidia.com/gpu": 2}});
    quotas.create(&PostParams::default(), &quota("team-a", spec.clone())).await.unwrap();
    wait_enforced(&admin, "a", "team-a", GPU, "2").await;
    wait_params(&admin, "_quotas lists team-a", |d| {
        d.get("_quotas").is_some_and(|q| q.split(' ').any(|n| n == "team-a"))
    })
    .await;

    op.stop_now();
    quotas.delete("team-a", &DeleteParams::default()).await.unwrap();
    wait_for("team-a deleted", T, || async { quotas.get_opt("team-a").await.ok()?.is_none().then_some(()) })
        .await
        .unwrap();
    let msg = quotas.create(&PostParams::default(), &quota("team-a", spec.clone())).await.unwrap_err().to_string();
    assert!(
        msg.contains(
            "metadata.name: TenantGpuQuota team-a was deleted and the operator has not run since (its namespaces \
             are still described as enforced by it, their ResourceQuotas gone); retry once the operator has run"
        ),
        "{msg}"
    );
    let other = json!({"namespaces": ["b"], "hard": {"nvidia.com/gpu": 1}});
    quotas.create(&PostParams::default(), &quota("team-b", other)).await.unwrap();

    let (_op2, _) = spawn_operator(&cp, "op2").unwrap();
    wait_params(&admin, "_quotas without team-a", |d| {
        d.get("_quotas").is_some_and(|q| q.split(' ').any(|n| n == "team-b") && !q.split(' ').any(|n| n == "team-a"))
    })
    .await;
    quotas.create(&PostParams::default(), &quota("team-a", spec)).await.unwrap();
    wait_enforced(&admin, "a", "team-a", GPU, "2").await;
}

/// Two quotas claim `x`, `team-b` with `unlisted: Zero`. Its per-quota list
/// (`team-b.resources`) cannot answer for `x` (`x.quota` names both), so the params list per
/// namespace what some ResourceQuota there limits (`x.limited`): the API server refuses a pod
/// asking for a GPU resource none limits (`nvidia.com/gpu.shared`, which no node advertises
/// yet), and admits one asking for the limited `nvidia.com/gpu`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_quotas_one_zero_on_a_namespace_refuse_gpu_resources_no_resource_quota_limits() {
    let (_cp, admin, _op) = setup(&["x"]).await;
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    let zero = json!({"namespaces": ["x"], "hard": {"nvidia.com/gpu": 2}, "unlisted": "Zero"});
    quotas.create(&PostParams::default(), &quota("team-b", zero)).await.unwrap();
    wait_enforced(&admin, "x", "team-b", GPU, "2").await;
    let typo = json!({"namespaces": ["x"], "hard": {"nvidia.com/gpu": 4}});
    quotas.create(&PostParams::default(), &quota("team-c", typo)).await.unwrap();
    let data = wait_params(&admin, "x.limited written, x enforced", |d| {
        d.get("x.quota").is_some_and(|q| q.contains("team-c")) && d.contains_key("x.limited") && !pending(d, "x")
    })
    .await;
    // `nvidia.com/gpu` (both quotas' `hard`) and Zero's 0 for each catalog MIG profile; not gpu.shared.
    let limited: Vec<&str> = data["x.limited"].split(' ').collect();
    assert!(limited.contains(&"nvidia.com/gpu") && limited.contains(&"nvidia.com/mig-1g.10gb"), "{limited:?}");
    assert!(!limited.contains(&"nvidia.com/gpu.shared"), "{limited:?}");

    let pods: Api<Pod> = Api::namespaced(admin.clone(), "x");
    let msg =
        pods.create(&PostParams::default(), &gpu_pod("shared", "nvidia.com/gpu.shared")).await.unwrap_err().to_string();
    assert!(
        msg.contains(&format!(
            "spec.containers[0].resources.requests[nvidia.com/gpu.shared]: namespace x of TenantGpuQuota {} (unlisted: \
             Zero in a \
             conflict, or an invalid quota): no ResourceQuota limits this GPU resource",
            data["x.quota"]
        )),
        "{msg}"
    );
    pods.create(&PostParams::default(), &gpu_pod("whole", "nvidia.com/gpu")).await.unwrap();
}

/// The API server type-checks each policy against the schemas of what it matches
/// (`status.typeChecking`): a warning there is an expression that may fail at runtime, and with
/// `failurePolicy: Fail` that refuses every request it matches. The shipped policies have none.
/// The server checks only validations and messageExpressions: a variable that does not type-check
/// becomes `dyn` unreported, and match conditions are not checked. So each policy also gets a
/// test-only copy (no binding: never evaluated) whose validations are its variables' and match
/// conditions' expressions ([`type_check_copy`]); the copy has no warnings either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_policies_type_check_on_the_api_server_without_warnings() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    install_crds(&admin).await.unwrap();
    apply_file(&admin, "config/rbac/claim-classes.yaml").await.unwrap();
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(admin.clone());
    let checked = |name: String| {
        let policies = policies.clone();
        async move {
            let checked = wait_for(&format!("{name} type-checked"), T, || async {
                let p = policies.get(&name).await.ok()?;
                let st = p.status?;
                (st.observed_generation == p.metadata.generation).then_some(st.type_checking?)
            })
            .await
            .unwrap();
            checked.expression_warnings.unwrap_or_default()
        }
    };
    // Every policy's, then one assertion: a run names every expression that needs a fix.
    let mut found: Vec<String> = Vec::new();
    for name in ["tessera-claim-classes", "tessera-gpu-pods", "tessera-gpu-bindings", "tessera-quota-names"] {
        assert_eq!(checked(name.to_string()).await, vec![], "{name}");
        let (copy, what) = type_check_copy(&policies.get(name).await.unwrap());
        if what.is_empty() {
            continue; // no variable, no match condition (a policy needs one validation)
        }
        let copy = policies.create(&PostParams::default(), &copy).await.unwrap();
        let warnings = checked(copy.metadata.name.unwrap()).await;
        // Each warning with the variable or match condition its validation stands for.
        let named: Vec<String> = warnings
            .iter()
            .map(|w| {
                let i = w.field_ref.strip_prefix("spec.validations[").and_then(|r| r.split(']').next());
                let of = i.and_then(|i| what.get(i.parse::<usize>().ok()?)).map_or("?", String::as_str);
                format!("{name} {of}: {}", w.warning)
            })
            .collect();
        found.extend(named);
    }
    assert!(found.is_empty(), "variables and match conditions with type errors:\n{}", found.join("\n"));
}

/// A copy of `p` named `<name>-typecheck` with the same `paramKind`, `matchConstraints` and
/// `variables` (so references resolve) whose validations are each variable's and each match
/// condition's expression `e`, as `(e) == (e)`: a bool the type checker checks through. Also
/// says what each validation stands for (`variables.<name>`, `matchConditions.<name>`).
fn type_check_copy(p: &ValidatingAdmissionPolicy) -> (ValidatingAdmissionPolicy, Vec<String>) {
    use k8s_openapi::api::admissionregistration::v1::Validation;
    let mut spec = p.spec.clone().unwrap_or_default();
    let vars = spec.variables.iter().flatten().map(|v| (format!("variables.{}", v.name), v.expression.clone()));
    let conds =
        spec.match_conditions.iter().flatten().map(|c| (format!("matchConditions.{}", c.name), c.expression.clone()));
    let (what, exprs): (Vec<String>, Vec<String>) = vars.chain(conds).unzip();
    let checks = exprs.iter().map(|e| Validation { expression: format!("({e}) == ({e})"), ..Default::default() });
    spec.validations = Some(checks.collect());
    spec.match_conditions = None;
    spec.audit_annotations = None;
    let mut copy = ValidatingAdmissionPolicy::default();
    copy.metadata.name = Some(format!("{}-typecheck", p.metadata.name.as_deref().unwrap_or_default()));
    copy.spec = Some(spec);
    (copy, what)
}

/// Both names the quota may give its ResourceQuota in `a` are held by the tenant's
/// own. Waiting will not help, so the pod policy's refusal gives the cause the params carry
/// (`a.pending`) instead of "retry in a few seconds"; once one name is freed, the operator
/// writes its ResourceQuota there and GPU pods are admitted within the share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_resource_quota_names_taken_refuses_gpu_pods_naming_the_cause() {
    let (_cp, admin, _op) = setup(&["a"]).await;
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    let spec = json!({"namespaces": ["b"], "hard": {"nvidia.com/gpu": 2}});
    let uid = quotas.create(&PostParams::default(), &quota("team-a", spec)).await.unwrap().metadata.uid.unwrap();
    let fallback = tessera_planner::quota::fallback_resource_quota_name("team-a", &uid);
    let rqs: Api<ResourceQuota> = Api::namespaced(admin.clone(), "a");
    for name in ["tessera-team-a", fallback.as_str()] {
        let rq: ResourceQuota = serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"hard": {GPU: "100"}}}))
        .unwrap();
        rqs.create(&PostParams::default(), &rq).await.unwrap();
    }
    let join = json!({"spec": {"namespaces": ["b", "a"]}});
    quotas.patch("team-a", &PatchParams::default(), &Patch::Merge(&join)).await.unwrap();
    let data = wait_params(&admin, "a.pending written", |d| d.contains_key("a.pending") && pending(d, "a")).await;
    let cause = format!("ResourceQuotas tessera-team-a and {fallback} there are not TenantGpuQuota team-a's");
    assert!(data["a.pending"].starts_with(&cause), "{}", data["a.pending"]);

    let pods: Api<Pod> = Api::namespaced(admin.clone(), "a");
    let msg = pods.create(&PostParams::default(), &gpu_pod("early", "nvidia.com/gpu")).await.unwrap_err().to_string();
    assert!(
        msg.contains(&format!(
            "spec.containers[0].resources.requests[nvidia.com/gpu]: namespace a of TenantGpuQuota team-a: {cause}"
        )) && msg.contains("rename or delete one")
            && !msg.contains("retry in a few seconds"),
        "{msg}"
    );

    rqs.delete("tessera-team-a", &DeleteParams::default()).await.unwrap();
    wait_enforced(&admin, "a", "team-a", GPU, "1").await;
    wait_params(&admin, "a enforced", |d| !d.contains_key("a.pending") && !pending(d, "a")).await;
    pods.create(&PostParams::default(), &gpu_pod("p0", "nvidia.com/gpu")).await.unwrap();
}

/// More leftover claims of a GPU class in `x` than `x.claims` may list (1 KiB per
/// namespace) were made before it joined its quota. The params say `_all`: the API server
/// refuses every pod naming an existing claim there, even one of an open class, naming the
/// cause and the way out (templates); a pod using a template is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_claims_cap_every_pod_naming_an_existing_claim_is_refused() {
    let (_cp, admin, _op) = setup(&["x"]).await;
    let classes: Api<k8s_openapi::api::resource::v1::DeviceClass> = Api::all(admin.clone());
    for (name, expr) in [
        ("mig.nvidia.com", "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"),
        ("fpga.example.com", "device.driver == 'fpga.example.com'"),
    ] {
        let class = serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expr}}]}}))
        .unwrap();
        classes.create(&PostParams::default(), &class).await.unwrap();
    }
    let claim = |name: &str, class: &str| -> ResourceClaim {
        serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name}, "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": class}}]}}}))
        .unwrap()
    };
    let claims: Api<ResourceClaim> = Api::namespaced(admin.clone(), "x");
    // 30 entries of ~50 characters: past 1 KiB.
    for i in 0..30 {
        claims
            .create(&PostParams::default(), &claim(&format!("leftover-from-before-the-quota-{i:02}"), "mig.nvidia.com"))
            .await
            .unwrap();
    }
    claims.create(&PostParams::default(), &claim("fpga", "fpga.example.com")).await.unwrap();

    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    let spec = json!({"namespaces": ["x"], "hard": {"nvidia.com/mig-1g.10gb": 2}});
    quotas.create(&PostParams::default(), &quota("team-x", spec)).await.unwrap();
    wait_params(&admin, "x.claims is _all", |d| d.get("x.claims").map(String::as_str) == Some("_all")).await;

    let pods: Api<Pod> = Api::namespaced(admin.clone(), "x");
    let naming: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "g"}]}}],
                 "resourceClaims": [{"name": "g", "resourceClaimName": "fpga"}]}}))
    .unwrap();
    let msg = pods.create(&PostParams::default(), &naming).await.unwrap_err().to_string();
    assert!(
        msg.contains(
            "spec.resourceClaims[0].resourceClaimName: namespace x of TenantGpuQuota team-x holds more unallocated \
             ResourceClaims of GPU classes not Tessera's than the params can list"
        ) && msg.contains("use resourceClaimTemplateName"),
        "{msg}"
    );
    let templated: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "t"},
        "spec": {"containers": [{"name": "c", "image": "x"}],
                 "resourceClaims": [{"name": "g", "resourceClaimTemplateName": "any"}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &templated).await.unwrap();
}

/// The gated GPU pod `early` was made in `g` before `g` joined a quota (its
/// ResourceQuota never counted it at creation). Once the operator has listed it in `g.pods` and
/// the gate is removed, the real scheduler finds node-g's MIG slices but the binding policy
/// refuses the binding, naming the pod, quota, time, cause and fix: it stays unbound. The pod
/// `later`, made after the ResourceQuota (counted), is bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_gpu_pod_made_before_its_namespace_joined_a_quota_is_not_bound() {
    const MIG: &str = "nvidia.com/mig-1g.10gb";
    let (_cp, admin, _op) = setup(&["g"]).await;
    let node = FakeGpuNode::new("node-g", "NVIDIA-H100-80GB-HBM3", 1).resource(MIG, 7);
    create_gpu_nodes(&admin, &[node]).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "g");
    let mut early = gpu_pod("early", MIG);
    early.spec.as_mut().unwrap().scheduling_gates = Some(vec![PodSchedulingGate { name: "example.com/later".into() }]);
    pods.create(&PostParams::default(), &early).await.unwrap();

    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    quotas
        .create(&PostParams::default(), &quota("team-g", json!({"namespaces": ["g"], "hard": {MIG: 4}})))
        .await
        .unwrap();
    wait_enforced(&admin, "g", "team-g", &format!("requests.{MIG}"), "4").await;
    let listed = |d: &BTreeMap<String, String>| {
        d.get("g.pods").map(String::as_str) == Some("early") && d.contains_key("g.since") && !pending(d, "g")
    };
    let data = wait_params(&admin, "g.pods lists early", listed).await;
    let since = data["g.since"].clone();

    pods.patch("early", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"schedulingGates": []}})))
        .await
        .unwrap();
    let want = format!(
        "pod early of namespace g (TenantGpuQuota team-g) may not be bound: it asks for GPU extended resources and \
         was made no later than {since}, when its ResourceQuota began counting pods (before the namespace's GPU \
         limits were in force); bound, it would take GPUs the quota never counted; delete the pod and create it \
         again (it will be counted)"
    );
    wait_for("the binding's refusal in early's scheduling status", T, || async {
        scheduling_messages(&admin, "g", "early").await.contains(&want).then_some(())
    })
    .await
    .unwrap();

    // `.since` has second granularity: a pod made in its second is listed too.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    pods.create(&PostParams::default(), &gpu_pod("later", MIG)).await.unwrap();
    wait_for("later bound to node-g", T, || async {
        (pods.get("later").await.ok()?.spec?.node_name.as_deref() == Some("node-g")).then_some(())
    })
    .await
    .unwrap();
    let early = pods.get("early").await.unwrap();
    assert_eq!(early.spec.and_then(|s| s.node_name), None, "early stays unbound");
}
