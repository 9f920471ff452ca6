//! The operator's own writes that its caches have not shown yet (controller-runtime calls these
//! expectations). A pass plans from the caches; a watch that lags a write (a busy API server, a
//! slow event loop) would show a node just started as still at rest, and the next pass would
//! start it again (recording `cordonedByUs: false` for a node it cordoned itself) or start one
//! more node than `maxUnavailable` allows. A node whose cached objects are older than the last
//! write to them is left alone for that pass and counted as in flight. Pure; the controller
//! records the `resourceVersion` each write returns, and how far each watch has got.

use std::sync::atomic::{AtomicU64, Ordering};

use kube::Resource;
use kube::runtime::watcher;

use tessera_planner::FastMap;

/// Follows one watch, after its reflector, into `seen`: the highest resourceVersion the store
/// holds or has seen deleted. A re-list's objects count at its end (the reflector swaps the
/// store in then), and so does `written` as it was when the re-list began (the list is read
/// afterwards, so it shows every earlier write, even to objects deleted since).
#[derive(Debug, Default)]
pub struct WatchProgress {
    listing: u64,
}

impl WatchProgress {
    pub fn observe<K: Resource>(&mut self, event: &watcher::Event<K>, seen: &AtomicU64, written: &AtomicU64) {
        let rv = |k: &K| revision(k.meta().resource_version.as_deref()).unwrap_or(0);
        match event {
            watcher::Event::Apply(k) | watcher::Event::Delete(k) => {
                seen.fetch_max(rv(k), Ordering::Release);
            }
            watcher::Event::Init => self.listing = written.load(Ordering::Acquire),
            watcher::Event::InitApply(k) => self.listing = self.listing.max(rv(k)),
            watcher::Event::InitDone => {
                seen.fetch_max(self.listing, Ordering::Release);
            }
        }
    }
}

/// Which cached object a write went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    GpuNode,
    Node,
}

/// How far each watch has got: the highest resourceVersion among the objects it delivered.
/// Watch events arrive in resourceVersion order, so a watch past a write has delivered it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    pub gpunodes: u64,
    pub nodes: u64,
}

#[derive(Debug, Clone, Default)]
struct Expected {
    gpunode: Option<u64>,
    node: Option<u64>,
    /// Plans named by the rollout records written (a deleted plan waits for them).
    plans: Vec<String>,
}

#[derive(Debug, Default)]
pub struct Expectations {
    pending: FastMap<String, Expected>,
}

pub use tessera_planner::resource_version::revision;

impl Expectations {
    /// A write to `node`'s object succeeded and returned `resource_version` (or, after a write
    /// whose outcome is unknown, the version a fresh read returned).
    pub fn wrote(&mut self, node: &str, object: Written, resource_version: Option<&str>) {
        let Some(rv) = revision(resource_version) else { return };
        let e = self.pending.entry(node.to_string()).or_default();
        let slot = match object {
            Written::GpuNode => &mut e.gpunode,
            Written::Node => &mut e.node,
        };
        *slot = Some(slot.map_or(rv, |old| old.max(rv)));
    }

    /// Whether the caches show every write of ours to `node`: its cached objects (their
    /// resourceVersions, `None` when not cached) are at least as new, or the watch has gone past
    /// the write (the object was deleted since). Forgets the node once they do. There is no
    /// time limit: deciding on a view older than our own write is what this prevents, and a
    /// watch that is down holds the node until it is back (and re-listed).
    pub fn caught_up(&mut self, node: &str, gpunode: Option<&str>, node_rv: Option<&str>, progress: Progress) -> bool {
        let Some(e) = self.pending.get(node) else { return true };
        let seen = |expected: Option<u64>, cached: Option<&str>, watched: u64| match expected {
            None => true,
            Some(want) => {
                watched >= want || cached.is_some_and(|rv| revision(Some(rv)).is_none_or(|have| have >= want))
            }
        };
        if seen(e.gpunode, gpunode, progress.gpunodes) && seen(e.node, node_rv, progress.nodes) {
            self.pending.remove(node);
            return true;
        }
        false
    }

    /// Forgets nodes that are gone (their Node left the cache).
    pub fn retain(&mut self, present: impl Fn(&str) -> bool) {
        self.pending.retain(|k, _| present(k));
    }

    /// The rollout record just written to `node` names `plan`.
    pub fn named(&mut self, node: &str, plan: &str) {
        if let Some(e) = self.pending.get_mut(node)
            && !e.plans.iter().any(|p| p == plan)
        {
            e.plans.push(plan.to_string());
        }
    }

    /// Whether a write not seen yet named `plan` in a node's rollout record.
    pub fn names(&self, plan: &str) -> bool {
        self.pending.values().any(|e| e.plans.iter().any(|p| p == plan))
    }

    /// The nodes with a write not seen yet.
    pub fn nodes(&self) -> Vec<String> {
        self.pending.keys().cloned().collect()
    }

    /// Nodes with a write not seen yet.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

/// One kind of object (GpuNodes or Nodes) as a consistent read showed it: its revision and each
/// object's resourceVersion. A new leader reads it after acquiring the lease and decides nothing
/// until its cache shows at least that much ([`Listed::shown`]): the read includes every write
/// the old leader had acknowledged (a list without a resourceVersion is a quorum read), and
/// our own expectations know nothing of the old leader's writes. Why not the list's revision
/// against [`Progress`] alone: a watch's progress is the newest version among its own kind's
/// objects, which stays below the cluster-wide revision for as long as no such object changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listed {
    revision: Option<u64>,
    objects: FastMap<String, Option<u64>>,
}

impl Listed {
    /// `revision`: the list's resourceVersion; `objects`: (name, resourceVersion) of its items.
    /// Versions that are not revisions cannot be compared and are not waited for.
    pub fn new<'a>(revision: Option<&str>, objects: impl IntoIterator<Item = (&'a str, Option<&'a str>)>) -> Self {
        let objects = objects.into_iter().map(|(name, rv)| (name.to_string(), self::revision(rv)));
        Listed { revision: self::revision(revision), objects: objects.collect() }
    }

    /// Whether a cache (each object's name and resourceVersion) whose watch has got to
    /// `progress` shows the read: the watch is past its revision, or every listed object is
    /// cached at least as new (or the watch is past its version: changed or deleted since), and
    /// no cached object the read no longer had is older than the read (a delete not seen yet).
    pub fn shown<'a>(&self, cached: impl IntoIterator<Item = (&'a str, Option<&'a str>)>, progress: u64) -> bool {
        let Some(read) = self.revision else { return true };
        if progress >= read {
            return true;
        }
        let mut cached_rv: FastMap<&str, Option<u64>> = FastMap::default();
        for (name, rv) in cached {
            let rv = revision(rv);
            if !self.objects.contains_key(name) && rv.is_some_and(|rv| rv <= read) {
                return false; // gone by the read, still cached
            }
            cached_rv.insert(name, rv);
        }
        self.objects.iter().all(|(name, want)| {
            want.is_none_or(|want| {
                progress >= want
                    || cached_rv.get(name.as_str()).is_some_and(|have| have.is_none_or(|have| have >= want))
            })
        })
    }
}

/// What a new leader must see before its first decision: GpuNodes and Nodes read after it
/// acquired the lease (see [`Listed`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fence {
    pub gpunodes: Listed,
    pub nodes: Listed,
}

impl Fence {
    /// Whether both caches show the read (see [`Listed::shown`]).
    pub fn shown<'a, 'b>(
        &self,
        gpunodes: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
        nodes: impl IntoIterator<Item = (&'b str, Option<&'b str>)>,
        progress: Progress,
    ) -> bool {
        self.gpunodes.shown(gpunodes, progress.gpunodes) && self.nodes.shown(nodes, progress.nodes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: Progress = Progress { gpunodes: 0, nodes: 0 };

    #[test]
    fn a_node_waits_until_both_caches_show_our_writes() {
        let mut e = Expectations::default();
        assert!(e.caught_up("n1", Some("5"), Some("7"), NONE), "nothing written: nothing to wait for");
        e.wrote("n1", Written::GpuNode, Some("10"));
        e.wrote("n1", Written::Node, Some("11"));
        assert!(!e.caught_up("n1", Some("9"), Some("11"), NONE), "the GpuNode cache is behind");
        assert!(!e.caught_up("n1", Some("10"), Some("8"), NONE), "the Node cache is behind");
        assert!(e.caught_up("n2", Some("1"), Some("1"), NONE), "another node is not held");
        assert!(e.caught_up("n1", Some("12"), Some("11"), NONE), "both caught up (a later write counts)");
        assert!(e.is_empty(), "forgotten once seen");
    }

    #[test]
    fn the_latest_write_is_the_one_waited_for() {
        let mut e = Expectations::default();
        e.wrote("n1", Written::GpuNode, Some("20"));
        e.wrote("n1", Written::GpuNode, Some("15")); // responses may arrive out of order
        assert!(!e.caught_up("n1", Some("15"), None, NONE));
        assert!(e.caught_up("n1", Some("20"), None, NONE));
    }

    #[test]
    fn a_missing_object_is_waited_for_until_the_watch_is_past_the_write() {
        let mut e = Expectations::default();
        e.wrote("n1", Written::GpuNode, Some("30"));
        assert!(!e.caught_up("n1", None, None, Progress { gpunodes: 29, nodes: 99 }), "the cache may lag its creation");
        assert!(!e.caught_up("n1", Some("29"), None, Progress { gpunodes: 29, nodes: 99 }));
        assert!(
            e.caught_up("n1", None, None, Progress { gpunodes: 30, nodes: 0 }),
            "the watch delivered the write and the object is gone since: deleted"
        );
    }

    #[test]
    fn unreadable_versions_are_not_waited_for() {
        let mut e = Expectations::default();
        e.wrote("n1", Written::GpuNode, Some("opaque"));
        assert!(e.is_empty(), "a version that is not a revision is never recorded");
        e.wrote("n1", Written::Node, Some("40"));
        assert!(!e.caught_up("n1", None, Some("39"), NONE));
        assert!(e.caught_up("n1", None, Some("x-y"), NONE), "a cached version that cannot be compared");
    }

    fn node(rv: &str) -> k8s_openapi::api::core::v1::Node {
        let mut n = k8s_openapi::api::core::v1::Node::default();
        n.metadata.resource_version = Some(rv.into());
        n
    }

    #[test]
    fn a_watch_progresses_with_its_events_and_a_relist_only_once_it_is_in() {
        let (seen, written) = (AtomicU64::new(0), AtomicU64::new(0));
        let mut w = WatchProgress::default();
        w.observe(&watcher::Event::Apply(node("10")), &seen, &written);
        w.observe(&watcher::Event::Delete(node("12")), &seen, &written);
        assert_eq!(seen.load(Ordering::Acquire), 12);
        // A re-list: we wrote version 40 to an object deleted before the list; the list's
        // objects are older than that. Nothing counts until the list is in.
        written.store(40, Ordering::Release);
        w.observe(&watcher::Event::<k8s_openapi::api::core::v1::Node>::Init, &seen, &written);
        written.store(50, Ordering::Release); // a write after the list began is not assumed seen
        w.observe(&watcher::Event::InitApply(node("30")), &seen, &written);
        assert_eq!(seen.load(Ordering::Acquire), 12, "the store still holds the old objects");
        w.observe(&watcher::Event::<k8s_openapi::api::core::v1::Node>::InitDone, &seen, &written);
        assert_eq!(seen.load(Ordering::Acquire), 40);
        let mut e = Expectations::default();
        e.wrote("gone", Written::Node, Some("40"));
        e.wrote("later", Written::Node, Some("50"));
        let progress = Progress { gpunodes: 0, nodes: seen.load(Ordering::Acquire) };
        assert!(e.caught_up("gone", None, None, progress), "deleted before the re-list: not waited for");
        assert!(!e.caught_up("later", None, None, progress), "written after the re-list began: still waited for");
    }

    #[test]
    fn an_unseen_record_holds_only_the_plan_it_names() {
        let mut e = Expectations::default();
        e.wrote("n1", Written::GpuNode, Some("7"));
        e.named("n1", "a");
        assert!(e.names("a") && !e.names("b"));
        assert!(e.caught_up("n1", Some("7"), None, NONE));
        assert!(!e.names("a"), "seen: it holds nothing any more");
    }

    #[test]
    fn nodes_that_are_gone_are_forgotten() {
        let mut e = Expectations::default();
        e.wrote("gone", Written::Node, Some("5"));
        e.wrote("here", Written::Node, Some("5"));
        e.retain(|n| n == "here");
        assert_eq!(e.len(), 1);
        assert!(!e.caught_up("here", None, Some("4"), NONE));
    }

    /// The old leader started n1 just before it lost the lease: its record (`Draining`,
    /// `cordonedByUs: true`) at 105 and its cordon at 104. The new leader's caches still show n1
    /// at rest and uncordoned.
    type Cache = [(&'static str, Option<&'static str>); 2];

    fn takeover() -> (Fence, Cache, Cache) {
        let fence = Fence {
            gpunodes: Listed::new(Some("110"), [("n1", Some("105")), ("n2", Some("50"))]),
            nodes: Listed::new(Some("110"), [("n1", Some("104")), ("n2", Some("40"))]),
        };
        (fence, [("n1", Some("90")), ("n2", Some("50"))], [("n1", Some("80")), ("n2", Some("40"))])
    }

    #[test]
    fn a_new_leader_whose_caches_lag_the_read_after_taking_over_decides_nothing() {
        let (fence, mut gpunodes, mut nodes) = takeover();
        let progress = Progress { gpunodes: 95, nodes: 85 };
        // The new leader's own record of writes is empty: alone, it would let n1 start again.
        assert!(Expectations::default().caught_up("n1", Some("90"), Some("80"), progress));
        assert!(!fence.shown(gpunodes, nodes, progress), "both caches lag the old leader's last writes");
        gpunodes[0].1 = Some("105");
        let progress = Progress { gpunodes: 105, nodes: 85 };
        assert!(!fence.shown(gpunodes, nodes, progress), "the cordon is not cached yet");
        nodes[0].1 = Some("104");
        assert!(fence.shown(gpunodes, nodes, Progress { gpunodes: 105, nodes: 104 }));
        assert!(fence.shown(gpunodes, nodes, progress), "a cache as new as the read, however far its watch got");
    }

    #[test]
    fn a_watch_past_the_read_shows_it_and_a_listed_object_deleted_since_is_not_waited_for() {
        let (fence, gpunodes, nodes) = takeover();
        assert!(fence.shown(gpunodes, nodes, Progress { gpunodes: 110, nodes: 111 }), "both watches past the read");
        let only_n2 = [("n2", Some("50"))];
        assert!(
            !fence.gpunodes.shown(only_n2, 100),
            "n1 missing from the cache, the watch short of its version: its creation is not cached yet"
        );
        assert!(fence.gpunodes.shown(only_n2, 105), "the watch delivered n1's version: deleted since the read");
    }

    #[test]
    fn a_cached_object_the_read_no_longer_had_holds_the_fence_until_its_delete_is_cached() {
        let listed = Listed::new(Some("110"), [("n2", Some("50"))]);
        assert!(!listed.shown([("n1", Some("90")), ("n2", Some("50"))], 100), "n1 was deleted by the read");
        assert!(listed.shown([("n2", Some("50"))], 100), "its delete is cached");
        assert!(listed.shown([("n1", Some("111")), ("n2", Some("50"))], 111), "created again after the read");
        assert!(listed.shown([("n1", Some("111")), ("n2", Some("50"))], 100), "created after the read, cached");
    }

    #[test]
    fn a_read_whose_versions_cannot_be_compared_holds_nothing() {
        let listed = Listed::new(Some("opaque"), [("n1", Some("5"))]);
        assert!(listed.shown([], 0));
        let listed = Listed::new(Some("10"), [("n1", Some("x")), ("n2", Some("5"))]);
        assert!(listed.shown([("n1", Some("1")), ("n2", Some("y"))], 0), "uncomparable versions are not waited for");
        assert!(!listed.shown([("n1", Some("1"))], 0), "n2 still missing");
    }
}
