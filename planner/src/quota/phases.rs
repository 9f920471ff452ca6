//! Raises wait for lowerings: a share moved between namespaces (`namespaceHard` edited, a
//! namespace added to an `Even` split) lowers one ResourceQuota and raises another. The quota
//! controller of the controller manager syncs each `status.hard` (what admission enforces) on
//! its own, so a raise that shows before the lowering lets the tenant past `hard` meanwhile
//! (`a1: 1, a2: 3` -> `a1: 3, a2: 1`: 3 admitted in `a1` while `a2` still admits 3). A raise of
//! a key in one namespace is therefore written only once every other namespace of the quota
//! enforces that key at no more than its new planned limit; until then the namespace keeps the
//! limit it enforces, and the lowered ones go first.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::holdings::Planned;

/// A ResourceQuota's `hard`, in its spec or status.
pub type Hard = BTreeMap<String, Quantity>;

/// The limit in force for `key`: the larger of `spec.hard` (written, and synced into `status`
/// by the controller manager at any moment) and `status.hard` (what admission enforces now).
/// `None` where either lacks the key (unlimited now or soon) or a value is no quantity (unknown).
pub fn in_force(spec: Option<&Hard>, status: Option<&Hard>, key: &str) -> Option<i64> {
    let count = |h: Option<&Hard>| super::quantity::count(&h?.get(key)?.0);
    Some(count(spec)?.max(count(status)?))
}

/// [`in_force`] for one planned namespace.
fn in_force_of(p: &Planned<'_>, key: &str) -> Option<i64> {
    in_force(p.written, p.status.and_then(|s| s.hard.as_ref()), key)
}

/// Holds back each planned raise (a key whose planned limit is above what the namespace's
/// `status.hard` enforces) while another namespace of the same quota enforces that key above
/// its own planned limit (a lowering not yet in force; a namespace whose ResourceQuota has no
/// status yet enforces nothing, i.e. more than anything). A held raise keeps the enforced limit.
/// Lowerings and unchanged limits pass as planned. Returns a note per held raise, for `Ready`.
pub fn hold_raises(planned: &mut [Planned<'_>]) -> Vec<String> {
    // Per namespace, the keys it has yet to lower: (key, enforced or None, planned).
    let lowering: Vec<Vec<(String, Option<i64>, i64)>> = planned
        .iter()
        .map(|p| {
            p.hard
                .iter()
                .filter_map(|(k, v)| {
                    let want = super::quantity::count(v)?;
                    let have = in_force_of(p, k);
                    have.is_none_or(|h| h > want).then(|| (k.clone(), have, want))
                })
                .collect()
        })
        .collect();
    let mut notes = Vec::new();
    for i in 0..planned.len() {
        let raises: Vec<(String, i64, i64)> = planned[i]
            .hard
            .iter()
            .filter_map(|(k, v)| {
                let want = super::quantity::count(v)?;
                let have = in_force_of(&planned[i], k)?;
                (want > have).then(|| (k.clone(), have, want))
            })
            .collect();
        for (key, have, want) in raises {
            let blocking = planned.iter().zip(&lowering).enumerate().find_map(|(j, (other, lows))| {
                let low = lows.iter().find(|(k, _, _)| *k == key).filter(|_| j != i)?;
                Some((other.ns.clone(), low.1, low.2))
            });
            let Some((other, enforced, target)) = blocking else { continue };
            planned[i].hard.insert(key.clone(), have.to_string());
            let enforced = enforced.map_or("no limit yet".to_string(), |e| format!("{e}"));
            notes.push(format!(
                "namespace {}: {key}: raise from {have} to {want} waits until namespace {other}'s ResourceQuota \
                 enforces its lower limit {target} (enforces {enforced})",
                planned[i].ns
            ));
        }
    }
    notes
}

#[cfg(test)]
mod tests;
