//! The cache of unbound pods asking for GPU extended resources, for `quota::early_pods`: a watch
//! of pods with `spec.nodeName=` (a pod that is bound leaves it as a deletion) whose events are
//! sifted before the cache ([`sift`]): only GPU pods are kept, as bare metadata. Every pod of
//! the cluster is unbound at first, so the others wake nothing and cost no memory.

use std::sync::Arc;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::watcher::{self, Event};
use tokio::sync::Notify;

use crate::cache::{Cache, keep};
use crate::pass_wakes::Waker;
use tessera_planner::quota::early_pods::{PendingPod, unbound_gpu_pod};

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

/// Whether the cache is listed: not while `watch pods` is denied (an upgrade that replaced the
/// image but not the ClusterRole), nor once its writer is gone (nothing fills it).
pub(super) fn listed(store: &Store<Pod>) -> bool {
    use futures::FutureExt;
    store.wait_until_ready().now_or_never().is_some_and(|r| r.is_ok())
}

/// The reason on `Ready` while the cache is not listed.
pub(super) const POD_WATCH_FAILING: &str = tessera_crds::conditions::quota_reasons::POD_WATCH_FAILING;

/// What `Ready` says while the cache is not listed.
pub(super) const POD_WATCH_MESSAGE: &str = "unbound pods are not listed: the operator's ClusterRole lacks `watch pods` (apply the ClusterRole of this release); `<ns>.pods` keeps the pods listed before, GPU pods made before a namespace joined since are not refused binding";

/// While the cache is not listed (`listed` false): `Ready=False`, reason [`POD_WATCH_FAILING`],
/// or, where `Ready` is already `False` for another reason, that reason kept and
/// [`POD_WATCH_MESSAGE`] added to its message. The passes go on meanwhile (see
/// `quota::early_pods::carried`): only this status says the params lag.
pub(super) fn report_pod_watch(
    st: &mut tessera_crds::quota::TenantGpuQuotaStatus,
    listed: bool,
    generation: Option<i64>,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) {
    use tessera_crds::conditions::{READY, find, set_condition};
    if listed {
        return;
    }
    let (reason, message) = match find(&st.conditions, READY).filter(|c| c.status == "False") {
        Some(c) => (c.reason.clone(), format!("{}; {POD_WATCH_MESSAGE}", c.message)),
        None => (POD_WATCH_FAILING.to_string(), POD_WATCH_MESSAGE.to_string()),
    };
    set_condition(&mut st.conditions, READY, false, &reason, message, generation, now.clone());
}

/// Watches unbound pods into a cache, waking `changed` as [`sift`] says.
pub(super) fn watch(client: Client, changed: Arc<Notify>) -> Store<Pod> {
    let (store, writer) = reflector::store();
    let config = watcher::Config::default().fields("spec.nodeName=");
    let events = watcher::watcher(Api::<Pod>::all(client), config).default_backoff();
    tokio::spawn(keep_pods(events, writer, changed));
    store
}

/// Keeps `writer`'s store at the pod events of `events` that [`kept`] passes on, waking
/// `changed` as [`sift`] says.
fn keep_pods<S>(events: S, writer: Writer<Pod>, changed: Arc<Notify>) -> impl Future<Output = ()>
where
    S: futures::Stream<Item = Result<Event<Pod>, watcher::Error>>,
{
    let cached = writer.as_reader();
    let events = events.try_filter_map(move |ev| futures::future::ready(Ok(kept(ev, &cached))));
    // A pod `kept` passes on wakes when new to the cache, not when it changes (see `sift`).
    let cache = Cache {
        trim: |_| {},
        failed: "unbound pod watch error; retrying with backoff",
        ..Cache::waking(vec![Waker { notify: changed, differs: |_, _| false }])
    };
    keep(events, writer, cache, |_| {})
}

/// The event [`sift`] stores, less a deletion that wakes nobody: that of a pod the cache does not
/// hold, which would change nothing. The rest wake as `sift` says: a pod new to the cache, one
/// that leaves it, and the end of a re-list.
fn kept(event: Event<Pod>, cached: &Store<Pod>) -> Option<Event<Pod>> {
    let (event, wake) = sift(event, |p| cached.get(&ObjectRef::from_obj(p)).is_some())?;
    (wake || !matches!(event, Event::Delete(_))).then_some(event)
}

#[cfg(test)]
mod tests;
