//! Faults mixed and repeated while one plan rolls out and another is at rest, on the real control
//! plane: the leader killed (a standby replica takes over), kube-apiserver frozen for less and
//! for more than the agents' heartbeat lease, node agents restarted or frozen past their lease,
//! and watch outages (the API server restarted). Checked at every poll: no node whose plan did not change is cordoned and no
//! pod on it is evicted. At the end every plan converges and nothing is left cordoned.
//!
//! `TESSERA_FAULT_ROUNDS` sets the rounds (default: each fault once, then mixed ones);
//! `scripts/fault-loop.sh` runs the loop again and again.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tessera_crds::conditions::{READY, find};
use tessera_crds::{GpuNode, GpuPartitionPlan};
use tessera_e2e::fixtures::{
    FakeGpuNode, apply_file, create_gpu_nodes, create_namespace, install_crds, spawn_node_agent, spawn_operator,
    wait_for, wait_plan_ready,
};
use tessera_e2e::process::Component;
use tessera_e2e::{ControlPlane, Identity};

const T: Duration = Duration::from_secs(240);
/// The agents' heartbeat lease: a freeze of [`LONG_FREEZE`] outlasts it, one of [`SHORT_FREEZE`]
/// does not.
const LEASE_SECONDS: u64 = 6;
const SHORT_FREEZE: Duration = Duration::from_secs(3);
const LONG_FREEZE: Duration = Duration::from_secs(12);
/// The nodes of the plan that never changes, and of the one that keeps changing.
const AT_REST: [&str; 2] = ["rest-0", "rest-1"];
const ROLLING: [&str; 2] = ["roll-0", "roll-1"];
/// The rolling plan's layouts, one per round in turn.
const LAYOUTS: [&str; 2] = ["1g.10gb", "3g.40gb"];

#[derive(Debug, Clone, Copy)]
enum Fault {
    /// The leading replica is killed (SIGKILL) and started again as a standby.
    LeaderKilled,
    ShortFreeze,
    LongFreeze,
    /// Every node agent killed and started again.
    AgentsRestarted,
    /// Every node agent frozen (SIGSTOP) for longer than its lease, then let go: the operator
    /// judges them dead and marks their GpuNodes `Ready=Unknown`, then sees their leases renew
    /// before they report again.
    AgentsFrozen,
    /// kube-apiserver killed and started again: every watch breaks and re-lists.
    WatchOutage,
}

/// Each fault once, then pairs of them back to back.
fn rounds() -> Vec<Vec<Fault>> {
    use Fault::*;
    let all = vec![
        vec![AgentsFrozen],
        vec![LongFreeze],
        vec![LeaderKilled],
        vec![ShortFreeze],
        vec![AgentsRestarted],
        vec![WatchOutage],
        vec![LeaderKilled, LongFreeze],
        vec![LongFreeze, AgentsRestarted],
        vec![WatchOutage, LongFreeze],
        vec![AgentsFrozen, LeaderKilled],
    ];
    let n = std::env::var("TESSERA_FAULT_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(all.len()).max(1);
    all.into_iter().cycle().take(n).collect()
}

struct Cluster {
    cp: ControlPlane,
    admin: Client,
    agents: BTreeMap<&'static str, Component>,
    operators: BTreeMap<String, Component>,
    /// Replicas started again after a kill (each under a new identity).
    restarts: usize,
}

impl Cluster {
    async fn start() -> Self {
        let cp = ControlPlane::start().await.unwrap();
        let admin = cp.client(Identity::Admin).await.unwrap();
        install_crds(&admin).await.unwrap();
        for f in [
            "config/base/namespace.yaml",
            "config/rbac/node-agent.yaml",
            "config/rbac/node-agent-fence.yaml",
            "config/rbac/operator.yaml",
        ] {
            apply_file(&admin, f).await.unwrap();
        }
        let fake: Vec<FakeGpuNode> = AT_REST
            .iter()
            .map(|n| (n, "rest"))
            .chain(ROLLING.iter().map(|n| (n, "roll")))
            .map(|(n, pool)| {
                FakeGpuNode::new(n, "NVIDIA-H100-80GB-HBM3", 1).label("pool", pool).resource("nvidia.com/gpu", 1)
            })
            .collect();
        create_gpu_nodes(&admin, &fake).await.unwrap();
        let mut cluster = Cluster { cp, admin, agents: BTreeMap::new(), operators: BTreeMap::new(), restarts: 0 };
        for n in AT_REST.iter().chain(&ROLLING) {
            cluster.start_agent(n).await;
        }
        for tag in ["op-a", "op-b"] {
            cluster.operators.insert(tag.to_string(), spawn_operator(&cluster.cp, tag).unwrap().0);
        }
        cluster
    }

    async fn start_agent(&mut self, node: &'static str) {
        let lease = LEASE_SECONDS.to_string();
        let args = ["--lease-duration-seconds", lease.as_str(), "--sim-latency-ms", "200"];
        let state = self.cp.dir.join(format!("{node}.json"));
        let agent = spawn_node_agent(&self.cp, node, &state, "H100-80GB", &args).await.unwrap();
        self.agents.insert(node, agent);
    }

    /// The running replica holding the operator's leader Lease now, if any is.
    async fn leader(&self) -> Option<String> {
        let holder = holder(&self.admin).await?;
        self.operators.contains_key(&holder).then_some(holder)
    }

    async fn inject(&mut self, fault: Fault) {
        tessera_e2e::tell!("fault: {fault:?}");
        match fault {
            Fault::LeaderKilled => {
                let leader = wait_for("a leader", T, || self.leader()).await.unwrap();
                self.operators.remove(&leader).unwrap().stop_now();
                // Started again under a new identity, as a new pod would be: the lease is not
                // its own, so the standby (or it) takes over only once the lease expires.
                self.restarts += 1;
                let tag = format!("op-{}", self.restarts);
                let replica = spawn_operator(&self.cp, &tag).unwrap().0;
                self.operators.insert(tag, replica);
            }
            Fault::ShortFreeze => self.cp.freeze_apiserver(SHORT_FREEZE).await.unwrap(),
            Fault::LongFreeze => self.cp.freeze_apiserver(LONG_FREEZE).await.unwrap(),
            Fault::AgentsRestarted => {
                for n in AT_REST.iter().chain(&ROLLING) {
                    self.agents.get_mut(n).unwrap().stop_now();
                    self.start_agent(n).await;
                }
            }
            Fault::AgentsFrozen => {
                let pids: Vec<u32> = self.agents.values().map(Component::pid).collect();
                // SAFETY: kill(2) on processes this test started and still holds (not reaped).
                let signal = |sig| {
                    pids.iter().for_each(|p| {
                        unsafe { libc::kill(*p as libc::pid_t, sig) };
                    })
                };
                signal(libc::SIGSTOP);
                tokio::time::sleep(LONG_FREEZE).await;
                signal(libc::SIGCONT);
            }
            Fault::WatchOutage => self.cp.restart_apiserver(Duration::from_secs(3)).await.unwrap(),
        }
    }
}

fn plan(name: &str, pool: &str, profile: &str) -> GpuPartitionPlan {
    serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan", "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": {"pool": pool}},
                 "layouts": [{"gpuProduct": "H100-80GB", "profiles": {profile: 2}}],
                 "rollout": {"maxUnavailable": 1, "drainTimeoutSeconds": 30}}
    }))
    .unwrap()
}

async fn ready(admin: &Client, name: &str) {
    wait_plan_ready(admin, name, T).await.unwrap();
}

/// A GPU pod bound to `node`; `owner` makes it evictable (a bare pod blocks every eviction).
fn gpu_pod(name: &str, node: &str, owner: Option<serde_json::Value>) -> Pod {
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x",
                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
    if let Some(o) = owner {
        pod["metadata"]["ownerReferences"] = json!([o]);
    }
    serde_json::from_value(pod).unwrap()
}

/// Who holds the operator's leader Lease now.
async fn holder(admin: &Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "tessera-system");
    leases.get("tessera-operator").await.ok()?.spec?.holder_identity
}

/// What the property check saw as it polled through every fault.
#[derive(Default)]
struct Seen {
    /// What it found wrong.
    violations: Vec<String>,
    /// Looks that got an answer (a frozen or restarting API server gives none).
    looks: usize,
    /// Every holder of the leader Lease seen.
    leaders: std::collections::BTreeSet<String>,
    /// Whether a node at rest was seen marked `Ready=Unknown` by the operator (the state a
    /// wrongful start came from).
    marked_dead: bool,
}

/// What the check saw, shared between the polling task and the test.
type Shared = Arc<Mutex<Seen>>;

/// One look at the nodes at rest: any cordoned, or any of their pods gone or terminating.
/// Requests that time out (the API server frozen) or fail (restarting) check nothing.
async fn check_at_rest(admin: &Client, pods: &BTreeMap<String, String>, shared: &Shared) {
    let look = async {
        let nodes: Api<Node> = Api::all(admin.clone());
        let list = nodes.list(&Default::default()).await.ok()?;
        let pod_list = Api::<Pod>::namespaced(admin.clone(), "lab").list(&Default::default()).await.ok()?;
        let gns = Api::<GpuNode>::all(admin.clone()).list(&Default::default()).await.ok()?;
        Some((list.items, pod_list.items, gns.items, holder(admin).await))
    };
    let Ok(Some((nodes, listed, gns, leader))) = tokio::time::timeout(Duration::from_secs(2), look).await else {
        return;
    };
    let marked = gns.iter().filter(|g| AT_REST.contains(&g.name_any().as_str())).any(|g| {
        let ready = g.status.as_ref().and_then(|s| find(&s.conditions, READY).cloned());
        ready.is_some_and(|c| c.reason == "AgentNotResponding")
    });
    let mut found = Vec::new();
    for n in nodes.iter().filter(|n| AT_REST.contains(&n.name_any().as_str())) {
        if n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false) {
            found.push(format!("{} (at rest) cordoned", n.name_any()));
        }
    }
    for (name, uid) in pods {
        match listed.iter().find(|p| p.name_any() == *name) {
            Some(p) if p.uid().as_deref() == Some(uid) && p.metadata.deletion_timestamp.is_none() => {}
            _ => found.push(format!("pod lab/{name} on a node at rest evicted or deleted")),
        }
    }
    let mut seen = locked(shared);
    seen.violations.extend(found);
    seen.looks += 1;
    seen.leaders.extend(leader);
    seen.marked_dead |= marked;
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_never_cordon_a_node_at_rest_and_every_plan_converges() {
    let mut c = Cluster::start().await;
    let admin = c.admin.clone();
    let plans: Api<GpuPartitionPlan> = Api::all(admin.clone());
    plans.create(&PostParams::default(), &plan("rest", "rest", "3g.40gb")).await.unwrap();
    plans.create(&PostParams::default(), &plan("roll", "roll", LAYOUTS[1])).await.unwrap();
    ready(&admin, "rest").await;
    ready(&admin, "roll").await;

    // The nodes at rest hold work: a bare notebook (it would hold a drain forever, as on a real
    // cluster) and a managed pod (a drain would evict it).
    create_namespace(&admin, "lab").await.unwrap();
    let owner = Api::<ConfigMap>::namespaced(admin.clone(), "lab")
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "owner"}})).unwrap())
        .await
        .unwrap();
    let owner =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.uid(), "controller": true});
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "lab");
    let mut at_rest_pods = BTreeMap::new();
    for pod in [gpu_pod("notebook", AT_REST[0], None), gpu_pod("trainer", AT_REST[1], Some(owner))] {
        let made = pods.create(&PostParams::default(), &pod).await.unwrap();
        at_rest_pods.insert(made.name_any(), made.uid().unwrap());
    }

    let shared: Shared = Arc::default();
    let polling = {
        let (admin, shared, pods) = (admin.clone(), shared.clone(), at_rest_pods.clone());
        tokio::spawn(async move {
            loop {
                check_at_rest(&admin, &pods, &shared).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };

    let faults_began = k8s_openapi::jiff::Timestamp::now();
    let rounds = rounds();
    for (i, faults) in rounds.iter().enumerate() {
        // A change in flight on the rolling plan at every fault.
        let profile = LAYOUTS[i % LAYOUTS.len()];
        let change = json!({"spec": {"layouts": [{"gpuProduct": "H100-80GB", "profiles": {profile: 2}}]}});
        // A client of its own each round: the last one may have spoken to an API server since
        // restarted.
        let plans: Api<GpuPartitionPlan> = Api::all(c.cp.client(Identity::Admin).await.unwrap());
        plans.patch("roll", &PatchParams::default(), &Patch::Merge(&change)).await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let looks = locked(&shared).looks;
        for fault in faults {
            c.inject(*fault).await;
        }
        // Long enough for a judged-dead agent to renew and the next leader to act.
        tokio::time::sleep(Duration::from_secs(LEASE_SECONDS + 4)).await;
        let seen = locked(&shared);
        assert!(seen.violations.is_empty(), "round {i} ({faults:?}): {:#?}", seen.violations);
        assert!(seen.looks > looks, "round {i} ({faults:?}): the check got no answer at all");
    }

    let admin = c.cp.client(Identity::Admin).await.unwrap();
    ready(&admin, "roll").await;
    ready(&admin, "rest").await;
    polling.abort();
    {
        let seen = locked(&shared);
        assert!(seen.violations.is_empty(), "{:#?}", seen.violations);
        assert!(seen.marked_dead, "no node at rest was ever marked Ready=Unknown: the faults missed the case");
        if rounds.iter().flatten().any(|f| matches!(f, Fault::LeaderKilled)) {
            assert!(seen.leaders.len() > 1, "leadership never changed hands: {:?}", seen.leaders);
        }
    }
    // Between two looks a start and its withdrawal could pass unseen: no Event of the plan at
    // rest since the faults began says a drain started, was withdrawn or handed a node over.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(admin.clone(), "default");
    let rest_events: Vec<String> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|e| {
            e.regarding
                .as_ref()
                .is_some_and(|r| r.kind.as_deref() == Some("GpuPartitionPlan") && r.name.as_deref() == Some("rest"))
        })
        .filter(|e| e.event_time.as_ref().is_some_and(|t| t.0 > faults_began))
        .filter_map(|e| e.reason.clone())
        .filter(|r| ["DrainStarted", "DrainWithdrawn", "Applying"].contains(&r.as_str()))
        .collect();
    assert!(rest_events.is_empty(), "the plan at rest moved a node: {rest_events:?}");
    let nodes: Api<Node> = Api::all(admin.clone());
    for n in nodes.list(&Default::default()).await.unwrap().items {
        let cordoned = n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
        assert!(!cordoned, "{} left cordoned", n.name_any());
    }
    let last = LAYOUTS[(rounds.len() - 1) % LAYOUTS.len()];
    let gns: Api<GpuNode> = Api::all(admin.clone());
    for n in ROLLING {
        let st = gns.get(n).await.unwrap().status.unwrap();
        let got: Vec<&str> = st.gpus[0].instances.iter().map(|i| i.profile.as_str()).collect();
        assert_eq!(got, [last, last], "{n} holds the last layout");
    }
    for (name, uid) in &at_rest_pods {
        let pod = pods.get(name).await.unwrap();
        assert_eq!(pod.uid().as_ref(), Some(uid), "lab/{name} is the pod made before the faults");
    }
}

/// The timing behind a node at rest cordoned after an API-server freeze, made exact: the agent is
/// judged dead and its GpuNode marked `Ready=Unknown`, then its lease renews before it reports
/// again (here the renewal is written for it while it is still stopped, as a renewal sent before
/// the freeze lands first). Nothing differs between intent and report: it is not started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_at_rest_whose_lease_renews_before_its_agent_reports_again_is_not_started() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let c = Cluster::start().await;
    let admin = c.admin.clone();
    let plans: Api<GpuPartitionPlan> = Api::all(admin.clone());
    plans.create(&PostParams::default(), &plan("rest", "rest", "3g.40gb")).await.unwrap();
    ready(&admin, "rest").await;
    let node = AT_REST[0];
    let pid = c.agents[node].pid() as libc::pid_t;
    // SAFETY: kill(2) on a process this test started and still holds (not reaped).
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let gns: Api<GpuNode> = Api::all(admin.clone());
    wait_for(&format!("{node} marked Ready=Unknown"), T, || async {
        let st = gns.get(node).await.ok()?.status?;
        find(&st.conditions, READY).filter(|c| c.reason == "AgentNotResponding").map(|_| ())
    })
    .await
    .unwrap();
    let leases: Api<Lease> = Api::namespaced(admin.clone(), tessera_crds::gpunode::AGENT_LEASE_NAMESPACE);
    let renewed = json!({"spec": {"renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now())}});
    leases.patch(node, &PatchParams::default(), &Patch::Merge(&renewed)).await.unwrap();
    // Several passes, each of which would start a node seen alive whose Ready is not True.
    let nodes: Api<Node> = Api::all(admin.clone());
    for _ in 0..16 {
        let n = nodes.get(node).await.unwrap();
        assert!(!n.spec.and_then(|s| s.unschedulable).unwrap_or(false), "{node} cordoned with nothing to change");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let rollout = gns.get(node).await.unwrap().status.and_then(|s| s.rollout).map(|r| r.phase);
    assert_eq!(rollout, Some(tessera_crds::gpunode::NodePhase::Idle), "{node} is not started");
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    ready(&admin, "rest").await;
}
