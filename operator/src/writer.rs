//! The one way the runtime writes to the API server, Events too (`controller::events`). A
//! [`Writer`] refuses every write once this replica's leader tenure may have ended
//! ([`Error::NotLeader`], nothing sent: see `leader`), names the field manager (the
//! [`Manager`]s below, all declared here), counts the failure of a write its caller goes on
//! from, and, for the rollout controller, remembers what it wrote until the caches show it (see
//! `expectations`). Every request, reads too, is also counted by the client itself
//! (`tessera_operator_api_requests_total`, see `run`).

use std::fmt::Debug;
use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tessera_crds::GpuNode;

use crate::Error;
use crate::expectations::{Expectations, Written};
use crate::leader::Tenure;
use crate::metrics::Metrics;

pub mod bodies;

/// The operator's field managers. Their names are part of the cluster's state (each owns its
/// fields in `managedFields`; a renamed one would leave its fields to the old name) and the
/// e2e tests assert them: they never change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Manager {
    /// Everything the operator writes but the fields below.
    Operator,
    /// The `Ready=Unknown` of a silent agent: separate, so the rollout writes never remove it
    /// and the agent takes the condition back when it returns.
    Liveness,
    /// The `DraInSync` conditions on GpuNodes, so neither the agent's status writes nor the
    /// rollout's remove them.
    Dra,
    /// A plan's `status.layoutDecision`, so the per-pass status write never removes a decision.
    Layouts,
}

impl Manager {
    /// The field manager's name, as the API server records it.
    pub const fn name(self) -> &'static str {
        match self {
            Manager::Operator => "tessera-operator",
            Manager::Liveness => "tessera-operator-liveness",
            Manager::Dra => "tessera-operator-dra",
            Manager::Layouts => "tessera-operator-layouts",
        }
    }
}

/// Field manager of everything the operator writes (also its Events' reporting controller).
pub const MANAGER: &str = Manager::Operator.name();
/// Field manager of the `Ready=Unknown` the operator writes for a silent agent.
pub const LIVENESS_MANAGER: &str = Manager::Liveness.name();
/// Field manager of the `DraInSync` conditions on GpuNodes.
pub const DRA_MANAGER: &str = Manager::Dra.name();
/// Field manager of `status.layoutDecision`.
pub const LAYOUTS_MANAGER: &str = Manager::Layouts.name();

/// How a patch is sent: a forced server-side apply, or a JSON merge patch (under a manager, or
/// the API server's default one).
#[derive(Debug, Clone, Copy)]
enum Kind {
    Apply(Manager),
    Merge(Option<Manager>),
}

/// One patch of one object: its body, how it is sent, whether to the status subresource, and
/// which of the rollout's caches must show it before its node is planned again.
#[derive(Debug)]
pub struct Write<'b, B> {
    body: &'b B,
    kind: Kind,
    status: bool,
    expect: Option<Written>,
}

impl<'b, B: Serialize + Debug> Write<'b, B> {
    /// A server-side apply of `body` by `manager`, forced: these fields are the operator's.
    pub fn apply(manager: Manager, body: &'b B) -> Self {
        Write { body, kind: Kind::Apply(manager), status: false, expect: None }
    }

    /// A JSON merge patch under the API server's default field manager.
    pub fn merge(body: &'b B) -> Self {
        Write { body, kind: Kind::Merge(None), status: false, expect: None }
    }

    /// A JSON merge patch recorded under `manager`.
    pub fn merge_as(manager: Manager, body: &'b B) -> Self {
        Write { body, kind: Kind::Merge(Some(manager)), status: false, expect: None }
    }

    /// To the object's status subresource.
    pub fn status(self) -> Self {
        Write { status: true, ..self }
    }

    /// Remembered until the rollout's cache of `object` (named like its node) shows it.
    pub fn expected(self, object: Written) -> Self {
        Write { expect: Some(object), ..self }
    }

    /// The request's parameters and patch.
    fn request(&self) -> (PatchParams, Patch<&'b B>) {
        match self.kind {
            Kind::Apply(m) => (PatchParams::apply(m.name()).force(), Patch::Apply(self.body)),
            Kind::Merge(m) => (
                PatchParams { field_manager: m.map(|m| m.name().into()), ..Default::default() },
                Patch::Merge(self.body),
            ),
        }
    }
}

/// Where the rollout controller keeps its writes until the caches show them.
#[derive(Clone, Copy)]
pub struct Expecting<'a> {
    pub expectations: &'a Mutex<Expectations>,
    /// The newest version written to each kind of object (see `watch_into_store_waking`).
    pub gpunodes_written: &'a AtomicU64,
    pub nodes_written: &'a AtomicU64,
}

impl Expecting<'_> {
    /// Remembers a write's resourceVersion: the node waits until the caches show it.
    fn expect(&self, node: &str, object: Written, resource_version: Option<&str>) {
        if let Some(rv) = crate::expectations::revision(resource_version) {
            let newest = match object {
                Written::GpuNode => self.gpunodes_written,
                Written::Node => self.nodes_written,
            };
            newest.fetch_max(rv, Ordering::Release);
        }
        let mut expectations = crate::locked(self.expectations);
        expectations.wrote(node, object, resource_version);
    }
}

/// A controller's writes: checked against its tenure, under its field managers, counted.
#[derive(Clone, Copy)]
pub struct Writer<'a> {
    client: &'a Client,
    /// Until when this replica may write; none: without leader election, always.
    tenure: Option<&'a Tenure>,
    metrics: &'a Metrics,
    /// Where writes marked [`Write::expected`] are remembered (the rollout controller's).
    expecting: Option<Expecting<'a>>,
}

impl<'a> Writer<'a> {
    /// Writes through `client` while `tenure` holds (none: always).
    pub fn new(client: &'a Client, tenure: Option<&'a Tenure>, metrics: &'a Metrics) -> Self {
        Writer { client, tenure, metrics, expecting: None }
    }

    /// The same writer, remembering each write marked [`Write::expected`] in `expecting`.
    pub fn expecting(self, expecting: Expecting<'a>) -> Self {
        Writer { expecting: Some(expecting), ..self }
    }

    /// The client the writes go through (for the `Api`s they are sent to).
    pub fn client(&self) -> &'a Client {
        self.client
    }

    /// Refuses a write once the leader lease may have passed to another replica: the pass that
    /// planned it may have started under the lease, the write would land after (see `leader`).
    pub fn may_write(&self) -> Result<(), Error> {
        match self.tenure.is_none_or(|t| t.holds(std::time::SystemTime::now())) {
            true => Ok(()),
            false => Err(Error::NotLeader),
        }
    }

    /// Sends `write` to the object `name`. A failure is returned, not counted: the pass counts it
    /// (by its kind) where it ends up.
    pub async fn send<K, B>(&self, api: &Api<K>, name: &str, write: Write<'_, B>) -> Result<K, Error>
    where
        K: Resource + Clone + DeserializeOwned + Debug,
        B: Serialize + Debug,
    {
        Ok(self.patch(api, name, write).await??)
    }

    /// Sends `write` to the object `name`; a failed write is counted (`kube`) and handed back
    /// inside, for the caller to report and go on. [`Error::NotLeader`] outside, nothing sent.
    pub async fn send_counted<K, B>(
        &self,
        api: &Api<K>,
        name: &str,
        write: Write<'_, B>,
    ) -> Result<kube::Result<K>, Error>
    where
        K: Resource + Clone + DeserializeOwned + Debug,
        B: Serialize + Debug,
    {
        let sent = self.patch(api, name, write).await?;
        Ok(sent.inspect_err(|_| self.metrics.error("kube")))
    }

    /// Deletes the object `name`; one already gone counts as deleted. A failure is returned,
    /// not counted (as [`Self::send`]).
    pub async fn delete<K>(&self, api: &Api<K>, name: &str, dp: &DeleteParams) -> Result<(), Error>
    where
        K: Resource + Clone + DeserializeOwned + Debug,
    {
        Ok(self.deleted(api, name, dp).await??)
    }

    /// Deletes the object `name`; one already gone counts as deleted, a failure is counted and
    /// handed back inside (as [`Self::send_counted`]).
    pub async fn delete_counted<K>(
        &self,
        api: &Api<K>,
        name: &str,
        dp: &DeleteParams,
    ) -> Result<kube::Result<()>, Error>
    where
        K: Resource + Clone + DeserializeOwned + Debug,
    {
        let deleted = self.deleted(api, name, dp).await?;
        Ok(deleted.inspect_err(|_| self.metrics.error("kube")))
    }

    /// Runs `call`, a write the typed API cannot send (an eviction, read raw), only while the
    /// tenure holds: the future is not polled otherwise.
    pub async fn guarded<T>(&self, call: impl Future<Output = Result<T, Error>>) -> Result<T, Error> {
        self.may_write()?;
        self.within_tenure(call).await?
    }

    /// Awaits `call` no longer than the tenure holds: the client retries a throttled or
    /// unavailable server (429, 503) for minutes, and a retry that lands after the lease passed
    /// would undo what the next leader wrote. Past the tenure the call is dropped (no further
    /// retry is sent) and the write counts as not written ([`Error::NotLeader`]); a request
    /// already on the wire may still land after it (the known gap in `leader`).
    async fn within_tenure<T>(&self, call: impl Future<Output = T>) -> Result<T, Error> {
        let Some(tenure) = self.tenure else { return Ok(call.await) };
        let mut call = std::pin::pin!(call);
        // A renewal seen while the call runs extends the tenure, and the wait with it.
        loop {
            match tenure.remaining(std::time::SystemTime::now()) {
                None => return Ok(call.await),
                Some(left) if left.is_zero() => return Err(Error::NotLeader),
                Some(left) => {
                    if let Ok(answer) = tokio::time::timeout(left, call.as_mut()).await {
                        return Ok(answer);
                    }
                }
            }
        }
    }

    /// The tenure check, then the patch, remembered if it is [`Write::expected`].
    async fn patch<K, B>(&self, api: &Api<K>, name: &str, write: Write<'_, B>) -> Result<kube::Result<K>, Error>
    where
        K: Resource + Clone + DeserializeOwned + Debug,
        B: Serialize + Debug,
    {
        self.may_write()?;
        let (params, patch) = write.request();
        let sent = match write.status {
            true => self.within_tenure(api.patch_status(name, &params, &patch)).await,
            false => self.within_tenure(api.patch(name, &params, &patch)).await,
        };
        let written = match (sent, write.expect) {
            (Ok(written), _) => written,
            // Given up on, but the server may have applied it: remembered as any failed write.
            (Err(e), Some(object)) => {
                // Bounded: a server too slow to answer the write may not answer the read either.
                let _ = tokio::time::timeout(crate::leader::MARGIN, self.read_back(name, object)).await;
                return Err(e);
            }
            (Err(e), None) => return Err(e),
        };
        Ok(match write.expect {
            Some(object) => self.recorded(name, object, written).await,
            None => written,
        })
    }

    /// The tenure check, then the delete (404: already gone, done).
    async fn deleted<K>(&self, api: &Api<K>, name: &str, dp: &DeleteParams) -> Result<kube::Result<()>, Error>
    where
        K: Resource + Clone + DeserializeOwned + Debug,
    {
        self.may_write()?;
        Ok(match self.within_tenure(api.delete(name, dp)).await? {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e),
        })
    }

    /// Remembers the version a write returned, so the node waits until the caches show it. A
    /// write that failed may still have been applied (a timeout, a reset connection): the object
    /// is read back and that version waited for instead. If the read fails too, the next pass
    /// decides from the caches as they are.
    async fn recorded<K: Resource>(&self, node: &str, object: Written, result: kube::Result<K>) -> kube::Result<K> {
        let Some(expecting) = self.expecting else { return result };
        match result {
            Ok(k) => {
                expecting.expect(node, object, k.meta().resource_version.as_deref());
                Ok(k)
            }
            Err(e) => {
                self.read_back(node, object).await;
                Err(e)
            }
        }
    }

    /// After a write whose outcome is unknown (failed, or given up on at the tenure's end):
    /// reads the object's version back, so the next pass waits until the caches show it.
    async fn read_back(&self, node: &str, object: Written) {
        let Some(expecting) = self.expecting else { return };
        let version = match object {
            Written::GpuNode => {
                Api::<GpuNode>::all(self.client.clone()).get_metadata_opt(node).await.map(|m| m.map(|m| m.metadata))
            }
            Written::Node => {
                Api::<Node>::all(self.client.clone()).get_metadata_opt(node).await.map(|m| m.map(|m| m.metadata))
            }
        };
        if let Ok(Some(meta)) = version {
            expecting.expect(node, object, meta.resource_version.as_deref());
        }
    }
}

#[cfg(test)]
mod tests;
