//! The activity writer's cost at rest, on a simulated clock: a node's devices sampled every 30 s
//! for a day through the real tracker and write rule, counting the status writes it would send
//! and the pod lists its holder lookup would make (each busy device's process has a PID).
//! Run by `make bench` (`bench-activity`) and bounded by a test.

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tessera_crds::activity::ActivitySource;

use super::write::should_write;
use super::{Observation, Tracker};

/// How each device's SM activity moves over the day.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// Every device idle all day.
    Idle,
    /// Every device steadily busy (60% ± 5 points of noise per sample).
    Steady,
    /// Busy 09:00-17:00 (60% ± 5), idle otherwise.
    Workday,
    /// Worst case: each sample 0% or 100% at random.
    Flapping,
    /// At rest, but each figure hovers at its threshold: SM activity 0.8% / 1.3% and memory
    /// 250 / 262 MiB (no process) in turn, sample after sample.
    Hovering,
}

/// Writes a node of `devices` MIG devices would send in `hours` of `sample` intervals under
/// `load`, with writes at most every `write_interval`.
pub fn writes(load: Load, devices: u32, hours: i64, sample: SignedDuration, write_interval: SignedDuration) -> u32 {
    cost(load, devices, hours, sample, write_interval).0
}

/// [`writes`], and the pod lists of the holder lookup (every PID maps to a pod).
pub fn cost(
    load: Load,
    devices: u32,
    hours: i64,
    sample: SignedDuration,
    write_interval: SignedDuration,
) -> (u32, u32) {
    let start = Timestamp::from_second(1_800_000_000 - 1_800_000_000 % 86_400).unwrap_or(Timestamp::UNIX_EPOCH);
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut tracker = Tracker::default();
    let mut last: Option<(Timestamp, tessera_crds::activity::NodeActivity)> = None;
    let mut count = 0;
    let mut lookup = super::lookup::Lookup::default();
    let mut lists = 0;
    let mut at = start;
    while at < start + SignedDuration::from_hours(hours) {
        let hour = (at.as_second() - start.as_second()).rem_euclid(86_400) / 3600;
        let obs = (0..devices)
            .map(|d| {
                let noise = (next() % 11) as f64 - 5.0;
                let percent = match load {
                    Load::Idle => 0.0,
                    Load::Steady => 60.0 + noise,
                    Load::Workday if (9..17).contains(&hour) => 60.0 + noise,
                    Load::Workday => 0.0,
                    Load::Flapping => (next() % 2) as f64 * 100.0,
                    Load::Hovering => [0.8, 1.3][(at.as_second() / 30 % 2) as usize],
                };
                let hover = load == Load::Hovering;
                Observation {
                    gpu_index: d / 7,
                    model_name: "NVIDIA H100 80GB HBM3".into(),
                    gpu_uuid: format!("GPU-{}", d / 7),
                    uuid: Some(format!("MIG-{d}")),
                    profile: Some("1g.10gb".into()),
                    start: Some((d % 7) as u8),
                    gpu_instance_id: Some(d % 7 + 9),
                    source: ActivitySource::Gpm,
                    sm_active_percent: Some(percent),
                    gpm_failed: false,
                    memory_used_mib: if hover { [250, 262][(at.as_second() / 30 % 2) as usize] } else { 0 },
                    processes: u32::from(percent > 0.0 && !hover),
                    pids: if percent > 0.0 && !hover { vec![1000 + d] } else { vec![] },
                }
            })
            .collect::<Vec<_>>();
        let pids: Vec<u32> = obs.iter().flat_map(|o| o.pids.iter().copied()).collect();
        if lookup.due(&pids) {
            lists += 1;
            let pod = tessera_crds::activity::DevicePod::default();
            let found = pids.iter().map(|p| (*p, pod.clone())).collect();
            lookup.listed(pids, found, std::time::Duration::from_secs(30));
        }
        tracker.observe(at, obs);
        // As the agent writes it: with the holders named, so a holder change counts too.
        let summary = super::holders::summary(&tracker, at, &lookup.found);
        if should_write(last.as_ref().map(|(t, a)| (*t, a)), &summary, at, write_interval).is_some() {
            count += 1;
            last = Some((at, summary));
        }
        at += sample;
    }
    (count, lists)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_at_rest_writes_about_once_a_day_and_never_more_than_the_interval_allows() {
        let (s, w) = (SignedDuration::from_secs(30), SignedDuration::from_mins(5));
        // The first summary (no share yet), then its first 1 h figure 5 min later; then nothing.
        assert_eq!(writes(Load::Idle, 56, 24, s, w), 2);
        let steady = writes(Load::Steady, 56, 24, s, w);
        assert!(steady <= 3, "noise under 10 points is no news: {steady}");
        // Two transitions a day, each followed by the 1 h share moving in 10-point steps.
        let workday = writes(Load::Workday, 56, 24, s, w);
        assert!((2..=20).contains(&workday), "{workday}");
        // One per 5 min, plus an early write when a device idle 5 min on end wakes (rare at
        // random: 304 a day here), not a write per sample.
        let flapping = writes(Load::Flapping, 56, 24, s, w);
        assert!(flapping <= 24 * 12 * 5 / 4, "about one per 5 min: {flapping}");
        // Figures hovering at their thresholds (hysteresis): as few writes as at rest.
        let hovering = writes(Load::Hovering, 56, 24, s, w);
        assert!(hovering <= 3, "hovering at a threshold is no news: {hovering}");
        // Pod lists: at rest, none with no process and one for steady ones (their PIDs do not
        // change); a workday's processes are listed when they start, not while they run.
        let lists = |load| cost(load, 56, 24, s, w).1;
        assert_eq!((lists(Load::Idle), lists(Load::Hovering), lists(Load::Steady)), (0, 0, 1));
        assert_eq!(lists(Load::Workday), 1);
    }
}
