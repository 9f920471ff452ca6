//! Pure: whether a node agent is alive, from its heartbeat Lease. This is the kubelet's node-lease
//! pattern: the agent renews a small Lease in `tessera-node-leases`; nothing writes status per
//! heartbeat, and a hung agent (stuck in a driver call) stops renewing because its one loop does
//! both.

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

/// Alive while `renewTime + leaseDurationSeconds` has not passed.
pub fn agent_health(lease: Option<&Lease>, now: Timestamp) -> AgentHealth {
    let Some(spec) = lease.and_then(|l| l.spec.as_ref()) else {
        return AgentHealth::NotResponding { since: None };
    };
    let Some(renewed) = spec.renew_time.as_ref().map(|t| t.0) else {
        return AgentHealth::NotResponding { since: None };
    };
    let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(40).max(1)));
    if now.duration_since(renewed) <= duration {
        AgentHealth::Alive
    } else {
        AgentHealth::NotResponding { since: Some(renewed) }
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

    #[test]
    fn alive_within_the_lease_duration_and_not_after() {
        let now: Timestamp = "2026-06-01T00:01:00Z".parse().unwrap();
        let fresh = lease(Some("2026-06-01T00:00:30.000000Z"), 40);
        assert_eq!(agent_health(Some(&fresh), now), AgentHealth::Alive);
        let stale = lease(Some("2026-06-01T00:00:10.000000Z"), 40);
        let since: Timestamp = "2026-06-01T00:00:10Z".parse().unwrap();
        assert_eq!(agent_health(Some(&stale), now), AgentHealth::NotResponding { since: Some(since) });
        assert!(agent_health(Some(&stale), now).describe().contains("last renewed at 2026-06-01T00:00:10Z"));
    }

    #[test]
    fn no_lease_or_no_renewal_is_not_responding() {
        let now: Timestamp = "2026-06-01T00:01:00Z".parse().unwrap();
        assert_eq!(agent_health(None, now), AgentHealth::NotResponding { since: None });
        assert_eq!(agent_health(Some(&lease(None, 40)), now), AgentHealth::NotResponding { since: None });
    }
}
