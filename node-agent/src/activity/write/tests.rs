use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tessera_crds::activity::DeviceActivity;

use super::*;

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

fn dev(uuid: &str, share: Option<i32>, idle: bool) -> DeviceActivity {
    DeviceActivity {
        gpu_index: 0,
        uuid: Some(uuid.into()),
        active_percent_1h: share,
        idle_since: idle.then(|| Time(t(0))),
        ..Default::default()
    }
}

fn node(devices: Vec<DeviceActivity>) -> NodeActivity {
    NodeActivity { measured_at: None, devices }
}

/// (case, last written, current, now, expected).
type Case<'a> = (&'a str, Option<(Timestamp, &'a NodeActivity)>, NodeActivity, i64, Option<Reason>);

#[test]
fn writes_only_meaningful_changes_and_not_too_often() {
    let five = SignedDuration::from_mins(5);
    let written = node(vec![dev("MIG-a", Some(40), false), dev("MIG-b", Some(0), true)]);
    let unmeasured = node(vec![dev("MIG-a", Some(40), false), dev("MIG-b", None, true)]);
    let cases: Vec<Case> = vec![
        ("nothing written yet", None, node(vec![]), 0, Some(Reason::First)),
        ("unchanged", Some((t(0), &written)), written.clone(), 3600, None),
        (
            "share moved 9 points",
            Some((t(0), &written)),
            node(vec![dev("MIG-a", Some(49), false), dev("MIG-b", Some(0), true)]),
            600,
            None,
        ),
        (
            "share moved 10 points",
            Some((t(0), &written)),
            node(vec![dev("MIG-a", Some(30), false), dev("MIG-b", Some(0), true)]),
            600,
            Some(Reason::Share),
        ),
        (
            "share moved, but within the interval",
            Some((t(0), &written)),
            node(vec![dev("MIG-a", Some(90), false), dev("MIG-b", Some(0), true)]),
            299,
            None,
        ),
        (
            "a device went idle",
            Some((t(0), &written)),
            node(vec![dev("MIG-a", Some(40), true), dev("MIG-b", Some(0), true)]),
            300,
            Some(Reason::IdleTransition),
        ),
        (
            "an idle device became active",
            Some((t(0), &written)),
            node(vec![dev("MIG-a", Some(40), false), dev("MIG-b", Some(0), false)]),
            300,
            Some(Reason::IdleTransition),
        ),
        (
            "a device was destroyed",
            Some((t(0), &written)),
            node(vec![dev("MIG-a", Some(40), false)]),
            300,
            Some(Reason::DeviceSet),
        ),
        (
            "a device replaced by another",
            Some((t(0), &written)),
            node(vec![dev("MIG-a", Some(40), false), dev("MIG-c", None, false)]),
            300,
            Some(Reason::DeviceSet),
        ),
        (
            "a share lost its figure",
            Some((t(0), &written)),
            node(vec![dev("MIG-a", Some(40), false), dev("MIG-b", None, true)]),
            300,
            Some(Reason::Share),
        ),
        (
            "a share's first figure",
            Some((t(0), &unmeasured)),
            node(vec![dev("MIG-a", Some(40), false), dev("MIG-b", Some(0), true)]),
            300,
            Some(Reason::Share),
        ),
    ];
    for (name, last, current, now, want) in cases {
        assert_eq!(should_write(last, &current, t(now), five), want, "{name}");
    }
}

#[test]
fn a_source_change_is_a_device_set_change() {
    let written = node(vec![dev("MIG-a", Some(40), false)]);
    let mut now = written.clone();
    now.devices[0].source = ActivitySource::ProcessesAndMemory;
    let got = should_write(Some((t(0), &written)), &now, t(300), SignedDuration::from_mins(5));
    assert_eq!(got, Some(Reason::DeviceSet));
}

#[test]
fn idle_again_after_a_short_burst_is_written_with_its_later_idle_since() {
    let written = node(vec![dev("MIG-b", Some(0), true)]);
    let mut again = dev("MIG-b", Some(0), true);
    again.idle_since = Some(Time(t(900)));
    let got = should_write(Some((t(0), &written)), &node(vec![again]), t(1200), SignedDuration::from_mins(5));
    assert_eq!(got, Some(Reason::IdleTransition));
}

#[test]
fn memory_or_processes_appearing_or_ending_is_news_and_a_device_at_rest_writes_nothing() {
    // An idle GPM device: its share and idleness do not move when a leak begins or ends.
    let with = |mib: i64, processes: i32| {
        let mut d = dev("MIG-a", Some(0), true);
        (d.memory_used_mib, d.processes) = (mib, processes);
        node(vec![d])
    };
    let cases: Vec<(&str, NodeActivity, NodeActivity, i64, bool)> = vec![
        ("a leak begins: memory held, no process", with(0, 0), with(2048, 0), 300, true),
        ("a leak ends: the memory is freed", with(2048, 0), with(0, 0), 300, true),
        ("a process starts", with(0, 0), with(0, 1), 300, true),
        ("the last process ends", with(512, 1), with(512, 0), 300, true),
        ("only the amount of memory moved", with(2048, 0), with(4096, 0), 300, false),
        ("only the number of processes moved", with(512, 1), with(512, 3), 300, false),
        ("a leak begins, but within the interval", with(0, 0), with(2048, 0), 299, false),
        ("at rest with memory held", with(2048, 1), with(2048, 1), 3600, false),
        // Real hardware: an idle MIG device shows tens of MiB in use, never 0.
        ("a leak ends: back to an idle device's 11 MiB", with(2048, 0), with(11, 0), 300, true),
        ("a leak begins from an idle device's 11 MiB", with(11, 0), with(2048, 0), 300, true),
        ("an idle device's baseline is no leak", with(0, 0), with(11, 0), 300, false),
        ("the baseline moved", with(11, 0), with(14, 0), 300, false),
        ("at the leak threshold is no leak", with(11, 0), with(256, 0), 300, false),
        ("just above it is", with(256, 0), with(257, 0), 300, true),
    ];
    for (name, written, current, now, news) in cases {
        let got = should_write(Some((t(0), &written)), &current, t(now), SignedDuration::from_mins(5));
        assert_eq!(got, news.then_some(Reason::Usage), "{name}");
    }
}

#[test]
fn a_leak_figure_hovering_at_the_threshold_is_written_once_and_memory_counts_only_without_processes() {
    let with = |mib: i64, processes: i32| {
        let mut d = dev("MIG-a", Some(0), true);
        (d.memory_used_mib, d.processes) = (mib, processes);
        node(vec![d])
    };
    let cases: Vec<(&str, NodeActivity, NodeActivity, bool)> = vec![
        // Written held at 262: hovering just under the threshold is no news...
        ("held, dips just under the threshold", with(262, 0), with(250, 0), false),
        ("held, down to the release band's edge", with(262, 0), with(129, 0), false),
        // ...only falling to the release band (half the threshold) ends the leak.
        ("held, freed to the release band", with(262, 0), with(128, 0), true),
        ("not held, rises over the threshold", with(250, 0), with(262, 0), true),
        ("not held, hovers under it", with(129, 0), with(256, 0), false),
        // With a compute process the memory says nothing of a leak (the process does).
        ("a process runs while its memory crosses the threshold", with(100, 1), with(2048, 1), false),
        ("a process runs while its memory is freed", with(2048, 2), with(11, 2), false),
        ("the process ends, its memory held", with(2048, 1), with(2048, 0), true),
    ];
    for (name, written, current, news) in cases {
        let got = should_write(Some((t(0), &written)), &current, t(300), SignedDuration::from_mins(5));
        assert_eq!(got, news.then_some(Reason::Usage), "{name}");
    }
    // A figure alternating 250 / 262 MiB every sample for a day: one write, not one an interval.
    let mut last = (t(0), with(250, 0));
    let mut writes = 0;
    for i in 1..2880 {
        let current = with(if i % 2 == 0 { 250 } else { 262 }, 0);
        if should_write(Some((last.0, &last.1)), &current, t(i * 30), SignedDuration::from_mins(5)).is_some() {
            writes += 1;
            last = (t(i * 30), current);
        }
    }
    assert_eq!(writes, 1, "hovering costs one write");
}

#[test]
fn a_device_waking_is_written_at_once_and_other_news_waits_the_interval() {
    let five = SignedDuration::from_mins(5);
    // Written at 600 s: MIG-b idle since 0 (10 min then).
    let written = node(vec![dev("MIG-a", Some(40), false), dev("MIG-b", Some(0), true)]);
    let woke = node(vec![dev("MIG-a", Some(40), false), dev("MIG-b", Some(0), false)]);
    let cases: Vec<(&str, NodeActivity, i64, Option<Reason>)> = vec![
        ("an idle device wakes 30 s after a write", woke.clone(), 630, Some(Reason::Wake)),
        (
            "it wakes while another device went idle",
            node(vec![dev("MIG-a", Some(40), true), dev("MIG-b", Some(0), false)]),
            630,
            Some(Reason::Wake),
        ),
        ("a device going idle waits", node(vec![dev("MIG-a", Some(40), true), dev("MIG-b", Some(0), true)]), 630, None),
        ("a share step waits", node(vec![dev("MIG-a", Some(90), false), dev("MIG-b", Some(0), true)]), 630, None),
        ("a device gone waits", node(vec![dev("MIG-b", Some(0), true)]), 630, None),
        ("after the interval it is an idle transition as before", woke.clone(), 900, Some(Reason::IdleTransition)),
    ];
    for (name, current, now, want) in cases {
        assert_eq!(should_write(Some((t(600), &written)), &current, t(now), five), want, "{name}");
    }
    // Written idle for less than an interval (a short pause, or a device flapping sample after
    // sample): its waking waits like any news, so flapping costs no write per sample.
    let mut brief = written.clone();
    brief.devices[1].idle_since = Some(Time(t(400)));
    assert_eq!(should_write(Some((t(600), &brief)), &woke, t(630), five), None);
    assert_eq!(should_write(Some((t(600), &brief)), &woke, t(900), five), Some(Reason::IdleTransition));
}

#[test]
fn a_clock_stepped_back_before_the_last_write_does_not_stall_writes() {
    let five = SignedDuration::from_mins(5);
    let written = node(vec![dev("MIG-a", Some(40), false)]);
    let moved = node(vec![dev("MIG-a", Some(90), false)]);
    // The clock stepped back an hour after the write: the news is written, not held for 65 min.
    assert_eq!(should_write(Some((t(3600), &written)), &moved, t(30), five), Some(Reason::Share));
    // Nothing new is still nothing.
    assert_eq!(should_write(Some((t(3600), &written)), &written, t(30), five), None);
    // An `idleSince` written before the step lies in the future now; the tracker moved its own
    // back by the step: that is rewritten, else the operator reads the device as not idle.
    let mut idle = dev("MIG-a", Some(0), true);
    idle.idle_since = Some(Time(t(3000)));
    let before_step = node(vec![idle.clone()]);
    idle.idle_since = Some(Time(t(-570)));
    let got = should_write(Some((t(3600), &before_step)), &node(vec![idle]), t(30), five);
    assert_eq!(got, Some(Reason::IdleTransition));
}
