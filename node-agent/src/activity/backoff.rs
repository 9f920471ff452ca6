//! Spacing of the activity write's retries while the API server refuses it. Counted in samples,
//! not read from a clock, so it is pure: after the n-th failure in a row the next try waits
//! 2^(n-1) samples (30 s, 1 min, 2 min ... at the default 30 s sample), at most
//! [`MAX_BACKOFF`]'s worth; one success starts over. Nothing is queued meanwhile: the try that
//! comes writes the summary of its own sample.

use std::time::Duration;

/// The longest wait between two tries of a failing write.
pub const MAX_BACKOFF: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Backoff {
    /// Failures in a row.
    failures: u32,
    /// Samples still to let pass before the next try.
    skip: u64,
}

impl Backoff {
    /// Whether this sample may try the write. A sample that may not is counted off the wait.
    pub fn try_now(&mut self) -> bool {
        if self.skip == 0 {
            return true;
        }
        self.skip -= 1;
        false
    }

    /// The try failed: wait twice as long as last time, at most `MAX_BACKOFF` at `sample`.
    pub fn failed(&mut self, sample: Duration) {
        self.failures = self.failures.saturating_add(1);
        let cap = (MAX_BACKOFF.as_secs() / sample.as_secs().max(1)).max(1);
        let wait = 1u64.checked_shl(self.failures - 1).unwrap_or(u64::MAX).min(cap);
        self.skip = wait - 1;
    }

    /// The try went through: the next failure waits one sample again.
    pub fn succeeded(&mut self) {
        *self = Self::default();
    }

    /// Failures in a row (for the log).
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives `b` over `samples` samples against a write that fails while `fails(i)`: the
    /// samples at which a write was tried.
    fn tries(b: &mut Backoff, sample: Duration, samples: u64, fails: impl Fn(u64) -> bool) -> Vec<u64> {
        let mut out = Vec::new();
        for i in 0..samples {
            if !b.try_now() {
                continue;
            }
            out.push(i);
            match fails(i) {
                true => b.failed(sample),
                false => b.succeeded(),
            }
        }
        out
    }

    #[test]
    fn a_write_that_keeps_failing_is_tried_ten_times_an_hour_not_at_every_sample() {
        let mut b = Backoff::default();
        let thirty = Duration::from_secs(30);
        // An hour of 30 s samples: 30 s, 1, 2, 4, 8 min, then every 10 min.
        let got = tries(&mut b, thirty, 120, |_| true);
        assert_eq!(got, vec![0, 1, 3, 7, 15, 31, 51, 71, 91, 111]);
        assert_eq!(b.failures(), 10);
        // The wait never grows past 10 min, however long it fails.
        let mut long = Backoff::default();
        let got = tries(&mut long, thirty, 10_000, |_| true);
        assert!(got.windows(2).all(|w| w[1] - w[0] <= 20), "{got:?}");
        assert!(got.windows(2).any(|w| w[1] - w[0] == 20));
    }

    #[test]
    fn a_success_starts_the_wait_over_and_a_fast_sample_keeps_the_ten_minute_cap() {
        let thirty = Duration::from_secs(30);
        let mut b = Backoff::default();
        // Fails four times (samples 0, 1, 3, 7), then goes through at 15; fails again from 16.
        let got = tries(&mut b, thirty, 20, |i| i != 15);
        assert_eq!(got, vec![0, 1, 3, 7, 15, 16, 17, 19]);
        // At 2 s samples (the demo) the cap is 300 samples, still 10 minutes.
        let mut fast = Backoff::default();
        let got = tries(&mut fast, Duration::from_secs(2), 2_000, |_| true);
        assert_eq!(got.windows(2).map(|w| w[1] - w[0]).max(), Some(300));
        // A sample longer than the cap: every sample tries.
        let mut slow = Backoff::default();
        assert_eq!(tries(&mut slow, Duration::from_secs(900), 4, |_| true), vec![0, 1, 2, 3]);
    }
}
