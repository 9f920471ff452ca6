//! The agent's activity pass: sample every device, feed the tracker, and write the summary to
//! `GpuNode.status.activity` when [`should_write`] says so. Its own field manager applies only
//! that field, so the reconcile pass's status apply (which omits it) never removes it, and this
//! one never touches the reconcile's fields.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tessera_crds::activity::NodeActivity;
use tessera_crds::gpunode::GpuNode;
use tracing::{debug, warn};

use super::Tracker;

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
    pub(crate) fn pruned_retry(&self, now: Timestamp) -> Option<super::write::Reason> {
        let (at, _) = self.last.as_ref().filter(|_| self.pruned.is_some())?;
        let elapsed = now.duration_since(*at);
        (elapsed >= self.write_interval || elapsed < SignedDuration::ZERO).then_some(super::write::Reason::First)
    }

    /// Compares the stored summary the write's answer holds with what was `sent`: fields the
    /// API server dropped (an older CRD) are logged once, with the fix, and kept in `pruned`.
    pub(crate) fn check_pruned(&mut self, sent: &NodeActivity, gn: &GpuNode) {
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
