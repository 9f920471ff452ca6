//! A node whose GPU DRA driver publishes ResourceSlices keeps our cordon after its agent applied
//! the layout, until the slices list it or `DRA_WAIT_SECS` pass (see `dra_wait`).

use super::*;
use crate::rollout::dra_wait::{self, Hold};

const STALE: &str = "the DRA driver lists devices the GPUs no longer hold: gpu-0-mig-9-0-4";

fn applying() -> serde_json::Value {
    json!({"phase": "Applying", "plan": "p", "planGeneration": 1, "cordonedByUs": true,
           "drainStartedAt": "2026-05-31T23:50:00Z", "applyStartedAt": "2026-05-31T23:55:00Z"})
}

/// Waiting since `since`, with the message a wait for `why` writes.
fn uncordoning(since: &str, why: &str) -> serde_json::Value {
    let message = dra_wait::waiting_message(since.parse().unwrap(), why);
    json!({"phase": "Uncordoning", "plan": "p", "planGeneration": 1, "cordonedByUs": true,
           "drainStartedAt": "2026-05-31T23:50:00Z", "draWaitStartedAt": since, "message": message})
}

/// A node cordoned by us, its layout applied, with this record and these slices.
fn applied_node(record: serde_json::Value, slices: DraSlices) -> NodeInput<'static> {
    let mut n = node("n1", true, gpunode("n1", wanted(), true, Some(record)));
    n.dra_slices = slices;
    n
}

fn run(n: NodeInput<'static>) -> (Vec<Action>, PlanReport) {
    let (actions, mut reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[n], now());
    (actions, reports.remove("p").unwrap())
}

fn records(actions: &[Action]) -> Vec<&NodeRollout> {
    actions
        .iter()
        .filter_map(|a| if let Action::Rollout { rollout: Some(r), .. } = a { Some(r) } else { None })
        .collect()
}

fn uncordons(actions: &[Action]) -> bool {
    actions.iter().any(|a| matches!(a, Action::Uncordon { .. }))
}

#[test]
fn stale_or_publishing_slices_keep_the_cordon_after_the_agent_applied() {
    for slices in [DraSlices::Stale(STALE.into()), DraSlices::Publishing] {
        let (actions, report) = run(applied_node(applying(), slices.clone()));
        assert!(!uncordons(&actions), "{slices:?}: uncordoned before the driver re-published: {actions:?}");
        assert!(!actions.iter().any(|a| matches!(a, Action::Completed { .. })), "{actions:?}");
        let [r] = records(&actions)[..] else { panic!("one record: {actions:?}") };
        assert_eq!(r.phase, NodePhase::Uncordoning);
        assert!(r.cordoned_by_us);
        assert_eq!(r.dra_wait_started_at, Some(Time(now())), "the wait is stamped in the record");
        assert!(r.message.contains("ResourceSlices"), "{}", r.message);
        assert_eq!((report.in_progress, report.updated), (1, 0), "{report:?}");
    }
}

#[test]
fn the_cordon_is_released_once_the_slices_list_the_new_layout() {
    let n = applied_node(uncordoning("2026-05-31T23:59:30Z", STALE), DraSlices::InSync);
    let (actions, report) = run(n);
    assert!(uncordons(&actions), "{actions:?}");
    let idle = records(&actions).into_iter().last().expect("a record");
    assert_eq!((idle.phase, idle.cordoned_by_us, idle.dra_wait_started_at.clone()), (NodePhase::Idle, false, None));
    assert!(actions.contains(&Action::Completed { node: "n1".into(), seconds: 600.0 }), "{actions:?}");
    assert!(actions.iter().any(|a| matches!(a, Action::Event { reason: "Applied", warning: false, .. })));
    assert!(!actions.iter().any(|a| matches!(a, Action::Event { warning: true, .. })), "{actions:?}");
    assert_eq!(report.updated, 1);
}

#[test]
fn past_the_bound_the_node_is_uncordoned_anyway_with_a_warning_naming_it() {
    // 301 s after the wait started, the slices still stale.
    let n = applied_node(uncordoning("2026-05-31T23:54:59Z", STALE), DraSlices::Stale(STALE.into()));
    let (actions, report) = run(n);
    assert!(uncordons(&actions), "never left cordoned by us: {actions:?}");
    let warning = actions
        .iter()
        .find_map(|a| match a {
            Action::Event { reason, message, warning: true, .. } => Some((*reason, message.clone())),
            _ => None,
        })
        .expect("a Warning Event");
    assert_eq!(warning.0, "DraSlicesStale");
    assert!(warning.1.contains("n1") && warning.1.contains("gpu-0-mig-9-0-4"), "{}", warning.1);
    assert_eq!(report.updated, 1);
    // Just under the bound it still waits.
    let n = applied_node(uncordoning("2026-05-31T23:55:01Z", STALE), DraSlices::Stale(STALE.into()));
    assert!(!uncordons(&run(n).0));
}

#[test]
fn a_node_without_gpu_driver_slices_is_uncordoned_at_once() {
    let (actions, report) = run(applied_node(applying(), DraSlices::None));
    assert!(uncordons(&actions), "{actions:?}");
    assert!(records(&actions).iter().all(|r| r.dra_wait_started_at.is_none()), "{actions:?}");
    assert_eq!(report.updated, 1);
    // Already in sync when the agent reports: no wait either.
    assert!(uncordons(&run(applied_node(applying(), DraSlices::InSync)).0));
}

#[test]
fn a_restarted_operator_resumes_the_wait_from_the_record() {
    // Mid-wait, same reason: nothing to write, nothing to do; still in flight.
    let n = applied_node(uncordoning("2026-05-31T23:59:00Z", STALE), DraSlices::Stale(STALE.into()));
    let (actions, report) = run(n);
    assert!(actions.is_empty(), "{actions:?}");
    assert_eq!(report.in_progress, 1);
    // The driver started publishing: the message says so; the start of the wait stays.
    let n = applied_node(uncordoning("2026-05-31T23:59:00Z", STALE), DraSlices::Publishing);
    let (actions, _) = run(n);
    let [r] = records(&actions)[..] else { panic!("{actions:?}") };
    assert_eq!(r.dra_wait_started_at, Some(Time("2026-05-31T23:59:00Z".parse().unwrap())));
    // A record from before the stamp (or written by an older operator): stamped now, not finished.
    let legacy = json!({"phase": "Uncordoning", "plan": "p", "planGeneration": 1, "cordonedByUs": true});
    let (actions, _) = run(applied_node(legacy, DraSlices::Stale(STALE.into())));
    assert!(!uncordons(&actions), "{actions:?}");
    assert_eq!(records(&actions)[0].dra_wait_started_at, Some(Time(now())));
}

#[test]
fn only_a_cordon_of_ours_that_still_holds_is_kept() {
    let stale = || DraSlices::Stale(STALE.into());
    // Cordoned by an admin: not ours to hold or release; the node is done.
    let mut admin = applying();
    admin["cordonedByUs"] = json!(false);
    let (actions, report) = run(applied_node(admin, stale()));
    assert!(!uncordons(&actions) && report.updated == 1, "{actions:?} {report:?}");
    // Uncordoned by someone mid-wait: nothing left to hold.
    let mut n = applied_node(uncordoning("2026-05-31T23:59:00Z", STALE), stale());
    n.unschedulable = false;
    let (actions, report) = run(n);
    assert_eq!(records(&actions).last().map(|r| r.phase), Some(NodePhase::Idle), "{actions:?}");
    assert_eq!(report.updated, 1);
}

#[test]
fn the_hold_decision_table() {
    let at = |s: &str| -> Timestamp { s.parse().unwrap() };
    let record = |ours: bool, since: Option<&str>| NodeRollout {
        cordoned_by_us: ours,
        dra_wait_started_at: since.map(|s| Time(at(s))),
        ..Default::default()
    };
    let stale = DraSlices::Stale("x".into());
    let wait = |since: &str| Hold::Wait { since: at(since), why: "x".into() };
    let cases: Vec<(&str, DraSlices, NodeRollout, bool, Hold)> = vec![
        ("no slices", DraSlices::None, record(true, None), true, Hold::Finish(None)),
        ("in sync", DraSlices::InSync, record(true, Some("2026-05-31T23:59:00Z")), true, Hold::Finish(None)),
        ("stale, first seen", stale.clone(), record(true, None), true, wait("2026-06-01T00:00:00Z")),
        (
            "stale, mid-wait",
            stale.clone(),
            record(true, Some("2026-05-31T23:58:00Z")),
            true,
            wait("2026-05-31T23:58:00Z"),
        ),
        ("not our cordon", stale.clone(), record(false, None), true, Hold::Finish(None)),
        ("uncordoned meanwhile", stale.clone(), record(true, None), false, Hold::Finish(None)),
    ];
    for (name, slices, r, unschedulable, want) in cases {
        assert_eq!(dra_wait::hold("n1", &slices, &r, unschedulable, now()), want, "{name}");
    }
    let late = dra_wait::hold("n1", &stale, &record(true, Some("2026-05-31T23:55:00Z")), true, now());
    assert!(matches!(&late, Hold::Finish(Some(m)) if m.contains("n1") && m.ends_with(": x")), "{late:?}");
}
