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
