//! Per-key stamps: when each planned GPU key of a ResourceQuota (`requests.nvidia.com/...` and
//! `<class>.deviceclass.resource.k8s.io/devices` of Tessera's classes) was first seen in force,
//! in the annotation [`IN_FORCE_KEYS`]. The single stamp ([`super::IN_FORCE_SINCE`]) says when the
//! namespace's limits first were; a key added later (a resource that was unlimited: `unlisted:
//! Unlimited`, then listed in `hard`) counts claims and pods only from its own time on, so the
//! ones made while it was unlimited are early for it (`<ns>.since.<class>`, [`later_keys`]).
//! A recorded key keeps its stamp across limit changes; one no longer planned is dropped, so
//! adding it again stamps it anew. An unreadable record counts as none and every key in force is
//! stamped again at the new time (later: fails closed).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::jiff::Timestamp;

/// The annotation: `key=RFC3339` pairs, space-separated, sorted by key.
pub const IN_FORCE_KEYS: &str = "tessera.dev/limits-in-force-keys";

/// The record on a ResourceQuota.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// No annotation: a ResourceQuota of an operator before per-key stamps, or none yet (the
    /// record is written with the single stamp, `""` when empty). Removed by hand, it is read as
    /// such an upgrade: every key in force takes the single stamp.
    Absent,
    /// Present but not what the operator writes: counts as no key recorded.
    Unreadable,
    Keys(BTreeMap<String, Timestamp>),
}

/// Whether `key` is one the record stamps: a limit on a GPU extended resource or on the devices
/// of one of Tessera's classes.
pub fn is_gpu_key(key: &str) -> bool {
    key.strip_prefix("requests.").is_some_and(crate::quota::is_gpu_resource)
        || crate::quota::claims::class_of_key(key).is_some_and(|c| crate::quota::claims::resource_of_class(c).is_some())
}

/// The record `rq` carries: each value [`super::format`]ted exactly and not before the
/// ResourceQuota's creation, each key a GPU key ([`is_gpu_key`]), no key twice; else unreadable.
pub fn record(rq: &ResourceQuota) -> Record {
    let Some(raw) = rq.metadata.annotations.as_ref().and_then(|a| a.get(IN_FORCE_KEYS)) else {
        return Record::Absent;
    };
    let created = rq.metadata.creation_timestamp.as_ref().map(|c| c.0);
    let mut keys = BTreeMap::new();
    for pair in raw.split(' ').filter(|p| !p.is_empty()) {
        let Some((k, v)) = pair.split_once('=') else { return Record::Unreadable };
        let Ok(t) = v.parse::<Timestamp>() else { return Record::Unreadable };
        let exact = super::format(t) == v && created.is_none_or(|c| t >= c);
        if !exact || !is_gpu_key(k) || keys.insert(k.to_string(), t).is_some() {
            return Record::Unreadable;
        }
    }
    Record::Keys(keys)
}

/// When `key` came into force on `rq` as cached: its recorded stamp; with no record (upgrade),
/// the single stamp, for every key; none where unreadable or not recorded (closed).
pub fn key_stamp(rq: &ResourceQuota, key: &str) -> Option<Timestamp> {
    match record(rq) {
        Record::Keys(keys) => keys.get(key).copied(),
        Record::Unreadable => None,
        Record::Absent => super::stamp_of(rq).map(|(_, t)| t),
    }
}

/// [`IN_FORCE_KEYS`] as written.
pub fn render(keys: &BTreeMap<String, Timestamp>) -> String {
    keys.iter().map(|(k, t)| format!("{k}={}", super::format(*t))).collect::<Vec<_>>().join(" ")
}

/// The record a planned apply of `hard` carries onto `rq` (as cached): the cached stamps of the
/// GPU keys still planned; each planned GPU key in force ([`super::enforces`], per key) and not
/// recorded, stamped at `fresh`. Upgrade: with no record, the keys in force take the single
/// stamp where `rq` has one. None while nothing is recorded and `rq` had no record.
pub fn planned(rq: &ResourceQuota, hard: &BTreeMap<String, String>, fresh: Timestamp) -> Option<String> {
    let cached = record(rq);
    let mut keys = match &cached {
        Record::Keys(k) => k.clone(),
        Record::Unreadable | Record::Absent => BTreeMap::new(),
    };
    let upgrade = (cached == Record::Absent).then(|| super::stamp_of(rq).map(|(_, t)| t)).flatten();
    keys.retain(|k, _| hard.contains_key(k) && is_gpu_key(k));
    for (k, v) in hard.iter().filter(|(k, _)| is_gpu_key(k)) {
        if !keys.contains_key(k) && super::enforces(rq, &BTreeMap::from([(k.clone(), v.clone())])) {
            keys.insert(k.clone(), upgrade.unwrap_or(fresh));
        }
    }
    (cached != Record::Absent || !keys.is_empty()).then(|| render(&keys))
}

/// Per tenant namespace with a `<ns>.since` in `policy`, the GPU keys of the ResourceQuotas there
/// (`rqs`) of each quota claiming it (`<ns>.quota`, two names in a conflict) stamped later than that: the latest stamp per key. A key
/// not recorded is not listed (its class is closed, its pods' namespace pending).
pub fn later_keys(
    policy: &BTreeMap<String, String>,
    quotas: &[&tessera_crds::TenantGpuQuota],
    rqs: &[ResourceQuota],
) -> BTreeMap<String, BTreeMap<String, Timestamp>> {
    let mut out: BTreeMap<String, BTreeMap<String, Timestamp>> = BTreeMap::new();
    for (key, since) in policy {
        let Some(ns) = key.strip_suffix(".since").filter(|ns| !ns.contains('.')) else { continue };
        let Ok(since) = since.parse::<Timestamp>() else { continue };
        // Claimed by two quotas it holds both names ("A B"): each one's ResourceQuotas count.
        let Some(names) = policy.get(&format!("{ns}.quota")) else { continue };
        let claiming: Vec<_> =
            names.split(' ').filter_map(|n| quotas.iter().find(|q| q.metadata.name.as_deref() == Some(n))).collect();
        let owned = |rq: &&ResourceQuota| claiming.iter().any(|q| super::super::owned_by(rq, q));
        for rq in rqs.iter().filter(|rq| rq.metadata.namespace.as_deref() == Some(ns)).filter(owned) {
            let Record::Keys(keys) = record(rq) else { continue };
            for (k, t) in keys.into_iter().filter(|(_, t)| *t > since) {
                let e = out.entry(ns.to_string()).or_default().entry(k).or_insert(t);
                *e = (*e).max(t);
            }
        }
    }
    out
}

/// The params `<ns>.since.<class>` of [`later_keys`]' device keys: read by the claim policy
/// (`early`) and [`crate::quota::unallocated::early`].
pub fn class_since(later: &BTreeMap<String, BTreeMap<String, Timestamp>>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (ns, keys) in later {
        for (k, t) in keys {
            if let Some(class) = crate::quota::claims::class_of_key(k) {
                out.insert(format!("{ns}.since.{class}"), super::format(*t));
            }
        }
    }
    out
}
