//! The tracker against figures hovering at the idle threshold and a clock stepped backwards.

use super::super::*;

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

fn gpm(sm: f64) -> Observation {
    Observation {
        gpu_index: 0,
        model_name: "NVIDIA H100 80GB HBM3".into(),
        gpu_uuid: "GPU-0".into(),
        uuid: Some("MIG-a".into()),
        profile: Some("3g.40gb".into()),
        start: Some(4),
        gpu_instance_id: Some(2),
        source: ActivitySource::Gpm,
        sm_active_percent: Some(sm),
        gpm_failed: false,
        memory_used_mib: 11,
        processes: 1,
        pids: vec![],
    }
}

fn device(tracker: &Tracker, now: i64) -> DeviceActivity {
    tracker.summary(t(now)).devices.into_iter().next().expect("device in summary")
}

#[test]
fn a_figure_hovering_at_the_idle_threshold_keeps_one_idle_stretch() {
    let mut tr = Tracker::default();
    tr.observe(t(0), vec![gpm(0.0)]);
    // 0.8% / 1.3% in turn for an hour: one idle stretch, from the first sample.
    for i in 1..120 {
        tr.observe(t(i * 30), vec![gpm(if i % 2 == 0 { 0.8 } else { 1.3 })]);
        assert_eq!(device(&tr, i * 30).idle_since.map(|s| s.0), Some(t(0)), "sample {i}");
    }
    // Under ACTIVE_FROM_PERCENT it stays idle; at it, it is active at once.
    tr.observe(t(3600), vec![gpm(ACTIVE_FROM_PERCENT - 0.1)]);
    assert!(device(&tr, 3600).idle_since.is_some());
    tr.observe(t(3630), vec![gpm(ACTIVE_FROM_PERCENT)]);
    assert_eq!(device(&tr, 3630).idle_since, None);
    // An active device at 3% stays active: it goes idle only under 1%.
    tr.observe(t(3660), vec![gpm(3.0)]);
    assert_eq!(device(&tr, 3660).idle_since, None);
    tr.observe(t(3690), vec![gpm(0.9)]);
    assert_eq!(device(&tr, 3690).idle_since.map(|s| s.0), Some(t(3660)));
}

#[test]
fn a_clock_stepped_back_credits_no_negative_interval_and_keeps_idle_since_in_the_past() {
    // Idle for 10 min, then the clock steps back an hour: the stretch keeps its 10 min (the
    // step counts as no time), never in the future.
    let mut tr = Tracker::default();
    for i in 0..=20 {
        tr.observe(t(i * 30), vec![gpm(0.0)]);
    }
    tr.observe(t(630 - 3600), vec![gpm(0.0)]);
    assert_eq!(device(&tr, 630 - 3600).idle_since.map(|s| s.0), Some(t(-3570)));
    // Busy, then idle on the first sample after the step: idle since then, not since the old
    // (future) sample time.
    let mut tr = Tracker::default();
    for i in 0..=20 {
        tr.observe(t(i * 30), vec![gpm(60.0)]);
    }
    tr.observe(t(630 - 3600), vec![gpm(0.0)]);
    let since = device(&tr, 630 - 3600).idle_since.map(|s| s.0);
    assert!(since.is_some_and(|s| s <= t(630 - 3600)), "{since:?}");
    // An hour at 60% then, after a 2 h step back, an hour at 0%: the busy hour left the 1 h
    // window (it was an hour ago), not counted as the future.
    let mut tr = Tracker::default();
    for i in 0..120 {
        tr.observe(t(i * 30), vec![gpm(60.0)]);
    }
    for i in 0..120 {
        tr.observe(t(i * 30 - 3600), vec![gpm(0.0)]);
    }
    let d = device(&tr, -30);
    assert!(d.active_percent_1h.is_some_and(|p| p <= 1), "{:?}", d.active_percent_1h);
    assert!(d.active_percent_24h.is_some_and(|p| (29..=31).contains(&p)), "{:?}", d.active_percent_24h);
}

#[test]
fn a_device_kept_unread_across_a_clock_step_back_is_moved_back_too() {
    let pm = |uuid: &str| Observation {
        uuid: Some(uuid.into()),
        source: ActivitySource::ProcessesAndMemory,
        sm_active_percent: None,
        processes: 0,
        ..gpm(0.0)
    };
    let one = [(0, Some("MIG-b".to_string()))];
    let mut tr = Tracker::default();
    tr.observe(t(0), vec![pm("MIG-a"), pm("MIG-b")]);
    tr.observe_unread(t(30), vec![pm("MIG-a")], &one);
    // The clock steps back an hour before the next pass; MIG-b is still unread.
    let now = 60 - 3600;
    tr.observe_unread(t(now), vec![pm("MIG-a")], &one);
    let b = tr.summary(t(now)).devices.into_iter().find(|d| d.uuid.as_deref() == Some("MIG-b")).unwrap();
    let since = b.idle_since.unwrap().0;
    assert!(since <= t(now), "never in the future: {since}");
    assert_eq!(since, t(-3570), "moved back by the step (the 30 s it had kept)");
    // Kept 10 min after its last read (-3570), not for the step too.
    tr.observe_unread(t(-3570 + 600), vec![pm("MIG-a")], &one);
    assert!(tr.summary(t(-2970)).devices.iter().any(|d| d.uuid.as_deref() == Some("MIG-b")), "kept at +600 s");
    tr.observe_unread(t(-3570 + 601), vec![pm("MIG-a")], &one);
    assert!(tr.summary(t(-2969)).devices.iter().all(|d| d.uuid.as_deref() != Some("MIG-b")));
}

#[test]
fn a_clock_step_back_at_least_as_long_as_an_outage_does_not_hide_it() {
    // Idle since 0, sampled every 30 s to 3600. The clock steps back an hour; nothing is
    // sampled for 50 min, so the next sample reads 3000 by the new clock.
    let base = std::time::Instant::now();
    let mono = |s: u64| base + std::time::Duration::from_secs(s);
    let sampled = || {
        let mut tr = Tracker::default();
        for i in 0..=120 {
            tr.observe_at(t(i * 30), mono(i as u64 * 30), vec![gpm(0.0)], &[]);
        }
        tr
    };
    let mut tr = sampled();
    tr.observe_at(t(3000), mono(3600 + 3000), vec![gpm(0.0)], &[]);
    assert_eq!(device(&tr, 3000).idle_since, Some(Time(t(3000))), "50 min unobserved: the stretch starts over");
    // Only 30 s really passed across the same step: the stretch goes on, moved back by the step.
    let mut tr = sampled();
    tr.observe_at(t(30), mono(3630), vec![gpm(0.0)], &[]);
    assert_eq!(device(&tr, 30).idle_since, Some(Time(t(-3600))));
    // Under a second of drift between the clocks moves nothing.
    tr.observe_at(t(60), mono(3660) + std::time::Duration::from_millis(400), vec![gpm(0.0)], &[]);
    assert_eq!(device(&tr, 60).idle_since, Some(Time(t(-3600))));
}

/// A small backward step with the wall clock still moving forward is no step: only the interval
/// reads shorter, and `idleSince` stays (moving it on every step of a second or more would cost
/// a write per node and step: a leap second, or a VM's time sync stepping a fast guest back
/// every few minutes). One that leaves a negative interval, or of a minute or more, still moves
/// it back.
#[test]
fn a_small_step_back_with_time_still_moving_forward_moves_no_idle_since() {
    let base = std::time::Instant::now();
    let mono = |s: u64| base + std::time::Duration::from_secs(s);
    let mut tr = Tracker::default();
    for i in 0..=10 {
        tr.observe_at(t(i * 30), mono(i as u64 * 30), vec![gpm(0.0)], &[]);
    }
    // A leap second: 30 s pass by the monotonic clock, 29 s by the wall clock.
    tr.observe_at(t(329), mono(330), vec![gpm(0.0)], &[]);
    assert_eq!(device(&tr, 329).idle_since, Some(Time(t(0))), "a 1 s step moves nothing");
    // 45 s back within a 30 s interval: the wall clock went backwards, so it is moved back.
    tr.observe_at(t(314), mono(360), vec![gpm(0.0)], &[]);
    assert_eq!(device(&tr, 314).idle_since, Some(Time(t(-45))), "a negative interval is a step");
}
