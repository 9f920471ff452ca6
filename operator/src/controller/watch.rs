//! The caches the controllers read: each a reflector store kept current by a watch (with
//! backoff) in the background, waking only the listeners that read what changed (see `wake`).

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use tessera_crds::gpunode::AGENT_LEASE_NAMESPACE;
use tessera_crds::{GpuNode, GpuPartitionPlan, TenantGpuQuota};
use tessera_planner::liveness::LeaseWatch;
use tessera_planner::slim::{SlimGpuNode, SlimNode};
use tokio::sync::Notify;
use tracing::warn;

use super::slots::Dirty;
use super::{leases, trim_metadata, trim_node};
use crate::wake::{self, Waker};

/// The caches the rollout reads, each with what the context keeps of its watch.
pub(super) struct Caches {
    pub(super) plans: Store<GpuPartitionPlan>,
    pub(super) gpunodes: Store<GpuNode>,
    pub(super) nodes: Store<Node>,
    pub(super) leases: Store<Lease>,
    /// Whether the lease watch is caught up.
    pub(super) lease_watch: Arc<Mutex<LeaseWatch>>,
    pub(super) quotas: Store<TenantGpuQuota>,
    /// The nodes the GpuNode, Node and Lease watches saw change.
    pub(super) dirty: Arc<Dirty>,
    /// How far the GpuNode and Node caches have got, and the newest version the operator wrote
    /// to each (see [`watch_into_store_waking`]).
    pub(super) gpunodes_progress: Arc<AtomicU64>,
    pub(super) nodes_progress: Arc<AtomicU64>,
    pub(super) gpunodes_written: Arc<AtomicU64>,
    pub(super) nodes_written: Arc<AtomicU64>,
}

impl Caches {
    /// Starts the watches: every change the rollout reads wakes `changed` (see `wake`), and a
    /// change of a GpuNode's GPUs also wakes `fleet_changed`.
    pub(super) fn start(client: &Client, changed: &Arc<Notify>, fleet_changed: Arc<Notify>) -> Self {
        // Nodes, GpuNodes and Leases are named alike: their changes name the node to read again.
        let dirty = Arc::new(Dirty::default());
        let all = watcher::Config::default;
        let plans = watch_into_store_waking(
            Api::<GpuPartitionPlan>::all(client.clone()),
            all(),
            vec![Waker { notify: changed.clone(), differs: wake::plan_differs }],
            trim_metadata,
            Default::default(),
            None,
        )
        .0;
        // The quota controller reads the same GpuNodes (their capacity): one cache, woken both.
        let gpunodes_written = Arc::new(AtomicU64::new(0));
        let nodes_written = Arc::new(AtomicU64::new(0));
        let (gpunodes, gpunodes_progress) = watch_into_store_waking(
            Api::<SlimGpuNode>::all(client.clone()),
            all(),
            vec![Waker::always(changed.clone()), Waker { notify: fleet_changed, differs: wake::gpus_differ }],
            trim_metadata,
            gpunodes_written.clone(),
            Some(dirty.clone()),
        );
        let (nodes, nodes_progress) = watch_into_store_waking(
            Api::<SlimNode>::all(client.clone()),
            all(),
            vec![Waker { notify: changed.clone(), differs: wake::node_differs }],
            trim_node,
            nodes_written.clone(),
            Some(dirty.clone()),
        );
        let (leases, lease_watch) = leases::watch_leases(
            Api::<Lease>::namespaced(client.clone(), AGENT_LEASE_NAMESPACE),
            Waker { notify: changed.clone(), differs: wake::lease_differs },
            dirty.clone(),
        );
        let quotas = watch_into_store_waking(
            Api::<TenantGpuQuota>::all(client.clone()),
            all(),
            vec![Waker { notify: changed.clone(), differs: wake::quota_differs }],
            trim_metadata,
            Default::default(),
            None,
        )
        .0;
        Self {
            plans,
            gpunodes,
            nodes,
            leases,
            lease_watch,
            quotas,
            dirty,
            gpunodes_progress,
            nodes_progress,
            gpunodes_written,
            nodes_written,
        }
    }
}

/// A cache of `api` kept current by a watch (with backoff) in the background; every change wakes
/// `changed` (a re-list once, when it is complete). Objects are trimmed ([`trim_metadata`]) before they are cached. Shared by the
/// rollout and quota controllers.
pub fn watch_into_store<K>(api: Api<K>, config: watcher::Config, changed: Arc<Notify>) -> Store<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    watch_into_store_waking(api, config, vec![Waker::always(changed)], trim_metadata, Default::default(), None).0
}

/// [`watch_into_store`] of objects decoded as `W` (a lighter form, see `slim`) and cached as
/// `K`, trimmed with `trim`, waking each listener only on the changes it reads (see `wake`).
/// Also returns how far the cache has got: the highest resourceVersion (an etcd revision) of the
/// objects it holds or has seen deleted, raised only once the store has them (a re-list's
/// objects count once the whole list is in). `written` is the newest version the operator has
/// written to these objects: a re-list is read after it starts (the newest data, not a cache),
/// so once in, it shows every write made before, even of objects deleted since. `dirty`, if
/// given, is told the name of every object that changed (before anyone is woken).
pub fn watch_into_store_waking<W, K>(
    api: Api<W>,
    config: watcher::Config,
    wake: Vec<Waker<K>>,
    trim: fn(&mut K),
    written: Arc<AtomicU64>,
    dirty: Option<Arc<Dirty>>,
) -> (Store<K>, Arc<AtomicU64>)
where
    W: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static + Into<K>,
    K: Resource + Clone + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (store, writer) = reflector::store();
    let progress = Arc::new(AtomicU64::new(0));
    let seen = progress.clone();
    tokio::spawn(async move {
        let differs = wake.iter().map(|w| w.differs).collect();
        let events = watcher(api, config).default_backoff().map_ok(|event| event_into::<W, K>(event)).modify(trim);
        let mut tracker = crate::expectations::WatchProgress::default();
        // Named as changed before the progress counts it: a pass that reads this progress (it does
        // so before taking the names) finds the name and reads the node again; otherwise a
        // node whose cached version passed our write could be planned from its old slot.
        let stream = store_deciding_wakes(events, writer, differs).inspect_ok(move |(ev, _)| {
            if let Some(dirty) = &dirty {
                dirty.mark(ev);
            }
            tracker.observe(ev, &seen, &written);
        });
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok((_, to_wake)) => {
                    for (_, w) in wake.iter().enumerate().filter(|(i, _)| to_wake & (1 << i) != 0) {
                        w.notify.notify_one();
                    }
                }
                Err(e) => warn!(error = %e, "watch error; retrying with backoff"),
            }
        }
    });
    (store, progress)
}

/// Stores each event of `events` in `writer`'s cache and yields it with the listeners it must
/// wake (bit `i` for `differs[i]`, see `wake::to_wake`): decided against the version cached
/// before the event is stored, yielded after it is, so a woken pass finds the change.
pub fn store_deciding_wakes<K, S>(
    events: S,
    mut writer: reflector::store::Writer<K>,
    differs: Vec<fn(&K, &K) -> bool>,
) -> impl futures::Stream<Item = Result<(watcher::Event<K>, u64), watcher::Error>>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let cached = writer.as_reader();
    events.map_ok(move |event| {
        let to_wake = wake::to_wake(&event, |k| cached.get(&reflector::ObjectRef::from_obj(k)), &differs);
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
        let differs: Vec<fn(&Node, &Node) -> bool> = vec![wake::node_differs, |_, _| true];
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
