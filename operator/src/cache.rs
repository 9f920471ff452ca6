//! How every cache is started: a reflector store kept current by a watch (with backoff) in the
//! background, waking only the listeners that read what changed (see `pass_wakes`). [`start_cache`]
//! starts one; a cache whose stream must differ (the leases' re-lists, the unbound pods'
//! sifting) builds its stream and keeps its store with [`keep`].

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use futures::{Stream, StreamExt, TryStreamExt};
use kube::api::Api;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use tessera_planner::trimmed::trim_metadata;
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::pass_wakes::{self, Waker};

/// What is told the name of every object that changed (the rollout's `Dirty`).
pub trait Marks<K>: Send + Sync {
    /// Called for every watch event once the cache holds it.
    fn mark(&self, event: &watcher::Event<K>);
}

/// How a cache is kept (see [`start_cache`] and [`keep`]). Build one with [`Cache::waking`] and
/// set the rest by name (`Cache { trim: trim_node, ..Cache::waking(wake) }`).
pub struct Cache<K> {
    /// The listeners, each woken only on the changes it reads (see `pass_wakes`).
    pub wake: Vec<Waker<K>>,
    /// Applied to every object before it is cached.
    pub trim: fn(&mut K),
    /// Told the name of every object that changed, before anyone is woken.
    pub dirty: Option<Arc<dyn Marks<K>>>,
    /// The newest version the operator has written to these objects (see [`start_cache`]).
    pub written: Arc<AtomicU64>,
    /// A `resource.k8s.io/v1` resource that may not be served, and what is logged when it is not
    /// (see [`served`]): the cache is then ready and empty, and its listeners woken once.
    pub served: Option<(&'static str, &'static str)>,
    /// Logged with each watch error.
    pub failed: &'static str,
}

impl<K: Resource> Cache<K> {
    /// Waking `pass_wakes`, trimmed with [`trim_metadata`], marking nothing, of an API always served.
    pub fn waking(wake: Vec<Waker<K>>) -> Self {
        Self {
            wake,
            trim: trim_metadata::<K>,
            dirty: None,
            written: Default::default(),
            served: None,
            failed: "watch error; retrying with backoff",
        }
    }

    /// [`Cache::waking`] `notify` on every change.
    pub fn always(notify: Arc<Notify>) -> Self {
        Self::waking(vec![Waker::always(notify)])
    }
}

/// A cache of `api`'s objects, decoded as `W` (a lighter form, see `trimmed`) and cached as `K`,
/// kept current by a watch (with backoff) in the background as `cache` says (see [`keep`]).
/// Also returns how far the cache has got: the highest resourceVersion (an etcd revision) of the
/// objects it holds or has seen deleted, raised only once the store has them (a re-list's
/// objects count once the whole list is in). `cache.written` is the newest version the operator
/// has written to these objects: a re-list is read after it starts (the newest data, not a
/// cache), so once in, it shows every write made before, even of objects deleted since.
pub fn start_cache<W, K>(api: Api<W>, config: watcher::Config, cache: Cache<K>) -> (Store<K>, Arc<AtomicU64>)
where
    W: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static + Into<K>,
    K: Resource + Clone + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (store, writer) = reflector::store();
    let progress = Arc::new(AtomicU64::new(0));
    let seen = progress.clone();
    tokio::spawn(async move {
        if let Some((resource, absent)) = cache.served
            && !served(&api.clone().into_client(), resource).await
        {
            info!("{absent}");
            mark_synced_empty(writer);
            cache.wake.iter().for_each(|w| w.notify.notify_one());
            return;
        }
        let written = cache.written.clone();
        let mut tracker = crate::expectations::WatchProgress::default();
        let events = watcher(api, config).default_backoff().map_ok(|event| event_into::<W, K>(event));
        keep(events, writer, cache, move |item| {
            if let Ok(event) = item {
                tracker.observe(event, &seen, &written);
            }
        })
        .await;
    });
    (store, progress)
}

/// Keeps `writer`'s store at `events` until they end: each event is trimmed (`cache.trim`) and
/// stored, its object named in `cache.dirty`, then shown to `seen`, then the listeners that read
/// the change are woken (see `pass_wakes`). Named as changed before `seen` counts it: a pass that reads
/// a cache's progress (before taking the names) finds the name and reads the node again;
/// otherwise a node whose cached version passed our write could be planned from its old cached copy.
pub async fn keep<K, S>(
    events: S,
    writer: Writer<K>,
    cache: Cache<K>,
    mut seen: impl FnMut(Result<&watcher::Event<K>, &watcher::Error>),
) where
    K: Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let Cache { wake, trim, dirty, failed, .. } = cache;
    let differs = wake.iter().map(|w| w.differs).collect();
    let stream = store_deciding_wakes(events.map_ok(move |event| event.modify(trim)), writer, differs);
    futures::pin_mut!(stream);
    while let Some(item) = stream.next().await {
        match item {
            Ok((event, to_wake)) => {
                if let Some(dirty) = &dirty {
                    dirty.mark(&event);
                }
                seen(Ok(&event));
                for (_, w) in wake.iter().enumerate().filter(|(i, _)| to_wake & (1 << i) != 0) {
                    w.notify.notify_one();
                }
            }
            Err(e) => {
                seen(Err(&e));
                warn!(error = %e, "{failed}");
            }
        }
    }
}

/// Stores each event of `events` in `writer`'s cache and yields it with the listeners it must
/// wake (bit `i` for `differs[i]`, see `pass_wakes::to_wake`): decided against the version cached
/// before the event is stored, yielded after it is, so a woken pass finds the change.
fn store_deciding_wakes<K, S>(
    events: S,
    mut writer: Writer<K>,
    differs: Vec<fn(&K, &K) -> bool>,
) -> impl Stream<Item = Result<(watcher::Event<K>, u64), watcher::Error>>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let cached = writer.as_reader();
    events.map_ok(move |event| {
        let to_wake = pass_wakes::to_wake(&event, |k| cached.get(&reflector::ObjectRef::from_obj(k)), &differs);
        writer.apply_watcher_event(&event);
        (event, to_wake)
    })
}

/// A watch event of objects decoded as `W`, as one of `K`.
fn event_into<W: Into<K>, K>(event: watcher::Event<W>) -> watcher::Event<K> {
    match event {
        watcher::Event::Apply(o) => watcher::Event::Apply(o.into()),
        watcher::Event::Delete(o) => watcher::Event::Delete(o.into()),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(o) => watcher::Event::InitApply(o.into()),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// Whether the API server serves `resource` (e.g. `resourceclaims`) in `resource.k8s.io/v1`.
/// Asked until it answers: any answer but "not found" counts as served, and the watch then
/// retries (and holds the passes) until it can list them, rather than plan blind to them.
pub(crate) async fn served(client: &Client, resource: &str) -> bool {
    loop {
        match client.list_api_group_resources("resource.k8s.io/v1").await {
            Ok(list) => return list.resources.iter().any(|r| r.name == resource),
            Err(kube::Error::Api(s)) if s.code == 404 => return false,
            Err(e) => {
                warn!(error = %e, "could not tell whether resource.k8s.io/v1 is served; asking again");
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
        }
    }
}

/// An empty list, fully read: the store is ready and holds nothing.
pub(crate) fn mark_synced_empty<K>(mut writer: Writer<K>)
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitDone);
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    #[tokio::test]
    async fn wakes_are_decided_against_the_cached_version_and_yielded_once_it_is_stored() {
        let node = |rv: &str, unschedulable: bool, taint: bool| -> Node {
            serde_json::from_value(json!({"metadata": {"name": "n1", "resourceVersion": rv},
                "spec": {"unschedulable": unschedulable,
                         "taints": if taint { json!([{"key": "k", "effect": "NoSchedule"}]) } else { json!([]) }}}))
            .unwrap()
        };
        let events = vec![
            watcher::Event::Init,
            watcher::Event::InitApply(node("1", false, true)),
            watcher::Event::InitDone,
            watcher::Event::Apply(node("2", false, false)), // a taint removed: not read by the rollout
            watcher::Event::Apply(node("3", true, false)),  // a cordon
            watcher::Event::Delete(node("3", true, false)),
        ];
        let (store, writer) = reflector::store::<Node>();
        let differs: Vec<fn(&Node, &Node) -> bool> = vec![pass_wakes::node_differs, |_, _| true];
        let stream = store_deciding_wakes(futures::stream::iter(events.into_iter().map(Ok)), writer, differs);
        futures::pin_mut!(stream);
        let mut seen = Vec::new();
        while let Some(Ok((event, to_wake))) = stream.next().await {
            // Yielded after the store has it: a woken pass reads the change.
            let cached = store.get(&reflector::ObjectRef::new("n1")).and_then(|n| n.metadata.resource_version.clone());
            seen.push((to_wake, cached));
            if let watcher::Event::Delete(_) = event {
                assert!(store.get(&reflector::ObjectRef::new("n1")).is_none());
            }
        }
        let rv = |v: &str| Some(v.to_string());
        assert_eq!(
            seen,
            vec![(0, None), (0, None), (0b11, rv("1")), (0b10, rv("2")), (0b11, rv("3")), (0b11, None)],
            "Init and InitApply wake nobody, InitDone everyone; the taint wakes only the listener that reads all"
        );
    }
}
