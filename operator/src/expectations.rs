//! The operator's own writes that its caches have not shown yet (controller-runtime calls these
//! expectations). A pass plans from the caches; a watch that lags a write (a busy API server, a
//! slow event loop) would show a node just started as still at rest, and the next pass would
//! start it again (recording `cordonedByUs: false` for a node it cordoned itself) or start one
//! more node than `maxUnavailable` allows. A node whose cached objects are older than the last
//! write to them is left alone for that pass and counted as in flight. Pure; the controller
//! records the `resourceVersion` each write returns.

use std::time::{Duration, Instant};

use crate::FastMap;

/// How long a write may stay unseen before the pass stops waiting for it (a watch that far
/// behind is being re-listed; the object may have been deleted and created again).
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Which cached object a write went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    GpuNode,
    Node,
}

#[derive(Debug, Clone, Default)]
struct Expected {
    gpunode: Option<u64>,
    node: Option<u64>,
    since: Option<Instant>,
}

#[derive(Debug, Default)]
pub struct Expectations {
    pending: FastMap<String, Expected>,
}

/// An etcd revision, the form every resourceVersion takes with the API server's storage. One in
/// another form cannot be compared, so it is never waited for.
fn revision(rv: Option<&str>) -> Option<u64> {
    rv?.parse().ok()
}

impl Expectations {
    /// A write to `node`'s object succeeded and returned `resource_version`.
    pub fn wrote(&mut self, node: &str, object: Written, resource_version: Option<&str>, now: Instant) {
        let Some(rv) = revision(resource_version) else { return };
        let e = self.pending.entry(node.to_string()).or_default();
        let slot = match object {
            Written::GpuNode => &mut e.gpunode,
            Written::Node => &mut e.node,
        };
        *slot = Some(slot.map_or(rv, |old| old.max(rv)));
        e.since = Some(now);
    }

    /// Whether the cached objects of `node` (their resourceVersions, `None` when not cached)
    /// show every write of ours to them. Forgets the node once they do, or once the last write
    /// is older than [`PATIENCE`].
    pub fn caught_up(&mut self, node: &str, gpunode: Option<&str>, node_rv: Option<&str>, now: Instant) -> bool {
        let Some(e) = self.pending.get(node) else { return true };
        // A missing object has nothing to catch up with; an unreadable version cannot be compared.
        let seen = |expected: Option<u64>, cached: Option<&str>| match (expected, cached) {
            (None, _) | (_, None) => true,
            (Some(want), Some(rv)) => revision(Some(rv)).is_none_or(|have| have >= want),
        };
        let late = e.since.is_some_and(|t| now.saturating_duration_since(t) > PATIENCE);
        if (seen(e.gpunode, gpunode) && seen(e.node, node_rv)) || late {
            self.pending.remove(node);
            return true;
        }
        false
    }

    /// Nodes with a write not seen yet.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_waits_until_both_caches_show_our_writes() {
        let t0 = Instant::now();
        let mut e = Expectations::default();
        assert!(e.caught_up("n1", Some("5"), Some("7"), t0), "nothing written: nothing to wait for");
        e.wrote("n1", Written::GpuNode, Some("10"), t0);
        e.wrote("n1", Written::Node, Some("11"), t0);
        assert!(!e.caught_up("n1", Some("9"), Some("11"), t0), "the GpuNode cache is behind");
        assert!(!e.caught_up("n1", Some("10"), Some("8"), t0), "the Node cache is behind");
        assert!(e.caught_up("n2", Some("1"), Some("1"), t0), "another node is not held");
        assert!(e.caught_up("n1", Some("12"), Some("11"), t0), "both caught up (a later write counts)");
        assert!(e.is_empty(), "forgotten once seen");
    }

    #[test]
    fn the_latest_write_is_the_one_waited_for() {
        let t0 = Instant::now();
        let mut e = Expectations::default();
        e.wrote("n1", Written::GpuNode, Some("20"), t0);
        e.wrote("n1", Written::GpuNode, Some("15"), t0); // responses may arrive out of order
        assert!(!e.caught_up("n1", Some("15"), None, t0));
        assert!(e.caught_up("n1", Some("20"), None, t0));
    }

    #[test]
    fn unreadable_versions_and_missing_objects_are_not_waited_for() {
        let t0 = Instant::now();
        let mut e = Expectations::default();
        e.wrote("n1", Written::GpuNode, Some("opaque"), t0);
        assert!(e.is_empty(), "a version that is not a revision is never recorded");
        e.wrote("n1", Written::GpuNode, Some("30"), t0);
        assert!(!e.caught_up("n1", Some("29"), None, t0));
        assert!(e.caught_up("n1", Some("x-y"), None, t0), "a cached version that cannot be compared");
        e.wrote("n1", Written::GpuNode, Some("30"), t0);
        assert!(e.caught_up("n1", None, None, t0), "the object is gone from the cache");
    }

    #[test]
    fn a_write_unseen_for_longer_than_the_patience_is_given_up() {
        let t0 = Instant::now();
        let mut e = Expectations::default();
        e.wrote("n1", Written::Node, Some("40"), t0);
        assert!(!e.caught_up("n1", None, Some("39"), t0 + PATIENCE));
        assert!(e.caught_up("n1", None, Some("39"), t0 + PATIENCE + Duration::from_millis(1)));
        assert!(e.is_empty());
    }
}
