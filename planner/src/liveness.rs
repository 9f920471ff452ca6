//! Pure: whether a node agent is alive, from its heartbeat Lease. This is the kubelet's node-lease
//! pattern: the agent renews a small Lease in `tessera-node-leases`; nothing writes status per
//! heartbeat, and a hung agent (stuck in a driver call) stops renewing because its one loop does
//! both.
//!
//! Nothing is judged from a lease the operator has not watched long enough: a lease first seen
//! (after an operator start or failover) is `Unproven` until it is seen renewing, and after the
//! lease watch was down (an API or watch outage) no agent is judged dead until the watch has
//! re-listed and a lease duration has passed since.

use crate::FastMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// A node agent's heartbeat as the operator judges it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentHealth {
    Alive,
    /// Not seen renewing yet (its lease first seen, or the lease watch only just caught up after
    /// an outage): no node is started or handed to it, but it is not reported dead either.
    Unproven,
    /// No renewal within the lease's duration; `since` is the last renewal, if there ever was one.
    NotResponding {
        since: Option<Timestamp>,
    },
}

impl AgentHealth {
    /// Judged dead (an unproven agent is not).
    pub fn is_not_responding(&self) -> bool {
        matches!(self, AgentHealth::NotResponding { .. })
    }

    /// For status messages: "node agent not responding since ...".
    pub fn describe(&self) -> String {
        match self {
            AgentHealth::Alive => "node agent alive".into(),
            AgentHealth::Unproven => "node agent not seen renewing its heartbeat lease yet".into(),
            AgentHealth::NotResponding { since: Some(t) } => {
                format!("node agent not responding: its lease was last renewed at {t}")
            }
            AgentHealth::NotResponding { since: None } => {
                "node agent not responding: it has never renewed its heartbeat lease".into()
            }
        }
    }
}

/// Where the lease watch stands: the operator judges agents by the lease changes it sees, so a
/// watch that is down (or has not re-listed since it was) shows silence that proves nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LeaseWatch {
    /// Not listed yet, or failed since its last re-list.
    #[default]
    Down,
    /// Its last re-list was in at this instant (the operator's clock), and nothing failed since.
    CaughtUp(Timestamp),
}

/// A lease watch's event as liveness reads it: only the end of a re-list says anything about the
/// leases that did not change. The runtime maps the watcher's events onto these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEvent {
    /// A re-list began.
    RelistStarted,
    /// A re-list is complete: the cache holds every lease as of now.
    RelistDone,
    /// One lease was listed, changed or deleted.
    Changed,
}

impl LeaseWatch {
    /// The watch after it delivered `event` (once the cache holds it): a re-list done after a
    /// failure (or the first) brings it up. Nothing else does: the kube watcher resumes a
    /// broken watch silently, and events alone say nothing of the leases that did not change.
    pub fn after_event(self, event: WatchEvent, now: Timestamp) -> Self {
        match (self, event) {
            (LeaseWatch::Down, WatchEvent::RelistDone) => LeaseWatch::CaughtUp(now),
            (watch, _) => watch,
        }
    }

    /// The watch after it failed: down until a re-list is in (see `controller::leases`).
    pub fn after_failure(self) -> Self {
        LeaseWatch::Down
    }
}

/// What the operator last saw of one lease: its `renewTime`, and when (by the operator's own
/// clock) that value was first seen. Judging by the operator's clock, as the node lifecycle
/// controller does, makes clock skew between nodes irrelevant.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    renewed: Timestamp,
    at: Timestamp,
    /// Seen changing: the agent renewed it while the operator watched.
    proven: bool,
    /// Judged not responding (through a caught-up watch): it stays so until the lease changes,
    /// so a later watch outage does not make a dead agent look merely unproven.
    dead: bool,
}

/// Agents' heartbeats as observed over time.
#[derive(Debug, Default)]
pub struct Liveness {
    seen: FastMap<String, Seen>,
}

impl Liveness {
    /// Alive while the lease's `renewTime` was seen changing within `leaseDurationSeconds` of
    /// `now`; not responding once neither that nor the watch's catch-up is that recent.
    pub fn health(&mut self, node: &str, lease: Option<&Lease>, now: Timestamp, watch: LeaseWatch) -> AgentHealth {
        self.judge(node, lease, now, watch).0
    }

    /// [`Self::health`], and until when the agent stays alive if `lease` does not change: a pass
    /// need not look at an unchanged lease again before then (`None`: look every pass).
    pub fn judge(
        &mut self,
        node: &str,
        lease: Option<&Lease>,
        now: Timestamp,
        watch: LeaseWatch,
    ) -> (AgentHealth, Option<Timestamp>) {
        let spec = lease.and_then(|l| l.spec.as_ref());
        let Some(renewed) = spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0) else {
            self.seen.remove(node);
            return (AgentHealth::NotResponding { since: None }, None);
        };
        let seen = match self.seen.get_mut(node) {
            Some(seen) => seen,
            None => self.seen.entry(node.to_string()).or_insert(Seen { renewed, at: now, proven: false, dead: false }),
        };
        if seen.renewed != renewed {
            *seen = Seen { renewed, at: now, proven: true, dead: false };
        }
        let duration =
            SignedDuration::from_secs(i64::from(spec.and_then(|s| s.lease_duration_seconds).unwrap_or(40).max(1)));
        let within = |from: Timestamp| now.duration_since(from) <= duration;
        if seen.dead {
            return (AgentHealth::NotResponding { since: Some(renewed) }, None);
        }
        if within(seen.at) {
            return match seen.proven {
                true => (AgentHealth::Alive, seen.at.checked_add(duration).ok()),
                false => (AgentHealth::Unproven, None),
            };
        }
        // Silent for a lease duration, as far as the cache shows: dead only if the watch showing
        // it has been caught up for a lease duration too.
        match watch {
            LeaseWatch::CaughtUp(since) if !within(since) => {
                seen.dead = true;
                (AgentHealth::NotResponding { since: Some(renewed) }, None)
            }
            _ => (AgentHealth::Unproven, None),
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

    /// A lease watch re-listed long before the tests' instants.
    fn up() -> LeaseWatch {
        LeaseWatch::CaughtUp(at("2026-05-01T00:00:00Z"))
    }

    fn renewed_at(t: &str) -> Lease {
        lease(Some(&format!("2026-06-01T{t}.000000Z")), 40)
    }

    #[test]
    fn alive_while_the_lease_keeps_changing_and_not_after_its_duration() {
        let mut l = Liveness::default();
        l.health("n1", Some(&renewed_at("00:00:00")), at("2026-06-01T00:00:00Z"), up());
        let first = renewed_at("00:00:01");
        assert_eq!(l.health("n1", Some(&first), at("2026-06-01T00:00:01Z"), up()), AgentHealth::Alive);
        assert_eq!(l.health("n1", Some(&first), at("2026-06-01T00:00:41Z"), up()), AgentHealth::Alive);
        let stale = l.health("n1", Some(&first), at("2026-06-01T00:00:42Z"), up());
        assert_eq!(stale, AgentHealth::NotResponding { since: Some(at("2026-06-01T00:00:01Z")) });
        assert!(stale.describe().contains("last renewed at 2026-06-01T00:00:01Z"));
        // A renewal brings it back.
        let renewed = renewed_at("00:00:50");
        assert_eq!(l.health("n1", Some(&renewed), at("2026-06-01T00:00:51Z"), up()), AgentHealth::Alive);
    }

    #[test]
    fn alive_until_is_the_last_instant_an_unchanged_lease_keeps_the_agent_alive() {
        let mut l = Liveness::default();
        l.judge("n1", Some(&renewed_at("00:00:00")), at("2026-06-01T00:00:00Z"), up());
        let first = renewed_at("00:00:04");
        let (health, until) = l.judge("n1", Some(&first), at("2026-06-01T00:00:05Z"), up());
        assert_eq!((health, until), (AgentHealth::Alive, Some(at("2026-06-01T00:00:45Z"))), "seen renewed at :05");
        // Judged again later with the same lease: the same deadline, and it holds to the instant.
        assert_eq!(l.judge("n1", Some(&first), at("2026-06-01T00:00:45Z"), up()).1, Some(at("2026-06-01T00:00:45Z")));
        assert!(matches!(
            l.health("n1", Some(&first), at("2026-06-01T00:00:45.001Z"), up()),
            AgentHealth::NotResponding { .. }
        ));
        assert_eq!(l.judge("n1", None, at("2026-06-01T00:00:46Z"), up()).1, None, "no lease: no deadline");
    }

    #[test]
    fn the_agents_clock_does_not_matter_only_that_the_lease_changes() {
        let mut l = Liveness::default();
        // The agent's clock is an hour behind the operator's: still alive while it renews.
        for (i, t) in ["23:00:00", "23:00:10", "23:00:20"].iter().enumerate() {
            let lease = lease(Some(&format!("2026-05-31T{t}.000000Z")), 40);
            let now = at(&format!("2026-06-01T00:00:{:02}Z", i * 10));
            let want = if i == 0 { AgentHealth::Unproven } else { AgentHealth::Alive };
            assert_eq!(l.health("n1", Some(&lease), now, up()), want);
        }
    }

    #[test]
    fn no_lease_or_no_renewal_is_not_responding() {
        let mut l = Liveness::default();
        let now = at("2026-06-01T00:01:00Z");
        assert_eq!(l.health("n1", None, now, up()), AgentHealth::NotResponding { since: None });
        assert_eq!(l.health("n1", Some(&lease(None, 40)), now, up()), AgentHealth::NotResponding { since: None });
    }

    /// An operator start or failover first sees every lease with a recent `renewTime`, whether
    /// or not its agent still renews it: a lease first seen proves nothing until seen renewing.
    #[test]
    fn a_lease_first_seen_is_unproven_until_seen_renewing_and_dead_a_lease_duration_later() {
        let mut l = Liveness::default();
        let first = renewed_at("00:00:00");
        let (health, until) = l.judge("n1", Some(&first), at("2026-06-01T00:00:05Z"), up());
        assert_eq!((health, until), (AgentHealth::Unproven, None), "judged again every pass until proven");
        assert!(AgentHealth::Unproven.describe().contains("not seen renewing"));
        assert_eq!(l.health("n1", Some(&first), at("2026-06-01T00:00:45Z"), up()), AgentHealth::Unproven);
        assert_eq!(
            l.health("n1", Some(&first), at("2026-06-01T00:00:45.001Z"), up()),
            AgentHealth::NotResponding { since: Some(at("2026-06-01T00:00:00Z")) },
            "never seen renewing: dead once its first sight is a lease duration old"
        );
        // Another agent renews after it was first seen: alive from then.
        l.judge("n2", Some(&first), at("2026-06-01T00:00:05Z"), up());
        let (health, until) = l.judge("n2", Some(&renewed_at("00:00:10")), at("2026-06-01T00:00:11Z"), up());
        assert_eq!((health, until), (AgentHealth::Alive, Some(at("2026-06-01T00:00:51Z"))));
    }

    /// Silence seen through a watch that was down proves nothing; the grace of a
    /// lease duration restarts from the moment the watch caught up.
    #[test]
    fn no_agent_is_judged_dead_from_a_lease_watch_that_is_down_or_only_just_caught_up() {
        let mut l = Liveness::default();
        let t = |s: &str| at(&format!("2026-06-01T{s}Z"));
        for n in ["a", "b", "c"] {
            l.judge(n, Some(&renewed_at("00:00:00")), t("00:00:00"), up());
        }
        for n in ["a", "b"] {
            assert_eq!(l.health(n, Some(&renewed_at("00:00:10")), t("00:00:10"), up()), AgentHealth::Alive);
        }
        // c never renewed: dead before the outage, and it stays so through it (no flapping).
        let c_dead = AgentHealth::NotResponding { since: Some(t("00:00:00")) };
        assert_eq!(l.health("c", Some(&renewed_at("00:00:00")), t("00:00:41"), up()), c_dead);
        // The watch goes down at :20; a and b's leases run out at :50 in its cache.
        let down = LeaseWatch::Down;
        assert_eq!(l.health("a", Some(&renewed_at("00:00:10")), t("00:00:30"), down), AgentHealth::Alive);
        assert_eq!(l.health("a", Some(&renewed_at("00:00:10")), t("00:01:30"), down), AgentHealth::Unproven);
        assert_eq!(l.health("c", Some(&renewed_at("00:00:00")), t("00:01:30"), down), c_dead);
        // Caught up (re-listed) at 02:00: a lease duration of grace from then.
        let back = LeaseWatch::CaughtUp(t("00:02:00"));
        assert_eq!(l.health("a", Some(&renewed_at("00:00:10")), t("00:02:00"), back), AgentHealth::Unproven);
        assert_eq!(l.health("b", Some(&renewed_at("00:02:05")), t("00:02:06"), back), AgentHealth::Alive);
        assert_eq!(l.health("a", Some(&renewed_at("00:00:10")), t("00:02:40"), back), AgentHealth::Unproven);
        assert_eq!(
            l.health("a", Some(&renewed_at("00:00:10")), t("00:02:40.001"), back),
            AgentHealth::NotResponding { since: Some(t("00:00:10")) }
        );
        assert_eq!(l.health("b", Some(&renewed_at("00:02:05")), t("00:02:45"), back), AgentHealth::Alive);
        assert_eq!(l.health("c", Some(&renewed_at("00:00:00")), t("00:02:10"), back), c_dead);
    }

    #[test]
    fn the_lease_watch_is_caught_up_only_once_a_relist_after_its_last_failure_is_in() {
        let t = |s: &str| at(&format!("2026-06-01T{s}Z"));
        let (init, done, apply) = (WatchEvent::RelistStarted, WatchEvent::RelistDone, WatchEvent::Changed);
        let mut w = LeaseWatch::default();
        assert_eq!(w, LeaseWatch::Down, "not listed yet");
        w = w.after_event(init, t("00:00:01"));
        assert_eq!(w, LeaseWatch::Down);
        w = w.after_event(done, t("00:00:02"));
        assert_eq!(w, LeaseWatch::CaughtUp(t("00:00:02")));
        w = w.after_event(apply, t("00:00:03")).after_event(init, t("00:00:04")).after_event(done, t("00:00:05"));
        assert_eq!(w, LeaseWatch::CaughtUp(t("00:00:02")), "a re-list without a failure changes nothing");
        w = w.after_failure();
        assert_eq!(w, LeaseWatch::Down);
        w = w.after_event(apply, t("00:00:10")).after_event(init, t("00:00:11"));
        assert_eq!(w, LeaseWatch::Down, "events alone, or a re-list begun, are not a catch-up");
        assert_eq!(w.after_event(done, t("00:00:12")), LeaseWatch::CaughtUp(t("00:00:12")));
    }
}
