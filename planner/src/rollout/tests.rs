use std::collections::BTreeSet;
use std::rc::Rc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use proptest::prelude::*;
use serde_json::json;
use tessera_crds::conditions::RECONCILING;
use tessera_crds::gpunode::GpuState;
use tessera_crds::plan::GpuPartitionPlanSpec;

use super::*;
use crate::liveness::AgentHealth;

fn plan(name: &str, priority: i32, max_unavailable: serde_json::Value, layouts: serde_json::Value) -> GpuPartitionPlan {
    serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan",
        "metadata": {"name": name, "generation": 1},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "a"}}, "priority": priority, "layouts": layouts,
                 "rollout": {"maxUnavailable": max_unavailable, "drainTimeoutSeconds": 60}}
    }))
    .unwrap()
}

fn h100_layout() -> serde_json::Value {
    json!([{"gpuProduct": "H100-80GB", "profiles": {"3g.40gb": 2}}])
}

fn gpunode(name: &str, spec_gpus: serde_json::Value, applied: bool, rollout: Option<serde_json::Value>) -> GpuNode {
    let mut status =
        json!({"gpus": [{"index": 0, "uuid": "GPU-0", "product": "NVIDIA H100 80GB HBM3", "migCapable": true}]});
    if applied {
        status["observedGeneration"] = json!(2);
        status["conditions"] = json!([{"type": "Ready", "status": "True", "reason": "Applied", "message": "",
                                       "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 2}]);
    }
    if let Some(r) = rollout {
        status["rollout"] = r;
    }
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": name, "generation": 2}, "spec": {"gpus": spec_gpus}, "status": status}))
    .unwrap()
}

/// The MIG instances an agent reports for `profiles`, placed one after another (4 slots each).
fn instances<'p>(profiles: impl IntoIterator<Item = &'p str>) -> Vec<tessera_crds::gpunode::MigInstance> {
    profiles
        .into_iter()
        .enumerate()
        .map(|(i, p)| serde_json::from_value(json!({"profile": p, "start": i * 4, "size": 4})).unwrap())
        .collect()
}

fn wanted() -> serde_json::Value {
    json!([{"index": 0, "migEnabled": true, "profiles": {"3g.40gb": 2}}])
}

static POOL_A: std::sync::LazyLock<BTreeMap<String, String>> =
    std::sync::LazyLock::new(|| [("pool".to_string(), "a".to_string())].into());

fn node(name: &str, unschedulable: bool, gn: GpuNode) -> NodeInput<'static> {
    NodeInput {
        // Leaked: a test's few names live as long as the cached Nodes they stand for would.
        name: name.to_string().leak(),
        labels: &POOL_A,
        unschedulable,
        gpunode: Some(std::sync::Arc::new(gn)),
        pods: Ok(vec![]),
        daemonsets: BTreeSet::new(),
        claims: Default::default(),
        returns: BTreeMap::new(),
        agent: AgentHealth::Alive,
        cordon_annotated: None,
        cache_behind: false,
        versions: None,
        dra_refused: None,
        dra_slices: Default::default(),
    }
}

mod agents;
mod blockers;
mod claims;
mod dra;
mod dra_wait;
mod kept;
mod withdrawn;

/// Versions that change with what the planner reads of a node (its content hashed), as
/// resourceVersions change with every write.
fn versions_of(x: &NodeInput<'_>) -> Versions {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    let hash = |v: String| BuildHasherDefault::<DefaultHasher>::default().hash_one(v);
    Versions {
        node: hash(format!("{}{:?}{:?}{:?}", x.name, x.labels, x.unschedulable, x.cordon_annotated)),
        gpunode: x.gpunode.as_ref().map(|g| hash(serde_json::to_string(&**g).unwrap())),
    }
}

fn now() -> Timestamp {
    "2026-06-01T00:00:00Z".parse().unwrap()
}

#[test]
fn a_node_in_sync_is_updated_and_left_alone() {
    let nodes = [node("n1", false, gpunode("n1", wanted(), true, None))];
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &nodes, now());
    assert_eq!(reports["p"].updated, 1);
    assert!(actions.iter().all(|a| matches!(a, Action::Rollout { .. })), "{actions:?}");
}

#[test]
fn a_differing_node_records_draining_before_cordoning() {
    let nodes = [node("n1", false, gpunode("n1", json!([]), true, None))];
    let (actions, _) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &nodes, now());
    match &actions[..2] {
        [Action::Rollout { rollout: Some(r), .. }, Action::Cordon { node }] => {
            assert_eq!(r.phase, NodePhase::Draining);
            assert!(r.cordoned_by_us);
            assert_eq!(node, "n1");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_already_cordoned_node_is_not_ours_to_uncordon() {
    let nodes = [node("n1", true, gpunode("n1", json!([]), true, None))];
    let (actions, _) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &nodes, now());
    assert!(!actions.iter().any(|a| matches!(a, Action::Cordon { .. })));
    let Action::Rollout { rollout: Some(r), .. } = &actions[0] else { panic!() };
    assert!(!r.cordoned_by_us);
}

#[test]
fn a_drained_node_gets_its_intent_then_applying() {
    let r = json!({"phase": "Draining", "plan": "p", "cordonedByUs": true, "drainStartedAt": "2026-06-01T00:00:00Z"});
    let nodes = [node("n1", true, gpunode("n1", json!([]), true, Some(r)))];
    let (actions, _) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &nodes, now());
    assert!(matches!(&actions[0], Action::Intent { gpus, .. } if gpus.len() == 1));
    assert!(matches!(&actions[1], Action::Rollout { rollout: Some(r), .. } if r.phase == NodePhase::Applying));
}

#[test]
fn gpu_pods_are_evicted_and_a_timeout_stalls_without_force() {
    let r = json!({"phase": "Draining", "plan": "p", "cordonedByUs": true, "drainStartedAt": "2026-05-31T00:00:00Z",
                   "message": "eviction of ml/a blocked: Cannot evict pod as it would violate the pod's disruption budget web"});
    let mut n = node("n1", true, gpunode("n1", json!([]), true, Some(r)));
    let pod = |name: &str, gpu: bool| -> Pod {
        let res = if gpu { json!({"limits": {"nvidia.com/mig-3g.40gb": "1"}}) } else { json!({}) };
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ml", "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}]},
            "spec": {"containers": [{"name": "c", "resources": res}]}, "status": {"phase": "Running"}}))
        .unwrap()
    };
    n.pods = Ok(vec![pod("a", true), pod("b", false)]);
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[n], now());
    let evicted: Vec<&Action> = actions.iter().filter(|a| !matches!(a, Action::Blockers { .. })).collect();
    let want = Action::Evict { node: "n1".into(), namespace: "ml".into(), pod: "a".into(), came_back: None };
    assert_eq!(evicted, vec![&want]);
    assert_eq!(reports["p"].drain_timeouts.len(), 1);
    assert!(reports["p"].drain_timeouts[0].contains("disruption budget web"), "{:?}", reports["p"]);
}

#[test]
fn equal_priorities_conflict_and_neither_acts() {
    let nodes = [node("n1", false, gpunode("n1", json!([]), true, None))];
    let plans = [plan("p", 5, json!(1), h100_layout()), plan("q", 5, json!(1), h100_layout())];
    let (actions, reports) = plan_fleet(&plans, &nodes, now());
    assert!(actions.is_empty(), "{actions:?}");
    assert_eq!(reports["p"].conflicts, [("n1".to_string(), vec!["q".to_string()])].into());
    assert_eq!(reports["q"].conflicts, [("n1".to_string(), vec!["p".to_string()])].into());
    // Each plan's condition names the other one.
    for (me, other) in [("p", "q"), ("q", "p")] {
        let st = crate::status::plan_status(&[], &reports[me], Some(1), false, Time(now()));
        for t in [STALLED, tessera_crds::conditions::CONFLICT] {
            let c = st.conditions.iter().find(|c| c.type_ == t).unwrap();
            assert!(
                c.message.contains(&format!("plan(s) {other} of equal priority also match node(s) n1")),
                "{}",
                c.message
            );
        }
    }
    // A higher priority wins cleanly.
    let plans = [plan("p", 5, json!(1), h100_layout()), plan("q", 6, json!(1), h100_layout())];
    let (_, reports) = plan_fleet(&plans, &nodes, now());
    assert!(reports["q"].conflicts.is_empty());
    assert_eq!(reports["q"].in_progress, 1);
    assert_eq!(reports["p"].matched, 0);
}

#[test]
fn an_impossible_layout_is_reported_not_applied() {
    let nodes = [node("n1", false, gpunode("n1", json!([]), true, None))];
    let bad = json!([{"gpuProduct": "H100-80GB", "profiles": {"4g.40gb": 2}}]);
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), bad)], &nodes, now());
    assert!(actions.is_empty());
    assert!(reports["p"].invalid_spec[0].contains("holds at most 1"), "{:?}", reports["p"]);
}

#[test]
fn a_product_without_a_layout_is_skipped() {
    let nodes = [node("n1", false, gpunode("n1", json!([]), true, None))];
    let a30 = json!([{"gpuProduct": "A30", "profiles": {"4g.24gb": 1}}]);
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), a30)], &nodes, now());
    assert!(actions.is_empty());
    assert!(reports["p"].skipped["n1"].contains("no layout for this node's GPUs (NVIDIA H100 80GB HBM3)"));
}

#[test]
fn a_deleted_plan_releases_its_nodes_without_reconfiguring() {
    let r = json!({"phase": "Draining", "plan": "p", "cordonedByUs": true});
    let nodes = [node("n1", true, gpunode("n1", json!([]), true, Some(r)))];
    let (actions, _) = plan_fleet(&[], &nodes, now());
    assert_eq!(
        actions,
        vec![Action::Uncordon { node: "n1".into() }, Action::Rollout { node: "n1".into(), rollout: None }]
    );
}

/// A released node keeps no intent of a plan that no longer has it.
/// The first pass uncordons and forgets the record; the next empties the intent, once.
#[test]
fn a_node_no_plan_owns_any_more_is_released_then_its_intent_emptied() {
    let r = json!({"phase": "Idle", "plan": "p", "cordonedByUs": false});
    let mut gn = gpunode("n1", wanted(), true, Some(r));
    gn.spec.plan = Some("p".into());
    let (actions, _) = plan_fleet(&[], &[node("n1", false, gn.clone())], now());
    assert_eq!(actions, vec![Action::Rollout { node: "n1".into(), rollout: None }], "the record first");
    gn.status.as_mut().unwrap().rollout = None;
    let (actions, _) = plan_fleet(&[], &[node("n1", false, gn.clone())], now());
    assert_eq!(actions, vec![Action::ClearIntent { node: "n1".into() }]);
    let mut lagging = node("n1", false, gn.clone());
    lagging.cache_behind = true;
    assert_eq!(plan_fleet(&[], &[lagging], now()).0, vec![], "not on a cache behind our writes");
    gn.spec = Default::default();
    assert_eq!(plan_fleet(&[], &[node("n1", false, gn.clone())], now()).0, vec![], "once empty, nothing more");
    // A node an invalid plan or conflicting plans still claim keeps its intent.
    gn.spec.gpus = serde_json::from_value(wanted()).unwrap();
    let twins = [plan("p", 0, json!(1), h100_layout()), plan("q", 0, json!(1), h100_layout())];
    let (actions, _) = plan_fleet(&twins, &[node("n1", false, gn)], now());
    assert!(!actions.iter().any(|a| matches!(a, Action::ClearIntent { .. })), "{actions:?}");
}

/// A node whose intent was emptied (its plan deleted and re-created, a
/// selector edited and reverted) and whose GPUs still hold the layout is taken back without a
/// cordon or a drain; GPUs that differ are drained as usual, and so is a node whose agent saw the
/// intent and still does not say applied.
#[test]
fn a_node_taken_back_with_its_layout_in_place_is_not_drained() {
    let holding = |profiles: &[&str]| {
        let mut gn = gpunode("n1", json!([]), false, None);
        let g = &mut gn.status.as_mut().unwrap().gpus[0];
        g.mig_enabled = true;
        g.instances = instances(profiles.iter().copied());
        gn
    };
    let p = [plan("p", 0, json!(1), h100_layout())];
    let (actions, reports) = plan_fleet(&p, &[node("n1", false, holding(&["3g.40gb", "3g.40gb"]))], now());
    assert!(matches!(&actions[0], Action::Intent { gpus, .. } if gpus.len() == 1), "{actions:?}");
    assert!(
        matches!(&actions[1], Action::Rollout { rollout: Some(r), .. } if r.phase == NodePhase::Idle && !r.cordoned_by_us)
    );
    assert_eq!(actions.len(), 2, "no cordon, no drain: {actions:?}");
    assert_eq!(reports["p"].in_progress, 1);

    let (actions, _) = plan_fleet(&p, &[node("n1", false, holding(&["3g.40gb", "1g.10gb"]))], now());
    assert!(actions.iter().any(|a| matches!(a, Action::Cordon { .. })), "another layout is drained: {actions:?}");

    let mut seen = holding(&["3g.40gb", "3g.40gb"]);
    seen.spec.gpus = serde_json::from_value(wanted()).unwrap();
    seen.status.as_mut().unwrap().observed_generation = seen.metadata.generation;
    let (actions, _) = plan_fleet(&p, &[node("n1", false, seen)], now());
    assert!(actions.iter().any(|a| matches!(a, Action::Cordon { .. })), "seen and not applied: {actions:?}");
}

#[test]
fn an_agent_failure_uncordons_and_reports() {
    let r = json!({"phase": "Applying", "plan": "p", "planGeneration": 1, "cordonedByUs": true});
    let mut gn = gpunode("n1", wanted(), false, Some(r));
    gn.status.as_mut().unwrap().conditions = serde_json::from_value(json!([{"type": "Stalled", "status": "True",
        "reason": "InstanceInUse", "message": "pid 7", "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 2}])).unwrap();
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[node("n1", true, gn)], now());
    assert!(actions.contains(&Action::Uncordon { node: "n1".into() }));
    assert_eq!(reports["p"].failed, vec![("n1".to_string(), "InstanceInUse: pid 7".to_string())]);
}

#[test]
fn finishing_a_node_reports_how_long_its_change_took() {
    let r = json!({"phase": "Applying", "plan": "p", "planGeneration": 1, "cordonedByUs": true, "drainStartedAt": "2026-05-31T23:59:00Z"});
    let nodes = [node("n1", true, gpunode("n1", wanted(), true, Some(r)))];
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &nodes, now());
    assert!(actions.contains(&Action::Completed { node: "n1".into(), seconds: 60.0 }), "{actions:?}");
    assert!(actions.contains(&Action::Uncordon { node: "n1".into() }));
    assert_eq!(reports["p"].updated, 1);
}

#[test]
fn a_reset_request_keeps_the_node_cordoned_and_stalls_the_plan() {
    let r = json!({"phase": "Applying", "plan": "p", "planGeneration": 1, "cordonedByUs": true});
    let mut gn = gpunode("n1", wanted(), false, Some(r));
    gn.status.as_mut().unwrap().conditions = serde_json::from_value(json!([{"type": "Stalled", "status": "True",
        "reason": "ResetRequired", "message": "GPU 0: MIG mode change to enabled needs a GPU reset or node reboot",
        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 2}]))
    .unwrap();
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[node("n1", true, gn)], now());
    assert!(actions.is_empty(), "{actions:?}");
    assert_eq!(reports["p"].reset_required.len(), 1);
    assert!(reports["p"].failed.is_empty());
    let st = crate::status::plan_status(&[], &reports["p"], Some(1), false, Time(now()));
    let stalled = st.conditions.iter().find(|c| c.type_ == STALLED).unwrap();
    assert_eq!(stalled.reason, "ResetRequired");
    assert!(stalled.message.contains("n1: ResetRequired"), "{}", stalled.message);
}

/// How a simulated node agent behaves once it is handed a node.
#[derive(Debug, Clone, Copy)]
enum AgentKind {
    Good,
    /// Reports `Stalled` (a busy instance the drain cannot clear).
    Stalls,
    /// Fails a driver call this many passes, then succeeds.
    Retries(u32),
    /// Dies when handed the node, for this many rounds, then comes back and succeeds.
    DiesFor(u32),
    /// Crash-loops: the operator sees it alive, not proven yet, and dead, in turn; it works
    /// (succeeds) in the rounds it is up.
    Flaps,
}

fn cond(t: &str, status: &str, reason: &str, generation: Option<i64>) -> Condition {
    serde_json::from_value(json!({"type": t, "status": status, "reason": reason, "message": reason,
        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": generation}))
    .unwrap()
}

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// A tiny model of the cluster: the operator's actions change it, and each agent behaves as its
/// kind says, changing the GPUs only when handed a node. Checks the invariants on every round.
struct Sim {
    plans: Vec<GpuPartitionPlan>,
    nodes: Vec<NodeInput<'static>>,
    /// What each node's GPUs hold (the ground truth, not what is reported).
    held: Vec<Vec<GpuIntent>>,
    kinds: Vec<AgentKind>,
    dead_for: Vec<u32>,
    retries: Vec<u32>,
    pre_cordoned: BTreeSet<String>,
    budget: usize,
    /// The cluster's truth; the planner sees it one round late (a lagging cache).
    real_unschedulable: Vec<bool>,
    /// When set, each node's actions of a round may stop early (a failed call, a crash).
    rng: Option<u64>,
    /// The verdicts kept between rounds: every round is planned both with them and afresh.
    carry: KeptVerdicts,
    /// Node verdicts reused over all rounds.
    reused: usize,
    /// Rounds so far (the phase of flapping agents).
    rounds: usize,
}

impl Sim {
    fn new(n: usize, budget: serde_json::Value, limit: usize, pre: &BTreeSet<usize>, kinds: Vec<AgentKind>) -> Self {
        let nodes: Vec<NodeInput<'static>> = (0..n)
            .map(|i| node(&format!("n{i:02}"), pre.contains(&i), gpunode(&format!("n{i:02}"), json!([]), true, None)))
            .collect();
        let retries = kinds.iter().map(|k| if let AgentKind::Retries(r) = k { *r } else { 0 }).collect();
        Sim {
            plans: vec![plan("p", 0, budget, h100_layout())],
            pre_cordoned: nodes.iter().filter(|x| x.unschedulable).map(|x| x.name.to_string()).collect(),
            real_unschedulable: nodes.iter().map(|x| x.unschedulable).collect(),
            rng: None,
            carry: KeptVerdicts::default(),
            reused: 0,
            rounds: 0,
            // The operator just started: no agent is proven yet.
            nodes: nodes.into_iter().map(|x| NodeInput { agent: AgentHealth::Unproven, ..x }).collect(),
            held: vec![vec![]; n],
            kinds,
            dead_for: vec![0; n],
            retries,
            budget: limit,
        }
    }

    fn desired(&self) -> Vec<GpuIntent> {
        serde_json::from_value(wanted()).unwrap()
    }

    fn rollout(&self, i: usize) -> Option<&NodeRollout> {
        self.nodes[i].gpunode.as_ref()?.status.as_ref()?.rollout.as_ref()
    }

    /// Independent of the planner's own bookkeeping: disrupted by us, failed for this plan
    /// generation, or not updated with a dead agent.
    fn unavailable(&self) -> usize {
        let generation = self.plans[0].metadata.generation;
        (0..self.nodes.len())
            .filter(|&i| {
                let r = self.rollout(i);
                let phase = r.map(|r| r.phase).unwrap_or_default();
                let failed = phase == NodePhase::Failed && r.is_some_and(|r| r.plan_generation == generation);
                let dead = self.nodes[i].agent != AgentHealth::Alive && self.held[i] != self.desired();
                in_flight(phase) || failed || dead
            })
            .count()
    }

    fn round(&mut self) -> PlanReport {
        let before = self.unavailable();
        for x in &mut self.nodes {
            x.versions = Some(versions_of(x));
        }
        let (actions, reports) = plan_fleet(&self.plans, &self.nodes, now());
        let kept = plan_fleet_with(&self.plans, &self.nodes, now(), &mut self.carry);
        assert_eq!(
            (&kept.0, &kept.1),
            (&actions, &reports),
            "the verdicts kept from the round before changed the plan"
        );
        self.reused += self.carry.reused;
        // A node is started, or handed over, only with its agent alive; only a dead agent's
        // `GpuNode` is marked `Ready=Unknown`.
        for a in &actions {
            let i = self.nodes.iter().position(|x| x.name == crate::rollout::node_of(a)).unwrap();
            let was = self.rollout(i).map(|r| r.phase).unwrap_or_default();
            let agent = &self.nodes[i].agent;
            match a {
                Action::Rollout { rollout: Some(r), node } => {
                    let started = r.phase == NodePhase::Draining && was != NodePhase::Draining;
                    let handed = r.phase == NodePhase::Applying && was == NodePhase::Draining;
                    assert!(
                        !(started || handed) || *agent == AgentHealth::Alive,
                        "{node} moved to {:?} with {agent:?}",
                        r.phase
                    );
                    assert!(!(started && self.at_rest_with_layout(i)), "{node} started with nothing to change");
                }
                Action::Intent { node, gpus, .. } => {
                    // An intent the GPUs already hold changes nothing (a drain withdrawn, taken back).
                    assert!(
                        *agent == AgentHealth::Alive || was == NodePhase::Applying || self.held[i] == *gpus,
                        "{node}: intent with {agent:?}"
                    );
                }
                Action::AgentDown { node, .. } => {
                    assert!(agent.is_not_responding(), "{node} reported down with {agent:?}")
                }
                _ => {}
            }
        }
        let mut starts = 0;
        // Per node, a failed call or a crash may cut its ordered actions short.
        let mut cut: BTreeMap<String, usize> = BTreeMap::new();
        if let Some(rng) = self.rng.as_mut() {
            for a in &actions {
                let node = crate::rollout::node_of(a).to_string();
                cut.entry(node).or_insert_with(|| {
                    *rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let roll = (*rng >> 33) % 8;
                    if roll < 2 { roll as usize } else { usize::MAX }
                });
            }
        }
        let mut done: BTreeMap<String, usize> = BTreeMap::new();
        let actions: Vec<Action> = actions
            .into_iter()
            .filter(|a| {
                let node = crate::rollout::node_of(a).to_string();
                let k = done.entry(node.clone()).or_default();
                *k += 1;
                *k <= cut.get(&node).copied().unwrap_or(usize::MAX)
            })
            .collect();
        for a in actions {
            let i = |name: &str| self.nodes.iter().position(|x| x.name == name).unwrap();
            match a {
                Action::Cordon { node } => {
                    let i = i(&node);
                    self.real_unschedulable[i] = true;
                }
                Action::Uncordon { node } => {
                    assert!(!self.pre_cordoned.contains(&node), "uncordoned {node}, which an admin cordoned");
                    let i = i(&node);
                    self.real_unschedulable[i] = false;
                }
                Action::Rollout { node, rollout } => {
                    let i = i(&node);
                    let was = self.rollout(i).map(|r| r.phase).unwrap_or_default();
                    if rollout.as_ref().is_some_and(|r| r.phase == NodePhase::Draining) && was != NodePhase::Draining {
                        starts += 1;
                    }
                    std::sync::Arc::make_mut(self.nodes[i].gpunode.as_mut().unwrap())
                        .status
                        .as_mut()
                        .unwrap()
                        .rollout = rollout;
                }
                Action::Intent { node, gpus, .. } => {
                    let i = i(&node);
                    let gn = std::sync::Arc::make_mut(self.nodes[i].gpunode.as_mut().unwrap());
                    if gn.spec.gpus != gpus {
                        gn.spec.gpus = gpus;
                        gn.metadata.generation = Some(gn.metadata.generation.unwrap() + 1);
                    }
                }
                Action::ClearIntent { node } => {
                    let i = i(&node);
                    let gn = std::sync::Arc::make_mut(self.nodes[i].gpunode.as_mut().unwrap());
                    if !gn.spec.gpus.is_empty() || gn.spec.plan.is_some() {
                        gn.spec = Default::default();
                        gn.metadata.generation = Some(gn.metadata.generation.unwrap() + 1);
                    }
                }
                Action::AgentDown { node, .. } => {
                    let i = i(&node);
                    let st = std::sync::Arc::make_mut(self.nodes[i].gpunode.as_mut().unwrap()).status.as_mut().unwrap();
                    st.conditions.retain(|c| c.type_ != READY);
                    st.conditions.push(cond(READY, "Unknown", "AgentNotResponding", None));
                }
                Action::Evict { .. }
                | Action::ForceDelete { .. }
                | Action::Event { .. }
                | Action::Completed { .. }
                | Action::Blockers { .. } => {}
            }
        }
        assert!(
            starts == 0 || before + starts <= self.budget,
            "{before} unavailable + {starts} started > {}",
            self.budget
        );
        let generation = self.plans[0].metadata.generation;
        let disrupted = (0..self.nodes.len())
            .filter(|&i| {
                let r = self.rollout(i);
                r.is_some_and(|r| {
                    in_flight(r.phase) || (r.phase == NodePhase::Failed && r.plan_generation == generation)
                })
            })
            .count();
        assert!(disrupted <= self.budget, "{disrupted} nodes disrupted or failed > maxUnavailable {}", self.budget);
        for i in 0..self.nodes.len() {
            self.agent_pass(i);
        }
        self.rounds += 1;
        for i in 0..self.nodes.len() {
            self.nodes[i].unschedulable = self.real_unschedulable[i];
        }
        reports["p"].clone()
    }

    fn agent_pass(&mut self, i: usize) {
        if self.dead_for[i] > 0 {
            self.dead_for[i] -= 1;
            self.nodes[i].agent =
                if self.dead_for[i] == 0 { AgentHealth::Alive } else { AgentHealth::NotResponding { since: None } };
            return;
        }
        if let AgentKind::Flaps = self.kinds[i] {
            let was_down = self.nodes[i].agent.is_not_responding();
            self.nodes[i].agent = match (self.rounds + i) % 3 {
                0 => AgentHealth::Alive,
                1 => AgentHealth::Unproven,
                _ => AgentHealth::NotResponding { since: None },
            };
            // Back from every other lapse, its lease renews a round before it reports again (the
            // timing of an API-server freeze): the operator sees it alive over its own
            // `Ready=Unknown`. After the other lapses it reports at once.
            let renews_first = was_down && (self.rounds / 3 + i).is_multiple_of(2);
            if self.nodes[i].agent.is_not_responding() || renews_first {
                return;
            }
        } else {
            // Seen renewing (or back after a crash that `dead_for` no longer counts).
            self.nodes[i].agent = AgentHealth::Alive;
        }
        let handed_over = self.rollout(i).is_some_and(|r| r.phase == NodePhase::Applying);
        let gn = self.nodes[i].gpunode.as_ref().unwrap();
        let (spec, generation) = (gn.spec.gpus.clone(), gn.metadata.generation);
        let mut observed = gn.status.as_ref().unwrap().observed_generation;
        let conditions = if self.held[i] == spec {
            observed = generation;
            vec![cond(READY, "True", "Applied", generation)]
        } else if !handed_over {
            vec![
                cond(READY, "False", "AwaitingDrain", generation),
                cond(RECONCILING, "True", "AwaitingDrain", generation),
            ]
        } else {
            match self.kinds[i] {
                AgentKind::Stalls => {
                    vec![
                        cond(READY, "False", "InstanceInUse", generation),
                        cond(STALLED, "True", "InstanceInUse", generation),
                    ]
                }
                AgentKind::Retries(_) if self.retries[i] > 0 => {
                    self.retries[i] -= 1;
                    vec![
                        cond(READY, "False", "ApplyFailed", generation),
                        cond(RECONCILING, "True", "Retrying", generation),
                    ]
                }
                AgentKind::DiesFor(k) if k > 0 => {
                    self.kinds[i] = AgentKind::DiesFor(0);
                    self.dead_for[i] = k;
                    self.nodes[i].agent = AgentHealth::NotResponding { since: None };
                    return;
                }
                _ => {
                    assert!(self.real_unschedulable[i], "{} changed its GPUs while schedulable", self.nodes[i].name);
                    self.held[i] = spec;
                    observed = generation;
                    vec![cond(READY, "True", "Applied", generation)]
                }
            }
        };
        let held = self.held[i].first().cloned();
        let st = std::sync::Arc::make_mut(self.nodes[i].gpunode.as_mut().unwrap()).status.as_mut().unwrap();
        st.observed_generation = observed;
        st.conditions = conditions;
        // What its GPU holds, as the agent reports it (so a report can show the intent held).
        let g = &mut st.gpus[0];
        g.mig_enabled = held.as_ref().is_some_and(|h| h.mig_enabled);
        g.instances = instances(
            held.iter().flat_map(|h| h.profiles.iter().flat_map(|(p, k)| std::iter::repeat_n(p.as_str(), *k as usize))),
        );
    }

    /// Whether node `i` has nothing to change: its GPU holds the plan's layout, its agent has seen
    /// the intent and says neither `Stalled` nor `Reconciling` for it.
    fn at_rest_with_layout(&self, i: usize) -> bool {
        let gn = self.nodes[i].gpunode.as_ref().unwrap();
        let st = gn.status.as_ref().unwrap();
        let objects =
            st.conditions.iter().any(|c| (c.type_ == STALLED || c.type_ == RECONCILING) && c.status == "True");
        self.held[i] == self.desired()
            && gn.spec.gpus == self.desired()
            && st.observed_generation == gn.metadata.generation
            && !objects
    }
}

fn agent_kind() -> impl Strategy<Value = AgentKind> {
    prop_oneof![
        4 => Just(AgentKind::Good),
        1 => Just(AgentKind::Stalls),
        1 => (1u32..4).prop_map(AgentKind::Retries),
        1 => (1u32..6).prop_map(AgentKind::DiesFor),
        1 => Just(AgentKind::Flaps),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Agents that fail, stall, die and come back: `maxUnavailable` (failed and unresponsive
    /// nodes counted) is never exceeded, no GPU changes on a schedulable node, no node an admin
    /// cordoned is uncordoned; once the agents are healthy and the plan is re-applied, the whole
    /// fleet converges and only the admin's cordons remain.
    #[test]
    fn failing_dying_and_stalling_agents_never_break_the_rollout_invariants(
        (n, kinds) in (1usize..10).prop_flat_map(|n| (Just(n), proptest::collection::vec(agent_kind(), n))),
        budget in 1usize..4,
        percent in proptest::bool::ANY,
        cordoned in proptest::collection::btree_set(0usize..10, 0..3),
        faults in proptest::option::of(any::<u64>()),
    ) {
        let (value, limit) = if percent {
            let pct = budget * 25; // 25..75 %
            (json!(format!("{pct}%")), ((n * pct) / 100).max(1))
        } else {
            (json!(budget), budget)
        };
        let mut sim = Sim::new(n, value, limit, &cordoned, kinds);
        sim.rng = faults;
        for _ in 0..(6 * n + 10) {
            sim.round();
        }
        sim.rng = None;
        // Heal every agent and, once they have reported, bump the plan (what an admin does after
        // fixing the cause). A plan bumped before a stalled agent reports again is failed anew at
        // once on its old `Stalled` (a known gap, see docs/failure-modes.md).
        sim.kinds = vec![AgentKind::Good; n];
        sim.round();
        sim.plans[0].metadata.generation = Some(2);
        let mut done = false;
        for _ in 0..(8 * n + 20) {
            let report = sim.round();
            let in_flight_now = (0..n).any(|i| sim.rollout(i).is_some_and(|r| in_flight(r.phase)));
            if report.updated as usize == n && !in_flight_now {
                done = true;
                break;
            }
        }
        prop_assert!(done, "the healed fleet did not converge");
        for i in 0..n {
            prop_assert_eq!(&sim.held[i], &sim.desired(), "node {} has the plan's layout", i);
        }
        let still: BTreeSet<String> =
            sim.nodes.iter().zip(&sim.real_unschedulable).filter(|(_, u)| **u).map(|(x, _)| x.name.to_string()).collect();
        prop_assert_eq!(still, sim.pre_cordoned.clone(), "only the nodes cordoned before us stay cordoned");
    }
}

#[test]
fn paused_plans_start_no_new_node_but_finish_in_flight_ones() {
    let mut p = plan("p", 0, json!(2), h100_layout());
    p.spec.paused = true;
    let r = json!({"phase": "Draining", "plan": "p", "cordonedByUs": true, "drainStartedAt": "2026-06-01T00:00:00Z"});
    let nodes = [
        node("n1", true, gpunode("n1", json!([]), true, Some(r))),
        node("n2", false, gpunode("n2", json!([]), true, None)),
    ];
    let (actions, reports) = plan_fleet(&[p], &nodes, now());
    assert!(actions.iter().any(|a| matches!(a, Action::Intent { node, .. } if node == "n1")));
    assert!(!actions.iter().any(|a| matches!(a, Action::Cordon { node } if node == "n2")));
    assert_eq!(reports["p"].pending, 1);
}

fn draining(started: &str) -> serde_json::Value {
    json!({"phase": "Draining", "plan": "p", "planGeneration": 1, "cordonedByUs": true, "drainStartedAt": started})
}

fn gpu_pod(name: &str, extra: serde_json::Value) -> Pod {
    let mut v = json!({"metadata": {"name": name, "namespace": "ml", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}]},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running"}});
    for (k, val) in extra.as_object().unwrap() {
        v["metadata"][k] = val.clone();
    }
    serde_json::from_value(v).unwrap()
}

#[test]
fn a_stale_cordoned_by_us_is_never_written_back_after_a_failure() {
    // Failed and still cordoned by us, and the GPUs already match (the plan was reverted).
    let r = json!({"phase": "Failed", "plan": "p", "planGeneration": 1, "cordonedByUs": true, "message": "x"});
    let nodes = [node("n1", true, gpunode("n1", wanted(), true, Some(r)))];
    let (actions, _) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &nodes, now());
    let uncordon = actions.iter().position(|a| matches!(a, Action::Uncordon { .. })).expect("uncordoned");
    for a in &actions[uncordon..] {
        if let Action::Rollout { rollout: Some(r), .. } = a {
            assert!(!r.cordoned_by_us, "cordonedByUs written back after the uncordon: {actions:?}");
        }
    }
    // The next pass, with the uncordon seen, records the node Idle.
    let cleared = json!({"phase": "Failed", "plan": "p", "planGeneration": 1, "cordonedByUs": false, "message": "x"});
    let nodes = [node("n1", false, gpunode("n1", wanted(), true, Some(cleared)))];
    let (actions, _) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &nodes, now());
    assert!(actions.iter().any(
        |a| matches!(a, Action::Rollout { rollout: Some(r), .. } if r.phase == NodePhase::Idle && !r.cordoned_by_us)
    ));
}

#[test]
fn a_failed_node_uncordoned_this_pass_is_not_restarted_on_a_stale_view() {
    // Failed for an older generation and still cordoned by us: the plan changed since.
    let r = json!({"phase": "Failed", "plan": "p", "planGeneration": 0, "cordonedByUs": true, "message": "x"});
    let nodes = [node("n1", true, gpunode("n1", json!([]), true, Some(r)))];
    let (actions, _) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &nodes, now());
    assert!(actions.contains(&Action::Uncordon { node: "n1".into() }));
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::Rollout { rollout: Some(r), .. } if r.phase == NodePhase::Draining)),
        "restarting now would record cordonedByUs=false for a node about to be schedulable: {actions:?}"
    );
}

#[test]
fn a_drained_node_that_is_schedulable_again_is_cordoned_not_handed_over() {
    let nodes = [node("n1", false, gpunode("n1", json!([]), true, Some(draining("2026-06-01T00:00:00Z"))))];
    let (actions, _) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &nodes, now());
    assert!(!actions.iter().any(|a| matches!(a, Action::Intent { .. })), "{actions:?}");
    assert!(actions.contains(&Action::Cordon { node: "n1".into() }));
}

#[test]
fn in_flight_nodes_the_plan_no_longer_fits_still_hold_their_slot() {
    // n1 is mid-change but reports no GPUs any more (agent re-registering): still cordoned.
    let mut gn1 = gpunode("n1", wanted(), false, Some(draining("2026-06-01T00:00:00Z")));
    gn1.status.as_mut().unwrap().gpus.clear();
    let nodes = [node("n1", true, gn1), node("n2", false, gpunode("n2", json!([]), true, None))];
    let (actions, _) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &nodes, now());
    assert!(!actions.iter().any(|a| matches!(a, Action::Cordon { node } if node == "n2")), "{actions:?}");
}

#[test]
fn releasing_a_node_mid_apply_withdraws_the_hand_over_before_the_uncordon() {
    let r = json!({"phase": "Applying", "plan": "gone", "planGeneration": 1, "cordonedByUs": true});
    let mut n = node("n1", true, gpunode("n1", wanted(), false, Some(r)));
    n.agent = AgentHealth::NotResponding { since: None };
    let (actions, _) = plan_fleet(&[], &[n], now());
    let withdrawn = actions
        .iter()
        .position(|a| matches!(a, Action::Rollout { rollout: Some(r), .. } if r.phase != NodePhase::Applying))
        .expect("hand-over withdrawn");
    let uncordon = actions.iter().position(|a| matches!(a, Action::Uncordon { .. })).unwrap();
    assert!(withdrawn < uncordon, "{actions:?}");
}

#[test]
fn failed_nodes_hold_rollout_slots_and_the_rollout_halts_saying_why() {
    let failed = json!({"phase": "Failed", "plan": "p", "planGeneration": 1, "message": "InstanceInUse: pid 7"});
    let nodes = [
        node("n1", false, gpunode("n1", wanted(), false, Some(failed))),
        node("n2", false, gpunode("n2", json!([]), true, None)),
    ];
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &nodes, now());
    assert!(!actions.iter().any(|a| matches!(a, Action::Cordon { .. })), "{actions:?}");
    assert_eq!((reports["p"].pending, reports["p"].unavailable, reports["p"].budget), (1, 1, 1));
    let st = crate::status::plan_status(&[], &reports["p"], Some(1), false, Time(now()));
    let stalled = st.conditions.iter().find(|c| c.type_ == STALLED).unwrap();
    assert_eq!(stalled.reason, "NodeFailed");
    assert!(stalled.message.starts_with("rollout halted: 1 node(s) failed"), "{}", stalled.message);
    assert!(stalled.message.contains("n1: InstanceInUse: pid 7"), "{}", stalled.message);
}

#[test]
fn a_failure_withdraws_the_hand_over_before_the_uncordon() {
    let r = json!({"phase": "Applying", "plan": "p", "planGeneration": 1, "cordonedByUs": true});
    let mut gn = gpunode("n1", wanted(), false, Some(r));
    gn.status.as_mut().unwrap().conditions = vec![cond(STALLED, "True", "InstanceInUse", Some(2))];
    let (actions, _) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[node("n1", true, gn)], now());
    let failed = actions
        .iter()
        .position(|a| matches!(a, Action::Rollout { rollout: Some(r), .. } if r.phase == NodePhase::Failed))
        .unwrap();
    let uncordon = actions.iter().position(|a| matches!(a, Action::Uncordon { .. })).unwrap();
    assert!(failed < uncordon, "{actions:?}");
}

#[test]
fn a_dead_agent_keeps_its_node_cordoned_and_stalls_the_plan_and_blocks_new_starts() {
    let r = json!({"phase": "Applying", "plan": "p", "planGeneration": 1, "cordonedByUs": true,
                   "applyStartedAt": "2026-05-31T23:59:00Z"});
    let mut gn = gpunode("n1", wanted(), false, Some(r));
    // The bug: Ready=True left over from a generation before the one handed over.
    gn.status.as_mut().unwrap().conditions = vec![cond(READY, "True", "Applied", Some(1))];
    let mut dead = node("n1", true, gn);
    let since: Timestamp = "2026-05-31T23:58:00Z".parse().unwrap();
    dead.agent = AgentHealth::NotResponding { since: Some(since) };
    let mut idle_dead = node("n2", false, gpunode("n2", json!([]), true, None));
    idle_dead.agent = AgentHealth::NotResponding { since: None };
    let healthy = node("n3", false, gpunode("n3", json!([]), true, None));
    // Budget 2: the node mid-change and the not-started node with a dead agent use it all.
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(2), h100_layout())], &[dead, idle_dead, healthy], now());
    // n3 waits, without a write (the plan counts it pending).
    assert!(!actions.iter().any(|a| crate::rollout::node_of(a) == "n3"), "n3 waits: {actions:?}");
    assert_eq!(reports["p"].pending, 1, "{:?}", reports["p"]);
    assert!(!actions.iter().any(|a| matches!(a, Action::Uncordon { .. } | Action::Cordon { .. })), "{actions:?}");
    // Ready=Unknown for both GpuNodes, so nobody reads a stale Ready=True.
    assert_eq!(actions.iter().filter(|a| matches!(a, Action::AgentDown { .. })).count(), 2, "{actions:?}");
    let st = crate::status::plan_status(&[], &reports["p"], Some(1), false, Time(now()));
    let stalled = st.conditions.iter().find(|c| c.type_ == STALLED).unwrap();
    assert_eq!(stalled.reason, "AgentNotResponding");
    assert!(
        stalled.message.contains("n1: node agent not responding: its lease was last renewed at 2026-05-31T23:58:00Z")
    );
    assert!(stalled.message.contains("n2: node agent not responding") && stalled.message.contains("(not started)"));
}

#[test]
fn an_agent_that_keeps_retrying_past_the_apply_timeout_stalls_the_plan_naming_it() {
    let r = json!({"phase": "Applying", "plan": "p", "planGeneration": 1, "cordonedByUs": true,
                   "applyStartedAt": "2026-05-31T23:40:00Z"});
    let mut gn = gpunode("n1", wanted(), false, Some(r));
    gn.status.as_mut().unwrap().conditions = vec![cond(RECONCILING, "True", "Retrying", Some(2))];
    let (actions, reports) =
        plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[node("n1", true, gn.clone())], now());
    assert!(!actions.iter().any(|a| matches!(a, Action::Uncordon { .. })), "stays cordoned: {actions:?}");
    let st = crate::status::plan_status(&[], &reports["p"], Some(1), false, Time(now()));
    let stalled = st.conditions.iter().find(|c| c.type_ == STALLED).unwrap();
    assert_eq!(stalled.reason, "ApplyTimeout");
    assert!(stalled.message.contains("n1: applying since 2026-05-31T23:40:00Z, over 600s; the agent says Retrying"));
    // Before the timeout the plan says why it waits, without stalling.
    let mut early = gn;
    early.status.as_mut().unwrap().rollout.as_mut().unwrap().apply_started_at = Some(Time(now()));
    let (_, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[node("n1", true, early)], now());
    let st = crate::status::plan_status(&[], &reports["p"], Some(1), false, Time(now()));
    assert!(st.conditions.iter().all(|c| c.type_ != STALLED));
    let reconciling = st.conditions.iter().find(|c| c.type_ == RECONCILING).unwrap();
    assert!(reconciling.message.contains("n1: Retrying"), "{}", reconciling.message);
}

#[test]
fn forcing_after_the_timeout_also_deletes_pods_stuck_terminating() {
    let mut p = plan("p", 0, json!(1), h100_layout());
    p.spec.rollout.force_after_timeout = true;
    let mut n = node("n1", true, gpunode("n1", json!([]), true, Some(draining("2026-05-31T00:00:00Z"))));
    n.pods =
        Ok(vec![gpu_pod("running", json!({})), gpu_pod("stuck", json!({"deletionTimestamp": "2026-05-31T00:00:00Z"}))]);
    let (actions, _) = plan_fleet(&[p], &[n], now());
    let forced: BTreeSet<&str> = actions
        .iter()
        .filter_map(|a| match a {
            Action::ForceDelete { pod, .. } => Some(pod.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(forced, ["running", "stuck"].into());
}

#[test]
fn a_node_whose_pods_cannot_be_listed_is_never_judged_drained() {
    let mut n = node("n1", true, gpunode("n1", json!([]), true, Some(draining("2026-06-01T00:00:00Z"))));
    n.pods = Err("the server is currently unable to handle the request".into());
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[n], now());
    assert!(!actions.iter().any(|a| matches!(a, Action::Intent { .. })), "{actions:?}");
    assert!(reports["p"].drain_blocked[0].contains("could not list its pods"));
}

#[test]
fn unmanaged_pods_block_the_drain_unless_the_plan_opts_in() {
    let bare = || gpu_pod("notebook", json!({"ownerReferences": null}));
    let mut n = node("n1", true, gpunode("n1", json!([]), true, Some(draining("2026-05-31T00:00:00Z"))));
    n.pods = Ok(vec![bare(), gpu_pod("managed", json!({}))]);
    let mut p = plan("p", 0, json!(1), h100_layout());
    p.spec.rollout.force_after_timeout = true; // force overrides PDBs, not this opt-in
    let (actions, reports) = plan_fleet(&[p.clone()], &[n.clone()], now());
    assert!(
        !actions.iter().any(|a| matches!(a, Action::Evict { .. } | Action::ForceDelete { .. } | Action::Intent { .. }))
    );
    assert!(reports["p"].drain_blocked.iter().any(|m| m.contains("pod ml/notebook has no controller")));
    assert!(reports["p"].drain_timeouts[0].contains("evictUnmanagedPods"), "{:?}", reports["p"].drain_timeouts);
    p.spec.rollout.evict_unmanaged_pods = true;
    p.spec.rollout.force_after_timeout = false;
    let (actions, _) = plan_fleet(&[p], &[n], now());
    assert!(actions.iter().any(|a| matches!(a, Action::Evict { pod, .. } if pod == "notebook")));
}

#[test]
fn a_plan_that_can_never_be_valid_acts_on_no_node_and_is_not_ready() {
    let cases = [
        (
            json!([{"gpuProduct": "Z100-80GB", "profiles": {"1g.10gb": 1}}]),
            "spec.layouts[0].gpuProduct: unknown GPU product",
        ),
        (json!([{"gpuProduct": "H100-80GB", "profiles": {"1g.5gb": 1}}]), "spec.layouts[0].profiles"),
        (
            json!([{"gpuProduct": "H100-80GB", "migEnabled": false, "profiles": {"1g.10gb": 1}}]),
            "must be empty when migEnabled is false",
        ),
        (
            json!([{"gpuProduct": "H100-80GB", "gpuIndices": [0, 0], "profiles": {"1g.10gb": 1}}]),
            "is already listed by this layout",
        ),
    ];
    for (layouts, want) in cases {
        for matched in [true, false] {
            let mut p = plan("p", 0, json!(1), layouts.clone());
            if !matched {
                p.spec.node_selector = serde_json::from_value(json!({"matchLabels": {"pool": "none"}})).unwrap();
            }
            let nodes = [node("n1", false, gpunode("n1", json!([]), true, None))];
            let (actions, reports) = plan_fleet(&[p], &nodes, now());
            assert!(actions.is_empty(), "{actions:?}");
            let st = crate::status::plan_status(&[], &reports["p"], Some(1), false, Time(now()));
            let ready = st.conditions.iter().find(|c| c.type_ == READY).unwrap();
            assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "InvalidSpec"), "{want}");
            assert!(ready.message.contains(want), "{want}: {}", ready.message);
        }
    }
}

#[test]
fn a_board_outside_the_catalog_is_valid_where_its_agent_reports_the_table() {
    let layouts = json!([{"gpuProduct": "NVIDIA Z100", "profiles": {"2g.20gb": 2}}]);
    let mut gn = gpunode("n1", json!([]), true, None);
    let gpu = &mut gn.status.as_mut().unwrap().gpus[0];
    gpu.product = "NVIDIA Z100".into();
    gpu.profiles = serde_json::from_value(json!([
        {"name": "2g.20gb", "id": 14, "computeSlices": 2, "memorySlices": 2, "maxCount": 3, "starts": [0, 2, 4]},
        {"name": "7g.80gb", "id": 0, "computeSlices": 7, "memorySlices": 8, "maxCount": 1, "starts": [0]}]))
    .unwrap();
    let (actions, reports) =
        plan_fleet(&[plan("p", 0, json!(1), layouts.clone())], &[node("n1", false, gn.clone())], now());
    assert!(reports["p"].invalid_spec.is_empty(), "{:?}", reports["p"].invalid_spec);
    assert!(actions.iter().any(|a| matches!(a, Action::Cordon { .. })));
    // The agent's table also bounds the layout: 4 x 2g.20gb cannot fit.
    let too_many = json!([{"gpuProduct": "NVIDIA Z100", "profiles": {"2g.20gb": 4}}]);
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), too_many)], &[node("n1", false, gn)], now());
    assert!(actions.is_empty() && reports["p"].invalid_spec[0].contains("spec.layouts[0].profiles"), "{reports:?}");
}

#[test]
fn our_cordon_is_undone_even_when_its_gpunode_record_is_lost() {
    // The GpuNode was deleted mid-rollout and re-registered by the agent: no rollout record.
    let mut n = node("n1", true, gpunode("n1", json!([]), true, None));
    // Within a minute it may be the Node cache running ahead of the GpuNode's: wait.
    n.cordon_annotated = Some("2026-05-31T23:59:30Z".parse().unwrap());
    let (actions, _) = plan_fleet(&[], &[n.clone()], now());
    assert!(actions.is_empty(), "{actions:?}");
    n.cordon_annotated = Some("2026-05-31T23:50:00Z".parse().unwrap());
    let (actions, _) = plan_fleet(&[], &[n.clone()], now());
    assert_eq!(actions, vec![Action::Uncordon { node: "n1".into() }]);
    // An admin's cordon (no annotation) is left alone.
    n.cordon_annotated = None;
    let (actions, _) = plan_fleet(&[], &[n], now());
    assert!(actions.is_empty(), "{actions:?}");
}

fn auto_plan(decision: Option<serde_json::Value>) -> GpuPartitionPlan {
    let mut v = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan",
        "metadata": {"name": "auto", "generation": 1},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "a"}}, "layoutsFrom": {},
                 "rollout": {"maxUnavailable": 1}}});
    if let Some(d) = decision {
        v["status"] = json!({"layoutDecision": d});
    }
    serde_json::from_value(v).unwrap()
}

#[test]
fn an_automatic_plan_rolls_out_only_its_targets_and_leaves_the_rest_alone() {
    let decision = json!({"planGeneration": 1, "targets": [{"node": "t", "gpus": wanted()}],
                          "message": "repartitioning 1 idle GPU(s)"});
    let nodes = [
        node("t", false, gpunode("t", json!([]), true, None)),
        node("other", false, gpunode("other", json!([]), true, None)),
    ];
    let (actions, reports) = plan_fleet(&[auto_plan(Some(decision))], &nodes, now());
    assert!(actions.iter().all(|a| crate::rollout::node_of(a) == "t"), "only the target acts: {actions:?}");
    assert!(matches!(&actions[..2], [Action::Rollout { rollout: Some(r), .. }, Action::Cordon { .. }]
        if r.phase == NodePhase::Draining));
    let r = &reports["auto"];
    assert_eq!((r.matched, r.updated, r.budget), (2, 1, 1));
    assert_eq!(r.demand.as_ref().map(|(met, reason, _)| (*met, *reason)), Some((true, "DemandMet")));
    let st = crate::status::plan_status(&[], r, Some(1), false, Time(now()));
    let ready = st.conditions.iter().find(|c| c.type_ == READY).unwrap();
    assert_eq!(ready.status, "False", "a target is still to change");
}

#[test]
fn an_automatic_plan_without_a_decision_acts_on_no_node_and_is_not_ready() {
    let nodes = [node("n1", false, gpunode("n1", json!([]), true, None))];
    let (actions, reports) = plan_fleet(&[auto_plan(None)], &nodes, now());
    assert!(actions.is_empty(), "{actions:?}");
    let st = crate::status::plan_status(&[], &reports["auto"], Some(1), false, Time(now()));
    let get = |t: &str| st.conditions.iter().find(|c| c.type_ == t).map(|c| (c.status.clone(), c.reason.clone()));
    assert_eq!(get(READY), Some(("False".into(), "RollingOut".into())));
    assert_eq!(get(tessera_crds::conditions::DEMAND_MET), Some(("False".into(), "Deciding".into())));
    assert!(st.conditions.iter().any(|c| c.type_ == RECONCILING && c.message.contains("working out the layouts")));
}

#[test]
fn an_automatic_plan_whose_target_is_applied_is_ready_and_says_what_it_decided() {
    let decision = json!({"planGeneration": 1, "targets": [{"node": "t", "gpus": wanted()}],
                          "shortfall": {"nvidia.com/mig-1g.10gb": 2}, "message": "still short"});
    let nodes = [node("t", false, gpunode("t", wanted(), true, None))];
    let (_, reports) = plan_fleet(&[auto_plan(Some(decision))], &nodes, now());
    let st = crate::status::plan_status(&[], &reports["auto"], Some(1), false, Time(now()));
    let get = |t: &str| st.conditions.iter().find(|c| c.type_ == t).map(|c| (c.status.clone(), c.reason.clone()));
    assert_eq!(get(READY), Some(("True".into(), "Applied".into())));
    assert_eq!(get(tessera_crds::conditions::DEMAND_MET), Some(("False".into(), "DemandNotMet".into())));
}

#[test]
fn a_node_we_cordoned_that_a_new_decision_drops_mid_drain_is_uncordoned_and_released() {
    // Switched from fixed layouts mid-drain, or a decision replaced before the node was handed
    // over: the intent was never written (empty spec), the node is cordoned by us.
    let draining = json!({"phase": "Draining", "plan": "auto", "cordonedByUs": true,
                          "drainStartedAt": "2026-06-01T00:00:00Z"});
    let decision = json!({"planGeneration": 1, "targets": []});
    let nodes = [node("n1", true, gpunode("n1", json!([]), true, Some(draining)))];
    let (actions, reports) = plan_fleet(&[auto_plan(Some(decision))], &nodes, now());
    assert!(actions.contains(&Action::Uncordon { node: "n1".into() }), "{actions:?}");
    assert!(actions.contains(&Action::Rollout { node: "n1".into(), rollout: None }), "{actions:?}");
    assert!(!actions.iter().any(|a| matches!(a, Action::Intent { .. })), "{actions:?}");
    assert_eq!(reports["auto"].matched, 1);
}

#[test]
fn a_node_an_automatic_plan_leaves_alone_with_our_cordon_still_recorded_is_uncordoned_and_released() {
    // A withdrawn drain cut after its `Idle` record (still naming our cordon), then a decision
    // that no longer targets the node: it is released, not left cordoned.
    let idle_ours = json!({"phase": "Idle", "plan": "auto", "planGeneration": 1, "cordonedByUs": true});
    let decision = json!({"planGeneration": 1, "targets": []});
    for unschedulable in [true, false] {
        let nodes = [node("n1", unschedulable, gpunode("n1", json!([]), true, Some(idle_ours.clone())))];
        let (actions, _) = plan_fleet(&[auto_plan(Some(decision.clone()))], &nodes, now());
        assert_eq!(actions.contains(&Action::Uncordon { node: "n1".into() }), unschedulable, "{actions:?}");
        assert!(actions.contains(&Action::Rollout { node: "n1".into(), rollout: None }), "{actions:?}");
    }
}

#[test]
fn an_old_decision_is_not_rolled_out_after_the_plan_changed() {
    let decision = json!({"planGeneration": 0, "targets": [{"node": "t", "gpus": wanted()}]});
    let nodes = [node("t", false, gpunode("t", json!([]), true, None))];
    let (actions, _) = plan_fleet(&[auto_plan(Some(decision))], &nodes, now());
    assert!(!actions.iter().any(|a| matches!(a, Action::Cordon { .. })), "{actions:?}");
}

#[test]
fn a_waiting_node_at_rest_gets_no_write_but_an_old_failed_record_is_replaced() {
    // Budget 1, taken by n1 (mid-drain). n2 at rest and n3 Failed for an older generation wait.
    let n1 = node("n1", true, gpunode("n1", json!([]), false, Some(draining("2026-06-01T00:00:00Z"))));
    let idle = json!({"phase": "Idle", "plan": "p", "planGeneration": 0});
    let n2 = node("n2", false, gpunode("n2", json!([]), true, Some(idle)));
    let old_failure = json!({"phase": "Failed", "plan": "p", "planGeneration": 0, "message": "driver error"});
    let n3 = node("n3", false, gpunode("n3", json!([]), true, Some(old_failure)));
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[n1, n2, n3], now());
    assert!(!actions.iter().any(|a| crate::rollout::node_of(a) == "n2"), "{actions:?}");
    let n3_records: Vec<_> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Rollout { node, rollout: Some(r) } if node == "n3" => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(n3_records.len(), 1, "{actions:?}");
    assert_eq!(n3_records[0].phase, NodePhase::Pending);
    assert!(n3_records[0].message.is_empty() && n3_records[0].plan_generation == Some(1), "{:?}", n3_records[0]);
    assert_eq!(reports["p"].pending, 2, "{:?}", reports["p"]);
    assert!(reports["p"].failed.is_empty(), "an earlier generation's failure is not this one's");
}

#[test]
fn a_node_whose_cache_lags_our_write_is_left_alone_and_holds_a_slot() {
    // n1 was just started (Draining written, cordoned) but the GpuNode cache still shows it at
    // rest while the Node cache shows the cordon: the stale view would start it again with
    // cordonedByUs=false, and start n2 beyond the budget of 1.
    let mut n1 = node("n1", true, gpunode("n1", json!([]), true, None));
    n1.cache_behind = true;
    n1.cordon_annotated = Some("2026-05-31T23:00:00Z".parse().unwrap());
    let n2 = node("n2", false, gpunode("n2", json!([]), true, None));
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[n1.clone(), n2.clone()], now());
    assert!(actions.is_empty(), "nothing on n1 (not even the old-cordon clean-up), nothing started: {actions:?}");
    let r = &reports["p"];
    assert_eq!((r.matched, r.in_progress, r.pending, r.unavailable, r.budget), (2, 1, 1, 1, 1), "{r:?}");
    assert!(r.failed.is_empty() && r.drain_blocked.is_empty());
    // Once the caches show the write (here: n1 Draining as ours), n1 goes on and n2 still waits.
    n1.cache_behind = false;
    n1.gpunode = Some(std::sync::Arc::new(gpunode("n1", json!([]), true, Some(draining("2026-06-01T00:00:00Z")))));
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[n1, n2], now());
    assert!(actions.iter().any(|a| matches!(a, Action::Intent { node, .. } if node == "n1")), "{actions:?}");
    assert!(!actions.iter().any(|a| crate::rollout::node_of(a) == "n2"), "{actions:?}");
    assert_eq!(reports["p"].pending, 1);
}

#[test]
fn a_lagging_cache_does_not_flip_a_node_with_its_layout_out_of_updated() {
    // The last node of a rollout was uncordoned and recorded Idle; the cache still shows it
    // Uncordoning with the layout applied. It is reported updated (the plan stays Ready), not
    // in progress, and still holds its slot until the cache catches up.
    let r = json!({"phase": "Uncordoning", "plan": "p", "planGeneration": 1, "cordonedByUs": true});
    let mut n1 = node("n1", true, gpunode("n1", wanted(), true, Some(r)));
    n1.cache_behind = true;
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[n1], now());
    assert!(actions.is_empty(), "{actions:?}");
    let r = &reports["p"];
    assert_eq!((r.matched, r.updated, r.in_progress, r.unavailable), (1, 1, 0, 1), "{r:?}");
}

#[test]
fn a_failure_is_still_reported_while_the_cache_lags_the_writes_that_followed_it() {
    // The agent stalled; the last pass wrote Failed and uncordoned, but the cache still shows
    // Applying with the agent's Stalled condition: the plan stays Stalled (no flapping), and
    // nothing is written again.
    let r = json!({"phase": "Applying", "plan": "p", "planGeneration": 1, "cordonedByUs": true,
                   "applyStartedAt": "2026-06-01T00:00:00Z"});
    let mut gn = gpunode("n1", wanted(), false, Some(r));
    gn.status.as_mut().unwrap().conditions.push(cond(STALLED, "True", "InstanceInUse", Some(2)));
    gn.metadata.generation = Some(2);
    let mut n1 = node("n1", true, gn);
    n1.cache_behind = true;
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[n1.clone()], now());
    assert!(actions.is_empty(), "{actions:?}");
    assert_eq!(reports["p"].failed.len(), 1, "{:?}", reports["p"]);
    n1.cache_behind = false;
    let (actions, _) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[n1], now());
    assert!(actions.contains(&Action::Uncordon { node: "n1".into() }), "the same view acts once caught up");
}

#[test]
fn another_plans_failure_of_the_same_generation_is_not_this_plans() {
    // Plan "old" (generation 1) failed n1; plan "p" (also generation 1) now owns it.
    let failed = json!({"phase": "Failed", "plan": "old", "planGeneration": 1, "message": "driver error"});
    let n1 = node("n1", false, gpunode("n1", json!([]), true, Some(failed)));
    let (actions, reports) = plan_fleet(&[plan("p", 0, json!(1), h100_layout())], &[n1], now());
    assert!(reports["p"].failed.is_empty(), "{:?}", reports["p"]);
    assert!(
        actions.iter().any(|a| matches!(a, Action::Rollout { rollout: Some(r), .. }
            if r.phase == NodePhase::Draining && r.plan.as_deref() == Some("p"))),
        "the node is started by its new plan: {actions:?}"
    );
}

#[test]
fn a_node_no_plan_owns_is_not_released_while_its_cache_lags() {
    let r = json!({"phase": "Uncordoning", "plan": "gone", "planGeneration": 1, "cordonedByUs": true});
    let mut n1 = node("n1", true, gpunode("n1", wanted(), true, Some(r)));
    n1.cache_behind = true;
    let (actions, _) = plan_fleet(&[], &[n1.clone()], now());
    assert!(actions.is_empty(), "{actions:?}");
    n1.cache_behind = false;
    let (actions, _) = plan_fleet(&[], &[n1], now());
    assert!(actions.contains(&Action::Uncordon { node: "n1".into() }), "{actions:?}");
}

#[test]
fn nodes_of_one_shape_share_one_intent_and_nothing_else_does() {
    let gpu = |index: i32, product: &str, mig_capable: bool, uuid: &str| -> GpuState {
        serde_json::from_value(json!({"index": index, "uuid": uuid, "product": product, "migCapable": mig_capable}))
            .unwrap()
    };
    let spec = |profiles: serde_json::Value| -> GpuPartitionPlanSpec {
        serde_json::from_value(json!({"nodeSelector": {}, "layouts": [
            {"gpuProduct": "H100-80GB", "profiles": profiles},
            {"gpuProduct": "A100-SXM4-40GB", "gpuIndices": [1], "profiles": {"7g.40gb": 1}},
            {"gpuProduct": "Some Future GPU", "migEnabled": false}]}))
        .unwrap()
    };
    let (three, seven) = (spec(json!({"3g.40gb": 2})), spec(json!({"7g.80gb": 1})));
    let h100 = "NVIDIA H100 80GB HBM3";
    let a = vec![gpu(0, h100, true, "GPU-a0")];
    let b = vec![gpu(0, h100, true, "GPU-b0")];
    let other_index = vec![gpu(1, h100, true, "GPU-c1")];
    let not_capable = vec![gpu(0, h100, false, "GPU-d0")];
    let unknown = vec![gpu(0, "Some Future GPU", true, "GPU-e0")];
    let mut memo = Memo::default();
    let first = memo.desired(&three, &a).unwrap();
    let second = memo.desired(&three, &b).unwrap();
    assert!(Rc::ptr_eq(&first, &second), "same shape (only the UUID differs): one intent, shared");
    for (s, gpus) in [(&three, &a), (&seven, &a), (&three, &other_index), (&three, &not_capable), (&three, &unknown)] {
        assert_eq!(memo.desired(s, gpus).map(|d| d.to_vec()), desired_intent(s, gpus), "{gpus:?}");
    }
    assert!(!Rc::ptr_eq(&first, &memo.desired(&seven, &a).unwrap()), "another plan's layouts: its own intent");
    assert!(memo.desired(&three, &not_capable).is_err(), "not MIG capable is this shape's answer only");
    // A board outside the catalog is read from its own profile table, which may differ between
    // nodes with the same product name: never shared.
    let future = memo.desired(&three, &unknown).unwrap();
    let other_future = memo.desired(&three, &[gpu(0, "Some Future GPU", true, "GPU-f0")]).unwrap();
    assert!(!Rc::ptr_eq(&future, &other_future), "outside the catalog: worked out per node");
}
