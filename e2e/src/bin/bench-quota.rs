//! The quota controller in gates mode at scale (`make bench`): N tenant namespaces (default
//! 10,000) under Q TenantGpuQuotas (default 1,000; half by name, half by `namespaceSelector`, one
//! in ten with `allocation: ResourceClaims`), on a real control plane. Reports the time until
//! every namespace has its gate and is labelled `tenant`, the operator's CPU and peak memory, its
//! writes per pass at rest, its writes for one namespace change (a namespace no quota claims; one
//! that joins a quota), and the size of the largest object of each kind it writes, which must not
//! grow with the number of namespaces. `bench-quota [NAMESPACES [QUOTAS]]`; the table goes to
//! `$BENCH_OUT/quota-gates.md` (default `docs/bench`). Exits non-zero when a pass at rest writes.

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tessera_crds::TenantGpuQuota;
use tessera_crds::gate::{GpuClassList, GpuQuotaGate};
use tessera_e2e::bench::{load, metric, operator_binary, output_dir, proc_stat, start_operator};
use tessera_e2e::fixtures::{apply_file, install_crds};
use tessera_e2e::{ControlPlane, Identity};

const TEAM: &str = "bench.tessera.dev/team";
const MARK: &str = "tessera.dev/gpu-gate";
const HEADER: &str = "| namespaces | quotas | until every gate s | until every tenant s | CPU s | peak RSS MiB | \
                      writes / pass at rest | writes: unclaimed namespace | writes: namespace joins a quota | \
                      largest gate B | largest ResourceQuota B | class list B | largest quota B | load |\n\
                      |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|";

fn team(j: usize) -> String {
    format!("q{j:04}")
}

/// Namespace `i` of `n`, spread over `q` quotas: `t<i>` of quota `i % q`.
fn namespace(i: usize) -> String {
    format!("t{i:05}")
}

async fn create_namespaces(admin: &Client, names: Vec<(String, String)>) {
    let api: Api<Namespace> = Api::all(admin.clone());
    futures::stream::iter(names)
        .for_each_concurrent(32, |(name, team)| {
            let api = api.clone();
            async move {
                let ns: Namespace =
                    serde_json::from_value(json!({"metadata": {"name": name, "labels": {TEAM: team}}})).unwrap();
                api.create(&PostParams::default(), &ns).await.unwrap();
            }
        })
        .await;
}

/// Quota `j`: even ones select their namespaces by label, odd ones name them; one in ten
/// allocates through ResourceClaims.
fn quota(j: usize, n: usize, q: usize) -> TenantGpuQuota {
    let mut spec = json!({"hard": {"nvidia.com/gpu": 8, "nvidia.com/mig-1g.10gb": 20}});
    if j.is_multiple_of(2) {
        spec["namespaceSelector"] = json!({"matchLabels": {TEAM: team(j)}});
    } else {
        spec["namespaces"] = json!((j..n).step_by(q).map(namespace).collect::<Vec<_>>());
    }
    if j.is_multiple_of(10) {
        spec["allocation"] = json!("ResourceClaims");
    }
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": team(j)}, "spec": spec}))
    .unwrap()
}

/// The serialized size of the largest of `objects` as the API server stores it (less
/// `managedFields`, which the server adds).
fn largest<K: serde::Serialize + kube::Resource>(objects: impl IntoIterator<Item = K>) -> usize {
    let sized = objects.into_iter().map(|mut o| {
        o.meta_mut().managed_fields = None;
        let name =
            format!("{}/{}", o.meta().namespace.clone().unwrap_or_default(), o.meta().name.clone().unwrap_or_default());
        (serde_json::to_vec(&o).map(|v| v.len()).unwrap_or(0), name)
    });
    let (size, name) = sized.max().unwrap_or_default();
    tessera_e2e::tell!("largest {}: {name}, {size} B", std::any::type_name::<K>().rsplit("::").next().unwrap_or("?"));
    size
}

/// Waits until every bench namespace (`TEAM` label) has a gate and is labelled `tenant`; returns
/// the seconds until each, from `started`.
async fn wait_converged(admin: &Client, n: usize, started: Instant) -> anyhow::Result<(f64, f64)> {
    let gates: Api<GpuQuotaGate> = Api::all(admin.clone());
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let tenant = ListParams::default().labels(&format!("{TEAM},{MARK}=tenant"));
    let (mut gated, mut tenants) = (None, None);
    while gated.is_none() || tenants.is_none() {
        anyhow::ensure!(started.elapsed() < Duration::from_secs(3600), "not converged within an hour");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let have_gates = gates.list_metadata(&ListParams::default()).await.map(|l| l.items.len()).unwrap_or(0);
        if gated.is_none() && have_gates >= n {
            gated = Some(started.elapsed().as_secs_f64());
        }
        let have = namespaces.list_metadata(&tenant).await.map(|l| l.items.len()).unwrap_or(0);
        tessera_e2e::tell!(
            "{:.0} s: {have_gates} gates, {have} of {n} namespaces a tenant's",
            started.elapsed().as_secs_f64()
        );
        if tenants.is_none() && have >= n {
            tenants = Some(started.elapsed().as_secs_f64());
        }
    }
    Ok((gated.unwrap_or_default(), tenants.unwrap_or_default()))
}

/// How long the bench watches the operator at rest (`BENCH_REST_SECONDS`, default 30): several
/// periodic passes (every 5 s). The quiet that ends a change's count is a third of it.
fn rest() -> Duration {
    let s = std::env::var("BENCH_REST_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    Duration::from_secs(s)
}

/// The operator's writes for `change`: counted from before it is made until `seen` says its
/// effect is in the cluster and then no write for a third of [`rest`] (at most 10 minutes: a
/// pass at 10,000 namespaces takes seconds, so the quiet alone would end the count too soon).
async fn writes_for<S, Fut>(port: u16, change: impl std::future::Future<Output = ()>, mut seen: S) -> f64
where
    S: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let before = metric(port, "tessera_operator_api_writes_total");
    change.await;
    let deadline = Instant::now() + Duration::from_secs(600);
    while !seen().await {
        if Instant::now() > deadline {
            tessera_e2e::tell!("the change's effect not seen within 10 minutes: its writes are not counted");
            return f64::NAN;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (mut last, mut quiet) = (metric(port, "tessera_operator_api_writes_total"), Instant::now());
    while quiet.elapsed() < rest() / 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = metric(port, "tessera_operator_api_writes_total");
        if now != last {
            (last, quiet) = (now, Instant::now());
        }
    }
    last - before
}

/// Whether namespace `ns` is labelled `mark`.
async fn marked(namespaces: &Api<Namespace>, ns: &str, mark: &str) -> bool {
    let got = namespaces.get_opt(ns).await.ok().flatten();
    got.is_some_and(|n| n.labels().get(MARK).map(String::as_str) == Some(mark))
}

struct Row {
    namespaces: usize,
    quotas: usize,
    until_gated: f64,
    until_tenant: f64,
    cpu: f64,
    rss_mib: f64,
    writes_per_pass_at_rest: f64,
    writes_unclaimed: f64,
    writes_joining: f64,
    largest_gate: usize,
    largest_rq: usize,
    class_list: usize,
    largest_quota: usize,
    load: f64,
}

impl Row {
    fn markdown(&self) -> String {
        format!(
            "| {} | {} | {:.0} | {:.0} | {:.1} | {:.0} | {:.2} | {:.0} | {:.0} | {} | {} | {} | {} | {:.1} |",
            self.namespaces,
            self.quotas,
            self.until_gated,
            self.until_tenant,
            self.cpu,
            self.rss_mib,
            self.writes_per_pass_at_rest,
            self.writes_unclaimed,
            self.writes_joining,
            self.largest_gate,
            self.largest_rq,
            self.class_list,
            self.largest_quota,
            self.load
        )
    }
}

async fn bench(n: usize, q: usize, operator: &std::path::Path) -> anyhow::Result<Row> {
    let cp = ControlPlane::start().await?;
    let admin = cp.client(Identity::Admin).await?;
    install_crds(&admin).await?;
    for f in ["config/base/namespace.yaml", "config/rbac/operator.yaml", "config/rbac/quota-gates.yaml"] {
        apply_file(&admin, f).await?;
    }
    let made = Instant::now();
    create_namespaces(&admin, (0..n).map(|i| (namespace(i), team(i % q))).collect()).await;
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    for j in 0..q {
        quotas.create(&PostParams::default(), &quota(j, n, q)).await?;
    }
    tessera_e2e::tell!("{n} namespaces and {q} quotas made in {:.0} s", made.elapsed().as_secs_f64());

    let started = Instant::now();
    let (mut op, port) = start_operator(&cp, operator, &["--quota-admission=gates"]).await?;
    let (until_gated, until_tenant) = wait_converged(&admin, n, started).await?;
    let (cpu, _) = proc_stat(op.pid());

    // At rest: the periodic passes (every 5 s) write nothing.
    writes_for(port, async {}, || async { true }).await;
    let (writes0, passes0) =
        (metric(port, "tessera_operator_api_writes_total"), metric(port, "tessera_operator_reconciles_total"));
    tokio::time::sleep(rest()).await;
    let writes = metric(port, "tessera_operator_api_writes_total") - writes0;
    let passes = metric(port, "tessera_operator_reconciles_total") - passes0;
    let writes_per_pass_at_rest = writes / passes.max(1.0);
    tessera_e2e::tell!("at rest: {writes} writes in {passes} passes over {:?}", rest());

    // One namespace no quota claims (labelled closed), then one that joins quota q0000 (its
    // gate, its ResourceQuota, two labels, the quota's status, and the Even share of each of
    // the quota's other namespaces lowered).
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let unclaimed = create_namespaces(&admin, vec![("unclaimed".into(), "none".into())]);
    let writes_unclaimed = writes_for(port, unclaimed, || marked(&namespaces, "unclaimed", "closed")).await;
    let joins = create_namespaces(&admin, vec![("joins".into(), team(0))]);
    let writes_joining = writes_for(port, joins, || marked(&namespaces, "joins", "tenant")).await;
    let (_, hwm) = proc_stat(op.pid());

    let gates: Api<GpuQuotaGate> = Api::all(admin.clone());
    let rqs: Api<ResourceQuota> = Api::all(admin.clone());
    let lists: Api<GpuClassList> = Api::all(admin.clone());
    let ours = ListParams::default().labels("tessera.dev/quota");
    let row = Row {
        namespaces: n,
        quotas: q,
        until_gated,
        until_tenant,
        cpu,
        rss_mib: hwm as f64 / 1024.0,
        writes_per_pass_at_rest,
        writes_unclaimed,
        writes_joining,
        largest_gate: largest(gates.list(&Default::default()).await?.items),
        largest_rq: largest(rqs.list(&ours).await?.items.into_iter().filter(|r| r.name_any().starts_with("tessera-"))),
        class_list: largest(lists.list(&Default::default()).await?.items),
        largest_quota: largest(quotas.list(&Default::default()).await?.items),
        load: load(),
    };
    op.stop_now();
    Ok(row)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let n = args.first().copied().unwrap_or(10_000);
    let q = args.get(1).copied().unwrap_or(1_000).clamp(1, n);
    let (operator, out) = (operator_binary()?, output_dir());
    tessera_e2e::say!("{HEADER}");
    let row = bench(n, q, &operator).await?;
    tessera_e2e::say!("{}", row.markdown());
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("quota-gates.md"), format!("{HEADER}\n{}\n", row.markdown()))?;
    tessera_e2e::say!("table written to {}/quota-gates.md", out.display());
    anyhow::ensure!(row.writes_per_pass_at_rest == 0.0, "passes at rest wrote: a pass at rest must write nothing");
    Ok(())
}
