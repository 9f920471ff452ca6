//! `tessera-operator run`: caches, leader election, the control loop, and the probe/metrics
//! endpoint. Followers keep their caches warm and take over as soon as the lease is theirs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::controller;
use crate::metrics::Metrics;
use crate::quota_controller::QuotaController;

/// The leader Lease, in `--lease-namespace`.
const LEASE_NAME: &str = "tessera-operator";

pub struct RunOptions {
    pub listen: String,
    pub leader_elect: bool,
    pub lease_namespace: String,
    pub identity: String,
    /// `--gpu-dra-drivers`: whose ResourceClaim allocations are GPUs.
    pub gpu_drivers: tessera_planner::dra::GpuDrivers,
    /// `--quota-admission`.
    pub quota_admission: crate::quota_controller::QuotaAdmission,
    /// `--gpu-open-namespaces` (gates mode).
    pub gpu_open_namespaces: tessera_planner::quota::gates::open::OpenNamespaces,
}

pub async fn run(opts: RunOptions) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::default());
    let (client, evict_client) = clients(&metrics).await?;
    let ready = serve_probes(&opts.listen, &metrics).await?;
    let controllers = Controllers::start(&opts, client.clone(), evict_client, &metrics).await;
    controllers.wait_synced().await;
    ready.store(true, Ordering::Relaxed);
    info!("caches synced");
    if !opts.leader_elect {
        controllers.run_until_interrupted().await;
        return Ok(());
    }
    controllers.lead_while_elected(&opts, client, &metrics).await
}

/// The API clients, every request of both counted: one with kube's retries, and one without
/// for evictions (see `Context::evict_client`).
async fn clients(metrics: &Arc<Metrics>) -> anyhow::Result<(Client, Client)> {
    let config = kube::Config::infer().await?;
    let client = counted_client(config.clone(), metrics)?;
    let mut no_retry = config;
    no_retry.default_retry = false;
    let evict_client = counted_client(no_retry, metrics)?;
    Ok((client, evict_client))
}

/// Serves /livez, /readyz and /metrics on `listen`; returns the flag /readyz answers from.
async fn serve_probes(listen: &str, metrics: &Arc<Metrics>) -> anyhow::Result<Arc<AtomicBool>> {
    let ready = Arc::new(AtomicBool::new(false));
    let listener = tokio::net::TcpListener::bind(listen).await?;
    info!(addr = %listen, "serving /livez, /readyz, /metrics");
    tokio::spawn(crate::server::serve(listener, ready.clone(), metrics.clone()));
    Ok(ready)
}

/// The rollout and quota controllers over their caches, and the GPU DRA drivers' slices both read.
struct Controllers {
    rollout: Arc<controller::Context>,
    /// What wakes the rollout's passes.
    changed: Arc<Notify>,
    quotas: Arc<QuotaController>,
    dra: Arc<controller::dra::DraWatch>,
}

/// The controllers' loops while this replica leads.
struct Worker {
    rollout: JoinHandle<()>,
    quotas: JoinHandle<()>,
}

impl Controllers {
    /// Starts the fleet's caches once, and both controllers over them.
    async fn start(opts: &RunOptions, client: Client, evict_client: Client, metrics: &Arc<Metrics>) -> Self {
        let caches = controller::Caches::start(&client, opts.gpu_drivers.clone());
        let ctx = controller::start(client.clone(), evict_client, metrics.clone(), opts.identity.clone(), &caches);
        let quotas = QuotaController::start(
            client,
            metrics.clone(),
            &caches,
            &ctx,
            opts.gpu_drivers.clone(),
            opts.lease_namespace.clone(),
            crate::quota_controller::AdmissionSettings {
                mode: opts.quota_admission,
                open: opts.gpu_open_namespaces.clone(),
            },
        );
        Self { rollout: ctx, changed: caches.changed, quotas, dra: caches.dra }
    }

    /// Waits until every cache has listed what it watches.
    async fn wait_synced(&self) {
        self.rollout.wait_ready().await;
        self.quotas.wait_ready().await;
        // As with the claims: no pass runs on an empty slice cache that may not be empty (a
        // DynamicMIG node would be drained and carved). A cluster without the API is ready at once.
        while tokio::time::timeout(std::time::Duration::from_secs(30), self.dra.wait_ready()).await.is_err() {
            warn!("ResourceSlices not listed yet (is list/watch of resourceslices allowed?); rollouts wait for them");
        }
    }

    /// Without leader election: runs both controllers until Ctrl-C.
    async fn run_until_interrupted(&self) {
        tokio::select! {
            _ = self.rollout.clone().run(self.changed.clone()) => {}
            _ = self.quotas.clone().run() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }

    /// Runs both controllers whenever this replica holds the leader Lease, until Ctrl-C or the
    /// lease watch ends.
    async fn lead_while_elected(&self, opts: &RunOptions, client: Client, metrics: &Metrics) -> anyhow::Result<()> {
        // Before the lease can be ours: no write until our renewal is seen (see `leader`).
        crate::leader::follow(
            kube::Api::namespaced(client.clone(), &opts.lease_namespace),
            LEASE_NAME,
            opts.identity.clone(),
            self.rollout.tenure.clone(),
        );
        let manager = LeaseManagerBuilder::new(client, LEASE_NAME)
            .with_namespace(&opts.lease_namespace)
            .with_identity(&opts.identity)
            .with_duration(crate::leader::LEASE_SECONDS)
            .with_grace(crate::leader::RENEW_BEFORE_SECONDS)
            .build()
            .await?;
        let (mut leader, lease_task) = manager.watch().await;
        let mut worker: Option<Worker> = None;
        loop {
            let is_leader = *leader.borrow_and_update();
            match (is_leader, worker.is_some()) {
                (true, false) => {
                    info!(identity = %opts.identity, "became leader");
                    worker = Some(self.spawn());
                }
                (false, true) => {
                    warn!("lost the lease; stopping");
                    if let Some(w) = worker.take() {
                        self.step_down(w, metrics).await;
                    }
                }
                _ => {}
            }
            tokio::select! {
                r = leader.changed() => if r.is_err() { break },
                _ = tokio::signal::ctrl_c() => break,
            }
        }
        if let Some(w) = worker.take() {
            w.rollout.abort();
            w.quotas.abort();
        }
        drop(leader);
        let _ = lease_task.await;
        Ok(())
    }

    /// Starts both controllers' loops, on becoming the leader.
    fn spawn(&self) -> Worker {
        let rollout = tokio::spawn(self.rollout.clone().run(self.changed.clone()));
        Worker { rollout, quotas: tokio::spawn(self.quotas.clone().run()) }
    }

    /// On losing the lease: stops both loops and forgets what only a leader keeps.
    async fn step_down(&self, worker: Worker, metrics: &Metrics) {
        worker.rollout.abort();
        worker.quotas.abort();
        // An abort lands at the task's next await: a pass between its last await and its metric
        // writes would export tenant series after they were forgotten (a follower's frozen idle
        // series keeps an alert firing), so wait for both.
        let _ = worker.rollout.await;
        let _ = worker.quotas.await;
        metrics.forget_leader_state();
        // What the passes kept (the fleet's objects among it) goes too: a follower would hold it
        // for nothing, and a leader again starts from the caches.
        self.rollout.forget_passes();
    }
}

/// A client whose every request increments `tessera_operator_api_requests_total`, and each
/// but a GET (a read, a list or a watch) `tessera_operator_api_writes_total`.
fn counted_client(config: kube::Config, metrics: &Arc<Metrics>) -> anyhow::Result<Client> {
    let (requests, writes) = (metrics.api_requests.clone(), metrics.api_writes.clone());
    let layer = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        requests.inc();
        if req.method() != http::Method::GET {
            writes.inc();
        }
        req
    });
    Ok(kube::client::ClientBuilder::try_from(config)?.with_layer(&layer).build())
}
