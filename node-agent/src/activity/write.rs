//! Whether the activity summary is worth an API write. The agent samples every pass; the
//! API server hears of it at most every `--activity-write-interval` (default 5 min), and only on a
//! meaningful change (a device set change, an idle transition, a 1 h share moved by 10 points, a
//! device's memory held (over `LEAK_THRESHOLD_MIB`, released at half that) or processes appearing
//! or all going, a new holder), so a node at rest costs no writes at all. A device waking is
//! written at once: the report must not call a working slice idle for another interval.

use std::collections::BTreeSet;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tessera_crds::activity::{ActivitySource, DeviceActivity, LEAK_THRESHOLD_MIB, NodeActivity};

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
    /// A device written idle is active: written at once, within the interval (a notebook woke;
    /// the report must not show it idle for up to another interval).
    Wake,
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

/// Memory written as held is news again only once down to this (half the threshold): a figure
/// hovering at [`LEAK_THRESHOLD_MIB`] is written once, not at every interval. The operator reads
/// the written figure against the threshold alone, so its leak verdict moves with the writes.
pub const LEAK_RELEASE_MIB: u64 = LEAK_THRESHOLD_MIB / 2;

/// A leak beginning or ending on a device, from its written (`w`) figures to its current ones:
/// compute processes appearing or all going; without a process on either side, memory rising
/// over the threshold, or, written held, falling to [`LEAK_RELEASE_MIB`]. With a process the
/// amount of memory is no sign of a leak (the process is).
fn usage_moved(w: &DeviceActivity, d: &DeviceActivity) -> bool {
    if (w.processes > 0) != (d.processes > 0) {
        return true;
    }
    if d.processes > 0 {
        return false;
    }
    match held(w.memory_used_mib) {
        true => u64::try_from(d.memory_used_mib).map_or(true, |m| m <= LEAK_RELEASE_MIB),
        false => held(d.memory_used_mib),
    }
}

/// Decides on `current` against what this agent last wrote (`None`: nothing yet) and when.
/// News waits out `min_interval` since the last write, except a device waking from an idle
/// stretch written at least that long ([`Reason::Wake`]);
/// a clock stepped back before the last write ends the wait (the write restarts it) rather than
/// hold every write until the clock passes that time again.
pub fn should_write(
    last: Option<(Timestamp, &NodeActivity)>,
    current: &NodeActivity,
    now: Timestamp,
    min_interval: SignedDuration,
) -> Option<Reason> {
    let Some((at, written)) = last else {
        return Some(Reason::First);
    };
    let reason = change(written, current)?;
    let elapsed = now.duration_since(at);
    if elapsed >= min_interval || elapsed < SignedDuration::ZERO {
        return Some(reason);
    }
    woke(written, at, min_interval, current).then_some(Reason::Wake)
}

/// The written device of `d` (same GPU and UUID).
fn before<'a>(written: &'a NodeActivity, d: &DeviceActivity) -> Option<&'a DeviceActivity> {
    written.devices.iter().find(|w| w.gpu_index == d.gpu_index && w.uuid == d.uuid)
}

/// A device written idle (`at`, for at least `interval` by then) is active now. One written
/// idle for less waits like other news: a device flapping sample after sample, each device's
/// short pauses, must not cost a write per sample.
fn woke(written: &NodeActivity, at: Timestamp, interval: SignedDuration, current: &NodeActivity) -> bool {
    let long_idle = |w: &DeviceActivity| w.idle_since.as_ref().is_some_and(|s| at.duration_since(s.0) >= interval);
    current.devices.iter().any(|d| d.idle_since.is_none() && before(written, d).is_some_and(long_idle))
}

/// What changed meaningfully since `written`, whenever that was.
fn change(written: &NodeActivity, current: &NodeActivity) -> Option<Reason> {
    if devices(written) != devices(current) {
        return Some(Reason::DeviceSet);
    }
    let (mut share, mut usage) = (false, false);
    for d in &current.devices {
        let Some(w) = before(written, d) else { return Some(Reason::DeviceSet) };
        // Idle now and then, or idle again after a short burst: a later `idleSince` than the
        // one written (the written one would overstate how long it has idled); or an earlier
        // one (a clock stepped back: the written one lies in the future).
        if w.idle_since.is_some() != d.idle_since.is_some()
            || d.idle_since.as_ref().is_some_and(|n| w.idle_since.as_ref().is_some_and(|o| n.0 != o.0))
        {
            return Some(Reason::IdleTransition);
        }
        share |= match (w.active_percent_1h, d.active_percent_1h) {
            (Some(a), Some(b)) => (a - b).abs() >= SHARE_STEP_POINTS,
            (a, b) => a != b,
        };
        usage |= usage_moved(w, d);
    }
    share
        .then_some(Reason::Share)
        .or_else(|| usage.then_some(Reason::Usage))
        .or_else(|| super::holders::moved(written, current).then_some(Reason::Holder))
}

#[cfg(test)]
mod tests;
