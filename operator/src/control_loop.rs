//! The skeleton both controllers' loops share: wait for the caches, then pass after pass, each
//! gated (leader tenure, fence) and each failure counted and logged, with a pause between them
//! that ends early, after a debounce, when something the passes read changes.
//! Level-triggered: a pass re-derives everything from the caches, so a missed wake costs at
//! most one period.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tracing::warn;

use crate::Error;
use crate::metrics::Metrics;

/// What a controller brings to [`Loop::run`].
pub(crate) trait Passes {
    /// What the controller keeps from its start to its passes (the rollout's fence).
    type Gate: Send;
    /// Logged, with the error, when a pass fails.
    const FAILED: &'static str;

    /// Until the caches the passes read are listed; returns the first pass's gate.
    fn ready(&self) -> impl Future<Output = Self::Gate> + Send;
    /// Whether a pass may start now (the leader tenure, the rollout's fence).
    fn may_pass(&self, gate: &mut Self::Gate) -> bool;
    /// One pass.
    fn pass(&self) -> impl Future<Output = Result<(), Error>> + Send;
    /// Where failed passes are counted.
    fn metrics(&self) -> &Metrics;
}

/// When passes run: after a change (each wake with its debounce), else every `period`.
pub(crate) struct Loop {
    /// What wakes a pass, each with how long its changes are batched before the pass.
    pub(crate) wakes: Vec<(Arc<Notify>, Duration)>,
    /// The longest pause between passes.
    pub(crate) period: Duration,
}

impl Loop {
    /// Runs `controller`'s passes until the future is dropped.
    pub(crate) async fn run<C: Passes + Sync>(&self, controller: &C) {
        let mut gate = controller.ready().await;
        loop {
            if controller.may_pass(&mut gate) {
                Self::pass(controller).await;
            }
            self.wait().await;
        }
    }

    /// One pass; a failure is logged and, unless it is only part of the pass, counted.
    async fn pass<C: Passes>(controller: &C) {
        if let Err(e) = controller.pass().await {
            if !matches!(e, Error::PartialPass(_)) {
                controller.metrics().error(e.kind());
            }
            warn!(error = %e, "{}", C::FAILED);
        }
    }

    /// Until a wake fires and its debounce is over, or `period` is.
    async fn wait(&self) {
        if self.wakes.is_empty() {
            return tokio::time::sleep(self.period).await;
        }
        let woken = self.wakes.iter().map(|(notify, debounce)| {
            Box::pin(async move {
                notify.notified().await;
                *debounce
            })
        });
        tokio::select! {
            (debounce, _, _) = futures::future::select_all(woken) => tokio::time::sleep(debounce).await,
            _ = tokio::time::sleep(self.period) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A controller that counts its passes, may pass while `allowed`, and fails with `failure`.
    #[derive(Default)]
    struct Counting {
        passes: AtomicUsize,
        gated: AtomicUsize,
        allowed: std::sync::atomic::AtomicBool,
        failure: Mutex<Option<Error>>,
        metrics: Metrics,
    }

    impl Passes for Counting {
        type Gate = ();
        const FAILED: &'static str = "test pass failed; retrying";

        async fn ready(&self) {}

        fn may_pass(&self, _: &mut ()) -> bool {
            self.gated.fetch_add(1, Ordering::SeqCst);
            self.allowed.load(Ordering::SeqCst)
        }

        async fn pass(&self) -> Result<(), Error> {
            self.passes.fetch_add(1, Ordering::SeqCst);
            self.failure.lock().unwrap().take().map_or(Ok(()), Err)
        }

        fn metrics(&self) -> &Metrics {
            &self.metrics
        }
    }

    #[tokio::test]
    async fn a_wake_runs_a_pass_after_its_debounce_and_the_period_runs_one_anyway() {
        let (fast, slow) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let ms = Duration::from_millis;
        let lp = Loop { wakes: vec![(fast.clone(), ms(10)), (slow.clone(), ms(400))], period: Duration::from_secs(60) };
        let c = Counting::default();
        c.allowed.store(true, Ordering::SeqCst);
        let passes = || c.passes.load(Ordering::SeqCst);
        let run = lp.run(&c);
        tokio::pin!(run);
        // Runs the loop for `ms` milliseconds (it never ends by itself).
        macro_rules! settle {
            ($ms:expr) => {
                assert!(tokio::time::timeout(ms($ms), &mut run).await.is_err())
            };
        }
        settle!(50);
        assert_eq!(passes(), 1, "the first pass runs at once");
        fast.notify_one();
        settle!(100);
        assert_eq!(passes(), 2, "a wake runs a pass after its debounce");
        slow.notify_one();
        settle!(100);
        assert_eq!(passes(), 2, "the slow wake's debounce is not over");
        settle!(500);
        assert_eq!(passes(), 3);
        let periodic = Loop { wakes: vec![], period: ms(20) };
        let quiet = Counting::default();
        assert!(tokio::time::timeout(ms(150), periodic.run(&quiet)).await.is_err());
        assert!(quiet.gated.load(Ordering::SeqCst) >= 3, "every period asks whether a pass may start");
        assert_eq!(quiet.passes.load(Ordering::SeqCst), 0, "a gated pass does not run");
    }

    #[tokio::test]
    async fn a_failed_pass_is_counted_unless_only_part_of_it_failed() {
        let lp = Loop { wakes: vec![], period: Duration::from_secs(60) };
        let c = Counting::default();
        c.allowed.store(true, Ordering::SeqCst);
        *c.failure.lock().unwrap() = Some(Error::PartialPass(2));
        assert!(tokio::time::timeout(Duration::from_millis(20), lp.run(&c)).await.is_err());
        *c.failure.lock().unwrap() = Some(Error::NotLeader);
        assert!(tokio::time::timeout(Duration::from_millis(20), lp.run(&c)).await.is_err());
        let text = c.metrics.render();
        let counted =
            |kind: &str| text.contains(&format!("tessera_operator_reconcile_errors_total{{kind=\"{kind}\"}} 1"));
        assert!(counted("client"), "a pass that failed whole is counted:\n{text}");
        assert!(!counted("partial"), "a pass that failed only in part is not:\n{text}");
    }
}
