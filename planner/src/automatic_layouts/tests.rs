use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use serde_json::json;
use tessera_crds::GpuNode;
use tessera_crds::solver;

use super::*;

const MIG1G: &str = "nvidia.com/mig-1g.10gb";
const MIG3G: &str = "nvidia.com/mig-3g.40gb";

fn auto_plan(decision: Option<serde_json::Value>) -> GpuPartitionPlan {
    let mut v = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan",
        "metadata": {"name": "auto", "generation": 1},
        "spec": {"layoutsFrom": {"quotaSelector": {"matchLabels": {"team": "ml"}}, "stabilizationSeconds": 30}}});
    if let Some(d) = decision {
        v["status"] = json!({"layoutDecision": d});
    }
    serde_json::from_value(v).unwrap()
}

fn quota(name: &str, labels: serde_json::Value, hard: serde_json::Value) -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": name, "labels": labels}, "spec": {"namespaces": [name], "hard": hard}}))
    .unwrap()
}

/// A node with H100s holding the given instances (profile, start) per GPU.
fn gpunode(name: &str, gpus: &[&[(&str, i32)]], rollout: Option<serde_json::Value>) -> GpuNode {
    let h = catalog::lookup("H100-80GB").unwrap();
    let gpus: Vec<serde_json::Value> = gpus
        .iter()
        .enumerate()
        .map(|(i, inst)| {
            let instances: Vec<serde_json::Value> = inst
                .iter()
                .map(|(p, s)| json!({"profile": p, "start": s, "size": h.profile(p).unwrap().memory_slices}))
                .collect();
            json!({"index": i, "uuid": format!("GPU-{name}-{i}"), "product": "NVIDIA H100 80GB HBM3",
                   "migCapable": true, "migEnabled": true, "instances": instances})
        })
        .collect();
    let mut status = json!({"gpus": gpus});
    if let Some(r) = rollout {
        status["rollout"] = r;
    }
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": name}, "spec": {"gpus": [{"index": 0, "migEnabled": true, "profiles": {"7g.80gb": 1}}]},
        "status": status}))
    .unwrap()
}

fn now() -> Time {
    Time("2026-06-01T00:00:00Z".parse().unwrap())
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// A demand of the plan's own quotas only.
fn mine(selected: &BTreeMap<String, i64>) -> Demand {
    Demand { selected: selected.clone(), ..Default::default() }
}

#[test]
fn a_plans_demand_is_its_quotas_plus_headroom_and_every_other_live_quotas_guarantee() {
    let mut deleted = quota("gone", json!({"team": "ml"}), json!({MIG1G: 100}));
    deleted.metadata.deletion_timestamp = Some(now());
    let quotas = vec![
        quota("a", json!({"team": "ml"}), json!({MIG1G: 3, MIG3G: 1})),
        quota("b", json!({"team": "ml"}), json!({MIG1G: 4})),
        quota("other", json!({"team": "web"}), json!({MIG1G: 50})),
        deleted,
    ];
    let mut from = auto_plan(None).spec.layouts_from.unwrap();
    from.headroom_percent = 10;
    let d = plan_demand(&from, &quotas);
    assert_eq!(d.selected, [(MIG1G.to_string(), 8), (MIG3G.to_string(), 2)].into(), "7 + 10% -> 8, 1 + 10% -> 2");
    assert_eq!(d.others, [(MIG1G.to_string(), 50)].into(), "no headroom on quotas the plan does not select");
    assert_eq!(d.total(), [(MIG1G.to_string(), 58), (MIG3G.to_string(), 2)].into());
}

#[test]
fn when_to_decide_again() {
    let d: BTreeMap<String, i64> = [(MIG1G.to_string(), 7)].into();
    let decided = |demand: &BTreeMap<String, i64>, fleet: &str, generation: i64| {
        auto_plan(Some(json!({"planGeneration": generation, "demand": demand, "fleet": fleet})))
    };
    assert_eq!(next(&auto_plan(None), &d, "f", 0, 0, 0, &[]), Next::Decide("no decision yet".into()));
    assert!(
        matches!(next(&auto_plan(None), &d, "f", 0, 1, 0, &[]), Next::Wait(m) if m.contains("1 node(s) in flight")),
        "not even a first decision under a node mid-change (a plan switched from fixed layouts)"
    );
    assert_eq!(next(&decided(&d, "f", 1), &d, "f", 0, 0, 0, &[]), Next::Keep, "nothing changed");
    let more: BTreeMap<String, i64> = [(MIG1G.to_string(), 9)].into();
    assert!(
        matches!(next(&decided(&d, "f", 1), &more, "f", 10, 0, 0, &[]), Next::Stabilize { why, left: 20 } if why.contains("7 -> 9"))
    );
    assert!(
        matches!(next(&decided(&d, "f", 1), &more, "f", 30, 0, 0, &[]), Next::Decide(m) if m.contains("nvidia.com/mig-1g.10gb 7 -> 9"))
    );
    assert!(
        matches!(next(&decided(&d, "f", 1), &more, "f", 30, 2, 0, &[]), Next::Wait(m) if m.contains("2 node(s) in flight")),
        "never re-decided under nodes mid-change"
    );
    assert!(
        matches!(next(&decided(&d, "old", 1), &d, "f", 30, 0, 0, &[]), Next::Decide(m) if m.contains("nodes or GPUs"))
    );
    assert!(
        matches!(next(&decided(&d, "f", 0), &d, "f", 30, 0, 0, &[]), Next::Decide(m) if m.contains("plan changed"))
    );
    assert!(
        matches!(next(&decided(&d, "f", 1), &d, "f", 30, 0, 1, &[]), Next::Decide(m) if m.contains("1 target node(s) failed")),
        "a failed or unreachable target is decided around"
    );
}

#[test]
fn a_decision_changes_only_idle_owned_nodes_and_says_why() {
    let seven: &[(&str, i32)] = &[("7g.80gb", 0)];
    let nodes = [
        gpunode("idle", &[seven], None),
        gpunode("busy", &[seven], None),
        gpunode("dead-agent", &[seven], None),
        gpunode("not-mine", &[seven], None),
    ];
    let refs: Vec<&GpuNode> = nodes.iter().collect();
    let demand: BTreeMap<String, i64> = [(MIG1G.to_string(), 7)].into();
    let owned = set(&["idle", "busy", "dead-agent"]);
    let d = decide(
        &auto_plan(None),
        &mine(&demand),
        &refs,
        &owned,
        &set(&["busy"]),
        &set(&["dead-agent"]),
        &[],
        "test",
        now(),
    )
    .unwrap();
    assert_eq!(d.targets.len(), 1, "{d:#?}");
    assert_eq!(d.targets[0].node, "idle");
    assert_eq!(d.targets[0].gpus[0].profiles, [("1g.10gb".to_string(), 7)].into());
    assert!(d.shortfall.is_empty());
    assert_eq!(d.kept_busy, vec!["busy".to_string()]);
    assert!(d.message.contains("repartitioning 1 idle GPU(s) on 1 node(s)"), "{}", d.message);
    assert!(d.message.contains("left alone: busy"), "{}", d.message);
    assert_eq!((d.supply_before.get(MIG1G), d.supply_after.get(MIG1G)), (None, Some(&7)));

    let more: BTreeMap<String, i64> = [(MIG1G.to_string(), 30)].into();
    let d =
        decide(&auto_plan(None), &mine(&more), &refs, &owned, &set(&["busy"]), &set(&["dead-agent"]), &[], "t", now())
            .unwrap();
    assert_eq!(d.shortfall, [(MIG1G.to_string(), 23)].into(), "only the idle node can change");
    assert!(d.message.contains("still short of nvidia.com/mig-1g.10gb by 23"), "{}", d.message);
}

#[test]
fn layouts_that_already_meet_the_demand_change_nothing() {
    let nodes = [gpunode("a", &[&[("3g.40gb", 0), ("3g.40gb", 4)]], None)];
    let refs: Vec<&GpuNode> = nodes.iter().collect();
    let demand: BTreeMap<String, i64> = [(MIG3G.to_string(), 2)].into();
    let d =
        decide(&auto_plan(None), &mine(&demand), &refs, &set(&["a"]), &set(&[]), &set(&[]), &[], "t", now()).unwrap();
    assert!(d.targets.is_empty());
    assert!(d.message.starts_with("the current layouts meet the demand; nothing changes"), "{}", d.message);
}

#[test]
fn what_an_automatic_plan_asks_of_each_node() {
    let target = json!({"planGeneration": 1,
        "targets": [{"node": "t", "gpus": [{"index": 0, "migEnabled": true, "profiles": {"1g.10gb": 7}}]}]});
    let plan = auto_plan(Some(target.clone()));
    let seven: &[(&str, i32)] = &[("7g.80gb", 0)];
    let Ask::Target(want) = desired(&plan, "t", &gpunode("t", &[seven], None)) else { panic!() };
    assert_eq!(want[0].profiles, [("1g.10gb".to_string(), 7)].into());
    assert_eq!(desired(&plan, "idle", &gpunode("idle", &[seven], None)), Ask::LeaveAlone, "not a target");
    let done = gpunode("done", &[seven], Some(json!({"phase": "Idle", "plan": "auto"})));
    assert_eq!(desired(&plan, "done", &done), Ask::LeaveAlone);
    let mid = gpunode("mid", &[seven], Some(json!({"phase": "Applying", "plan": "someone-else"})));
    assert_eq!(desired(&plan, "mid", &mid), Ask::Finish(mid.spec.gpus.clone()), "a node handed over finishes");
    for phase in ["Draining", "Pending", "Failed"] {
        let n = gpunode("n", &[seven], Some(json!({"phase": phase, "plan": "auto", "cordonedByUs": true})));
        assert_eq!(desired(&plan, "n", &n), Ask::Release, "{phase}: not handed over and not a target");
    }
    let mut stale = auto_plan(Some(target));
    stale.metadata.generation = Some(2);
    assert_eq!(
        desired(&stale, "t", &gpunode("t", &[seven], None)),
        Ask::LeaveAlone,
        "a decision for another generation of the plan is not rolled out"
    );
    // Indexed once per pass, the targets answer as the list did: the first one naming a node.
    let twice = json!({"planGeneration": 1, "targets": [
        {"node": "t", "gpus": [{"index": 0, "migEnabled": true, "profiles": {"1g.10gb": 7}}]},
        {"node": "t", "gpus": [{"index": 0, "migEnabled": true, "profiles": {"3g.40gb": 2}}]}]});
    let Ask::Target(first) = desired(&auto_plan(Some(twice)), "t", &gpunode("t", &[seven], None)) else { panic!() };
    assert_eq!(first[0].profiles, [("1g.10gb".to_string(), 7)].into());
}

#[test]
fn an_unlimited_quota_still_gets_the_most_the_fleet_can_give() {
    let nodes = [gpunode("a", &[&[("7g.80gb", 0)]], None), gpunode("b", &[&[("7g.80gb", 0)]], None)];
    let refs: Vec<&GpuNode> = nodes.iter().collect();
    let demand: BTreeMap<String, i64> = [(MIG1G.to_string(), i64::MAX / 2)].into();
    let d = decide(&auto_plan(None), &mine(&demand), &refs, &set(&["a", "b"]), &set(&[]), &set(&[]), &[], "t", now())
        .unwrap();
    assert_eq!((d.changed_gpus, d.supply_after.get(MIG1G)), (2, Some(&14)), "{d:?}");
    assert_eq!(d.shortfall[MIG1G], i64::MAX / 2 - 14, "the shortfall is against the real demand");
}

/// A fleet of H100s each with one random maximal layout, and a random demand.
fn fleet_and_demand() -> impl Strategy<Value = (Vec<Vec<solver::Placement>>, Vec<bool>, BTreeMap<String, i64>)> {
    let h = catalog::lookup("H100-80GB").unwrap();
    let layouts = solver::maximal_layouts(h, Some(&["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]));
    let n = layouts.len();
    (prop::collection::vec(0..n, 1..6), prop::collection::vec(any::<bool>(), 6), (0i64..12, 0i64..4, 0i64..3)).prop_map(
        move |(picks, busy, (a, b, c))| {
            let fleet = picks.iter().map(|&i| layouts[i].clone()).collect();
            let demand =
                [(MIG1G.to_string(), a), ("nvidia.com/mig-2g.20gb".to_string(), b), (MIG3G.to_string(), c)].into();
            (fleet, busy, demand)
        },
    )
}

fn nodes_of(fleet: &[Vec<solver::Placement>]) -> Vec<GpuNode> {
    fleet
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let inst: Vec<(&str, i32)> = l.iter().map(|p| (p.profile.as_str(), i32::from(p.start))).collect();
            gpunode(&format!("n{i}"), &[&inst], None)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Never flapping: once a decision's targets are applied, deciding again on the same demand
    /// changes nothing. Busy nodes are never targets, and every target fits its GPU.
    #[test]
    fn applying_a_decision_and_deciding_again_changes_nothing((fleet, busy, demand) in fleet_and_demand()) {
        let h = catalog::lookup("H100-80GB").unwrap();
        let nodes = nodes_of(&fleet);
        let refs: Vec<&GpuNode> = nodes.iter().collect();
        let owned: BTreeSet<String> = nodes.iter().map(|n| n.name_any()).collect();
        let busy: BTreeSet<String> = owned.iter().enumerate().filter(|(i, _)| busy[*i]).map(|(_, n)| n.clone()).collect();
        let first = decide(&auto_plan(None), &mine(&demand), &refs, &owned, &busy, &BTreeSet::new(), &[], "t", now()).unwrap();
        let mut after = fleet.clone();
        for t in &first.targets {
            prop_assert!(!busy.contains(&t.node), "a busy node is a target: {first:?}");
            let i: usize = t.node[1..].parse().unwrap();
            let counts: solver::ProfileCounts =
                t.gpus[0].profiles.iter().map(|(p, n)| (p.clone(), *n as u32)).collect();
            after[i] = solver::fit(h, &counts).expect("every target fits its GPU");
        }
        let nodes2 = nodes_of(&after);
        let refs2: Vec<&GpuNode> = nodes2.iter().collect();
        let again = decide(&auto_plan(None), &mine(&demand), &refs2, &owned, &busy, &BTreeSet::new(), &[], "t", now()).unwrap();
        prop_assert!(again.targets.is_empty(), "decided again: {again:?} after {first:?}");
        prop_assert_eq!(again.shortfall, first.shortfall);
    }
}

/// A node with one GPU that is not MIG capable (the solver cannot see it; it supplies one
/// `nvidia.com/gpu` all the same).
fn whole_gpu_node(name: &str) -> GpuNode {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": name}, "spec": {},
        "status": {"gpus": [{"index": 0, "uuid": format!("GPU-{name}"), "product": "NVIDIA A10",
                             "migCapable": false, "migEnabled": false}]}}))
    .unwrap()
}

/// An automatic plan and the quota controller give the same answer for the same fleet.
/// Each row: the quotas (the plan selects `team: ml`), the fleet, and the plan's nodes (all
/// changeable, but already as full as the demand can make them, so the decision's supply is
/// the fleet's as it is).
#[test]
fn the_plan_and_the_quotas_agree_on_the_same_fleet() {
    use crate::quota::{Capacity, plan_quotas};
    use tessera_crds::conditions::CAPACITY_AVAILABLE;
    let seven_1g: Vec<(&str, i32)> = (0..7).map(|s| ("1g.10gb", s)).collect();
    let four_1g_one_3g: Vec<(&str, i32)> =
        vec![("1g.10gb", 0), ("1g.10gb", 1), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4)];
    let ml = || json!({"team": "ml"});
    // Selected, but invalid (no namespace): the quota controller enforces nothing new for it.
    let mut invalid = quota("broken", ml(), json!({MIG1G: 50}));
    invalid.spec.namespaces.clear();
    struct Row {
        name: &'static str,
        quotas: Vec<TenantGpuQuota>,
        nodes: Vec<GpuNode>,
        owned: &'static [&'static str],
        short: BTreeMap<String, i64>,
    }
    let rows = vec![
        Row {
            name: "team-c is not selected and needs slices on GPUs outside the plan (the issue's fleet)",
            quotas: vec![
                quota("team-a", ml(), json!({MIG1G: 9})),
                quota("team-b", ml(), json!({MIG1G: 9})),
                quota("team-c", json!({"team": "web"}), json!({MIG1G: 2})),
            ],
            nodes: vec![
                gpunode("p1", &[&seven_1g], None),
                gpunode("p2", &[&seven_1g], None),
                gpunode("outside", &[&four_1g_one_3g], None),
            ],
            owned: &["p1", "p2"],
            short: [(MIG1G.to_string(), 2)].into(),
        },
        Row {
            name: "the fleet covers every quota, the unselected one on GPUs outside the plan",
            quotas: vec![
                quota("team-a", ml(), json!({MIG1G: 14})),
                quota("team-c", json!({"team": "web"}), json!({MIG1G: 4, MIG3G: 1})),
            ],
            nodes: vec![gpunode("p1", &[&seven_1g, &seven_1g], None), gpunode("outside", &[&four_1g_one_3g], None)],
            owned: &["p1"],
            short: BTreeMap::new(),
        },
        Row {
            name: "a GPU the solver cannot carve (not MIG capable) still supplies a whole GPU",
            quotas: vec![quota("team-a", ml(), json!({"nvidia.com/gpu": 1, MIG1G: 7}))],
            nodes: vec![gpunode("p1", &[&seven_1g], None), whole_gpu_node("a10")],
            owned: &["p1"],
            short: BTreeMap::new(),
        },
        Row {
            name: "an invalid or deleted quota counts for neither",
            quotas: vec![quota("team-a", ml(), json!({MIG1G: 7})), invalid.clone(), {
                let mut gone = quota("gone", ml(), json!({MIG1G: 50}));
                gone.metadata.deletion_timestamp = Some(now());
                gone
            }],
            nodes: vec![gpunode("p1", &[&seven_1g], None)],
            owned: &["p1"],
            short: BTreeMap::new(),
        },
    ];
    for row in rows {
        let plan = auto_plan(None);
        let from = plan.spec.layouts_from.clone().unwrap();
        let namespaces: BTreeSet<String> = row.quotas.iter().flat_map(|q| q.spec.namespaces.clone()).collect();
        let quotas = plan_quotas(&row.quotas, &namespaces, &[], &row.nodes, now());
        let refs: Vec<&GpuNode> = row.nodes.iter().collect();
        let demand = plan_demand(&from, &row.quotas);
        let d = decide(&plan, &demand, &refs, &set(row.owned), &set(&[]), &set(&[]), &[], "t", now()).unwrap();
        let over: BTreeMap<String, i64> =
            quotas.shortfall.iter().filter(|(_, n)| **n > 0).map(|(r, n)| (r.clone(), *n)).collect();
        assert_eq!(over, row.short, "{}: the quota controller", row.name);
        assert_eq!(d.shortfall, row.short, "{}: the plan's decision {d:#?}", row.name);
        assert_eq!(d.supply_before, Capacity::of(&row.nodes).supply, "{}: the same fleet supply", row.name);
        let mut with_decision = plan.clone();
        with_decision.status =
            Some(tessera_crds::GpuPartitionPlanStatus { layout_decision: Some(d), ..Default::default() });
        let (met, _, msg) = demand_condition(&with_decision).unwrap();
        for (name, st) in &quotas.statuses {
            let Some(c) = st.conditions.iter().find(|c| c.type_ == CAPACITY_AVAILABLE) else { continue };
            assert_eq!(
                c.status == "True",
                met,
                "{}: quota {name} says {:?}, the plan says {msg:?}",
                row.name,
                c.message
            );
        }
    }
}

/// While it waits, the plan says what changed, what the fleet supplies of the demand
/// now (the quota controller's shortfall) and when it will decide.
#[test]
fn the_stabilizing_message_names_the_shortfall_and_when_it_decides() {
    let demand: BTreeMap<String, i64> = [(MIG1G.to_string(), 20), (MIG3G.to_string(), 1)].into();
    let supply: BTreeMap<String, i64> = [(MIG1G.to_string(), 18), (MIG3G.to_string(), 1)].into();
    let at = Time("2026-06-01T00:00:30Z".parse().unwrap());
    let m =
        stabilizing_message("the quotas' demand changed: nvidia.com/mig-1g.10gb 18 -> 20", &demand, &supply, 30, &at);
    assert_eq!(
        m,
        "waiting 30s (stabilizationSeconds) for the change to hold still: the quotas' demand changed: \
         nvidia.com/mig-1g.10gb 18 -> 20; the fleet supplies nvidia.com/mig-1g.10gb 18 of 20 (short 2); deciding at \
         2026-06-01T00:00:30Z unless it changes again"
    );
    let m = stabilizing_message(
        "the plan changed",
        &demand,
        &[(MIG1G.to_string(), 20), (MIG3G.to_string(), 1)].into(),
        0,
        &at,
    );
    assert!(m.contains("the fleet's current layouts cover the demand"), "{m}");
}

/// `node` failed as this plan's target: its agent reports `Stalled` `reason` for the intent it was
/// given (its current generation), and (while `failed`) the rollout record says `Failed`.
fn cannot_apply(node: &str, reason: &str, failed: bool, generation: i64) -> GpuNode {
    let seven: &[(&str, i32)] = &[("7g.80gb", 0)];
    let record = json!({"phase": "Failed", "plan": "auto", "planGeneration": generation,
                        "message": format!("{reason}: instance 7g.80gb holds 900 MiB")});
    let mut gn = gpunode(node, &[seven], failed.then_some(record));
    gn.metadata.generation = Some(3);
    gn.status.as_mut().unwrap().conditions = serde_json::from_value(json!([{"type": "Stalled", "status": "True",
        "reason": reason, "message": "instance 7g.80gb holds 900 MiB", "observedGeneration": 3,
        "lastTransitionTime": "2026-06-01T00:00:00Z"}]))
    .unwrap();
    gn
}

fn with_decision(mut plan: GpuPartitionPlan, d: &LayoutDecision) -> GpuPartitionPlan {
    plan.status.get_or_insert_with(Default::default).layout_decision = Some(d.clone());
    plan
}

/// One decision as the controller makes it: nodes failed or mid-change frozen, the exclusions
/// the plan's nodes and stored decision give.
fn decide_as_the_controller(plan: &GpuPartitionPlan, nodes: &[GpuNode], demand: &Demand) -> LayoutDecision {
    let refs: Vec<&GpuNode> = nodes.iter().collect();
    let owned: BTreeSet<String> = nodes.iter().map(|g| g.name_any()).collect();
    let frozen: BTreeSet<String> = nodes.iter().filter(|g| frozen_by_rollout(g)).map(|g| g.name_any()).collect();
    let ex = exclusions(plan, refs.iter().copied());
    decide(plan, demand, &refs, &owned, &set(&[]), &frozen, &ex.kept, "t", now()).unwrap()
}

#[test]
fn a_target_whose_agent_cannot_apply_is_not_chosen_again_until_something_changes() {
    let seven: &[(&str, i32)] = &[("7g.80gb", 0)];
    // Each node can give 7 1g slices; 14 asks for both, so the plan stays short without `n` and
    // is re-checked every 5 minutes: the re-check must not pick `n` again.
    let demand = mine(&[(MIG1G.to_string(), 14)].into());
    let targets = |d: &LayoutDecision| d.targets.iter().map(|t| t.node.clone()).collect::<Vec<_>>();
    let first = decide_as_the_controller(
        &auto_plan(None),
        &[gpunode("n", &[seven], None), gpunode("m", &[seven], None)],
        &demand,
    );
    assert_eq!(targets(&first), ["m", "n"]);
    // `n` fails (LeakedMemory); `m` is applied. The plan decides around `n`.
    let plan = with_decision(auto_plan(None), &first);
    let m_done = gpunode(
        "m",
        &[&[
            ("1g.10gb", 0),
            ("1g.10gb", 1),
            ("1g.10gb", 2),
            ("1g.10gb", 3),
            ("1g.10gb", 4),
            ("1g.10gb", 5),
            ("1g.10gb", 6),
        ]],
        None,
    );
    let failed = [cannot_apply("n", "LeakedMemory", true, 1), m_done.clone()];
    let second = decide_as_the_controller(&plan, &failed, &demand);
    assert!(targets(&second).is_empty(), "{second:#?}");
    let plan = with_decision(auto_plan(None), &second);
    assert_eq!(desired(&plan, "n", &failed[0]), Ask::Release, "not a target any more: released");
    // Released: no rollout record, nothing frozen; the agent still cannot apply. The 5-minute
    // re-check of the unmet demand must leave `n` out, and the plan must say why.
    let released = [cannot_apply("n", "LeakedMemory", false, 1), m_done.clone()];
    let ex = exclusions(&plan, released.iter());
    assert!(ex.lifted.is_empty(), "{ex:?}");
    assert_eq!(next(&plan, &demand.total(), &second.fleet, 300, 0, 0, &ex.lifted), Next::Keep);
    let third = decide_as_the_controller(&plan, &released, &demand);
    assert!(targets(&third).is_empty(), "the node that failed is chosen again: {third:#?}");
    assert_eq!(third.excluded.len(), 1);
    assert_eq!((third.excluded[0].node.as_str(), third.excluded[0].reason.as_str()), ("n", "LeakedMemory"));
    assert!(third.message.contains("n (LeakedMemory: instance 7g.80gb holds 900 MiB)"), "{}", third.message);
    assert!(third.message.contains(RETRY_ANNOTATION), "{}", third.message);
    assert_eq!(second.excluded, third.excluded, "the decision that released it says so too");
    let plan = with_decision(auto_plan(None), &third);
    assert_eq!(exclusions(&plan, released.iter()).kept, third.excluded, "and again after a restart: from the status");

    // Something changes about it: each lifts the exclusion, the plan decides again, `n` is tried.
    let mut reset = released.clone();
    reset[0].status.as_mut().unwrap().conditions.clear(); // an admin reset the GPU
    let mut other = released.clone();
    other[0].status.as_mut().unwrap().conditions[0].reason = "InstanceInUse".into();
    let mut retried = released.clone();
    retried[0].metadata.annotations = Some([(RETRY_ANNOTATION.to_string(), "1".to_string())].into());
    for (what, nodes) in [("report cleared", &reset), ("another reason", &other), ("retry annotation", &retried)] {
        let ex = exclusions(&plan, nodes.iter());
        assert!(ex.kept.is_empty() && ex.lifted.len() == 1 && ex.lifted[0].starts_with("n "), "{what}: {ex:?}");
        assert!(
            matches!(next(&plan, &demand.total(), &third.fleet, 30, 0, 0, &ex.lifted), Next::Decide(m) if m.contains("tried again: n ")),
            "{what}"
        );
        assert_eq!(targets(&decide_as_the_controller(&plan, nodes, &demand)), ["n"], "{what}");
    }
    // An annotation already there when the node was left out is not a new request.
    let annotated = with_decision(auto_plan(None), &decide_as_the_controller(&plan, &retried, &demand));
    let mut failed_again = retried.clone();
    failed_again[0] = cannot_apply("n", "LeakedMemory", true, 1);
    failed_again[0].metadata.annotations = retried[0].metadata.annotations.clone();
    let out = decide_as_the_controller(&annotated, &failed_again, &demand);
    assert_eq!(out.excluded[0].retry.as_deref(), Some("1"));
    let stays = [cannot_apply("n", "LeakedMemory", false, 1), m_done.clone()];
    let mut stays = stays;
    stays[0].metadata.annotations = retried[0].metadata.annotations.clone();
    assert_eq!(exclusions(&with_decision(auto_plan(None), &out), stays.iter()).kept.len(), 1);
    // The plan changes: a decision for the new generation starts afresh.
    let mut edited = plan.clone();
    edited.metadata.generation = Some(2);
    assert!(exclusions(&edited, released.iter()).kept.is_empty());
    assert_eq!(targets(&decide_as_the_controller(&edited, &released, &demand)), ["n"]);
    // A node the plan no longer owns is dropped from the list.
    assert!(exclusions(&plan, [&m_done]).kept.is_empty());
}
