//! The verdicts a pass keeps for the next (`KeptVerdicts`): reused only while a node's inputs are the
//! same, and never changing what a pass decides.

use super::*;

static POOL_B: std::sync::LazyLock<BTreeMap<String, String>> =
    std::sync::LazyLock::new(|| [("pool".to_string(), "b".to_string())].into());

fn versioned(mut x: NodeInput<'static>) -> NodeInput<'static> {
    x.versions = Some(versions_of(&x));
    x
}

/// Plans `nodes` afresh and with `kept_verdicts`, checks both agree, and returns them.
fn both(
    plans: &[GpuPartitionPlan],
    nodes: &[NodeInput<'_>],
    carry: &mut KeptVerdicts,
) -> (Vec<Action>, BTreeMap<String, PlanReport>) {
    both_at(plans, nodes, carry, now())
}

fn both_at(
    plans: &[GpuPartitionPlan],
    nodes: &[NodeInput<'_>],
    carry: &mut KeptVerdicts,
    at: Timestamp,
) -> (Vec<Action>, BTreeMap<String, PlanReport>) {
    let fresh = plan_fleet(plans, nodes, at);
    let kept = plan_fleet_with(plans, nodes, at, carry);
    assert_eq!(kept, fresh, "the kept verdicts changed what the pass decided");
    fresh
}

fn idle_here() -> serde_json::Value {
    json!({"phase": "Idle", "plan": "p", "planGeneration": 1})
}

fn applying() -> serde_json::Value {
    json!({"phase": "Applying", "plan": "p", "planGeneration": 1, "cordonedByUs": true,
           "drainStartedAt": "2026-06-01T00:00:00Z", "applyStartedAt": "2026-06-01T00:00:00Z"})
}

/// Three nodes updated, one applying (the whole budget), three waiting, one no plan matches.
fn fleet() -> Vec<NodeInput<'static>> {
    let mut nodes = Vec::new();
    for i in 0..3 {
        let name = format!("u{i}");
        nodes.push(versioned(node(&name, false, gpunode(&name, wanted(), true, Some(idle_here())))));
    }
    nodes.push(versioned(node("a0", true, gpunode("a0", wanted(), false, Some(applying())))));
    for i in 0..3 {
        let name = format!("w{i}");
        nodes.push(versioned(node(&name, false, gpunode(&name, json!([]), true, None))));
    }
    let mut other = node("o0", false, gpunode("o0", json!([]), true, None));
    other.labels = &POOL_B;
    nodes.push(versioned(other));
    nodes
}

#[test]
fn a_pass_reuses_the_verdicts_of_nodes_whose_inputs_did_not_change() {
    let plans = [plan("p", 0, json!(1), h100_layout())];
    let mut carry = KeptVerdicts::default();
    let (_, first) = both(&plans, &fleet(), &mut carry);
    assert_eq!((carry.planned, carry.reused), (8, 0), "the first pass plans every node");
    assert_eq!((first["p"].updated, first["p"].pending, first["p"].in_progress), (3, 3, 1));
    let (actions, second) = both(&plans, &fleet(), &mut carry);
    assert_eq!(
        (carry.planned, carry.reused),
        (1, 7),
        "only the node in flight is planned again: the updated, the waiting and the unowned are reused"
    );
    assert_eq!(second, first);
    assert!(actions.is_empty(), "{actions:?}");
}

#[test]
fn a_waiting_node_with_a_kept_verdict_starts_once_a_slot_frees() {
    let plans = [plan("p", 0, json!(1), h100_layout())];
    let mut carry = KeptVerdicts::default();
    both(&plans, &fleet(), &mut carry);
    both(&plans, &fleet(), &mut carry);
    // The applying node is done and back at rest: its slot is free.
    let mut nodes = fleet();
    nodes[3] = versioned(node("a0", false, gpunode("a0", wanted(), true, Some(idle_here()))));
    let (actions, reports) = both(&plans, &nodes, &mut carry);
    let started: Vec<&str> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Cordon { node } => Some(node.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(started, ["w0"], "the first waiting node in order starts, and only one");
    assert_eq!((reports["p"].updated, reports["p"].pending, reports["p"].in_progress), (4, 2, 1));
    assert_eq!(
        (carry.planned, carry.reused),
        (2, 6),
        "the freed node and w0 planned; three updated, two still waiting and the unowned one reused"
    );
}

#[test]
fn a_changed_version_agent_cache_or_plan_forgets_the_verdict() {
    let plans = [plan("p", 0, json!(1), h100_layout())];
    let mut carry = KeptVerdicts::default();
    both(&plans, &fleet(), &mut carry);
    // A new version of one waiting node: that node alone is planned again.
    let mut nodes = fleet();
    nodes[4].versions.as_mut().unwrap().gpunode = Some(7);
    both(&plans, &nodes, &mut carry);
    assert_eq!((carry.planned, carry.reused), (2, 6));
    // Its agent stops responding, another's cache lags, a third carries our cordon mark (kept out
    // to be safe; its orphan check runs for every node anyway): none of the three is reused.
    nodes[0].agent = AgentHealth::NotResponding { since: None };
    nodes[1].cache_behind = true;
    nodes[5].cordon_annotated = Some(now());
    both(&plans, &nodes, &mut carry);
    assert_eq!((carry.planned, carry.reused), (4, 4), "{carry:?}");
    // A node without versions is never reused.
    nodes[6].versions = None;
    both(&plans, &nodes, &mut carry);
    both(&plans, &nodes, &mut carry);
    assert_eq!(carry.planned, 5, "{carry:?}");
    // Any change to the plans forgets every verdict.
    let mut bumped = plans.clone();
    bumped[0].metadata.generation = Some(2);
    both(&bumped, &fleet(), &mut carry);
    assert_eq!(carry.reused, 0);
}

/// A node of the property test: what its objects say, and its inputs beside them.
fn drawn(
    i: usize,
    (state, pool_b, unschedulable, annotated, dead, behind, unversioned, uncatalogued): Draw,
) -> NodeInput<'static> {
    let name = format!("n{i:02}");
    let record = match state % 10 {
        0 | 1 => None,
        2 => Some(idle_here()),
        3 => Some(json!({"phase": "Idle", "plan": "old", "planGeneration": 4})),
        4 => Some(json!({"phase": "Draining", "plan": "p", "planGeneration": 1, "cordonedByUs": true,
                         "drainStartedAt": "2026-05-31T00:00:00Z"})),
        5 => Some(applying()),
        6 => Some(json!({"phase": "Uncordoning", "plan": "p", "planGeneration": 1, "cordonedByUs": true})),
        7 => Some(json!({"phase": "Failed", "plan": "p", "planGeneration": 1, "message": "x"})),
        8 => Some(json!({"phase": "Failed", "plan": "p", "planGeneration": 0, "cordonedByUs": true, "message": "x"})),
        _ => Some(json!({"phase": "Pending", "plan": "p", "planGeneration": 1})),
    };
    let spec = if state % 3 == 0 { json!([]) } else { wanted() };
    let mut gn = gpunode(&name, spec, state % 4 != 1, record);
    if uncatalogued {
        // A board outside the catalog, with the profile table its agent read.
        gn.status.as_mut().unwrap().gpus[0] = serde_json::from_value(json!({"index": 0, "uuid": "GPU-0",
            "product": "NVIDIA Future GPU", "migCapable": true, "profiles": [
            {"name": "3g.40gb", "id": 9, "computeSlices": 3, "memorySlices": 4, "maxCount": 2, "starts": [0, 4]},
            {"name": "7g.80gb", "id": 0, "computeSlices": 7, "memorySlices": 8, "maxCount": 1, "starts": [0]}]}))
        .unwrap();
    }
    let mut x = node(&name, unschedulable, gn);
    if state % 13 == 12 {
        x.gpunode = None;
    }
    if pool_b {
        x.labels = &POOL_B;
    }
    x.cordon_annotated = annotated.then(|| "2026-05-31T00:00:00Z".parse().unwrap());
    if dead {
        // Dead, or not proven yet (first seen, or the lease watch just back).
        x.agent = if state >= 128 { AgentHealth::Unproven } else { AgentHealth::NotResponding { since: None } };
    }
    x.cache_behind = behind;
    x.versions = (!unversioned).then(|| versions_of(&x));
    x
}

type Draw = (u8, bool, bool, bool, bool, bool, bool, bool);

fn draw() -> impl Strategy<Value = Draw> {
    (
        any::<u8>(),
        proptest::bool::weighted(0.2),
        proptest::bool::weighted(0.2),
        proptest::bool::weighted(0.1),
        proptest::bool::weighted(0.1),
        proptest::bool::weighted(0.1),
        proptest::bool::weighted(0.05),
        proptest::bool::weighted(0.1),
    )
}

/// What changes between two passes of the property test.
#[derive(Debug, Clone)]
struct Step {
    redraw: Vec<(usize, Draw)>,
    plan_change: u8,
    /// A node whose agent health or cache lag flips with the same versions.
    flip: Option<(usize, bool)>,
    /// The nodes come in another order (positions change).
    rotate: usize,
    /// Seconds the clock moves on.
    advance: u16,
}

fn step() -> impl Strategy<Value = Step> {
    (
        proptest::collection::vec((0usize..12, draw()), 0..4),
        0u8..10,
        proptest::option::of((0usize..12, any::<bool>())),
        0usize..3,
        0u16..400,
    )
        .prop_map(|(redraw, plan_change, flip, rotate, advance)| Step {
            redraw,
            plan_change,
            flip,
            rotate,
            advance,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Passes over a fleet that changes between them (nodes redrawn, reordered, removed, agents
    /// dying and caches lagging with unchanged versions, the clock moving past drain and apply
    /// timeouts, plans edited, paused, deleted and overlapping, boards outside the catalog):
    /// every pass decides with the kept verdicts exactly what it decides afresh.
    #[test]
    fn kept_verdicts_never_change_a_pass(
        first in proptest::collection::vec(draw(), 1..12),
        steps in proptest::collection::vec(step(), 1..6),
        budget in 1i64..4,
        second_plan in proptest::option::of(-1i32..2),
        future_board in any::<bool>(),
    ) {
        // A layout for a board outside the catalog is valid only while a matched node reports
        // its table: the plan's validity then depends on nodes, not on the plan alone.
        let layouts = if future_board {
            json!([{"gpuProduct": "H100-80GB", "profiles": {"3g.40gb": 2}},
                   {"gpuProduct": "NVIDIA Future GPU", "profiles": {"3g.40gb": 2}}])
        } else {
            h100_layout()
        };
        let mut plans = vec![plan("p", 0, json!(budget), layouts)];
        plans[0].spec.rollout.apply_timeout_seconds = 300;
        if let Some(priority) = second_plan {
            plans.push(plan("q", priority, json!(1), h100_layout()));
        }
        let mut nodes: Vec<NodeInput<'static>> = first.iter().enumerate().map(|(i, d)| drawn(i, *d)).collect();
        let mut carry = KeptVerdicts::default();
        let mut at = now();
        both_at(&plans, &nodes, &mut carry, at);
        for step in steps {
            for (i, d) in step.redraw {
                if i < nodes.len() {
                    nodes[i] = drawn(i, d);
                } else {
                    nodes.push(drawn(nodes.len(), d));
                }
            }
            if let Some((i, agent)) = step.flip {
                let len = nodes.len();
                let x = &mut nodes[i % len];
                if agent {
                    x.agent = match x.agent {
                        AgentHealth::Alive => AgentHealth::NotResponding { since: None },
                        AgentHealth::NotResponding { .. } => AgentHealth::Unproven,
                        AgentHealth::Unproven => AgentHealth::Alive,
                    };
                } else {
                    x.cache_behind = !x.cache_behind;
                }
            }
            let len = nodes.len();
            nodes.rotate_left(step.rotate % len);
            at = at.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(i64::from(step.advance))).unwrap();
            match step.plan_change {
                0 => plans[0].spec.paused = !plans[0].spec.paused,
                1 => plans[0].metadata.generation = Some(plans[0].metadata.generation.unwrap_or(1) + 1),
                2 => plans[0].spec.rollout.max_unavailable = serde_json::from_value(json!(budget + 1)).unwrap(),
                3 if nodes.len() > 1 => {
                    nodes.pop();
                }
                4 => {
                    // The plans after it move up among the live ones.
                    let deleting = &mut plans[0].metadata.deletion_timestamp;
                    *deleting = match deleting {
                        None => Some(Time(now())),
                        Some(_) => None,
                    };
                }
                5 => plans[0].spec.node_selector = serde_json::from_value(json!({"matchLabels": {"pool": "b"}})).unwrap(),
                _ => {}
            }
            both_at(&plans, &nodes, &mut carry, at);
        }
    }
}

#[test]
fn an_automatic_plan_keeps_no_verdict() {
    // Its intent follows the decision in its status, which the plan key does not hold.
    let decision = json!({"planGeneration": 1, "targets": [{"node": "t", "gpus": wanted()}], "message": "m"});
    let nodes = [
        versioned(node("t", false, gpunode("t", json!([]), true, None))),
        versioned(node("other", false, gpunode("other", json!([]), true, None))),
    ];
    let plans = [auto_plan(Some(decision))];
    let mut carry = KeptVerdicts::default();
    both(&plans, &nodes, &mut carry);
    both(&plans, &nodes, &mut carry);
    assert_eq!((carry.planned, carry.reused), (2, 0));
}

#[test]
fn the_rollout_model_reuses_verdicts_while_it_keeps_its_invariants() {
    // The model of the cluster in `tests` plans every round with and without the kept verdicts
    // and compares them; here it must also have reused some, or that comparison proved nothing.
    let mut sim = Sim::new(6, json!(2), 2, &BTreeSet::new(), vec![AgentKind::Good; 6]);
    for _ in 0..20 {
        sim.round();
    }
    assert!(sim.reused > 20, "reused {} verdicts over 20 rounds", sim.reused);
    assert!(sim.held.iter().all(|h| *h == sim.desired()), "the fleet converged");
}

#[test]
fn a_node_reporting_a_board_outside_the_catalog_is_planned_every_pass() {
    // The plan's layout for that board is valid only while a matched node reports its table, so
    // the node must be seen by `validate` in every pass, kept verdict or not.
    let layouts = json!([{"gpuProduct": "NVIDIA Future GPU", "profiles": {"3g.40gb": 2}}]);
    let plans = [plan("p", 0, json!(1), layouts)];
    // At rest with the plan's layout (state 2), on the board outside the catalog.
    let nodes = [drawn(0, (2, false, false, false, false, false, false, true))];
    let mut carry = KeptVerdicts::default();
    let (_, first) = both(&plans, &nodes, &mut carry);
    assert!(first["p"].invalid_spec.is_empty(), "{:?}", first["p"]);
    assert_eq!(first["p"].updated, 1, "{:?}", first["p"]);
    let (_, second) = both(&plans, &nodes, &mut carry);
    assert_eq!(second, first);
    assert_eq!((carry.planned, carry.reused), (1, 0));
}
