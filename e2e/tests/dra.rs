//! GPUs handed out through Dynamic Resource Allocation on the real control plane: the simulated
//! NVIDIA DRA driver (`sim-dra-driver`) publishes a node's MIG devices from its agent's report,
//! the resource-claim controller makes a pod's claim from its template, kube-scheduler allocates
//! a device of the asked profile on the node that has one and binds the pod there, and the claim
//! goes when the pod goes.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaimTemplate, ResourceSlice};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tessera_crds::GpuNode;
use tessera_crds::conditions::{READY, find};
use tessera_e2e::dra::{
    self, CLAIM_REF, MIG_CLASS, SIM_DRA_LABEL, allocated_devices, device_attribute, device_names, pod_claim_name,
    profile_selector, slice_name, spawn_sim_dra_driver, wait_pod_claim_allocated, wait_slice,
};
use tessera_e2e::fixtures::{FakeGpuNode, apply_file, create_gpu_nodes, install_crds, spawn_node_agent, wait_for};
use tessera_e2e::{ControlPlane, Identity};

const T: Duration = Duration::from_secs(60);
const H100: &str = "NVIDIA H100 80GB HBM3";

async fn setup(nodes: &[&str]) -> (ControlPlane, Client) {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    install_crds(&admin).await.unwrap();
    apply_file(&admin, "config/base/namespace.yaml").await.unwrap();
    apply_file(&admin, "config/rbac/node-agent.yaml").await.unwrap();
    apply_file(&admin, "config/rbac/node-agent-fence.yaml").await.unwrap();
    let fake: Vec<FakeGpuNode> = nodes.iter().map(|n| FakeGpuNode::new(n, "NVIDIA-H100-80GB-HBM3", 1)).collect();
    create_gpu_nodes(&admin, &fake).await.unwrap();
    (cp, admin)
}

async fn opt_in(admin: &Client, node: &str, on: bool) {
    let value = if on { json!("true") } else { serde_json::Value::Null };
    let patch = json!({"metadata": {"labels": {SIM_DRA_LABEL: value}}});
    Api::<Node>::all(admin.clone()).patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

/// Writes a GpuNode's report as its agent would (for nodes whose agent the test does not run).
async fn report(admin: &Client, node: &str, gpus: serde_json::Value) {
    let api: Api<GpuNode> = Api::all(admin.clone());
    let body = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "metadata": {"name": node}, "spec": {}});
    api.patch(node, &PatchParams::apply("tessera-operator").force(), &Patch::Apply(&body)).await.unwrap();
    let body = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "status": {"gpus": gpus}});
    api.patch_status(node, &PatchParams::apply("tessera-node-agent").force(), &Patch::Apply(&body)).await.unwrap();
}

/// Has the real agent on `node` make `profiles` on GPU 0 (intent, cordon and hand-over as the
/// operator does, then uncordoned again); returns the agent's report.
async fn make_mig_devices(admin: &Client, node: &str, profiles: serde_json::Value) -> GpuNode {
    let api: Api<GpuNode> = Api::all(admin.clone());
    let nodes: Api<Node> = Api::all(admin.clone());
    let body = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "metadata": {"name": node},
                      "spec": {"plan": "test", "gpus": [{"index": 0, "migEnabled": true, "profiles": profiles}]}});
    let generation = api
        .patch(node, &PatchParams::apply("tessera-operator").force(), &Patch::Apply(&body))
        .await
        .unwrap()
        .metadata
        .generation;
    for (cordon, phase) in [(json!(true), "Applying"), (serde_json::Value::Null, "Idle")] {
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(json!({"spec": {"unschedulable": cordon}})))
            .await
            .unwrap();
        let body = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
                          "status": {"rollout": {"phase": phase, "plan": "test"}}});
        api.patch_status(node, &PatchParams::apply("tessera-operator").force(), &Patch::Apply(&body)).await.unwrap();
        if phase == "Applying" {
            wait_for(&format!("{node} applied"), T, || async {
                let st = api.get(node).await.ok()?.status?;
                let ready = find(&st.conditions, READY).is_some_and(|c| c.status == "True");
                (st.observed_generation == generation && ready).then_some(())
            })
            .await
            .unwrap();
        }
    }
    api.get(node).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_pod_gets_a_1g_10gb_device_of_the_node_that_publishes_one_and_its_claim_goes_with_it() {
    let (cp, admin) = setup(&["gpu-a", "gpu-b", "gpu-c"]).await;
    let _agent = spawn_node_agent(&cp, "gpu-a", &cp.dir.join("gpu-a.json"), "H100-80GB", &[]).await.unwrap();
    let gn = make_mig_devices(&admin, "gpu-a", json!({"1g.10gb": 2, "3g.40gb": 1})).await;
    let reported = &gn.status.as_ref().unwrap().gpus[0];
    // gpu-b publishes a whole GPU only; gpu-c has a 1g.10gb but is not opted in to the driver.
    report(
        &admin,
        "gpu-b",
        json!([{"index": 0, "uuid": "GPU-b0", "product": H100, "memoryMib": 81559,
                                     "migCapable": true, "migEnabled": false}]),
    )
    .await;
    report(
        &admin,
        "gpu-c",
        json!([{"index": 0, "uuid": "GPU-c0", "product": H100, "memoryMib": 81559,
        "migCapable": true, "migEnabled": true,
        "instances": [{"profile": "1g.10gb", "start": 0, "size": 1, "uuid": "MIG-c0"}]}]),
    )
    .await;
    opt_in(&admin, "gpu-a", true).await;
    opt_in(&admin, "gpu-b", true).await;
    let _driver = spawn_sim_dra_driver(&cp).unwrap();

    // gpu-a's slice lists exactly the MIG devices its agent made, with their UUIDs.
    let slice = wait_slice(&admin, "gpu-a", T, |s| device_names(s).len() == 3).await.unwrap();
    assert_eq!(slice.spec.driver, "gpu.nvidia.com");
    assert_eq!(slice.spec.pool.name, "gpu-a");
    for inst in &reported.instances {
        let name =
            dra::devices::mig_device_name(0, &inst.profile, if inst.profile == "1g.10gb" { 19 } else { 9 }, inst.start);
        assert_eq!(device_attribute(&slice, &name, "uuid"), inst.uuid, "{name} in {:?}", device_names(&slice));
        assert_eq!(device_attribute(&slice, &name, "profile").as_deref(), Some(inst.profile.as_str()));
        assert_eq!(device_attribute(&slice, &name, "parentUUID").as_deref(), Some(reported.uuid.as_str()));
    }
    let b = wait_slice(&admin, "gpu-b", T, |_| true).await.unwrap();
    assert_eq!(device_names(&b), ["gpu-0"]);
    let slices: Api<ResourceSlice> = Api::all(admin.clone());
    assert!(slices.get_opt(&slice_name("gpu-c")).await.unwrap().is_none(), "gpu-c is not opted in");

    // A pod asking for a 1g.10gb through a claim template.
    let ns = "team-a";
    tessera_e2e::fixtures::create_namespace(&admin, ns).await.unwrap();
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(admin.clone(), ns);
    let template = dra::claim_template(ns, "one-1g", MIG_CLASS, Some(&profile_selector("1g.10gb")), 1);
    templates.create(&PostParams::default(), &template).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    pods.create(&PostParams::default(), &dra::pod_with_claim_template(ns, "trainer", "one-1g")).await.unwrap();

    let claim = wait_pod_claim_allocated(&admin, ns, "trainer", T).await.unwrap();
    let devices = allocated_devices(&claim);
    assert_eq!(devices.len(), 1, "{devices:?}");
    let (driver, pool, device) = &devices[0];
    assert_eq!((driver.as_str(), pool.as_str()), ("gpu.nvidia.com", "gpu-a"));
    assert_eq!(device_attribute(&slice, device, "profile").as_deref(), Some("1g.10gb"), "{device}");
    let owner = &claim.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Pod", "trainer"), "made from the template for the pod");
    let pod = wait_for("trainer bound", T, || async {
        let p = pods.get("trainer").await.ok()?;
        p.spec.as_ref()?.node_name.is_some().then_some(p)
    })
    .await
    .unwrap();
    assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some("gpu-a"));
    let reserved = claim.status.as_ref().and_then(|s| s.reserved_for.clone()).unwrap_or_default();
    assert!(reserved.iter().any(|r| r.name == "trainer"), "{reserved:?}");

    // Deleting the pod frees the claim: the controller drops its finalizer and it is deleted.
    let claim_name = pod_claim_name(&pod, CLAIM_REF).unwrap();
    pods.delete("trainer", &DeleteParams::default()).await.unwrap();
    dra::wait_claim_deleted(&admin, ns, &claim_name, T).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slice_follows_the_report_across_a_driver_restart_with_a_new_generation_and_goes_when_the_node_opts_out() {
    let (cp, admin) = setup(&["gpu-a"]).await;
    let mig = |uuid: &str, profile: &str, start: i32, size: i32| {
        json!([{"index": 0, "uuid": "GPU-a0", "product": H100, "memoryMib": 81559, "migCapable": true,
                "migEnabled": true, "instances": [{"profile": profile, "start": start, "size": size, "uuid": uuid}]}])
    };
    report(&admin, "gpu-a", mig("MIG-1", "1g.10gb", 0, 1)).await;
    opt_in(&admin, "gpu-a", true).await;
    let driver = spawn_sim_dra_driver(&cp).unwrap();
    let first = wait_slice(&admin, "gpu-a", T, |_| true).await.unwrap();
    assert_eq!(device_names(&first), ["gpu-0-mig-1g10gb-19-0"]);
    let generation = first.spec.pool.generation;

    // A pass with nothing new writes nothing (the resync is 5 s).
    tokio::time::sleep(Duration::from_secs(7)).await;
    let slices: Api<ResourceSlice> = Api::all(admin.clone());
    let same = slices.get(&slice_name("gpu-a")).await.unwrap();
    assert_eq!(same.metadata.resource_version, first.metadata.resource_version, "an unchanged slice is not rewritten");

    // The report changes while the driver is down: a new driver converges from what it lists.
    drop(driver);
    report(&admin, "gpu-a", mig("MIG-2", "3g.40gb", 4, 4)).await;
    let _driver = spawn_sim_dra_driver(&cp).unwrap();
    let second = wait_slice(&admin, "gpu-a", T, |s| device_names(s) == ["gpu-0-mig-3g40gb-9-4"]).await.unwrap();
    assert_eq!(second.spec.pool.generation, generation + 1);
    assert_eq!(device_attribute(&second, "gpu-0-mig-3g40gb-9-4", "uuid").as_deref(), Some("MIG-2"));

    opt_in(&admin, "gpu-a", false).await;
    wait_for("gpu-a's slice deleted", T, || async {
        slices.get_opt(&slice_name("gpu-a")).await.ok()?.is_none().then_some(())
    })
    .await
    .unwrap();
}
