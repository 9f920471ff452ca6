//! Whether the activity report is current, as the heartbeat Lease announces it
//! (`tessera.dev/activity-failing-since`): since when the stored summary has been left behind.

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::writer::Writer;

/// A report not current for longer than this many samples is announced (a passing failure,
/// retried on the next sample, is not).
pub const FAILING_AFTER_SAMPLES: u32 = 2;

impl Writer {
    /// Since when the activity report has not been current, once that has lasted longer than
    /// [`FAILING_AFTER_SAMPLES`] samples at `now`: the heartbeat Lease carries it, and the
    /// operator sets the node's summary aside as a dead agent's.
    pub fn failing_since(&self, now: Timestamp) -> Option<Timestamp> {
        let grace =
            SignedDuration::try_from(self.sample_interval * FAILING_AFTER_SAMPLES).unwrap_or(SignedDuration::MAX);
        self.failing_rebased(now).filter(|since| now.duration_since(*since) > grace)
    }

    /// A pass ended at `now`, leaving the stored summary `current` or not: a failure starts
    /// [`Writer::failing`] (kept from its first pass, moved back by a clock step), a current
    /// report clears it.
    pub fn passed(&mut self, now: Timestamp, current: bool) {
        self.failing = if current { None } else { self.failing_rebased(now).or(Some(now)) };
        // The last current pass moves back by a step too, so the Lease never says the report
        // was current later than it began to fail.
        let step = self.step_back(now);
        self.current_at =
            if current { Some(now) } else { self.current_at.map(|at| at.checked_sub(step).unwrap_or(at)) };
        self.last_pass = Some(now);
    }

    /// Until when the stored summary is known current, for the heartbeat Lease's
    /// `activity-current-until`: this run's last current pass, or, until it has one (not seeded,
    /// or failing since it seeded), what the previous run said, copied through: a renewal alone
    /// must not make a report nobody brought up to date current for the next run.
    pub fn current_until(&self) -> Option<Timestamp> {
        self.current_at.or_else(|| self.previous.and_then(|p| p.kept()))
    }

    /// [`Writer::failing`] as of `now`: when the clock reads earlier than the last pass it
    /// stepped back, and the failure moves back by as much, as the tracker moves `idleSince`
    /// (`History::rebase`): the step counts as no time, so the failure is announced after the
    /// usual grace, not late by the size of the step, and never lies in the future.
    fn failing_rebased(&self, now: Timestamp) -> Option<Timestamp> {
        let step = self.step_back(now);
        self.failing.map(|since| since.checked_sub(step).unwrap_or(since))
    }

    /// How far the clock stepped back since the last pass (zero when it did not).
    fn step_back(&self, now: Timestamp) -> SignedDuration {
        self.last_pass.map_or(SignedDuration::ZERO, |at| at.duration_since(now).max(SignedDuration::ZERO))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn a_failure_is_announced_after_two_samples_and_ends_with_a_current_pass() {
        let mut w = Writer::default();
        w.passed(t(0), true);
        w.passed(t(30), false);
        w.passed(t(60), false);
        assert_eq!(w.failing_since(t(90)), None, "two samples: a passing failure");
        w.passed(t(91), false);
        assert_eq!(w.failing_since(t(91)), Some(t(30)), "past two samples: since the first");
        w.passed(t(120), true);
        assert_eq!(w.failing_since(t(150)), None);
    }

    #[test]
    fn only_a_current_pass_of_this_run_moves_current_until_forward() {
        use super::super::previous::{Failing, PreviousRun};
        let mut w = Writer::default();
        assert_eq!(w.current_until(), None, "nothing known");
        w.previous = Some(PreviousRun { renewed: Some(t(-30)), failing: Failing::No, current: Some(Some(t(-7200))) });
        assert_eq!(w.current_until(), Some(t(-7200)), "not seeded: copied through, not the heartbeat");
        w.passed(t(0), false);
        assert_eq!(w.current_until(), Some(t(-7200)), "a failed pass moves nothing");
        w.passed(t(30), true);
        assert_eq!(w.current_until(), Some(t(30)), "a current pass");
        w.passed(t(60), false);
        assert_eq!(w.current_until(), Some(t(30)), "failing since: current until the last current pass");
    }

    #[test]
    fn a_clock_stepped_back_moves_the_failure_back_as_the_tracker_moves_idle_since() {
        // Failing since 0; after the pass at 30 the clock steps back an hour. As in
        // `History::rebase`, the step counts as no time: the failure keeps the 30 s it had, so
        // it is announced once it has lasted two samples as usual, not an hour late.
        let step = 3600;
        let mut w = Writer::default();
        w.passed(t(0), false);
        w.passed(t(30), false);
        // A renewal before the next pass: 30 s of failing, not announced yet.
        assert_eq!(w.failing_since(t(45 - step)), None);
        w.passed(t(60 - step), false);
        assert_eq!(w.failing_since(t(90 - step)), None, "60 s: two samples, not past them");
        assert_eq!(w.failing_since(t(91 - step)), Some(t(30 - step)), "past two samples");
        w.passed(t(90 - step), false);
        assert_eq!(w.failing_since(t(120 - step)), Some(t(30 - step)), "the same since, pass after pass");
        // A current pass still clears it; a step with nothing failing announces nothing.
        w.passed(t(120 - step), true);
        w.passed(t(150 - 2 * step), true);
        assert_eq!(w.failing_since(t(300 - 2 * step)), None);
    }

    #[test]
    fn a_clock_stepped_back_moves_the_last_current_pass_back_with_the_failure() {
        // Current at 0; the clock steps back an hour, then every pass fails.
        let step = 3600;
        let mut w = Writer::default();
        w.passed(t(0), true);
        for at in [30, 60, 90] {
            w.passed(t(at - step), false);
        }
        let since = w.failing_since(t(91 - step)).expect("announced");
        assert_eq!(w.current_until(), Some(t(30 - step)), "moved back by the step (3570 s: the step is no time)");
        assert!(w.current_until().unwrap() <= since, "current until {:?}, failing since {since}", w.current_until());
    }
}
