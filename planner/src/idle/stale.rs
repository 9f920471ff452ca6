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
//! - `Unproven` (the operator just started, or its lease watch just caught up) is not trusted
//!   blindly: before publishing, `idle::gate` judges it as one read does (`renewTime` older than
//!   `leaseDurationSeconds` by the operator's clock: not reporting), so a dead agent's summary is
//!   not read after a failover, and a live one's is (no flapping of the tenants' figures).
//! - `kubectl tessera idle` and `status` read the Leases once ([`from_leases`]): an agent is not
//!   reporting when its `renewTime` is older than its `leaseDurationSeconds` by the reader's
//!   clock (one read cannot watch a renewal; clock skew between the reader and the nodes shows
//!   as early or late verdicts). Where no Lease was read (RBAC, `--from` files without Leases),
//!   nothing is set aside; a node without a Lease among those read is not judged either (an
//!   export may hold only some).
//! - A live agent whose activity report is not current (sampling or writing has failed for more
//!   than two samples: a lost GPU's whole pass, an API server refusing its writes) says so on the
//!   same Lease renewal, as the annotation [`ACTIVITY_FAILING_SINCE`]; its node is set aside as a
//!   dead agent's, "since" being that time. Both the rollout pass's verdicts and the CLI's read
//!   of the Leases honour it. An annotation that does not parse still sets the node aside (its
//!   agent says the report is stale), with no time. The set-aside record's [`Cause`] tells a
//!   dead agent from a live one whose report is stale (their reasons read differently).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube_core::ResourceExt;
use serde::Serialize;
use tessera_crds::gpunode::{ACTIVITY_FAILING_SINCE, AGENT_LEASE_NAMESPACE};

use crate::liveness::AgentHealth;

/// Why a node's summary is set aside: a dead agent and a live one saying its report is stale
/// call for different fixes (restart the agent, or look at its GPU / API access).
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Cause {
    /// Its heartbeat Lease ran out, or was never renewed.
    AgentSilent,
    /// The agent renews its Lease and says its activity report is not current
    /// ([`ACTIVITY_FAILING_SINCE`]).
    ReportNotCurrent,
}

/// A node set aside: since when (the last heartbeat, or the time the agent gives; `None`: never
/// seen one, or an annotation that does not parse) and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Silence {
    pub since: Option<Timestamp>,
    pub cause: Cause,
}

impl Silence {
    /// The agent is silent (dead or hung) since its last heartbeat.
    pub fn silent(since: Option<Timestamp>) -> Self {
        Silence { since, cause: Cause::AgentSilent }
    }

    /// The agent is alive and says its report is not current.
    pub fn report_not_current(since: Option<Timestamp>) -> Self {
        Silence { since, cause: Cause::ReportNotCurrent }
    }
}

/// Nodes whose agents are not reporting.
pub type NotReporting = BTreeMap<String, Silence>;

/// A node whose summary the report set aside.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SetAside {
    pub node: String,
    /// The agent's last heartbeat, or since when it says its report is not current.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
    pub cause: Cause,
    /// Devices pods hold there, counted `unmeasured` for it.
    pub held: i64,
}

impl SetAside {
    /// `node agent not reporting since T`, for the CLI and the log.
    pub fn reason(&self) -> String {
        match (self.cause, self.since) {
            (Cause::AgentSilent, Some(t)) => format!("node agent not reporting since {t}"),
            (Cause::AgentSilent, None) => "node agent has never reported (no heartbeat)".into(),
            (Cause::ReportNotCurrent, Some(t)) => {
                format!("node agent says its activity report is not current since {t}")
            }
            (Cause::ReportNotCurrent, None) => {
                "node agent says its activity report is not current (annotation unreadable)".into()
            }
        }
    }
}

/// The rollout pass's verdicts, shared with the quota controller (the latest pass's only).
#[derive(Debug, Clone, Default)]
pub struct Published(Arc<Mutex<Arc<NotReporting>>>);

impl Published {
    /// Replaces the verdicts with those of `agents` (node name, its health, and its Lease for
    /// the agent's own word that its report is not current).
    pub fn publish<'a>(&self, agents: impl Iterator<Item = (&'a str, &'a AgentHealth, Option<&'a Lease>)>) {
        let next: NotReporting = agents
            .filter_map(|(node, h, lease)| match h {
                AgentHealth::NotResponding { since } => Some((node.to_string(), Silence::silent(*since))),
                _ => {
                    lease.and_then(activity_failing).map(|since| (node.to_string(), Silence::report_not_current(since)))
                }
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

/// Whether the agent says its activity report is not current, and since when (`Some(None)`: an
/// annotation that does not parse).
pub fn activity_failing(lease: &Lease) -> Option<Option<Timestamp>> {
    lease.annotations().get(ACTIVITY_FAILING_SINCE).map(|v| v.parse().ok())
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
            match alive {
                false => Some((l.name_any(), Silence::silent(renewed))),
                true => activity_failing(l).map(|since| (l.name_any(), Silence::report_not_current(since))),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn failing(mut l: Lease, since: &str) -> Lease {
        l.annotations_mut().insert(ACTIVITY_FAILING_SINCE.into(), since.into());
        l
    }

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
            failing(lease("stuck", ns, Some("2026-06-01T11:59:50.000000Z")), "2026-06-01T11:50:00Z"),
            failing(lease("garbled", ns, Some("2026-06-01T11:59:50.000000Z")), "yesterday"),
        ];
        let got = from_leases(&leases, now);
        let want: NotReporting = [
            ("dead".to_string(), Silence::silent(Some("2026-06-01T11:00:00Z".parse().unwrap()))),
            ("never".to_string(), Silence::silent(None)),
            ("stuck".to_string(), Silence::report_not_current(Some("2026-06-01T11:50:00Z".parse().unwrap()))),
            ("garbled".to_string(), Silence::report_not_current(None)),
        ]
        .into();
        assert_eq!(got, want);
    }

    #[test]
    fn only_agents_judged_not_responding_are_published_and_a_new_pass_replaces_them() {
        let p = Published::default();
        let t: Timestamp = "2026-06-01T11:00:00Z".parse().unwrap();
        let dead = AgentHealth::NotResponding { since: Some(t) };
        let agents = [("a", AgentHealth::Alive), ("b", AgentHealth::Unproven), ("c", dead)];
        p.publish(agents.iter().map(|(n, h)| (*n, h, None)));
        assert_eq!(*p.get(), NotReporting::from([("c".to_string(), Silence::silent(Some(t)))]));
        p.publish([("c", &AgentHealth::Alive, None)].into_iter());
        assert!(p.get().is_empty());
        let text = SetAside { node: "c".into(), since: Some(t), cause: Cause::AgentSilent, held: 1 }.reason();
        assert_eq!(text, "node agent not reporting since 2026-06-01T11:00:00Z");
    }

    #[test]
    fn a_live_agent_that_says_its_report_is_stale_is_set_aside_until_the_annotation_goes() {
        let p = Published::default();
        let since: Timestamp = "2026-06-01T11:50:00Z".parse().unwrap();
        let ns = AGENT_LEASE_NAMESPACE;
        let stuck = failing(lease("a", ns, Some("2026-06-01T11:59:50.000000Z")), "2026-06-01T11:50:00Z");
        for health in [AgentHealth::Alive, AgentHealth::Unproven] {
            p.publish([("a", &health, Some(&stuck))].into_iter());
            let want = Silence::report_not_current(Some(since));
            assert_eq!(*p.get(), NotReporting::from([("a".to_string(), want)]), "{health:?}");
        }
        // Current again: the renewal left the annotation out.
        let current = lease("a", ns, Some("2026-06-01T12:00:00.000000Z"));
        p.publish([("a", &AgentHealth::Alive, Some(&current))].into_iter());
        assert!(p.get().is_empty());
    }

    /// a live agent with a garbled annotation is not described as one that never
    /// reported, and the CLI tells a dead agent from a live one saying its report is stale.
    #[test]
    fn the_reason_tells_a_dead_agent_from_a_live_one_whose_report_is_stale() {
        let t: Timestamp = "2026-06-01T11:50:00Z".parse().unwrap();
        let ns = AGENT_LEASE_NAMESPACE;
        let garbled = failing(lease("g", ns, Some("2026-06-01T11:59:50.000000Z")), "yesterday");
        let p = Published::default();
        p.publish([("g", &AgentHealth::Alive, Some(&garbled))].into_iter());
        let set_aside =
            |node: &str, s: Silence| SetAside { node: node.into(), since: s.since, cause: s.cause, held: 1 };
        let text = set_aside("g", p.get()["g"]).reason();
        assert_eq!(text, "node agent says its activity report is not current (annotation unreadable)");
        let stuck = set_aside("s", Silence::report_not_current(Some(t))).reason();
        assert_eq!(stuck, "node agent says its activity report is not current since 2026-06-01T11:50:00Z");
        let never = set_aside("n", Silence::silent(None)).reason();
        assert_eq!(never, "node agent has never reported (no heartbeat)");
        let v = serde_json::to_value(set_aside("g", p.get()["g"])).unwrap();
        assert_eq!(v["cause"], "reportNotCurrent");
    }
}
