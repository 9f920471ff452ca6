//! When to list the node's pods to name the devices' holders (PID -> pod, [`super::holders`]).
//! A new PID is looked up at once. A PID the last list found no pod for (its cgroup not readable
//! yet, its pod not yet in the watch cache, or a process outside Kubernetes) is looked up again
//! after a back-off counted in samples (the next sample, then 1, 2, 4 ... min, at most every
//! 10 min, [`super::backoff`]): a passing race is over by the next sample, while a process that
//! never maps costs at most ~10 lists in its first hour and 6 an hour after, not one per sample.
//! PIDs that end need no list: they are only dropped.

use std::collections::BTreeMap;
use std::time::Duration;

use tessera_crds::activity::DevicePod;

use super::backoff::Backoff;

#[derive(Debug, Clone, Default)]
pub struct Lookup {
    /// The PIDs the last list that went through was asked about (found or not), sorted.
    looked_up: Vec<u32>,
    /// PID -> pod, for those found and still running.
    pub found: BTreeMap<u32, DevicePod>,
    /// Spaces the lookups of PIDs no pod was found for.
    retry: Backoff,
}

impl Lookup {
    /// Whether this sample lists the pods for `pids` (sorted): a PID never looked up, at once;
    /// only PIDs not found, when their wait is out. Drops the pods of PIDs that ended.
    pub fn due(&mut self, pids: &[u32]) -> bool {
        // An ended PID is forgotten, so one reused by a new process is new.
        self.found.retain(|pid, _| pids.binary_search(pid).is_ok());
        self.looked_up.retain(|pid| pids.binary_search(pid).is_ok());
        if pids.iter().any(|p| self.looked_up.binary_search(p).is_err()) {
            return true;
        }
        pids.iter().any(|p| !self.found.contains_key(p)) && self.retry.try_now()
    }

    /// A list went through for `pids` (sorted) and found `found`. Some PID still not found: the
    /// next try waits, counted afresh when a new PID brought this list about.
    pub fn listed(&mut self, pids: Vec<u32>, found: BTreeMap<u32, DevicePod>, sample: Duration) {
        let new = pids.iter().any(|p| self.looked_up.binary_search(p).is_err());
        if new || pids.iter().all(|p| found.contains_key(p)) {
            self.retry.succeeded();
        }
        if pids.iter().any(|p| !found.contains_key(p)) {
            self.retry.failed(sample);
        }
        self.looked_up = pids;
        self.found = found;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: Duration = Duration::from_secs(30);

    fn pod() -> DevicePod {
        DevicePod { namespace: "ml".into(), name: "nb".into(), uid: "uid-nb".into() }
    }

    /// Runs `samples` samples over `pids(i)`, where a list finds the PIDs `maps(i)` says: the
    /// samples that listed.
    fn lists(
        l: &mut Lookup,
        samples: u32,
        pids: impl Fn(u32) -> Vec<u32>,
        maps: impl Fn(u32, u32) -> bool,
    ) -> Vec<u32> {
        let mut out = Vec::new();
        for i in 0..samples {
            let p = pids(i);
            if l.due(&p) {
                out.push(i);
                let found = p.iter().filter(|pid| maps(i, **pid)).map(|pid| (*pid, pod())).collect();
                l.listed(p, found, SAMPLE);
            }
        }
        out
    }

    /// (case, the PIDs at sample i, whether a list at i finds a PID, the samples that list).
    type Case = (&'static str, fn(u32) -> Vec<u32>, fn(u32, u32) -> bool, Vec<u32>);

    #[test]
    fn pids_not_found_are_looked_up_again_with_a_back_off_and_new_ones_at_once() {
        let cases: [Case; 5] = [
            ("no PID: no list", |_| vec![], |_, _| true, vec![]),
            ("found at once: one list", |_| vec![1], |_, _| true, vec![0]),
            ("found on the second try (a race)", |_| vec![1], |i, _| i >= 1, vec![0, 1]),
            // 1, 2, 4, 8, 16 samples apart, then every 20 (10 min at 30 s).
            (
                "never found (outside Kubernetes): backing off",
                |_| vec![9],
                |_, _| false,
                vec![0, 1, 3, 7, 15, 31, 51, 71],
            ),
            (
                "a new PID lists at once and starts the wait over",
                |i| if i < 5 { vec![9] } else { vec![2, 9] },
                |_, p| p == 2,
                vec![0, 1, 3, 5, 6, 8, 12, 20, 36, 56, 76],
            ),
        ];
        for (name, pids, maps, want) in cases {
            assert_eq!(lists(&mut Lookup::default(), 80, pids, maps), want, "{name}");
        }
    }

    #[test]
    fn a_pid_that_ends_is_dropped_without_a_list() {
        let mut l = Lookup::default();
        assert!(l.due(&[1, 2]));
        l.listed(vec![1, 2], BTreeMap::from([(1, pod()), (2, pod())]), SAMPLE);
        assert!(!l.due(&[2]), "an ended PID needs no list");
        assert_eq!(l.found.keys().copied().collect::<Vec<_>>(), vec![2]);
        assert!(!l.due(&[2]));
    }
}
