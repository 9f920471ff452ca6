//! Which pod runs on each device, for `/metrics` and for `GpuNode.status.activity`: the API does
//! not say which device the device plugin gave which pod, but a device's compute processes do
//! (their cgroups name their pod). The operator takes a pod named here as the exact holder of
//! that device. A holder change is news for the summary ([`moved`]); at rest PIDs do not change,
//! so naming holders adds no writes.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::Timestamp;
use tessera_crds::activity::{DevicePod, NodeActivity};

use super::Tracker;

/// The pod running all of `pids`; `None` with no PID, with PIDs of several pods, or with one
/// not found in a pod (a process outside Kubernetes: the device is then not the pod's alone).
pub fn pod_of<'a>(pids: &[u32], holders: &'a BTreeMap<u32, DevicePod>) -> Option<&'a DevicePod> {
    let pods: Option<BTreeSet<&DevicePod>> = pids.iter().map(|p| holders.get(p)).collect();
    match pods?.into_iter().collect::<Vec<_>>()[..] {
        [pod] => Some(pod),
        _ => None,
    }
}

/// The tracker's summary at `now` with each device's pod named from `holders` (PID -> pod).
pub fn summary(tracker: &Tracker, now: Timestamp, holders: &BTreeMap<u32, DevicePod>) -> NodeActivity {
    let mut out = tracker.summary(now);
    for (d, (o, _)) in out.devices.iter_mut().zip(tracker.latest(now)) {
        // A device seeded unread has no PIDs yet: its stored holder (from the tracker) stands.
        d.pod = pod_of(&o.pids, holders).cloned().or(d.pod.take());
    }
    out
}

/// Whether a device of `current` names another pod than `written` did (the same device by GPU
/// and UUID; a device set change is caught before this).
pub fn moved(written: &NodeActivity, current: &NodeActivity) -> bool {
    current
        .devices
        .iter()
        .any(|d| written.devices.iter().any(|w| w.gpu_index == d.gpu_index && w.uuid == d.uuid && w.pod != d.pod))
}

#[cfg(test)]
mod tests {
    use tessera_crds::activity::{ActivitySource, DeviceActivity};

    use super::*;
    use crate::activity::Observation;
    use crate::activity::write::{Reason, should_write};

    fn pod(name: &str) -> DevicePod {
        DevicePod { namespace: "ml".into(), name: name.into(), uid: format!("uid-{name}") }
    }

    #[test]
    fn a_device_names_its_pod_only_when_all_its_processes_are_that_pods() {
        let holders = BTreeMap::from([(1, pod("a")), (2, pod("a")), (3, pod("b"))]);
        let cases: [(&str, &[u32], Option<&str>); 5] = [
            ("no process", &[], None),
            ("one pod's processes", &[1, 2], Some("a")),
            ("two pods share it", &[1, 3], None),
            ("a process outside any pod", &[1, 9], None),
            ("only an unknown process", &[9], None),
        ];
        for (case, pids, want) in cases {
            assert_eq!(pod_of(pids, &holders).map(|p| p.name.as_str()), want, "{case}");
        }
    }

    #[test]
    fn the_summary_names_each_devices_pod_and_a_new_holder_is_news() {
        let t = Timestamp::from_second(1_800_000_000).unwrap();
        let obs = |uuid: &str, pids: Vec<u32>| Observation {
            gpu_index: 0,
            model_name: "NVIDIA H100 80GB HBM3".into(),
            gpu_uuid: "GPU-0".into(),
            uuid: Some(uuid.into()),
            profile: Some("1g.10gb".into()),
            start: Some(0),
            gpu_instance_id: Some(9),
            source: ActivitySource::Gpm,
            sm_active_percent: None,
            gpm_failed: false,
            memory_used_mib: 0,
            processes: pids.len() as u32,
            pids,
        };
        let mut tracker = Tracker::default();
        tracker.observe(t, vec![obs("MIG-a", vec![1]), obs("MIG-b", vec![])]);
        let holders = BTreeMap::from([(1, pod("a"))]);
        let s = summary(&tracker, t, &holders);
        let named: Vec<_> = s.devices.iter().map(|d| (d.uuid.as_deref(), d.pod.clone())).collect();
        assert_eq!(named, vec![(Some("MIG-a"), Some(pod("a"))), (Some("MIG-b"), None)]);
        assert!(!moved(&s, &s), "unchanged");
        let mut other = s.clone();
        other.devices[0].pod = Some(pod("c"));
        assert!(moved(&s, &other), "another pod");
        other.devices[0].pod = None;
        assert!(moved(&s, &other), "its processes ended");
        // Written as news, within the write interval as any other change.
        let five = k8s_openapi::jiff::SignedDuration::from_mins(5);
        let later = |m: i64| t.checked_add(k8s_openapi::jiff::SignedDuration::from_mins(m)).unwrap();
        assert_eq!(should_write(Some((t, &s)), &other, later(6), five), Some(Reason::Holder));
        assert_eq!(should_write(Some((t, &s)), &other, later(1), five), None);
        assert_eq!(should_write(Some((t, &s)), &s, later(6), five), None, "at rest: no write");
        let gone = NodeActivity { devices: vec![DeviceActivity { gpu_index: 1, ..Default::default() }], ..s.clone() };
        assert!(!moved(&s, &gone), "no device in common: the device set change says it");
    }
}
