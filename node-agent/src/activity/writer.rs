//! The agent's activity pass: sample every device, feed the tracker, and write the summary to
//! `GpuNode.status.activity` when [`should_write`] says so. Its own field manager applies only
//! that field, so the reconcile pass's status apply (which omits it) never removes it, and this
//! one never touches the reconcile's fields.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tessera_crds::activity::NodeActivity;
use tessera_crds::gpunode::GpuNode;
use tracing::{debug, warn};

use super::Tracker;
use super::write::should_write;
use crate::Error;
use crate::agent::Agent;
use crate::backend::GpuBackend;

/// The field manager of `status.activity` (apart from the agent's other writes; see above).
pub const ACTIVITY_MANAGER: &str = "tessera-node-agent-activity";

/// State of the activity pass between samples.
#[derive(Debug, Clone)]
pub struct Writer {
    pub tracker: Tracker,
    /// What this agent last wrote, and when (`None`: nothing since it started, or what is stored
    /// is not it any more: [`Writer::check_stored`]).
    pub last: Option<(Timestamp, NodeActivity)>,
    /// The UID of the GpuNode `last` was written to.
    pub written_uid: Option<String>,
    /// At most one write per this interval (`--activity-write-interval-seconds`, default 300).
    pub write_interval: SignedDuration,
    /// How often devices are sampled (`--activity-sample-seconds`, default 30).
    pub sample_interval: Duration,
    /// The latest `/metrics` text, rendered every sample (served by `metrics::serve`).
    pub metrics: std::sync::Arc<std::sync::Mutex<String>>,
    /// PID -> pod of the devices' processes, looked up (one pod list) for new PIDs, and again
    /// with a back-off for PIDs no pod was found for ([`super::lookup`]).
    pub holders: super::lookup::Lookup,
    /// Where the PIDs' cgroups are read (`/proc`, the host's with the host PID namespace).
    pub proc_root: std::path::PathBuf,
    /// Whether the tracker was seeded from the stored `status.activity` (once per run).
    pub seeded: bool,
    /// Spaces the retries of a write the API server keeps refusing.
    pub backoff: super::backoff::Backoff,
    /// Since when the stored summary has not been kept current (sampling failed, the stored one
    /// could not be read, or a write it needed failed or waits out the back-off); `None` while
    /// current; moved back by a clock step like `idleSince` ([`Writer::passed`]). Announced on
    /// the heartbeat Lease ([`Writer::failing_since`]).
    pub failing: Option<Timestamp>,
    /// The last pass of this run that left the stored summary current (so it had seeded):
    /// published as `activity-current-until` ([`Writer::current_until`]).
    pub current_at: Option<Timestamp>,
    /// The previous run as its heartbeat Lease left it, once read ([`Agent::previous_run`]).
    pub previous: Option<super::previous::PreviousRun>,
    /// When the last pass ended, by this node's clock: a later pass or renewal reading an
    /// earlier time saw the clock step back ([`Writer::passed`]).
    pub last_pass: Option<Timestamp>,
    /// The `status.activity` paths the API server dropped from the last write (an older CRD
    /// prunes fields it does not know); `None` when it stored everything sent.
    pub pruned: Option<Vec<String>>,
}

impl Writer {
    /// The reconcile read this node's GpuNode `gn`: when it is not what this agent last wrote to
    /// (deleted and recreated: another UID) or stores no summary, `last` is forgotten so the
    /// next sample writes. Else a recreated GpuNode of a node at rest (nothing new to write)
    /// would stay without a summary for good, its devices counted unmeasured.
    pub fn check_stored(&mut self, gn: &GpuNode) {
        let stored = gn.status.as_ref().and_then(|s| s.activity.as_ref());
        let other = self.written_uid.is_some() && gn.metadata.uid != self.written_uid;
        // An older CRD prunes the summary: its absence is known, and retried at the interval
        // (`pruned_retry`), not at every reconcile.
        let pruned = self.pruned.is_some() && !other;
        if self.last.is_some() && (stored.is_none() || other) && !pruned {
            debug!(uid = ?gn.metadata.uid, "GpuNode.status.activity is not what was written; writing it again");
            self.last = None;
        }
    }
}

impl Writer {
    /// The last write was pruned (see [`Writer::pruned`]): written again once the interval since
    /// it is over, so an upgraded CRD gets the summary even at rest.
    fn pruned_retry(&self, now: Timestamp) -> Option<super::write::Reason> {
        let (at, _) = self.last.as_ref().filter(|_| self.pruned.is_some())?;
        let elapsed = now.duration_since(*at);
        (elapsed >= self.write_interval || elapsed < SignedDuration::ZERO).then_some(super::write::Reason::First)
    }

    /// Compares the stored summary the write's answer holds with what was `sent`: fields the
    /// API server dropped (an older CRD) are logged once, with the fix, and kept in `pruned`.
    fn check_pruned(&mut self, sent: &NodeActivity, gn: &GpuNode) {
        let sent = serde_json::to_value(sent).unwrap_or_default();
        let got = gn.status.as_ref().and_then(|s| s.activity.as_ref()).map(serde_json::to_value);
        let got = got.and_then(Result::ok).unwrap_or_default();
        let dropped = super::prune::dropped(&sent, &got, "status.activity");
        let dropped = (!dropped.is_empty()).then_some(dropped);
        if dropped.is_some() && dropped != self.pruned {
            warn!(fields = ?dropped, "the API server dropped GpuNode.status.activity fields this agent wrote: \
                its CRD is older than the agent; upgrade the CRDs (kubectl apply --server-side -f \
                config/helm/tessera/crds/); writing at most every write interval meanwhile");
        }
        self.pruned = dropped;
    }
}

impl Default for Writer {
    fn default() -> Self {
        Self {
            tracker: Tracker::default(),
            last: None,
            written_uid: None,
            write_interval: SignedDuration::from_mins(5),
            sample_interval: Duration::from_secs(30),
            metrics: Default::default(),
            holders: Default::default(),
            proc_root: "/proc".into(),
            seeded: false,
            backoff: Default::default(),
            failing: None,
            current_at: None,
            previous: None,
            last_pass: None,
            pruned: None,
        }
    }
}

impl<B: GpuBackend> Agent<B> {
    /// One activity pass. A failed write is logged and retried after a back-off (see
    /// [`super::backoff`]; the summary is recomputed then; nothing is queued). Keeps
    /// [`Writer::failing`]: set at the first pass that leaves the stored summary behind, cleared
    /// by the next that leaves it current.
    pub async fn sample_activity(&mut self) -> Result<(), Error> {
        let current = self.activity_pass().await;
        self.activity.passed(Timestamp::now(), matches!(current, Ok(true)));
        current.map(|_| ())
    }

    /// One pass: `Ok(false)` when a write was due but waits out the back-off.
    async fn activity_pass(&mut self) -> Result<bool, Error> {
        let (observations, unread) = tokio::task::block_in_place(|| super::sample::observe_all(&mut self.backend))?;
        // With those of devices kept as last read: their holders stay named (no write, no list).
        let mut pids: Vec<u32> = observations.iter().flat_map(|o| o.pids.iter().copied()).collect();
        pids.extend(self.activity.tracker.unread_pids(&unread));
        pids.sort_unstable();
        pids.dedup();
        if self.activity.holders.due(&pids) {
            match tokio::task::block_in_place(|| self.try_pods_of(&pids)) {
                Ok(pods) => self.activity.holders.listed(pids, pods, self.activity.sample_interval),
                // Tried again on the next sample (the PIDs looked up stay the old ones); the PIDs
                // still running keep their pods meanwhile.
                Err(e) => {
                    warn!(error = %e, "could not list this node's pods to name the devices' holders; retrying on the next sample");
                }
            }
        }
        let prior = match self.activity.seeded {
            true => None,
            false => match self.resume_from().await {
                Ok(prior) => Some(prior),
                Err(e) => {
                    // `/metrics` still shows this sample (figures without history); seeding, and
                    // the write, are tried again on the next one.
                    let (now, w) = (Timestamp::now(), &mut self.activity);
                    let mut fresh = Tracker::default();
                    fresh.observe(now, observations);
                    *w.metrics.lock().unwrap_or_else(|p| p.into_inner()) =
                        super::metrics::render(&self.node, &fresh, now, &w.holders.found);
                    return Err(e);
                }
            },
        };
        let (now, mono) = (Timestamp::now(), std::time::Instant::now());
        let w = &mut self.activity;
        match prior {
            Some((prior, previous)) => {
                let current_until = previous.current_until(prior.measured_at.as_ref().map(|t| t.0));
                w.tracker = Tracker::seed(now, &prior, current_until, observations, &unread).passed_at(mono);
                w.seeded = true;
            }
            None => w.tracker.observe_at(now, mono, observations, &unread),
        }
        let summary = super::holders::summary(&w.tracker, now, &w.holders.found);
        *w.metrics.lock().unwrap_or_else(|p| p.into_inner()) =
            super::metrics::render(&self.node, &w.tracker, now, &w.holders.found);
        let due = should_write(w.last.as_ref().map(|(t, a)| (*t, a)), &summary, now, w.write_interval);
        let Some(reason) = due.or_else(|| w.pruned_retry(now)) else {
            // Nothing due: what is stored is current (a change that failed to be written went
            // back), so no wait of earlier failures is left over for the next change.
            w.backoff.succeeded();
            return Ok(true);
        };
        if !w.backoff.try_now() {
            debug!(failures = w.backoff.failures(), "activity write backing off");
            return Ok(false);
        }
        debug!(?reason, devices = summary.devices.len(), "writing GpuNode.status.activity");
        let body = json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
            "status": {"activity": summary}
        });
        let api: Api<GpuNode> = Api::all(self.client.clone());
        match api.patch_status(&self.node, &PatchParams::apply(ACTIVITY_MANAGER).force(), &Patch::Apply(&body)).await {
            Ok(gn) => {
                self.activity.check_pruned(&summary, &gn);
                self.activity.last = Some((now, summary));
                self.activity.written_uid = gn.metadata.uid;
                self.activity.backoff.succeeded();
                Ok(true)
            }
            Err(e) => {
                self.activity.backoff.failed(self.activity.sample_interval);
                warn!(error = %e, failures = self.activity.backoff.failures(),
                    "could not write GpuNode.status.activity; retrying after a back-off");
                Err(e.into())
            }
        }
    }
}

impl<B: GpuBackend> Agent<B> {
    /// What a restart resumes from: the stored summary, and the previous run's Lease.
    async fn resume_from(&mut self) -> Result<(NodeActivity, super::previous::PreviousRun), Error> {
        let previous = self.previous_run().await?;
        Ok((self.stored_activity().await?, previous))
    }

    /// What an earlier run wrote to this node's `status.activity` (empty when there is no
    /// GpuNode or no summary yet). A failed read fails the pass: starting empty would reset
    /// every `idleSince` on the next write.
    async fn stored_activity(&self) -> Result<NodeActivity, Error> {
        let api: Api<GpuNode> = Api::all(self.client.clone());
        let node = api.get_opt(&self.node).await.inspect_err(
            |e| warn!(error = %e, "could not read GpuNode.status.activity to resume from; retrying on the next sample"),
        )?;
        Ok(node.and_then(|n| n.status).and_then(|s| s.activity).unwrap_or_default())
    }
}

#[cfg(test)]
#[path = "writer_tests.rs"]
mod tests;
