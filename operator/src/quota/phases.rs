//! Raises wait for lowerings: a share moved between namespaces (`namespaceHard` edited, a
//! namespace added to an `Even` split) lowers one ResourceQuota and raises another. The quota
//! controller of the controller manager syncs each `status.hard` (what admission enforces) on
//! its own, so a raise that shows before the lowering lets the tenant past `hard` meanwhile
//! (`a1: 1, a2: 3` -> `a1: 3, a2: 1`: 3 admitted in `a1` while `a2` still admits 3). A raise of
//! a key in one namespace is therefore written only once every other namespace of the quota
//! enforces that key at no more than its new planned limit; until then the namespace keeps the
//! limit it enforces, and the lowered ones go first.

use k8s_openapi::api::core::v1::ResourceQuotaStatus;

use super::holdings::Planned;

/// The limit `status.hard` enforces for `key` (`None`: not enforced, i.e. unlimited, or not a
/// whole number, taken as unknown).
fn in_force(status: Option<&ResourceQuotaStatus>, key: &str) -> Option<i64> {
    super::quantity::count(&status?.hard.as_ref()?.get(key)?.0)
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
                    let have = in_force(p.status, k);
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
                let have = in_force(planned[i].status, k)?;
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
