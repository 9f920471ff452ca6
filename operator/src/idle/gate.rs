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
//! - No quota left, or no node measuring anything: the tenants' figures and series are cleared
//!   (a deleted quota's `certain="true"` series would keep `TesseraSlicesIdle` firing).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;

use super::stale::{self, NotReporting, Published};
use crate::liveness::AgentHealth;

/// The rollout pass's verdicts, and whether it has published any yet.
#[derive(Debug, Clone, Default)]
pub struct Verdicts {
    published: Published,
    once: Arc<AtomicBool>,
}

impl Verdicts {
    /// Publishes one pass's verdicts: node name, its health, and its Lease (for `Unproven`).
    pub fn publish<'a>(
        &self,
        agents: impl Iterator<Item = (&'a str, &'a AgentHealth, Option<&'a Lease>)>,
        now: Timestamp,
    ) {
        let judged: Vec<(&str, AgentHealth, Option<&Lease>)> =
            agents.map(|(n, h, l)| (n, for_report(n, h, l, now), l)).collect();
        self.published.publish(judged.iter().map(|(n, h, l)| (*n, h, *l)));
        self.once.store(true, Ordering::Release);
    }

    /// The latest verdicts; `None` before the first pass published any.
    pub fn get(&self) -> Option<Arc<NotReporting>> {
        self.once.load(Ordering::Acquire).then(|| self.published.get())
    }
}

/// An agent's health as the idle report takes it: `Unproven` judged from its Lease alone.
fn for_report(node: &str, health: &AgentHealth, lease: Option<&Lease>, now: Timestamp) -> AgentHealth {
    match (health, lease) {
        (AgentHealth::Unproven, Some(l)) => match stale::from_leases(std::slice::from_ref(l), now).remove(node) {
            Some(since) => AgentHealth::NotResponding { since },
            None => AgentHealth::Unproven,
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

    #[test]
    fn no_verdicts_before_the_first_pass_publishes() {
        let v = Verdicts::default();
        assert!(v.get().is_none());
        let now: Timestamp = "2026-06-01T12:00:00Z".parse().unwrap();
        v.publish(std::iter::empty(), now);
        assert_eq!(v.get().as_deref(), Some(&NotReporting::new()));
    }

    #[test]
    fn an_unproven_agent_is_judged_from_its_lease_by_the_operators_clock() {
        let now: Timestamp = "2026-06-01T12:00:00Z".parse().unwrap();
        let (dead, fresh) =
            (lease("dead", "2026-06-01T11:00:00.000000Z"), lease("fresh", "2026-06-01T11:59:50.000000Z"));
        let unproven = AgentHealth::Unproven;
        let v = Verdicts::default();
        v.publish([("dead", &unproven, Some(&dead)), ("fresh", &unproven, Some(&fresh))].into_iter(), now);
        let since: Timestamp = "2026-06-01T11:00:00Z".parse().unwrap();
        assert_eq!(*v.get().unwrap(), NotReporting::from([("dead".to_string(), Some(since))]));
    }
}
