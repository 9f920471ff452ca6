//! Which watch events wake a controller's pass. A pass steps over the whole fleet (cheaply for
//! unchanged nodes, see `controller::fleet_cache`), so waking it on a change it does not read costs a
//! pass for nothing: kubelets (and kwok) rewrite each Node's
//! status every few minutes, agents renew their Leases every few seconds, and the operator's own
//! status writes come back as plan events. Those still reach the caches; they just do not start
//! a pass. A pass also starts two seconds after the last one ended, so a change filtered out here
//! (an agent's renewed Lease, say: liveness reads it at the next pass) waits at most a pass and
//! two seconds.

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Resource;
use kube::runtime::watcher::Event;
use tessera_crds::gpunode::ACTIVITY_CURRENT_UNTIL;
use tessera_crds::{GpuNode, GpuPartitionPlan, TenantGpuQuota};
use tokio::sync::Notify;

/// A listener of a watch, and what it reads: `differs(old, new)` says whether a change matters.
pub struct Waker<K> {
    pub notify: Arc<Notify>,
    pub differs: fn(&K, &K) -> bool,
}

impl<K> Waker<K> {
    /// Woken on every change.
    pub fn always(notify: Arc<Notify>) -> Self {
        Self { notify, differs: |_, _| true }
    }
}

/// The listeners (bit `i` for `differs[i]`) an event must wake. `old` is the cached version of
/// an applied object, read before the event reaches the cache. New and deleted objects, and the
/// end of a re-list, wake everyone; the objects of a re-list wake nobody until it is complete.
pub fn to_wake<K>(event: &Event<K>, old: impl Fn(&K) -> Option<Arc<K>>, differs: &[fn(&K, &K) -> bool]) -> u64 {
    let everyone = if differs.len() >= 64 { u64::MAX } else { (1u64 << differs.len()) - 1 };
    match event {
        Event::Apply(new) => match old(new) {
            None => everyone,
            Some(old) => differs.iter().enumerate().filter(|(_, d)| d(&old, new)).fold(0, |m, (i, _)| m | 1 << i),
        },
        Event::Delete(_) | Event::InitDone => everyone,
        Event::Init | Event::InitApply(_) => 0,
    }
}

/// Metadata the controllers read on every kind: labels and annotations (selectors, the cordon
/// mark), generation, finalizers, deletion.
fn metadata_differs<K: Resource>(a: &K, b: &K) -> bool {
    let (a, b) = (a.meta(), b.meta());
    a.labels != b.labels
        || a.annotations != b.annotations
        || a.generation != b.generation
        || a.finalizers != b.finalizers
        || a.deletion_timestamp != b.deletion_timestamp
        || a.uid != b.uid
}

/// The rollout reads a Node's labels, annotations and `spec.unschedulable`: not its status, nor
/// its taints (the node lifecycle controller adds and removes those as nodes come and go).
pub fn node_differs(a: &Node, b: &Node) -> bool {
    let unschedulable = |n: &Node| n.spec.as_ref().and_then(|s| s.unschedulable);
    metadata_differs(a, b) || unschedulable(a) != unschedulable(b)
}

/// A plan's spec and metadata, and the layout decision an automatic plan follows; not the
/// conditions and counts the operator itself writes (each write would wake a pass for nothing).
pub fn plan_differs(a: &GpuPartitionPlan, b: &GpuPartitionPlan) -> bool {
    let decision = |p: &GpuPartitionPlan| p.status.as_ref().and_then(|s| s.layout_decision.clone());
    metadata_differs(a, b) || a.spec != b.spec || decision(a) != decision(b)
}

/// Who holds an agent's Lease, for how long, and whether it was ever renewed (liveness reads a
/// Lease without a renewal as an agent not responding); a renewal alone is read at the next pass.
/// The agent's `activity-current-until` annotation is left out: it moves at the first renewal
/// after each current pass (~every 30 s per node) and only a restarted agent reads it, so with
/// it a fleet at rest would wake a pass every debounce. `activity-failing-since` still wakes.
pub fn lease_differs(a: &Lease, b: &Lease) -> bool {
    let holder = |l: &Lease| {
        l.spec.as_ref().map(|s| (s.holder_identity.clone(), s.lease_duration_seconds, s.renew_time.is_some()))
    };
    let read = |l: &Lease| {
        let mut meta = l.metadata.clone();
        if let Some(a) = meta.annotations.as_mut() {
            a.remove(ACTIVITY_CURRENT_UNTIL);
            if a.is_empty() {
                meta.annotations = None;
            }
        }
        Lease { metadata: meta, spec: None }
    };
    let (a_read, b_read) = (read(a), read(b));
    metadata_differs(&a_read, &b_read) || holder(a) != holder(b)
}

/// Automatic plans read a quota's labels and limits, not its usage.
pub fn quota_differs(a: &TenantGpuQuota, b: &TenantGpuQuota) -> bool {
    metadata_differs(a, b) || a.spec != b.spec
}

/// The quota controller reads GpuNodes only for the capacity their GPUs supply.
pub fn gpus_differ(a: &GpuNode, b: &GpuNode) -> bool {
    fn gpus(g: &GpuNode) -> Option<&Vec<tessera_crds::gpunode::GpuState>> {
        g.status.as_ref().map(|s| &s.gpus)
    }
    a.metadata.uid != b.metadata.uid || gpus(a) != gpus(b)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use tessera_crds::gpunode::ACTIVITY_FAILING_SINCE;

    fn node(unschedulable: bool, labels: serde_json::Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": "n1", "resourceVersion": "1", "labels": labels},
                                      "spec": {"unschedulable": unschedulable}}))
        .unwrap()
    }

    #[test]
    fn an_object_not_cached_yet_a_deletion_and_a_relist_wake_everyone() {
        let n = node(false, json!({}));
        let differs: [fn(&Node, &Node) -> bool; 2] = [node_differs, |_, _| false];
        assert_eq!(to_wake(&Event::Apply(n.clone()), |_| None, &differs), 0b11);
        assert_eq!(to_wake(&Event::Delete(n.clone()), |_| Some(Arc::new(n.clone())), &differs), 0b11);
        assert_eq!(to_wake(&Event::<Node>::InitDone, |_| None, &differs), 0b11);
        assert_eq!(to_wake(&Event::<Node>::Init, |_| None, &differs), 0);
        assert_eq!(to_wake(&Event::InitApply(n.clone()), |_| None, &differs), 0, "woken once, at InitDone");
    }

    #[test]
    fn a_change_wakes_only_the_listeners_that_read_it() {
        let old = Arc::new(node(false, json!({"pool": "a"})));
        let mut heartbeat = node(false, json!({"pool": "a"}));
        heartbeat.metadata.resource_version = Some("2".into());
        heartbeat.status =
            Some(serde_json::from_value(json!({"conditions": [{"type": "Ready", "status": "True"}]})).unwrap());
        let differs: [fn(&Node, &Node) -> bool; 2] = [node_differs, |_, _| true];
        let cached = |_: &Node| Some(old.clone());
        assert_eq!(to_wake(&Event::Apply(heartbeat), cached, &differs), 0b10, "a status-only write wakes no pass");
        assert_eq!(to_wake(&Event::Apply(node(true, json!({"pool": "a"}))), cached, &differs), 0b11, "a cordon");
        assert_eq!(to_wake(&Event::Apply(node(false, json!({"pool": "b"}))), cached, &differs), 0b11, "a relabel");
        let mut marked = node(false, json!({"pool": "a"}));
        marked.metadata.annotations = Some([("tessera.dev/cordoned-at".to_string(), "t".to_string())].into());
        assert_eq!(to_wake(&Event::Apply(marked), cached, &differs), 0b11, "the cordon mark");
        let mut tainted = node(false, json!({"pool": "a"}));
        tainted.spec.as_mut().unwrap().taints = Some(vec![Default::default()]);
        assert_eq!(to_wake(&Event::Apply(tainted), cached, &differs), 0b10, "a taint is not read");
    }

    #[test]
    fn the_operators_own_status_write_wakes_no_pass_but_a_decision_or_spec_change_does() {
        let plan = |generation: i64, status: serde_json::Value| -> GpuPartitionPlan {
            serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan",
                "metadata": {"name": "p", "generation": generation},
                "spec": {"nodeSelector": {}, "layouts": [{"gpuProduct": "H100-80GB", "profiles": {"7g.80gb": 1}}]},
                "status": status}))
            .unwrap()
        };
        let old = plan(1, json!({"updatedNodes": 1}));
        assert!(!plan_differs(&old, &plan(1, json!({"updatedNodes": 2}))));
        assert!(plan_differs(&old, &plan(2, json!({"updatedNodes": 1}))));
        let decided = plan(1, json!({"updatedNodes": 1, "layoutDecision": {"changedGpus": 1}}));
        assert!(plan_differs(&old, &decided), "an automatic plan's decision is read by the rollout");
        let mut deleting = old.clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-01-01T00:00:00Z".parse().unwrap()));
        assert!(plan_differs(&old, &deleting));
    }

    #[test]
    fn a_lease_renewal_wakes_no_pass_but_a_new_holder_does() {
        let lease = |holder: &str, renewed: &str| -> Lease {
            serde_json::from_value(json!({"metadata": {"name": "n1"}, "spec": {"holderIdentity": holder,
                "leaseDurationSeconds": 40, "renewTime": renewed}}))
            .unwrap()
        };
        let old = lease("a", "2026-01-01T00:00:00.000000Z");
        assert!(!lease_differs(&old, &lease("a", "2026-01-01T00:00:10.000000Z")));
        assert!(lease_differs(&old, &lease("b", "2026-01-01T00:00:10.000000Z")));
        let mut longer = lease("a", "2026-01-01T00:00:10.000000Z");
        longer.spec.as_mut().unwrap().lease_duration_seconds = Some(60);
        assert!(lease_differs(&old, &longer), "a new duration changes when the agent counts as down");
        let mut never = old.clone();
        never.spec.as_mut().unwrap().renew_time = None;
        assert!(lease_differs(&never, &old), "a first renewal: the agent is alive");
        let annotated = |l: &Lease, key: &str, value: &str| {
            let mut l = l.clone();
            l.metadata.annotations.get_or_insert_with(Default::default).insert(key.into(), value.into());
            l
        };
        let current = annotated(&old, ACTIVITY_CURRENT_UNTIL, "2026-01-01T00:00:00Z");
        assert!(!lease_differs(&old, &current), "the agent's first current-until: the operator never reads it");
        assert!(
            !lease_differs(&current, &annotated(&old, ACTIVITY_CURRENT_UNTIL, "2026-01-01T00:00:30Z")),
            "a renewal after each current pass moves current-until (every ~30 s per node)"
        );
        assert!(lease_differs(&current, &annotated(&current, ACTIVITY_FAILING_SINCE, "2026-01-01T00:00:30Z")));
        assert!(lease_differs(&current, &annotated(&current, "tessera.dev/other", "x")), "other annotations are read");
    }

    #[test]
    fn the_quota_controller_wakes_only_when_the_gpus_change() {
        let gn = |phase: &str, profiles: serde_json::Value| -> GpuNode {
            serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
                "metadata": {"name": "n1", "uid": "u"}, "spec": {},
                "status": {"rollout": {"phase": phase}, "gpus": [{"index": 0, "uuid": "GPU-1",
                           "product": "H100", "migCapable": true, "instances": profiles}]}}))
            .unwrap()
        };
        let old = gn("Idle", json!([]));
        assert!(!gpus_differ(&old, &gn("Draining", json!([]))), "a rollout record is not capacity");
        assert!(gpus_differ(&old, &gn("Idle", json!([{"profile": "7g.80gb", "start": 0, "size": 8}]))));
    }
}
