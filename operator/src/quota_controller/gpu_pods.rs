//! Gates mode's cache of the pods charged for GPUs, bound or not ([`quota::gates`]): Tessera's
//! own count beside what each ResourceQuota shows. Every pod event is sifted before the cache
//! ([`sift`]): a pod charged for GPUs is kept as bare metadata (name, namespace, creation time,
//! its charges and whether it is bound); any other is dropped, so the rest of the cluster's pods
//! cost no memory and wake nothing.
//!
//! [`quota::gates`]: tessera_planner::quota::gates

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::watcher::{self, Event};
use tessera_planner::quota::gates::Holder;
use tessera_planner::quota::gates::charges::pod_charges;
use tokio::sync::Notify;

use crate::cache::{Cache, keep};
use crate::pass_wakes::Waker;

/// Where the cached pod keeps its charges (`key=n`, space-separated): the cache holds no spec.
const CHARGES: &str = "tessera.dev/gpu-charges";

/// The pod as cached, or `None` when it is charged for no GPU (finished, or asking for none).
pub(super) fn bare(p: &Pod) -> Option<Pod> {
    let charges = pod_charges(p);
    if charges.is_empty() {
        return None;
    }
    let rendered: Vec<String> = charges.iter().map(|(k, n)| format!("{k}={n}")).collect();
    let metadata = ObjectMeta {
        name: p.metadata.name.clone(),
        namespace: p.metadata.namespace.clone(),
        creation_timestamp: p.metadata.creation_timestamp.clone(),
        annotations: Some([(CHARGES.to_string(), rendered.join(" "))].into()),
        ..Default::default()
    };
    let node_name = p.spec.as_ref().and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty());
    Some(Pod { metadata, spec: Some(PodSpec { node_name, ..Default::default() }), status: None })
}

/// What the cache stores of `event` and whether it wakes a pass: a charged pod is kept (waking
/// when new or when its charges or binding changed); any other pod is deleted from the cache
/// (waking when it was there). `cached`: the pod as the cache holds it now.
pub(super) fn sift(event: Event<Pod>, cached: impl Fn(&Pod) -> Option<Pod>) -> Option<(Event<Pod>, bool)> {
    match event {
        Event::Apply(p) => Some(match bare(&p) {
            Some(b) => {
                let wake = cached(&b).as_ref() != Some(&b);
                (Event::Apply(b), wake)
            }
            None => {
                let was = cached(&p).is_some();
                (Event::Delete(p), was)
            }
        }),
        Event::Delete(p) => {
            let was = cached(&p).is_some();
            Some((Event::Delete(p), was))
        }
        Event::InitApply(p) => bare(&p).map(|b| (Event::InitApply(b), false)),
        Event::Init => Some((Event::Init, false)),
        Event::InitDone => Some((Event::InitDone, true)),
    }
}

/// Watches every pod into a cache of the charged ones, waking `changed` as [`sift`] says.
pub(super) fn watch(client: Client, changed: Arc<Notify>) -> Store<Pod> {
    let (store, writer) = reflector::store();
    // A quorum list: the count must hold every pod that exists, not a watch cache's view.
    let config = watcher::Config::default().list_semantic(watcher::ListSemantic::MostRecent);
    let events = watcher::watcher(Api::<Pod>::all(client), config).default_backoff();
    tokio::spawn(keep_pods(events, writer, changed));
    store
}

fn keep_pods<S>(events: S, writer: Writer<Pod>, changed: Arc<Notify>) -> impl Future<Output = ()>
where
    S: futures::Stream<Item = Result<Event<Pod>, watcher::Error>>,
{
    let cached = writer.as_reader();
    let events = events.try_filter_map(move |ev| {
        let kept = sift(ev, |p| cached.get(&ObjectRef::from_obj(p)).map(|p| (*p).clone()))
            .and_then(|(ev, wake)| (wake || !matches!(ev, Event::Delete(_))).then_some(ev));
        futures::future::ready(Ok(kept))
    });
    let cache = Cache {
        trim: |_| {},
        failed: "GPU pod watch error; retrying with backoff",
        // The bare pod is all a pass reads: any change of it (bound, charges) wakes one.
        ..Cache::waking(vec![Waker { notify: changed, differs: |a, b| a != b }])
    };
    keep(events, writer, cache, |_| {})
}

/// The cached pods of each namespace, as the gates planner reads them.
pub(super) fn holders(store: &Store<Pod>) -> BTreeMap<String, Vec<Holder>> {
    let mut out: BTreeMap<String, Vec<Holder>> = BTreeMap::new();
    for p in store.state() {
        let charges = p.metadata.annotations.as_ref().and_then(|a| a.get(CHARGES)).map_or_else(Default::default, |c| {
            c.split(' ')
                .filter_map(|kv| kv.split_once('='))
                .filter_map(|(k, n)| Some((k.to_string(), n.parse().ok()?)))
                .collect()
        });
        let holder = Holder {
            name: p.metadata.name.clone().unwrap_or_default(),
            created: tessera_planner::quota::gates::namespace::created(&p.metadata),
            charges,
            placed: p.spec.as_ref().is_some_and(|s| s.node_name.is_some()),
        };
        out.entry(p.metadata.namespace.clone().unwrap_or_default()).or_default().push(holder);
    }
    out
}

#[cfg(test)]
mod tests;
