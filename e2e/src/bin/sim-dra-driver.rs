//! Plays NVIDIA's DRA driver for GPUs (`gpu.nvidia.com`) for the demo and the end-to-end tests:
//! applies its DeviceClasses and, for every node labelled `tessera.dev/sim-dra=true`, publishes
//! the node's ResourceSlice built from its GpuNode report (the real driver's kubelet plugin reads
//! NVML; this reads what Tessera's agent read). Level-triggered: each pass lists everything and
//! changes only what differs, on any GpuNode or Node event and every `--resync-seconds`.
//!
//! Usage: `KUBECONFIG=... sim-dra-driver [--resync-seconds N] [--once]`.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{FutureExt as _, StreamExt};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, ResourceExt};
use tessera_crds::GpuNode;
use tessera_e2e::dra::slice::{MANAGED_BY, Observed, ObservedNode, SliceAction, opted_in, plan};
use tessera_e2e::dra::{SIM_DRA_LABEL, apply_device_classes};
use tessera_e2e::tell;

const FIELD_MANAGER: &str = "tessera-sim-dra-driver";

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let (mut once, mut resync) = (false, 10u64);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--once" => once = true,
            "--resync-seconds" => {
                let v = args.next().ok_or_else(|| anyhow::anyhow!("--resync-seconds needs a value"))?;
                resync = v.parse().map_err(|e| anyhow::anyhow!("--resync-seconds {v:?}: {e}"))?;
            }
            other => anyhow::bail!("unknown argument {other:?} (usage: sim-dra-driver [--resync-seconds N] [--once])"),
        }
    }
    let client = Client::try_default().await?;
    let gpunodes: Api<GpuNode> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let mut events = futures::stream::select(
        watcher(gpunodes, watcher::Config::default()).default_backoff().map(|_| ()).boxed(),
        watcher(nodes, watcher::Config::default().labels(SIM_DRA_LABEL)).default_backoff().map(|_| ()).boxed(),
    );
    loop {
        if let Err(e) = pass(&client).await {
            tell!("sim-dra-driver: pass failed (retrying): {e}");
        }
        if once {
            return Ok(());
        }
        tokio::select! {
            _ = events.next() => {
                // A burst of events (a watch's initial list) makes one pass, not one each.
                tokio::time::sleep(Duration::from_millis(100)).await;
                while let Some(Some(())) = events.next().now_or_never() {}
            }
            _ = tokio::time::sleep(Duration::from_secs(resync)) => {}
        }
    }
}

/// One pass: observe, plan, act.
async fn pass(client: &Client) -> anyhow::Result<()> {
    apply_device_classes(client).await?;
    let observed = observe(client).await?;
    let planned = plan(&observed);
    for (node, s) in &planned.skipped {
        tell!("sim-dra-driver: node {node}: {} not published: {}", s.path, s.reason);
    }
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    for action in planned.actions {
        match action {
            SliceAction::Apply(slice) => {
                let name = slice.name_any();
                let patch = serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                    "metadata": slice.metadata, "spec": slice.spec});
                slices.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await?;
                tell!("sim-dra-driver: published {name} (generation {})", slice.spec.pool.generation);
            }
            SliceAction::Delete(name) => {
                match slices.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
                tell!("sim-dra-driver: deleted {name}");
            }
        }
    }
    Ok(())
}

async fn observe(client: &Client) -> anyhow::Result<Observed> {
    let mut nodes: BTreeMap<String, ObservedNode> = BTreeMap::new();
    for n in Api::<Node>::all(client.clone()).list(&ListParams::default().labels(SIM_DRA_LABEL)).await? {
        let seen = ObservedNode {
            uid: n.uid().unwrap_or_default(),
            opted_in: opted_in(n.metadata.labels.as_ref()),
            report: None,
        };
        nodes.insert(n.name_any(), seen);
    }
    for gn in Api::<GpuNode>::all(client.clone()).list(&ListParams::default()).await? {
        if let Some(seen) = nodes.get_mut(&gn.name_any()) {
            // No slice before the agent has reported its GPUs.
            seen.report = gn.status.filter(|s| !s.gpus.is_empty());
        }
    }
    let ours = format!("{}={}", MANAGED_BY.0, MANAGED_BY.1);
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default().labels(&ours))
        .await?
        .into_iter()
        .map(|s| (s.name_any(), s))
        .collect();
    Ok(Observed { nodes, slices })
}
