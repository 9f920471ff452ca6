//! The agent's activity pass (see `crate::activity`): sample every device, feed the tracker, and
//! write the summary to `GpuNode.status.activity` when `activity::write::should_write` says so;
//! on the first pass of a run, resume from what the previous run stored and announced.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tessera_crds::activity::NodeActivity;
use tessera_crds::gpunode::{AGENT_LEASE_NAMESPACE, GpuNode};
use tracing::{debug, info, warn};

use super::Agent;
use crate::Error;
use crate::activity::Tracker;
use crate::activity::previous::PreviousRun;
use crate::activity::write::should_write;
use crate::activity::writer::ACTIVITY_MANAGER;
use crate::backend::GpuBackend;

impl<B: GpuBackend> Agent<B> {
    /// One activity pass. A failed write is logged and retried after a back-off (see
    /// [`crate::activity::backoff`]; the summary is recomputed then; nothing is queued). Keeps
    /// [`Writer::failing`]: set at the first pass that leaves the stored summary behind, cleared
    /// by the next that leaves it current.
    pub async fn sample_activity(&mut self) -> Result<(), Error> {
        let current = self.activity_pass().await;
        self.activity.passed(Timestamp::now(), matches!(current, Ok(true)));
        current.map(|_| ())
    }

    /// One pass: `Ok(false)` when a write was due but waits out the back-off.
    async fn activity_pass(&mut self) -> Result<bool, Error> {
        let (observations, unread) =
            tokio::task::block_in_place(|| crate::activity::sample::observe_all(&mut self.backend))?;
        // With those of devices kept as last read: their holders stay named (no write, no list).
        let mut pids: Vec<u32> = observations.iter().flat_map(|o| o.pids.iter().copied()).collect();
        pids.extend(self.activity.tracker.unread_pids(&unread));
        pids.sort_unstable();
        pids.dedup();
        if self.activity.holders.due(&pids) {
            match tokio::task::block_in_place(|| self.try_pods_of(&pids)) {
                Ok(pods) => self.activity.holders.listed(pids, pods, self.activity.sample_interval),
                // Tried again on the next sample (the PIDs looked up stay the old ones); the PIDs
                // still running keep their pods meanwhile.
                Err(e) => {
                    warn!(error = %e, "could not list this node's pods to name the devices' holders; retrying on the next sample");
                }
            }
        }
        let prior = match self.activity.seeded {
            true => None,
            false => match self.resume_from().await {
                Ok(prior) => Some(prior),
                Err(e) => {
                    // `/metrics` still shows this sample (figures without history); seeding, and
                    // the write, are tried again on the next one.
                    let (now, w) = (Timestamp::now(), &mut self.activity);
                    let mut fresh = Tracker::default();
                    fresh.observe(now, observations);
                    *w.metrics.lock().unwrap_or_else(|p| p.into_inner()) =
                        crate::activity::metrics::render(&self.node, &fresh, now, &w.holders.found);
                    return Err(e);
                }
            },
        };
        let (now, mono) = (Timestamp::now(), std::time::Instant::now());
        let w = &mut self.activity;
        match prior {
            Some((prior, previous)) => {
                let current_until = previous.current_until(prior.measured_at.as_ref().map(|t| t.0));
                w.tracker = Tracker::seed(now, &prior, current_until, observations, &unread).passed_at(mono);
                w.seeded = true;
            }
            None => w.tracker.observe_at(now, mono, observations, &unread),
        }
        let summary = crate::activity::holders::summary(&w.tracker, now, &w.holders.found);
        *w.metrics.lock().unwrap_or_else(|p| p.into_inner()) =
            crate::activity::metrics::render(&self.node, &w.tracker, now, &w.holders.found);
        let due = should_write(w.last.as_ref().map(|(t, a)| (*t, a)), &summary, now, w.write_interval);
        let Some(reason) = due.or_else(|| w.pruned_retry(now)) else {
            // Nothing due: what is stored is current (a change that failed to be written went
            // back), so no wait of earlier failures is left over for the next change.
            w.backoff.succeeded();
            return Ok(true);
        };
        if !w.backoff.try_now() {
            debug!(failures = w.backoff.failures(), "activity write backing off");
            return Ok(false);
        }
        debug!(?reason, devices = summary.devices.len(), "writing GpuNode.status.activity");
        let body = json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
            "status": {"activity": summary}
        });
        let api: Api<GpuNode> = Api::all(self.client.clone());
        match api.patch_status(&self.node, &PatchParams::apply(ACTIVITY_MANAGER).force(), &Patch::Apply(&body)).await {
            Ok(gn) => {
                self.activity.check_pruned(&summary, &gn);
                self.activity.last = Some((now, summary));
                self.activity.written_uid = gn.metadata.uid;
                self.activity.backoff.succeeded();
                Ok(true)
            }
            Err(e) => {
                self.activity.backoff.failed(self.activity.sample_interval);
                warn!(error = %e, failures = self.activity.backoff.failures(),
                    "could not write GpuNode.status.activity; retrying after a back-off");
                Err(e.into())
            }
        }
    }
}

impl<B: GpuBackend> Agent<B> {
    /// What a restart resumes from: the stored summary, and the previous run's Lease.
    async fn resume_from(&mut self) -> Result<(NodeActivity, PreviousRun), Error> {
        let previous = self.previous_run().await?;
        Ok((self.stored_activity().await?, previous))
    }

    /// What an earlier run wrote to this node's `status.activity` (empty when there is no
    /// GpuNode or no summary yet). A failed read fails the pass: starting empty would reset
    /// every `idleSince` on the next write.
    async fn stored_activity(&self) -> Result<NodeActivity, Error> {
        let api: Api<GpuNode> = Api::all(self.client.clone());
        let node = api.get_opt(&self.node).await.inspect_err(
            |e| warn!(error = %e, "could not read GpuNode.status.activity to resume from; retrying on the next sample"),
        )?;
        Ok(node.and_then(|n| n.status).and_then(|s| s.activity).unwrap_or_default())
    }
}

impl<B: GpuBackend> Agent<B> {
    /// The previous run, read from the Lease once per run (by the first renewal or the first
    /// activity pass, whichever comes first); a stale report it announced becomes this run's
    /// failure, so the next renewal keeps announcing it. A failed read fails the caller (tried
    /// again): renewing unread would erase both.
    pub async fn previous_run(&mut self) -> Result<PreviousRun, Error> {
        if let Some(p) = self.activity.previous {
            return Ok(p);
        }
        let api: Api<Lease> = Api::namespaced(self.client.clone(), AGENT_LEASE_NAMESPACE);
        let lease = api.get_opt(&self.node).await.inspect_err(
            |e| warn!(error = %e, "could not read this agent's heartbeat Lease to resume from; retrying"),
        )?;
        let p = PreviousRun::from_lease(lease.as_ref());
        // A time in the future (the clock stepped back since) would never be announced: capped.
        if let Some(since) = p.failing_since().map(|s| s.min(Timestamp::now())) {
            info!(%since, "the previous run announced its activity report stale; announcing it until current");
            let failing = &mut self.activity.failing;
            *failing = Some(failing.map_or(since, |f| f.min(since)));
        }
        self.activity.previous = Some(p);
        Ok(p)
    }
}

#[cfg(test)]
mod tests;
