//! Seeding a restarted agent's tracker from what the previous run wrote: the restart neither
//! resets `idleSince` nor forgets the shares, nor lets an idle stretch span an outage no run
//! observed.

use std::collections::BTreeMap;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tessera_crds::activity::{DeviceActivity, NodeActivity};

use super::{DAY, DeviceKey, History, MAX_INTERVAL, Observation, Tracker};

impl Tracker {
    /// Seeds an empty tracker from `prior` (the node's stored `status.activity`, written by an
    /// earlier run) for the devices of the first pass with the same GPU, UUID and source.
    ///
    /// `current_until` is until when the previous run kept `prior` current (its last heartbeat,
    /// or when its report began to fail; see [`crate::activity::previous`]). Within
    /// [`MAX_INTERVAL`] of it (the gap rule of a running agent) the restart is no gap: each
    /// stored `idleSince` is kept unless the device is active now (GPM: from
    /// [`super::ACTIVE_FROM_PERCENT`], as in a running stretch), and the devices in `unread`
    /// (reads failed this pass; a GPU's when the UUID is `None`) are kept as stored, as a
    /// running agent keeps them, until the gap rule drops them. Past it (or unknown) nobody
    /// observed the time between: idle stretches start over from this run's samples, and unread
    /// devices drop out.
    ///
    /// The 1 h / 24 h shares are carried either way, as two synthetic buckets ending at
    /// `current_until` (the previous run kept them current until then; a node at rest writes
    /// hours apart, and an hour ending at `measuredAt` would leave a GPM device unmeasured until
    /// its first figure), so new samples blend in and the prior ages out of each window as real
    /// history would; one more than 24 h old carries none. Devices that no longer exist or are
    /// measured another way are ignored. A `current_until` later than `now` means the clock
    /// stepped back since: every stored time moves back by the step, as a running agent's
    /// history does, and the gap is unknown (how long the agent was down the step may hide), so
    /// stretches start over and unread devices drop out.
    pub fn seed(
        now: Timestamp,
        prior: &NodeActivity,
        current_until: Option<Timestamp>,
        observations: Vec<Observation>,
        unread: &[DeviceKey],
    ) -> Self {
        let step = current_until.map_or(SignedDuration::ZERO, |at| at.duration_since(now).max(SignedDuration::ZERO));
        let back = |t: Timestamp| t.checked_sub(step).unwrap_or(t);
        let current_until = current_until.map(back);
        let measured_at = prior.measured_at.as_ref().map(|t| back(t.0));
        // The shares are current until `current_until` where known (a `measuredAt` later than it
        // is a clock stepped back after the write: clamped by it), the day's measured at
        // `measuredAt`.
        let shares_at =
            current_until.or(measured_at).filter(|at| *at <= now && now.duration_since(*at).as_secs() < DAY);
        let day_at = shares_at.map(|at| measured_at.map_or(at, |m| m.min(at)));
        // After a step nobody knows how long the previous run has been down (the step may hide
        // an outage as long): an unknown gap.
        let continuous =
            current_until.filter(|at| step == SignedDuration::ZERO && now.duration_since(*at) <= MAX_INTERVAL);
        let carry = |h: &mut History, d: &DeviceActivity| {
            // A stored stretch goes on as in a running agent: a first figure in the band
            // (under `ACTIVE_FROM_PERCENT`) does not end it.
            let stored = d.idle_since.as_ref().map(|t| back(t.0)).filter(|s| *s <= now);
            if continuous.is_some() && h.last.idle_after(stored.is_some(), h.gpm_failures) != Some(false) {
                h.idle_since = stored.or(h.idle_since);
            }
            if let (Some(at), Some(day_at)) = (shares_at, day_at) {
                h.seed_shares(at, day_at, d.active_percent_1h, d.active_percent_24h);
            }
        };
        let gpus: BTreeMap<u32, (String, String)> =
            observations.iter().map(|o| (o.gpu_index, (o.model_name.clone(), o.gpu_uuid.clone()))).collect();
        let mut devices = BTreeMap::new();
        for o in observations {
            let mut h = History::new(o, now);
            let old = prior
                .devices
                .iter()
                .find(|d| d.gpu_index == h.last.gpu_index as i32 && d.uuid == h.last.uuid && d.source == h.last.source);
            if let Some(d) = old {
                carry(&mut h, d);
            }
            devices.insert(h.last.key(), h);
        }
        if let Some(at) = continuous {
            for d in &prior.devices {
                let Ok(gpu) = u32::try_from(d.gpu_index) else { continue };
                let key = (gpu, d.uuid.clone());
                let is_unread = unread.iter().any(|(g, u)| *g == gpu && (u.is_none() || *u == d.uuid));
                if !is_unread || devices.contains_key(&key) {
                    continue;
                }
                let (model_name, gpu_uuid) = gpus.get(&gpu).cloned().unwrap_or_default();
                let o = as_stored(d, gpu, model_name, gpu_uuid);
                let mut h = History::new(o, now);
                // Last read (as far as is known) when the previous run last kept it current.
                h.last_at = at.min(now);
                h.idle_since = None;
                h.stored_pod = d.pod.clone();
                carry(&mut h, d);
                devices.insert(key, h);
            }
        }
        Self { devices, last_pass: Some(now), last_mono: None }
    }
}

/// A stored device as its last observation (no GPM figure, no PIDs: not read this run).
fn as_stored(d: &DeviceActivity, gpu_index: u32, model_name: String, gpu_uuid: String) -> Observation {
    Observation {
        gpu_index,
        model_name,
        gpu_uuid,
        uuid: d.uuid.clone(),
        profile: d.profile.clone(),
        start: d.start.and_then(|s| u8::try_from(s).ok()),
        gpu_instance_id: None,
        source: d.source,
        sm_active_percent: None,
        gpm_failed: false,
        memory_used_mib: u64::try_from(d.memory_used_mib).unwrap_or(0),
        processes: u32::try_from(d.processes).unwrap_or(0),
        pids: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use tessera_crds::activity::ActivitySource;

    use super::super::ACTIVE_FROM_PERCENT;
    use super::super::tests::{mig, t};
    use super::*;

    /// A device as the tracker tests sample it, holding 11 MiB and no GPM figure.
    fn obs(uuid: &str, source: ActivitySource, processes: u32) -> Observation {
        Observation { memory_used_mib: 11, ..mig(uuid, source, None, processes) }
    }

    /// Stored at 0: MIG-a and MIG-b, idle since -3600, 40% over the hour.
    fn prior() -> NodeActivity {
        let device = |uuid: &str| DeviceActivity {
            gpu_index: 0,
            uuid: Some(uuid.into()),
            profile: Some("3g.40gb".into()),
            start: Some(4),
            source: ActivitySource::Gpm,
            active_percent_1h: Some(40),
            idle_since: Some(Time(t(-3600))),
            memory_used_mib: 11,
            ..Default::default()
        };
        NodeActivity { measured_at: Some(Time(t(0))), devices: vec![device("MIG-a"), device("MIG-b")] }
    }

    fn find(tr: &Tracker, now: i64, uuid: &str) -> Option<DeviceActivity> {
        tr.summary(t(now)).devices.into_iter().find(|d| d.uuid.as_deref() == Some(uuid))
    }

    #[test]
    fn devices_unread_at_restart_keep_their_stored_figures_within_the_gap_rule() {
        let a = || vec![obs("MIG-a", ActivitySource::Gpm, 0)];
        let one = [(0, Some("MIG-b".to_string()))];
        let gpu = [(0, None)];
        // (case, current until, unread, whether MIG-b is kept at 60)
        let cases: [(&str, Option<i64>, &[DeviceKey], bool); 5] = [
            ("its read failed, the previous run current a minute ago", Some(0), &one, true),
            ("its GPU's reads failed", Some(0), &gpu, true),
            ("merely missing (destroyed)", Some(0), &[], false),
            ("the previous run not current for over 10 min", Some(-600), &one, false),
            ("unknown since when", None, &one, false),
        ];
        for (name, until, unread, kept) in cases {
            let tr = Tracker::seed(t(60), &prior(), until.map(t), a(), unread);
            let b = find(&tr, 60, "MIG-b");
            assert_eq!(b.is_some(), kept, "{name}: {b:?}");
            if let Some(b) = b {
                assert_eq!(b.idle_since, Some(Time(t(-3600))), "{name}: the stored stretch");
                assert_eq!((b.active_percent_1h, b.memory_used_mib), (Some(40), 11), "{name}: as stored");
            }
        }
        // Unread on: kept up to 10 min after the previous run was last current, as a running
        // agent keeps it; read again within that, the same stretch goes on; read later, the
        // stretch does not span the 10 min nobody observed it (a running agent's gap rule).
        let both = || vec![obs("MIG-a", ActivitySource::Gpm, 0), obs("MIG-b", ActivitySource::Gpm, 0)];
        for (read_at, want) in [(600, Some(Time(t(-3600)))), (630, None)] {
            let mut tr = Tracker::seed(t(60), &prior(), Some(t(0)), a(), &one);
            tr.observe_unread(t(570), a(), &one);
            tr.observe_unread(t(600), a(), &one);
            assert!(find(&tr, 600, "MIG-b").is_some());
            tr.observe(t(read_at), both());
            assert_eq!(find(&tr, read_at, "MIG-b").unwrap().idle_since, want, "read at {read_at}");
        }
        let mut tr = Tracker::seed(t(60), &prior(), Some(t(0)), a(), &one);
        tr.observe_unread(t(601), a(), &one);
        assert!(find(&tr, 601, "MIG-b").is_none(), "past the gap rule: dropped");
    }

    #[test]
    fn an_idle_stretch_does_not_span_an_outage_past_the_gap_rule() {
        let pm = |p| vec![obs("MIG-a", ActivitySource::ProcessesAndMemory, p)];
        let mut prior = prior();
        prior.devices.iter_mut().for_each(|d| d.source = ActivitySource::ProcessesAndMemory);
        let now = 7200;
        // (case, current until, first observation, want idle since)
        type Case = (&'static str, Option<i64>, Vec<Observation>, Option<i64>);
        let cases: [Case; 5] = [
            ("down 5 min, idle now: the stored stretch goes on", Some(now - 300), pm(0), Some(-3600)),
            ("down 2 h, idle now: a new stretch from now", Some(now - 7200), pm(0), Some(now)),
            (
                "down 2 h, GPM's first sample: none until its first figure",
                Some(now - 7200),
                vec![obs("MIG-a", ActivitySource::Gpm, 1)],
                None,
            ),
            ("unknown since when: a new stretch", None, pm(0), Some(now)),
            ("down 5 min, active now: none", Some(now - 300), pm(1), None),
        ];
        for (name, until, first, want) in cases {
            let mut p = prior.clone();
            if first[0].source == ActivitySource::Gpm {
                p.devices.iter_mut().for_each(|d| d.source = ActivitySource::Gpm);
            }
            let tr = Tracker::seed(t(now), &p, until.map(t), first, &[]);
            assert_eq!(find(&tr, now, "MIG-a").unwrap().idle_since, want.map(|s| Time(t(s))), "{name}");
        }
    }

    #[test]
    fn a_restart_after_the_clock_stepped_back_moves_the_shares_back_and_counts_the_gap_unknown() {
        // Stored at 3600 and current until 3630 by the old clock; the clock has stepped back
        // since: the restart's first pass reads 60. How long the agent was down the step may
        // hide (here 30 s, or 50 min): an unknown gap, as past the gap rule.
        let mut p = prior();
        p.measured_at = Some(Time(t(3600)));
        p.devices.iter_mut().for_each(|d| {
            d.source = ActivitySource::ProcessesAndMemory;
            d.idle_since = Some(Time(t(3000)));
        });
        let first = vec![obs("MIG-a", ActivitySource::ProcessesAndMemory, 0)];
        let one = [(0, Some("MIG-b".to_string()))];
        for now in [60, 3000] {
            let tr = Tracker::seed(t(now), &p, Some(t(3630)), first.clone(), &one);
            let a = find(&tr, now, "MIG-a").unwrap();
            assert_eq!(a.idle_since, Some(Time(t(now))), "at {now}: the stretch starts over");
            assert_eq!(a.active_percent_1h, Some(40), "at {now}: the stored shares, moved back: still history");
            assert!(find(&tr, now, "MIG-b").is_none(), "at {now}: unread after an unknown gap: dropped");
        }
    }

    #[test]
    fn a_restart_at_rest_carries_the_hours_share_up_to_when_the_summary_was_last_current() {
        // Written three hours ago (nothing new since), kept current until a minute ago: the
        // restart's first GPM sample has no figure yet, and the hour's share is still the
        // stored one, not unmeasured.
        let now = 3 * 3600 + 60;
        let tr = Tracker::seed(t(now), &prior(), Some(t(now - 60)), vec![obs("MIG-a", ActivitySource::Gpm, 1)], &[]);
        assert_eq!(find(&tr, now, "MIG-a").unwrap().active_percent_1h, Some(40));
    }

    #[test]
    fn a_restart_at_rest_ages_the_days_share_from_when_it_was_measured() {
        // Measured at 0 (50% over the day, idle the last hour), kept current (nothing new to
        // write) until 20 h. The day's share at the restart is mostly history older than a day
        // by now: of the stored 23 h only the 3 h after -4 h are still in the window.
        let mut p = prior();
        p.devices.iter_mut().for_each(|d| (d.active_percent_1h, d.active_percent_24h) = (Some(0), Some(50)));
        let now = 20 * 3600 + 60;
        let tr = Tracker::seed(t(now), &p, Some(t(now - 60)), vec![obs("MIG-a", ActivitySource::Gpm, 1)], &[]);
        let a = find(&tr, now, "MIG-a").unwrap();
        assert_eq!(a.active_percent_1h, Some(0), "the hour: current until 20 h");
        assert_eq!(a.active_percent_24h, Some(39), "not the stored 50% as if measured now");
    }

    #[test]
    fn a_restart_keeps_the_shares_written_after_a_clock_step_back_it_was_current_for() {
        // Written at 3600; the clock stepped back an hour, and the previous run stayed current
        // until 0 by the new clock. The restart (30 s later, no step now) still carries them.
        let mut p = prior();
        p.measured_at = Some(Time(t(3600)));
        let tr = Tracker::seed(t(30), &p, Some(t(0)), vec![obs("MIG-a", ActivitySource::Gpm, 1)], &[]);
        assert_eq!(find(&tr, 30, "MIG-a").unwrap().active_percent_1h, Some(40));
    }

    #[test]
    fn a_first_gpm_figure_in_the_band_keeps_the_stored_idle_stretch_as_a_running_agent_does() {
        let figure = |sm: f64| Observation { sm_active_percent: Some(sm), ..obs("MIG-a", ActivitySource::Gpm, 1) };
        let mut busy = prior();
        busy.devices.iter_mut().for_each(|d| d.idle_since = None);
        // (case, stored, current until, first figure, want idle since at 60)
        type Case = (&'static str, NodeActivity, Option<i64>, f64, Option<i64>);
        let cases: [Case; 6] = [
            ("stored idle, 3% (the band): the stretch goes on", prior(), Some(0), 3.0, Some(-3600)),
            ("stored idle, just under 5%: the stretch goes on", prior(), Some(0), 4.9, Some(-3600)),
            ("stored idle, 5%: active", prior(), Some(0), ACTIVE_FROM_PERCENT, None),
            ("stored idle, 0.5%: the stretch goes on", prior(), Some(0), 0.5, Some(-3600)),
            ("stored active, 3%: active (idle only under 1%)", busy, Some(0), 3.0, None),
            ("stored idle, down past the gap rule, 3%: judged afresh, active", prior(), Some(-600), 3.0, None),
        ];
        for (name, stored, until, sm, want) in cases {
            let mut tr = Tracker::seed(t(60), &stored, until.map(t), vec![figure(sm)], &[]);
            assert_eq!(find(&tr, 60, "MIG-a").unwrap().idle_since, want.map(|s| Time(t(s))), "{name}");
            // The next figure in the band: as a running agent, the same (or no) stretch.
            tr.observe(t(90), vec![figure(3.0)]);
            assert_eq!(find(&tr, 90, "MIG-a").unwrap().idle_since, want.map(|s| Time(t(s))), "{name}: next");
        }
    }
}
