//! The catalog's data. Sources (see shared research notes, cross-checked on hardware where noted):
//! - NVIDIA MIG User Guide, "Supported MIG Profiles" (docs.nvidia.com/datacenter/tesla/mig-user-guide/
//!   supported-mig-profiles.html): slices, fractions and max counts per board.
//! - `nvidia-smi mig -lgip` / `-lgipp` output in the guide's "Getting Started" page (A100-40GB) and in
//!   NVIDIA issues/PRs (ids, placements for the other boards).
//! - H100-80GB was read on real hardware (NVIDIA H100 80GB HBM3, driver 580.159.04) on 2026-11-22:
//!   ids, max counts and placements below match exactly (docs/hardware/h100-80gb-hbm3.txt).

use super::{GpuModel, ProfileSpec};

const fn p(
    name: &'static str,
    id: u32,
    compute_slices: u8,
    memory_slices: u8,
    max_count: u8,
    starts: &'static [u8],
) -> ProfileSpec {
    ProfileSpec { name, id, compute_slices, memory_slices, max_count, starts, media_extensions: false }
}

const fn me(profile: ProfileSpec) -> ProfileSpec {
    ProfileSpec { media_extensions: true, ..profile }
}

const ANY_OF_7: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
const EVEN: &[u8] = &[0, 2, 4, 6];
const TWO_SLICE: &[u8] = &[0, 2, 4];
const HALVES: &[u8] = &[0, 4];
const FIRST: &[u8] = &[0];

/// The seven-profile, eight-memory-slot pattern shared by A100, H100, H200, GH200 and B200:
/// 1g (ids 19/20 for `+me`), double-memory 1g (15), 2g (14), 3g (9), 4g (5), 7g (0).
macro_rules! eight_slot {
    ($one:literal, $two:literal, $four:literal, $all:literal) => {
        &[
            p(concat!("1g.", $one, "gb"), 19, 1, 1, 7, ANY_OF_7),
            me(p(concat!("1g.", $one, "gb+me"), 20, 1, 1, 1, ANY_OF_7)),
            p(concat!("1g.", $two, "gb"), 15, 1, 2, 4, EVEN),
            p(concat!("2g.", $two, "gb"), 14, 2, 2, 3, TWO_SLICE),
            p(concat!("3g.", $four, "gb"), 9, 3, 4, 2, HALVES),
            p(concat!("4g.", $four, "gb"), 5, 4, 4, 1, FIRST),
            p(concat!("7g.", $all, "gb"), 0, 7, 8, 1, FIRST),
        ]
    };
}

pub static MODELS: &[GpuModel] = &[
    GpuModel {
        name: "A30-24GB",
        nvml_names: &["NVIDIA A30"],
        pci_device_ids: &[0x20B7],
        memory_slots: 4,
        compute_slices: 4,
        // Four-slot axis. Ids/placements from a user's -lgip/-lgipp dump; the 2g+me profile needs R525+.
        profiles: &[
            p("1g.6gb", 14, 1, 1, 4, &[0, 1, 2, 3]),
            me(p("1g.6gb+me", 21, 1, 1, 1, &[0, 1, 2, 3])),
            p("2g.12gb", 5, 2, 2, 2, &[0, 2]),
            me(p("2g.12gb+me", 6, 2, 2, 1, &[0, 2])),
            p("4g.24gb", 0, 4, 4, 1, FIRST),
        ],
        source: "MIG User Guide A30 table; ids and placements from a public -lgip/-lgipp dump",
    },
    GpuModel {
        name: "A100-40GB",
        nvml_names: &["NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"],
        pci_device_ids: &[0x20B0, 0x20B1, 0x20F1, 0x20F6],
        memory_slots: 8,
        compute_slices: 7,
        // The guide's worked -lgip/-lgipp example. 1g.10gb needs R525+. The doc lists 1g.10gb as 1/8
        // of memory, but -lgipp shows ":2"; we follow the hardware output.
        profiles: eight_slot!("5", "10", "20", "40"),
        source: "MIG User Guide A100 table and its -lgip/-lgipp example (getting-started-with-mig)",
    },
    GpuModel {
        name: "A100-80GB",
        nvml_names: &["NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"],
        pci_device_ids: &[0x20B2, 0x20B5, 0x20F3, 0x20F5],
        memory_slots: 8,
        compute_slices: 7,
        profiles: eight_slot!("10", "20", "40", "80"),
        source: "MIG User Guide A100-80GB table; ids from -lgip samples. ASSUMED: placements equal A100-40GB",
    },
    GpuModel {
        name: "H100-80GB",
        nvml_names: &["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H800", "NVIDIA H800 PCIe"],
        pci_device_ids: &[0x2330, 0x2331, 0x2322, 0x2324],
        memory_slots: 8,
        compute_slices: 7,
        profiles: eight_slot!("10", "20", "40", "80"),
        source: "MIG User Guide H100 80GB table; verified on an H100 80GB HBM3 with driver 580.159.04",
    },
    GpuModel {
        name: "H100-94GB",
        nvml_names: &["NVIDIA H100 NVL", "NVIDIA H800 NVL"],
        pci_device_ids: &[0x2321, 0x233A],
        memory_slots: 8,
        compute_slices: 7,
        profiles: eight_slot!("12", "24", "47", "94"),
        source: "MIG User Guide H100 94GB table; ids from -lgip samples; placements from an NVIDIA example",
    },
    GpuModel {
        name: "H100-96GB",
        nvml_names: &["NVIDIA GH200 480GB", "NVIDIA H100 96GB HBM3", "NVIDIA H20"],
        pci_device_ids: &[0x2342, 0x233D, 0x20B6, 0x2329],
        memory_slots: 8,
        compute_slices: 7,
        profiles: eight_slot!("12", "24", "48", "96"),
        source: "MIG User Guide H100 96GB table. ASSUMED: 7g.96gb id 0 and placements equal H100-80GB",
    },
    GpuModel {
        name: "H200-141GB",
        nvml_names: &["NVIDIA H200", "NVIDIA H200 NVL"],
        pci_device_ids: &[0x2335, 0x233B],
        memory_slots: 8,
        compute_slices: 7,
        profiles: eight_slot!("18", "35", "71", "141"),
        source: "MIG User Guide H200 table; ids from NVIDIA/mig-parted#120. ASSUMED: placements equal H100",
    },
    GpuModel {
        name: "GH200-144GB",
        nvml_names: &["NVIDIA GH200 144G HBM3e"],
        pci_device_ids: &[0x2348],
        memory_slots: 8,
        compute_slices: 7,
        profiles: eight_slot!("18", "36", "72", "144"),
        source: "GPU Operator default config (PR #1057). ASSUMED: 3g/4g/7g ids, max counts and placements follow H200",
    },
    GpuModel {
        name: "B200-180GB",
        nvml_names: &["NVIDIA B200"],
        pci_device_ids: &[0x2901],
        memory_slots: 8,
        compute_slices: 7,
        profiles: eight_slot!("23", "45", "90", "180"),
        source: "MIG User Guide B200 table (fractions, max counts); ids from NVIDIA/mig-parted#187. \
                 ASSUMED: 3g/4g/7g ids and all placements follow the 8-slot pattern; verify with NVML",
    },
];
