use serde_json::{Value, json};

use super::*;
use crate::fleet_status::fleet_status;

mod exact;

const H100: &str = "NVIDIA H100 80GB HBM3";
const NOW: &str = "2026-06-01T12:00:00Z";

fn now() -> Timestamp {
    NOW.parse().unwrap()
}

/// A node with one H100 cut 3g.40gb@0 + 3g.40gb@4 and one whole GPU, and the agent's figures.
fn gpunode(name: &str, activity: Vec<Value>) -> GpuNode {
    let gpus = json!([
        {"index": 0, "uuid": "GPU-0", "product": H100, "migCapable": true, "migEnabled": true,
         "instances": [{"profile": "3g.40gb", "start": 0, "size": 4}, {"profile": "3g.40gb", "start": 4, "size": 4}]},
        {"index": 1, "uuid": "GPU-1", "product": H100, "migCapable": true}
    ]);
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": name}, "spec": {},
        "status": {"gpus": gpus, "activity": {"measuredAt": NOW, "devices": activity}}}))
    .unwrap()
}

/// A GPM figure: idle since `idle_since`, or busy (a 1h share of 40%) without one.
fn mig_act(start: i32, idle_since: Option<&str>, mib: i64) -> Value {
    let share = if idle_since.is_some() { 0 } else { 40 };
    json!({"gpuIndex": 0, "profile": "3g.40gb", "start": start, "source": "Gpm", "idleSince": idle_since,
           "activePercent1h": share, "memoryUsedMib": mib, "processes": i32::from(mib > 0)})
}

fn whole_act(idle_since: Option<&str>, mib: i64, processes: i32) -> Value {
    json!({"gpuIndex": 1, "source": "ProcessesAndMemory", "idleSince": idle_since, "memoryUsedMib": mib,
           "processes": processes})
}

fn pod(ns: &str, name: &str, resources: Value, annotations: Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"limits": resources}}]},
        "status": {"phase": "Running"}}))
    .unwrap()
}

fn quota(name: &str, namespaces: &[&str]) -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": name}, "spec": {"namespaces": namespaces, "hard": {}}}))
    .unwrap()
}

fn report(activity: Vec<Value>, pods: &[Pod], idle_after: &[(&str, i64)]) -> IdleReport {
    let nodes = [gpunode("n1", activity)];
    let quotas = [quota("ml", &["ml"]), quota("web", &["web"])];
    let status = fleet_status(&nodes, &[], &quotas, pods);
    let after = idle_after.iter().map(|(t, s)| (t.to_string(), SignedDuration::from_secs(*s))).collect();
    idle_report(&status, &nodes, pods, &after, &NotReporting::new(), now())
}

fn mig_pod(ns: &str, name: &str, n: i64) -> Pod {
    pod(ns, name, json!({"nvidia.com/mig-3g.40gb": n}), json!({}))
}

fn tenant(r: &IdleReport, t: &str) -> (i64, i64, i64, i64) {
    let u = r.tenants.get(t).cloned().unwrap_or_default();
    (u.allocated, u.active, u.idle, u.unmeasured)
}

#[test]
fn idle_beyond_the_default_hour_counts_idle_and_lists_the_holder() {
    // Table: (idleSince of the held instance, expected (allocated, active, idle, unmeasured)).
    let cases = [
        (None, (1, 1, 0, 0)),                         // busy
        (Some("2026-06-01T11:30:00Z"), (1, 1, 0, 0)), // idle 30 min < 1h
        (Some("2026-06-01T11:00:00Z"), (1, 0, 1, 0)), // exactly 1h: idle
        (Some("2026-05-31T12:00:00Z"), (1, 0, 1, 0)), // a day
        (Some("2026-06-01T13:00:00Z"), (1, 1, 0, 0)), // in the future (clock skew): not idle
    ];
    for (since, want) in cases {
        let r = report(vec![mig_act(0, since, 512)], &[mig_pod("ml", "a", 1)], &[]);
        assert_eq!(tenant(&r, "ml"), want, "idleSince {since:?}");
        assert_eq!(r.idle.len() as i64, want.2, "idleSince {since:?}");
    }
    let r = report(vec![mig_act(0, Some("2026-05-31T12:00:00Z"), 512)], &[mig_pod("ml", "a", 1)], &[]);
    let h = &r.idle[0];
    assert_eq!((h.pod.as_str(), h.tenant.as_deref(), h.node.as_str()), ("ml/a", Some("ml"), "n1"));
    assert_eq!((h.gpu, h.profile.as_str(), h.start, h.memory_used_mib), (0, "3g.40gb", Some(0), 512));
    assert_eq!(h.idle_since, "2026-05-31T12:00:00Z".parse::<Timestamp>().unwrap());
    assert!(!h.exact, "one pod holds one of two instances of its profile: which one is a guess");
}

#[test]
fn a_gpm_device_without_a_share_or_idle_time_is_unmeasured_not_active() {
    // An agent just started (no second GPM sample yet) or whose GPM calls fail.
    let first = json!({"gpuIndex": 0, "profile": "3g.40gb", "start": 0, "source": "Gpm", "memoryUsedMib": 0,
                       "processes": 0});
    let r = report(vec![first], &[mig_pod("ml", "a", 1)], &[]);
    assert_eq!(tenant(&r, "ml"), (1, 0, 0, 1));
}

#[test]
fn an_instance_made_again_at_the_same_start_with_another_profile_does_not_take_the_old_figure() {
    let mut old = mig_act(0, Some("2026-05-01T00:00:00Z"), 0);
    old["profile"] = json!("4g.40gb");
    let r = report(vec![old], &[mig_pod("ml", "a", 1)], &[]);
    assert_eq!(tenant(&r, "ml"), (1, 0, 0, 1));
}

/// Same GPU, start and profile, but another UUID: the instance was destroyed and made again; its
/// predecessor's `idleSince` is not inherited. Either side without a UUID still matches.
#[test]
fn an_instance_made_again_with_a_new_uuid_does_not_take_the_old_figure() {
    let pods = [mig_pod("ml", "a", 1)];
    let quotas = [quota("ml", &["ml"])];
    let run = |instance_uuid: Option<&str>, figure_uuid: Option<&str>| {
        let mut act = mig_act(0, Some("2026-05-01T00:00:00Z"), 0);
        act["uuid"] = json!(figure_uuid);
        let mut node = gpunode("n1", vec![act]);
        node.status.as_mut().unwrap().gpus[0].instances[0].uuid = instance_uuid.map(String::from);
        let nodes = [node];
        let status = fleet_status(&nodes, &[], &quotas, &pods);
        let r = idle_report(&status, &nodes, &pods, &BTreeMap::new(), &NotReporting::new(), now());
        tenant(&r, "ml")
    };
    assert_eq!(run(Some("MIG-new"), Some("MIG-old")), (1, 0, 0, 1), "re-made: not measured yet");
    assert_eq!(run(Some("MIG-a"), Some("MIG-a")), (1, 0, 1, 0));
    assert_eq!(run(None, Some("MIG-a")), (1, 0, 1, 0), "an older GpuNode without UUIDs");
    assert_eq!(run(Some("MIG-a"), None), (1, 0, 1, 0), "an older agent without UUIDs");
}

#[test]
fn a_dead_agents_last_summary_is_set_aside_and_its_held_devices_count_unmeasured() {
    // Idle since May by the last summary, a busy whole GPU, and memory on a free instance.
    let act = vec![mig_act(0, Some("2026-05-01T00:00:00Z"), 0), mig_act(4, None, 2048), whole_act(None, 100, 1)];
    let nodes = [gpunode("n1", act), gpunode("n2", vec![])];
    let quotas = [quota("ml", &["ml"])];
    let pods = [mig_pod("ml", "a", 1), pod("ml", "w", json!({"nvidia.com/gpu": 1}), json!({}))];
    let status = fleet_status(&nodes, &[], &quotas, &pods);
    let alive = idle_report(&status, &nodes, &pods, &BTreeMap::new(), &NotReporting::new(), now());
    assert_eq!((tenant(&alive, "ml"), alive.idle.len(), alive.leaked.len()), ((2, 1, 1, 0), 1, 1));
    assert!(alive.not_reporting.is_empty());
    // The agent's lease ran out at 11:00: nothing of its summary is read, n2 (alive) is not named.
    let since: Timestamp = "2026-06-01T11:00:00Z".parse().unwrap();
    let dead = NotReporting::from([("n1".to_string(), stale::Silence::silent(Some(since)))]);
    let r = idle_report(&status, &nodes, &pods, &BTreeMap::new(), &dead, now());
    assert_eq!(tenant(&r, "ml"), (2, 0, 0, 2), "neither idle nor active");
    assert!(r.idle.is_empty() && r.leaked.is_empty(), "{r:?}");
    let cause = stale::Cause::AgentSilent;
    assert_eq!(r.not_reporting, vec![SetAside { node: "n1".into(), since: Some(since), cause, held: 2 }]);
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["notReporting"][0]["since"], "2026-06-01T11:00:00Z");
    // The quota's status names the node and since when.
    let a = tenant_activity(&r, "ml", DEFAULT_IDLE_AFTER);
    assert_eq!((a.unmeasured, a.not_reporting.len()), (2, 1));
    assert_eq!((a.not_reporting[0].node.as_str(), a.not_reporting[0].since.as_ref().map(|t| t.0)), ("n1", Some(since)));
    assert!(tenant_activity(&alive, "ml", DEFAULT_IDLE_AFTER).not_reporting.is_empty());
}

#[test]
fn a_pod_idles_no_longer_than_it_has_run() {
    // The slice sat idle since May; the notebook holding it started an hour and a half ago.
    let mut p = mig_pod("ml", "a", 1);
    p.status.get_or_insert_default().start_time = Some(Time("2026-06-01T10:30:00Z".parse().unwrap()));
    let r = report(vec![mig_act(0, Some("2026-05-01T00:00:00Z"), 0)], &[p.clone()], &[]);
    assert_eq!(r.idle[0].idle_since, "2026-06-01T10:30:00Z".parse::<Timestamp>().unwrap());
    // Started 30 minutes ago: not idle past the 1h default yet, whatever the device's history.
    p.status.get_or_insert_default().start_time = Some(Time("2026-06-01T11:30:00Z".parse().unwrap()));
    let r = report(vec![mig_act(0, Some("2026-05-01T00:00:00Z"), 0)], &[p], &[]);
    assert_eq!(tenant(&r, "ml"), (1, 1, 0, 0));
}

#[test]
fn the_threshold_is_per_tenant() {
    let act = vec![mig_act(0, Some("2026-06-01T11:30:00Z"), 0), mig_act(4, Some("2026-06-01T11:30:00Z"), 0)];
    let pods = [mig_pod("ml", "a", 1), pod("web", "w", json!({"nvidia.com/mig-3g.40gb": 1}), json!({}))];
    let r = report(act, &pods, &[("web", 600)]);
    assert_eq!(tenant(&r, "ml"), (1, 1, 0, 0), "ml keeps the 1h default");
    assert_eq!(tenant(&r, "web"), (1, 0, 1, 0), "web idles after 10 min");
}

#[test]
fn a_held_device_without_figures_is_unmeasured_not_idle() {
    // The agent reported only the whole GPU; the held MIG instance has no figure.
    let r = report(vec![whole_act(None, 0, 0)], &[mig_pod("ml", "a", 1)], &[]);
    assert_eq!(tenant(&r, "ml"), (1, 0, 0, 1));
    assert!(r.idle.is_empty());
    // A figure for another start does not stand in for it.
    let r = report(vec![mig_act(4, Some("2026-05-01T00:00:00Z"), 0)], &[mig_pod("ml", "a", 1)], &[]);
    assert_eq!(tenant(&r, "ml"), (1, 0, 0, 1));
}

#[test]
fn guessed_holders_are_marked_and_untenanted_pods_count_under_empty() {
    // Two pods share two instances of one profile: the placement guesses which is whose.
    let act = vec![mig_act(0, Some("2026-05-01T00:00:00Z"), 0), mig_act(4, None, 0)];
    let pods = [mig_pod("ml", "a", 1), mig_pod("other", "b", 1)];
    let r = report(act, &pods, &[]);
    assert_eq!(tenant(&r, "ml"), (1, 0, 1, 0));
    assert_eq!(tenant(&r, ""), (1, 1, 0, 0), "a namespace no quota claims");
    assert!(!r.idle[0].exact, "guessed holder must be marked");
}

#[test]
fn whole_gpu_holder_and_vcluster_names() {
    let ann = json!({VCLUSTER_NAME: "trainer-0", VCLUSTER_NAMESPACE: "team-a"});
    let pods = [pod("ml", "trainer-0-x-team-a-x-vc", json!({"nvidia.com/gpu": 1}), ann)];
    let r = report(vec![whole_act(Some("2026-06-01T08:00:00Z"), 70000, 1)], &pods, &[]);
    assert_eq!(tenant(&r, "ml"), (1, 0, 1, 0));
    let h = &r.idle[0];
    assert_eq!((h.profile.as_str(), h.start, h.gpu), ("whole", None, 1));
    assert_eq!(h.virtual_pod.as_deref(), Some("team-a/trainer-0"));
    // One annotation alone names nothing.
    let half = [pod("ml", "p", json!({"nvidia.com/gpu": 1}), json!({VCLUSTER_NAME: "x"}))];
    let r = report(vec![whole_act(Some("2026-06-01T08:00:00Z"), 0, 0)], &half, &[]);
    assert_eq!(r.idle[0].virtual_pod, None);
}

/// A figure for a free 3g.40gb instance with explicit memory and process count.
fn mig_free(start: i32, mib: i64, processes: i32) -> Value {
    json!({"gpuIndex": 0, "profile": "3g.40gb", "start": start, "source": "Gpm", "idleSince": "2026-05-01T00:00:00Z",
           "activePercent1h": 0, "memoryUsedMib": mib, "processes": processes})
}

#[test]
fn memory_on_a_free_device_is_leaked_and_unattributed() {
    // Real idle MIG instances show ~11 MiB of driver memory and no process: not leaked.
    let act = vec![mig_free(0, 11, 0), mig_free(4, 900, 0), whole_act(Some("2026-05-01T00:00:00Z"), 11, 0)];
    let r = report(act, &[], &[]);
    assert!(r.tenants.is_empty(), "nothing held: no tenant figures");
    assert!(r.idle.is_empty(), "a free device is not an idle holder");
    let leaked: Vec<_> = r.leaked.iter().map(|l| (l.gpu, l.start, l.memory_used_mib)).collect();
    assert_eq!(leaked, vec![(0, Some(4), 900)], "only the 900 MiB instance");
    // A compute process leaks whatever its memory; the threshold itself counts.
    let act = vec![mig_free(0, 11, 1), mig_free(4, LEAKED_MEMORY_MIB + 1, 0), whole_act(None, LEAKED_MEMORY_MIB, 0)];
    let r = report(act, &[], &[]);
    let leaked: Vec<_> = r.leaked.iter().map(|l| (l.gpu, l.start, l.memory_used_mib, l.processes)).collect();
    assert_eq!(leaked, vec![(0, Some(0), 11, 1), (0, Some(4), LEAKED_MEMORY_MIB + 1, 0)]);
}

#[test]
fn idle_holders_sort_oldest_first() {
    let act = vec![mig_act(0, Some("2026-06-01T09:00:00Z"), 0), mig_act(4, Some("2026-05-30T00:00:00Z"), 0)];
    let pods = [mig_pod("ml", "a", 2)];
    let r = report(act, &pods, &[]);
    let starts: Vec<_> = r.idle.iter().map(|h| h.start).collect();
    assert_eq!(starts, vec![Some(4), Some(0)]);
    assert!(r.idle.iter().all(|h| h.exact), "one pod holds every instance of the profile: exact");
}

#[test]
fn thresholds_come_from_quotas_and_a_bad_one_falls_back_to_the_default() {
    let mut quotas = [quota("ml", &["ml"]), quota("web", &["web"]), quota("bad", &["bad"])];
    quotas[1].spec.idle_after = Some("10m".into());
    quotas[2].spec.idle_after = Some("soon".into());
    let t = idle_thresholds(&quotas);
    assert_eq!(t.get("web"), Some(&SignedDuration::from_secs(600)));
    assert_eq!(t.get("ml"), None, "absent: the default applies");
    assert_eq!(t.get("bad"), None, "unparsable: the default applies");
}

#[test]
fn a_quota_status_gets_its_own_tenants_figures_oldest_idle_first_and_bounded() {
    let act = vec![mig_act(0, Some("2026-06-01T09:00:00Z"), 10), mig_act(4, Some("2026-05-30T00:00:00Z"), 20)];
    let r = report(act, &[mig_pod("ml", "a", 2)], &[]);
    let a = tenant_activity(&r, "ml", SignedDuration::from_secs(5400));
    assert_eq!((a.idle_after.as_str(), a.allocated, a.active, a.idle, a.unmeasured), ("1h30m", 2, 0, 2, 0));
    let mibs: Vec<_> = a.idle_holders.iter().map(|h| h.memory_used_mib).collect();
    assert_eq!(mibs, vec![20, 10], "oldest idle first");
    let other = tenant_activity(&r, "web", DEFAULT_IDLE_AFTER);
    assert_eq!((other.idle_after.as_str(), other.allocated, other.idle_holders.len()), ("1h", 0, 0));
    // At most MAX_IDLE_HOLDERS listed, the count still whole.
    let mut many = r.clone();
    many.idle = (0..30).map(|_| r.idle[0].clone()).collect();
    many.tenants.get_mut("ml").unwrap().idle = 30;
    let a = tenant_activity(&many, "ml", DEFAULT_IDLE_AFTER);
    assert_eq!((a.idle, a.idle_holders.len()), (30, MAX_IDLE_HOLDERS));
}

#[test]
fn durations_are_spelled_as_idle_after_takes_them() {
    for (secs, text) in [(0, "0s"), (90, "1m30s"), (3600, "1h"), (90061, "1d1h1m1s")] {
        assert_eq!(format_duration(SignedDuration::from_secs(secs)), text);
        if secs > 0 {
            assert_eq!(parse_idle_after(text), Ok(secs as u64));
        }
    }
}

#[test]
fn a_failed_read_keeps_the_quotas_previous_figures_and_nothing_measured_clears_them() {
    let r = report(vec![mig_act(0, Some("2026-05-30T00:00:00Z"), 0)], &[mig_pod("ml", "a", 1)], &[]);
    let t: BTreeMap<String, SignedDuration> = [("ml".to_string(), SignedDuration::from_secs(600))].into();
    let fresh = status_activity(&Outcome::Report(r), None, "ml", &t).unwrap();
    assert_eq!((fresh.idle_after.as_str(), fresh.idle), ("10m", 1));
    assert_eq!(status_activity(&Outcome::Keep, Some(&fresh), "ml", &t), Some(fresh.clone()), "kept, not dropped");
    assert_eq!(status_activity(&Outcome::Keep, None, "ml", &t), None);
    assert_eq!(status_activity(&Outcome::Clear, Some(&fresh), "ml", &t), None, "no idle holder left behind");
}

#[test]
fn status_marks_idle_devices_in_the_diagram_the_lines_and_json() {
    let act = vec![mig_act(0, None, 0), mig_act(4, Some("2026-05-31T12:00:00Z"), 0), whole_act(None, 0, 0)];
    let nodes = [gpunode("n1", act)];
    let quotas = [quota("ml", &["ml"])];
    let pods = [mig_pod("ml", "a", 2)];
    let mut status = fleet_status(&nodes, &[], &quotas, &pods);
    let before = crate::fleet_status::text(&status, false);
    let r = idle_report(&status, &nodes, &pods, &BTreeMap::new(), &NotReporting::new(), now());
    mark_idle(&mut status, &r);
    let t = crate::fleet_status::text(&status, false);
    assert!(before.contains("[AAAABBBB]") && !before.contains("idle since"), "{before}");
    assert!(t.contains("[AAAAbbbb]"), "the idle instance in lower case: {t}");
    assert!(t.contains("B  ml  ml/a  idle since 2026-05-31T12:00:00Z"), "{t}");
    assert!(t.contains("lower case / idle since"), "{t}");
    let v = serde_json::to_value(&status).unwrap();
    let inst = &v["nodes"][0]["gpus"][0]["instances"];
    assert_eq!(inst[1]["idleSince"], "2026-05-31T12:00:00Z");
    assert!(inst[0].get("idleSince").is_none());
    assert_eq!(v["nodes"][0]["gpus"][0]["slots"], "AAAABBBB", "JSON keeps the letters");
}
