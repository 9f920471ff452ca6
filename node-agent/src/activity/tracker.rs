//! Per-device history of SM activity and idleness. Pure: every call takes `now`; nothing reads a
//! clock. History is kept in minute buckets (at most 24 h of them per device), so memory stays
//! bounded whatever the sampling rate. Not persisted by the agent: after a restart it is seeded
//! from what the previous run wrote to `GpuNode.status.activity` ([`Tracker::seed`]), so a
//! restart neither resets `idleSince` nor forgets the shares.

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tessera_crds::activity::{ActivitySource, DeviceActivity, DevicePod, NodeActivity};

/// A device: its GPU index, and the MIG instance's UUID (none for a whole GPU).
pub type DeviceKey = (u32, Option<String>);

/// Below this SM activity (percent) a GPM device counts as idle.
pub const IDLE_BELOW_PERCENT: f64 = 1.0;
/// An idle GPM device becomes active only at this SM activity (percent) or more: a figure
/// hovering around [`IDLE_BELOW_PERCENT`] keeps one idle stretch (hysteresis) rather than start
/// a new one, and cost a write, every interval.
pub const ACTIVE_FROM_PERCENT: f64 = 5.0;
/// An interval longer than this between two observations is not credited to either window (the
/// agent was stopped or stuck; what happened then is unknown).
pub const MAX_INTERVAL: SignedDuration = SignedDuration::from_mins(10);
/// After this many GPM failures in a row (5 min at the default 30 s sample) a device is judged by
/// its processes alone, like one without GPM: a board whose GPM always fails must not leave a
/// busy device idle forever. Before that a failed sample with a process is unknown.
pub const GPM_FAILURES_BEFORE_PROCESSES: u32 = 10;
/// A backward clock step smaller than this, with the wall clock still moving forward, is not
/// applied to the histories (drift, a leap second, a VM's time sync): see `observe_passed`.
const SMALL_STEP: SignedDuration = SignedDuration::from_secs(60);
const HOUR: i64 = 3600;
const DAY: i64 = 24 * HOUR;

/// One device as sampled at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub gpu_index: u32,
    /// The GPU's product name (DCGM's `modelName` label).
    pub model_name: String,
    /// The GPU's UUID (DCGM's `UUID` label, also for its MIG devices).
    pub gpu_uuid: String,
    pub uuid: Option<String>,
    pub profile: Option<String>,
    pub start: Option<u8>,
    /// The MIG device's GPU instance id (DCGM's `GPU_I_ID`); none for a whole GPU.
    pub gpu_instance_id: Option<u32>,
    pub source: ActivitySource,
    /// GPM's SM activity since the previous sample, percent; `None` without GPM or on a first
    /// sample.
    pub sm_active_percent: Option<f64>,
    /// GPM failed for this device this sample: without a process it is idle; with one it is
    /// unknown (an idle pod's open CUDA context is a process), unless GPM keeps failing
    /// ([`GPM_FAILURES_BEFORE_PROCESSES`]).
    pub gpm_failed: bool,
    pub memory_used_mib: u64,
    pub processes: u32,
    /// The compute processes' PIDs (to name the pod holding the device on `/metrics`).
    pub pids: Vec<u32>,
}

impl Observation {
    pub fn key(&self) -> DeviceKey {
        (self.gpu_index, self.uuid.clone())
    }

    /// Idle now: GPM under 1%; without GPM, no compute process. `None` (unknown): GPM with no
    /// figure yet, or GPM failed with a process running (it may only hold a context).
    pub(crate) fn idle(&self) -> Option<bool> {
        match (self.source, self.sm_active_percent) {
            (ActivitySource::Gpm, Some(p)) => Some(p < IDLE_BELOW_PERCENT),
            (ActivitySource::Gpm, None) if !self.gpm_failed => None,
            (ActivitySource::Gpm, None) if self.processes > 0 => None,
            _ => Some(self.processes == 0),
        }
    }

    /// [`Observation::idle`] for a device in an idle stretch (`idle_before`) or not, after
    /// `gpm_failures` GPM failures in a row: in a stretch a GPM figure under
    /// [`ACTIVE_FROM_PERCENT`] keeps it idle (hysteresis); GPM failing for good judges by the
    /// processes ([`GPM_FAILURES_BEFORE_PROCESSES`]). Shared by a running agent and a restart's
    /// seeding, so both judge a figure in the band alike.
    pub(crate) fn idle_after(&self, idle_before: bool, gpm_failures: u32) -> Option<bool> {
        match self.gpm_failed && gpm_failures >= GPM_FAILURES_BEFORE_PROCESSES {
            true => Some(self.processes == 0),
            false if idle_before && self.sm_active_percent.is_some_and(|p| p < ACTIVE_FROM_PERCENT) => Some(true),
            false => self.idle(),
        }
    }
}

/// Seconds observed and SM-active seconds in one minute; or, seeded from a stored summary, over
/// `spread` (from, to; seconds), of which a window counts the part it covers.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Bucket {
    minute: i64,
    seconds: f64,
    active_seconds: f64,
    spread: Option<(i64, i64)>,
}

#[derive(Debug, Clone)]
struct History {
    last: Observation,
    last_at: Timestamp,
    buckets: VecDeque<Bucket>,
    idle_since: Option<Timestamp>,
    /// GPM failures in a row.
    gpm_failures: u32,
    /// The holder stored for a device seeded unread (no PIDs read this run), named until it is
    /// read ([`Tracker::seed`]).
    stored_pod: Option<DevicePod>,
}

impl History {
    fn new(o: Observation, now: Timestamp) -> Self {
        let idle_since = (o.idle() == Some(true)).then_some(now);
        let gpm_failures = u32::from(o.gpm_failed);
        Self { last: o, last_at: now, buckets: VecDeque::new(), idle_since, gpm_failures, stored_pod: None }
    }

    fn observe(&mut self, o: Observation, now: Timestamp) {
        self.stored_pod = None;
        let mut interval = now.duration_since(self.last_at);
        if interval < SignedDuration::ZERO {
            // The clock stepped back: the step counts as no time (see `rebase`).
            self.rebase(-interval);
            interval = SignedDuration::ZERO;
        }
        if interval > MAX_INTERVAL {
            // Nobody observed the gap (the agent hung, or its samples stopped): an idle stretch
            // does not span it, as after a restart past the gap rule (`seed`); this sample
            // judges afresh, without the band of a stretch going on.
            self.idle_since = None;
        }
        if let Some(p) = o.sm_active_percent
            && interval > SignedDuration::ZERO
            && interval <= MAX_INTERVAL
        {
            self.credit(now, interval.as_secs_f64(), p.clamp(0.0, 100.0));
        }
        self.gpm_failures = if o.gpm_failed { self.gpm_failures.saturating_add(1) } else { 0 };
        // Hysteresis: idle under 1%, active again only from `ACTIVE_FROM_PERCENT`.
        let idle = o.idle_after(self.idle_since.is_some(), self.gpm_failures);
        match idle {
            // GPM's figure covers the interval since the previous sample: idle from its start.
            Some(true) if self.idle_since.is_none() => {
                let began = if o.sm_active_percent.is_some() && interval <= MAX_INTERVAL { self.last_at } else { now };
                self.idle_since = Some(began);
            }
            Some(false) => self.idle_since = None,
            _ => {}
        }
        // A board losing GPM (or gaining it) changes what "idle" means: the other kind's record
        // does not carry over.
        if o.source != self.last.source {
            self.buckets.clear();
            self.idle_since = (o.idle() == Some(true)).then_some(now);
        }
        self.last = o;
        self.last_at = now;
        let oldest = now.as_second().div_euclid(60) - DAY / 60;
        while self.buckets.front().is_some_and(|b| b.minute <= oldest) {
            self.buckets.pop_front();
        }
    }

    /// Moves everything recorded `step` earlier, as if the clock had read that much less all
    /// along: after a clock stepped back, `idleSince` stays in the past (the stretch keeps the
    /// length it had) and the history stays in its windows' order, not counted as the future.
    fn rebase(&mut self, step: SignedDuration) {
        self.last_at = self.last_at.checked_sub(step).unwrap_or(self.last_at);
        self.idle_since = self.idle_since.map(|t| t.checked_sub(step).unwrap_or(t));
        let (secs, minutes) = (step.as_secs(), (step.as_secs() + 30).div_euclid(60));
        for b in &mut self.buckets {
            b.minute -= minutes;
            b.spread = b.spread.map(|(from, to)| (from - secs, to - secs));
        }
    }

    /// Two buckets that make the hour ending at `at` average `p1h` and the day ending at
    /// `day_at` (when the shares were measured; at most `at`) `p24h`: the hour at `at`'s minute,
    /// the other 23 h before the hour ending at `day_at`. Each is spread over the time it stands
    /// for, so it leaves a window gradually, as real history would: a day's share measured
    /// hours ago ages from then, not from `at`.
    fn seed_shares(&mut self, at: Timestamp, day_at: Timestamp, p1h: Option<i32>, p24h: Option<i32>) {
        let end = at.as_second();
        let minute = end.div_euclid(60);
        let hour_active = p1h.map(|p| HOUR as f64 * f64::from(p.clamp(0, 100)) / 100.0);
        if let Some(p) = p24h {
            let rest = (DAY as f64 * f64::from(p.clamp(0, 100)) / 100.0 - hour_active.unwrap_or(0.0)).max(0.0);
            let seconds = (DAY - HOUR) as f64;
            let day_end = day_at.as_second().min(end);
            let (minute, spread) = (day_end.div_euclid(60) - HOUR / 60, Some((day_end - DAY, day_end - HOUR)));
            self.buckets.push_back(Bucket { minute, seconds, active_seconds: rest.min(seconds), spread });
        }
        if let Some(active) = hour_active {
            let spread = Some((end - HOUR, end));
            self.buckets.push_back(Bucket { minute, seconds: HOUR as f64, active_seconds: active, spread });
        }
    }

    /// Credits `seconds` ending at `now` at `percent`, to the minute `now` falls in (a sample
    /// interval is short against a minute; its whole weight goes to its end).
    fn credit(&mut self, now: Timestamp, seconds: f64, percent: f64) {
        let minute = now.as_second().div_euclid(60);
        let active = seconds * percent / 100.0;
        match self.buckets.back_mut() {
            Some(b) if b.minute == minute && b.spread.is_none() => {
                b.seconds += seconds;
                b.active_seconds += active;
            }
            _ => self.buckets.push_back(Bucket { minute, seconds, active_seconds: active, spread: None }),
        }
    }

    /// Mean SM activity over the `window` seconds ending at `now`, percent (rounded); `None`
    /// when nothing was measured in it.
    fn mean(&self, now: Timestamp, window: i64) -> Option<i32> {
        let first = now.as_second().div_euclid(60) - window / 60;
        let from = now.as_second() - window;
        let (s, a) = self.buckets.iter().fold((0.0, 0.0), |(s, a), b| {
            let share = match b.spread {
                // The part of a seeded stretch still inside the window.
                Some((start, end)) => {
                    (end - start.max(from)).clamp(0, end - start) as f64 / (end - start).max(1) as f64
                }
                None => f64::from(u8::from(b.minute > first)),
            };
            (s + b.seconds * share, a + b.active_seconds * share)
        });
        (s > 0.0).then(|| (100.0 * a / s).round() as i32)
    }
}

/// Every current device's history.
#[derive(Debug, Clone, Default)]
pub struct Tracker {
    devices: BTreeMap<DeviceKey, History>,
    /// When the last pass was, by this node's clock: a pass reading earlier saw it step back.
    last_pass: Option<Timestamp>,
    /// When the last pass was, by the monotonic clock ([`Tracker::observe_at`]): what really
    /// passed since, which a wall clock stepped back hides.
    last_mono: Option<Instant>,
}

impl Tracker {
    /// Takes one pass's observations of all devices: a device missing from them (destroyed, or
    /// its GPU's MIG mode changed) drops out; a new one starts with no history.
    pub fn observe(&mut self, now: Timestamp, observations: Vec<Observation>) {
        self.observe_unread(now, observations, &[]);
    }

    /// [`Tracker::observe`], where the devices `unread` (a GPU's when the UUID is `None`) could
    /// not be read this pass: those keep their history, and stay in the summary as last read,
    /// for up to [`MAX_INTERVAL`] since then, so a passing read failure neither resets an idle
    /// stretch nor costs two writes. Longer, they drop out (the operator counts them unmeasured).
    pub fn observe_unread(&mut self, now: Timestamp, observations: Vec<Observation>, unread: &[DeviceKey]) {
        self.last_mono = None;
        self.observe_passed(now, None, observations, unread);
    }

    /// [`Tracker::observe_unread`] at `mono` by the monotonic clock, as the running agent
    /// observes: a wall clock stepped back is measured as the monotonic time since the last
    /// pass less the wall-clock time, so time that really passed during the step still counts
    /// (an outage as long as the step is still a gap, not hidden by it).
    pub fn observe_at(&mut self, now: Timestamp, mono: Instant, observations: Vec<Observation>, unread: &[DeviceKey]) {
        let elapsed = self.last_mono.map(|at| SignedDuration::try_from(mono.saturating_duration_since(at)));
        self.last_mono = Some(mono);
        self.observe_passed(now, elapsed.and_then(Result::ok), observations, unread);
    }

    /// Marks a seeded tracker's pass as at `mono` by the monotonic clock, for the next
    /// [`Tracker::observe_at`].
    pub fn passed_at(mut self, mono: Instant) -> Self {
        self.last_mono = Some(mono);
        self
    }

    fn observe_passed(
        &mut self,
        now: Timestamp,
        elapsed: Option<SignedDuration>,
        observations: Vec<Observation>,
        unread: &[DeviceKey],
    ) {
        // A clock stepped back since the last pass moves every history back by the step, those
        // kept unread too (else their `idleSince` lies in the future, kept for the step). A step
        // under a minute with the wall clock still moving forward (drift, a leap second, a VM's
        // time sync) is left alone: the interval only reads shorter, and moving `idleSince`
        // would cost a write per node and step.
        let wall = self.last_pass.map_or(SignedDuration::ZERO, |at| now.duration_since(at));
        let step = elapsed.map_or(-wall, |e| e - wall);
        let backwards = wall < SignedDuration::ZERO;
        if step > SignedDuration::ZERO && (backwards || step >= SMALL_STEP) {
            self.devices.values_mut().for_each(|h| h.rebase(step));
        }
        self.last_pass = Some(now);
        let mut next = BTreeMap::new();
        for o in observations {
            let key = o.key();
            let h = match self.devices.remove(&key) {
                Some(mut h) => {
                    h.observe(o, now);
                    h
                }
                None => History::new(o, now),
            };
            next.insert(key, h);
        }
        for (key, h) in std::mem::take(&mut self.devices) {
            let is_unread = unread.iter().any(|(g, u)| *g == key.0 && (u.is_none() || *u == key.1));
            if is_unread && now.duration_since(h.last_at) <= MAX_INTERVAL {
                next.entry(key).or_insert(h);
            }
        }
        self.devices = next;
    }

    /// The PIDs last read of the devices `unread` this pass (kept as last read), so their
    /// holders stay looked up.
    pub fn unread_pids(&self, unread: &[DeviceKey]) -> impl Iterator<Item = u32> + '_ {
        let unread = unread.to_vec();
        self.devices
            .iter()
            .filter(move |(key, _)| unread.iter().any(|(g, u)| *g == key.0 && (u.is_none() || *u == key.1)))
            .flat_map(|(_, h)| h.last.pids.iter().copied())
    }

    /// Every device's latest observation with its summary, for `/metrics`.
    pub fn latest(&self, now: Timestamp) -> Vec<(&Observation, DeviceActivity)> {
        let summary = self.summary(now);
        self.devices.values().map(|h| &h.last).zip(summary.devices).collect()
    }

    /// The summary for `GpuNode.status.activity`, as of `now`.
    pub fn summary(&self, now: Timestamp) -> NodeActivity {
        let devices = self
            .devices
            .values()
            .map(|h| DeviceActivity {
                gpu_index: h.last.gpu_index as i32,
                uuid: h.last.uuid.clone(),
                profile: h.last.profile.clone(),
                start: h.last.start.map(i32::from),
                source: h.last.source,
                active_percent_1h: h.mean(now, HOUR),
                active_percent_24h: h.mean(now, DAY),
                idle_since: h.idle_since.map(Time),
                memory_used_mib: h.last.memory_used_mib as i64,
                processes: h.last.processes as i32,
                // Named by the writer, which knows the pods (`holders::summary`); a device seeded
                // unread keeps its stored one.
                pod: h.stored_pod.clone(),
            })
            .collect();
        NodeActivity { measured_at: Some(Time(now)), devices }
    }
}

/// [`Tracker::seed`]: a restart resumes from the stored summary.
mod seed;

#[cfg(test)]
mod tests;
