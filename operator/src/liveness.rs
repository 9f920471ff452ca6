//! Pure: whether a node agent is alive, from its heartbeat Lease. This is the kubelet's node-lease
//! pattern: the agent renews a small Lease in `tessera-node-leases`; nothing writes status per
//! heartbeat, and a hung agent (stuck in a driver call) stops renewing because its one loop does
//! both.

use crate::FastMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// A node agent's heartbeat as the operator judges it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentHealth {
    Alive,
    /// No renewal within the lease's duration; `since` is the last renewal, if there ever was one.
    NotResponding {
        since: Option<Timestamp>,
    },
}

impl AgentHealth {
    /// For status messages: "node agent not responding since ...".
    pub fn describe(&self) -> String {
        match self {
            AgentHealth::Alive => "node agent alive".into(),
            AgentHealth::NotResponding { since: Some(t) } => {
                format!("node agent not responding: its lease was last renewed at {t}")
            }
            AgentHealth::NotResponding { since: None } => {
                "node agent not responding: it has never renewed its heartbeat lease".into()
            }
        }
    }
}

/// What the operator last saw of one lease: its `renewTime`, and when (by the operator's own
/// clock) that value was first seen. Judging by the operator's clock, as the node lifecycle
/// controller does, makes clock skew between nodes irrelevant.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    renewed: Timestamp,
    at: Timestamp,
}

/// Agents' heartbeats as observed over time. Every lease seen for the first time (after an
/// operator start, say) gets a full lease duration of grace.
#[derive(Debug, Default)]
pub struct Liveness {
    seen: FastMap<String, Seen>,
}

impl Liveness {
    /// Alive while the lease's `renewTime` changed within `leaseDurationSeconds` of `now`.
    pub fn health(&mut self, node: &str, lease: Option<&Lease>, now: Timestamp) -> AgentHealth {
        self.judge(node, lease, now).0
    }

    /// [`Self::health`], and until when the agent stays alive if `lease` does not change: a pass
    /// need not look at an unchanged lease again before then.
    pub fn judge(&mut self, node: &str, lease: Option<&Lease>, now: Timestamp) -> (AgentHealth, Option<Timestamp>) {
        let spec = lease.and_then(|l| l.spec.as_ref());
        let Some(renewed) = spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0) else {
            self.seen.remove(node);
            return (AgentHealth::NotResponding { since: None }, None);
        };
        let seen = match self.seen.get_mut(node) {
            Some(seen) => seen,
            None => self.seen.entry(node.to_string()).or_insert(Seen { renewed, at: now }),
        };
        if seen.renewed != renewed {
            *seen = Seen { renewed, at: now };
        }
        let duration =
            SignedDuration::from_secs(i64::from(spec.and_then(|s| s.lease_duration_seconds).unwrap_or(40).max(1)));
        if now.duration_since(seen.at) <= duration {
            (AgentHealth::Alive, seen.at.checked_add(duration).ok())
        } else {
            (AgentHealth::NotResponding { since: Some(renewed) }, None)
        }
    }

    /// Forgets a node's lease (its node left the fleet).
    pub fn forget(&mut self, node: &str) {
        self.seen.remove(node);
    }

    /// Keeps only the nodes `present` says are still there.
    pub fn retain(&mut self, present: impl Fn(&str) -> bool) {
        self.seen.retain(|k, _| present(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lease(renewed: Option<&str>, seconds: i32) -> Lease {
        let mut spec = json!({"leaseDurationSeconds": seconds, "holderIdentity": "n1"});
        if let Some(t) = renewed {
            spec["renewTime"] = json!(t);
        }
        serde_json::from_value(json!({"metadata": {"name": "n1"}, "spec": spec})).unwrap()
    }

    fn at(t: &str) -> Timestamp {
        t.parse().unwrap()
    }

    #[test]
    fn alive_while_the_lease_keeps_changing_and_not_after_its_duration() {
        let mut l = Liveness::default();
        let first = lease(Some("2026-06-01T00:00:00.000000Z"), 40);
        assert_eq!(l.health("n1", Some(&first), at("2026-06-01T00:00:00Z")), AgentHealth::Alive);
        assert_eq!(l.health("n1", Some(&first), at("2026-06-01T00:00:40Z")), AgentHealth::Alive);
        let stale = l.health("n1", Some(&first), at("2026-06-01T00:00:41Z"));
        assert_eq!(stale, AgentHealth::NotResponding { since: Some(at("2026-06-01T00:00:00Z")) });
        assert!(stale.describe().contains("last renewed at 2026-06-01T00:00:00Z"));
        // A renewal brings it back.
        let renewed = lease(Some("2026-06-01T00:00:50.000000Z"), 40);
        assert_eq!(l.health("n1", Some(&renewed), at("2026-06-01T00:00:51Z")), AgentHealth::Alive);
    }

    #[test]
    fn alive_until_is_the_last_instant_an_unchanged_lease_keeps_the_agent_alive() {
        let mut l = Liveness::default();
        let first = lease(Some("2026-06-01T00:00:00.000000Z"), 40);
        let (health, until) = l.judge("n1", Some(&first), at("2026-06-01T00:00:05Z"));
        assert_eq!((health, until), (AgentHealth::Alive, Some(at("2026-06-01T00:00:45Z"))), "first seen at :05");
        // Judged again later with the same lease: the same deadline, and it holds to the instant.
        assert_eq!(l.judge("n1", Some(&first), at("2026-06-01T00:00:45Z")).1, Some(at("2026-06-01T00:00:45Z")));
        assert!(matches!(
            l.health("n1", Some(&first), at("2026-06-01T00:00:45.001Z")),
            AgentHealth::NotResponding { .. }
        ));
        assert_eq!(l.judge("n1", None, at("2026-06-01T00:00:46Z")).1, None, "no lease: no deadline");
    }

    #[test]
    fn the_agents_clock_does_not_matter_only_that_the_lease_changes() {
        let mut l = Liveness::default();
        // The agent's clock is an hour behind the operator's: still alive while it renews.
        for (i, t) in ["23:00:00", "23:00:10", "23:00:20"].iter().enumerate() {
            let lease = lease(Some(&format!("2026-05-31T{t}.000000Z")), 40);
            let now = at(&format!("2026-06-01T00:00:{:02}Z", i * 10));
            assert_eq!(l.health("n1", Some(&lease), now), AgentHealth::Alive);
        }
    }

    #[test]
    fn no_lease_or_no_renewal_is_not_responding() {
        let mut l = Liveness::default();
        let now = at("2026-06-01T00:01:00Z");
        assert_eq!(l.health("n1", None, now), AgentHealth::NotResponding { since: None });
        assert_eq!(l.health("n1", Some(&lease(None, 40)), now), AgentHealth::NotResponding { since: None });
    }
}
