//! Pausing the GPU clients for a MIG mode change, as NVIDIA's MIG Manager does: restarted pods
//! would grab the GPU again before the mode change, so their DaemonSets are stopped through the
//! GPU Operator's `nvidia.com/gpu.deploy.*` Node labels (its DaemonSets select `"true"`), and put
//! back afterwards. A label found `false` is someone else's decision: never touched. Crash-safe:
//! the previous values are recorded on the `GpuNode` ([`PAUSED_FOR`]) before a label changes, and
//! any pass that finds the record and no mode change to make restores them. Pure; the agent acts.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};
use tessera_crds::gpunode::GpuIntent;

use crate::backend::GpuInfo;

/// The GPU Operator's per-operand deploy labels on a Node.
pub const DEPLOY_LABELS: [&str; 4] = [
    "nvidia.com/gpu.deploy.device-plugin",
    "nvidia.com/gpu.deploy.gpu-feature-discovery",
    "nvidia.com/gpu.deploy.dcgm-exporter",
    "nvidia.com/gpu.deploy.dcgm",
];

/// The value a paused label holds: the MIG Manager's, so tools that know it recognise it.
pub const PAUSED: &str = "paused-for-mig-change";

/// GpuNode annotation: the [`Record`] of a pause, as JSON.
pub const PAUSED_FOR: &str = "tessera.dev/paused-gpu-clients";

/// How long a mode change waits for the paused clients' pods to go (the MIG Manager's `kubectl
/// wait --timeout`); after it the change is tried anyway (an `IN_USE` then restarts them).
pub const WAIT_LIMIT: Duration = Duration::from_secs(300);

/// What a pause changed: each paused label's previous value, and when the pause began.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub since: Timestamp,
    pub labels: BTreeMap<String, String>,
}

impl Record {
    /// The record of pausing `labels` (the Node's) now; `None` when there is nothing to pause.
    pub fn of(labels: &BTreeMap<String, String>, since: Timestamp) -> Option<Record> {
        let labels: BTreeMap<String, String> =
            DEPLOY_LABELS.iter().filter_map(|k| Some((k.to_string(), labels.get(*k)?.clone()))).collect();
        let labels: BTreeMap<String, String> = labels.into_iter().filter(|(_, v)| pausable(v)).collect();
        (!labels.is_empty()).then_some(Record { since, labels })
    }

    /// Parses the annotation, naming it and the reason on bad input.
    pub fn parse(text: &str) -> Result<Record, String> {
        serde_json::from_str(text).map_err(|e| format!("annotation {PAUSED_FOR}: {e}"))
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A label is paused unless it is `false` (someone else stopped it: left alone) or paused already.
fn pausable(value: &str) -> bool {
    value != "false" && value != PAUSED
}

/// Whether the intent changes the MIG mode of a GPU it names (or clears a pending opposite mode):
/// the only change that needs the GPU free of its clients. A GPU that cannot do MIG changes none.
pub fn mode_change_pending(inventory: &[GpuInfo], intent: &[GpuIntent]) -> bool {
    intent.iter().any(|want| {
        inventory.iter().find(|i| i64::from(i.index) == i64::from(want.index)).is_some_and(|info| {
            (info.mig_capable || !want.mig_enabled)
                && (info.mig_enabled != want.mig_enabled || info.mig_pending == Some(!want.mig_enabled))
        })
    })
}

/// The label writes that pause the clients on a Node with `labels`: every deploy label present and
/// neither `false` nor paused. Absent labels stay absent (the GPU Operator sets all of them on
/// the nodes it manages; elsewhere they steer nothing).
pub fn pause_patch(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    DEPLOY_LABELS
        .iter()
        .filter_map(|k| labels.get(*k).filter(|v| pausable(v)).map(|_| (k.to_string(), PAUSED.to_string())))
        .collect()
}

/// The label writes that undo a pause: each label still paused gets its recorded value back
/// (`true`, as the MIG Manager restores, when the record lacks it or was unreadable). One changed
/// meanwhile (to `false`, or removed) is not ours any more: untouched.
pub fn restore_patch(record: Option<&Record>, labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    DEPLOY_LABELS
        .iter()
        .filter(|k| labels.get(**k).is_some_and(|v| v == PAUSED))
        .map(|k| {
            let previous = record.and_then(|r| r.labels.get(*k)).map_or("true", String::as_str);
            (k.to_string(), previous.to_string())
        })
        .collect()
}

/// Whether the mode change still waits for the clients: some of their pods are left and the
/// pause is younger than [`WAIT_LIMIT`].
pub fn must_wait(pods_left: usize, since: Timestamp, now: Timestamp) -> bool {
    let waited = now.duration_since(since);
    pods_left > 0 && waited < k8s_openapi::jiff::SignedDuration::try_from(WAIT_LIMIT).unwrap_or_default()
}

#[cfg(test)]
mod tests;
