//! TenantGpuQuota on the real control plane: enforced by the API server's ResourceQuota admission.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tessera_crds::TenantGpuQuota;
use tessera_crds::conditions::{CAPACITY_AVAILABLE, CONFLICT, READY, RECONCILING, STALLED, find};
use tessera_e2e::fixtures::{apply_file, create_namespace, install_crds, spawn_operator, wait_for};
use tessera_e2e::process::Component;
use tessera_e2e::{ControlPlane, Identity};

const T: Duration = Duration::from_secs(60);
const MIG: &str = "requests.nvidia.com/mig-1g.10gb";

async fn setup(namespaces: &[&str]) -> (ControlPlane, Client, Component) {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    install_crds(&admin).await.unwrap();
    for f in ["config/base/namespace.yaml", "config/rbac/operator.yaml", "config/rbac/viewer.yaml"] {
        apply_file(&admin, f).await.unwrap();
    }
    for ns in namespaces {
        create_namespace(&admin, ns).await.unwrap();
    }
    let (op, _) = spawn_operator(&cp, "op").unwrap();
    (cp, admin, op)
}

fn quota(name: &str, spec: serde_json::Value) -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "metadata": {"name": name}, "spec": spec}))
        .unwrap()
}

fn mig_pod(name: &str) -> Pod {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]}}))
    .unwrap()
}

/// Waits until our ResourceQuota exists in `ns` with the given hard limit and the controller-manager
/// has filled in its status (admission needs both).
async fn wait_enforced(admin: &Client, ns: &str, quota: &str, resource: &str, hard: &str) {
    wait_enforced_as(admin, ns, &tessera_planner::quota::resource_quota_name(quota), resource, hard).await
}

/// [`wait_enforced`] for the ResourceQuota named `name`.
async fn wait_enforced_as(admin: &Client, ns: &str, name: &str, resource: &str, hard: &str) {
    let rqs: Api<ResourceQuota> = Api::namespaced(admin.clone(), ns);
    wait_for(&format!("{ns}/{name} enforced"), T, || async {
        let rq = rqs.get(name).await.ok()?;
        let spec_ok = rq.spec.as_ref()?.hard.as_ref()?.get(resource).map(|q| q.0.as_str()) == Some(hard);
        let status_ok = rq.status.as_ref()?.hard.as_ref()?.get(resource).map(|q| q.0.as_str()) == Some(hard);
        (spec_ok && status_ok).then_some(())
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_over_the_quota_are_refused_with_the_quota_named_even_when_created_concurrently() {
    let (_cp, admin, _op) = setup(&["team-a", "team-a-batch"]).await;
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    quotas
        .create(
            &PostParams::default(),
            &quota(
                "team-a",
                json!({"namespaces": ["team-a", "team-a-batch"],
            "hard": {"nvidia.com/mig-1g.10gb": 7}, "split": "Explicit",
            "namespaceHard": {"team-a": {"nvidia.com/mig-1g.10gb": 5}, "team-a-batch": {"nvidia.com/mig-1g.10gb": 2}}}),
            ),
        )
        .await
        .unwrap();
    wait_enforced(&admin, "team-a", "team-a", "requests.nvidia.com/mig-1g.10gb", "5").await;
    wait_enforced(&admin, "team-a-batch", "team-a", "requests.nvidia.com/mig-1g.10gb", "2").await;

    // 20 pods at once into a namespace whose share is 5: the API server admits exactly 5.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "team-a");
    let results = futures::future::join_all((0..20).map(|i| {
        let pods = pods.clone();
        async move { pods.create(&PostParams::default(), &mig_pod(&format!("p{i}"))).await }
    }))
    .await;
    let admitted = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(admitted, 5, "exactly the share is admitted");
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        let msg = r.to_string();
        assert!(
            msg.contains("exceeded quota: tessera-team-a") || msg.contains("the object has been modified"),
            "refusal names the quota: {msg}"
        );
    }
    assert!(
        results
            .iter()
            .filter_map(|r| r.as_ref().err())
            .any(|e| e.to_string().contains("exceeded quota: tessera-team-a"))
    );
    assert_eq!(pods.list(&ListParams::default()).await.unwrap().items.len(), 5);

    // Status: usage per resource and per namespace.
    let q = wait_for("usage reported", T, || async {
        let q = quotas.get("team-a").await.ok()?;
        let st = q.status.clone()?;
        (st.resources.first()?.used == 5).then_some(st)
    })
    .await
    .unwrap();
    assert_eq!((q.resources[0].hard, q.resources[0].remaining), (7, 2));
    assert_eq!(find(&q.conditions, READY).unwrap().status, "True");

    // Drift is corrected.
    let rqs: Api<ResourceQuota> = Api::namespaced(admin.clone(), "team-a");
    rqs.patch(
        "tessera-team-a",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"hard": {"requests.nvidia.com/mig-1g.10gb": "50"}}})),
    )
    .await
    .unwrap();
    wait_enforced(&admin, "team-a", "team-a", "requests.nvidia.com/mig-1g.10gb", "5").await;

    // Deleting the quota removes what it created.
    quotas.delete("team-a", &DeleteParams::default()).await.unwrap();
    for ns in ["team-a", "team-a-batch"] {
        let rqs: Api<ResourceQuota> = Api::namespaced(admin.clone(), ns);
        wait_for(&format!("{ns} ResourceQuota removed"), T, || async {
            rqs.get_opt("tessera-team-a").await.ok()?.is_none().then_some(())
        })
        .await
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_edit_its_quota_or_resource_quota() {
    let (cp, admin, _op) = setup(&["team-a"]).await;
    Api::<TenantGpuQuota>::all(admin.clone())
        .create(
            &PostParams::default(),
            &quota("team-a", json!({"namespaces": ["team-a"], "hard": {"nvidia.com/mig-1g.10gb": 2}})),
        )
        .await
        .unwrap();
    wait_enforced(&admin, "team-a", "team-a", "requests.nvidia.com/mig-1g.10gb", "2").await;
    // The tenant is an editor of its namespace (the usual grant).
    let rb: RoleBinding =
        serde_json::from_value(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "team-a-edit", "namespace": "team-a"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "team-a"}]}))
        .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), "team-a").create(&PostParams::default(), &rb).await.unwrap();
    let tenant = cp.client(Identity::TenantA).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "team-a");
    wait_for("tenant can create pods", T, || async {
        pods.create(&PostParams::default(), &mig_pod("mine")).await.ok()
    })
    .await
    .unwrap();
    let forbidden = |e: kube::Error| matches!(e, kube::Error::Api(s) if s.code == 403);
    let rqs: Api<ResourceQuota> = Api::namespaced(tenant.clone(), "team-a");
    let raise = json!({"spec": {"hard": {"requests.nvidia.com/mig-1g.10gb": "100"}}});
    assert!(forbidden(rqs.patch("tessera-team-a", &PatchParams::default(), &Patch::Merge(&raise)).await.unwrap_err()));
    assert!(forbidden(rqs.delete("tessera-team-a", &DeleteParams::default()).await.unwrap_err()));
    let quotas: Api<TenantGpuQuota> = Api::all(tenant.clone());
    // TenantGpuQuota is cluster-scoped: no namespace role reaches it, and tenants get no cluster write.
    let raise = json!({"spec": {"hard": {"nvidia.com/mig-1g.10gb": 100}}});
    assert!(forbidden(quotas.patch("team-a", &PatchParams::default(), &Patch::Merge(&raise)).await.unwrap_err()));
    assert!(forbidden(quotas.delete("team-a", &DeleteParams::default()).await.unwrap_err()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_commitment_shows_in_capacity_available_with_the_shortfall() {
    let (_cp, admin, _op) = setup(&["a", "b"]).await;
    // The fleet: one node whose agent reported seven 1g.10gb slices.
    let gns: Api<tessera_crds::GpuNode> = Api::all(admin.clone());
    let gn: tessera_crds::GpuNode =
        serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": "gpu-0"}, "spec": {}}))
        .unwrap();
    gns.create(&PostParams::default(), &gn).await.unwrap();
    let inst: Vec<_> = (0..7).map(|i| json!({"profile": "1g.10gb", "start": i, "size": 1})).collect();
    let status = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "status": {"gpus": [
        {"index": 0, "uuid": "GPU-0", "product": "NVIDIA H100 80GB HBM3", "migCapable": true, "migEnabled": true, "instances": inst}]}});
    gns.patch_status("gpu-0", &PatchParams::apply("tessera-node-agent"), &Patch::Apply(&status)).await.unwrap();

    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    quotas
        .create(
            &PostParams::default(),
            &quota("a", json!({"namespaces": ["a"], "hard": {"nvidia.com/mig-1g.10gb": 4}})),
        )
        .await
        .unwrap();
    let ok = wait_for("a: capacity sufficient", T, || async {
        let q = quotas.get("a").await.ok()?;
        find(&q.status?.conditions, CAPACITY_AVAILABLE).filter(|c| c.status == "True").cloned()
    })
    .await
    .unwrap();
    assert_eq!(ok.reason, "Sufficient");
    quotas
        .create(
            &PostParams::default(),
            &quota("b", json!({"namespaces": ["b"], "hard": {"nvidia.com/mig-1g.10gb": 5}})),
        )
        .await
        .unwrap();
    for name in ["a", "b"] {
        let c = wait_for(&format!("{name}: over-committed"), T, || async {
            let q = quotas.get(name).await.ok()?;
            find(&q.status?.conditions, CAPACITY_AVAILABLE).filter(|c| c.status == "False").cloned()
        })
        .await
        .unwrap();
        assert_eq!(c.message, "over-committed: nvidia.com/mig-1g.10gb: quotas 9, fleet 7, short 2");
    }
}

/// The quota's condition of `type_`, once it is True.
async fn wait_condition(quotas: &Api<TenantGpuQuota>, name: &str, type_: &str, reason: &str) -> Condition {
    wait_for(&format!("{name}: {type_} {reason}"), T, || async {
        let q = quotas.get(name).await.ok()?;
        find(&q.status?.conditions, type_).filter(|c| c.status == "True" && c.reason == reason).cloned()
    })
    .await
    .unwrap()
}

/// Creates `n` pods asking for one 1g.10gb slice each in `ns`, then one more, which the API
/// server must refuse naming `rq_name`.
async fn fills_up_to(admin: &Client, ns: &str, n: usize, rq_name: &str) {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    for i in 0..n {
        pods.create(&PostParams::default(), &mig_pod(&format!("p{i}"))).await.unwrap();
    }
    let err = pods.create(&PostParams::default(), &mig_pod("one-too-many")).await.unwrap_err();
    assert!(err.to_string().contains(&format!("exceeded quota: {rq_name}")), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_claimed_by_a_second_quota_keeps_the_limit_enforced_there() {
    let (_cp, admin, _op) = setup(&["team-a", "shared"]).await;
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    let spec = json!({"namespaces": ["team-a"], "hard": {"nvidia.com/mig-1g.10gb": 3}});
    quotas.create(&PostParams::default(), &quota("team-a", spec)).await.unwrap();
    wait_enforced(&admin, "team-a", "team-a", MIG, "3").await;

    // A GitOps typo: another quota claims team-a too.
    let typo = json!({"namespaces": ["team-a", "shared"], "hard": {"nvidia.com/mig-1g.10gb": 10}});
    quotas.create(&PostParams::default(), &quota("typo", typo)).await.unwrap();
    // The typo's status is written at the end of a pass that saw both quotas: by then that
    // pass's stale deletions are done.
    wait_condition(&quotas, "typo", CONFLICT, "NamespaceClaimedTwice").await;
    wait_enforced(&admin, "shared", "typo", MIG, "5").await;
    let rq = Api::<ResourceQuota>::namespaced(admin.clone(), "team-a").get_opt("tessera-team-a").await.unwrap();
    assert_eq!(rq.expect("not deleted").spec.unwrap().hard.unwrap()[MIG].0, "3", "the tenant's limit still holds");
    fills_up_to(&admin, "team-a", 3, "tessera-team-a").await;
    let c = wait_condition(&quotas, "team-a", CONFLICT, "NamespaceClaimedTwice").await;
    assert!(c.message.contains("the stricter limit holds") && c.message.contains("team-a (also claimed by typo)"));

    // The typo is fixed: the conflict clears and team-a is managed again.
    let fixed = json!({"spec": {"namespaces": ["shared"]}});
    quotas.patch("typo", &PatchParams::default(), &Patch::Merge(&fixed)).await.unwrap();
    wait_for("team-a: Conflict cleared", T, || async {
        let q = quotas.get("team-a").await.ok()?;
        find(&q.status?.conditions, CONFLICT).is_none().then_some(())
    })
    .await
    .unwrap();
    wait_enforced(&admin, "shared", "typo", MIG, "10").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_with_a_253_character_name_is_enforced_and_does_not_hold_up_the_others() {
    let (_cp, admin, _op) = setup(&["team-a", "team-b"]).await;
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    // As long as a name may be: longer than a label value (63) and than `tessera-<name>` allows.
    let long = format!("{}z", "l".repeat(252));
    for (name, ns) in [(long.as_str(), "team-b"), ("team-a", "team-a")] {
        let spec = json!({"namespaces": [ns], "hard": {"nvidia.com/mig-1g.10gb": 2}});
        quotas.create(&PostParams::default(), &quota(name, spec)).await.unwrap();
    }
    wait_enforced(&admin, "team-a", "team-a", MIG, "2").await;
    wait_enforced(&admin, "team-b", &long, MIG, "2").await;
    let name = tessera_planner::quota::resource_quota_name(&long);
    let rq = Api::<ResourceQuota>::namespaced(admin.clone(), "team-b").get(&name).await.unwrap();
    let uid = quotas.get(&long).await.unwrap().metadata.uid.unwrap();
    assert!(name.len() <= 253 && name.starts_with("tessera-llll"), "{name}");
    assert!(rq.metadata.labels.unwrap()[tessera_planner::quota::QUOTA_LABEL].len() <= 63);
    assert_eq!(rq.metadata.annotations.unwrap()[tessera_planner::quota::QUOTA_NAME_ANNOTATION], long);
    assert_eq!(rq.metadata.owner_references.unwrap()[0].uid, uid);
    let ready = wait_condition(&quotas, &long, READY, "Enforced").await;
    assert_eq!(ready.message, "ResourceQuotas are in place");
    fills_up_to(&admin, "team-b", 2, &name).await;
    // Deleting it removes what it created (the owner reference and the stale sweep find it).
    quotas.delete(&long, &DeleteParams::default()).await.unwrap();
    let rqs: Api<ResourceQuota> = Api::namespaced(admin.clone(), "team-b");
    wait_for("long-named ResourceQuota removed", T, || async {
        rqs.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_own_resource_quota_named_like_ours_is_neither_adopted_nor_deleted_and_the_limit_holds() {
    let (_cp, admin, _op) = setup(&["team-m"]).await;
    let rqs: Api<ResourceQuota> = Api::namespaced(admin.clone(), "team-m");
    // The user's own: our name, even our label, but not written by Tessera. And one that looks
    // like a stale one of ours.
    for (name, label) in [("tessera-mine", "mine"), ("tessera-old", "old")] {
        let rq: ResourceQuota = serde_json::from_value(json!({"metadata": {"name": name,
            "labels": {"tessera.dev/quota": label}}, "spec": {"hard": {"requests.nvidia.com/gpu": "1"}}}))
        .unwrap();
        rqs.create(&PostParams::default(), &rq).await.unwrap();
    }
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    let spec = json!({"namespaces": ["team-m"], "hard": {"nvidia.com/mig-1g.10gb": 2}});
    let uid = quotas.create(&PostParams::default(), &quota("mine", spec)).await.unwrap().metadata.uid.unwrap();
    let fallback = tessera_planner::quota::fallback_resource_quota_name("mine", &uid);
    // The status is written at the end of the pass that saw the quota: by then it has acted.
    wait_for("mine: status written", T, || async { quotas.get("mine").await.ok()?.status.map(|_| ()) }).await.unwrap();
    let theirs = rqs.get("tessera-mine").await.unwrap();
    assert!(theirs.metadata.owner_references.is_none(), "not adopted");
    assert_eq!(theirs.spec.unwrap().hard.unwrap().keys().collect::<Vec<_>>(), ["requests.nvidia.com/gpu"]);
    assert!(rqs.get_opt("tessera-old").await.unwrap().is_some(), "not deleted");

    // The tenant's limit holds, under the other name, and the quota says why.
    wait_enforced_as(&admin, "team-m", &fallback, MIG, "2").await;
    fills_up_to(&admin, "team-m", 2, &fallback).await;
    let stalled = wait_condition(&quotas, "mine", STALLED, "ResourceQuotaNameTaken").await;
    assert!(stalled.message.contains("namespace team-m: ResourceQuota tessera-mine exists and is not this quota's"));
    assert!(stalled.message.contains(&format!("the share is enforced as {fallback}")), "{}", stalled.message);

    // The user removes theirs: Tessera takes its own name back and removes the stand-in.
    rqs.delete("tessera-mine", &DeleteParams::default()).await.unwrap();
    wait_for("stand-in removed", T, || async { rqs.get_opt(&fallback).await.ok()?.is_none().then_some(()) })
        .await
        .unwrap();
    wait_enforced_as(&admin, "team-m", "tessera-mine", MIG, "2").await;
    wait_condition(&quotas, "mine", READY, "Enforced").await;
    assert!(rqs.get_opt("tessera-old").await.unwrap().is_some(), "still not deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_resource_quota_write_fails_only_its_quota() {
    let (_cp, admin, _op) = setup(&["locked", "open", "retired"]).await;
    // An admission policy refuses every ResourceQuota write in `locked`.
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({"metadata": {"name": "lock-quotas"},
        "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": [{"apiGroups": [""],
            "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["resourcequotas"]}]},
        "validations": [{"expression": "object.metadata.namespace != 'locked'",
                         "message": "ResourceQuotas in locked are frozen"}]}}))
    .unwrap();
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({"metadata": {"name": "lock-quotas"},
        "spec": {"policyName": "lock-quotas", "validationActions": ["Deny"]}}))
    .unwrap();
    Api::<ValidatingAdmissionPolicy>::all(admin.clone()).create(&PostParams::default(), &policy).await.unwrap();
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(admin.clone());
    bindings.create(&PostParams::default(), &binding).await.unwrap();
    let probe: ResourceQuota = serde_json::from_value(json!({"metadata": {"name": "probe"}})).unwrap();
    let locked: Api<ResourceQuota> = Api::namespaced(admin.clone(), "locked");
    wait_for("the policy is active", T, || async {
        match locked.create(&PostParams::default(), &probe).await {
            Err(e) if e.to_string().contains("frozen") => Some(()),
            Ok(_) => locked.delete("probe", &DeleteParams::default()).await.ok().and(None),
            Err(_) => None,
        }
    })
    .await
    .unwrap();

    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    let spec = json!({"namespaces": ["open", "retired"], "hard": {"nvidia.com/mig-1g.10gb": 4}});
    quotas.create(&PostParams::default(), &quota("open", spec)).await.unwrap();
    wait_enforced(&admin, "retired", "open", MIG, "2").await;
    let spec = json!({"namespaces": ["locked"], "hard": {"nvidia.com/mig-1g.10gb": 1}});
    quotas.create(&PostParams::default(), &quota("locked", spec)).await.unwrap();
    // `open` changes while `locked`'s write keeps failing: applied, its stale one deleted, its status
    // written.
    let patch = json!({"spec": {"namespaces": ["open"]}});
    quotas.patch("open", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    wait_enforced(&admin, "open", "open", MIG, "4").await;
    let retired: Api<ResourceQuota> = Api::namespaced(admin.clone(), "retired");
    wait_for("stale ResourceQuota deleted", T, || async {
        retired.get_opt("tessera-open").await.ok()?.is_none().then_some(())
    })
    .await
    .unwrap();
    wait_for("open: status of generation 2", T, || async {
        let st = quotas.get("open").await.ok()?.status?;
        let ready = find(&st.conditions, READY)?;
        (st.observed_generation == Some(2) && ready.status == "True").then_some(())
    })
    .await
    .unwrap();
    let failed = wait_for("locked: WriteFailed", T, || async {
        let q = quotas.get("locked").await.ok()?;
        find(&q.status?.conditions, READY).filter(|c| c.reason == "WriteFailed").cloned()
    })
    .await
    .unwrap();
    assert_eq!(failed.status, "False");
    assert!(failed.message.contains("ResourceQuota tessera-locked in locked: ") && failed.message.contains("frozen"));
    wait_condition(&quotas, "locked", RECONCILING, "WriteFailed").await;

    // The policy goes: the next passes succeed and the failure clears by itself.
    bindings.delete("lock-quotas", &DeleteParams::default()).await.unwrap();
    wait_enforced(&admin, "locked", "locked", MIG, "1").await;
    wait_condition(&quotas, "locked", READY, "Enforced").await;
}

fn gpu_pod(name: &str) -> Pod {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "x",
            "resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}]}}))
    .unwrap()
}

/// A namespace created after its quota lists it (here: while the operator is down) has no
/// ResourceQuota at first, so extended resources would be unlimited there: every pod asking for
/// `nvidia.com/gpu` created at once admitted, the later 0 (or share) too late. So
/// `tessera-gpu-pods` refuses them, naming the field, namespace and quota, until the operator
/// has the namespace's ResourceQuota enforced; then no more than the share is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_in_a_namespace_created_after_its_quota_never_pass_its_share() {
    let (cp, admin, mut op) = setup(&["a"]).await;
    apply_file(&admin, "config/rbac/claim-classes.yaml").await.unwrap();
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    let q = quota("team-a", json!({"namespaces": ["a", "b"], "hard": {"nvidia.com/gpu": 4}}));
    quotas.create(&PostParams::default(), &q).await.unwrap();
    wait_enforced(&admin, "a", "team-a", "requests.nvidia.com/gpu", "2").await;
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(admin.clone(), "tessera-system");
    // `b` (not created yet) is pending; `a` no longer, once its ResourceQuota shows the limit.
    wait_for("b alone pending in the params", T, || async {
        let data = cms.get("tessera-claim-classes").await.ok()?.data?;
        (data.get("b.quota")? == "team-a" && data.get("_pending")? == "b").then_some(())
    })
    .await
    .unwrap();

    // The operator is down when `b` is created: nothing writes its ResourceQuota.
    op.stop_now();
    create_namespace(&admin, "b").await.unwrap();
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(admin.clone(), "b");
    wait_for("b's default service account", T, || async { sas.get_opt("default").await.ok()?.map(|_| ()) })
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "b");
    let create_many = |prefix: &'static str| {
        let pods = pods.clone();
        async move {
            futures::future::join_all((0..6).map(|i| {
                let pods = pods.clone();
                async move { pods.create(&PostParams::default(), &gpu_pod(&format!("{prefix}{i}"))).await }
            }))
            .await
        }
    };
    for r in create_many("early").await {
        let msg = r.expect_err("no pod asking for nvidia.com/gpu is admitted before b's limit is enforced").to_string();
        assert!(
            msg.contains("spec.containers[0].resources.requests[nvidia.com/gpu]: namespace b of TenantGpuQuota team-a")
                && msg.contains("not yet enforced; retry in a few seconds"),
            "{msg}"
        );
    }
    // Pods asking for no GPU are not held back, nor GPU pods in an enforced namespace.
    let plain: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cpu"},
        "spec": {"containers": [{"name": "c", "image": "x"}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &plain).await.unwrap();
    Api::<Pod>::namespaced(admin.clone(), "a").create(&PostParams::default(), &gpu_pod("in-a")).await.unwrap();

    // The operator back: b's share is written and enforced, then exactly the share is admitted.
    let (_op2, _) = spawn_operator(&cp, "op2").unwrap();
    wait_enforced(&admin, "b", "team-a", "requests.nvidia.com/gpu", "2").await;
    wait_for("b no longer pending", T, || async {
        let data = cms.get("tessera-claim-classes").await.ok()?.data?;
        (!data.get("_pending")?.split(' ').any(|n| n == "b")).then_some(())
    })
    .await
    .unwrap();
    let results = create_many("late").await;
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 2, "the share, never more: {results:?}");
    let gpu_pods = pods.list(&ListParams::default()).await.unwrap().items.len() - 1;
    assert_eq!(gpu_pods, 2, "no more than the share in b");
}
