//! Claims, claim templates and pods that use them, and waits on what the scheduler and the
//! resource-claim controller do with them.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use super::{device_classes, slice_name};
use crate::Error;
use crate::fixtures::{MANAGER, wait_for};

/// The name pods give their one claim (`spec.resourceClaims[0].name`) and its one request.
pub const CLAIM_REF: &str = "gpu";

/// A claim spec (`spec` of a ResourceClaim, `spec.spec` of a template): `count` devices of
/// `class`, each matching `selector` (CEL) when given.
pub fn claim_spec(class: &str, selector: Option<&str>, count: i64) -> serde_json::Value {
    let mut exactly = json!({"deviceClassName": class, "allocationMode": "ExactCount", "count": count});
    if let Some(cel) = selector {
        exactly["selectors"] = json!([{"cel": {"expression": cel}}]);
    }
    json!({"devices": {"requests": [{"name": CLAIM_REF, "exactly": exactly}]}})
}

/// A ResourceClaim in `ns` (see [`claim_spec`]).
pub fn claim(ns: &str, name: &str, class: &str, selector: Option<&str>, count: i64) -> ResourceClaim {
    serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns}, "spec": claim_spec(class, selector, count)}))
    .expect("a valid ResourceClaim")
}

/// A ResourceClaimTemplate in `ns`: each pod naming it gets its own claim of this spec.
pub fn claim_template(ns: &str, name: &str, class: &str, selector: Option<&str>, count: i64) -> ResourceClaimTemplate {
    serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ns}, "spec": {"spec": claim_spec(class, selector, count)}}))
    .expect("a valid ResourceClaimTemplate")
}

/// A pod whose one container uses the claim `claim` (shared: every pod naming it uses the same).
pub fn pod_with_claim(ns: &str, name: &str, claim: &str) -> Pod {
    pod(ns, name, json!({"name": CLAIM_REF, "resourceClaimName": claim}))
}

/// A pod whose one container uses a claim made for it from the template `template`.
pub fn pod_with_claim_template(ns: &str, name: &str, template: &str) -> Pod {
    pod(ns, name, json!({"name": CLAIM_REF, "resourceClaimTemplateName": template}))
}

/// `pod` kept to `node` (a `kubernetes.io/hostname` node selector): the scheduler still allocates
/// its claim, from that node's devices only (drain and busy checks on a chosen node).
pub fn on_node(mut pod: Pod, node: &str) -> Pod {
    if let Some(spec) = pod.spec.as_mut() {
        spec.node_selector.get_or_insert_with(Default::default).insert("kubernetes.io/hostname".into(), node.into());
    }
    pod
}

/// The ResourceQuota key limiting the devices of `class` requested through claims in a namespace.
pub fn device_quota_key(class: &str) -> String {
    format!("{class}.deviceclass.resource.k8s.io/devices")
}

/// Waits until the claim `name` is gone (its finalizer removed by the resource-claim controller).
pub async fn wait_claim_deleted(client: &Client, ns: &str, name: &str, timeout: Duration) -> Result<(), Error> {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), ns);
    wait_for(&format!("claim {ns}/{name} deleted"), timeout, || async {
        claims.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await
}

fn pod(ns: &str, name: &str, claim_ref: serde_json::Value) -> Pod {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {"resourceClaims": [claim_ref],
                 "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": CLAIM_REF}]}}]}}))
    .expect("a valid Pod")
}

/// Server-side applies NVIDIA's DeviceClasses.
pub async fn apply_device_classes(client: &Client) -> Result<(), Error> {
    let api: Api<DeviceClass> = Api::all(client.clone());
    for class in device_classes() {
        let name = class.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&class)).await?;
    }
    Ok(())
}

/// The claim a pod's `spec.resourceClaims[name]` resolved to (the controller's generated name
/// for a template, from `status.resourceClaimStatuses`; the named claim otherwise).
pub fn pod_claim_name(pod: &Pod, name: &str) -> Option<String> {
    let spec = pod.spec.as_ref()?.resource_claims.as_ref()?.iter().find(|c| c.name == name)?;
    if let Some(claim) = &spec.resource_claim_name {
        return Some(claim.clone());
    }
    let statuses = pod.status.as_ref()?.resource_claim_statuses.as_ref()?;
    statuses.iter().find(|s| s.name == name)?.resource_claim_name.clone()
}

/// The devices allocated to a claim: (driver, pool, device) per result.
pub fn allocated_devices(claim: &ResourceClaim) -> Vec<(String, String, String)> {
    let results = claim.status.as_ref().and_then(|s| s.allocation.as_ref()).and_then(|a| a.devices.as_ref());
    results
        .and_then(|d| d.results.as_ref())
        .map(|r| r.iter().map(|r| (r.driver.clone(), r.pool.clone(), r.device.clone())).collect())
        .unwrap_or_default()
}

/// Waits until the pod's claim `CLAIM_REF` exists and is allocated; returns the claim.
pub async fn wait_pod_claim_allocated(
    client: &Client,
    ns: &str,
    pod: &str,
    timeout: Duration,
) -> Result<ResourceClaim, Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), ns);
    wait_for(&format!("the claim of pod {ns}/{pod} allocated"), timeout, || async {
        let name = pod_claim_name(&pods.get(pod).await.ok()?, CLAIM_REF)?;
        let claim = claims.get(&name).await.ok()?;
        (!allocated_devices(&claim).is_empty()).then_some(claim)
    })
    .await
}

/// Waits until the node's slice satisfies `check`; returns it.
pub async fn wait_slice(
    client: &Client,
    node: &str,
    timeout: Duration,
    check: impl Fn(&ResourceSlice) -> bool,
) -> Result<ResourceSlice, Error> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let name = slice_name(node);
    let check = &check;
    wait_for(&format!("ResourceSlice {name}"), timeout, || {
        let (api, name) = (api.clone(), name.clone());
        async move { api.get_opt(&name).await.ok().flatten().filter(check) }
    })
    .await
}

/// The names of the devices a slice lists.
pub fn device_names(slice: &ResourceSlice) -> Vec<String> {
    slice.spec.devices.iter().flatten().map(|d| d.name.clone()).collect()
}

/// A string attribute of a published device (`profile`, `uuid`, `parentUUID`, ...).
pub fn device_attribute(slice: &ResourceSlice, device: &str, attribute: &str) -> Option<String> {
    let d = slice.spec.devices.iter().flatten().find(|d| d.name == device)?;
    d.attributes.as_ref()?.get(attribute)?.string.clone()
}

/// A ReplicaSet of `replicas` copies of `pod` (its spec and labels; `app=<name>` selects them),
/// so that an evicted pod comes back with a new UID and the drain's controller checks pass.
pub fn replica_set(ns: &str, name: &str, replicas: i32, pod: &Pod) -> k8s_openapi::api::apps::v1::ReplicaSet {
    let mut labels = pod.metadata.labels.clone().unwrap_or_default();
    labels.insert("app".into(), name.into());
    serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": labels}, "spec": pod.spec}}}))
    .expect("a valid ReplicaSet")
}

/// The pod's `PodScheduled` condition message and its events' messages (the scheduler's
/// refusals: `FailedScheduling`, a refused binding), joined; empty where none can be read.
pub async fn scheduling_messages(admin: &Client, ns: &str, pod: &str) -> String {
    let mut out = Vec::new();
    if let Ok(p) = Api::<Pod>::namespaced(admin.clone(), ns).get(pod).await {
        let conditions = p.status.and_then(|s| s.conditions).unwrap_or_default();
        out.extend(conditions.into_iter().filter(|c| c.type_ == "PodScheduled").filter_map(|c| c.message));
    }
    let events: Api<Event> = Api::namespaced(admin.clone(), ns);
    let lp = ListParams::default().fields(&format!("involvedObject.name={pod}"));
    if let Ok(list) = events.list(&lp).await {
        out.extend(list.items.into_iter().filter_map(|e| e.message));
    }
    out.join("\n")
}
