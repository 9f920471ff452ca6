//! A simulated backend whose reads of chosen devices fail (a lost GPU, a GPM fault), for the
//! activity pass's tests.

use crate::Error;
use crate::backend::sim::SimBackend;
use crate::backend::{GpuBackend, GpuInfo, GpuProcess, HardwareProfile, Instance, ModeChange, SmActivity};

/// Which read fails on which device: (GPU, GPU instance or `None` for any/the whole GPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    Processes(u32),
    Instances(u32),
    Memory(u32, Option<u32>),
    Gpm(u32, Option<u32>),
    /// GPM answers "first sample" (no figure) for this device.
    GpmFirst(u32, Option<u32>),
}

pub struct Faulty {
    pub inner: SimBackend,
    pub failing: Vec<Read>,
}

fn lost() -> Error {
    Error::Nvml("GPU_IS_LOST".into())
}

impl Faulty {
    fn fails(&self, r: Read) -> bool {
        self.failing.contains(&r)
    }
}

impl GpuBackend for Faulty {
    fn inventory(&mut self) -> Result<Vec<GpuInfo>, Error> {
        self.inner.inventory()
    }
    fn profiles(&mut self, gpu: u32) -> Result<Vec<HardwareProfile>, Error> {
        self.inner.profiles(gpu)
    }
    fn instances(&mut self, gpu: u32) -> Result<Vec<Instance>, Error> {
        if self.fails(Read::Instances(gpu)) {
            return Err(lost());
        }
        self.inner.instances(gpu)
    }
    fn processes(&mut self, gpu: u32) -> Result<Vec<GpuProcess>, Error> {
        if self.fails(Read::Processes(gpu)) {
            return Err(lost());
        }
        self.inner.processes(gpu)
    }
    fn memory_used_mib(&mut self, gpu: u32, gi: u32) -> Result<u64, Error> {
        if self.fails(Read::Memory(gpu, Some(gi))) {
            return Err(lost());
        }
        self.inner.memory_used_mib(gpu, gi)
    }
    fn gpu_memory_used_mib(&mut self, gpu: u32) -> Result<u64, Error> {
        if self.fails(Read::Memory(gpu, None)) {
            return Err(lost());
        }
        self.inner.gpu_memory_used_mib(gpu)
    }
    fn sm_activity(&mut self, gpu: u32, gi: Option<u32>, uuid: &str) -> Result<SmActivity, Error> {
        if self.fails(Read::Gpm(gpu, gi)) {
            return Err(Error::Nvml("nvmlGpmMigSampleGet: NOT_SUPPORTED".into()));
        }
        if self.fails(Read::GpmFirst(gpu, gi)) {
            return Ok(SmActivity::FirstSample);
        }
        self.inner.sm_activity(gpu, gi, uuid)
    }
    fn set_mig_mode(&mut self, gpu: u32, enabled: bool) -> Result<ModeChange, Error> {
        self.inner.set_mig_mode(gpu, enabled)
    }
    fn create_instance(&mut self, gpu: u32, profile: &str, start: u8) -> Result<Instance, Error> {
        self.inner.create_instance(gpu, profile, start)
    }
    fn destroy_instance(&mut self, gpu: u32, gi: u32) -> Result<(), Error> {
        self.inner.destroy_instance(gpu, gi)
    }
    fn destroy_half_made(&mut self, gpu: u32, gi: u32) -> Result<(), Error> {
        self.inner.destroy_half_made(gpu, gi)
    }
}
