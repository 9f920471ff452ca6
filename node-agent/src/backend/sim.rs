//! Simulated GPUs that obey the same rules as the hardware: placements from the catalog, NVML-like
//! errors, per-operation latency, processes on instances, and injected faults. State lives in a
//! JSON file, so it survives an agent restart as a real GPU's does; `reboot` clears instances.
//!
//! Processes are read from `<state>.processes.json`, which tests and the demo write (with
//! `node-agent sim run-process`) to play workloads.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

pub use self::model::{CallFault, SimGpu, SimProcess, SimState};
use super::{GpuBackend, GpuInfo, GpuProcess, HardwareProfile, Instance, ModeChange, SmActivity, mode_change};
use crate::Error;

pub mod model;
pub mod split;

/// What a simulated fault does once the operation count passes its threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Every mutating operation after the k-th fails with an error.
    FailAfter(u64),
    /// The process aborts right after the k-th mutating operation (a kill mid-apply).
    CrashAfter(u64),
}

pub struct SimBackend {
    path: PathBuf,
    latency: Duration,
    fault: Option<Fault>,
}

impl SimBackend {
    /// Opens the state file, creating GPUs of the given catalog products if it does not exist
    /// (`A100-40GB`, or `A100-40GB:passthrough` for a GPU passed through to a VM). GPU UUIDs are
    /// derived from the state file's path, the index and the product.
    pub fn open(path: &Path, products: &[String]) -> Result<Self, Error> {
        let sim = Self::at(path);
        let _lock = sim.lock()?;
        if !path.exists() {
            let mut state = SimState::default();
            let host = path.display().to_string();
            for (i, p) in products.iter().enumerate() {
                state.gpus.push(model::new_gpu(&host, i as u32, p)?);
            }
            sim.save(&state)?;
        }
        Ok(sim)
    }

    /// The simulator over a state file, with no latency and no faults.
    pub fn at(path: &Path) -> Self {
        Self { path: path.to_path_buf(), latency: Duration::ZERO, fault: None }
    }

    pub fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    pub fn with_fault(mut self, fault: Option<Fault>) -> Self {
        self.fault = fault;
        self
    }

    fn err(&self, reason: impl ToString) -> Error {
        Error::State { path: self.path.display().to_string(), reason: reason.to_string() }
    }

    pub fn load(&self) -> Result<SimState, Error> {
        let text = std::fs::read_to_string(&self.path).map_err(|e| self.err(e))?;
        serde_json::from_str(&text).map_err(|e| self.err(e))
    }

    pub fn save(&self, state: &SimState) -> Result<(), Error> {
        self.write_atomically(&self.path, state)
    }

    /// Serialises every read-modify-write of the state and processes files across processes (an
    /// agent, `node-agent sim ...`, other NVML clients), as the driver serialises NVML calls.
    /// Held until the guard drops; the kernel releases it if the process dies. Not re-entrant:
    /// take it once per operation, around `load` and `save`.
    pub fn lock(&self) -> Result<StateLock, Error> {
        let mut name = self.path.file_name().unwrap_or_default().to_os_string();
        name.push(".lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.path.with_file_name(name))
            .map_err(|e| self.err(format!("opening the lock file: {e}")))?;
        file.lock().map_err(|e| self.err(format!("locking: {e}")))?;
        Ok(StateLock(file))
    }

    /// A unique temp file + rename: a crash never leaves a torn file, and concurrent writers never
    /// share (and truncate) one temp file, so a reader sees a whole old or whole new file.
    fn write_atomically(&self, path: &Path, value: &impl Serialize) -> Result<(), Error> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let text = serde_json::to_string_pretty(value).map_err(|e| self.err(e))?;
        let mut name = path.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".{}.{}.tmp", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        let tmp = path.with_file_name(name);
        std::fs::write(&tmp, text).map_err(|e| self.err(e))?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            self.err(e)
        })
    }

    pub fn processes_path(&self) -> PathBuf {
        processes_path(&self.path)
    }

    /// Every simulated process on every GPU.
    pub fn all_processes(&self) -> Result<Vec<SimProcess>, Error> {
        match std::fs::read_to_string(self.processes_path()) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| self.err(e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Runs one mutating operation: latency, fault injection, then `f` on the loaded state, saved
    /// atomically afterwards.
    fn mutate<T>(&mut self, f: impl FnOnce(&mut SimState, &[SimProcess]) -> Result<T, Error>) -> Result<T, Error> {
        if !self.latency.is_zero() {
            std::thread::sleep(self.latency);
        }
        let _lock = self.lock()?;
        let mut state = self.load()?;
        if let Some(Fault::FailAfter(k)) = self.fault
            && state.ops >= k
        {
            return Err(Error::InjectedFault(state.ops));
        }
        let processes = self.all_processes()?;
        let out = f(&mut state, &processes)?;
        state.ops += 1;
        self.save(&state)?;
        if let Some(Fault::CrashAfter(k)) = self.fault
            && state.ops >= k
        {
            eprintln!("simulated crash after {} operations", state.ops);
            std::process::abort();
        }
        Ok(out)
    }
}

/// The held state lock (see [`SimBackend::lock`]); dropping it unlocks.
pub struct StateLock(#[allow(dead_code)] std::fs::File);

pub fn processes_path(state: &Path) -> PathBuf {
    let mut name = state.file_name().unwrap_or_default().to_os_string();
    name.push(".processes.json");
    state.with_file_name(name)
}

/// Adds a simulated process on a MIG device (by UUID) or on a whole GPU; used by tests and the demo.
/// `used_mib`: the device memory it holds.
pub fn run_process(
    state: &Path,
    gpu: u32,
    mig_uuid: Option<&str>,
    pid: u32,
    name: &str,
    used_mib: Option<u64>,
) -> Result<(), Error> {
    let sim = SimBackend::at(state);
    let _lock = sim.lock()?;
    let st = sim.load()?;
    let g = st.gpus.get(gpu as usize).ok_or_else(|| Error::NotFound(format!("GPU {gpu}")))?;
    let gpu_instance_id = match mig_uuid {
        None => None,
        Some(u) => Some(
            g.instances
                .iter()
                .find(|i| i.uuid == u)
                .ok_or_else(|| Error::NotFound(format!("MIG device {u} on GPU {gpu}")))?
                .gpu_instance_id,
        ),
    };
    let mut all = sim.all_processes()?;
    let process = GpuProcess { pid, gpu_instance_id, name: name.to_string() };
    all.push(SimProcess { gpu, process, used_mib: used_mib.unwrap_or(0) });
    write_processes(&sim, &all)
}

/// Removes every simulated process with `pid`.
pub fn stop_process(state: &Path, pid: u32) -> Result<(), Error> {
    let sim = SimBackend::at(state);
    let _lock = sim.lock()?;
    let mut all = sim.all_processes()?;
    all.retain(|p| p.process.pid != pid);
    write_processes(&sim, &all)
}

fn write_processes(sim: &SimBackend, all: &[SimProcess]) -> Result<(), Error> {
    sim.write_atomically(&sim.processes_path(), &all)
}

/// A simulated reboot: instances are gone (they never survive one); a pending MIG mode takes
/// effect on Ampere; on Hopper and later MIG mode is not persistent and comes back disabled.
pub fn reboot(state: &Path) -> Result<(), Error> {
    update(state, |st| {
        model::reboot(st);
        true
    })
}

/// A simulated driver restart: a reboot's effect on the GPUs, and NVML sessions opened before it
/// see their GPUs lost.
pub fn driver_restart(state: &Path) -> Result<(), Error> {
    update(state, |st| {
        model::reboot(st);
        st.driver_generation += 1;
        true
    })
}

/// Memory held in a MIG device by a context with no process (a zombie); only a reset frees it.
pub fn leak_memory(state: &Path, gpu: u32, mig_uuid: &str, mib: u64) -> Result<(), Error> {
    let sim = SimBackend::at(state);
    let _lock = sim.lock()?;
    let mut st = sim.load()?;
    let g = model::gpu(&mut st, gpu)?;
    let gi = g
        .instances
        .iter()
        .find(|i| i.uuid == mig_uuid)
        .ok_or_else(|| Error::NotFound(format!("MIG device {mig_uuid} on GPU {gpu}")))?
        .gpu_instance_id;
    g.leaked_mib.insert(gi, mib);
    sim.save(&st)
}

/// Sets the SM activity GPM reports (percent, 0-100) for a MIG device (by UUID) or, without one,
/// for the whole GPU with MIG off.
pub fn set_activity(state: &Path, gpu: u32, mig_uuid: Option<&str>, percent: f64) -> Result<(), Error> {
    if !(0.0..=100.0).contains(&percent) {
        return Err(Error::InvalidArgument(format!("--percent {percent}: SM activity is a percentage, 0 to 100")));
    }
    let sim = SimBackend::at(state);
    let _lock = sim.lock()?;
    let mut st = sim.load()?;
    let g = model::gpu(&mut st, gpu)?;
    match mig_uuid {
        None => g.whole_sm_active_percent = percent,
        Some(uuid) => {
            let gi = g
                .instances
                .iter()
                .find(|i| i.uuid == uuid)
                .ok_or_else(|| Error::NotFound(format!("MIG device {uuid} on GPU {gpu}")))?
                .gpu_instance_id;
            g.sm_active_percent.insert(gi, percent);
        }
    }
    sim.save(&st)
}

/// A client (by name) starts or stops holding a GPU's device open (see `SimGpu::holders`).
pub fn hold_device(state: &Path, gpu: u32, holder: &str, holding: bool) -> Result<(), Error> {
    let sim = SimBackend::at(state);
    let _lock = sim.lock()?;
    let mut st = sim.load()?;
    let holders = &mut model::gpu(&mut st, gpu)?.holders;
    holders.retain(|h| h != holder);
    if holding {
        holders.push(holder.to_string());
    }
    sim.save(&st)
}

/// Adds a fault for the simulated NVML library to inject.
pub fn add_call_fault(state: &Path, fault: CallFault) -> Result<(), Error> {
    update(state, |st| {
        st.call_faults.push(fault);
        false
    })
}

/// One locked read-modify-write of the state; `f` returns whether the processes are gone too.
fn update(state: &Path, f: impl FnOnce(&mut SimState) -> bool) -> Result<(), Error> {
    let sim = SimBackend::at(state);
    let _lock = sim.lock()?;
    let mut st = sim.load()?;
    let clear_processes = f(&mut st);
    sim.save(&st)?;
    if clear_processes {
        write_processes(&sim, &[])?;
    }
    Ok(())
}

impl GpuBackend for SimBackend {
    fn inventory(&mut self) -> Result<Vec<GpuInfo>, Error> {
        Ok(self.load()?.gpus.into_iter().map(|g| g.info).collect())
    }

    fn profiles(&mut self, gpu: u32) -> Result<Vec<HardwareProfile>, Error> {
        let mut st = self.load()?;
        let g = model::gpu(&mut st, gpu)?;
        Ok(model::profiles(model::model(&g.info.product)?))
    }

    fn instances(&mut self, gpu: u32) -> Result<Vec<Instance>, Error> {
        let mut st = self.load()?;
        let g = model::gpu(&mut st, gpu)?;
        let mut list = g.instances.clone();
        for i in &mut list {
            i.split_compute = g.split.get(&i.gpu_instance_id).map_or(0, |v| v.len() as u32);
        }
        list.sort_by_key(|i| i.start);
        Ok(list)
    }

    fn processes(&mut self, gpu: u32) -> Result<Vec<GpuProcess>, Error> {
        Ok(self.all_processes()?.into_iter().filter(|p| p.gpu == gpu).map(|p| p.process).collect())
    }

    fn memory_used_mib(&mut self, gpu: u32, gpu_instance_id: u32) -> Result<u64, Error> {
        Ok(model::memory_used_mib(&self.load()?, &self.all_processes()?, gpu, gpu_instance_id))
    }

    fn gpu_memory_used_mib(&mut self, gpu: u32) -> Result<u64, Error> {
        let st = self.load()?;
        let g = st.gpus.get(gpu as usize).ok_or_else(|| Error::NotFound(format!("GPU {gpu}")))?;
        let procs: u64 = self.all_processes()?.iter().filter(|p| p.gpu == gpu).map(|p| p.used_mib).sum();
        Ok(procs + g.leaked_mib.values().sum::<u64>())
    }

    /// Hopper and later report the set activity (`sim set-activity`) at once: the simulator's
    /// activity is a level, so no first sample is needed. Ampere has no GPM.
    fn sm_activity(&mut self, gpu: u32, gpu_instance_id: Option<u32>, _uuid: &str) -> Result<SmActivity, Error> {
        let st = self.load()?;
        let g = st.gpus.get(gpu as usize).ok_or_else(|| Error::NotFound(format!("GPU {gpu}")))?;
        if model::is_ampere(&g.info.product) {
            return Ok(SmActivity::Unsupported);
        }
        if let Some(gi) = gpu_instance_id
            && !g.instances.iter().any(|i| i.gpu_instance_id == gi)
        {
            return Err(Error::NotFound(format!("GPU instance {gi} on GPU {gpu}")));
        }
        Ok(SmActivity::Percent(model::sm_active_percent(&st, gpu, gpu_instance_id)))
    }

    fn set_mig_mode(&mut self, gpu: u32, enabled: bool) -> Result<ModeChange, Error> {
        let activation = self.mutate(|st, procs| model::set_mig_mode(st, procs, gpu, enabled))?;
        mode_change(gpu, enabled, activation)
    }

    /// Two operations, as on the hardware: a crash between them leaves a GPU instance alone.
    fn create_instance(&mut self, gpu: u32, profile: &str, start: u8) -> Result<Instance, Error> {
        let gi = self.mutate(|st, _| model::create_gpu_instance(st, gpu, profile, start))?;
        match self.mutate(|st, _| model::create_compute_instance(st, gpu, gi.gpu_instance_id)) {
            Ok(done) => Ok(done),
            Err(e) => {
                let _ = self.mutate(|st, _| model::destroy_gpu_instance(st, gpu, gi.gpu_instance_id));
                Err(e)
            }
        }
    }

    fn destroy_instance(&mut self, gpu: u32, gpu_instance_id: u32) -> Result<(), Error> {
        let has_compute = self
            .instances(gpu)?
            .iter()
            .any(|i| i.gpu_instance_id == gpu_instance_id && i.compute_instance_id.is_some());
        if has_compute {
            self.mutate(|st, procs| model::destroy_compute_instance(st, procs, gpu, gpu_instance_id))?;
        }
        self.mutate(|st, _| model::destroy_gpu_instance(st, gpu, gpu_instance_id))
    }

    fn destroy_half_made(&mut self, gpu: u32, gpu_instance_id: u32) -> Result<(), Error> {
        self.mutate(|st, _| model::destroy_gpu_instance(st, gpu, gpu_instance_id))
    }
}

#[cfg(test)]
mod tests;
