//! Nodes and `GpuNode`s as the operator reads them, decoded without what it never reads.
//!
//! Every watch event and every write's response carries the whole object. `managedFields` (one
//! entry per writer: agent, operator, liveness, kubectl...) is often the larger part of it, and a
//! Node's status (conditions, capacity, images) is most of a Node. Decoding them only to drop
//! them costs much of the operator's CPU in a rollout (BENCHMARKS.md). These types skip
//! them while decoding (serde passes over unknown fields without building them), and convert
//! into the ordinary types, so the caches still hold `Node`s and `GpuNode`s.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube_core::Resource;
use serde::{Deserialize, Deserializer};
use tessera_crds::GpuNode;
use tessera_crds::gpunode::{GpuNodeSpec, GpuNodeStatus};

/// `ObjectMeta` less `managedFields`: every other field, so nothing read elsewhere is lost.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaWire {
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

/// Decodes object metadata, passing over `managedFields` without building it.
fn meta_without_managed_fields<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = MetaWire::deserialize(d)?;
    Ok(ObjectMeta {
        annotations: m.annotations,
        creation_timestamp: m.creation_timestamp,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        deletion_timestamp: m.deletion_timestamp,
        finalizers: m.finalizers,
        generate_name: m.generate_name,
        generation: m.generation,
        labels: m.labels,
        managed_fields: None,
        name: m.name,
        namespace: m.namespace,
        owner_references: m.owner_references,
        resource_version: m.resource_version,
        self_link: m.self_link,
        uid: m.uid,
    })
}

/// A `GpuNode` decoded without `managedFields`; used to watch and to write GpuNodes.
#[derive(Deserialize, Clone, Debug)]
pub struct SlimGpuNode {
    #[serde(default, deserialize_with = "meta_without_managed_fields")]
    pub metadata: ObjectMeta,
    pub spec: GpuNodeSpec,
    pub status: Option<GpuNodeStatus>,
}

impl From<SlimGpuNode> for GpuNode {
    fn from(s: SlimGpuNode) -> Self {
        GpuNode { metadata: s.metadata, spec: s.spec, status: s.status }
    }
}

/// A `Node` decoded without `managedFields` and with only the `nvidia.com/` resources of its
/// status's `allocatable` (the quotas hold those at 0 under `unlisted: Zero`: see
/// [`advertised_only`]); the rest of its status is never read here.
#[derive(Deserialize, Clone, Debug)]
pub struct SlimNode {
    #[serde(default, deserialize_with = "meta_without_managed_fields")]
    pub metadata: ObjectMeta,
    pub spec: Option<NodeSpec>,
    #[serde(default)]
    pub status: Option<SlimNodeStatus>,
}

/// A Node's status as decoded here: its `allocatable` only.
#[derive(Deserialize, Clone, Debug, Default)]
pub struct SlimNodeStatus {
    #[serde(default)]
    pub allocatable: Option<BTreeMap<String, Quantity>>,
}

impl From<SlimNode> for Node {
    fn from(s: SlimNode) -> Self {
        Node { metadata: s.metadata, spec: s.spec, status: advertised_only(s.status.and_then(|s| s.allocatable)) }
    }
}

/// The prefix of NVIDIA's extended resources (`nvidia.com/gpu`, `nvidia.com/mig-*`, and what
/// the device plugin renames for time-slicing or MPS, e.g. `nvidia.com/gpu.shared`).
pub const NVIDIA_RESOURCE_PREFIX: &str = "nvidia.com/";

/// A Node status holding only the `nvidia.com/` resources of `allocatable`; `None` when none.
pub fn advertised_only(allocatable: Option<BTreeMap<String, Quantity>>) -> Option<NodeStatus> {
    let kept: BTreeMap<String, Quantity> =
        allocatable?.into_iter().filter(|(k, _)| k.starts_with(NVIDIA_RESOURCE_PREFIX)).collect();
    (!kept.is_empty()).then(|| NodeStatus { allocatable: Some(kept), ..Default::default() })
}

/// The same resource (URL, kind) as `$full`, decoded as `$slim`.
macro_rules! same_resource {
    ($slim:ty, $full:ty) => {
        impl Resource for $slim {
            type DynamicType = ();
            type Scope = <$full as Resource>::Scope;

            fn kind(dt: &()) -> Cow<'_, str> {
                <$full>::kind(dt)
            }
            fn group(dt: &()) -> Cow<'_, str> {
                <$full>::group(dt)
            }
            fn version(dt: &()) -> Cow<'_, str> {
                <$full>::version(dt)
            }
            fn plural(dt: &()) -> Cow<'_, str> {
                <$full>::plural(dt)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

same_resource!(SlimGpuNode, GpuNode);
same_resource!(SlimNode, Node);

/// kubectl's copy of the last applied object: as large as the object, and read by nobody here.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what no controller here reads but every cached object carries: `managedFields` (often
/// the larger part of an object written by several managers) and kubectl's last-applied copy.
pub fn trim_metadata<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// A Node as the rollout reads it: name, labels, annotations and `spec.unschedulable`, and the
/// `nvidia.com/` resources it advertises (the quotas: `trimmed::advertised_only`). The rest of its
/// status (conditions, capacity, addresses, images) is most of its size and is never read.
pub fn trim_node(node: &mut Node) {
    trim_metadata(node);
    node.status = advertised_only(node.status.take().and_then(|s| s.allocatable));
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn meta_json() -> serde_json::Value {
        json!({
            "name": "n1", "namespace": "ns", "uid": "u-1", "resourceVersion": "42", "generation": 3,
            "generateName": "n", "selfLink": "/x", "creationTimestamp": "2026-01-01T00:00:00Z",
            "deletionTimestamp": "2026-01-02T00:00:00Z", "deletionGracePeriodSeconds": 30,
            "labels": {"pool": "a"}, "annotations": {"tessera.dev/cordoned-at": "2026-01-01T00:00:00Z"},
            "finalizers": ["f"],
            "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "o", "uid": "u-o"}],
            "managedFields": [{"manager": "kubectl", "operation": "Apply", "apiVersion": "v1",
                               "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {}}}}]
        })
    }

    #[test]
    fn a_slim_gpunode_is_the_gpunode_less_its_managed_fields() {
        let object = json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "metadata": meta_json(),
            "spec": {"plan": "p", "gpus": [{"index": 0, "migEnabled": true, "profiles": {"3g.40gb": 2}}]},
            "status": {"observedGeneration": 3, "gpus": [{"index": 0, "uuid": "GPU-1",
                       "product": "NVIDIA H100 80GB HBM3", "migCapable": true}],
                       "rollout": {"phase": "Draining", "plan": "p", "cordonedByUs": true}}
        });
        let mut full: GpuNode = serde_json::from_value(object.clone()).unwrap();
        assert!(full.metadata.managed_fields.is_some(), "the fixture has managed fields to drop");
        full.metadata.managed_fields = None;
        let slim: GpuNode = serde_json::from_value::<SlimGpuNode>(object).unwrap().into();
        // Compared as JSON: the generated GpuNode type has no `PartialEq`.
        assert_eq!(serde_json::to_value(&slim).unwrap(), serde_json::to_value(&full).unwrap());
        assert_eq!(slim.status.and_then(|s| s.rollout).map(|r| r.cordoned_by_us), Some(true));
    }

    #[test]
    fn a_slim_node_keeps_metadata_and_spec_and_drops_status_and_managed_fields() {
        let object = json!({
            "apiVersion": "v1", "kind": "Node", "metadata": meta_json(),
            "spec": {"unschedulable": true, "taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "capacity": {"cpu": "8"},
                       "allocatable": {"cpu": "8"}}
        });
        let mut full: Node = serde_json::from_value(object.clone()).unwrap();
        full.metadata.managed_fields = None;
        full.status = None;
        let slim: Node = serde_json::from_value::<SlimNode>(object).unwrap().into();
        assert_eq!(slim, full);
        assert_eq!(slim.spec.and_then(|s| s.unschedulable), Some(true));
    }

    /// The quotas hold every `nvidia.com/` resource a node advertises at 0 under
    /// `unlisted: Zero` (`nvidia.com/gpu.shared` of time-slicing): the cache keeps those.
    #[test]
    fn a_slim_node_keeps_the_nvidia_resources_it_advertises() {
        let object = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
            "status": {"allocatable": {"cpu": "8", "nvidia.com/gpu.shared": "16", "nvidia.com/gpu": "0"}}});
        let slim: Node = serde_json::from_value::<SlimNode>(object).unwrap().into();
        let kept = slim.status.and_then(|s| s.allocatable).unwrap_or_default();
        assert_eq!(kept.keys().collect::<Vec<_>>(), ["nvidia.com/gpu", "nvidia.com/gpu.shared"]);
    }

    #[test]
    fn slim_types_address_the_same_resources() {
        assert_eq!(SlimGpuNode::url_path(&(), None), GpuNode::url_path(&(), None));
        assert_eq!(SlimNode::url_path(&(), None), Node::url_path(&(), None));
        assert_eq!(SlimGpuNode::kind(&()), "GpuNode");
        assert_eq!(SlimNode::api_version(&()), "v1");
    }
}
