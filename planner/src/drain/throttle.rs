//! Pure: when an eviction the API server answered 429 may be tried again. A throttle (API
//! priority and fairness, max-in-flight) or a PodDisruptionBudget whose status is behind says
//! when in `Retry-After` (and `details.retryAfterSeconds` of the Status body); asking sooner only
//! adds to the load that made it refuse. The drain is bounded per pass and requeues, so each pod
//! keeps a not-before time instead of a sleep.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kube_core::Status;

/// The longest wait a server's answer can impose: a bad header must not park a pod for hours
/// (the drain timeout still reports it meanwhile).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// How long to wait before asking again: the `Retry-After` header in seconds (the API server
/// sends seconds; an HTTP date is not read), else the body's `details.retryAfterSeconds`; at most
/// [`MAX_RETRY_AFTER`]. `None` (0 or neither): the next pass may try.
pub fn retry_after(header: Option<&str>, status: &Status) -> Option<Duration> {
    let from_header = header.and_then(|h| h.trim().parse::<u64>().ok());
    let from_body = status.details.as_ref().map(|d| u64::from(d.retry_after_seconds));
    let secs = from_header.or(from_body).filter(|s| *s > 0)?;
    Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER))
}

/// Per pod (`namespace`, `name`), the time before which its eviction is not tried again and the
/// refusal it got, said again meanwhile so the node's record does not flip every pass. Kept in
/// the operator's memory only: a restart, or another replica taking the lease, may ask once
/// more before the time (the server then says Retry-After again). Entries are dropped once due.
#[derive(Debug, Default)]
pub struct NotBefore(BTreeMap<(String, String), (Instant, String)>);

impl NotBefore {
    /// Records a refusal that asked to wait `after`.
    pub fn defer(&mut self, namespace: &str, pod: &str, now: Instant, after: Duration, refusal: String) {
        self.0.retain(|_, (until, _)| *until > now);
        self.0.insert((namespace.to_string(), pod.to_string()), (now + after, refusal));
    }

    /// The refusal still standing for this pod at `now`, if its time has not come.
    pub fn waiting(&mut self, namespace: &str, pod: &str, now: Instant) -> Option<String> {
        let key = (namespace.to_string(), pod.to_string());
        match self.0.get(&key) {
            Some((until, refusal)) if *until > now => Some(refusal.clone()),
            Some(_) => {
                self.0.remove(&key);
                None
            }
            None => None,
        }
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn status(v: serde_json::Value) -> Status {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_wait_is_the_servers_retry_after_header_else_its_body_bounded() {
        // API priority and fairness: a plain-text body, the wait only in the header.
        let plain = Status::failure("Too many requests, please try again later.", "").with_code(429);
        assert_eq!(retry_after(Some("7"), &plain), Some(Duration::from_secs(7)));
        // A Status body carrying retryAfterSeconds (and the header with the same).
        let body = status(json!({"code": 429, "message": "m", "details": {"retryAfterSeconds": 10}}));
        assert_eq!(retry_after(None, &body), Some(Duration::from_secs(10)));
        assert_eq!(retry_after(Some(" 3 "), &body), Some(Duration::from_secs(3)), "the header wins");
        // A PDB refusal asks for nothing: the next pass may try.
        let pdb = status(json!({"code": 429, "message": "m", "details": {"causes": [{"reason": "DisruptionBudget"}]}}));
        assert_eq!(retry_after(None, &pdb), None);
        assert_eq!(retry_after(Some("0"), &pdb), None);
        assert_eq!(retry_after(Some("Wed, 21 Oct 2026 07:28:00 GMT"), &pdb), None, "a date is not read");
        assert_eq!(retry_after(Some("86400"), &plain), Some(MAX_RETRY_AFTER));
    }

    #[test]
    fn a_pod_is_not_tried_again_before_its_time_and_its_refusal_stands_meanwhile() {
        let t0 = Instant::now();
        let mut nb = NotBefore::default();
        nb.defer("ml", "a", t0, Duration::from_secs(5), "eviction of ml/a refused (HTTP 429): busy".into());
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(nb.waiting("ml", "a", at(4)).as_deref(), Some("eviction of ml/a refused (HTTP 429): busy"));
        assert_eq!(nb.waiting("ml", "b", at(4)), None, "another pod is not held");
        assert_eq!(nb.waiting("other", "a", at(4)), None, "nor a namesake in another namespace");
        assert_eq!(nb.waiting("ml", "a", at(5)), None, "due at the time the server gave");
        assert!(nb.is_empty(), "forgotten once due");
        // Entries past their time do not pile up.
        nb.defer("ml", "a", t0, Duration::from_secs(1), "x".into());
        nb.defer("ml", "b", at(2), Duration::from_secs(1), "y".into());
        assert_eq!(nb.len(), 1);
    }
}
