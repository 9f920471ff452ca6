use serde_json::{Value, json};

use super::*;
use k8s_openapi::api::resource::v1::ResourceClaim;

fn plan(pool: &str, layouts: Value, rollout: Value) -> GpuPartitionPlan {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan",
        "metadata": {"name": "p"}, "spec": {"nodeSelector": {"matchLabels": {"pool": pool}},
        "layouts": layouts, "rollout": rollout}}))
    .unwrap()
}

fn node(name: &str, pool: &str) -> Node {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": {"pool": pool}}})).unwrap()
}

/// A GpuNode with one H100, MIG off (`instances` empty) or with these MIG instances applied.
fn gpunode(name: &str, instances: &[&str]) -> GpuNode {
    let instances: Vec<Value> =
        instances.iter().enumerate().map(|(i, p)| json!({"profile": p, "start": i * 4, "size": 4})).collect();
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "metadata": {"name": name},
        "spec": {}, "status": {"gpus": [{"index": 0, "uuid": format!("u-{name}"), "product": "NVIDIA H100 80GB HBM3",
        "migCapable": true, "migEnabled": !instances.is_empty(), "instances": instances}]}}))
    .unwrap()
}

/// A running GPU pod in `ml` on `node`, owned by a ReplicaSet, labelled `app: <app>`.
fn pod(name: &str, node: &str, app: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "ml", "labels": {"app": app}, "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}]},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running"}})
}

fn pods(v: Vec<Value>) -> Vec<Pod> {
    v.into_iter().map(|p| serde_json::from_value(p).unwrap()).collect()
}

/// A budget in `ml` selecting `app: <app>`, with the status the disruption controller wrote.
fn budget(name: &str, app: &str, allowed: i32) -> PodDisruptionBudget {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ml"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
        "status": {"disruptionsAllowed": allowed, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}}))
    .unwrap()
}

fn quota(name: &str, hard: Value) -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": name}, "spec": {"namespaces": [name], "hard": hard}}))
    .unwrap()
}

fn run(
    plan: &GpuPartitionPlan,
    nodes: &[(Node, Option<GpuNode>)],
    pods: &[Pod],
    budgets: &[PodDisruptionBudget],
    daemonsets: Option<&BTreeSet<(String, String)>>,
    quotas: &[TenantGpuQuota],
) -> Preview {
    run_with_claims(plan, nodes, pods, budgets, daemonsets, quotas, &ClaimIndex::empty())
}

fn run_with_claims(
    plan: &GpuPartitionPlan,
    nodes: &[(Node, Option<GpuNode>)],
    pods: &[Pod],
    budgets: &[PodDisruptionBudget],
    daemonsets: Option<&BTreeSet<(String, String)>>,
    quotas: &[TenantGpuQuota],
    claims: &ClaimIndex,
) -> Preview {
    let capacity = Capacity::of(nodes.iter().filter_map(|(_, g)| g.as_ref()));
    let plans = [plan.clone()];
    let fleet = Fleet { plans: &plans, nodes, pods, budgets, daemonsets, quotas, capacity: &capacity, claims };
    preview(plan, &fleet)
}

/// A ResourceClaim in `ml` allocated `device` of `driver` on pool `n1`.
fn claim(name: &str, driver: &str, device: &str) -> ResourceClaim {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ml"}, "spec": {},
        "status": {"allocation": {"devices": {"results": [
            {"request": "r", "driver": driver, "pool": "n1", "device": device}]}}}}))
    .unwrap()
}

/// A pod holding a GPU through a ResourceClaim (no extended resource) is a GPU pod: the
/// preview lists it among the evicted, or as a blocker when the drain refuses it.
#[test]
fn a_preview_lists_pods_holding_gpus_through_claims_on_a_changing_node() {
    let plan = plan("a", json!([{"gpuProduct": "H100-80GB", "profiles": {"3g.40gb": 2}}]), json!({}));
    let nodes = [(node("n1", "a"), Some(gpunode("n1", &[])))];
    let with_claim = |name: &str, claim: &str| {
        let mut p = pod(name, "n1", name);
        p["spec"]["containers"][0]["resources"] = json!({});
        p["spec"]["resourceClaims"] = json!([{"name": "gpu", "resourceClaimName": claim}]);
        p
    };
    let mut bare = with_claim("bare", "c-bare");
    bare["metadata"].as_object_mut().unwrap().remove("ownerReferences");
    let pods = pods(vec![with_claim("dra", "c-gpu"), bare, with_claim("nic", "c-nic"), with_claim("pending", "c-new")]);
    let claims = [
        claim("c-gpu", "gpu.nvidia.com", "gpu-0"),
        claim("c-bare", "gpu.nvidia.com", "gpu-0-mig-9-0-4"),
        claim("c-nic", "nic.example.com", "eth-0"),
    ];
    let index = ClaimIndex::new(&claims, &tessera_planner::dra::GpuDrivers::default());
    let p = run_with_claims(&plan, &nodes, &pods, &[], None, &[], &index);
    assert_eq!(p.changes.len(), 1);
    // `pending` names a claim not read: a GPU of unknown device, evicted rather than run over.
    assert_eq!(p.changes[0].evict, vec!["ml/dra", "ml/pending"]);
    assert_eq!(p.changes[0].refused.len(), 1, "{:?}", p.changes[0].refused);
    assert!(p.changes[0].refused[0].contains("pod ml/bare has no controller"), "{:?}", p.changes[0].refused);
}

#[test]
fn preview_lists_changes_evictions_and_capacity() {
    let plan = plan("a", json!([{"gpuProduct": "H100-80GB", "profiles": {"3g.40gb": 2}}]), json!({}));
    let nodes = [(node("n1", "a"), Some(gpunode("n1", &[]))), (node("n2", "b"), None)];
    let mut web = pod("web", "n1", "web");
    web["spec"]["containers"][0]["resources"] = json!({});
    let mut notebook = pod("notebook", "n1", "nb");
    notebook["metadata"].as_object_mut().unwrap().remove("ownerReferences");
    let pods = pods(vec![pod("train", "n1", "train"), web, pod("far", "n2", "train"), notebook]);
    let p = run(&plan, &nodes, &pods, &[], None, &[]);
    assert_eq!(p.changes.len(), 1);
    assert_eq!(p.changes[0].evict, vec!["ml/train"]);
    assert_eq!(p.changes[0].refused.len(), 1);
    assert!(p.changes[0].refused[0].contains("pod ml/notebook has no controller"), "{:?}", p.changes[0].refused);
    assert_eq!(p.capacity_before, [("nvidia.com/gpu".to_string(), 1)].into());
    assert_eq!(p.capacity_after, [("nvidia.com/mig-3g.40gb".to_string(), 2)].into());
    assert!(p.quotas_short.is_empty() && p.changes[0].budget_blocked.is_empty());
}

/// The preview counts what blocks the drain (a budget that allows no disruption, a pod with no
/// controller, a pod of a deleted DaemonSet) among its drain blockers, and names the quotas the
/// new layout leaves short.
#[test]
fn a_preview_names_the_budgets_and_pods_that_block_the_drain_and_the_quotas_left_short() {
    // n1's GPU goes from two 3g.40gb slices to a whole GPU; team-a's quota needs one slice.
    let plan = plan("a", json!([{"gpuProduct": "H100-80GB", "migEnabled": false}]), json!({}));
    let nodes =
        [(node("n1", "a"), Some(gpunode("n1", &["3g.40gb", "3g.40gb"]))), (node("n2", "b"), Some(gpunode("n2", &[])))];
    let mut notebook = pod("notebook", "n1", "nb");
    notebook["metadata"].as_object_mut().unwrap().remove("ownerReferences");
    let mut agent = pod("agent-x", "n1", "agent");
    agent["metadata"]["ownerReferences"][0]["kind"] = json!("DaemonSet");
    agent["metadata"]["ownerReferences"][0]["name"] = json!("gone");
    let pods = pods(vec![pod("serve-0", "n1", "serve"), notebook, agent]);
    let budgets = [budget("serve", "serve", 0)];
    let quotas = [quota("team-a", json!({"nvidia.com/mig-3g.40gb": 1})), quota("team-b", json!({"nvidia.com/gpu": 1}))];
    let no_daemonsets = BTreeSet::new();
    let p = run(&plan, &nodes, &pods, &budgets, Some(&no_daemonsets), &quotas);

    let c = &p.changes[0];
    assert_eq!(c.evict, vec!["ml/serve-0"]);
    assert_eq!(c.budget_blocked.len(), 1, "{:?}", c.budget_blocked);
    let b = &c.budget_blocked[0];
    assert_eq!((b.pod.as_str(), b.budget.as_str()), ("ml/serve-0", "ml/serve"));
    assert!(b.why.contains("allows 0 disruptions now (1 healthy, 1 needed)"), "{}", b.why);
    assert_eq!(c.refused.len(), 2, "{:?}", c.refused);
    assert!(c.refused[0].contains("pod ml/notebook has no controller"), "{:?}", c.refused);
    assert!(c.refused[1].contains("DaemonSet gone, which no longer exists"), "{:?}", c.refused);
    assert_eq!(c.blockers().len(), 3);

    let short = ResourceShort {
        resource: "nvidia.com/mig-3g.40gb".into(),
        quotas: 1,
        fleet_before: 2,
        fleet_after: 0,
        short: 1,
    };
    // The controller's CapacityAvailable is fleet-wide: every quota goes False, team-b too.
    let want: Vec<QuotaShort> = ["team-a", "team-b"]
        .iter()
        .map(|q| QuotaShort {
            quota: q.to_string(),
            resources: vec![short.clone()],
            capacity_available_before: "True".into(),
        })
        .collect();
    assert_eq!(p.quotas_short, want);
    assert_eq!(
        want[0].to_string(),
        "quota team-a: CapacityAvailable True -> False: nvidia.com/mig-3g.40gb: quotas ask 1, fleet 2 -> 0, short 1"
    );

    let md = crate::markdown::preview(std::slice::from_ref(&p));
    assert!(md.contains("| p | 1 | 1 | 3 | 2 | 0 | 0 |"), "the Drain blockers column counts them: {md}");
    assert!(md.contains("pod ml/serve-0: PodDisruptionBudget ml/serve allows 0 disruptions"), "{md}");
    assert!(md.contains("| team-a | nvidia.com/mig-3g.40gb | 1 | 2 -> 0 | 1 |"), "{md}");
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(json["changes"][0]["budget_blocked"][0]["budget"], "ml/serve");
    assert_eq!(json["quotas_short"][0]["resources"][0]["short"], 1);

    // Without the DaemonSets read, a DaemonSet pod counts as managed: not evicted, and as it uses
    // a GPU it holds the hand-over, as the rollout would.
    let p = run(&plan, &nodes, &pods, &budgets, None, &quotas);
    assert_eq!(p.changes[0].refused.len(), 2, "{:?}", p.changes[0].refused);
    assert!(
        p.changes[0].refused[1].starts_with("pod ml/agent-x of DaemonSet ml/gone uses a GPU"),
        "{:?}",
        p.changes[0].refused
    );
}

/// A budget that allows one disruption refuses the evictions past the first of the pods the
/// plan evicts at once: every pod of a node, `maxUnavailable` nodes together.
#[test]
fn a_budget_refuses_what_the_plan_evicts_at_once_past_its_allowance() {
    let nodes =
        [(node("n1", "a"), Some(gpunode("n1", &["3g.40gb"]))), (node("n2", "a"), Some(gpunode("n2", &["3g.40gb"])))];
    let pods = pods(vec![pod("web-0", "n1", "web"), pod("web-1", "n1", "web"), pod("web-2", "n2", "web")]);
    let blocked = |max_unavailable: i32, allowed: i32| -> Vec<String> {
        let plan = plan(
            "a",
            json!([{"gpuProduct": "H100-80GB", "migEnabled": false}]),
            json!({"maxUnavailable": max_unavailable}),
        );
        let p = run(&plan, &nodes, &pods, &[budget("web", "web", allowed)], None, &[]);
        p.changes.iter().flat_map(|c| c.budget_blocked.iter().map(|b| format!("{}: {}", c.node, b.pod))).collect()
    };
    assert_eq!(blocked(1, 1), vec!["n1: ml/web-1"], "n1's two pods go at once");
    assert_eq!(blocked(2, 1), vec!["n1: ml/web-1", "n2: ml/web-2"], "both nodes drain together");
    assert_eq!(blocked(1, 2), Vec::<String>::new());
    assert_eq!(blocked(2, 3), Vec::<String>::new());
    assert_eq!(blocked(1, 0).len(), 3, "nothing may go");
}

/// The Eviction API's own rules: pods it does not check a budget for, and budgets it refuses.
#[test]
fn budgets_apply_as_the_eviction_api_applies_them() {
    let unready = |mut p: Value| {
        p["status"]["conditions"] = json!([{"type": "Ready", "status": "False"}]);
        p
    };
    let mut pending = pod("p", "n1", "web");
    pending["status"]["phase"] = json!("Pending");
    let mut always: PodDisruptionBudget = budget("web", "web", 0);
    always.spec.as_mut().unwrap().unhealthy_pod_eviction_policy = Some("AlwaysAllow".into());
    let mut healthy = budget("web", "web", 0); // minAvailable met: unready pods may go
    healthy.status.as_mut().unwrap().current_healthy = Some(2);
    let mut unhealthy = budget("web", "web", 0);
    unhealthy.status.as_mut().unwrap().current_healthy = Some(0);
    let mut no_status = budget("web", "web", 1);
    no_status.status = None;
    let mut stale = budget("web", "web", 1);
    stale.metadata.generation = Some(2);
    stale.status.as_mut().unwrap().observed_generation = Some(1);
    let mut elsewhere = budget("web", "web", 0);
    elsewhere.metadata.namespace = Some("other".into());
    let mut no_selector = budget("web", "web", 0);
    no_selector.spec.as_mut().unwrap().selector = None;
    let table: Vec<(&str, Value, Vec<PodDisruptionBudget>, Option<&str>)> = vec![
        ("pending pod", pending.clone(), vec![budget("web", "web", 0)], None),
        ("pending pod, two budgets", pending, vec![budget("a", "web", 0), budget("b", "web", 0)], None),
        ("unready pod, AlwaysAllow", unready(pod("p", "n1", "web")), vec![always], None),
        ("unready pod, healthy budget", unready(pod("p", "n1", "web")), vec![healthy], None),
        ("unready pod, unhealthy budget", unready(pod("p", "n1", "web")), vec![unhealthy], Some("allows 0")),
        ("ready pod", pod("p", "n1", "web"), vec![budget("web", "web", 0)], Some("allows 0")),
        ("no status", pod("p", "n1", "web"), vec![no_status], Some("has no status")),
        ("stale status", pod("p", "n1", "web"), vec![stale], Some("has no status for its current generation")),
        (
            "two budgets",
            pod("p", "n1", "web"),
            vec![budget("a", "web", 5), budget("b", "web", 5)],
            Some("more than one"),
        ),
        ("other namespace", pod("p", "n1", "web"), vec![elsewhere], None),
        ("no selector", pod("p", "n1", "web"), vec![no_selector], None),
        ("other labels", pod("p", "n1", "web"), vec![budget("db", "db", 0)], None),
    ];
    for (what, p, budgets, want) in table {
        let p: Pod = serde_json::from_value(p).unwrap();
        let got = budgets::blocks(&[("n1".into(), vec![&p])], &budgets, 1);
        let why: Vec<&str> = got.values().flatten().map(|b| b.why.as_str()).collect();
        match want {
            None => assert!(why.is_empty(), "{what}: {why:?}"),
            Some(w) => assert!(why.len() == 1 && why[0].contains(w), "{what}: {why:?}"),
        }
    }
}

fn capacity(supply: &[(&str, i64)]) -> Capacity {
    Capacity {
        supply: supply.iter().map(|(r, n)| (r.to_string(), *n)).collect(),
        whole_gpu_gb: 80,
        ..Default::default()
    }
}

#[test]
fn quotas_are_listed_when_the_plan_makes_them_short_or_shorter() {
    let a = quota("team-a", json!({"nvidia.com/mig-3g.40gb": 2}));
    let b = quota("team-b", json!({"nvidia.com/gpu": 3}));
    let mut invalid = quota("broken", json!({"nvidia.com/mig-3g.40gb": 9}));
    invalid.spec.namespaces.clear();
    let quotas = [a, b, invalid];
    let names = |before: &[(&str, i64)], after: &[(&str, i64)]| -> Vec<String> {
        quotas::short(&quotas, &capacity(before), &capacity(after)).iter().map(ToString::to_string).collect()
    };
    let enough = [("nvidia.com/mig-3g.40gb", 2), ("nvidia.com/gpu", 3)];
    assert_eq!(names(&enough, &enough), Vec::<String>::new());
    assert_eq!(names(&enough, &[("nvidia.com/mig-3g.40gb", 3), ("nvidia.com/gpu", 4)]), Vec::<String>::new());
    // team-b was short already (so was everyone's CapacityAvailable); the plan takes more of
    // what team-a asks for: team-a is listed, team-b asks for none of it.
    assert_eq!(
        names(
            &[("nvidia.com/mig-3g.40gb", 2), ("nvidia.com/gpu", 1)],
            &[("nvidia.com/mig-3g.40gb", 1), ("nvidia.com/gpu", 1)]
        ),
        vec![
            "quota team-a: CapacityAvailable False already, and shorter: nvidia.com/mig-3g.40gb: quotas ask 2, fleet 2 -> 1, short 1"
        ]
    );
    // A shortage the plan does not make worse is not the plan's.
    assert_eq!(names(&[("nvidia.com/gpu", 1)], &[("nvidia.com/gpu", 2)]), Vec::<String>::new());
}

/// A preview whose every cluster- or user-given string carries ESC sequences (retitle the
/// terminal, clear the screen), a BEL, a bidi override and line breaks that would fake lines.
fn hostile_preview() -> Preview {
    let evil = |s: &str| format!("{s}\u{1b}]0;pwned\u{7}\u{1b}[2J\u{202e}\nfake line\r\n");
    Preview {
        plan: evil("plan"),
        changes: vec![NodeChange {
            node: evil("node"),
            gpus: vec![GpuIntent { index: 0, mig_enabled: true, profiles: [(evil("3g.40gb"), 2)].into() }],
            evict: vec![evil("ml/pod")],
            refused: vec![evil("pod ml/x has no controller")],
            budget_blocked: vec![BudgetBlock { pod: evil("ml/b"), budget: evil("ml/pdb"), why: evil("allows 0") }],
        }],
        unchanged: vec![evil("quiet")],
        skipped: [(evil("skipped"), evil("no GPU inventory"))].into(),
        capacity_before: [(evil("nvidia.com/gpu"), 1)].into(),
        capacity_after: [(evil("nvidia.com/mig-3g.40gb"), 2)].into(),
        quotas_short: vec![QuotaShort {
            quota: evil("team"),
            resources: vec![ResourceShort {
                resource: evil("nvidia.com/mig-3g.40gb"),
                quotas: 1,
                fleet_before: 2,
                fleet_after: 0,
                short: 1,
            }],
            capacity_available_before: "True".into(),
        }],
    }
}

/// The text output escapes control characters in every name and message: printed as they come,
/// a pod or node name could drive the terminal or fake a line of the preview.
#[test]
fn the_text_output_escapes_control_characters_in_every_name_and_message() {
    let out = text(&[hostile_preview()]);
    let bad: Vec<char> =
        out.chars().filter(|c| (c.is_control() && *c != '\n') || ('\u{202a}'..='\u{202e}').contains(c)).collect();
    assert!(bad.is_empty(), "{bad:?} in {out:?}");
    // Every line is one the preview wrote: no name starts a line of its own.
    for line in out.lines() {
        assert!(line.starts_with("plan ") || line.starts_with("  "), "a faked line: {line:?}\n{out}");
        assert!(!line.starts_with("fake") && !line.trim_start().starts_with("fake"), "{line:?}");
    }
    assert!(out.contains("plan plan?]0;pwned??[2J? fake line  : 1 node(s) change"), "{out}");
    assert!(out.contains("    evict ml/pod?]0;pwned"), "{out}");
}

#[test]
fn the_markdown_output_escapes_control_characters_in_every_name_and_message() {
    let md = crate::markdown::preview(&[hostile_preview()]);
    let bad: Vec<char> =
        md.chars().filter(|c| (c.is_control() && *c != '\n') || ('\u{202a}'..='\u{202e}').contains(c)).collect();
    assert!(bad.is_empty(), "{bad:?} in {md:?}");
    assert!(!md.lines().any(|l| l.trim_start().starts_with("fake line")), "a faked line: {md}");
}
