//! When a namespace's limits came into force: the stamp [`IN_FORCE_SINCE`] on each ResourceQuota
//! Tessera writes, the source of the params' `<ns>.since`. The API server's quota admission
//! enforces `status.hard`, which the controller manager copies from `spec.hard` a moment after a
//! write; a claim created in between is counted by nothing. Its creation time is after the
//! ResourceQuota's, so `since` must be a time at which `status.hard` was already in force: the
//! first pass that sees the planned limits in force stamps the latest write the API server
//! recorded on the object (its `managedFields` times: the status write that synced `hard` is
//! among them, so neither clock skew nor the operator's lag enters). Classes open, and the
//! namespace leaves `_pending`, only once the stamp is cached (a pass later), so no claim is
//! admitted through an open class before `since`. On the ResourceQuota itself, so a restarted
//! operator finds it; every later apply carries it unchanged (server-side apply would drop it).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};
use k8s_openapi::jiff::Timestamp;

/// The annotation: RFC3339, UTC, to the second.
pub const IN_FORCE_SINCE: &str = "tessera.dev/limits-in-force-since";

/// `t` as the stamp and `<ns>.since` write it: RFC3339 in UTC, to the second (what
/// `creationTimestamp` has, which the claim policy compares it with).
pub fn format(t: Timestamp) -> String {
    Timestamp::from_second(t.as_second()).unwrap_or(t).to_string()
}

/// The stamp `rq` carries, if it is one the operator could have written: [`format`]ted exactly
/// and not before the ResourceQuota's creation. Anything else counts as none and is stamped again:
/// a hand-written value never reaches the policy's `timestamp()` (an error there would refuse
/// every claim write of the namespace) nor moves `since` before the limits existed.
pub fn stamp_of(rq: &ResourceQuota) -> Option<(&str, Timestamp)> {
    let raw = rq.metadata.annotations.as_ref()?.get(IN_FORCE_SINCE)?;
    let t: Timestamp = raw.parse().ok()?;
    let created = rq.metadata.creation_timestamp.as_ref().map(|c| c.0);
    (format(t) == *raw && created.is_none_or(|c| t >= c)).then_some((raw.as_str(), t))
}

/// Whether `rq` enforces `hard` (its planned limits): every key in force ([`super::phases::in_force`]:
/// in `spec.hard` and `status.hard`) at no more than planned. The test the class gate
/// (`claims::allowed_classes`) and the pod gate (`pod_gate::enforced`) apply per key.
pub fn enforces(rq: &ResourceQuota, hard: &BTreeMap<String, String>) -> bool {
    let spec = rq.spec.as_ref().and_then(|s| s.hard.as_ref());
    let status = rq.status.as_ref().and_then(|s| s.hard.as_ref());
    hard.iter().all(|(k, want)| {
        let have = super::phases::in_force(spec, status, k);
        have.zip(super::quantity::count(want)).is_some_and(|(h, w)| h <= w)
    })
}

/// The stamp a planned apply of `hard` carries onto `rq` (as cached) for `quota`: the stamp `rq`
/// has, unchanged; none while `rq` is not written or does not enforce `hard` yet; else a new one.
/// A new one is the latest `managedFields` time ([`latest_write`]), or `now` without any, plus
/// [`MARGIN_SECS`]; never before the creation. Upgrade: a ResourceQuota of an operator that wrote no stamp takes the
/// stored params' `<ns>.since` (`stored`: that operator wrote its creation time there) where they
/// name this quota and that time is not before its creation, so claims it admitted then are not
/// refused at allocation now.
pub fn planned(
    rq: Option<&ResourceQuota>,
    hard: &BTreeMap<String, String>,
    quota: &str,
    stored: &BTreeMap<String, String>,
    now: &Time,
) -> Option<String> {
    let rq = rq?;
    if let Some((raw, _)) = stamp_of(rq) {
        return Some(raw.to_string());
    }
    if !enforces(rq, hard) {
        return None;
    }
    let created = rq.metadata.creation_timestamp.as_ref().map(|c| c.0);
    let ns = rq.metadata.namespace.as_deref().unwrap_or_default();
    let upgrade = stored
        .get(&format!("{ns}.since"))
        .filter(|_| stored.get(&format!("{ns}.quota")).map(String::as_str) == Some(quota))
        .and_then(|s| s.parse::<Timestamp>().ok())
        .filter(|s| created.is_some_and(|c| *s >= c));
    let t = upgrade.unwrap_or_else(|| taken(rq, now));
    Some(format(created.map_or(t, |c| t.max(c))))
}

/// Added to a newly taken stamp: an API server whose ResourceQuota informer lags up to this
/// long behind the status sync (shows the object without `status.hard`) admits a claim or pod
/// uncounted; made before the stamp, it is early. The stamp is in force (classes open, the
/// namespace leaves `_pending`) only once the operator's clock reaches it ([`due`]); the quota
/// loop runs at least every 5 s, so that costs at most one more pass. A longer lag is a known gap.
pub const MARGIN_SECS: i64 = 5;

/// A new stamp (single or per key): the latest write (or `now` without any) plus [`MARGIN_SECS`].
fn taken(rq: &ResourceQuota, now: &Time) -> Timestamp {
    let t = latest_write(rq).unwrap_or(now.0);
    t.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(MARGIN_SECS)).unwrap_or(t)
}

/// `rqs` as the params read them at `now`: a stamp (single or per key) not yet past is left out,
/// so nothing it gates opens before it ([`MARGIN_SECS`]). Due only from the second after it:
/// creation times count to the second and the stamp's own second is early (`<=`), so a class
/// opened inside it would refuse the claims made through it. Borrowed when none is left out.
pub fn due(rqs: std::borrow::Cow<'_, [ResourceQuota]>, now: Timestamp) -> std::borrow::Cow<'_, [ResourceQuota]> {
    // Whole seconds: not due while `now` is within the stamp's second or before it.
    let late = |t: &Timestamp| now.as_second() <= t.as_second();
    let future_keys = |rq: &ResourceQuota| match keys::record(rq) {
        keys::Record::Keys(k) => k.values().any(late),
        _ => false,
    };
    let early = |rq: &ResourceQuota| stamp_of(rq).is_some_and(|(_, t)| late(&t)) || future_keys(rq);
    if !rqs.iter().any(early) {
        return rqs;
    }
    let mut out = rqs.into_owned();
    for rq in out.iter_mut() {
        let single = stamp_of(rq).is_some_and(|(_, t)| late(&t));
        let record = match keys::record(rq) {
            keys::Record::Keys(mut k) if k.values().any(late) => {
                k.retain(|_, t| !late(t));
                Some(keys::render(&k))
            }
            _ => None,
        };
        let Some(a) = rq.metadata.annotations.as_mut() else { continue };
        if single {
            a.remove(IN_FORCE_SINCE);
        }
        if let Some(r) = record {
            a.insert(keys::IN_FORCE_KEYS.into(), r);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// [`planned`] and the per-key record ([`keys::planned`]) a planned apply carries. A key newly in
/// force takes the new single stamp where this pass sets one (the same time, the upgrade's
/// included), else the latest write (or `now`) plus [`MARGIN_SECS`], never before the creation. Whenever the single
/// stamp is planned the record is too (`""` with no GPU key in force). None of either while `rq`
/// is scoped.
pub fn planned_both(
    rq: Option<&ResourceQuota>,
    hard: &BTreeMap<String, String>,
    quota: &str,
    stored: &BTreeMap<String, String>,
    now: &Time,
) -> (Option<String>, Option<String>) {
    // Scoped (someone added `spec.scopes`/`scopeSelector`): it enforces nothing, so no stamp is
    // carried (the apply removes both) and it is stamped anew once the scope goes; claims and
    // pods made meanwhile are then early.
    if rq.is_some_and(|rq| super::pod_gate::scoped(rq).is_some()) {
        return (None, None);
    }
    let since = planned(rq, hard, quota, stored, now);
    let Some(rq) = rq else { return (since, None) };
    let new_since = since.as_deref().filter(|_| stamp_of(rq).is_none()).and_then(|s| s.parse::<Timestamp>().ok());
    let fresh = new_since.unwrap_or_else(|| {
        let t = taken(rq, now);
        rq.metadata.creation_timestamp.as_ref().map_or(t, |c| t.max(c.0))
    });
    // The record goes with the single stamp, empty where no GPU key is in force: an absent one
    // then means only an operator before per-key stamps (the upgrade path), never a key added
    // to a quota that had none.
    let keys = keys::planned(rq, hard, fresh).or_else(|| since.as_ref().map(|_| String::new()));
    (since, keys)
}

/// The latest `managedFields[].time` of `rq`: when the API server last recorded a write to it.
pub fn latest_write(rq: &ResourceQuota) -> Option<Timestamp> {
    rq.metadata.managed_fields.iter().flatten().filter_map(|m| m.time.as_ref().map(|t| t.0)).max()
}

/// Trims a cached ResourceQuota's `managedFields` to one entry holding only [`latest_write`]
/// (what [`planned`] reads): the rest is often most of the object and read by nobody here.
/// Also drops what [`crate::trimmed::trim_metadata`] drops.
pub fn trim_managed_fields(rq: &mut ResourceQuota) {
    let latest = latest_write(rq);
    crate::trimmed::trim_metadata(rq);
    rq.metadata.managed_fields = latest.map(|t| vec![ManagedFieldsEntry { time: Some(Time(t)), ..Default::default() }]);
}

/// `rq` as a previous pass left it once its limits were in force: stamped at its creation (or,
/// with none, a fixed time before the tests' `now`). For fixtures of synced ResourceQuotas.
#[cfg(test)]
pub(crate) fn stamped(mut rq: ResourceQuota) -> ResourceQuota {
    let at = rq.metadata.creation_timestamp.as_ref().map_or("2026-05-01T00:00:00Z".to_string(), |c| format(c.0));
    rq.metadata.annotations.get_or_insert_default().insert(IN_FORCE_SINCE.into(), at);
    rq
}

pub mod keys;

#[cfg(test)]
mod tests;
