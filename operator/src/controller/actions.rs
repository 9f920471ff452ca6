//! The executor of a pass: each planned action becomes one API request (or a metric), every
//! write sent through the rollout's `Writer` (checked against the leader's tenure, remembered
//! until the caches show it).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams};
use serde_json::json;
use tracing::{info, warn};

use super::{Context, eviction};
use crate::Error;
use crate::expectations::Written;
use crate::writer::{Manager, Write, bodies};
use tessera_planner::rollout::{self, Action};
use tessera_planner::trimmed::{SlimGpuNode, SlimNode};

/// Marks an eviction that got no answer in time (see `evict`).
pub(super) const EVICTION_TIMED_OUT: &str = "timed out after";
/// How long one eviction call may take before it counts as blocked (never block a pass).
const EVICTION_TIMEOUT: Duration = Duration::from_secs(5);

impl Context {
    /// Executes one action; returns `(node, reason)` when an eviction was refused.
    pub(super) async fn act(&self, action: Action) -> Result<Option<(String, String)>, Error> {
        // Before any action: not even a completion is counted once the lease may have passed.
        let writer = self.writer();
        writer.may_write()?;
        // Written through the slim types: a response is decoded without what is never read.
        let nodes: Api<SlimNode> = Api::all(self.client.clone());
        let gns: Api<SlimGpuNode> = Api::all(self.client.clone());
        match action {
            Action::Rollout { node, rollout } => self.write_rollout(&node, rollout.as_ref()).await?,
            Action::Cordon { node } => {
                info!(%node, "cordon");
                let body = json!({"metadata": {"annotations": {
                                      rollout::CORDONED_ANNOTATION: k8s_openapi::jiff::Timestamp::now().to_string()}},
                                  "spec": {"unschedulable": true}});
                writer.send(&nodes, &node, Write::merge(&body).expected(Written::Node)).await?;
            }
            Action::Uncordon { node } => {
                info!(%node, "uncordon");
                let body = json!({"metadata": {"annotations": {rollout::CORDONED_ANNOTATION: null}},
                                  "spec": {"unschedulable": null}});
                writer.send(&nodes, &node, Write::merge(&body).expected(Written::Node)).await?;
            }
            Action::Evict { node, namespace, pod, came_back } => {
                return Ok(self.evict(&node, &namespace, &pod, came_back.as_deref()).await?.map(|why| (node, why)));
            }
            Action::ForceDelete { node, namespace, pod } => {
                warn!(%node, %namespace, %pod, "drain timed out; deleting as the plan's forceAfterTimeout asks");
                let dp = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
                writer.delete(&Api::<Pod>::namespaced(self.client.clone(), &namespace), &pod, &dp).await?;
            }
            Action::Intent { node, plan, gpus } => {
                let body = bodies::intent(&node, plan, gpus);
                writer.send(&gns, &node, Write::apply(Manager::Operator, &body).expected(Written::GpuNode)).await?;
            }
            Action::ClearIntent { node } => {
                // A merge patch, not an apply: it clears `plan` whoever else also set it (an apply
                // by our manager leaves a field another manager co-owns, and the pass would retry
                // forever), and it answers 404 instead of re-creating a GpuNode just deleted.
                let body = json!({"spec": {"plan": null, "gpus": []}});
                writer.send(&gns, &node, Write::merge(&body).expected(Written::GpuNode)).await?;
            }
            Action::Completed { seconds, .. } => self.metrics.node_rolled_out(seconds),
            Action::AgentDown { node, message } => {
                warn!(%node, %message, "node agent not responding");
                let reason = tessera_crds::conditions::gpunode_reasons::AGENT_NOT_RESPONDING;
                let now = Time(k8s_openapi::jiff::Timestamp::now());
                let body =
                    bodies::gpunode_conditions(vec![bodies::condition("Ready", "Unknown", reason, message, now)]);
                writer.send(&gns, &node, Write::apply(Manager::Liveness, &body).status()).await?;
            }
            // Collected by the pass: Events published aggregated (`publish_events`), blockers
            // recorded with the refused evictions (`record_drain_messages`).
            Action::Event { .. } | Action::Blockers { .. } => {}
        }
        Ok(None)
    }

    /// One eviction (see `eviction`: not asked again before a 429's Retry-After), bounded in
    /// time. `Some(reason)` if refused.
    /// `came_back`: the owner of a pod that came back to the cordoned node, counted once evicted.
    async fn evict(
        &self,
        node: &str,
        namespace: &str,
        pod: &str,
        came_back: Option<&str>,
    ) -> Result<Option<String>, Error> {
        let writer = self.writer();
        let call = writer.guarded(eviction::evict(&self.evict_client, &self.memory.not_before, namespace, pod));
        match tokio::time::timeout(EVICTION_TIMEOUT, call).await {
            Ok(Ok(eviction::Answer::Evicted)) => {
                info!(%node, %namespace, %pod, "evicted");
                self.metrics.evicted();
                if let Some(owner) = came_back {
                    crate::locked(&self.memory.returns).evicted(node, owner);
                }
                Ok(None)
            }
            Ok(Ok(eviction::Answer::Gone)) => Ok(None),
            Ok(Ok(eviction::Answer::Refused { why, asked })) => {
                if asked {
                    self.metrics.eviction_blocked();
                }
                Ok(Some(why))
            }
            Ok(Err(e)) => Err(e),
            Err(_) => {
                Ok(Some(format!("eviction of {namespace}/{pod} {EVICTION_TIMED_OUT} {}s", EVICTION_TIMEOUT.as_secs())))
            }
        }
    }
}
