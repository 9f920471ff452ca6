//! Whether the activity summary is worth an API write. The agent samples every pass; the
//! API server hears of it at most every `--activity-write-interval` (default 5 min), and only on a
//! meaningful change (a device set change, an idle transition, a 1 h share moved by 10 points, a
//! device's memory held (over `LEAK_THRESHOLD_MIB`) or processes appearing or all going, a new
//! holder), so a node at rest costs no writes at all.

use std::collections::BTreeSet;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tessera_crds::activity::{ActivitySource, LEAK_THRESHOLD_MIB, NodeActivity};

/// A 1 h share that moved by at least this many points is news.
pub const SHARE_STEP_POINTS: i32 = 10;

/// Why the summary is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Nothing written yet since the agent started (the stored summary may be another run's).
    First,
    /// A device appeared or went away, or how one is measured changed.
    DeviceSet,
    /// A device went idle or became active.
    IdleTransition,
    /// A device's 1 h share moved by 10 points or more (or got its first figure).
    Share,
    /// Another pod (or none) runs on a device ([`super::holders`]).
    Holder,
    /// A device's memory held or compute processes appeared or all went (a leak beginning or
    /// ending, on a GPM device whose share and idleness do not move).
    Usage,
}

/// Each device as (GPU, UUID, measured by GPM).
fn devices(a: &NodeActivity) -> BTreeSet<(i32, Option<&str>, bool)> {
    a.devices.iter().map(|d| (d.gpu_index, d.uuid.as_deref(), d.source == ActivitySource::Gpm)).collect()
}

/// Memory held on a device: above [`LEAK_THRESHOLD_MIB`], not the tens of MiB an idle MIG
/// device shows on real hardware (0 in the simulator), so a leak ending is news there too.
fn held(mib: i64) -> bool {
    u64::try_from(mib).is_ok_and(|m| m > LEAK_THRESHOLD_MIB)
}

/// Decides on `current` against what this agent last wrote (`None`: nothing yet) and when.
pub fn should_write(
    last: Option<(Timestamp, &NodeActivity)>,
    current: &NodeActivity,
    now: Timestamp,
    min_interval: SignedDuration,
) -> Option<Reason> {
    let Some((at, written)) = last else {
        return Some(Reason::First);
    };
    if now.duration_since(at) < min_interval {
        return None;
    }
    if devices(written) != devices(current) {
        return Some(Reason::DeviceSet);
    }
    let before =
        |uuid: Option<&str>, gpu: i32| written.devices.iter().find(|w| w.gpu_index == gpu && w.uuid.as_deref() == uuid);
    let (mut share, mut usage) = (false, false);
    for d in &current.devices {
        let Some(w) = before(d.uuid.as_deref(), d.gpu_index) else { return Some(Reason::DeviceSet) };
        // Idle now and then, or idle again after a short burst: a later `idleSince` than the
        // one written (the written one would overstate how long it has idled).
        if w.idle_since.is_some() != d.idle_since.is_some()
            || d.idle_since.as_ref().is_some_and(|n| w.idle_since.as_ref().is_some_and(|o| n.0 > o.0))
        {
            return Some(Reason::IdleTransition);
        }
        share |= match (w.active_percent_1h, d.active_percent_1h) {
            (Some(a), Some(b)) => (a - b).abs() >= SHARE_STEP_POINTS,
            (a, b) => a != b,
        };
        usage |= held(w.memory_used_mib) != held(d.memory_used_mib) || (w.processes > 0) != (d.processes > 0);
    }
    share
        .then_some(Reason::Share)
        .or_else(|| usage.then_some(Reason::Usage))
        .or_else(|| super::holders::moved(written, current).then_some(Reason::Holder))
}

#[cfg(test)]
#[path = "write_tests.rs"]
mod tests;
