//! Compute instances smaller than their GPU instance, as an admin makes with `nvidia-smi mig
//! -cci` (e.g. three 1-slice ones in a 3g): the driver lists and counts them; the agent reports
//! such a GPU and leaves it alone (it manages only whole MIG devices).

use super::model::{SimGpu, SimProcess, SimState, SplitCompute, gpu, instance, model, on_gpu, uuid};
use crate::Error;

/// Compute-instance sizes smaller than a GPU instance of `gi_slices` compute slices, with how many
/// fit in it (the MIG user guide's CI profiles: 1c and 2c in every GI larger than them; 3c and 4c
/// only in a 7g/8g one).
pub fn split_sizes(gi_slices: u8) -> Vec<(u8, u32)> {
    [1u8, 2, 3, 4]
        .into_iter()
        .filter(|&c| c < gi_slices && (c <= 2 || gi_slices >= 7))
        .map(|c| (c, free_starts(gi_slices, c, &[]).len() as u32))
        .collect()
}

/// Starts where a `slices`-wide compute instance fits in a GPU instance of `gi_slices` next to
/// `taken`: aligned to the next power of two (1c anywhere, 2c at 0/2/4, 3c and 4c at 0/4).
pub fn free_starts(gi_slices: u8, slices: u8, taken: &[SplitCompute]) -> Vec<u8> {
    let align = slices.next_power_of_two();
    (0..gi_slices)
        .step_by(usize::from(align))
        .filter(|s| s + slices <= gi_slices)
        .filter(|s| taken.iter().all(|t| s + slices <= t.start || t.start + t.slices <= *s))
        .collect()
}

/// The compute slices of a GPU instance, from its profile.
pub(crate) fn gi_slices(g: &SimGpu, gpu_index: u32, gi: u32) -> Result<u8, Error> {
    let profile = g
        .instances
        .iter()
        .find(|i| i.gpu_instance_id == gi)
        .ok_or_else(|| Error::NotFound(format!("GPU instance {gi} on GPU {gpu_index}")))?
        .profile
        .clone();
    model(&g.info.product)?
        .profile(&profile)
        .map(|p| p.compute_slices)
        .ok_or_else(|| Error::InvalidArgument(format!("profile {profile}")))
}

/// `nvmlGpuInstanceCreateComputeInstance` with a profile smaller than the GPU instance: placed at
/// the lowest free start; refused next to a full-size compute instance or when none fits.
pub fn create_split_compute_instance(
    st: &mut SimState,
    gpu_index: u32,
    gi: u32,
    slices: u8,
) -> Result<SplitCompute, Error> {
    let serial = st.next_uuid.to_string();
    let g = gpu(st, gpu_index)?;
    let total = gi_slices(g, gpu_index, gi)?;
    if !split_sizes(total).iter().any(|(c, _)| *c == slices) {
        return Err(Error::InvalidArgument(format!(
            "no {slices}-slice compute instance in a {total}-slice GPU instance"
        )));
    }
    if instance(g, gpu_index, gi)?.compute_instance_id.is_some() {
        return Err(Error::InsufficientResources(format!("GPU instance {gi} has its full-size compute instance")));
    }
    let uuid_base = g.info.uuid.clone();
    let list = g.split.entry(gi).or_default();
    let start = *free_starts(total, slices, list).first().ok_or_else(|| {
        Error::InsufficientResources(format!("no room for a {slices}-slice compute instance in GPU instance {gi}"))
    })?;
    let id = (0..).find(|id| list.iter().all(|c| c.id != *id)).unwrap_or(0);
    let made =
        SplitCompute { id, slices, start, uuid: uuid("MIG", &[&uuid_base, &gi.to_string(), &id.to_string(), &serial]) };
    list.push(made.clone());
    list.sort_by_key(|c| c.start);
    st.next_uuid += 1;
    Ok(made)
}

/// `nvmlComputeInstanceDestroy` of a smaller compute instance: refused while a process runs in
/// its GPU instance (the simulator does not tell which compute instance a process is in).
pub fn destroy_split_compute_instance(
    st: &mut SimState,
    procs: &[SimProcess],
    gpu_index: u32,
    gi: u32,
    ci: u32,
) -> Result<(), Error> {
    if on_gpu(procs, gpu_index).any(|p| p.process.gpu_instance_id == Some(gi)) {
        return Err(Error::InUse(format!("GPU instance {gi} on GPU {gpu_index} has processes")));
    }
    let list = gpu(st, gpu_index)?.split.entry(gi).or_default();
    let before = list.len();
    list.retain(|c| c.id != ci);
    if list.len() == before {
        return Err(Error::NotFound(format!("compute instance {ci} of GPU instance {gi} on GPU {gpu_index}")));
    }
    Ok(())
}
