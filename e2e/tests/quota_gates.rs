//! The per-namespace quota gate policies (`config/rbac/quota-gates.yaml`, not installed yet) on
//! the real API server, with the gates, the class list and the namespace labels written as the
//! operator will write them (under the operator's identity). What the policies refuse and admit:
//! an unclassified namespace closes GPU pods and claims but not CPU pods; a tenant namespace
//! admits only what its gate allows; only the operator writes gates and the label; a tenant
//! namespace whose gate is gone refuses everything its bindings match (fails closed).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Binding, Namespace, Pod, ResourceQuota};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, CustomResourceExt};
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

/// The gate CRDs from the types, the operator's rights on them, the policies.
async fn install(admin: &Client) {
    install_crds(admin).await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for crd in [GpuQuotaGate::crd(), GpuClassList::crd()] {
        let name = crd.metadata.name.clone().unwrap();
        crds.create(&PostParams::default(), &crd).await.unwrap();
        wait_for(&format!("{name} established"), T, || async {
            let c = crds.get(&name).await.ok()?;
            c.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
        })
        .await
        .unwrap();
    }
    apply_file(admin, "config/base/namespace.yaml").await.unwrap();
    apply_file(admin, "config/rbac/operator.yaml").await.unwrap();
    let rbac = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "tessera-operator-gates"},
        "rules": [{"apiGroups": ["tessera.dev"], "resources": ["gpuquotagates", "gpuclasslists"], "verbs": ["*"]},
                  {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "patch"]}]});
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "tessera-operator-gates"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "tessera-operator-gates"},
        "subjects": [{"kind": "ServiceAccount", "name": "tessera-operator", "namespace": "tessera-system"}]});
    let apply = PatchParams::apply("e2e").force();
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(admin.clone());
    roles.patch("tessera-operator-gates", &apply, &Patch::Apply(&rbac)).await.unwrap();
    let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(admin.clone());
    bindings.patch("tessera-operator-gates", &apply, &Patch::Apply(&binding)).await.unwrap();
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

    // The label is the operator's: refused to the admin and to a tenant, set by the operator.
    let msg = label(&admin, "open", Some("none")).await.unwrap_err().to_string();
    assert!(msg.contains("metadata.labels[tessera.dev/gpu-gate]: set by the Tessera operator only"), "{msg}");
    let namespaces: Api<Namespace> = Api::all(tenant.clone());
    let smuggled: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "smuggled", "labels": {LABEL: "none"}}})).unwrap();
    assert!(
        namespaces.create(&PostParams::default(), &smuggled).await.is_err(),
        "a tenant cannot (RBAC, then the guard)"
    );
    let admins: Api<Namespace> = Api::all(admin.clone());
    let msg = admins.create(&PostParams::default(), &smuggled).await.unwrap_err().to_string();
    assert!(msg.contains("set by the Tessera operator only"), "nor can an admin: {msg}");
    label(&operator, "open", Some("none")).await.unwrap();
    let open: Api<Pod> = Api::namespaced(admin.clone(), "open");
    wait_for("GPU pods admitted where no quota claims", T, || async {
        refused(&open, &pod("gpu", mig(3))).await.is_none().then_some(())
    })
    .await
    .unwrap();

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
