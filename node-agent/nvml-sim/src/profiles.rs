//! NVML's view of a simulated GPU's profiles: profile enums (`NVML_GPU_INSTANCE_PROFILE_*`) and
//! the info structs, from the simulator's table.

use tessera_crds::catalog::GpuModel;
use tessera_node_agent::backend::HardwareProfile;
use tessera_node_agent::backend::sim::model;

/// The `NVML_GPU_INSTANCE_PROFILE_*` enum of a profile, by its shape (nvml.h): 1 slice = 0,
/// 2 = 1, 3 = 2, 4 = 3, 7 = 4, 8 = 5, 6 = 6; `+me` 1 slice = 7 (`_REV1`), 2 slices = 8;
/// a 1-slice profile with two memory slices = 9 (`_REV2`); RTX PRO Blackwell variants: `+gfx`
/// 1/2/4 slices = 10/11/12 (3 = 17), `-me` 1/2 = 13/14, `+me.all` 1/2 = 15/16. On the H100 this
/// gives the enum -> id pairs read on the hardware (docs/hardware/h100-80gb-hbm3.nvml.json).
pub fn gi_enum(p: &HardwareProfile) -> Option<u32> {
    let suffix = tessera_crds::catalog::parse_profile_name(&p.name).map_or("", |n| n.suffix);
    Some(match (p.compute_slices, p.memory_slices, suffix) {
        (1, _, "+gfx") => 10,
        (2, _, "+gfx") => 11,
        (4, _, "+gfx") => 12,
        (3, _, "+gfx") => 17,
        (1, _, "-me") => 13,
        (2, _, "-me") => 14,
        (1, _, "+me.all") => 15,
        (2, _, "+me.all") => 16,
        (1, _, "+me") => 7,
        (2, _, "+me") => 8,
        (_, _, "") => match (p.compute_slices, p.memory_slices) {
            (1, 1) => 0,
            (1, 2) => 9,
            (2, _) => 1,
            (3, _) => 2,
            (4, _) => 3,
            (7, _) => 4,
            (8, _) => 5,
            (6, _) => 6,
            _ => return None,
        },
        _ => return None,
    })
}

pub fn table(product: &str) -> Option<(&'static GpuModel, Vec<HardwareProfile>)> {
    let m = model::model(product).ok()?;
    Some((m, model::profiles(m)))
}

pub fn by_enum(product: &str, e: u32) -> Option<HardwareProfile> {
    table(product)?.1.into_iter().find(|p| gi_enum(p) == Some(e))
}

pub fn by_id(product: &str, id: u32) -> Option<HardwareProfile> {
    table(product)?.1.into_iter().find(|p| p.id == id)
}

pub fn by_name(product: &str, name: &str) -> Option<HardwareProfile> {
    table(product)?.1.into_iter().find(|p| p.name == name)
}

/// SMs per profile: the H100 80GB HBM3's as read on the board; elsewhere 16 per compute slice
/// (an estimate; the agent does not read it).
pub fn multiprocessors(product: &str, p: &HardwareProfile) -> u32 {
    if product.contains("H100 80GB HBM3") {
        match gi_enum(p) {
            Some(0 | 7) => return 16,
            Some(1) => return 32,
            Some(2) => return 60,
            Some(3) => return 64,
            Some(4) => return 132,
            Some(9) => return 26,
            _ => {}
        }
    }
    u32::from(p.compute_slices) * 16
}

/// The `NVML_COMPUTE_INSTANCE_PROFILE_*` enum of the full-size compute instance of a GPU
/// instance with `slices` compute slices; the simulator models only that one, and its profile
/// id equals its enum, as on the boards we have records of.
pub fn full_ci_enum(slices: u8) -> Option<u32> {
    Some(match slices {
        1 => 0,
        2 => 1,
        3 => 2,
        4 => 3,
        7 => 4,
        8 => 5,
        6 => 6,
        _ => return None,
    })
}
