//! Allocated versus used: what each MIG instance, or whole GPU with MIG off, did lately.
//! [`sample`] reads one observation per device from the backend (GPM's SM activity where the
//! board has it, else compute processes and memory); [`tracker`] keeps the 1 h and 24 h means and
//! since when each device has been idle, with the time passed in; [`write`] decides whether the
//! summary in `GpuNode.status.activity` is worth an API write; [`holders`] names the pod running
//! on each device.

pub mod backoff;
pub mod bench;
pub mod failing;
#[cfg(test)]
pub mod faulty;
pub mod holders;
pub mod lookup;
pub mod metrics;
pub mod previous;
pub mod prune;
pub mod sample;
pub mod tracker;
pub mod write;
pub mod writer;

pub use tracker::{DeviceKey, Observation, Tracker};
