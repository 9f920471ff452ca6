//! The per-namespace quota gate policies (`config/rbac/quota-gates.yaml`, not installed yet) on
//! the real API server, with the gates, the class list and the namespace labels written as the
//! operator will write them (under the operator's identity). What the policies refuse and admit:
//! an unclassified namespace closes GPU pods and claims but not CPU pods; a tenant namespace
//! admits only what its gate allows; only the operator writes gates and the label; a tenant
//! namespace whose gate is gone refuses everything its bindings match (fails closed).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Binding, Namespace, Pod, ResourceQuota};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tessera_crds::gate::{GpuClassList, GpuQuotaGate};
use tessera_e2e::fixtures::{apply_file, create_namespace, install_crds, wait_for};
use tessera_e2e::{ControlPlane, Identity};

const T: Duration = Duration::from_secs(60);
const LABEL: &str = "tessera.dev/gpu-gate";

fn pod(name: &str, limits: Value) -> Pod {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}]}}))
    .unwrap()
}

fn mig(n: i64) -> Value {
    json!({"nvidia.com/mig-1g.10gb": n.to_string()})
}

fn claim(name: &str, class: &str) -> ResourceClaim {
    serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": class}}]}}}))
    .unwrap()
}

fn class(name: &str, expr: &str) -> DeviceClass {
    serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expr}}]}}))
    .unwrap()
}

/// The refusal's message, or `None` when admitted.
async fn refused<K>(api: &Api<K>, object: &K) -> Option<String>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.create(&PostParams::default(), object).await.err().map(|e| e.to_string())
}

/// The CRDs (the gate's among them), the operator's rights on gates, the policies.
async fn install(admin: &Client) {
    install_crds(admin).await.unwrap();
    apply_file(admin, "config/base/namespace.yaml").await.unwrap();
    apply_file(admin, "config/rbac/operator.yaml").await.unwrap();
    apply_file(admin, "config/rbac/quota-gates.yaml").await.unwrap();
}

fn gate(spec: Value) -> GpuQuotaGate {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuQuotaGate",
        "metadata": {"name": "gpu"}, "spec": spec}))
    .unwrap()
}

async fn label(client: &Client, ns: &str, value: Option<&str>) -> Result<Namespace, kube::Error> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let patch = json!({"metadata": {"labels": {LABEL: value}}});
    namespaces.patch(ns, &PatchParams::default(), &Patch::Merge(&patch)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gates_admit_within_them_and_only_the_operator_writes_them() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    let operator = cp.client(Identity::Operator).await.unwrap();
    let tenant = cp.client(Identity::TenantA).await.unwrap();
    install(&admin).await;
    for ns in ["fresh", "open", "team-a"] {
        create_namespace(&admin, ns).await.unwrap();
    }
    let classes: Api<DeviceClass> = Api::all(admin.clone());
    for (name, expr) in [
        ("mig.nvidia.com", "device.driver == 'gpu.nvidia.com'"),
        ("fpga.example.com", "device.driver == 'fpga.example.com'"),
        ("mig-1g.10gb.tessera.dev", "device.driver == 'gpu.nvidia.com'"),
        ("mig-2g.20gb.tessera.dev", "device.driver == 'gpu.nvidia.com'"),
    ] {
        classes.create(&PostParams::default(), &class(name, expr)).await.unwrap();
    }

    // An unclassified namespace: GPU pods and claims refused (once the policy is loaded), CPU pods admitted.
    let fresh: Api<Pod> = Api::namespaced(admin.clone(), "fresh");
    let mut n = 0;
    let msg = wait_for("the unclassified policy in force", T, || {
        n += 1;
        let (fresh, name) = (fresh.clone(), format!("gpu-{n}"));
        async move { refused(&fresh, &pod(&name, mig(1))).await }
    })
    .await
    .unwrap();
    assert!(msg.contains("which Tessera has not classified yet (no tessera.dev/gpu-gate label)"), "{msg}");
    assert_eq!(refused(&fresh, &pod("cpu", json!({"cpu": "1"}))).await, None, "a CPU pod is admitted");
    let fresh_claims: Api<ResourceClaim> = Api::namespaced(admin.clone(), "fresh");
    let msg = refused(&fresh_claims, &claim("c", "fpga.example.com")).await.expect("claims wait too");
    assert!(msg.contains("claims wait until the operator"), "{msg}");

    // The guard in force (policies load one by one): an admin's gate write is refused.
    let mut n = 0;
    wait_for("the guard in force", T, || {
        n += 1;
        let (gates, name) = (Api::<GpuQuotaGate>::namespaced(admin.clone(), "fresh"), format!("probe-{n}"));
        async move {
            let mut probe = gate(json!({"quota": "x", "state": "Closed", "reason": "probe"}));
            probe.metadata.name = Some(name);
            refused(&gates, &probe).await.filter(|m| m.contains("written by the Tessera operator only"))
        }
    })
    .await
    .unwrap();
    // The label is the operator's: refused to the admin and to a tenant, set by the operator.
    let msg = label(&admin, "open", Some("open")).await.unwrap_err().to_string();
    assert!(msg.contains("metadata.labels[tessera.dev/gpu-gate]: set by the Tessera operator only"), "{msg}");
    let namespaces: Api<Namespace> = Api::all(tenant.clone());
    let smuggled: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "smuggled", "labels": {LABEL: "open"}}})).unwrap();
    assert!(
        namespaces.create(&PostParams::default(), &smuggled).await.is_err(),
        "a tenant cannot (RBAC, then the guard)"
    );
    let admins: Api<Namespace> = Api::all(admin.clone());
    let msg = admins.create(&PostParams::default(), &smuggled).await.unwrap_err().to_string();
    assert!(msg.contains("set by the Tessera operator only"), "nor can an admin: {msg}");
    // Nor through the namespace's status or finalize subresources: refused by the guard, or
    // (where the API server drops metadata changes there) the label not set.
    let unlabelled = || async { admins.get("open").await.unwrap().labels().get(LABEL).cloned() };
    let status = json!({"metadata": {"labels": {LABEL: "open"}}});
    match admins.patch_status("open", &PatchParams::default(), &Patch::Merge(&status)).await {
        Err(e) => assert!(e.to_string().contains("set by the Tessera operator only"), "namespaces/status: {e}"),
        Ok(_) => assert_eq!(unlabelled().await, None, "namespaces/status set the label"),
    }
    let mut fin = admins.get("open").await.unwrap();
    fin.labels_mut().insert(LABEL.into(), "open".into());
    let req = http::Request::put("/api/v1/namespaces/open/finalize")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&fin).unwrap())
        .unwrap();
    match admin.request_text(req).await {
        Err(e) => assert!(e.to_string().contains("set by the Tessera operator only"), "namespaces/finalize: {e}"),
        Ok(_) => assert_eq!(unlabelled().await, None, "namespaces/finalize set the label"),
    }
    label(&operator, "open", Some("open")).await.unwrap();
    let open: Api<Pod> = Api::namespaced(admin.clone(), "open");
    wait_for("GPU pods admitted where no quota claims", T, || async {
        refused(&open, &pod("gpu", mig(3))).await.is_none().then_some(())
    })
    .await
    .unwrap();
    // Closed (no quota claims it, not on the open list): GPU pods refused, saying why; CPU pods admitted.
    label(&operator, "fresh", Some("closed")).await.unwrap();
    let mut n = 0;
    let msg = wait_for("the closed label seen", T, || {
        n += 1;
        let (fresh, name) = (fresh.clone(), format!("closed-{n}"));
        async move { refused(&fresh, &pod(&name, mig(1))).await.filter(|m| !m.contains("not classified")) }
    })
    .await
    .unwrap();
    assert!(msg.contains("which no TenantGpuQuota names and the operator does not keep open"), "{msg}");
    assert_eq!(refused(&fresh, &pod("cpu-2", json!({"cpu": "1"}))).await, None, "a CPU pod is admitted");

    // A tenant namespace: class list, gate, ResourceQuota, then the label.
    let lists: Api<GpuClassList> = Api::all(operator.clone());
    let list: GpuClassList =
        serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuClassList",
        "metadata": {"name": "tessera"},
        "spec": {"open": ["fpga.example.com"], "tessera": ["mig-1g.10gb.tessera.dev", "mig-2g.20gb.tessera.dev"]}}))
        .unwrap();
    lists.create(&PostParams::default(), &list).await.unwrap();
    let gates: Api<GpuQuotaGate> = Api::namespaced(operator.clone(), "team-a");
    let spec = json!({"quota": "team-a", "state": "Enforced", "reason": "the share of TenantGpuQuota team-a is enforced",
        "classes": ["mig-1g.10gb.tessera.dev"], "limited": ["nvidia.com/mig-1g.10gb"], "blockedPods": ["early"]});
    gates.create(&PostParams::default(), &gate(spec)).await.unwrap();
    let rqs: Api<ResourceQuota> = Api::namespaced(admin.clone(), "team-a");
    let rq: ResourceQuota = serde_json::from_value(json!({"metadata": {"name": "tessera-team-a"},
        "spec": {"hard": {"requests.nvidia.com/mig-1g.10gb": "2"}}}))
    .unwrap();
    rqs.create(&PostParams::default(), &rq).await.unwrap();
    wait_for("the ResourceQuota in force", T, || async { rqs.get("tessera-team-a").await.ok()?.status?.hard })
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "team-a");
    // Made before the namespace was a tenant's (still unclassified: a CPU pod; the gate names it).
    pods.create(&PostParams::default(), &pod("early", json!({"cpu": "1"}))).await.unwrap();
    label(&operator, "team-a", Some("tenant")).await.unwrap();

    // Tenants cannot write gates (no role grants it; the guard refuses even a wildcard role).
    let tenant_gates: Api<GpuQuotaGate> = Api::namespaced(tenant.clone(), "team-a");
    let msg = tenant_gates
        .patch("gpu", &PatchParams::default(), &Patch::Merge(json!({"spec": {"limited": ["nvidia.com/gpu"]}})))
        .await
        .unwrap_err()
        .to_string();
    assert!(msg.contains("forbidden"), "{msg}");
    let admin_gates: Api<GpuQuotaGate> = Api::namespaced(admin.clone(), "team-a");
    let msg = admin_gates
        .patch("gpu", &PatchParams::default(), &Patch::Merge(json!({"spec": {"limited": ["nvidia.com/gpu"]}})))
        .await
        .unwrap_err()
        .to_string();
    assert!(msg.contains("gpuquotagates are written by the Tessera operator only"), "{msg}");

    // The policies see the label once their namespace cache has it: until then the namespace is
    // unclassified and refused with that cause.
    let msg = wait_for("the gate in force", T, || async {
        refused(&pods, &pod("whole", json!({"nvidia.com/gpu": "1"}))).await.filter(|m| !m.contains("not classified"))
    })
    .await
    .unwrap();
    assert!(msg.contains("no ResourceQuota limits that GPU resource here"), "{msg}");
    assert_eq!(refused(&pods, &pod("one", mig(1))).await, None);
    assert_eq!(refused(&pods, &pod("two", mig(1))).await, None);
    let msg = refused(&pods, &pod("three", mig(1))).await.expect("past the share");
    assert!(msg.contains("exceeded quota: tessera-team-a"), "the ResourceQuota counts: {msg}");

    let claims: Api<ResourceClaim> = Api::namespaced(admin.clone(), "team-a");
    let msg = refused(&claims, &claim("nvidia", "mig.nvidia.com")).await.expect("NVIDIA's class is closed");
    assert!(msg.contains("class mig.nvidia.com of resourceclaims nvidia is closed in namespace team-a"), "{msg}");
    assert_eq!(refused(&claims, &claim("fpga", "fpga.example.com")).await, None, "a class off GPUs is open");
    assert_eq!(refused(&claims, &claim("ours", "mig-1g.10gb.tessera.dev")).await, None, "a granted class of ours");
    let msg = refused(&claims, &claim("other", "mig-2g.20gb.tessera.dev")).await.expect("not granted here");
    assert!(msg.contains("the quota does not grant that profile here"), "{msg}");
    classes.create(&PostParams::default(), &class("brand-new.example.com", "true")).await.unwrap();
    let msg = refused(&claims, &claim("new", "brand-new.example.com")).await.expect("a new class is closed at once");
    assert!(msg.contains("class brand-new.example.com"), "{msg}");

    // A blocked pod is refused binding, another bound.
    let bind = |name: &str| -> Binding {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}}))
        .unwrap()
    };
    let data = |b: &Binding| serde_json::to_vec(b).unwrap();
    let post = |name: &'static str| {
        let admin = admin.clone();
        async move {
            let req = http::Request::post(format!("/api/v1/namespaces/team-a/pods/{name}/binding"))
                .header("content-type", "application/json")
                .body(data(&bind(name)))
                .unwrap();
            admin.request_text(req).await.err().map(|e| e.to_string())
        }
    };
    let msg = post("early").await.expect("the gate names it");
    assert!(msg.contains("pod early of namespace team-a (TenantGpuQuota team-a) may not be bound"), "{msg}");
    assert_eq!(post("one").await, None);

    // The gate gone while the namespace is a tenant's: everything the gate bindings match is
    // refused there, CPU pods too (fails closed), until a gate is written again.
    Api::<GpuQuotaGate>::namespaced(admin.clone(), "team-a").delete("gpu", &Default::default()).await.unwrap();
    let mut n = 0;
    let msg = wait_for("the missing gate seen", T, || {
        n += 1;
        let (pods, name) = (pods.clone(), format!("cpu-{n}"));
        async move { refused(&pods, &pod(&name, json!({"cpu": "1"}))).await }
    })
    .await
    .unwrap();
    assert!(msg.contains("no params found for policy binding with `Deny` parameterNotFoundAction"), "{msg}");
}

/// A gated GPU pod (kube-scheduler waits for its scheduling gates to go).
fn gated(name: &str) -> Pod {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"schedulingGates": [{"name": "example.com/wait"}],
            "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}))
    .unwrap()
}

/// The operator in gates mode, end to end with kube-scheduler and kwok: twenty gated GPU pods made
/// in an open namespace, then a quota with a share of 2. The namespace goes from `open` to
/// `joining`; every scheduling gate is removed as soon as it is `joining`, so the scheduler tries
/// them while the limits come into force (ResourceQuota, gate with eighteen pods blocked, then
/// `tenant`); exactly two are bound at every poll; one of them deleted, exactly one more is. No
/// clock decides which: the first two made go first. A namespace a tenant makes for itself (not
/// on the open list) is closed to GPU pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_twenty_gpu_pods_made_before_joining_exactly_the_share_is_bound() {
    use tessera_e2e::fixtures::{FakeGpuNode, create_gpu_nodes, spawn_operator_with};
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    install(&admin).await;
    create_gpu_nodes(&admin, &[FakeGpuNode::new("n1", "NVIDIA-H100-80GB-HBM3", 8).resource("nvidia.com/gpu", 8)])
        .await
        .unwrap();
    create_namespace(&admin, "team-a").await.unwrap();
    let (_op, _) = spawn_operator_with(
        &cp,
        "op",
        &[("TESSERA_QUOTA_ADMISSION", "gates"), ("TESSERA_GPU_OPEN_NAMESPACES", "kube-system,team-a")],
    )
    .unwrap();
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let label_is = |want: Option<&'static str>| {
        let namespaces = namespaces.clone();
        async move {
            wait_for(&format!("team-a labelled {want:?}"), T, || async {
                let ns = namespaces.get("team-a").await.ok()?;
                (ns.labels().get(LABEL).map(String::as_str) == want).then_some(())
            })
            .await
            .unwrap()
        }
    };
    label_is(Some("open")).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "team-a");
    for i in 0..20 {
        // One second apart at most matters not: the order is by creation time, then name.
        pods.create(&PostParams::default(), &gated(&format!("p{i:02}"))).await.unwrap();
    }
    let quotas: Api<tessera_crds::TenantGpuQuota> = Api::all(admin.clone());
    let quota: tessera_crds::TenantGpuQuota = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1",
        "kind": "TenantGpuQuota", "metadata": {"name": "team-a"},
        "spec": {"namespaces": ["team-a"], "hard": {"nvidia.com/gpu": 2}}}))
    .unwrap();
    quotas.create(&PostParams::default(), &quota).await.unwrap();
    label_is(Some("joining")).await;
    // The scheduler may bind them from now on: only the gate (missing, then blocking) stops it.
    let ungate = json!({"spec": {"schedulingGates": null}});
    for i in 0..20 {
        pods.patch(&format!("p{i:02}"), &PatchParams::default(), &Patch::Merge(&ungate)).await.unwrap();
    }
    let bound = || {
        let pods = pods.clone();
        async move {
            let list = pods.list(&Default::default()).await.unwrap();
            list.items
                .iter()
                .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
                .map(|p| p.name_any())
                .collect::<Vec<_>>()
        }
    };
    wait_for("team-a labelled tenant, at most the share bound meanwhile", T, || async {
        let b = bound().await;
        assert!(b.len() <= 2, "more than the share bound while joining: {b:?}");
        let ns = namespaces.get("team-a").await.ok()?;
        (ns.labels().get(LABEL).map(String::as_str) == Some("tenant")).then_some(())
    })
    .await
    .unwrap();
    let gates: Api<GpuQuotaGate> = Api::namespaced(admin.clone(), "team-a");
    let gate = gates.get("gpu").await.unwrap();
    assert_eq!(gate.spec.blocked_pods.len(), 18, "{:?}", gate.spec);
    assert_eq!(gate.spec.over, vec!["requests.nvidia.com/gpu".to_string()]);
    let rq = Api::<ResourceQuota>::namespaced(admin.clone(), "team-a").get("tessera-team-a").await.unwrap();
    assert!(rq.finalizers().iter().any(|f| f == "tessera.dev/in-force"), "held");
    // A new GPU pod is refused (the ResourceQuota counts all twenty).
    assert!(refused(&pods, &pod("late", json!({"nvidia.com/gpu": "1"}))).await.is_some());

    // Two bound, never more, at every poll for a while (the scheduler retries the rest).
    let mut seen_two = 0;
    for _ in 0..40 {
        let b = bound().await;
        assert!(b.len() <= 2, "more than the share bound: {b:?}");
        if b.len() == 2 {
            seen_two += 1;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(seen_two > 20, "the share was bound");
    let first = bound().await;
    assert_eq!(first, vec!["p00".to_string(), "p01".to_string()], "the first made go first");
    pods.delete("p00", &Default::default()).await.unwrap();
    wait_for("one more bound", T, || async {
        let b = bound().await;
        assert!(b.len() <= 2, "more than the share bound: {b:?}");
        (b.len() == 2 && !b.contains(&"p00".to_string())).then_some(())
    })
    .await
    .unwrap();
    for _ in 0..12 {
        let b = bound().await;
        assert!(b.len() <= 2, "more than the share bound: {b:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // A namespace made by someone allowed to (no quota names it, not on the open list): closed.
    create_namespace(&admin, "made-by-a-tenant").await.unwrap();
    let theirs: Api<Pod> = Api::namespaced(admin.clone(), "made-by-a-tenant");
    wait_for("made-by-a-tenant labelled closed", T, || async {
        let ns = namespaces.get("made-by-a-tenant").await.ok()?;
        (ns.labels().get(LABEL).map(String::as_str) == Some("closed")).then_some(())
    })
    .await
    .unwrap();
    let mut n = 0;
    let msg = wait_for("a GPU pod refused there", T, || {
        n += 1;
        let (theirs, name) = (theirs.clone(), format!("gpu-{n}"));
        async move {
            refused(&theirs, &pod(&name, json!({"nvidia.com/gpu": "1"})))
                .await
                .filter(|m| m.contains("does not keep open"))
        }
    })
    .await
    .unwrap();
    assert!(msg.contains("made-by-a-tenant"), "{msg}");
}

/// A quota selecting namespaces by label follows them: a namespace made with the label joins
/// (labelled tenant, its ResourceQuota in force with the whole share), a second one takes half
/// the share (Even split), and one relabelled away leaves the quota (labelled closed, its
/// ResourceQuota let go) and the other takes the whole share again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_by_label_picks_up_new_namespaces_and_lets_go_of_relabelled_ones() {
    use tessera_e2e::fixtures::spawn_operator_with;
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    install(&admin).await;
    let (_op, _) = spawn_operator_with(&cp, "op", &[("TESSERA_QUOTA_ADMISSION", "gates")]).unwrap();
    let quotas: Api<tessera_crds::TenantGpuQuota> = Api::all(admin.clone());
    let quota: tessera_crds::TenantGpuQuota = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1",
        "kind": "TenantGpuQuota", "metadata": {"name": "team-b"},
        "spec": {"namespaceSelector": {"matchLabels": {"example.com/team": "b"}}, "hard": {"nvidia.com/gpu": 4}}}))
    .unwrap();
    quotas.create(&PostParams::default(), &quota).await.unwrap();
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let make = |name: &'static str| {
        let namespaces = namespaces.clone();
        async move {
            let ns: Namespace =
                serde_json::from_value(json!({"metadata": {"name": name, "labels": {"example.com/team": "b"}}}))
                    .unwrap();
            namespaces.create(&PostParams::default(), &ns).await.unwrap();
        }
    };
    // The share each namespace's ResourceQuota enforces, once the namespace is a tenant's.
    let enforced = |ns: &'static str, want: &'static str| {
        let (admin, namespaces) = (admin.clone(), namespaces.clone());
        async move {
            wait_for(&format!("{ns} a tenant's with a share of {want}"), T, || async {
                let n = namespaces.get(ns).await.ok()?;
                (n.labels().get(LABEL).map(String::as_str) == Some("tenant")).then_some(())?;
                let rq = Api::<ResourceQuota>::namespaced(admin.clone(), ns).get("tessera-team-b").await.ok()?;
                let hard = rq.status?.hard?;
                (hard.get("requests.nvidia.com/gpu").map(|q| q.0.as_str()) == Some(want)).then_some(())
            })
            .await
            .unwrap()
        }
    };
    make("b-one").await;
    enforced("b-one", "4").await;
    make("b-two").await;
    enforced("b-two", "2").await;
    enforced("b-one", "2").await;
    // Relabelled away: it leaves the quota, closed (not on the open list); b-one takes it all.
    let away = json!({"metadata": {"labels": {"example.com/team": "c"}}});
    namespaces.patch("b-two", &PatchParams::default(), &Patch::Merge(&away)).await.unwrap();
    enforced("b-one", "4").await;
    wait_for("b-two closed and its ResourceQuota gone", T, || async {
        let n = namespaces.get("b-two").await.ok()?;
        (n.labels().get(LABEL).map(String::as_str) == Some("closed")).then_some(())?;
        let rqs = Api::<ResourceQuota>::namespaced(admin.clone(), "b-two");
        rqs.get_opt("tessera-team-b").await.ok()?.is_none().then_some(())?;
        let gates = Api::<GpuQuotaGate>::namespaced(admin.clone(), "b-two");
        gates.get_opt("gpu").await.ok()?.is_none().then_some(())
    })
    .await
    .unwrap();

    // ClaimPolicyBound checks the gate policies as shipped: True; a binding edited to Warn: False, named.
    let bound = |status: &'static str| {
        let quotas = quotas.clone();
        async move {
            wait_for(&format!("ClaimPolicyBound={status} on team-b"), T, || async {
                let st = quotas.get("team-b").await.ok()?.status?;
                st.conditions.into_iter().find(|c| c.type_ == "ClaimPolicyBound" && c.status == status)
            })
            .await
            .unwrap()
        }
    };
    let ok = bound("True").await;
    assert_eq!(ok.reason, "Bound", "{ok:?}");
    let bindings: Api<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding> =
        Api::all(admin.clone());
    let warn = json!({"spec": {"validationActions": ["Warn"]}});
    bindings.patch("tessera-gpu-gate-bindings", &PatchParams::default(), &Patch::Merge(&warn)).await.unwrap();
    let broken = bound("False").await;
    assert_eq!(broken.reason, "PolicyNotEnforcing", "{broken:?}");
    assert!(
        broken.message.contains("ValidatingAdmissionPolicyBinding tessera-gpu-gate-bindings is not as shipped"),
        "{}",
        broken.message
    );
}
