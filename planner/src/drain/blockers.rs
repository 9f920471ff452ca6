//! Pure: why a drain waits, in one wording for every place a user looks (the node's
//! `status.rollout.message`, its `EvictionBlocked` Events, the plan's status and `kubectl tessera
//! status`). The planner finds the blockers it can see in the pods (refused, stuck terminating,
//! replacements that keep coming back); the controller adds the evictions the API refused.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube_core::Status;
use tessera_crds::gpunode::NodeRollout;

/// A pod this long past its deletion deadline is reported stuck: the kubelet confirms a kill
/// within seconds of the deadline, so longer means a finalizer or a kubelet that does not answer.
const STUCK_AFTER_SECS: i64 = 30;
/// A pod created this long after its node's drain started was placed on a cordoned node (the
/// scheduler may act on a view a few seconds older than the cordon).
const ARRIVED_AFTER_SECS: i64 = 10;
/// Evictions of one owner's returning replacements before the drain says they keep coming back.
pub const RETURNS_REPORTED: u32 = 3;

/// Why a pod already being deleted holds the drain, once it is past its deletion deadline.
pub fn stuck_terminating(pod: &Pod, now: Timestamp) -> Option<String> {
    let deadline = pod.metadata.deletion_timestamp.as_ref()?.0;
    if now.duration_since(deadline) <= SignedDuration::from_secs(STUCK_AFTER_SECS) {
        return None;
    }
    Some(format!(
        "pod {} is stuck terminating: its grace period ended at {deadline} (a finalizer, or a kubelet that \
         does not answer; spec.rollout.forceAfterTimeout deletes it after the drain timeout)",
        name_of(pod)
    ))
}

/// The controller of a pod created on the node after its drain started (`Kind namespace/name`):
/// a replacement that came back to the cordoned node (it tolerates the cordon's taint, or names
/// the node itself). Evicting it only makes room for the next one.
pub fn came_back(pod: &Pod, drain_started: Timestamp) -> Option<String> {
    let created = pod.metadata.creation_timestamp.as_ref()?.0;
    if created.duration_since(drain_started) <= SignedDuration::from_secs(ARRIVED_AFTER_SECS) {
        return None;
    }
    let owner = pod.metadata.owner_references.iter().flatten().find(|o| o.controller == Some(true))?;
    Some(format!("{} {}/{}", owner.kind, pod.metadata.namespace.as_deref().unwrap_or_default(), owner.name))
}

/// Said once an owner's returning pods were evicted [`RETURNS_REPORTED`] times. The wording does
/// not change with the count, so the node's record and its Events do not change every return.
pub fn keeps_coming_back(owner: &str, evictions: u32) -> Option<String> {
    (evictions >= RETURNS_REPORTED).then(|| {
        format!(
            "pods of {owner} keep coming back to the cordoned node ({RETURNS_REPORTED} or more evicted): they \
             tolerate the node.kubernetes.io/unschedulable taint or name the node, so the drain cannot finish \
             while they do (drop that toleration, or scale {owner} down)"
        )
    })
}

/// Why the API refused an eviction (HTTP 429). The refusing PodDisruptionBudget is named from the
/// API server's own `DisruptionBudget` cause: no request, no permission, and it is the budget
/// that refused, not a guess among those whose selectors match. A PDB is in its pod's namespace.
/// A 429 without that cause is a throttle (API priority and fairness) and is quoted as it is.
pub fn eviction_refused(namespace: &str, pod: &str, status: &Status) -> String {
    let cause = status.details.iter().flat_map(|d| d.causes.iter()).find(|c| c.reason == "DisruptionBudget");
    let Some(cause) = cause else {
        return format!("eviction of {namespace}/{pod} refused (HTTP {}): {}", status.code, status.message);
    };
    let budget = cause.message.strip_prefix("The disruption budget ").and_then(|rest| rest.split_whitespace().next());
    match budget {
        Some(name) => {
            format!(
                "eviction of {namespace}/{pod} blocked by PodDisruptionBudget {namespace}/{name}: {}",
                cause.message
            )
        }
        None => format!("eviction of {namespace}/{pod} blocked by a PodDisruptionBudget: {}", cause.message),
    }
}

/// A node's blocker message: the planner's blockers, then the refused evictions, each once.
pub fn message(blockers: &[String], refused: &[String]) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in blockers.iter().chain(refused) {
        if !parts.contains(&part.as_str()) {
            parts.push(part);
        }
    }
    parts.join("; ")
}

/// The rollout records to write for the draining nodes of a pass: a node's message is its
/// blockers (`found`, from `Action::Blockers`) then its refused evictions, written where it
/// differs from its cached record (`current`). A record whose new message is not empty also gets
/// an `EvictionBlocked` Event: one per change, not per pass.
pub fn records(
    found: &BTreeMap<String, Vec<String>>,
    refused: &BTreeMap<String, Vec<String>>,
    current: impl Fn(&str) -> Option<NodeRollout>,
) -> Vec<(String, NodeRollout)> {
    let none = Vec::new();
    let mut out = Vec::new();
    for (node, blockers) in found {
        let Some(mut r) = current(node) else { continue };
        let said = message(blockers, refused.get(node).unwrap_or(&none));
        if r.message != said {
            r.message = said;
            out.push((node.clone(), r));
        }
    }
    out
}

/// Per draining node, how many of each owner's returning pods were evicted. Kept in the
/// operator's memory only: a restart, or another replica taking the lease, starts counting again
/// (the message comes back after [`RETURNS_REPORTED`] more returns). Forgotten once the node
/// leaves `Draining`.
#[derive(Debug, Default)]
pub struct Returns(BTreeMap<String, BTreeMap<String, u32>>);

impl Returns {
    pub fn evicted(&mut self, node: &str, owner: &str) {
        let n = self.0.entry(node.to_string()).or_default().entry(owner.to_string()).or_default();
        *n = n.saturating_add(1);
    }

    pub fn of(&self, node: &str) -> BTreeMap<String, u32> {
        self.0.get(node).cloned().unwrap_or_default()
    }

    /// Keeps only the nodes still draining.
    pub fn retain(&mut self, draining: impl Fn(&str) -> bool) {
        self.0.retain(|node, _| draining(node));
    }
}

fn name_of(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn pod(meta: serde_json::Value) -> Pod {
        let mut m = json!({"name": "p", "namespace": "ml", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "u", "controller": true}]});
        for (k, v) in meta.as_object().unwrap() {
            m[k] = v.clone();
        }
        serde_json::from_value(json!({"metadata": m})).unwrap()
    }

    #[test]
    fn a_pdb_refusal_names_the_budget_the_api_server_says_refused() {
        // The body kube-apiserver answers an eviction that would break a budget with.
        let status: Status = serde_json::from_value(json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
            "reason": "TooManyRequests", "code": 429, "details": {"causes": [{"reason": "DisruptionBudget",
            "message": "The disruption budget web needs 2 healthy pods and has 2 currently"}]}}))
        .unwrap();
        assert_eq!(
            eviction_refused("serve", "web-abc", &status),
            "eviction of serve/web-abc blocked by PodDisruptionBudget serve/web: The disruption budget web needs 2 \
             healthy pods and has 2 currently"
        );
        // A budget the API names in other words is still said to be one.
        let mut odd = status.clone();
        odd.details.as_mut().unwrap().causes[0].message = "budget busy".into();
        assert_eq!(
            eviction_refused("serve", "web-abc", &odd),
            "eviction of serve/web-abc blocked by a PodDisruptionBudget: budget busy"
        );
        // A throttle is no budget: quoted, and no PDB named.
        let throttled: Status = serde_json::from_value(
            json!({"status": "Failure", "message": "Too many requests, please try again later.", "code": 429}),
        )
        .unwrap();
        let why = eviction_refused("serve", "web-abc", &throttled);
        assert_eq!(why, "eviction of serve/web-abc refused (HTTP 429): Too many requests, please try again later.");
    }

    #[test]
    fn a_pod_is_stuck_only_well_past_its_deletion_deadline() {
        let p = pod(json!({"deletionTimestamp": "2026-06-01T00:00:00Z"}));
        assert_eq!(stuck_terminating(&p, ts("2026-06-01T00:00:30Z")), None, "the kubelet has a moment to confirm");
        let why = stuck_terminating(&p, ts("2026-06-01T00:00:31Z")).unwrap();
        assert!(
            why.starts_with("pod ml/p is stuck terminating: its grace period ended at 2026-06-01T00:00:00Z"),
            "{why}"
        );
        // The wording does not change as time goes on (no Event per pass).
        assert_eq!(stuck_terminating(&p, ts("2026-06-01T05:00:00Z")), Some(why));
        assert_eq!(stuck_terminating(&pod(json!({})), ts("2026-06-01T05:00:00Z")), None);
    }

    #[test]
    fn a_pod_created_after_the_drain_started_came_back_for_its_controller() {
        let started = ts("2026-06-01T00:00:00Z");
        let early = pod(json!({"creationTimestamp": "2026-06-01T00:00:10Z"}));
        assert_eq!(came_back(&early, started), None, "scheduled on a view from before the cordon");
        let late = pod(json!({"creationTimestamp": "2026-06-01T00:00:11Z"}));
        assert_eq!(came_back(&late, started).as_deref(), Some("ReplicaSet ml/web-1"));
        let bare = pod(json!({"creationTimestamp": "2026-06-01T00:05:00Z", "ownerReferences": null}));
        assert_eq!(came_back(&bare, started), None, "no controller brings it back");
    }

    #[test]
    fn returns_are_said_from_the_threshold_on_in_words_that_do_not_change() {
        assert_eq!(keeps_coming_back("ReplicaSet ml/web-1", RETURNS_REPORTED - 1), None);
        let said = keeps_coming_back("ReplicaSet ml/web-1", RETURNS_REPORTED).unwrap();
        assert!(said.starts_with("pods of ReplicaSet ml/web-1 keep coming back to the cordoned node"), "{said}");
        assert_eq!(keeps_coming_back("ReplicaSet ml/web-1", 40), Some(said));
        let mut r = Returns::default();
        for _ in 0..3 {
            r.evicted("n1", "ReplicaSet ml/web-1");
        }
        r.evicted("n2", "ReplicaSet ml/web-1");
        assert_eq!(r.of("n1"), [("ReplicaSet ml/web-1".to_string(), 3)].into());
        r.retain(|n| n == "n2");
        assert!(r.of("n1").is_empty() && !r.of("n2").is_empty());
    }

    #[test]
    fn every_draining_node_gets_its_blockers_recorded_once_whether_or_not_it_evicts() {
        let record =
            |message: &str| NodeRollout { plan: Some("p".into()), message: message.into(), ..Default::default() };
        let unmanaged = "pod ml/a has no controller".to_string();
        let pdb = "eviction of ml/b blocked by PodDisruptionBudget ml/web: x".to_string();
        let found: BTreeMap<String, Vec<String>> = [
            ("refusing".to_string(), vec![unmanaged.clone()]), // no eviction at all this pass
            ("evicting".to_string(), vec![]),
            ("same".to_string(), vec![unmanaged.clone()]),
            ("cleared".to_string(), vec![]),
        ]
        .into();
        let refused: BTreeMap<String, Vec<String>> = [("evicting".to_string(), vec![pdb.clone()])].into();
        let current = |node: &str| match node {
            "same" => Some(record(&unmanaged)),
            "cleared" => Some(record("old news")),
            "gone" => None,
            _ => Some(record("")),
        };
        let out = records(&found, &refused, current);
        let by_node: BTreeMap<&str, &str> = out.iter().map(|(n, r)| (n.as_str(), r.message.as_str())).collect();
        assert_eq!(
            by_node,
            [("cleared", ""), ("evicting", pdb.as_str()), ("refusing", unmanaged.as_str())].into(),
            "a record already saying it is not written again"
        );
        assert!(out.iter().all(|(_, r)| r.plan.as_deref() == Some("p")), "the rest of the record is kept");
        assert!(records(&[("gone".to_string(), vec![unmanaged.clone()])].into(), &BTreeMap::new(), current).is_empty());
    }

    #[test]
    fn a_message_says_each_blocker_once_planners_first() {
        let a = "pod ml/a has no controller".to_string();
        let b = "eviction of ml/b blocked by PodDisruptionBudget ml/web: x".to_string();
        assert_eq!(message(std::slice::from_ref(&a), &[b.clone(), b.clone()]), format!("{a}; {b}"));
        assert_eq!(message(&[], &[]), "");
    }
}
