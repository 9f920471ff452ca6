//! Whose activity summaries the idle report sets aside: the agent writes
//! `GpuNode.status.activity` only on a meaningful change, so a dead agent's last summary stays
//! there unchanged: an idle device would keep growing idle, a busy one stay busy. A node whose
//! agent is not reporting has its held devices counted `unmeasured` instead, with the reason.
//!
//! Decisions:
//! - The operator reads the agents' heartbeat Leases already (`liveness`, for rollouts): the
//!   rollout pass publishes the nodes it judges `NotResponding` ([`Published`]), and the quota
//!   controller's idle report reads them. No heartbeat in the summary itself: that would cost
//!   a status write per node and interval, where the Lease is renewed anyway.
//! - `Unproven` (the operator just started, or its lease watch just caught up) is trusted: it
//!   says the operator has not watched long enough, not that the agent is gone, and lasts one
//!   lease duration; setting every node aside after each failover would flap the tenants'
//!   figures and reset their alert.
//! - `kubectl tessera idle` and `status` read the Leases once ([`from_leases`]): an agent is not
//!   reporting when its `renewTime` is older than its `leaseDurationSeconds` by the reader's
//!   clock (one read cannot watch a renewal; clock skew between the reader and the nodes shows
//!   as early or late verdicts). Where no Lease was read (RBAC, `--from` files without Leases),
//!   nothing is set aside; a node without a Lease among those read is not judged either (an
//!   export may hold only some).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use serde::Serialize;
use tessera_crds::gpunode::AGENT_LEASE_NAMESPACE;

use crate::liveness::AgentHealth;

/// Nodes whose agents are not reporting, with their last heartbeat (`None`: never seen one).
pub type NotReporting = BTreeMap<String, Option<Timestamp>>;

/// A node whose summary the report set aside.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SetAside {
    pub node: String,
    /// The agent's last heartbeat, when there was one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
    /// Devices pods hold there, counted `unmeasured` for it.
    pub held: i64,
}

impl SetAside {
    /// `node agent not reporting since T`, for the CLI and the log.
    pub fn reason(&self) -> String {
        match self.since {
            Some(t) => format!("node agent not reporting since {t}"),
            None => "node agent has never reported (no heartbeat)".into(),
        }
    }
}

/// The rollout pass's verdicts, shared with the quota controller (the latest pass's only).
#[derive(Debug, Clone, Default)]
pub struct Published(Arc<Mutex<Arc<NotReporting>>>);

impl Published {
    /// Replaces the verdicts with those of `agents` (node name and its health).
    pub fn publish<'a>(&self, agents: impl Iterator<Item = (&'a str, &'a AgentHealth)>) {
        let next: NotReporting = agents
            .filter_map(|(node, h)| match h {
                AgentHealth::NotResponding { since } => Some((node.to_string(), *since)),
                _ => None,
            })
            .collect();
        let mut cur = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if **cur != next {
            *cur = Arc::new(next);
        }
    }

    pub fn get(&self) -> Arc<NotReporting> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// From one read of the agents' Leases at `now` (the CLI): see the module's decisions.
pub fn from_leases(leases: &[Lease], now: Timestamp) -> NotReporting {
    leases
        .iter()
        .filter(|l| l.namespace().as_deref() == Some(AGENT_LEASE_NAMESPACE))
        .filter_map(|l| {
            let spec = l.spec.as_ref();
            let renewed = spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0);
            let duration = i64::from(spec.and_then(|s| s.lease_duration_seconds).unwrap_or(40).max(1));
            let alive = renewed.is_some_and(|r| now.duration_since(r) <= SignedDuration::from_secs(duration));
            (!alive).then(|| (l.name_any(), renewed))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn lease(node: &str, ns: &str, renewed: Option<&str>) -> Lease {
        let mut spec = json!({"holderIdentity": node, "leaseDurationSeconds": 40});
        if let Some(t) = renewed {
            spec["renewTime"] = json!(t);
        }
        serde_json::from_value(json!({"metadata": {"name": node, "namespace": ns}, "spec": spec})).unwrap()
    }

    #[test]
    fn one_read_of_the_leases_names_agents_silent_past_their_duration() {
        let now: Timestamp = "2026-06-01T12:00:00Z".parse().unwrap();
        let ns = AGENT_LEASE_NAMESPACE;
        let leases = [
            lease("fresh", ns, Some("2026-06-01T11:59:30.000000Z")),
            lease("edge", ns, Some("2026-06-01T11:59:20.000000Z")),
            lease("dead", ns, Some("2026-06-01T11:00:00.000000Z")),
            lease("never", ns, None),
            lease("elsewhere", "default", Some("2026-06-01T11:00:00.000000Z")),
        ];
        let got = from_leases(&leases, now);
        let want: NotReporting =
            [("dead".to_string(), Some("2026-06-01T11:00:00Z".parse().unwrap())), ("never".to_string(), None)].into();
        assert_eq!(got, want);
    }

    #[test]
    fn only_agents_judged_not_responding_are_published_and_a_new_pass_replaces_them() {
        let p = Published::default();
        let t: Timestamp = "2026-06-01T11:00:00Z".parse().unwrap();
        let dead = AgentHealth::NotResponding { since: Some(t) };
        let agents = [("a", AgentHealth::Alive), ("b", AgentHealth::Unproven), ("c", dead)];
        p.publish(agents.iter().map(|(n, h)| (*n, h)));
        assert_eq!(*p.get(), NotReporting::from([("c".to_string(), Some(t))]));
        p.publish([("c", &AgentHealth::Alive)].into_iter());
        assert!(p.get().is_empty());
        let text = SetAside { node: "c".into(), since: Some(t), held: 1 }.reason();
        assert_eq!(text, "node agent not reporting since 2026-06-01T11:00:00Z");
    }
}
