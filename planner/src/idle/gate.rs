//! When the quota controller computes an idle report, keeps the last one, or clears it.
//!
//! Decisions:
//! - No report before the rollout pass has published its first verdicts ([`Verdicts`]): until
//!   then a dead agent's last summary would be read as current (a false `TesseraSlicesIdle`
//!   after each operator start or failover, and `notReporting` flapping on the quotas). The
//!   quotas and the metrics keep what they had meanwhile.
//! - An agent the rollout pass calls `Unproven` (the operator has not watched its Lease for a
//!   lease duration yet) is judged for the report as one read of its Lease is
//!   ([`stale::from_leases`], the CLI's rule): `renewTime` older than `leaseDurationSeconds` by
//!   the operator's clock is not reporting. Trusting it would read a dead agent's summary for
//!   a lease duration after each start.
//! - Only a caught-up lease watch gives verdicts ([`Verdicts::publish`]): while it is down its
//!   cache holds old `renewTime`s, and judging them by the operator's clock would call every
//!   agent not reporting (every tenant's idle series gone, `notReporting` written to every quota
//!   then removed). No verdict means no report: the figures keep what they had.
//! - Verdicts expire ([`VERDICTS_MAX_AGE`]) and go with the leader lease ([`Verdicts::forget`]):
//!   while rollout passes are skipped (tenure not held) they would freeze while reports, and
//!   `tessera_operator_idle_report_timestamp_seconds`, kept refreshing. Old verdicts keep the
//!   figures instead, so the timestamp ages and the alert's staleness clause sees it.
//! - No quota left, or no node measuring anything: the tenants' figures and series are cleared
//!   (a deleted quota's `certain="true"` series would keep `TesseraSlicesIdle` firing).

use std::sync::{Arc, Mutex};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::stale::{self, NotReporting, Published};
use crate::liveness::{AgentHealth, LeaseWatch};

/// How old the verdicts may be for a report: the rollout pass publishes them every 2 s or so;
/// older ones mean its passes stopped (tenure not held, a pass stuck) and say nothing of now.
pub const VERDICTS_MAX_AGE: SignedDuration = SignedDuration::from_secs(120);

/// The rollout pass's verdicts, and when it last published usable ones.
#[derive(Debug, Clone, Default)]
pub struct Verdicts {
    published: Published,
    /// When the latest verdicts were published; `None`: none usable (none yet, the lease watch
    /// was down at the last pass, or the leader lease was lost since).
    at: Arc<Mutex<Option<Timestamp>>>,
}

impl Verdicts {
    /// Publishes one pass's verdicts: node name, its health, and its Lease (for `Unproven`).
    /// With the lease watch down, none: the cached Leases may be long out of date.
    pub fn publish<'a>(
        &self,
        agents: impl Iterator<Item = (&'a str, &'a AgentHealth, Option<&'a Lease>)>,
        now: Timestamp,
        watch: LeaseWatch,
    ) {
        if watch == LeaseWatch::Down {
            *self.at.lock().unwrap_or_else(|p| p.into_inner()) = None;
            return;
        }
        let judged: Vec<(&str, AgentHealth, Option<&Lease>)> =
            agents.map(|(n, h, l)| (n, for_report(n, h, l, now), l)).collect();
        self.published.publish(judged.iter().map(|(n, h, l)| (*n, h, *l)));
        *self.at.lock().unwrap_or_else(|p| p.into_inner()) = Some(now);
    }

    /// The latest verdicts at `now`; `None` when there are none usable, or they are older than
    /// [`VERDICTS_MAX_AGE`].
    pub fn get(&self, now: Timestamp) -> Option<Arc<NotReporting>> {
        let at = *self.at.lock().unwrap_or_else(|p| p.into_inner());
        at.filter(|at| now.duration_since(*at) <= VERDICTS_MAX_AGE).map(|_| self.published.get())
    }

    /// On losing the leader lease: none usable until a pass of the next tenure publishes.
    pub fn forget(&self) {
        *self.at.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// An agent's health as the idle report takes it: `Unproven` judged from its Lease alone.
fn for_report(node: &str, health: &AgentHealth, lease: Option<&Lease>, now: Timestamp) -> AgentHealth {
    match (health, lease) {
        // A live agent saying its report is stale is not dead: `Published` reads that itself.
        (AgentHealth::Unproven, Some(l)) => match stale::from_leases(std::slice::from_ref(l), now).remove(node) {
            Some(s) if s.cause == stale::Cause::AgentSilent => AgentHealth::NotResponding { since: s.since },
            _ => AgentHealth::Unproven,
        },
        (h, _) => h.clone(),
    }
}

/// What this pass does with the idle figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Compute a report (or reuse one computed within the refresh interval).
    Compute,
    /// Keep the quotas' and the metrics' figures as they are.
    Keep,
    /// Drop them: nothing left to report on.
    Clear,
}

/// Pure: the gate for a pass. `published`: the rollout pass's verdicts exist; `measured`: some
/// GpuNode carries an activity summary; `failed_recently`: the last pod list failed within the
/// refresh interval (not retried every pass).
pub fn gate(quotas: usize, published: bool, measured: bool, failed_recently: bool) -> Gate {
    if quotas == 0 || !measured {
        Gate::Clear
    } else if !published || failed_recently {
        Gate::Keep
    } else {
        Gate::Compute
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tessera_crds::gpunode::AGENT_LEASE_NAMESPACE;

    use super::*;

    fn lease(node: &str, renewed: &str) -> Lease {
        serde_json::from_value(json!({"metadata": {"name": node, "namespace": AGENT_LEASE_NAMESPACE},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": renewed}}))
        .unwrap()
    }

    #[test]
    fn nothing_to_report_on_clears_and_no_verdicts_yet_or_a_failed_list_keeps() {
        // (quotas, published, measured, failed recently)
        let table = [
            ((0, true, true, false), Gate::Clear),
            ((0, false, false, true), Gate::Clear),
            ((2, true, false, false), Gate::Clear),
            ((2, false, true, false), Gate::Keep),
            ((2, true, true, true), Gate::Keep),
            ((2, true, true, false), Gate::Compute),
        ];
        for ((q, p, m, f), want) in table {
            assert_eq!(gate(q, p, m, f), want, "quotas {q}, published {p}, measured {m}, failed {f}");
        }
    }

    fn at(t: &str) -> Timestamp {
        t.parse().unwrap()
    }

    fn up() -> LeaseWatch {
        LeaseWatch::CaughtUp(at("2026-05-01T00:00:00Z"))
    }

    #[test]
    fn no_verdicts_before_the_first_pass_publishes() {
        let v = Verdicts::default();
        let now = at("2026-06-01T12:00:00Z");
        assert!(v.get(now).is_none());
        v.publish(std::iter::empty(), now, up());
        assert_eq!(v.get(now).as_deref(), Some(&NotReporting::new()));
    }

    #[test]
    fn an_unproven_agent_is_judged_from_its_lease_by_the_operators_clock() {
        let now = at("2026-06-01T12:00:00Z");
        let (dead, fresh) =
            (lease("dead", "2026-06-01T11:00:00.000000Z"), lease("fresh", "2026-06-01T11:59:50.000000Z"));
        let unproven = AgentHealth::Unproven;
        let v = Verdicts::default();
        v.publish([("dead", &unproven, Some(&dead)), ("fresh", &unproven, Some(&fresh))].into_iter(), now, up());
        let since = at("2026-06-01T11:00:00Z");
        assert_eq!(
            *v.get(now).unwrap(),
            NotReporting::from([("dead".to_string(), stale::Silence::silent(Some(since)))])
        );
    }

    /// a broken lease watch leaves every cached `renewTime` behind the operator's
    /// clock; judged from them, every agent would be set aside.
    #[test]
    fn a_lease_watch_that_is_down_gives_no_verdicts_so_the_figures_are_kept() {
        let now = at("2026-06-01T12:00:00Z");
        let cached = lease("a", "2026-06-01T11:58:00.000000Z");
        let (alive, unproven) = (AgentHealth::Alive, AgentHealth::Unproven);
        let v = Verdicts::default();
        v.publish([("a", &alive, Some(&cached))].into_iter(), at("2026-06-01T11:59:58Z"), up());
        assert_eq!(v.get(now).as_deref(), Some(&NotReporting::new()));
        v.publish([("a", &unproven, Some(&cached))].into_iter(), now, LeaseWatch::Down);
        assert!(v.get(now).is_none(), "no verdicts: the gate keeps the figures");
        assert_eq!(gate(1, v.get(now).is_some(), true, false), Gate::Keep);
        // Re-listed just now: the Lease read is current, an unproven agent is judged from it.
        let relisted = lease("a", "2026-06-01T12:00:05.000000Z");
        let later = at("2026-06-01T12:00:06Z");
        v.publish([("a", &unproven, Some(&relisted))].into_iter(), later, LeaseWatch::CaughtUp(later));
        assert_eq!(v.get(later).as_deref(), Some(&NotReporting::new()));
    }

    /// verdicts of a lost tenure, or of passes that stopped, say nothing of now.
    #[test]
    fn verdicts_expire_and_go_with_the_leader_lease() {
        let t0 = at("2026-06-01T12:00:00Z");
        let dead = AgentHealth::NotResponding { since: Some(at("2026-06-01T11:00:00Z")) };
        let v = Verdicts::default();
        v.publish([("a", &dead, None)].into_iter(), t0, up());
        let max = t0.checked_add(VERDICTS_MAX_AGE).unwrap();
        assert!(v.get(max).is_some(), "still fresh at the limit");
        assert!(v.get(max.checked_add(SignedDuration::from_secs(1)).unwrap()).is_none(), "too old");
        v.publish([("a", &dead, None)].into_iter(), max, up());
        assert!(v.get(max).is_some(), "a new pass refreshes them");
        v.forget();
        assert!(v.get(max).is_none(), "gone with the lease");
        let shared = v.clone();
        shared.publish(std::iter::empty(), max, up());
        assert_eq!(v.get(max).as_deref(), Some(&NotReporting::new()), "a clone shares them");
    }
}
