//! The cache of unbound pods asking for GPU extended resources, for `quota::early_pods`: a watch
//! of pods with `spec.nodeName=` (a pod that is bound leaves it as a deletion) whose events are
//! sifted before the cache ([`sift`]): only GPU pods are kept, as bare metadata. Every pod of
//! the cluster is unbound at first, so the others wake nothing and cost no memory.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use tokio::sync::Notify;
use tracing::warn;

use crate::quota::early_pods::{PendingPod, unbound_gpu_pod};

/// Where the cached pod keeps the GPU resources it asks for (space-separated): the cache holds
/// no spec.
const RESOURCES: &str = "tessera.dev/gpu-resources";

/// The pod as cached: name, namespace, creation time and its GPU resources ([`RESOURCES`]).
fn bare(p: &PendingPod) -> Pod {
    let resources = p.resources.iter().cloned().collect::<Vec<_>>().join(" ");
    let created = p.created.map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time);
    let metadata = ObjectMeta {
        name: Some(p.name.clone()),
        namespace: Some(p.namespace.clone()),
        creation_timestamp: created,
        annotations: Some([(RESOURCES.to_string(), resources)].into()),
        ..Default::default()
    };
    Pod { metadata, ..Default::default() }
}

/// What the cache stores of `event`, and whether it wakes a quota pass: an unbound, unfinished
/// GPU pod is kept (bare, waking when new); any other pod is deleted from the cache (waking
/// when it was there: bound, finished, gone); a re-list keeps only GPU pods and wakes when done.
/// `cached` says whether a pod is in the cache now.
pub(super) fn sift(event: Event<Pod>, cached: impl Fn(&Pod) -> bool) -> Option<(Event<Pod>, bool)> {
    match event {
        Event::Apply(p) => Some(match unbound_gpu_pod(&p) {
            Some(g) => {
                let b = bare(&g);
                let new = !cached(&b);
                (Event::Apply(b), new)
            }
            None => {
                let was = cached(&p);
                (Event::Delete(p), was)
            }
        }),
        Event::Delete(p) => {
            let was = cached(&p);
            Some((Event::Delete(p), was))
        }
        Event::InitApply(p) => unbound_gpu_pod(&p).map(|g| (Event::InitApply(bare(&g)), false)),
        Event::Init => Some((Event::Init, false)),
        Event::InitDone => Some((Event::InitDone, true)),
    }
}

/// The cache's pods, as the planner reads them.
pub(super) fn pending(store: &Store<Pod>) -> Vec<PendingPod> {
    store
        .state()
        .iter()
        .map(|p| PendingPod {
            namespace: p.metadata.namespace.clone().unwrap_or_default(),
            name: p.metadata.name.clone().unwrap_or_default(),
            created: p.metadata.creation_timestamp.as_ref().map(|t| t.0),
            resources: p
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(RESOURCES))
                .map_or_else(Default::default, |r| {
                    r.split(' ').filter(|r| !r.is_empty()).map(str::to_string).collect()
                }),
        })
        .collect()
}

/// Watches unbound pods into a cache, waking `changed` as [`sift`] says.
pub(super) fn watch(client: Client, changed: Arc<Notify>) -> Store<Pod> {
    let (store, mut writer) = reflector::store();
    let cached = writer.as_reader();
    tokio::spawn(async move {
        let config = watcher::Config::default().fields("spec.nodeName=");
        let events = watcher::watcher(Api::<Pod>::all(client), config).default_backoff();
        futures::pin_mut!(events);
        while let Some(ev) = events.next().await {
            let ev = match ev {
                Ok(ev) => ev,
                Err(e) => {
                    warn!(error = %e, "unbound pod watch error; retrying with backoff");
                    continue;
                }
            };
            if let Some((ev, wake)) = sift(ev, |p| cached.get(&ObjectRef::from_obj(p)).is_some()) {
                writer.apply_watcher_event(&ev);
                if wake {
                    changed.notify_one();
                }
            }
        }
    });
    store
}

#[cfg(test)]
mod tests;
