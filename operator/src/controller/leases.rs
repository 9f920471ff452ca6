//! The agents' heartbeat Leases, watched so that their silence can be trusted: a failed watch
//! re-lists (the kube watcher would resume a broken watch silently, and a resumed watch with
//! no agent renewing shows nothing at all), and [`LeaseWatch`] says whether the cache is caught
//! up, and since when. Liveness judges no agent dead through a watch that is not.
//! A re-list costs one list of the leases (about 2 MB at 5,000 nodes) per watch failure.

use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};

use super::Dirty;
use crate::cache::{Cache, keep};
use crate::pass_wakes::Waker;
use tessera_planner::liveness::{LeaseWatch, WatchEvent};

/// Items of the stream `make` returns, until one fails: the next item comes from a new stream
/// (for a watcher: a fresh list). The caller's backoff spaces the attempts.
pub fn relisting<S, T, E>(make: impl Fn() -> S) -> impl Stream<Item = Result<T, E>>
where
    S: Stream<Item = Result<T, E>>,
{
    futures::stream::unfold((make, None::<std::pin::Pin<Box<S>>>), |(make, inner)| async move {
        let mut inner = inner.unwrap_or_else(|| Box::pin(make()));
        let item = inner.next().await?;
        let keep = item.is_ok().then_some(inner);
        Some((item, (make, keep)))
    })
}

/// A cache of the leases in `api`, kept by a watch that re-lists after any failure, and where
/// that watch stands. Every lease that changes is named in `dirty` (before the watch counts as
/// caught up: a pass that reads the state first, then the names, reads the re-listed leases).
pub fn watch_leases(api: Api<Lease>, wake: Waker<Lease>, dirty: Arc<Dirty>) -> (Store<Lease>, Arc<Mutex<LeaseWatch>>) {
    let (store, writer) = reflector::store();
    let state = Arc::new(Mutex::new(LeaseWatch::default()));
    let watch = state.clone();
    let events = relisting(move || watcher(api.clone(), watcher::Config::default())).default_backoff();
    let cache = Cache {
        dirty: Some(dirty),
        failed: "lease watch error; re-listing with backoff (no agent is judged dead meanwhile)",
        ..Cache::waking(vec![wake])
    };
    tokio::spawn(keep(events, writer, cache, move |item| {
        let mut watch = crate::locked(&watch);
        *watch = match item {
            Ok(event) => watch.after_event(lease_watch_event(event), Timestamp::now()),
            Err(_) => watch.after_failure(),
        };
    }));
    (store, state)
}

/// A watcher event as liveness reads it ([`WatchEvent`]).
fn lease_watch_event<K>(event: &watcher::Event<K>) -> WatchEvent {
    match event {
        watcher::Event::Init => WatchEvent::RelistStarted,
        watcher::Event::InitDone => WatchEvent::RelistDone,
        watcher::Event::InitApply(_) | watcher::Event::Apply(_) | watcher::Event::Delete(_) => WatchEvent::Changed,
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// Only a completed re-list brings a lease watch up (see `LeaseWatch::after_event`): a lease
    /// listed mid-re-list, changed or deleted is a change, not a catch-up; read through the
    /// watcher's real events.
    #[test]
    fn only_the_end_of_a_relist_reads_as_one() {
        let lease = Lease::default();
        let cases = [
            (watcher::Event::Init, WatchEvent::RelistStarted),
            (watcher::Event::InitApply(lease.clone()), WatchEvent::Changed),
            (watcher::Event::InitDone, WatchEvent::RelistDone),
            (watcher::Event::Apply(lease.clone()), WatchEvent::Changed),
            (watcher::Event::Delete(lease), WatchEvent::Changed),
        ];
        for (event, want) in cases {
            assert_eq!(lease_watch_event(&event), want, "{event:?}");
        }
        let at = k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let relisted = [watcher::Event::Init, watcher::Event::InitApply(Lease::default()), watcher::Event::InitDone]
            .iter()
            .fold(LeaseWatch::Down, |w, e| w.after_event(lease_watch_event(e), at));
        assert_eq!(relisted, LeaseWatch::CaughtUp(at));
        let midway = [watcher::Event::Init, watcher::Event::InitApply(Lease::default())]
            .iter()
            .fold(LeaseWatch::Down, |w, e| w.after_event(lease_watch_event(e), at));
        assert_eq!(midway, LeaseWatch::Down, "a re-list begun is not a catch-up");
    }

    #[tokio::test]
    async fn a_failed_stream_is_replaced_by_a_new_one() {
        let made = Cell::new(0);
        let items: Vec<Result<i32, &str>> = relisting(|| {
            made.set(made.get() + 1);
            let items: Vec<Result<i32, &str>> = match made.get() {
                1 => vec![Ok(1), Err("broken"), Ok(99)],
                _ => vec![Ok(2), Ok(3)],
            };
            futures::stream::iter(items)
        })
        .collect()
        .await;
        assert_eq!(items, [Ok(1), Err("broken"), Ok(2), Ok(3)], "the rest of the failed stream is dropped");
        assert_eq!(made.get(), 2);
    }
}
