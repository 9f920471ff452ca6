//! The time-free rule for a tenant namespace's GPU objects (`docs/design/quota-gates.md`): what
//! its gate lists and what its ResourceQuota is written with, from its share, what the
//! ResourceQuota shows used, and Tessera's own count of the namespace's pods and claims.
//!
//! No clock decides anything. Objects made before the namespace joined (or while its
//! ResourceQuota did not count them) are found by counting: usage per key is the larger of the
//! ResourceQuota's `status.used` and Tessera's count ([`charges`]). Then:
//! - the ResourceQuota's limit is the share less what it does not count yet, so quota admission
//!   (the only atomic counter) never admits past the share ([`written_limits`]);
//! - unbound pods and unallocated claims are taken in creation order, each while it fits in the
//!   share beside everything bound and allocated; the rest are listed as blocked, refused binding
//!   or allocation until usage falls ([`blocked`]);
//! - keys whose usage passes the share are listed: new objects asking for them are refused.
//!
//! Invariant (property-tested): what is bound or allocated, plus what the gate lets through, is
//! at most the share on every key, whatever was made before.

use std::collections::{BTreeMap, BTreeSet};

pub mod charges;
pub mod namespace;
pub mod open;
pub mod pass;

use charges::Charges;

/// One pod or claim of the namespace that holds (or may come to hold) GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The object's name (pods and claims are listed apart, so names do not collide).
    pub name: String,
    /// Its creation time as the API server wrote it (RFC 3339), for an order only: the first
    /// made are let through first. Never compared with a clock.
    pub created: String,
    /// What it is charged ([`charges::pod_charges`], [`charges::claim_charges`]).
    pub charges: Charges,
    /// Bound to a node (a pod) or allocated (a claim): it holds its devices already.
    pub placed: bool,
}

/// Per key, what the namespace uses: the larger of what its ResourceQuota shows (`None`: no
/// status yet) and what its holders are charged.
pub fn usage(shown: Option<&BTreeMap<String, i64>>, holders: &[&Holder]) -> BTreeMap<String, i64> {
    let mut counted: BTreeMap<String, i64> = BTreeMap::new();
    for h in holders {
        for (k, n) in &h.charges {
            *counted.entry(k.clone()).or_default() += n;
        }
    }
    for (k, n) in shown.into_iter().flatten() {
        let u = counted.entry(k.clone()).or_default();
        *u = (*u).max(*n);
    }
    counted
}

/// The limits to write in the namespace's ResourceQuota: each key's share less what the
/// ResourceQuota does not count yet (Tessera's count above its `status.used`), never below 0.
/// Quota admission checks new objects against its own `used`, so this keeps its `used` plus
/// what it admits within the share. With no status yet the share is written (the API server
/// admits nothing against a ResourceQuota whose status is unknown).
pub fn written_limits(
    share: &BTreeMap<String, i64>,
    shown: Option<&BTreeMap<String, i64>>,
    holders: &[&Holder],
) -> BTreeMap<String, i64> {
    let counted = usage(None, holders);
    share
        .iter()
        .map(|(k, s)| {
            let uncounted = match shown {
                None => 0,
                Some(used) => (counted.get(k).copied().unwrap_or(0) - used.get(k).copied().unwrap_or(0)).max(0),
            };
            (k.clone(), (s - uncounted).max(0))
        })
        .collect()
}

/// The keys whose usage passes their share (a key with no share has a share of 0).
pub fn over(share: &BTreeMap<String, i64>, usage: &BTreeMap<String, i64>) -> BTreeSet<String> {
    usage.iter().filter(|(k, u)| **u > share.get(*k).copied().unwrap_or(0)).map(|(k, _)| k.clone()).collect()
}

/// The unplaced holders that may not be placed: in creation order (then name), each one is let
/// through while, on every key it is charged, the placed ones and those let through before it
/// plus it stay within the share (a key with no share: 0). Returns the names of the others.
pub fn blocked(share: &BTreeMap<String, i64>, holders: &[&Holder]) -> BTreeSet<String> {
    let mut taken: BTreeMap<&str, i64> = BTreeMap::new();
    for h in holders.iter().filter(|h| h.placed) {
        for (k, n) in &h.charges {
            *taken.entry(k).or_default() += n;
        }
    }
    let mut waiting: Vec<&&Holder> = holders.iter().filter(|h| !h.placed).collect();
    waiting.sort_by(|a, b| (&a.created, &a.name).cmp(&(&b.created, &b.name)));
    let mut out = BTreeSet::new();
    for h in waiting {
        let fits = h
            .charges
            .iter()
            .all(|(k, n)| taken.get(k.as_str()).copied().unwrap_or(0) + n <= share.get(k).copied().unwrap_or(0));
        if fits {
            for (k, n) in &h.charges {
                *taken.entry(k).or_default() += n;
            }
        } else {
            out.insert(h.name.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests;
