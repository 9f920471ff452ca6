//! The ResourceQuotas this controller deleted, until its cache stops showing them (the
//! expectations pattern). A watch lagging the controller's own delete still shows the object:
//! a namespace removed from a quota and added back before the deletion is delivered would find
//! its stamped ResourceQuota there, enforced and current, so nothing would be applied (and its
//! classes open, the namespace not pending) while the cluster has no ResourceQuota at all.
//! Cached objects with a remembered UID count as absent; the memory of one is dropped once the
//! cache no longer shows it. In memory only: a restarted operator lists afresh (the watcher's
//! initial list is a quorum read, `ListSemantic::MostRecent`, so it shows the deletion).

use std::collections::BTreeSet;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ResourceQuota;

/// Namespace, name and UID of a deleted ResourceQuota.
type Key = (String, String, String);

fn key(rq: &ResourceQuota) -> Option<Key> {
    let m = &rq.metadata;
    Some((m.namespace.clone()?, m.name.clone()?, m.uid.clone()?))
}

#[derive(Debug, Default)]
pub(super) struct Deleted(Mutex<BTreeSet<Key>>);

impl Deleted {
    /// `cached` less the ResourceQuotas deleted by this controller; forgets each deleted one the
    /// cache no longer shows (the watch delivered its deletion).
    pub(super) fn hide(&self, cached: Vec<ResourceQuota>) -> Vec<ResourceQuota> {
        let mut gone = crate::locked(&self.0);
        let shown: BTreeSet<Key> = cached.iter().filter_map(key).collect();
        gone.retain(|k| shown.contains(k));
        cached.into_iter().filter(|rq| key(rq).is_none_or(|k| !gone.contains(&k))).collect()
    }

    /// `rq` (as cached) was deleted, or found already gone.
    pub(super) fn remember(&self, rq: &ResourceQuota) {
        if let Some(k) = key(rq) {
            crate::locked(&self.0).insert(k);
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rq(ns: &str, name: &str, uid: &str) -> ResourceQuota {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns, "uid": uid}})).unwrap()
    }

    #[test]
    fn a_deleted_resource_quota_is_hidden_while_cached_and_forgotten_once_gone() {
        let d = Deleted::default();
        d.remember(&rq("x", "r", "uid-1"));
        // Same name made again (another UID): shown; the deleted one: hidden.
        let got = d.hide(vec![rq("x", "r", "uid-1"), rq("y", "r", "uid-2")]);
        assert_eq!(got, vec![rq("y", "r", "uid-2")]);
        assert_eq!(d.len(), 1);
        let got = d.hide(vec![rq("x", "r", "uid-3")]);
        assert_eq!(got, vec![rq("x", "r", "uid-3")], "a new object under the deleted one's name");
        assert_eq!(d.len(), 0, "the cache no longer shows uid-1");
    }
}
