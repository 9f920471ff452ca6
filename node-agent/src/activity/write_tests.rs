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
            "a share's first figure",
            Some((t(0), &written)),
            node(vec![dev("MIG-a", Some(40), false), dev("MIG-b", None, true)]),
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
