//! The operator's control loop: observe (reflector caches, read again only for the nodes the
//! watches saw change (`slots`), plus the pods of draining nodes), plan (`rollout::plan_fleet_with`,
//! pure, reusing the verdicts of unchanged nodes), act (the small executor below), then one status
//! write per plan. Level-triggered: a pass runs on every change it reads (see `wake`) and at least
//! every two seconds, and every decision is re-derived from the API objects (what passes keep
//! between them is an exact shortcut, checked by version), so a restarted operator resumes where
//! it stopped.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
pub use tessera_planner::rollout::node_of;
pub use tessera_planner::slim::{trim_metadata, trim_node};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tessera_crds::gpunode::{AGENT_LEASE_NAMESPACE, NodePhase, NodeRollout};
use tessera_crds::{GpuNode, GpuPartitionPlan, TenantGpuQuota};
use tokio::sync::Notify;
use tracing::{info, warn};

pub(crate) mod claims;
pub mod dra;
mod eviction;
#[cfg(test)]
pub(crate) mod fake_dra_api;
mod fence;
mod layouts;
mod leases;
mod pass;
mod slots;

use slots::{Dirty, Slots};

use crate::Error;
use crate::expectations::{Expectations, Written};
use crate::metrics::Metrics;
use crate::wake::{self, Waker};
use tessera_planner::events::NodeEvent;
use tessera_planner::liveness::Liveness;
use tessera_planner::rollout::{self, Action};
use tessera_planner::slim::{SlimGpuNode, SlimNode};

/// Field manager of everything the operator writes.
pub const MANAGER: &str = "tessera-operator";
/// Field manager of the `Ready=Unknown` the operator writes for a silent agent: separate, so the
/// rollout writes never remove it and the agent takes the condition back when it returns.
pub const LIVENESS_MANAGER: &str = "tessera-operator-liveness";
/// Finalizer that releases a deleted plan's nodes (uncordon, forget) without touching their GPUs.
pub const FINALIZER: &str = "tessera.dev/release-nodes";
/// How long one eviction call may take before it counts as blocked (never block a pass).
/// Marks an eviction that got no answer in time (see `evict`).
const EVICTION_TIMED_OUT: &str = "timed out after";
const EVICTION_TIMEOUT: Duration = Duration::from_secs(5);
/// Changes are batched for this long before a pass. A pass plans the whole fleet, but borrows
/// its objects and memoises its look-ups, so it costs little next to its API requests; each
/// rollout wave takes three passes, so this pause is paid three times per wave. Measured at
/// 1,000 nodes, waiting only for a 40 ms lull instead made the rollout slower (57 s against
/// 43 s, 79 passes against 46): a pass that starts before the cache has the whole wave acts on
/// part of it, and the rest waits for that pass's requests to finish.
const DEBOUNCE: Duration = Duration::from_millis(200);
/// Nodes whose actions (and pod lists) run at once within a pass. A node's requests run one
/// after another, so a pass is bound by their latency more than by the API server: measured at
/// 1,000 nodes, 64 took 34 s against 40 s with 32 (and 40 s with 128).
const NODES_IN_PARALLEL: usize = 64;

/// Whether a node's rollout record keeps a deleted plan's finalizer: the plan has the node mid-
/// change or holds its cordon. A record at rest (`Idle`, `Pending`, `Failed` and uncordoned)
/// holds nothing: a node now waiting under another plan keeps the old plan's name in its record
/// until its turn (waiting costs no write), and must not keep the old plan from going away.
pub fn holds_deletion(record: &NodeRollout, plan: &str) -> bool {
    record.plan.as_deref() == Some(plan)
        && (record.cordoned_by_us
            || matches!(record.phase, NodePhase::Draining | NodePhase::Applying | NodePhase::Uncordoning))
}

pub struct Context {
    pub client: Client,
    /// kube retries 429 by default; evictions must see a PDB refusal at once.
    pub evict_client: Client,
    pub recorder: Recorder,
    /// This replica's identity, as `reportingInstance` of the Events it creates itself.
    instance: String,
    pub metrics: Arc<Metrics>,
    pub plans: Store<GpuPartitionPlan>,
    pub gpunodes: Store<GpuNode>,
    pub nodes: Store<Node>,
    pub leases: Store<Lease>,
    /// Whether the lease watch is caught up (no agent is judged dead through one that is not).
    lease_watch: Arc<std::sync::Mutex<tessera_planner::liveness::LeaseWatch>>,
    /// The quotas automatic plans serve (and `fragmentedSlices` is measured against).
    pub quotas: Store<TenantGpuQuota>,
    /// ResourceClaims: which pods use a GPU through DRA (the drain scope, the busy check).
    pub(crate) claims: claims::ClaimCache,
    /// Agents' heartbeats as observed pass after pass.
    pub liveness: std::sync::Mutex<Liveness>,
    /// The agents each pass judged not responding, for the idle report (`idle::stale`).
    pub not_reporting: tessera_planner::idle::gate::Verdicts,
    /// Each node's verdict of the last pass, reused while its inputs stay the same.
    carry: std::sync::Mutex<rollout::Carry>,
    /// Per draining node, the evictions of pods that came back to it (in memory only).
    returns: std::sync::Mutex<tessera_planner::drain::Returns>,
    /// Pods whose eviction the server asked to retry later (Retry-After; in memory only).
    not_before: std::sync::Mutex<tessera_planner::drain::NotBefore>,
    /// The fleet as the last pass read it, and the nodes the watches saw change since.
    slots: std::sync::Mutex<Slots>,
    dirty: Arc<Dirty>,
    /// Our writes the caches have not shown yet: their nodes wait a pass.
    expectations: std::sync::Mutex<Expectations>,
    /// How far the GpuNode and Node caches have got (highest resourceVersion they hold).
    gpunodes_progress: Arc<AtomicU64>,
    nodes_progress: Arc<AtomicU64>,
    /// The newest version the operator wrote to each (see `watch_into_store_waking`).
    gpunodes_written: Arc<AtomicU64>,
    nodes_written: Arc<AtomicU64>,
    /// Until when this replica may write as the leader (see `leader`): checked before each write.
    pub tenure: Arc<crate::leader::Tenure>,
    /// Automatic plans: since when their demand and fleet have held still.
    stability: std::sync::Mutex<layouts::Stability>,
    /// Decision writes the plan cache has not shown yet.
    decision_writes: std::sync::Mutex<tessera_planner::auto::written::DecisionWrites>,
    /// Stranded slices per (board, layout, demanded profiles), and per GpuNode version.
    stranded_memo: std::sync::Mutex<layouts::StrandedMemo>,
    /// The GPU DRA drivers' ResourceSlices (`run` sets it; none: no node refused, nothing counted).
    pub dra: std::sync::OnceLock<Arc<dra::DraWatch>>,
}

/// Starts the caches and returns the context plus a notifier that fires on every change the
/// rollout reads (see `wake`). `fleet_changed` fires when a `GpuNode`'s GPUs change (the quota
/// controller's wake-up). `gpu_drivers`: whose claim allocations are GPUs.
pub async fn start(
    client: Client,
    evict_client: Client,
    metrics: Arc<Metrics>,
    instance: String,
    fleet_changed: Arc<Notify>,
    gpu_drivers: tessera_planner::dra::GpuDrivers,
) -> (Arc<Context>, Arc<Notify>) {
    let changed = Arc::new(Notify::new());
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
    let claims = claims::ClaimCache::start(client.clone(), gpu_drivers);
    let recorder =
        Recorder::new(client.clone(), Reporter { controller: MANAGER.into(), instance: Some(instance.clone()) });
    let ctx = Context {
        client,
        evict_client,
        recorder,
        instance,
        metrics,
        plans,
        gpunodes,
        nodes,
        leases,
        lease_watch,
        quotas,
        claims,
        liveness: Default::default(),
        not_reporting: Default::default(),
        carry: Default::default(),
        returns: Default::default(),
        not_before: Default::default(),
        slots: Default::default(),
        dirty,
        expectations: Default::default(),
        gpunodes_progress,
        nodes_progress,
        gpunodes_written,
        nodes_written,
        tenure: Default::default(),
        stability: Default::default(),
        decision_writes: Default::default(),
        stranded_memo: Default::default(),
        dra: Default::default(),
    };
    (Arc::new(ctx), changed)
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

impl Context {
    pub async fn wait_ready(&self) {
        let _ = tokio::join!(
            self.plans.wait_until_ready(),
            self.gpunodes.wait_until_ready(),
            self.nodes.wait_until_ready(),
            self.leases.wait_until_ready(),
            self.quotas.wait_until_ready(),
            self.claims.wait_ready()
        );
        // Set by `run` before the loop starts; a pass never plans on slices not listed yet.
        if let Some(dra) = self.dra.get() {
            dra.wait_ready().await;
        }
    }

    /// Forgets what passes kept between them: the fleet's slots, verdicts and stranded slices.
    /// The next pass reads the whole fleet from the caches. Agents' heartbeats stay as observed
    /// (an agent silent all along is still judged silent, not given a new grace period).
    pub fn forget_passes(&self) {
        *self.slots.lock().unwrap_or_else(|p| p.into_inner()) = Slots::default();
        *self.carry.lock().unwrap_or_else(|p| p.into_inner()) = Default::default();
        *self.stranded_memo.lock().unwrap_or_else(|p| p.into_inner()) = Default::default();
        // The idle report's verdicts too: a new tenure's passes publish their own.
        self.not_reporting.forget();
    }

    /// Runs passes until the future is dropped. Started when the lease is ours: the first pass
    /// waits until the caches show the fleet as read after that (see `fence`).
    pub async fn run(self: Arc<Self>, changed: Arc<Notify>) {
        self.wait_ready().await;
        let mut fence = Some(self.read_fence().await);
        loop {
            if fence.as_ref().is_some_and(|f| self.fence_shown(f)) {
                fence = None;
            }
            // A leader that has not seen its lease renewed in time skips the pass (see `leader`).
            if fence.is_none() && self.tenure.holds(std::time::SystemTime::now()) {
                let started = Instant::now();
                if let Err(e) = self.reconcile().await {
                    if !matches!(e, Error::PartialPass(_)) {
                        self.metrics.error(e.kind());
                    }
                    warn!(error = %e, "reconcile pass failed; retrying");
                }
                self.metrics.reconciled(started.elapsed());
            }
            tokio::select! {
                _ = changed.notified() => tokio::time::sleep(DEBOUNCE).await,
                _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            }
        }
    }

    /// One pass over the fleet. A failing API call fails only its node's or its plan's part of
    /// the pass: the rest goes on, and the failure is reported in the plan's status and metrics.
    /// The cached objects are borrowed (`Arc`), never copied, and read again only for the nodes
    /// the watches saw change (see `slots`): with fixed-layout plans a pass costs the nodes that
    /// changed, and a step of a few nanoseconds for the rest (an automatic plan's decision still
    /// reads every node it owns).
    pub async fn reconcile(&self) -> Result<(), Error> {
        // Owned by the pass while it runs: a pass dropped half-way leaves none, and the next one
        // reads the whole fleet again.
        let mut slots = std::mem::take(&mut *self.slots.lock().unwrap_or_else(|p| p.into_inner()));
        let result = self.pass(&mut slots).await;
        *self.slots.lock().unwrap_or_else(|p| p.into_inner()) = slots;
        result
    }

    /// Nodes with a `GpuNode`, by the phase of its rollout record (a `GpuNode` whose Node is gone
    /// is no node of the fleet, and not counted).
    fn set_phase_metrics(&self, slots: &Slots) {
        // A handful of phases: counted in a short list, named once each.
        let mut counts: Vec<(NodePhase, i64)> = Vec::new();
        for phase in slots.slots.iter().filter(|s| s.gpunode.is_some()).map(|s| s.phase) {
            match counts.iter_mut().find(|(p, _)| *p == phase) {
                Some((_, n)) => *n += 1,
                None => counts.push((phase, 1)),
            }
        }
        let phases: BTreeMap<String, i64> = counts.into_iter().map(|(p, n)| (format!("{p:?}"), n)).collect();
        self.metrics.set_phases(&phases);
    }

    /// One Event per plan, reason and type for this pass (see `events`); warnings also on each
    /// Node. A plan deleted meanwhile gets none.
    async fn publish_events(&self, reached: Vec<NodeEvent>, plans: &[GpuPartitionPlan]) {
        for e in reached.iter().filter(|e| e.warning) {
            self.event_on_node(&e.node, e.reason, &e.message, true).await;
        }
        for e in tessera_planner::events::aggregate(reached) {
            if let Some(p) = plans.iter().find(|p| p.metadata.name.as_deref() == Some(e.plan.as_str())) {
                self.publish_new(&p.object_ref(&()), e.reason, &e.note, e.warning).await;
            }
        }
    }

    /// A new Event every time. The Recorder folds Events of the same object and reason into a
    /// series that keeps the first note, which would lose every later wave's node names.
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
        if let Err(e) = api.create(&PostParams::default(), &event).await {
            warn!(error = %e, "could not publish an event");
        }
    }

    /// The pods on a draining node, and which of their DaemonSets exist (a DaemonSet pod is
    /// skipped only while its DaemonSet exists). A DaemonSet that cannot be read counts as
    /// existing: when in doubt, delete nothing.
    async fn pods_on(&self, node: &str) -> (Result<Vec<Pod>, String>, std::collections::BTreeSet<(String, String)>) {
        let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let pods = match Api::<Pod>::all(self.client.clone()).list(&lp).await {
            Ok(list) => list.items,
            Err(e) => {
                self.metrics.error("kube");
                return (Err(e.to_string()), Default::default());
            }
        };
        let mut existing = std::collections::BTreeSet::new();
        let wanted: std::collections::BTreeSet<(String, String)> =
            pods.iter().filter_map(tessera_planner::drain::daemonset_of).collect();
        for (ns, name) in wanted {
            match Api::<DaemonSet>::namespaced(self.client.clone(), &ns).get_opt(&name).await {
                Ok(None) => {}
                Ok(Some(_)) | Err(_) => {
                    existing.insert((ns, name));
                }
            }
        }
        (Ok(pods), existing)
    }

    /// Executes one action; returns `(node, reason)` when an eviction was refused.
    async fn act(&self, action: Action) -> Result<Option<(String, String)>, Error> {
        self.may_write()?;
        // Written through the slim types: a response is decoded without what is never read.
        let nodes: Api<SlimNode> = Api::all(self.client.clone());
        let gns: Api<SlimGpuNode> = Api::all(self.client.clone());
        match action {
            Action::Rollout { node, rollout } => self.write_rollout(&node, rollout.as_ref()).await?,
            Action::Cordon { node } => {
                info!(%node, "cordon");
                let written = nodes
                    .patch(
                        &node,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"annotations": {
                                                 rollout::CORDONED_ANNOTATION: k8s_openapi::jiff::Timestamp::now().to_string()}},
                                             "spec": {"unschedulable": true}})),
                    )
                    .await;
                self.recorded(&node, Written::Node, written).await?;
            }
            Action::Uncordon { node } => {
                info!(%node, "uncordon");
                let written = nodes
                    .patch(
                        &node,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"annotations": {rollout::CORDONED_ANNOTATION: null}},
                                             "spec": {"unschedulable": null}})),
                    )
                    .await;
                self.recorded(&node, Written::Node, written).await?;
            }
            Action::Evict { node, namespace, pod, came_back } => {
                return Ok(self.evict(&node, &namespace, &pod, came_back.as_deref()).await?.map(|why| (node, why)));
            }
            Action::ForceDelete { node, namespace, pod } => {
                warn!(%node, %namespace, %pod, "drain timed out; deleting as the plan's forceAfterTimeout asks");
                let dp = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
                match Api::<Pod>::namespaced(self.client.clone(), &namespace).delete(&pod, &dp).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Action::Intent { node, plan, gpus } => {
                let body = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "metadata": {"name": node},
                                  "spec": {"plan": plan, "gpus": gpus}});
                let written = gns.patch(&node, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&body)).await;
                self.recorded(&node, Written::GpuNode, written).await?;
            }
            Action::ClearIntent { node } => {
                // A merge patch, not an apply: it clears `plan` whoever else also set it (an apply
                // by our manager leaves a field another manager co-owns, and the pass would retry
                // forever), and it answers 404 instead of re-creating a GpuNode just deleted.
                let body = json!({"spec": {"plan": null, "gpus": []}});
                let written = gns.patch(&node, &PatchParams::default(), &Patch::Merge(&body)).await;
                self.recorded(&node, Written::GpuNode, written).await?;
            }
            Action::Completed { seconds, .. } => self.metrics.node_rolled_out(seconds),
            Action::AgentDown { node, message } => {
                warn!(%node, %message, "node agent not responding");
                let condition = json!({"type": "Ready", "status": "Unknown", "reason": "AgentNotResponding",
                    "message": message, "lastTransitionTime": Time(k8s_openapi::jiff::Timestamp::now())});
                let body = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
                                  "status": {"conditions": [condition]}});
                gns.patch_status(&node, &PatchParams::apply(LIVENESS_MANAGER).force(), &Patch::Apply(&body)).await?;
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
        let call = eviction::evict(&self.evict_client, &self.not_before, namespace, pod);
        match tokio::time::timeout(EVICTION_TIMEOUT, call).await {
            Ok(Ok(eviction::Answer::Evicted)) => {
                info!(%node, %namespace, %pod, "evicted");
                self.metrics.evicted();
                if let Some(owner) = came_back {
                    self.returns.lock().unwrap_or_else(|p| p.into_inner()).evicted(node, owner);
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

    /// Records why each draining node's drain waits (its blockers, then the refused evictions)
    /// in its rollout message, which the plan's status and `kubectl tessera status` show, with an
    /// `EvictionBlocked` Event on the Node and the plan when it changes (see `drain::records`).
    async fn record_drain_messages(
        &self,
        found: &BTreeMap<String, Vec<String>>,
        refused: &BTreeMap<String, Vec<String>>,
    ) -> Vec<(String, String)> {
        let current = |node: &str| {
            let cached = self.gpunodes.get(&reflector::ObjectRef::new(node));
            cached.as_ref().and_then(|g| g.status.as_ref()?.rollout.clone())
        };
        let mut errors = Vec::new();
        for (node, r) in tessera_planner::drain::records(found, refused, current) {
            if !r.message.is_empty() {
                self.event_on_node(&node, "EvictionBlocked", &r.message, true).await;
                if let Some(plan) =
                    r.plan.as_deref().and_then(|p| self.plans.state().into_iter().find(|x| x.name_any() == p))
                {
                    let note = format!("{node}: {}", r.message);
                    self.publish(&plan.object_ref(&()), "EvictionBlocked", &note, true).await;
                }
            }
            if let Err(e) = self.write_rollout(&node, Some(&r)).await {
                self.metrics.error(e.kind());
                errors.push((node, e.to_string()));
            }
        }
        errors
    }

    /// Writes a node's `status.rollout` (the operator's only status field there); `None`
    /// removes it. A JSON merge patch naming every field ([`rollout_patch`]): the same result as
    /// a server-side apply of the record, at a fraction of the API server's CPU, and this write
    /// is four of a node's eight requests.
    async fn write_rollout(&self, node: &str, rollout: Option<&NodeRollout>) -> Result<(), Error> {
        self.may_write()?;
        let pp = PatchParams { field_manager: Some(MANAGER.into()), ..Default::default() };
        let written = Api::<SlimGpuNode>::all(self.client.clone())
            .patch_status(node, &pp, &Patch::Merge(rollout_patch(rollout)))
            .await;
        self.recorded(node, Written::GpuNode, written).await?;
        if let Some(plan) = rollout.and_then(|r| r.plan.as_deref()) {
            self.expectations.lock().unwrap_or_else(|p| p.into_inner()).named(node, plan);
        }
        Ok(())
    }

    /// Refuses a write once the leader lease may have passed to another replica: the pass that
    /// planned it may have started under the lease, the write would land after (see `leader`).
    fn may_write(&self) -> Result<(), Error> {
        match self.tenure.holds(std::time::SystemTime::now()) {
            true => Ok(()),
            false => Err(Error::NotLeader),
        }
    }

    /// Remembers the version a write returned, so the node waits until the caches show it. A
    /// write that failed may still have been applied (a timeout, a reset connection): the object
    /// is read back and that version waited for instead. If the read fails too, the next pass
    /// decides from the caches as they are.
    async fn recorded<K: Resource>(&self, node: &str, object: Written, result: kube::Result<K>) -> Result<K, Error> {
        let e = match result {
            Ok(k) => {
                self.expect(node, object, k.meta().resource_version.as_deref());
                return Ok(k);
            }
            Err(e) => e,
        };
        let version = match object {
            Written::GpuNode => {
                Api::<GpuNode>::all(self.client.clone()).get_metadata_opt(node).await.map(|m| m.map(|m| m.metadata))
            }
            Written::Node => {
                Api::<Node>::all(self.client.clone()).get_metadata_opt(node).await.map(|m| m.map(|m| m.metadata))
            }
        };
        if let Ok(Some(meta)) = version {
            self.expect(node, object, meta.resource_version.as_deref());
        }
        Err(e.into())
    }

    /// Remembers a write's resourceVersion: the node waits until the caches show it.
    fn expect(&self, node: &str, object: Written, resource_version: Option<&str>) {
        if let Some(rv) = crate::expectations::revision(resource_version) {
            let newest = match object {
                Written::GpuNode => &self.gpunodes_written,
                Written::Node => &self.nodes_written,
            };
            newest.fetch_max(rv, Ordering::Release);
        }
        let mut expectations = self.expectations.lock().unwrap_or_else(|p| p.into_inner());
        expectations.wrote(node, object, resource_version);
    }

    /// Adds the finalizer where it is missing; returns the plans where that failed.
    async fn ensure_finalizers(&self, plans: &[GpuPartitionPlan]) -> Vec<(String, Error)> {
        let mut failed = Vec::new();
        for p in plans
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && !p.finalizers().iter().any(|f| f == FINALIZER))
        {
            let mut finalizers = p.finalizers().to_vec();
            finalizers.push(FINALIZER.into());
            let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": p.resource_version()}});
            if let Err(e) = Api::<GpuPartitionPlan>::all(self.client.clone())
                .patch(&p.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                self.metrics.error("kube");
                failed.push((p.name_any(), e.into()));
            }
        }
        failed
    }

    /// A deleted plan: once no node is mid-rollout for it any more, drop the finalizer. GPUs keep
    /// their layout; the nodes' intent simply stops naming the plan.
    async fn finish_deletion(&self, plan: &GpuPartitionPlan, slots: &Slots) -> Result<(), Error> {
        let name = plan.name_any();
        // The nodes of the pass: a GpuNode whose Node is gone cannot be released any more, and
        // must not hold the plan.
        let busy = slots
            .slots
            .iter()
            .filter_map(|s| s.gpunode.as_ref()?.status.as_ref()?.rollout.as_ref())
            .any(|r| holds_deletion(r, &name));
        if busy || !plan.finalizers().iter().any(|f| f == FINALIZER) {
            return Ok(());
        }
        let finalizers: Vec<&String> = plan.finalizers().iter().filter(|f| *f != FINALIZER).collect();
        let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": plan.resource_version()}});
        Api::<GpuPartitionPlan>::all(self.client.clone())
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        info!(plan = %name, "released; its nodes keep their MIG layout");
        Ok(())
    }

    async fn event_on_node(&self, node: &str, reason: &str, message: &str, warning: bool) {
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.into()),
            uid: Some(node.into()),
            ..Default::default()
        };
        self.publish(&reference, reason, message, warning).await;
    }

    async fn publish(&self, reference: &ObjectReference, reason: &str, message: &str, warning: bool) {
        let ev = Event {
            type_: if warning { EventType::Warning } else { EventType::Normal },
            reason: reason.into(),
            note: Some(message.chars().take(1000).collect()),
            action: "Rollout".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, reference).await {
            warn!(error = %e, "could not publish an event");
        }
    }
}

/// The merge patch that makes `status.rollout` exactly `rollout`: unset fields are sent as null,
/// so a field of the previous record (a drain start, a message) never survives the write.
pub fn rollout_patch(rollout: Option<&NodeRollout>) -> serde_json::Value {
    let Some(r) = rollout else { return json!({"status": {"rollout": null}}) };
    let mut record = json!({"plan": null, "planGeneration": null, "drainStartedAt": null, "applyStartedAt": null,
                            "draWaitStartedAt": null, "message": null});
    if let (Some(all), Ok(serde_json::Value::Object(set))) = (record.as_object_mut(), serde_json::to_value(r)) {
        all.extend(set);
    }
    json!({"status": {"rollout": record}})
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn only_a_node_mid_change_or_cordoned_holds_a_deleted_plan() {
        let record = |phase: NodePhase, plan: &str, cordoned_by_us: bool| NodeRollout {
            phase,
            plan: Some(plan.into()),
            cordoned_by_us,
            ..Default::default()
        };
        for phase in [NodePhase::Draining, NodePhase::Applying, NodePhase::Uncordoning] {
            assert!(holds_deletion(&record(phase, "a", false), "a"), "{phase:?}");
            assert!(!holds_deletion(&record(phase, "b", true), "a"), "another plan's record: {phase:?}");
        }
        for phase in [NodePhase::Idle, NodePhase::Pending, NodePhase::Failed] {
            assert!(!holds_deletion(&record(phase, "a", false), "a"), "at rest: {phase:?}");
            assert!(holds_deletion(&record(phase, "a", true), "a"), "our cordon still to undo: {phase:?}");
        }
    }

    #[test]
    fn a_rollout_patch_names_every_field_so_nothing_stale_survives() {
        let full = NodeRollout {
            phase: NodePhase::Draining,
            plan: Some("p".into()),
            plan_generation: Some(3),
            cordoned_by_us: true,
            drain_started_at: Some(Time("2026-06-01T00:00:00Z".parse().unwrap())),
            apply_started_at: Some(Time("2026-06-01T00:01:00Z".parse().unwrap())),
            dra_wait_started_at: Some(Time("2026-06-01T00:02:00Z".parse().unwrap())),
            message: "blocked".into(),
        };
        let all = rollout_patch(Some(&full))["status"]["rollout"].clone();
        let back: NodeRollout = serde_json::from_value(all.clone()).unwrap();
        assert_eq!(back, full);
        let fields: Vec<&String> = all.as_object().unwrap().keys().collect();
        // At rest: every field the full record has is still named, unset ones as null.
        let idle = rollout_patch(Some(&NodeRollout { plan: Some("p".into()), ..Default::default() }));
        let idle = idle["status"]["rollout"].as_object().unwrap();
        for f in fields {
            assert!(idle.contains_key(f), "{f} missing from the patch of a record at rest");
        }
        assert_eq!(idle["phase"], "Idle");
        assert!(idle["drainStartedAt"].is_null() && idle["message"].is_null() && idle["applyStartedAt"].is_null());
        assert_eq!(rollout_patch(None), json!({"status": {"rollout": null}}));
    }
}
