//! Acts on `quota::plan_quotas`: server-side-applies one owned, labelled ResourceQuota per tenant
//! namespace (drift is overwritten on the next pass), deletes stale ones, writes quota status.
//! A failing write fails only its quota's part of the pass: the rest goes on, and the error is
//! reported in that quota's status (`WriteFailed`). Every write first checks the leader tenure
//! (see `leader`): once the lease may have passed, the pass writes nothing more.
//! Deleting a TenantGpuQuota removes its ResourceQuotas through their owner references (garbage
//! collector) and through the stale-object sweep here.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ResourceQuota};
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Client, Resource};
use serde_json::json;
use tessera_crds::conditions::set_condition_status;
use tessera_crds::quota::TenantGpuQuotaStatus;
use tessera_crds::{GpuNode, TenantGpuQuota};
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::Error;
use crate::cache::{Cache, start_cache};
use crate::control_loop::{Loop, Passes};
use crate::controller::{Caches, Context};
use crate::metrics::Metrics;
use crate::pass_wakes::Waker;
use crate::writer::{Manager, Write, Writer};
use tessera_planner::dra::GpuDrivers;
use tessera_planner::quota::claims::CLAIM_POLICY;
use tessera_planner::quota::stamp::IN_FORCE_SINCE;
use tessera_planner::quota::stamp::keys::IN_FORCE_KEYS;
use tessera_planner::quota::{
    Apply, Capacity, DraInputs, QUOTA_LABEL, QUOTA_NAME_ANNOTATION, QuotaPlan, plan_quotas_dra, quota_label_value,
};

mod claim_classes;
use claim_classes::PolicyCheck;
mod deleted;
mod gate_policies;
mod gates;
mod gpu_pods;
mod observe;
mod pending_pods;
mod policy_check;
mod retire_params;
mod writes;

/// `--quota-admission` and, in gates mode, `--gpu-open-namespaces`.
#[derive(Debug, Clone)]
pub struct AdmissionSettings {
    pub mode: QuotaAdmission,
    pub open: tessera_planner::quota::gates::open::OpenNamespaces,
}

/// How quota admission is held (`--quota-admission`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QuotaAdmission {
    /// One params ConfigMap for every tenant namespace, read by `config/rbac/claim-classes.yaml`.
    #[default]
    Params,
    /// A GpuQuotaGate per tenant namespace, the namespace label, the class list and held
    /// ResourceQuotas, read by `config/rbac/quota-gates.yaml` (`docs/design/quota-gates.md`).
    Gates,
}

pub struct QuotaController {
    client: Client,
    /// `--quota-admission`.
    admission: QuotaAdmission,
    /// Gates mode: every GpuQuotaGate (empty and never listed otherwise).
    gates: Store<tessera_crds::gate::GpuQuotaGate>,
    /// Gates mode: `--gpu-open-namespaces`, the unclaimed namespaces GPU work is not limited in.
    open: tessera_planner::quota::gates::open::OpenNamespaces,
    /// Gates mode: the pods charged for GPUs, bound or not ([`gpu_pods`]).
    gpu_pods: Store<Pod>,
    metrics: Arc<Metrics>,
    quotas: Store<TenantGpuQuota>,
    rqs: Store<ResourceQuota>,
    namespaces: Store<Namespace>,
    /// The rollout controller's cache (one cache of GpuNodes per process).
    gpunodes: Store<GpuNode>,
    /// Every DeviceClass: which reach GPUs decides the claim keys (see `quota::claims`).
    classes: Store<DeviceClass>,
    /// `--gpu-dra-drivers`.
    drivers: GpuDrivers,
    /// The operator's namespace: where the claim-class policy's params ConfigMap lives.
    namespace: String,
    /// The claim-class policy's params ConfigMap as the cluster has it (watched by name, so a
    /// deleted or edited one is written again).
    policy_params: Store<ConfigMap>,
    changed: Arc<Notify>,
    /// Fires when a GpuNode's reported GPUs change (not its rollout record: see `pass_wakes`); they
    /// wake a pass after a longer pause than changes to quotas and namespaces.
    fleet_changed: Arc<Notify>,
    /// The GPU DRA drivers' ResourceSlices (shared with the rollout): their supply counts too.
    dra: Arc<crate::controller::dra::DraWatch>,
    /// The rollout controller's Node cache: the `nvidia.com/` resources nodes advertise, held
    /// at 0 under `unlisted: Zero`.
    nodes: Store<k8s_openapi::api::core::v1::Node>,
    /// The rollout controller's ResourceClaim cache: exact holders of claims.
    claims: crate::controller::claims::ClaimCache,
    /// The agents the rollout controller judges not responding: their nodes' activity summaries
    /// are set aside (`idle::stale`); no report before it publishes any.
    not_reporting: tessera_planner::idle::gate::Verdicts,
    /// The last idle report and when its pods were listed (see `idle_report`).
    idle: std::sync::Mutex<Option<(std::time::Instant, tessera_planner::idle::IdleReport)>>,
    /// When listing pods for the idle report last failed: the next try waits `IDLE_REFRESH`.
    idle_failed: std::sync::Mutex<Option<std::time::Instant>>,
    /// The claim-class binding's or policy's problem last seen (logged when it changes).
    binding_problem: std::sync::Mutex<Option<String>>,
    /// Unbound pods asking for GPU extended resources (`pending_pods`): those made before
    /// their namespace's ResourceQuota are listed for the binding policy.
    pods: Store<Pod>,
    /// Whether the last pass found `pods` not listed (to log the change only).
    pods_unlisted: std::sync::atomic::AtomicBool,
    /// ResourceQuotas deleted here that `rqs` may still show ([`deleted`]).
    deleted: deleted::Deleted,
    /// Until when this replica may write as the leader (the rollout controller's; without
    /// leader election: always). Checked before each write.
    tenure: Arc<crate::leader::Tenure>,
}

/// How often the idle report lists every pod: the agents' activity summaries change every few
/// minutes at most, and a list of every pod each 5 s pass would load the API server.
const IDLE_REFRESH: Duration = Duration::from_secs(60);

/// How long changes are batched before a quota pass; GpuNode changes for longer (see above).
const DEBOUNCE: Duration = Duration::from_millis(100);
const FLEET_DEBOUNCE: Duration = Duration::from_secs(1);

/// What one quota pass reads from the caches ([`QuotaController::observe`]), once at its start.
struct Inputs {
    quotas: Vec<TenantGpuQuota>,
    /// The namespaces not being deleted.
    namespaces: BTreeSet<String>,
    /// The cached ResourceQuotas of the namespaces as they are now, less those deleted here.
    rqs: Vec<ResourceQuota>,
    capacity: Capacity,
    /// The cluster's DeviceClasses: Tessera's are written where they differ.
    classes: Vec<Arc<DeviceClass>>,
    /// Claims, classes, stored params and unbound pods (`pods_unknown`: their cache is not listed).
    dra: DraInputs,
    /// The pass's time, for the conditions it sets.
    now: Time,
}

impl QuotaController {
    /// Starts the quota controller's own caches; it reads the process's shared ones (`caches`:
    /// the GpuNodes, waking on `fleet_changed`, Nodes, claims, slices) and the rollout
    /// controller's verdicts and tenure (`rollout`). `namespace`: the operator's.
    pub(crate) fn start(
        client: Client,
        metrics: Arc<Metrics>,
        caches: &Caches,
        rollout: &Context,
        drivers: GpuDrivers,
        namespace: String,
        admission: AdmissionSettings,
    ) -> Arc<Self> {
        let AdmissionSettings { mode: admission, open } = admission;
        // Woken by the shared quota cache (see `Caches`) and by every cache of its own.
        let changed = caches.quota_changed.clone();
        let d = watcher::Config::default;
        let (gates, gpu_pods) = match admission {
            QuotaAdmission::Params => (kube::runtime::reflector::store().0, kube::runtime::reflector::store().0),
            QuotaAdmission::Gates => (
                start_cache(
                    Api::<tessera_crds::gate::GpuQuotaGate>::all(client.clone()),
                    d(),
                    Cache::always(changed.clone()),
                )
                .0,
                gpu_pods::watch(client.clone(), changed.clone()),
            ),
        };
        Arc::new(Self {
            admission,
            open,
            gates,
            gpu_pods,
            quotas: caches.quotas.clone(),
            // Every ResourceQuota, not only ours: a user's own one with our name must be seen, so
            // it is never adopted by a force-apply.
            // Each keeps its latest `managedFields` time: when its limits came into force.
            rqs: start_cache(
                Api::<ResourceQuota>::all(client.clone()),
                // A quorum read (kube's default, said here): a restart forgets what `deleted`
                // hid, so its list must not come from a watch cache that still shows them.
                d().list_semantic(watcher::ListSemantic::MostRecent),
                Cache { trim: tessera_planner::quota::stamp::trim_managed_fields, ..Cache::always(changed.clone()) },
            )
            .0,
            namespaces: start_cache(Api::<Namespace>::all(client.clone()), d(), Cache::always(changed.clone())).0,
            classes: watch_classes(client.clone(), changed.clone()),
            pods: pending_pods::watch(client.clone(), changed.clone()),
            pods_unlisted: Default::default(),
            deleted: Default::default(),
            gpunodes: caches.gpunodes.clone(),
            drivers,
            policy_params: start_cache(
                Api::<ConfigMap>::namespaced(client.clone(), &namespace),
                d().fields(&format!("metadata.name={}", tessera_planner::quota::claims::POLICY_PARAMS)),
                Cache::always(changed.clone()),
            )
            .0,
            namespace,
            client,
            metrics,
            changed,
            fleet_changed: caches.fleet_changed.clone(),
            dra: caches.dra.clone(),
            nodes: caches.nodes.clone(),
            claims: caches.claims.clone(),
            not_reporting: rollout.memory.not_reporting.clone(),
            idle: Default::default(),
            idle_failed: Default::default(),
            binding_problem: Default::default(),
            // One tenure for both controllers: neither writes once the lease may have passed.
            tenure: rollout.tenure.clone(),
        })
    }

    /// Until the caches every quota reads are listed. Not the DeviceClasses: where they cannot
    /// be listed (RBAC) only the quota passes wait for them ([`Self::run`]); the rollout
    /// controller, which `run.rs` starts after this, does not.
    pub async fn wait_ready(&self) {
        if self.admission == QuotaAdmission::Gates {
            let _ = tokio::join!(self.gates.wait_until_ready(), self.gpu_pods.wait_until_ready());
        }
        let _ = tokio::join!(
            self.quotas.wait_until_ready(),
            self.rqs.wait_until_ready(),
            self.namespaces.wait_until_ready(),
            self.gpunodes.wait_until_ready(),
            self.policy_params.wait_until_ready()
        );
    }

    /// Until the DeviceClasses are listed (at once where `resource.k8s.io/v1` is not served): a
    /// pass blind to them would write no `0` for GPU-reaching classes. Warns every 30 s.
    async fn wait_classes(&self) {
        while tokio::time::timeout(Duration::from_secs(30), self.classes.wait_until_ready()).await.is_err() {
            warn!(
                "DeviceClasses not listed yet (RBAC for deviceclasses.resource.k8s.io?): no quota pass runs until they are"
            );
        }
    }

    /// A while for the unbound pods to be listed before the first pass, no longer: the passes
    /// do not wait for them (a ClusterRole without `watch pods`, after an upgrade, held every
    /// quota pass forever); until they are, `<ns>.pods` are carried (`early_pods::carried`)
    /// and each quota's status says so ([`pending_pods::report_pod_watch`]).
    async fn wait_pods(&self) {
        if tokio::time::timeout(Duration::from_secs(30), self.pods.wait_until_ready()).await.is_err() {
            warn!("unbound pods not listed (RBAC: watch pods?): quota passes go on with the stored <ns>.pods");
        }
    }

    /// Runs quota passes until the future is dropped.
    pub async fn run(self: Arc<Self>) {
        let wakes = vec![(self.changed.clone(), DEBOUNCE), (self.fleet_changed.clone(), FLEET_DEBOUNCE)];
        Loop { wakes, period: Duration::from_secs(5) }.run(&*self).await;
    }

    /// One pass: observe the caches, plan every quota's objects, write those that differ, then
    /// each quota's status. A failed write fails only its part ([`Error::PartialPass`]); once the
    /// lease may have passed to another replica nothing more is written ([`Error::NotLeader`]).
    pub async fn reconcile(&self) -> Result<(), Error> {
        if self.admission == QuotaAdmission::Gates {
            return self.reconcile_gates().await;
        }
        let inputs = self.observe();
        let plan = self.plan(&inputs);
        // The policy's params and Tessera's classes first: they close claims, the keys below count.
        let (shared, stale_params) = self.write_claim_classes(&plan, &inputs.classes).await?;
        let policies = self.check_policies().await;
        let mut failures = writes::Failures::new();
        let unwritten = self.apply_resource_quotas(&inputs, &plan, &mut failures).await?;
        self.delete_stale_resource_quotas(&inputs, &plan, stale_params, &unwritten, &mut failures).await?;
        let idle = self.idle_report(&inputs.quotas).await;
        let reports = writes::Reports { shared: &shared, failures: &failures, policies: &policies, idle: &idle };
        let unsent = self.write_statuses(&inputs, &plan, &reports).await?;
        match shared.len() + failures.values().map(Vec::len).sum::<usize>() + unsent {
            0 => Ok(()),
            n => Err(Error::PartialPass(n)),
        }
    }

    /// The planner's answer for the pass's inputs ([`plan_quotas_dra`]); exports the shortfall.
    fn plan(&self, i: &Inputs) -> QuotaPlan {
        let plan = plan_quotas_dra(&i.quotas, &i.namespaces, &i.rqs, &i.capacity, &i.dra, i.now.clone());
        self.metrics.set_quota_shortfall(&plan.shortfall);
        plan
    }

    /// The quota controller's writes: checked against its tenure (once the leader lease may have
    /// passed to another replica, a deposed leader's stale caches could raise a share the new
    /// leader lowered), failures counted.
    fn writer(&self) -> Writer<'_> {
        Writer::new(&self.client, Some(&self.tenure), &self.metrics)
    }

    /// Allocated versus used now: every pod listed (paged) at most each `IDLE_REFRESH`, placed on
    /// the GpuNodes as `kubectl tessera status` places them, joined with their activity. See
    /// `idle::gate` for when it keeps the last figures (a failed pod list, no verdicts yet) or
    /// clears them (no quota, nothing measured).
    async fn idle_report(&self, quotas: &[TenantGpuQuota]) -> tessera_planner::idle::Outcome {
        use tessera_planner::idle::{Outcome, gate::Gate};
        let fresh = |at: &std::time::Instant| at.elapsed() < IDLE_REFRESH;
        let measured = self.gpunodes.state().iter().any(|g| g.status.as_ref().is_some_and(|s| s.activity.is_some()));
        let verdicts = self.not_reporting.get(k8s_openapi::jiff::Timestamp::now());
        let failed = crate::locked(&self.idle_failed).is_some_and(|at| fresh(&at));
        match tessera_planner::idle::gate::gate(quotas.len(), verdicts.is_some(), measured, failed) {
            Gate::Clear => {
                self.metrics.set_tenant_activity(&Default::default());
                *crate::locked(&self.idle) = None;
                return Outcome::Clear;
            }
            Gate::Keep => return Outcome::Keep,
            Gate::Compute => {}
        }
        let not_reporting = verdicts.unwrap_or_default();
        if let Some((_, r)) = crate::locked(&self.idle).as_ref().filter(|(at, _)| fresh(at)) {
            return Outcome::Report(r.clone());
        }
        let api: Api<Pod> = Api::all(self.client.clone());
        let mut pods = Vec::new();
        // Only pods that can hold a device: bound, not finished.
        let mut lp =
            ListParams::default().fields("spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed").limit(500);
        loop {
            match api.list(&lp).await {
                Ok(page) => {
                    pods.extend(page.items);
                    match page.metadata.continue_.filter(|c| !c.is_empty()) {
                        Some(token) => lp = lp.continue_token(&token),
                        None => break,
                    }
                }
                Err(e) => {
                    self.metrics.error("kube");
                    warn!(error = %e, "could not list pods for the idle report; keeping the last figures");
                    *crate::locked(&self.idle_failed) = Some(std::time::Instant::now());
                    return tessera_planner::idle::Outcome::Keep;
                }
            }
        }
        let gpunodes: Vec<GpuNode> = self.gpunodes.state().iter().map(|g| (**g).clone()).collect();
        let dra = tessera_planner::fleet_status::DeviceIndex {
            claims: self.claims.index(),
            slices: tessera_planner::fleet_status::SliceIndex::new(self.dra.slices().iter().map(|s| &**s)),
        };
        let status = tessera_planner::fleet_status::fleet_status_with(&gpunodes, &[], quotas, &pods, &dra);
        let thresholds = tessera_planner::idle::idle_thresholds(quotas);
        let now = k8s_openapi::jiff::Timestamp::now();
        let report = tessera_planner::idle::idle_report(&status, &gpunodes, &pods, &thresholds, &not_reporting, now);
        self.metrics.set_tenant_activity(&report);
        self.metrics.idle_reported(now.as_second());
        *crate::locked(&self.idle) = Some((std::time::Instant::now(), report.clone()));
        tessera_planner::idle::Outcome::Report(report)
    }

    /// Server-side-applies one ResourceQuota, owned by and labelled for `owner`.
    /// The stamps ([`IN_FORCE_SINCE`], [`IN_FORCE_KEYS`]) go with every apply that has them: one without it would
    /// remove it (server-side apply drops the fields a manager no longer sends).
    /// A failed apply is counted and handed back inside; [`Error::NotLeader`] outside, not sent.
    async fn apply(&self, owner: &TenantGpuQuota, a: &Apply) -> Result<kube::Result<()>, Error> {
        let mut annotations = serde_json::Map::new();
        annotations.insert(QUOTA_NAME_ANNOTATION.into(), json!(a.quota));
        if let Some(t) = &a.in_force_since {
            annotations.insert(IN_FORCE_SINCE.into(), json!(t));
        }
        if let Some(k) = &a.in_force_keys {
            annotations.insert(IN_FORCE_KEYS.into(), json!(k));
        }
        let mut body = json!({
            "apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": a.name, "namespace": a.namespace,
                "labels": {QUOTA_LABEL: quota_label_value(&a.quota), "app.kubernetes.io/managed-by": "tessera"},
                "annotations": annotations,
                "ownerReferences": [owner.controller_owner_ref(&()).expect("a stored object has a name and uid")]},
            "spec": {"hard": a.hard}
        });
        if self.admission == QuotaAdmission::Gates {
            // Held in force through its deletion until the namespace's new limits are (`gates`).
            body["metadata"]["finalizers"] = json!([tessera_crds::gate::IN_FORCE_FINALIZER]);
        }
        self.writer().may_write()?;
        info!(namespace = %a.namespace, quota = %a.quota, name = %a.name, "applying ResourceQuota");
        let api = Api::<ResourceQuota>::namespaced(self.client.clone(), &a.namespace);
        let applied = self.writer().send_counted(&api, &a.name, Write::apply(Manager::Operator, &body)).await?;
        Ok(applied.map(|_| ()))
    }
}

/// The cluster's DeviceClasses, waking `changed` on each change. Where `resource.k8s.io/v1`
/// serves none (before Kubernetes 1.34, or DRA off) no class can exist: the store is ready and
/// empty (enabling DRA later needs a restart, as for the claim cache).
fn watch_classes(client: Client, changed: Arc<Notify>) -> Store<DeviceClass> {
    let cache = Cache {
        trim: |c: &mut DeviceClass| c.metadata.managed_fields = None,
        served: Some(("deviceclasses", "resource.k8s.io/v1 is not served: no DeviceClass to hold at 0")),
        failed: "DeviceClass watch error; retrying with backoff",
        ..Cache::waking(vec![Waker::always(changed)])
    };
    start_cache(Api::<DeviceClass>::all(client), watcher::Config::default(), cache).0
}

/// The quota passes in the shared loop: the first waits for the caches, classes and pods.
impl Passes for QuotaController {
    type Gate = ();
    const FAILED: &'static str = "quota pass failed; retrying";

    async fn ready(&self) {
        self.wait_ready().await;
        self.wait_classes().await;
        self.wait_pods().await;
    }

    fn may_pass(&self, _: &mut ()) -> bool {
        // A leader that has not seen its lease renewed in time skips the pass (see `leader`).
        self.writer().may_write().is_ok()
    }

    async fn pass(&self) -> Result<(), Error> {
        self.reconcile().await
    }

    fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}

/// [`CLAIM_POLICY`] on a quota's status: `True` when every shipped policy and binding was read
/// and enforces, `False` naming what keeps one from reading the operator's params or from
/// enforcing them (the reason says which), `Unknown` naming what could not be read.
fn report_policies(st: &mut TenantGpuQuotaStatus, check: &PolicyCheck, g: Option<i64>, now: &Time) {
    use tessera_crds::conditions::quota_reasons::{BOUND, POLICY_NOT_READABLE};
    let (status, reason, message) = match check {
        PolicyCheck::Enforces => {
            ("True", BOUND, "every shipped admission policy reads the operator's params and enforces them as shipped")
        }
        PolicyCheck::Broken(reason, problem) => ("False", *reason, problem.as_str()),
        PolicyCheck::Unreadable(what) => ("Unknown", POLICY_NOT_READABLE, what.as_str()),
    };
    set_condition_status(&mut st.conditions, CLAIM_POLICY, status, reason, message, g, now.clone());
}

/// Whether `rq` already is what `a` would write (the plan checked that it is this quota's), and
/// carries the finalizer where `held` (gates mode).
fn is_current(rq: &ResourceQuota, a: &Apply, held: bool) -> bool {
    let finalized = rq.metadata.finalizers.iter().flatten().any(|f| f == tessera_crds::gate::IN_FORCE_FINALIZER);
    if held && !finalized {
        return false;
    }
    // An empty `hard` may come back omitted; quantities come back canonical (`1000` as `1k`).
    let empty = BTreeMap::new();
    let h = rq.spec.as_ref().and_then(|s| s.hard.as_ref()).unwrap_or(&empty);
    let same = |q: &str, v: &str| q == v || v.parse().is_ok_and(|n| tessera_planner::quota::quantity::is_exactly(q, n));
    let hard_ok = h.len() == a.hard.len() && a.hard.iter().all(|(k, v)| h.get(k).is_some_and(|q| same(&q.0, v)));
    let annotation = |k: &str| rq.metadata.annotations.as_ref().and_then(|m| m.get(k));
    let annotated = annotation(QUOTA_NAME_ANNOTATION) == Some(&a.quota);
    // Exactly as planned: a valid cached stamp is always carried, so one planned away (a scoped
    // ResourceQuota, `stamp::planned_both`) or not the operator's is to remove.
    let stamped = annotation(IN_FORCE_SINCE) == a.in_force_since.as_ref();
    let keyed = annotation(IN_FORCE_KEYS) == a.in_force_keys.as_ref();
    hard_ok && annotated && stamped && keyed
}

#[cfg(test)]
pub(crate) mod test_support;
#[cfg(test)]
mod tests;
