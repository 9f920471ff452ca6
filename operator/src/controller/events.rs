//! What a pass tells people beyond the objects' status: Kubernetes Events on the plans and the
//! Nodes, and why each draining node's drain waits.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector;
use kube::{Resource, ResourceExt};
use tessera_crds::GpuPartitionPlan;
use tessera_planner::events::NodeEvent;
use tracing::{debug, warn};

use super::{Context, MANAGER};
use crate::Error;

/// How a repeated Event (same object, reason and type) is published. Every Event goes through
/// [`Context::publish`], and so through the writer.
#[derive(Clone, Copy)]
pub(super) enum Repeats {
    /// Folded into one series by kube's Recorder (its count and last time move on, its first
    /// note stays): for a warning repeated every pass while it holds, such as a blocked eviction.
    Folded,
    /// A new Event every time: for each pass's aggregate, whose note names that wave's nodes and
    /// would be lost in a series that keeps the first.
    EachNew,
}

impl Context {
    /// One Event per plan, reason and type for this pass (see `events`); warnings also on each
    /// Node. A plan deleted meanwhile gets none.
    pub(super) async fn publish_events(&self, reached: Vec<NodeEvent>, plans: &[GpuPartitionPlan]) {
        for e in reached.iter().filter(|e| e.warning) {
            self.event_on_node(&e.node, e.reason, &e.message, true).await;
        }
        for e in tessera_planner::events::aggregate(reached) {
            if let Some(p) = plans.iter().find(|p| p.metadata.name.as_deref() == Some(e.plan.as_str())) {
                self.publish(&p.object_ref(&()), e.reason, &e.note, e.warning, Repeats::EachNew).await;
            }
        }
    }

    /// One Event on `reference`, repeated as `repeats` says; a failure to publish is only logged.
    pub(super) async fn publish(
        &self,
        reference: &ObjectReference,
        reason: &str,
        note: &str,
        warning: bool,
        repeats: Repeats,
    ) {
        match repeats {
            Repeats::Folded => self.publish_folded(reference, reason, note, warning).await,
            Repeats::EachNew => self.publish_new(reference, reason, note, warning).await,
        }
    }

    /// [`Repeats::EachNew`]: an Event of its own, named by the time.
    async fn publish_new(&self, reference: &ObjectReference, reason: &str, note: &str, warning: bool) {
        use k8s_openapi::api::events::v1::Event as K8sEvent;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        let now = k8s_openapi::jiff::Timestamp::now();
        let namespace = reference.namespace.clone().unwrap_or_else(|| "default".into());
        let name = reference.name.clone().unwrap_or_else(|| MANAGER.into());
        let event = K8sEvent {
            action: Some("Rollout".into()),
            reason: Some(reason.into()),
            note: Some(note.chars().take(tessera_planner::events::NOTE_LIMIT).collect()),
            event_time: Some(MicroTime(now)),
            regarding: Some(reference.clone()),
            metadata: kube::api::ObjectMeta {
                name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            reporting_controller: Some(MANAGER.into()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(if warning { "Warning" } else { "Normal" }.into()),
            ..Default::default()
        };
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        let created = async { api.create(&PostParams::default(), &event).await.map(drop).map_err(Error::from) };
        published(self.writer().guarded(created).await);
    }

    /// Records why each draining node's drain waits (its blockers, then the refused evictions)
    /// in its rollout message, which the plan's status and `kubectl tessera status` show, with an
    /// `EvictionBlocked` Event on the Node and the plan when it changes (see `drain::records`).
    pub(super) async fn record_drain_messages(
        &self,
        found: &BTreeMap<String, Vec<String>>,
        refused: &BTreeMap<String, Vec<String>>,
    ) -> Vec<(String, String)> {
        let current = |node: &str| {
            let cached = self.caches.gpunodes.get(&reflector::ObjectRef::new(node));
            cached.as_ref().and_then(|g| g.status.as_ref()?.rollout.clone())
        };
        let mut errors = Vec::new();
        for (node, r) in tessera_planner::drain::records(found, refused, current) {
            if !r.message.is_empty() {
                self.event_on_node(&node, "EvictionBlocked", &r.message, true).await;
                if let Some(plan) =
                    r.plan.as_deref().and_then(|p| self.caches.plans.state().into_iter().find(|x| x.name_any() == p))
                {
                    let note = format!("{node}: {}", r.message);
                    self.publish(&plan.object_ref(&()), "EvictionBlocked", &note, true, Repeats::Folded).await;
                }
            }
            if let Err(e) = self.write_rollout(&node, Some(&r)).await {
                self.metrics.error(e.kind());
                errors.push((node, e.to_string()));
            }
        }
        errors
    }

    /// An Event on the Node named `node` (folded: a Node's warnings repeat pass after pass).
    async fn event_on_node(&self, node: &str, reason: &str, message: &str, warning: bool) {
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.into()),
            uid: Some(node.into()),
            ..Default::default()
        };
        self.publish(&reference, reason, message, warning, Repeats::Folded).await;
    }

    /// [`Repeats::Folded`]: through kube's Recorder.
    async fn publish_folded(&self, reference: &ObjectReference, reason: &str, message: &str, warning: bool) {
        let ev = Event {
            type_: if warning { EventType::Warning } else { EventType::Normal },
            reason: reason.into(),
            note: Some(message.chars().take(1000).collect()),
            action: "Rollout".into(),
            secondary: None,
        };
        let recorded = async { self.recorder.publish(&ev, reference).await.map_err(Error::from) };
        published(self.writer().guarded(recorded).await);
    }
}

/// Events are writes too, so a replica whose tenure may have ended publishes none (through the
/// writer, as every write); a failure to publish is only logged.
fn published(result: Result<(), Error>) {
    match result {
        Ok(()) => {}
        Err(Error::NotLeader) => debug!("event not published: the leader lease may have passed"),
        Err(e) => warn!(error = %e, "could not publish an event"),
    }
}
