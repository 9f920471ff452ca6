//! `kubectl tessera status`: the fleet at a glance (built by `tessera_planner::fleet_status`).
//!
//! Reading what `status` shows: six lists, concurrently. One that fails (RBAC, a CRD not
//! installed, a timeout) is reported and the others are still shown; the command then exits 1.

use std::io::Write as _;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tessera_crds::{GpuNode, GpuPartitionPlan, TenantGpuQuota};

use std::io::IsTerminal;

use crate::Error;
use crate::Output;
use crate::connect::{ClusterArgs, client, list_all};
use crate::snapshot::Snapshot;
use clap::ValueEnum;
use tessera_planner::dra::GpuDrivers;
use tessera_planner::fleet_status::{self as render, Inputs, Unreadable, resource_name};

/// `--color`: as kubectl and git, colour only when stdout is a terminal unless told otherwise;
/// `NO_COLOR` (no-color.org) turns `auto` off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Colour {
    #[default]
    Auto,
    Always,
    Never,
}

impl Colour {
    pub fn enabled(self) -> bool {
        match self {
            Colour::Always => true,
            Colour::Never => false,
            Colour::Auto => {
                std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
            }
        }
    }
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
    let mut e: [Vec<Unreadable>; 6] = Default::default();
    let [e1, e2, e3, e4, e5, e6] = &mut e;
    let heartbeats = Api::<Lease>::namespaced(client.clone(), tessera_crds::gpunode::AGENT_LEASE_NAMESPACE);
    let (gpunodes, plans, quotas, pods, claims, slices, leases) = futures::join!(
        list::<GpuNode>(client, &all, limit, e1),
        list::<GpuPartitionPlan>(client, &all, limit, e2),
        list::<TenantGpuQuota>(client, &all, limit, e3),
        list::<Pod>(client, &running, limit, e4),
        list::<ResourceClaim>(client, &all, limit, e5),
        list::<ResourceSlice>(client, &all, limit, e6),
        list_all(&heartbeats, &all, limit),
    );
    let unreadable = e.concat();
    let (leases, leases_unread) = match leases {
        Ok(l) => (Some(l), None),
        Err(e) => (None, Some(describe(&e))),
    };
    Inputs {
        gpunodes,
        plans,
        quotas,
        pods,
        claims,
        slices,
        drivers: GpuDrivers::default(),
        unreadable,
        leases,
        leases_unread,
    }
}

pub fn from_snapshot(s: Snapshot) -> Inputs {
    Inputs {
        gpunodes: s.gpunodes,
        plans: s.plans,
        quotas: s.quotas,
        pods: s.pods,
        claims: s.claims,
        slices: s.slices,
        drivers: GpuDrivers::default(),
        unreadable: Vec::new(),
        leases: s.leases,
        leases_unread: None,
    }
}

/// The fleet from the cluster, or from `--from` files when any are given, with the GPU DRA
/// drivers asked for: what `status` and `idle` both read.
pub async fn load(cluster: &ClusterArgs, from: &[String], drivers: &GpuDrivers) -> Result<Inputs, Error> {
    let mut inputs = if from.is_empty() {
        from_cluster(&client(cluster).await?, cluster.request_limit()).await
    } else {
        from_snapshot(Snapshot::read(from)?)
    };
    inputs.drivers = drivers.clone();
    Ok(inputs)
}

/// Prints the report; exit 0, or 1 when part of it could not be read.
pub async fn run(
    cluster: &ClusterArgs,
    from: &[String],
    drivers: &GpuDrivers,
    output: Output,
    colour: bool,
) -> Result<i32, Error> {
    let inputs = load(cluster, from, drivers).await?;
    let mut report = inputs.report();
    let thresholds = tessera_planner::idle::idle_thresholds(&inputs.quotas);
    let now = k8s_openapi::jiff::Timestamp::now();
    let not_reporting = not_reporting(&inputs, now);
    let idle =
        tessera_planner::idle::idle_report(&report, &inputs.gpunodes, &inputs.pods, &thresholds, &not_reporting, now);
    tessera_planner::idle::mark_idle(&mut report, &idle);
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

/// The nodes whose agents' heartbeats ran out by `now`, from the Leases read (none when they
/// were not read: then no node's activity is set aside).
pub(crate) fn not_reporting(
    inputs: &Inputs,
    now: k8s_openapi::jiff::Timestamp,
) -> tessera_planner::idle::stale::NotReporting {
    inputs.leases.as_deref().map(|l| tessera_planner::idle::stale::from_leases(l, now)).unwrap_or_default()
}
