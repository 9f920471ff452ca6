//! How long this replica may still write as the leader, on its own clock. The lease manager says
//! a lease is lost only once it has read the Lease again and found another holder, and it reads
//! it only when it renews: while renewals fail (an API server slow or out of reach for this
//! replica, a stalled process) it goes on saying "leader" after the lease ran out and another
//! replica took over. The other replica decides from a read made after it took the lease (see
//! `controller::takeover`), so a write of ours after that read goes unseen: a second start of a
//! node, an orphan check undoing a cordon mid-drain, `maxUnavailable` exceeded. So every write
//! of a pass first checks the renewal this replica last saw of its own Lease.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};

use crate::cache::{Cache, keep};

/// The leader Lease's duration: another replica takes it this long after the last renewal.
pub const LEASE_SECONDS: u64 = 30;
/// The leader renews this long before the lease runs out.
/// 15 s: a renewal queued behind a busy API server (priority and fairness) still lands well
/// before [`MARGIN`] stops a healthy leader's writes.
pub const RENEW_BEFORE_SECONDS: u64 = 15;
/// The leader stops writing this long before its lease runs out: room for clock skew between
/// replicas and for a write already sent. Less than [`RENEW_BEFORE_SECONDS`], so a renewal that
/// succeeds reaches our watch before the writes stop.
pub const MARGIN: Duration = Duration::from_secs(5);

/// Until when this replica may write (milliseconds since the epoch; 0: not now).
#[derive(Debug)]
pub struct Tenure(AtomicU64);

impl Default for Tenure {
    /// Without leader election: always.
    fn default() -> Self {
        Tenure(AtomicU64::new(u64::MAX))
    }
}

impl Tenure {
    pub fn set(&self, until: Option<SystemTime>) {
        let millis = until.and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map_or(0, |d| d.as_millis());
        self.0.store(u64::try_from(millis).unwrap_or(u64::MAX), Ordering::Release);
    }

    /// Whether a write may start at `now`.
    pub fn holds(&self, now: SystemTime) -> bool {
        self.remaining(now).is_none_or(|left| !left.is_zero())
    }

    /// How long from `now` the tenure still holds: `None` without leader election (always),
    /// zero once it lapsed. A write started under the tenure must be answered within it.
    pub fn remaining(&self, now: SystemTime) -> Option<Duration> {
        let until = self.0.load(Ordering::Acquire);
        if until == u64::MAX {
            return None;
        }
        let now = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
        Some(Duration::from_millis(until.saturating_sub(u64::try_from(now).unwrap_or(u64::MAX))))
    }
}

/// Until when `lease` lets `identity` write: its last renewal (written with this replica's own
/// clock when it is the holder) plus its duration, less [`MARGIN`]. `None` if another replica
/// or nobody holds it, or it says no renewal or duration.
pub fn valid_until(lease: &Lease, identity: &str) -> Option<SystemTime> {
    let spec = lease.spec.as_ref()?;
    if spec.holder_identity.as_deref() != Some(identity) {
        return None;
    }
    let renewed: SystemTime = spec.renew_time.as_ref()?.0.into();
    let duration = Duration::from_secs(u64::try_from(spec.lease_duration_seconds?).ok()?);
    (renewed + duration).checked_sub(MARGIN)
}

/// Keeps `tenure` at what the Lease `name` says for `identity`, from a watch of it. A watch
/// that lags shows an older renewal: the writes stop early, never late.
pub fn follow(api: Api<Lease>, name: &str, identity: String, tenure: Arc<Tenure>) {
    tenure.set(None);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let events = watcher(api, config).default_backoff();
    // Read as it arrives, not from the store (which holds only this Lease); untrimmed, as read.
    let cache =
        Cache { trim: |_| {}, failed: "leader lease watch error; retrying with backoff", ..Cache::waking(vec![]) };
    tokio::spawn(keep(events, reflector::store().1, cache, move |event| {
        if let Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) = event {
            tenure.set(valid_until(lease, &identity));
        }
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn lease(holder: &str, renewed: SystemTime) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                renew_time: Some(MicroTime(renewed.try_into().unwrap())),
                lease_duration_seconds: Some(LEASE_SECONDS as i32),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_leader_whose_renewals_fail_stops_writing_before_another_can_take_the_lease() {
        let renewed = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let tenure = Tenure::default();
        tenure.set(valid_until(&lease("me", renewed), "me"));
        let at = |s: u64| renewed + Duration::from_secs(s);
        assert!(tenure.holds(at(RENEW_BEFORE_SECONDS + 1)), "the renewal is due but the lease runs a while yet");
        assert!(!tenure.holds(at(LEASE_SECONDS) - MARGIN), "no renewal seen: writes stop before the lease runs out");
        assert!(!tenure.holds(at(LEASE_SECONDS)), "another replica may hold it now");
        tenure.set(valid_until(&lease("me", at(20)), "me"));
        assert!(tenure.holds(at(LEASE_SECONDS)), "a renewal seen: writes go on");
    }

    #[test]
    fn a_lease_of_another_or_without_a_renewal_allows_no_write() {
        let now = SystemTime::now();
        let tenure = Tenure::default();
        assert!(tenure.holds(now), "without leader election: always");
        tenure.set(valid_until(&lease("other", now), "me"));
        assert!(!tenure.holds(now - Duration::from_secs(60)));
        let mut unrenewed = lease("me", now);
        unrenewed.spec.as_mut().unwrap().renew_time = None;
        assert_eq!(valid_until(&unrenewed, "me"), None);
        assert!(MARGIN < Duration::from_secs(RENEW_BEFORE_SECONDS), "a renewal lands before the writes stop");
    }
}
