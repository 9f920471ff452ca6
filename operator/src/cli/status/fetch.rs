//! Reading what `status` shows: four lists, concurrently. One that fails (RBAC, a CRD not
//! installed, a timeout) is reported and the others are still shown; the command then exits 1.

use std::io::Write as _;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tessera_crds::{GpuNode, GpuPartitionPlan, TenantGpuQuota};

use super::{FleetStatus, Unreadable, fleet_status, render};
use crate::Error;
use crate::cli::Output;
use crate::cli::connect::{ClusterArgs, client, list_all};
use crate::cli::snapshot::Snapshot;

/// What the report is computed from.
#[derive(Debug, Default)]
pub struct Inputs {
    pub gpunodes: Vec<GpuNode>,
    pub plans: Vec<GpuPartitionPlan>,
    pub quotas: Vec<TenantGpuQuota>,
    pub pods: Vec<Pod>,
    pub unreadable: Vec<Unreadable>,
}

impl Inputs {
    pub fn report(&self) -> FleetStatus {
        let mut s = fleet_status(&self.gpunodes, &self.plans, &self.quotas, &self.pods);
        s.unreadable = self.unreadable.clone();
        s.holders_known = !s.unreadable.iter().any(|u| u.resource == resource_name::<Pod>());
        s
    }
}

/// `plural.group` as kubectl names a resource in its errors.
fn resource_name<K: Resource<DynamicType = ()>>() -> String {
    let group = K::group(&());
    if group.is_empty() { K::plural(&()).into_owned() } else { format!("{}.{group}", K::plural(&())) }
}

async fn list<K>(
    client: &Client,
    params: &ListParams,
    limit: Option<Duration>,
    unreadable: &mut Vec<Unreadable>,
) -> Vec<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    match list_all(&Api::<K>::all(client.clone()), params, limit).await {
        Ok(items) => items,
        Err(e) => {
            unreadable.push(Unreadable { resource: resource_name::<K>(), error: describe(&e) });
            Vec::new()
        }
    }
}

/// The API server's own message when it answered; else the transport error with its causes
/// (kube's own text stops at "client error (Connect)").
fn describe(e: &kube::Error) -> String {
    if let kube::Error::Api(s) = e {
        return format!("{} ({})", s.message, s.reason);
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let c = cause.to_string();
        if !text.contains(&c) {
            text = format!("{text}: {c}");
        }
        source = cause.source();
    }
    text
}

pub async fn from_cluster(client: &Client, limit: Option<Duration>) -> Inputs {
    let all = ListParams::default();
    // Finished pods hold no devices; the API server filters them out.
    let running = ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed");
    let (mut e1, mut e2, mut e3, mut e4) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (gpunodes, plans, quotas, pods) = futures::join!(
        list::<GpuNode>(client, &all, limit, &mut e1),
        list::<GpuPartitionPlan>(client, &all, limit, &mut e2),
        list::<TenantGpuQuota>(client, &all, limit, &mut e3),
        list::<Pod>(client, &running, limit, &mut e4),
    );
    let unreadable = [e1, e2, e3, e4].concat();
    Inputs { gpunodes, plans, quotas, pods, unreadable }
}

pub fn from_snapshot(s: Snapshot) -> Inputs {
    Inputs { gpunodes: s.gpunodes, plans: s.plans, quotas: s.quotas, pods: s.pods, unreadable: Vec::new() }
}

/// Prints the report; exit 0, or 1 when part of it could not be read.
pub async fn run(cluster: &ClusterArgs, from: &[String], output: Output, colour: bool) -> Result<i32, Error> {
    let inputs = if from.is_empty() {
        from_cluster(&client(cluster).await?, cluster.request_limit()).await
    } else {
        from_snapshot(Snapshot::read(from)?)
    };
    let report = inputs.report();
    let text = match output {
        Output::Json => format!("{}\n", serde_json::to_string_pretty(&report)?),
        Output::Text => render::text(&report, colour),
    };
    write_stdout(&text)?;
    for u in &report.unreadable {
        let _ = writeln!(std::io::stderr(), "error: cannot read {}: {}", u.resource, render::clean(&u.error));
    }
    Ok(if report.unreadable.is_empty() { 0 } else { 1 })
}

/// Writes to stdout; a reader that stopped reading (`status | head`) is not an error.
fn write_stdout(text: &str) -> Result<(), Error> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Error::ReadFile { path: "(writing stdout)".into(), source: e })
        }
        _ => Ok(()),
    }
}
