use super::*;

pub(super) fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

pub(super) fn mig(uuid: &str, source: ActivitySource, sm: Option<f64>, processes: u32) -> Observation {
    Observation {
        gpu_index: 0,
        model_name: "NVIDIA H100 80GB HBM3".into(),
        gpu_uuid: "GPU-0".into(),
        uuid: Some(uuid.into()),
        profile: Some("3g.40gb".into()),
        start: Some(4),
        gpu_instance_id: Some(2),
        source,
        sm_active_percent: sm,
        gpm_failed: false,
        memory_used_mib: 512,
        processes,
        pids: vec![],
    }
}

fn gpm(uuid: &str, sm: f64) -> Observation {
    mig(uuid, ActivitySource::Gpm, Some(sm), 1)
}

/// Feeds `tracker` one device sampled every `step` seconds from `from` to `to` (exclusive).
fn run(tracker: &mut Tracker, from: i64, to: i64, step: i64, o: impl Fn(i64) -> Vec<Observation>) {
    let mut s = from;
    while s < to {
        tracker.observe(t(s), o(s));
        s += step;
    }
}

fn device(tracker: &Tracker, now: i64, uuid: &str) -> DeviceActivity {
    let summary = tracker.summary(t(now));
    summary.devices.into_iter().find(|d| d.uuid.as_deref() == Some(uuid)).expect("device in summary")
}

#[test]
fn windows_and_idle_since_per_case() {
    struct Case {
        name: &'static str,
        /// (from, to, percent) phases, sampled every 30 s.
        phases: &'static [(i64, i64, f64)],
        now: i64,
        want_1h: Option<i32>,
        want_24h: Option<i32>,
        want_idle_since: Option<i64>,
    }
    let cases = [
        Case {
            name: "steady 30% for two hours",
            phases: &[(0, 7200, 30.0)],
            now: 7170,
            want_1h: Some(30),
            want_24h: Some(30),
            want_idle_since: None,
        },
        Case {
            name: "busy an hour, then idle an hour: idle since the first idle interval began",
            phases: &[(0, 3600, 100.0), (3600, 7200, 0.0)],
            now: 7170,
            want_1h: Some(0),
            want_24h: Some(50),
            want_idle_since: Some(3570),
        },
        Case {
            name: "under 1% is idle; idle, it is active again only from 5% (hysteresis)",
            phases: &[(0, 600, 0.5), (600, 1200, 5.0)],
            now: 1170,
            want_1h: Some(3),
            want_24h: Some(3),
            want_idle_since: None,
        },
        Case {
            name: "a day and a half busy, then two hours idle: old minutes leave the 24 h window",
            phases: &[(0, 36 * 3600, 100.0), (36 * 3600, 38 * 3600, 0.0)],
            now: 38 * 3600 - 30,
            want_1h: Some(0),
            want_24h: Some(92),
            want_idle_since: Some(36 * 3600 - 30),
        },
    ];
    for c in cases {
        let mut tr = Tracker::default();
        for &(from, to, p) in c.phases {
            run(&mut tr, from, to, 30, |_| vec![gpm("MIG-a", p)]);
        }
        let d = device(&tr, c.now, "MIG-a");
        assert_eq!(d.source, ActivitySource::Gpm, "{}", c.name);
        assert_eq!(d.active_percent_1h, c.want_1h, "{}: 1 h", c.name);
        assert_eq!(d.active_percent_24h, c.want_24h, "{}: 24 h", c.name);
        assert_eq!(d.idle_since, c.want_idle_since.map(|s| Time(t(s))), "{}: idle since", c.name);
    }
}

#[test]
fn without_gpm_idle_means_no_compute_process_and_no_share_is_claimed() {
    let mut tr = Tracker::default();
    let pm = |procs| vec![mig("MIG-a", ActivitySource::ProcessesAndMemory, None, procs)];
    tr.observe(t(0), pm(0));
    tr.observe(t(30), pm(0));
    let d = device(&tr, 30, "MIG-a");
    assert_eq!((d.active_percent_1h, d.active_percent_24h), (None, None));
    assert_eq!(d.idle_since, Some(Time(t(0))));
    assert_eq!((d.memory_used_mib, d.processes), (512, 0));
    tr.observe(t(60), pm(1));
    assert_eq!(device(&tr, 60, "MIG-a").idle_since, None);
    tr.observe(t(90), pm(0));
    assert_eq!(device(&tr, 90, "MIG-a").idle_since, Some(Time(t(90))));
}

#[test]
fn a_first_gpm_sample_decides_nothing() {
    let mut tr = Tracker::default();
    tr.observe(t(0), vec![mig("MIG-a", ActivitySource::Gpm, None, 0)]);
    let d = device(&tr, 0, "MIG-a");
    assert_eq!((d.active_percent_1h, d.idle_since), (None, None));
}

#[test]
fn destroyed_devices_drop_out_and_new_ones_start_fresh() {
    let mut tr = Tracker::default();
    run(&mut tr, 0, 600, 30, |_| vec![gpm("MIG-a", 80.0), gpm("MIG-b", 0.0)]);
    // MIG-b destroyed, MIG-c made in its place.
    tr.observe(t(600), vec![gpm("MIG-a", 80.0), mig("MIG-c", ActivitySource::Gpm, None, 0)]);
    let s = tr.summary(t(600));
    let uuids: Vec<_> = s.devices.iter().map(|d| d.uuid.clone().unwrap()).collect();
    assert_eq!(uuids, vec!["MIG-a", "MIG-c"]);
    let c = device(&tr, 600, "MIG-c");
    assert_eq!((c.active_percent_1h, c.idle_since), (None, None));
    assert_eq!(device(&tr, 600, "MIG-a").active_percent_1h, Some(80));
}

#[test]
fn a_long_gap_is_not_credited_to_either_window() {
    let mut tr = Tracker::default();
    run(&mut tr, 0, 600, 30, |_| vec![gpm("MIG-a", 0.0)]);
    // Stopped for an hour; the first sample after reports 100% for the (unknown) gap.
    run(&mut tr, 4200, 4800, 30, |_| vec![gpm("MIG-a", 100.0)]);
    let d = device(&tr, 4770, "MIG-a");
    assert_eq!(d.active_percent_24h, Some(50), "570 s idle against 570 s busy, the gap left out");
    assert_eq!(d.idle_since, None);
}

#[test]
fn an_idle_stretch_does_not_span_a_gap_past_the_gap_rule() {
    let pm = |procs| mig("MIG-a", ActivitySource::ProcessesAndMemory, None, procs);
    let unknown = || Observation { gpm_failed: true, ..mig("MIG-a", ActivitySource::Gpm, None, 1) };
    // (case, before the gap, gap (s), the first sample after it, want idle since)
    type Case = (&'static str, fn(u32) -> Observation, i64, Observation, Option<i64>);
    let gpm0 = |_| gpm("MIG-a", 0.0);
    let cases: [Case; 6] = [
        ("a gap of exactly the gap rule: the stretch goes on", gpm0, 600, gpm("MIG-a", 0.0), Some(0)),
        ("hung an hour, idle after: a new stretch from the sample after", gpm0, 3600, gpm("MIG-a", 0.0), Some(4170)),
        ("hung an hour, then 3% (the band): not idle, nothing to go on", gpm0, 3600, gpm("MIG-a", 3.0), None),
        ("hung an hour, then GPM failed with a process: unknown, not idle", gpm0, 3600, unknown(), None),
        ("without GPM: a new stretch from the sample after", pm, 3600, pm(0), Some(4170)),
        ("without GPM, a gap of exactly the gap rule: the stretch goes on", pm, 600, pm(0), Some(0)),
    ];
    for (name, before, gap, after, want) in cases {
        let mut tr = Tracker::default();
        run(&mut tr, 0, 600, 30, |_| vec![before(0)]);
        tr.observe(t(570 + gap), vec![after]);
        assert_eq!(device(&tr, 570 + gap, "MIG-a").idle_since, want.map(|s| Time(t(s))), "{name}");
    }
}

fn prior(measured_at: i64, uuid: &str, source: ActivitySource, idle_since: Option<i64>) -> NodeActivity {
    NodeActivity {
        measured_at: Some(Time(t(measured_at))),
        devices: vec![DeviceActivity {
            gpu_index: 0,
            uuid: Some(uuid.into()),
            source,
            active_percent_1h: Some(40),
            active_percent_24h: Some(20),
            idle_since: idle_since.map(|s| Time(t(s))),
            ..Default::default()
        }],
    }
}

#[test]
fn a_restart_is_seeded_from_the_stored_summary_per_case() {
    struct Case {
        name: &'static str,
        prior: NodeActivity,
        first: Observation,
        now: i64,
        want_1h: Option<i32>,
        want_24h: Option<i32>,
        want_idle_since: Option<i64>,
    }
    let gpm_first = mig("MIG-a", ActivitySource::Gpm, None, 0);
    let pm = |procs| mig("MIG-a", ActivitySource::ProcessesAndMemory, None, procs);
    let cases = [
        Case {
            name: "same device, GPM's first sample undecided: idle since and both shares kept",
            prior: prior(0, "MIG-a", ActivitySource::Gpm, Some(-600)),
            first: gpm_first.clone(),
            now: 45,
            want_1h: Some(40),
            want_24h: Some(20),
            want_idle_since: Some(-600),
        },
        Case {
            name: "same device, idle now: the earlier idle since wins over now",
            prior: prior(0, "MIG-a", ActivitySource::ProcessesAndMemory, Some(-600)),
            first: pm(0),
            now: 45,
            want_1h: Some(40),
            want_24h: Some(20),
            want_idle_since: Some(-600),
        },
        Case {
            name: "same device, active now: no idle since",
            prior: prior(0, "MIG-a", ActivitySource::ProcessesAndMemory, Some(-600)),
            first: pm(1),
            now: 45,
            want_1h: Some(40),
            want_24h: Some(20),
            want_idle_since: None,
        },
        Case {
            name: "another UUID (the instance was recreated): nothing carried",
            prior: prior(0, "MIG-old", ActivitySource::Gpm, Some(-600)),
            first: gpm_first.clone(),
            now: 45,
            want_1h: None,
            want_24h: None,
            want_idle_since: None,
        },
        Case {
            name: "measured another way before: nothing carried, idle from now",
            prior: prior(0, "MIG-a", ActivitySource::Gpm, Some(-600)),
            first: pm(0),
            now: 45,
            want_1h: None,
            want_24h: None,
            want_idle_since: Some(45),
        },
        Case {
            name: "stored more than a day ago, kept current until now (at rest): the stretch and hour kept, the \
                   day's share aged from when it was measured (only the hour is left of it)",
            prior: prior(0, "MIG-a", ActivitySource::Gpm, Some(-600)),
            first: gpm_first.clone(),
            now: 25 * 3600,
            want_1h: Some(40),
            want_24h: Some(40),
            want_idle_since: Some(-600),
        },
        Case {
            name: "stored in the future (clock skew), kept current until now: the shares carried as of now, no \
                   idle since from the future",
            prior: prior(600, "MIG-a", ActivitySource::Gpm, Some(300)),
            first: gpm_first,
            now: 45,
            want_1h: Some(40),
            want_24h: Some(20),
            want_idle_since: None,
        },
    ];
    for c in cases {
        let tr = Tracker::seed(t(c.now), &c.prior, Some(t(c.now)), vec![c.first], &[]);
        let d = device(&tr, c.now, "MIG-a");
        assert_eq!(d.active_percent_1h, c.want_1h, "{}: 1 h", c.name);
        assert_eq!(d.active_percent_24h, c.want_24h, "{}: 24 h", c.name);
        assert_eq!(d.idle_since, c.want_idle_since.map(|s| Time(t(s))), "{}: idle since", c.name);
    }
}

#[test]
fn a_seeded_share_blends_with_new_samples_and_ages_out_of_the_hour() {
    let mut tr =
        Tracker::seed(t(0), &prior(0, "MIG-a", ActivitySource::Gpm, None), Some(t(0)), vec![gpm("MIG-a", 0.0)], &[]);
    run(&mut tr, 30, 1830, 30, |_| vec![gpm("MIG-a", 0.0)]);
    // The stored hour (40%) is half out of the window half an hour later: as real history,
    // 30 min of 40% and 30 min of 0%.
    assert_eq!(device(&tr, 1800, "MIG-a").active_percent_1h, Some(20));
    run(&mut tr, 1830, 3720, 30, |_| vec![gpm("MIG-a", 0.0)]);
    let d = device(&tr, 3690, "MIG-a");
    assert_eq!(d.active_percent_1h, Some(0), "the prior hour left the window");
    assert!(d.active_percent_24h.is_some_and(|p| p > 0 && p < 20), "{:?}", d.active_percent_24h);
}

/// A sample whose GPM read failed, with `processes` compute processes.
fn gpm_failed(uuid: &str, processes: u32) -> Observation {
    Observation { gpm_failed: true, ..mig(uuid, ActivitySource::Gpm, None, processes) }
}

#[test]
fn a_gpm_error_with_a_process_is_unknown_and_keeps_the_idle_stretch() {
    let mut tr = Tracker::default();
    // An idle pod holding a CUDA context: GPM 0%, one process, idle since 0.
    run(&mut tr, 0, 600, 30, |_| vec![gpm("MIG-a", 0.0)]);
    assert_eq!(device(&tr, 570, "MIG-a").idle_since, Some(Time(t(0))));
    // One GPM error: the open context says nothing about computing; the stretch goes on.
    tr.observe(t(600), vec![gpm_failed("MIG-a", 1)]);
    let d = device(&tr, 600, "MIG-a");
    assert_eq!((d.idle_since, d.active_percent_1h), (Some(Time(t(0))), Some(0)));
    run(&mut tr, 630, 700, 30, |_| vec![gpm("MIG-a", 0.0)]);
    assert_eq!(device(&tr, 690, "MIG-a").idle_since, Some(Time(t(0))), "GPM back: still the same stretch");
    // A busy device stays busy through an error with its process, and is idle through one
    // without any.
    let mut busy = Tracker::default();
    run(&mut busy, 0, 300, 30, |_| vec![gpm("MIG-b", 60.0)]);
    busy.observe(t(300), vec![gpm_failed("MIG-b", 1)]);
    assert_eq!(device(&busy, 300, "MIG-b").idle_since, None);
    busy.observe(t(330), vec![gpm_failed("MIG-b", 0)]);
    assert_eq!(device(&busy, 330, "MIG-b").idle_since, Some(Time(t(330))));
}

#[test]
fn a_device_whose_gpm_always_fails_is_judged_by_its_processes_after_a_while() {
    let mut tr = Tracker::default();
    run(&mut tr, 0, 300, 30, |_| vec![gpm("MIG-a", 0.0)]);
    // GPM fails every sample while a pod computes: unknown at first, then, after
    // GPM_FAILURES_BEFORE_PROCESSES failures in a row, busy by the processes rule.
    let mut s = 300;
    for _ in 1..GPM_FAILURES_BEFORE_PROCESSES {
        tr.observe(t(s), vec![gpm_failed("MIG-a", 1)]);
        s += 30;
    }
    assert_eq!(device(&tr, s, "MIG-a").idle_since, Some(Time(t(0))), "not yet");
    tr.observe(t(s), vec![gpm_failed("MIG-a", 1)]);
    assert_eq!(device(&tr, s, "MIG-a").idle_since, None, "judged by its process");
    // One good GPM figure in between starts the count over.
    tr.observe(t(s + 30), vec![gpm("MIG-a", 0.0)]);
    tr.observe(t(s + 60), vec![gpm_failed("MIG-a", 1)]);
    assert_eq!(device(&tr, s + 60, "MIG-a").idle_since, Some(Time(t(s))));
}

#[test]
fn a_device_that_could_not_be_read_keeps_its_history_for_up_to_the_gap_rule() {
    let mut tr = Tracker::default();
    run(&mut tr, 0, 300, 30, |_| vec![gpm("MIG-a", 0.0), gpm("MIG-b", 50.0)]);
    let before = tr.summary(t(270));
    // MIG-a's read fails: it stays in the summary as last seen (nothing new to write), MIG-b goes
    // on; one GPU-wide failure (its instances could not be listed) keeps both.
    tr.observe_unread(t(300), vec![gpm("MIG-b", 50.0)], &[(0, Some("MIG-a".into()))]);
    tr.observe_unread(t(330), vec![], &[(0, None)]);
    assert_eq!(tr.summary(t(330)).devices, before.devices);
    // Back within ten minutes: the same idle stretch.
    tr.observe(t(360), vec![gpm("MIG-a", 0.0), gpm("MIG-b", 50.0)]);
    assert_eq!(device(&tr, 360, "MIG-a").idle_since, Some(Time(t(0))));
    // Unread for longer than the gap rule: forgotten, and a new start when it is back.
    run(&mut tr, 390, 1000, 30, |_| vec![gpm("MIG-b", 50.0)]);
    let mut unread = Tracker::default();
    run(&mut unread, 0, 300, 30, |_| vec![gpm("MIG-a", 0.0)]);
    let mut s = 300;
    while s <= 270 + MAX_INTERVAL.as_secs() {
        unread.observe_unread(t(s), vec![], &[(0, Some("MIG-a".into()))]);
        assert_eq!(unread.summary(t(s)).devices.len(), 1, "kept at {s}");
        s += 30;
    }
    unread.observe_unread(t(s), vec![], &[(0, Some("MIG-a".into()))]);
    assert!(unread.summary(t(s)).devices.is_empty(), "forgotten at {s}");
    // A device merely missing (destroyed) drops out at once, as before.
    tr.observe(t(1000), vec![gpm("MIG-b", 50.0)]);
    assert!(tr.summary(t(1000)).devices.iter().all(|d| d.uuid.as_deref() == Some("MIG-b")));
}

mod band;
