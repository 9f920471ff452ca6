//! Holding the cordon after a change until the node's GPU DRA driver re-publishes. NVIDIA's DRA
//! driver lists a node's MIG devices in ResourceSlices; after a layout change its kubelet plugin
//! is restarted and publishes the new devices. Uncordoned before that, the scheduler allocates
//! claims from the old slices (devices that no longer exist) and their pods never start. So a
//! node whose GPU driver publishes slices stays cordoned (`Uncordoning`) until the slices list
//! what the agent reports, for at most [`DRA_WAIT_SECS`]: past that it is uncordoned anyway,
//! with a Warning, and its `DraInSync=False` left to show. Pure; the state is the node's record
//! (`draWaitStartedAt`) and the observed slices, so a restarted operator decides the same.

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tessera_crds::gpunode::NodeRollout;

/// The longest a node is kept cordoned for its slices after its agent applied the layout: the
/// kubelet plugin re-publishes within seconds; a driver that never does must not hold the node.
pub const DRA_WAIT_SECS: i64 = 300;

/// What a node's GPU DRA driver publishes, held against its agent's report (from
/// `dra_slices::node_condition`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum DraSlices {
    /// No GPU driver publishes slices for the node (or no report to hold them against).
    #[default]
    None,
    /// The complete pools list exactly the devices the agent reports.
    InSync,
    /// A pool of the newest generation is incomplete: the driver is mid-publication.
    Publishing,
    /// The complete pools disagree with the report (why).
    Stale(String),
}

/// What to do with a node whose agent has applied its layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Hold {
    /// Uncordon now; `Some(warning)` when the wait timed out with the slices still not in sync.
    Finish(Option<String>),
    /// Keep the cordon: waiting since `since` (now when the record has no stamp yet), and why.
    Wait { since: Timestamp, why: String },
}

/// Whether the node `name`, its layout applied, keeps our cordon for its slices. Only a cordon
/// of ours that still holds is kept; a node without GPU-driver slices never waits.
pub(super) fn hold(name: &str, slices: &DraSlices, r: &NodeRollout, unschedulable: bool, now: Timestamp) -> Hold {
    if !(r.cordoned_by_us && unschedulable) {
        return Hold::Finish(None);
    }
    let why = match slices {
        DraSlices::None | DraSlices::InSync => return Hold::Finish(None),
        DraSlices::Publishing => "its GPU DRA driver is publishing its ResourceSlices".to_string(),
        DraSlices::Stale(why) => why.clone(),
    };
    let since = r.dra_wait_started_at.as_ref().map_or(now, |t| t.0);
    if now.duration_since(since) >= SignedDuration::from_secs(DRA_WAIT_SECS) {
        return Hold::Finish(Some(format!(
            "uncordoned {name} after waiting {DRA_WAIT_SECS}s for its GPU DRA driver to list its new MIG layout; \
             DRA claims may get devices that no longer exist until it does: {why}"
        )));
    }
    Hold::Wait { since, why }
}

/// The record's message while a node waits (stable while the reason is, so no write per pass).
pub(super) fn waiting_message(since: Timestamp, why: &str) -> String {
    format!(
        "kept cordoned (since {since}, at most {DRA_WAIT_SECS}s) until its GPU DRA driver's ResourceSlices list \
         the new MIG layout: {why}"
    )
}
