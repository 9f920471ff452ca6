//! A new leader's first decision waits until its caches show what the old leader wrote last.
//! The caches of a follower are warm but may lag: a node the old leader started just before
//! losing the lease can still look at rest and uncordoned, and deciding on that view starts it
//! again (a second record with `cordonedByUs: false`, whose orphan check then uncordons it
//! mid-drain) or starts more nodes than `maxUnavailable` allows. Our own expectations know only
//! this process's writes, so the GpuNodes and Nodes are read once after the lease is ours, and
//! no pass runs until the caches are that new (`expectations::Listed`). Deciding from the API
//! objects read fresh on every pass would be correct too, but costs a read of the whole fleet
//! per pass; after this one read the caches are as good (and our own writes are followed by
//! `expectations`). The old leader writes nothing after its lease can have passed (`leader`), so
//! the read shows everything it will ever write.

use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::{Resource, ResourceExt};
use tessera_crds::GpuNode;
use tracing::{info, warn};

use super::Context;
use crate::expectations::{Fence, Listed, Progress};

/// Objects per page of the read (pages of one list are all read at its first page's revision).
const PAGE: u32 = 500;

impl Context {
    /// The GpuNodes and Nodes as they are now, read after the lease became ours; retried until
    /// it succeeds (nothing is decided meanwhile).
    pub(super) async fn read_fence(&self) -> Fence {
        loop {
            let read = async {
                let gpunodes = versions(Api::<GpuNode>::all(self.client.clone())).await?;
                let nodes = versions(Api::<Node>::all(self.client.clone())).await?;
                Ok::<_, kube::Error>(Fence { gpunodes, nodes })
            };
            match read.await {
                Ok(fence) => {
                    info!("read the fleet after taking the lease; no decision until the caches show it");
                    return fence;
                }
                Err(e) => {
                    self.metrics.error("kube");
                    warn!(error = %e, "cannot read the fleet after taking the lease; deciding nothing until it is read");
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
        }
    }

    /// Whether the GpuNode and Node caches show `takeover`.
    pub(super) fn fence_shown(&self, fence: &Fence) -> bool {
        // Read before the caches are: each cache below is at least this far along.
        let progress = Progress {
            gpunodes: self.caches.gpunodes_progress.load(Ordering::Acquire),
            nodes: self.caches.nodes_progress.load(Ordering::Acquire),
        };
        let (gpunodes, nodes) = (self.caches.gpunodes.state(), self.caches.nodes.state());
        let shown = fence.shown(gpunodes.iter().map(name_and_version), nodes.iter().map(name_and_version), progress);
        if shown {
            info!("caches show the fleet as read after taking the lease; deciding");
        }
        shown
    }
}

fn name_and_version<K: Resource>(k: &std::sync::Arc<K>) -> (&str, Option<&str>) {
    let meta = k.meta();
    (meta.name.as_deref().unwrap_or_default(), meta.resource_version.as_deref())
}

/// Every object's name and resourceVersion, and the list's revision. No selector, as the
/// watches have none: an object listed but never cached would hold the fence for ever.: a list without a
/// resourceVersion is a consistent (quorum) read, so it shows every write acknowledged before.
async fn versions<K>(api: Api<K>) -> Result<Listed, kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut lp = ListParams::default().limit(PAGE);
    let (mut revision, mut objects) = (None, Vec::new());
    loop {
        let page = api.list_metadata(&lp).await?;
        revision = revision.or(page.metadata.resource_version);
        objects.extend(page.items.into_iter().map(|o| (o.name_any(), o.metadata.resource_version)));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => lp = lp.continue_token(&token),
            _ => break,
        }
    }
    Ok(Listed::new(revision.as_deref(), objects.iter().map(|(n, rv)| (n.as_str(), rv.as_deref()))))
}
