//! The bodies of Tessera's own objects as the operator applies them, built from the crds' types.
//! A server-side apply owns exactly the fields it sends, so each body sends only what its field
//! manager owns: the types skip unset optional fields, and a status is sent without a spec
//! ([`StatusApply`]; a whole typed object would carry the spec's defaults).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::Resource;
use serde::Serialize;
use tessera_crds::GpuNode;
use tessera_crds::gpunode::{GpuIntent, GpuNodeSpec, GpuNodeStatus};

/// A server-side-apply body of a `K`'s status: `apiVersion` and `kind` as the type declares
/// them, the object's name where given, and `status`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusApply<S> {
    api_version: String,
    kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<ObjectMeta>,
    status: S,
}

impl<S: Serialize> StatusApply<S> {
    /// `status` as the status of a `K`.
    pub fn of<K: Resource<DynamicType = ()>>(status: S) -> Self {
        StatusApply {
            api_version: K::api_version(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            metadata: None,
            status,
        }
    }

    /// The same body, naming the object `name` in its metadata.
    pub fn named(self, name: &str) -> Self {
        StatusApply { metadata: Some(ObjectMeta { name: Some(name.into()), ..Default::default() }), ..self }
    }
}

/// A node's intent: the layout `plan` wants for its GPUs (`spec.plan`, `spec.gpus`).
pub fn intent(node: &str, plan: String, gpus: Vec<GpuIntent>) -> GpuNode {
    GpuNode::new(node, GpuNodeSpec { plan: Some(plan), gpus })
}

/// A GpuNode status holding only `conditions`: what one field manager applies of them.
pub fn gpunode_conditions(conditions: Vec<Condition>) -> StatusApply<GpuNodeStatus> {
    StatusApply::of::<GpuNode>(GpuNodeStatus { conditions, ..Default::default() })
}

/// A condition `type_` at `status`, for `reason`, since `since` (no observed generation).
pub fn condition(type_: &str, status: &str, reason: &str, message: String, since: Time) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time: since,
        observed_generation: None,
    }
}
