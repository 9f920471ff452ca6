//! What the agent's previous run left on its heartbeat Lease, read once per run before this run
//! first renews it (the renewal overwrites them): its `tessera.dev/activity-current-until`
//! annotation (until when a run that had seeded kept the report current; a Lease of an agent
//! before it has only `renewTime`, the last moment it was alive) and its
//! `tessera.dev/activity-failing-since` annotation. They tell a restarted agent
//! how long nobody kept the stored summary current (an idle stretch must not span an outage no
//! run observed), and that the report it takes over is stale (so the annotation, and the
//! operator's setting the summary aside, survive the restart).

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use tessera_crds::gpunode::{ACTIVITY_CURRENT_UNTIL, ACTIVITY_FAILING_SINCE};

/// The previous run's report, as its Lease announced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failing {
    /// Current (no annotation).
    No,
    Since(Timestamp),
    /// An annotation that does not parse (no agent writes one).
    Unreadable,
}

/// The previous run as its heartbeat Lease left it; `Default`: no Lease (a first run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreviousRun {
    /// Its last heartbeat.
    pub renewed: Option<Timestamp>,
    pub failing: Failing,
    /// Its `activity-current-until` annotation: `None` absent (an agent before it), `Some(None)`
    /// unknown (`unknown`, or does not parse).
    pub current: Option<Option<Timestamp>>,
}

impl Default for PreviousRun {
    fn default() -> Self {
        Self { renewed: None, failing: Failing::No, current: None }
    }
}

impl PreviousRun {
    pub fn from_lease(lease: Option<&Lease>) -> Self {
        let Some(lease) = lease else { return Self::default() };
        let renewed = lease.spec.as_ref().and_then(|s| s.renew_time.as_ref()).map(|t| t.0);
        let annotations = lease.metadata.annotations.as_ref();
        let failing = match annotations.and_then(|a| a.get(ACTIVITY_FAILING_SINCE)) {
            None => Failing::No,
            Some(v) => v.parse().map_or(Failing::Unreadable, Failing::Since),
        };
        let current = annotations.and_then(|a| a.get(ACTIVITY_CURRENT_UNTIL)).map(|v| v.parse().ok());
        Self { renewed, failing, current }
    }

    /// Until when the stored summary (measured at `measured_at`) is known current: as the
    /// previous run's `activity-current-until` says; at least until it was measured. `None`:
    /// not known at all.
    pub fn current_until(&self, measured_at: Option<Timestamp>) -> Option<Timestamp> {
        self.kept().max(measured_at)
    }

    /// Until when the previous run says it kept the report current, apart from `measuredAt`
    /// (what an unseeded run copies through). A Lease without `activity-current-until` (an agent
    /// before it): until its last heartbeat, or, announcing it stale, until the failure began.
    pub fn kept(&self) -> Option<Timestamp> {
        if let Some(current) = self.current {
            return current;
        }
        match self.failing {
            Failing::No => self.renewed,
            Failing::Since(since) => Some(since),
            Failing::Unreadable => None,
        }
    }

    /// The stale report this run takes over, since when: the announced time, or for an
    /// unreadable annotation the previous run's last heartbeat (it was stale then at least).
    pub fn failing_since(&self) -> Option<Timestamp> {
        match self.failing {
            Failing::No => None,
            Failing::Since(since) => Some(since),
            Failing::Unreadable => self.renewed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn lease(renewed: Option<i64>, annotation: Option<&str>) -> Lease {
        let mut l: Lease = serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}, "spec": {}})).unwrap();
        l.spec.as_mut().unwrap().renew_time =
            renewed.map(|s| k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(t(s)));
        if let Some(a) = annotation {
            l.metadata.annotations = Some([(ACTIVITY_FAILING_SINCE.to_string(), a.to_string())].into());
        }
        l
    }

    fn with_until(mut l: Lease, until: &str) -> Lease {
        l.metadata.annotations.get_or_insert_default().insert(ACTIVITY_CURRENT_UNTIL.to_string(), until.to_string());
        l
    }

    #[test]
    fn the_lease_says_until_when_the_stored_summary_was_current_and_whether_it_was_stale() {
        let since = t(-600).to_string();
        // (case, lease, measuredAt, want current_until, want failing since)
        type Case = (&'static str, Option<Lease>, Option<i64>, Option<i64>, Option<i64>);
        let cases: [Case; 9] = [
            ("no Lease (a first run): only the summary's time", None, Some(-7200), Some(-7200), None),
            ("alive and current until its last heartbeat", Some(lease(Some(-30), None)), Some(-7200), Some(-30), None),
            (
                "stale since 10 min: current until then",
                Some(lease(Some(-30), Some(&since))),
                Some(-7200),
                Some(-600),
                Some(-600),
            ),
            (
                "stale since before the summary: the summary's time",
                Some(lease(Some(-30), Some(&since))),
                Some(-60),
                Some(-60),
                Some(-600),
            ),
            (
                "an unreadable annotation: the summary's time, stale since the last heartbeat",
                Some(lease(Some(-30), Some("soon"))),
                Some(-7200),
                Some(-7200),
                Some(-30),
            ),
            ("nothing known", Some(lease(None, None)), None, None, None),
            (
                "renewed by a run that never brought it current: until what that run copied through",
                Some(with_until(lease(Some(-30), None), &t(-7000).to_string())),
                Some(-7200),
                Some(-7000),
                None,
            ),
            (
                "current-until unknown: the summary's time only, not the heartbeat",
                Some(with_until(lease(Some(-30), None), "unknown")),
                Some(-7200),
                Some(-7200),
                None,
            ),
            (
                "current-until beside a failure: current-until",
                Some(with_until(lease(Some(-30), Some(&since)), &t(-900).to_string())),
                Some(-7200),
                Some(-900),
                Some(-600),
            ),
        ];
        for (name, l, measured, want_until, want_failing) in cases {
            let p = PreviousRun::from_lease(l.as_ref());
            assert_eq!(p.current_until(measured.map(t)), want_until.map(t), "{name}: current until");
            assert_eq!(p.failing_since(), want_failing.map(t), "{name}: failing since");
        }
    }
}
