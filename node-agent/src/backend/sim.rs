//! Simulated GPUs that obey the same rules as the hardware: placements from the catalog, NVML-like
//! errors, per-operation latency, processes on instances, and injected faults. State lives in a
//! JSON file, so it survives an agent restart as a real GPU's does; `reboot` clears instances.
//!
//! Processes are read from `<state>.processes.json`, which tests and the demo write (with
//! `node-agent sim run-process`) to play workloads.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tessera_crds::catalog::{self, GpuModel};
use tessera_crds::solver::{self, Placement};

use super::{GpuBackend, GpuInfo, GpuProcess, HardwareProfile, Instance, ModeChange, catalog_profiles};
use crate::Error;

/// What a simulated fault does once the operation count passes its threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Every mutating operation after the k-th fails with an error.
    FailAfter(u64),
    /// The process aborts right after the k-th mutating operation (a kill mid-apply).
    CrashAfter(u64),
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimState {
    pub gpus: Vec<SimGpu>,
    /// Mutating operations performed so far (drives injected faults).
    pub ops: u64,
    pub next_uuid: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimGpu {
    pub info: GpuInfo,
    pub instances: Vec<Instance>,
    pub next_gpu_instance_id: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimProcess {
    pub gpu: u32,
    #[serde(flatten)]
    pub process: GpuProcess,
}

pub struct SimBackend {
    path: PathBuf,
    latency: Duration,
    fault: Option<Fault>,
}

/// Ampere boards need a GPU reset to change MIG mode; Hopper and later do not.
fn needs_reset(product: &str) -> bool {
    product.contains("A100") || product.contains("A30")
}

impl SimBackend {
    /// Opens the state file, creating GPUs of the given catalog products if it does not exist.
    pub fn open(path: &Path, products: &[String]) -> Result<Self, Error> {
        let sim = Self::at(path);
        if !path.exists() {
            let mut state = SimState::default();
            for (i, p) in products.iter().enumerate() {
                let model = catalog::lookup(p)
                    .ok_or_else(|| Error::InvalidArgument(format!("unknown simulated GPU product {p:?}")))?;
                let full = model.profiles.iter().map(|p| p.memory_gb()).max().unwrap_or(0);
                state.gpus.push(SimGpu {
                    info: GpuInfo {
                        index: i as u32,
                        uuid: format!("GPU-sim-{i:04}-{}", model.name.to_ascii_lowercase()),
                        product: model.nvml_names.first().copied().unwrap_or(model.name).to_string(),
                        memory_mib: u64::from(full) * 1024,
                        mig_capable: true,
                        mig_enabled: false,
                        mig_pending: None,
                    },
                    instances: Vec::new(),
                    next_gpu_instance_id: 1,
                });
            }
            sim.save(&state)?;
        }
        Ok(sim)
    }

    /// The simulator over a state file, with no latency and no faults.
    fn at(path: &Path) -> Self {
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

    fn save(&self, state: &SimState) -> Result<(), Error> {
        self.write_atomically(&self.path, state)
    }

    /// Temp file + rename: a crash never leaves a torn state or processes file.
    fn write_atomically(&self, path: &Path, value: &impl Serialize) -> Result<(), Error> {
        let text = serde_json::to_string_pretty(value).map_err(|e| self.err(e))?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).map_err(|e| self.err(e))?;
        std::fs::rename(&tmp, path).map_err(|e| self.err(e))
    }

    pub fn processes_path(&self) -> PathBuf {
        processes_path(&self.path)
    }

    fn all_processes(&self) -> Result<Vec<SimProcess>, Error> {
        match std::fs::read_to_string(self.processes_path()) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| self.err(e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(self.err(e)),
        }
    }

    fn gpu(state: &mut SimState, gpu: u32) -> Result<&mut SimGpu, Error> {
        state.gpus.get_mut(gpu as usize).ok_or_else(|| Error::NotFound(format!("GPU {gpu}")))
    }

    fn model(product: &str) -> Result<&'static GpuModel, Error> {
        catalog::lookup(product).ok_or_else(|| Error::NotSupported(format!("{product} has no MIG geometry")))
    }

    /// Runs one mutating operation: latency, fault injection, then `f` on the loaded state, saved
    /// atomically afterwards.
    fn mutate<T>(&mut self, f: impl FnOnce(&mut SimState, &[SimProcess]) -> Result<T, Error>) -> Result<T, Error> {
        if !self.latency.is_zero() {
            std::thread::sleep(self.latency);
        }
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

pub fn processes_path(state: &Path) -> PathBuf {
    let mut name = state.file_name().unwrap_or_default().to_os_string();
    name.push(".processes.json");
    state.with_file_name(name)
}

/// Adds a simulated process on a MIG device (by UUID) or on a whole GPU; used by tests and the demo.
pub fn run_process(state: &Path, gpu: u32, mig_uuid: Option<&str>, pid: u32, name: &str) -> Result<(), Error> {
    let sim = SimBackend::at(state);
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
    all.push(SimProcess { gpu, process: GpuProcess { pid, gpu_instance_id, name: name.to_string() } });
    write_processes(&sim, &all)
}

/// Removes every simulated process with `pid`.
pub fn stop_process(state: &Path, pid: u32) -> Result<(), Error> {
    let sim = SimBackend::at(state);
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
    let sim = SimBackend::at(state);
    let mut st = sim.load()?;
    for g in &mut st.gpus {
        g.instances.clear();
        g.info.mig_enabled = match g.info.mig_pending.take() {
            Some(pending) => pending,
            None => needs_reset(&g.info.product) && g.info.mig_enabled,
        };
    }
    sim.save(&st)?;
    write_processes(&sim, &[])
}

impl GpuBackend for SimBackend {
    fn inventory(&mut self) -> Result<Vec<GpuInfo>, Error> {
        Ok(self.load()?.gpus.into_iter().map(|g| g.info).collect())
    }

    fn profiles(&mut self, gpu: u32) -> Result<Vec<HardwareProfile>, Error> {
        let mut st = self.load()?;
        let g = Self::gpu(&mut st, gpu)?;
        Ok(catalog_profiles(Self::model(&g.info.product)?))
    }

    fn instances(&mut self, gpu: u32) -> Result<Vec<Instance>, Error> {
        let mut st = self.load()?;
        let mut list = Self::gpu(&mut st, gpu)?.instances.clone();
        list.sort_by_key(|i| i.start);
        Ok(list)
    }

    fn processes(&mut self, gpu: u32) -> Result<Vec<GpuProcess>, Error> {
        Ok(self.all_processes()?.into_iter().filter(|p| p.gpu == gpu).map(|p| p.process).collect())
    }

    fn set_mig_mode(&mut self, gpu: u32, enabled: bool) -> Result<ModeChange, Error> {
        self.mutate(|st, procs| {
            let g = Self::gpu(st, gpu)?;
            if !g.info.mig_capable {
                return Err(Error::NotSupported(format!("GPU {gpu} is not MIG capable")));
            }
            if !g.instances.is_empty() || procs.iter().any(|p| p.gpu == gpu) {
                return Err(Error::InUse(format!("GPU {gpu} has MIG instances or processes")));
            }
            if g.info.mig_enabled == enabled {
                g.info.mig_pending = None;
                return Ok(ModeChange::Applied);
            }
            if needs_reset(&g.info.product) {
                g.info.mig_pending = Some(enabled);
                Ok(ModeChange::ResetRequired)
            } else {
                g.info.mig_enabled = enabled;
                g.info.mig_pending = None;
                Ok(ModeChange::Applied)
            }
        })
    }

    fn create_instance(&mut self, gpu: u32, profile: &str, start: u8) -> Result<Instance, Error> {
        self.mutate(|st, _| {
            let uuid_n = st.next_uuid;
            let g = Self::gpu(st, gpu)?;
            if !g.info.mig_enabled {
                return Err(Error::InvalidArgument(format!("MIG mode is disabled on GPU {gpu}")));
            }
            let model = Self::model(&g.info.product)?;
            let spec = model
                .profile(profile)
                .ok_or_else(|| Error::InvalidArgument(format!("profile {profile} on {}", model.name)))?;
            let mut layout: Vec<Placement> = g
                .instances
                .iter()
                .map(|i| Placement { start: i.start, size: i.size, profile: i.profile.clone() })
                .collect();
            layout.push(Placement { start, size: spec.memory_slices, profile: spec.name.to_string() });
            if !solver::is_valid(model, &layout) {
                return Err(Error::InsufficientResources(format!(
                    "{}@{start} does not fit next to {:?}",
                    spec.name, g.instances
                )));
            }
            let id = g.next_gpu_instance_id;
            g.next_gpu_instance_id += 1;
            let instance = Instance {
                gpu_instance_id: id,
                compute_instance_id: 0,
                profile: spec.name.to_string(),
                start,
                size: spec.memory_slices,
                uuid: format!("MIG-sim-{gpu:02}-{uuid_n:06}"),
            };
            g.instances.push(instance.clone());
            st.next_uuid += 1;
            Ok(instance)
        })
    }

    fn destroy_instance(&mut self, gpu: u32, gpu_instance_id: u32) -> Result<(), Error> {
        self.mutate(|st, procs| {
            let g = Self::gpu(st, gpu)?;
            let Some(pos) = g.instances.iter().position(|i| i.gpu_instance_id == gpu_instance_id) else {
                return Err(Error::NotFound(format!("GPU instance {gpu_instance_id} on GPU {gpu}")));
            };
            if procs.iter().any(|p| p.gpu == gpu && p.process.gpu_instance_id == Some(gpu_instance_id)) {
                return Err(Error::InUse(format!("GPU instance {gpu_instance_id} on GPU {gpu} has processes")));
            }
            g.instances.remove(pos);
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests;
