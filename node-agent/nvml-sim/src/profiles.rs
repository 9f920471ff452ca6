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

/// A GPU-instance profile's SMs and engines, as `nvmlGpuInstanceProfileInfo_v3_t` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Engines {
    pub sm: u32,
    pub copy: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpeg: u32,
    pub ofa: u32,
}

const fn e(sm: u32, copy: u32, decoders: u32, jpeg: u32, ofa: u32) -> Engines {
    // No MIG profile on these boards has an NVENC.
    Engines { sm, copy, decoders, encoders: 0, jpeg, ofa }
}

/// Per board (catalog name) and profile: H100 80GB HBM3 as read on the board
/// (docs/hardware/h100-80gb-hbm3.nvml.json, driver 580.159.04); A100 and A30 from the MIG user
/// guide's "Supported MIG Profiles" tables (engines, copy engines), SMs from `nvidia-smi mig -lgip`
/// dumps (A30) and NVIDIA's go-nvml mock (A100: 14 per slice, 98 for 7g). ASSUMED: the other
/// Hopper boards (H100 94/96GB, H200, GH200) as the H100 80GB.
const ENGINES: &[(&str, &str, Engines)] = &[
    ("H100", "1g", e(16, 1, 1, 1, 0)),
    ("H100", "1g+me", e(16, 1, 1, 1, 1)),
    ("H100", "1g.2x", e(26, 1, 1, 1, 0)),
    ("H100", "2g", e(32, 2, 2, 2, 0)),
    ("H100", "3g", e(60, 3, 3, 3, 0)),
    ("H100", "4g", e(64, 4, 4, 4, 0)),
    ("H100", "7g", e(132, 8, 7, 7, 1)),
    ("A100", "1g", e(14, 1, 0, 0, 0)),
    ("A100", "1g+me", e(14, 1, 1, 1, 1)),
    ("A100", "1g.2x", e(14, 1, 1, 0, 0)),
    ("A100", "2g", e(28, 2, 1, 0, 0)),
    ("A100", "3g", e(42, 3, 2, 0, 0)),
    ("A100", "4g", e(56, 4, 2, 0, 0)),
    ("A100", "7g", e(98, 7, 5, 1, 1)),
    ("A30", "1g", e(14, 1, 0, 0, 0)),
    ("A30", "1g+me", e(14, 1, 1, 1, 1)),
    ("A30", "2g", e(28, 2, 2, 0, 0)),
    ("A30", "2g+me", e(28, 2, 2, 1, 1)),
    ("A30", "4g", e(56, 4, 4, 1, 1)),
];

/// The board family a catalog model's engines follow.
fn family(model: &str) -> Option<&'static str> {
    match model {
        "A100-40GB" | "A100-80GB" => Some("A100"),
        "A30-24GB" => Some("A30"),
        "H100-80GB" | "H100-94GB" | "H100-96GB" | "H200-141GB" | "GH200-144GB" => Some("H100"),
        _ => None,
    }
}

/// A profile's shape key in [`ENGINES`]: `1g`, `1g+me`, `1g.2x` (a 1-slice profile with two
/// memory slices), `2g`, ...
fn shape(p: &HardwareProfile) -> String {
    let me = if p.name.ends_with("+me") { "+me" } else { "" };
    let wide = if p.compute_slices == 1 && p.memory_slices == 2 { ".2x" } else { "" };
    format!("{}g{wide}{me}", p.compute_slices)
}

/// SMs and engines of a profile on a product. Boards without a table: 16 SMs and one copy engine
/// per compute slice, no media engines (an estimate; the agent reads none of it).
pub fn engines(product: &str, p: &HardwareProfile) -> Engines {
    let key = shape(p);
    table(product)
        .and_then(|(m, _)| family(m.name))
        .and_then(|f| ENGINES.iter().find(|(b, s, _)| *b == f && *s == key))
        .map(|(_, _, e)| *e)
        .unwrap_or(e(u32::from(p.compute_slices) * 16, u32::from(p.compute_slices), 0, 0, 0))
}

/// SMs per profile (see [`engines`]); kept for the callers that want only the count.
#[allow(dead_code)]
pub fn multiprocessors(product: &str, p: &HardwareProfile) -> u32 {
    engines(product, p).sm
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

/// The compute slices of a `NVML_COMPUTE_INSTANCE_PROFILE_*` enum (the inverse of
/// [`full_ci_enum`]).
pub fn ci_enum_slices(e: u32) -> Option<u8> {
    (1..=8u8).find(|s| full_ci_enum(*s) == Some(e))
}
