//! `make bench`: the operator's own cost per node reconfigured. Starts the real control plane,
//! creates N kwok nodes, stands in for N zero-latency node agents with one in-process emulator,
//! runs the release `tessera-operator` as a process, applies one plan over every node and waits
//! until it is Ready. Reports the operator's CPU time (from /proc), the requests it sent (its own
//! counter), wall time and peak RSS.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tessera_crds::solver::{self, ProfileCounts};
use tessera_crds::{GpuNode, GpuPartitionPlan, catalog};
use tessera_e2e::bench::{load, metric, operator_binary, output_dir, proc_stat, start_operator};
use tessera_e2e::fixtures::{apply_file, install_crds, wait_for};
use tessera_e2e::process::Component;
use tessera_e2e::{ControlPlane, Identity};
use tokio::task::JoinHandle;

/// One fleet size's figures.
struct Row {
    nodes: usize,
    wall: f64,
    cpu: f64,
    requests: f64,
    rss_mib: f64,
    passes: f64,
    load: f64,
    /// The emulated agents' lease renewals per second of the rollout (not the operator's).
    lease_writes_per_s: f64,
}

impl Row {
    fn markdown(&self) -> String {
        let n = self.nodes as f64;
        format!(
            "| {} | {:.1} | {:.2} | {:.2} | {:.0} | {:.1} | {:.0} | {:.3} | {:.0} | {:.1} | {:.1} |",
            self.nodes,
            self.wall,
            self.cpu,
            self.cpu * 1000.0 / n,
            self.requests,
            self.requests / n,
            self.rss_mib,
            self.rss_mib / n,
            self.passes,
            self.load,
            self.lease_writes_per_s
        )
    }
}

const HEADER: &str = "| nodes | wall s | operator CPU s | CPU ms / node | API requests | requests / node | peak RSS MiB | RSS MiB / node | passes | load (1 min) | agent lease writes / s |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|";

/// How the emulated agents renew their heartbeat Leases, as the node agent does (a lease of
/// `duration`, renewed every quarter of it, the first renewal at start). The duration is
/// lengthened with the fleet as the bench lengthens kwok's node leases (see `start_cluster`): at
/// `n/5` s (at least the agent's default 40 s) the renewals are 20 writes/s at any size, a load
/// next to the rollout's that the bench counts apart from the operator's.
///
/// `BENCH_LEASES=once` instead renews each lease once, just after the operator starts, with
/// leases of an hour: no renewal during the rollout, the load of the bench before its agents
/// renewed, for comparing figures measured then.
#[derive(Clone, Copy)]
struct Heartbeat {
    duration: Duration,
    /// Renewed as agents do (else once, after the operator starts).
    renewing: bool,
}

impl Heartbeat {
    fn for_fleet(n: usize) -> Self {
        if std::env::var("BENCH_LEASES").is_ok_and(|v| v == "once") {
            return Heartbeat { duration: Duration::from_secs(3600), renewing: false };
        }
        let seconds = (n / 5).max(DEFAULT_AGENT_LEASE_SECONDS as usize) as u64;
        Heartbeat { duration: Duration::from_secs(seconds), renewing: true }
    }

    /// Every lease is renewed within this long of any instant.
    fn period(self) -> Duration {
        self.duration / 4
    }
}

/// The node agent's default `--lease-duration-seconds`.
const DEFAULT_AGENT_LEASE_SECONDS: u64 = 40;

/// The emulated agents' lease writes, counted apart from the operator's requests.
#[derive(Default)]
struct Renewals {
    writes: AtomicU64,
    failed: AtomicU64,
}

/// Writes `node`'s heartbeat Lease renewed now, as the agent does (server-side apply as the
/// agent's field manager).
async fn renew(leases: &Api<Lease>, node: &str, heartbeat: Heartbeat) -> kube::Result<()> {
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": node},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": heartbeat.duration.as_secs(),
                 "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now())}});
    leases.patch(node, &PatchParams::apply("tessera-node-agent").force(), &Patch::Apply(&lease)).await.map(|_| ())
}

/// Renews every node's lease once per heartbeat period, spread evenly over it (an agent's
/// renewals are not in step with the others'), until aborted.
fn keep_renewing(
    leases: Api<Lease>,
    nodes: Vec<String>,
    heartbeat: Heartbeat,
    renewals: Arc<Renewals>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let gap = heartbeat.period() / nodes.len().max(1) as u32;
        let mut tick = tokio::time::interval(gap.max(Duration::from_millis(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for node in nodes.iter().cycle() {
            tick.tick().await;
            let (leases, node, renewals) = (leases.clone(), node.clone(), renewals.clone());
            // Each write on its own task, so a slow reply does not delay the next agent's.
            tokio::spawn(async move {
                let counter = match renew(&leases, &node, heartbeat).await {
                    Ok(()) => &renewals.writes,
                    Err(_) => &renewals.failed,
                };
                counter.fetch_add(1, Ordering::Relaxed);
            });
        }
    })
}

/// Plays every node agent at zero latency: registers inventory and a heartbeat Lease, renews the
/// leases as agents do (see [`Heartbeat`]), then reports each new intent as applied at once
/// (instances placed by the solver). Returns the tasks, to be aborted with the control plane.
async fn emulate_agents(
    client: Client,
    nodes: Vec<String>,
    heartbeat: Heartbeat,
    renewals: Arc<Renewals>,
) -> Vec<JoinHandle<()>> {
    let api: Api<GpuNode> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), tessera_crds::gpunode::AGENT_LEASE_NAMESPACE);
    futures::stream::iter(nodes.clone())
        .for_each_concurrent(32, |n| {
            let api = api.clone();
            let leases = leases.clone();
            async move {
                renew(&leases, &n, heartbeat).await.unwrap();
                let body = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "metadata": {"name": n}, "spec": {}});
                api.patch(&n, &PatchParams::apply("tessera-node-agent"), &Patch::Apply(&body)).await.unwrap();
                let st = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "status": {"gpus": [
                    {"index": 0, "uuid": format!("GPU-{n}"), "product": "NVIDIA H100 80GB HBM3", "migCapable": true}]}});
                api.patch_status(&n, &PatchParams::apply("tessera-node-agent").force(), &Patch::Apply(&st)).await.unwrap();
            }
        })
        .await;
    let renewing = match heartbeat.renewing {
        true => keep_renewing(leases, nodes, heartbeat, renewals),
        false => tokio::spawn(async {}),
    };
    let reporting = tokio::spawn(async move {
        let model = catalog::lookup("H100-80GB").unwrap();
        let stream = watcher(api.clone(), watcher::Config::default()).applied_objects();
        futures::pin_mut!(stream);
        while let Ok(Some(gn)) = stream.try_next().await {
            let generation = gn.metadata.generation;
            let done = gn.status.as_ref().and_then(|s| s.observed_generation) == generation;
            if done || gn.spec.gpus.is_empty() {
                continue;
            }
            let gpus: Vec<_> = gn
                .spec
                .gpus
                .iter()
                .map(|g| {
                    let req: ProfileCounts = g.profiles.iter().map(|(k, v)| (k.clone(), *v as u32)).collect();
                    let inst: Vec<_> = solver::fit(model, &req)
                        .unwrap_or_default()
                        .iter()
                        .map(|p| json!({"profile": p.profile, "start": p.start, "size": p.size}))
                        .collect();
                    json!({"index": g.index, "uuid": format!("GPU-{}", gn.name_any()), "product": "NVIDIA H100 80GB HBM3",
                           "migCapable": true, "migEnabled": g.mig_enabled, "instances": inst})
                })
                .collect();
            let st = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "status": {
                "observedGeneration": generation, "gpus": gpus,
                "conditions": [{"type": "Ready", "status": "True", "reason": "Applied", "message": "emulated",
                                "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": generation}]}});
            let _ = api
                .patch_status(&gn.name_any(), &PatchParams::apply("tessera-node-agent").force(), &Patch::Apply(&st))
                .await;
        }
    });
    vec![renewing, reporting]
}

/// `BENCH_LEASES=once`: every lease renewed once, 32 at a time.
async fn renew_all_once(admin: &Client, names: &[String], heartbeat: Heartbeat) {
    let leases: Api<Lease> = Api::namespaced(admin.clone(), tessera_crds::gpunode::AGENT_LEASE_NAMESPACE);
    futures::stream::iter(names)
        .for_each_concurrent(32, |n| {
            let leases = leases.clone();
            async move {
                let _ = renew(&leases, n, heartbeat).await;
            }
        })
        .await;
}

/// The emulator's tasks, aborted when the bench of one size ends, however it ends.
struct Aborting(Vec<JoinHandle<()>>);

impl Drop for Aborting {
    fn drop(&mut self) {
        self.0.iter().for_each(JoinHandle::abort);
    }
}

/// The operator starts no node whose agent it has not seen renew its lease (an agent first seen
/// is unproven): waits until each of the `n` leases has renewed since `since` (the operator's
/// start), however long a loaded machine makes a renewal cycle, then 2 s more for a pass.
async fn wait_renewed_since(
    admin: &Client,
    n: usize,
    since: k8s_openapi::jiff::Timestamp,
    heartbeat: Heartbeat,
) -> anyhow::Result<()> {
    let leases: Api<Lease> = Api::namespaced(admin.clone(), tessera_crds::gpunode::AGENT_LEASE_NAMESPACE);
    let waited = Instant::now();
    wait_for(
        "every agent lease renewed since the operator started",
        heartbeat.period() * 4 + Duration::from_secs(60),
        || async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let list = leases.list(&Default::default()).await.ok()?.items;
            let renewed = list
                .iter()
                .filter(|l| l.spec.as_ref().and_then(|s| s.renew_time.as_ref()).is_some_and(|t| t.0 > since));
            (renewed.count() >= n).then_some(())
        },
    )
    .await?;
    tessera_e2e::tell!(
        "{n} nodes: every agent lease renewed since the operator started, {:.0} s after it was ready",
        waited.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(())
}

/// One fleet size: a fresh control plane with `n` settled kwok nodes, the operator started on
/// it, then one plan rolled out over every node; the operator's cost measured around the rollout.
async fn bench(n: usize, operator: &std::path::Path) -> anyhow::Result<Row> {
    let cp = start_cluster(n).await?;
    let admin = cp.client(Identity::Admin).await?;
    install_crds(&admin).await?;
    for f in ["config/base/namespace.yaml", "config/rbac/node-agent.yaml", "config/rbac/operator.yaml"] {
        apply_file(&admin, f).await?;
    }
    let names: Vec<String> = (0..n).map(|i| format!("gpu-{i:04}")).collect();
    create_nodes(&admin, &names).await;
    let (heartbeat, renewals) = (Heartbeat::for_fleet(n), Arc::new(Renewals::default()));
    let _agents = Aborting(emulate_agents(admin.clone(), names.clone(), heartbeat, renewals.clone()).await);
    wait_settled(&admin, n).await?;

    let operator_started = k8s_openapi::jiff::Timestamp::now();
    let (mut op, port) = start_operator(&cp, operator, &[]).await?;
    if !heartbeat.renewing {
        renew_all_once(&admin, &names, heartbeat).await;
    }
    wait_renewed_since(&admin, n, operator_started, heartbeat).await?;
    let cpu0 = idle_cost(&op, port, n).await;
    let before = Counters::read(port);
    let renewed_before = renewals.writes.load(Ordering::Relaxed);
    let started = Instant::now();
    roll_out(&admin, n).await?;
    let wall = started.elapsed().as_secs_f64();
    let (cpu1, hwm) = proc_stat(op.pid());
    let after = Counters::read(port);
    let lease_writes = renewals.writes.load(Ordering::Relaxed) - renewed_before;
    tessera_e2e::tell!(
        "{n} nodes: the emulated agents renewed {lease_writes} leases during the rollout ({:.1}/s, \
         {} s leases; not in the operator's figures), {} renewal(s) failed in the whole run",
        lease_writes as f64 / wall,
        heartbeat.duration.as_secs(),
        renewals.failed.load(Ordering::Relaxed)
    );
    tessera_e2e::tell!(
        "{n} nodes: {} node-passes waited for the caches to show the operator's own writes",
        after.behind - before.behind
    );
    let (planned, reused) = (after.planned - before.planned, after.reused - before.reused);
    tessera_e2e::tell!(
        "{n} nodes: {planned} node-passes planned in full, {reused} reused from the pass before ({:.1} planned per node)",
        planned / n as f64
    );
    op.stop_now();
    Ok(Row {
        nodes: n,
        wall,
        cpu: cpu1 - cpu0,
        requests: after.requests - before.requests,
        rss_mib: hwm as f64 / 1024.0,
        passes: after.passes - before.passes,
        load: load(),
        lease_writes_per_s: lease_writes as f64 / wall,
    })
}

/// The control plane for `n` nodes, its node leases lengthened so heartbeats stay a small load.
async fn start_cluster(n: usize) -> anyhow::Result<ControlPlane> {
    // kwok renews each node's lease every quarter of its duration: 1,000 nodes at the kubelet's
    // 40 s send 100 writes/s, as much as the rollout itself on this machine's API server. The
    // bench measures the operator, so leases last n/5 s (at least 40): 20 writes/s at any size.
    let lease = (n / 5).max(tessera_e2e::controlplane::DEFAULT_NODE_LEASE_SECONDS as usize) as u32;
    Ok(ControlPlane::start_with_node_leases(lease).await?)
}

/// Creates the kwok nodes `names`, 32 at a time, in the pool the bench plan selects.
async fn create_nodes(admin: &Client, names: &[String]) {
    let nodes: Api<Node> = Api::all(admin.clone());
    futures::stream::iter(names.to_vec())
        .for_each_concurrent(32, |name| {
            let nodes = nodes.clone();
            async move {
                let node: Node = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": {"pool": "bench", "tessera.dev/kwok": "true"},
                                 "annotations": {"kwok.x-k8s.io/node": "fake"}}}))
                .unwrap();
                nodes.create(&PostParams::default(), &node).await.unwrap();
            }
        })
        .await;
}

/// Waits until all `n` nodes are listed and none is tainted.
async fn wait_settled(admin: &Client, n: usize) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(admin.clone());
    // Measured on a settled cluster: new nodes carry the not-ready taint until the node
    // lifecycle controller sees kwok's first heartbeat and removes it, one node at a time.
    let settled = Instant::now();
    wait_for("every node untainted", Duration::from_secs(1200), || async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let list = nodes.list(&Default::default()).await.ok()?.items;
        let tainted =
            list.iter().filter(|n| n.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|t| !t.is_empty()));
        (list.len() == n && tainted.count() == 0).then_some(())
    })
    .await?;
    tessera_e2e::tell!("{n} nodes: the cluster settled in {:.0} s", settled.elapsed().as_secs_f64());
    Ok(())
}

/// Tells the operator's cost with nothing to do (watch traffic, periodic passes) over 5 s: part
/// of every rollout's CPU, and most of it for a small fleet. Returns its CPU seconds at the end.
async fn idle_cost(op: &Component, port: u16, n: usize) -> f64 {
    let (idle0, _) = proc_stat(op.pid());
    let idle_passes = metric(port, "tessera_operator_reconciles_total");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (cpu0, _) = proc_stat(op.pid());
    let idle_passes = metric(port, "tessera_operator_reconciles_total") - idle_passes;
    tessera_e2e::tell!(
        "{n} nodes at rest: {:.1} ms of operator CPU per second, {idle_passes} passes in 5 s",
        (cpu0 - idle0) * 1000.0 / 5.0
    );
    cpu0
}

/// The operator's own counters at one moment; the bench reports their growth over a rollout.
struct Counters {
    requests: f64,
    passes: f64,
    behind: f64,
    planned: f64,
    reused: f64,
}

impl Counters {
    /// Reads every counter from the operator's /metrics on `port`.
    fn read(port: u16) -> Self {
        Counters {
            requests: metric(port, "tessera_operator_api_requests_total"),
            passes: metric(port, "tessera_operator_reconciles_total"),
            behind: metric(port, "tessera_operator_nodes_cache_behind_total"),
            planned: metric(port, "tessera_operator_nodes_planned_total"),
            reused: metric(port, "tessera_operator_nodes_reused_total"),
        }
    }
}

/// Creates the bench plan over every node (`maxUnavailable` 10%) and waits until it is Ready
/// with all `n` nodes updated.
async fn roll_out(admin: &Client, n: usize) -> anyhow::Result<()> {
    let plan: GpuPartitionPlan =
        serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan",
        "metadata": {"name": "bench"}, "spec": {"nodeSelector": {"matchLabels": {"pool": "bench"}},
        "layouts": [{"gpuProduct": "H100-80GB", "profiles": {"3g.40gb": 2}}],
        "rollout": {"maxUnavailable": "10%"}}}))?;
    let plans: Api<GpuPartitionPlan> = Api::all(admin.clone());
    plans.create(&PostParams::default(), &plan).await?;
    wait_for("plan Ready", Duration::from_secs(1800), || async {
        let st = plans.get("bench").await.ok()?.status?;
        (st.updated_nodes as usize == n
            && st.in_progress_nodes == 0
            && st.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        .then_some(())
    })
    .await?;
    Ok(())
}

/// The table and the plot, next to each other under `dir` (`BENCH_OUT`, default `docs/bench`).
fn write_results(dir: &std::path::Path, rows: &[Row]) -> anyhow::Result<()> {
    use tessera_e2e::plot::{Series, svg};
    std::fs::create_dir_all(dir)?;
    let table: Vec<String> = rows.iter().map(Row::markdown).collect();
    std::fs::write(dir.join("rollout-cost.md"), format!("{HEADER}\n{}\n", table.join("\n")))?;
    let cpu = Series {
        title: "operator CPU ms per node",
        points: rows.iter().map(|r| (r.nodes as f64, r.cpu * 1000.0 / r.nodes as f64)).collect(),
    };
    let wall = Series {
        title: "wall time s (maxUnavailable 10%)",
        points: rows.iter().map(|r| (r.nodes as f64, r.wall)).collect(),
    };
    let rss = Series { title: "peak RSS MiB", points: rows.iter().map(|r| (r.nodes as f64, r.rss_mib)).collect() };
    let plot = svg("Rollout of one plan over N kwok nodes (make bench)", "nodes (log scale)", &[cpu, wall, rss]);
    std::fs::write(dir.join("rollout-cost.svg"), plot)?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let sizes: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() { vec![100, 1000] } else { sizes };
    let (operator, out) = (operator_binary()?, output_dir());
    tessera_e2e::say!("{HEADER}");
    let mut rows = Vec::new();
    for n in sizes {
        let row = bench(n, &operator).await?;
        tessera_e2e::say!("{}", row.markdown());
        rows.push(row);
    }
    write_results(&out, &rows)?;
    tessera_e2e::say!("table and plot written to {}/rollout-cost.{{md,svg}}", out.display());
    Ok(())
}
