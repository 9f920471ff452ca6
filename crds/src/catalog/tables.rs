//! The catalog's data. Sources (see shared research notes, cross-checked on hardware where noted):
//! - NVIDIA MIG User Guide, "Supported MIG Profiles" (docs.nvidia.com/datacenter/tesla/mig-user-guide/
//!   supported-mig-profiles.html): slices, fractions and max counts per board.
//! - `nvidia-smi mig -lgip` / `-lgipp` output in the guide's "Getting Started" page (A100-40GB) and in
//!   NVIDIA issues/PRs (ids, placements for the other boards).
//! - NVIDIA mig-parted's `deployments/systemd/config-default.yaml` (also the GPU Operator's default
//!   MIG config): profile names per board, their `all-*` counts and the `device-filter` PCI ids.
//! - Boards that share one geometry share one entry (H800 with H100, A800 with A100, H20 with
//!   H100-96GB): their profile names, counts and placements are the same, so one CEL rule serves.
//! - A PCI id is listed only where an NVIDIA source (a `device-filter`) names it.
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

/// The four-memory-slot pattern of the RTX PRO 6000 Blackwell (GB202, four compute slices):
/// plain, graphics-capable (`+gfx`), no-media (`-me`), one-media (`+me`) and all-media
/// (`+me.all`) 1g and 2g profiles, and the whole GPU with or without graphics. ASSUMED: `+me.all`
/// shares the one-media-instance rule with `+me`; the driver may also refuse it beside instances
/// that keep media engines (not modelled; not checked on hardware).
macro_rules! four_slot_rtx {
    ($one:literal, $two:literal, $all:literal) => {
        &[
            p(concat!("1g.", $one, "gb"), 14, 1, 1, 4, ALL_OF_4),
            me(p(concat!("1g.", $one, "gb+me"), 21, 1, 1, 1, ALL_OF_4)),
            p(concat!("1g.", $one, "gb+gfx"), 47, 1, 1, 4, ALL_OF_4),
            me(p(concat!("1g.", $one, "gb+me.all"), 65, 1, 1, 1, ALL_OF_4)),
            p(concat!("1g.", $one, "gb-me"), 67, 1, 1, 4, ALL_OF_4),
            p(concat!("2g.", $two, "gb"), 5, 2, 2, 2, PAIRS_OF_4),
            p(concat!("2g.", $two, "gb+gfx"), 35, 2, 2, 2, PAIRS_OF_4),
            me(p(concat!("2g.", $two, "gb+me.all"), 64, 2, 2, 1, PAIRS_OF_4)),
            p(concat!("2g.", $two, "gb-me"), 66, 2, 2, 2, PAIRS_OF_4),
            p(concat!("4g.", $all, "gb"), 0, 4, 4, 1, FIRST),
            p(concat!("4g.", $all, "gb+gfx"), 32, 4, 4, 1, FIRST),
        ]
    };
}

/// The two-memory-slot pattern ASSUMED for the smaller RTX PRO Blackwell boards (at most two
/// instances): the RTX PRO 6000's 1g and whole-GPU variants, ids taken from it.
macro_rules! two_slot_rtx {
    ($one:literal, $all:literal) => {
        &[
            p(concat!("1g.", $one, "gb"), 14, 1, 1, 2, HALVES_OF_2),
            me(p(concat!("1g.", $one, "gb+me"), 21, 1, 1, 1, HALVES_OF_2)),
            p(concat!("1g.", $one, "gb+gfx"), 47, 1, 1, 2, HALVES_OF_2),
            p(concat!("2g.", $all, "gb"), 0, 2, 2, 1, FIRST),
            p(concat!("2g.", $all, "gb+gfx"), 32, 2, 2, 1, FIRST),
        ]
    };
}

const ALL_OF_4: &[u8] = &[0, 1, 2, 3];
const PAIRS_OF_4: &[u8] = &[0, 2];
const HALVES_OF_2: &[u8] = &[0, 1];

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
        nvml_names: &[
            "NVIDIA A100-SXM4-40GB",
            "NVIDIA A100-PCIE-40GB",
            "NVIDIA A800-SXM4-40GB",
            "NVIDIA A800 40GB PCIe",
        ],
        pci_device_ids: &[0x20B0, 0x20B1, 0x20F1, 0x20F6],
        memory_slots: 8,
        compute_slices: 7,
        // The guide's worked -lgip/-lgipp example. 1g.10gb needs R525+. The doc lists 1g.10gb as 1/8
        // of memory, but -lgipp shows ":2"; we follow the hardware output.
        profiles: eight_slot!("5", "10", "20", "40"),
        source: "MIG User Guide A100 table and its -lgip/-lgipp example (getting-started-with-mig); PCI ids from \
                 mig-parted's device-filter 'A100-40GB, A800-40GB'. ASSUMED: the A800 NVML names",
    },
    GpuModel {
        name: "A100-80GB",
        nvml_names: &[
            "NVIDIA A100-SXM4-80GB",
            "NVIDIA A100 80GB PCIe",
            "NVIDIA A800-SXM4-80GB",
            "NVIDIA A800 80GB PCIe",
        ],
        pci_device_ids: &[0x20B2, 0x20B5, 0x20F3, 0x20F5],
        memory_slots: 8,
        compute_slices: 7,
        profiles: eight_slot!("10", "20", "40", "80"),
        source: "MIG User Guide A100-80GB table; ids from -lgip samples; PCI ids from mig-parted's device-filter \
                 'A100-80GB, A800-80GB'. ASSUMED: placements equal A100-40GB; the A800 NVML names",
    },
    GpuModel {
        name: "H100-80GB",
        nvml_names: &["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H800", "NVIDIA H800 PCIe"],
        pci_device_ids: &[0x2330, 0x2331, 0x2322, 0x2324],
        memory_slots: 8,
        compute_slices: 7,
        profiles: eight_slot!("10", "20", "40", "80"),
        source: "MIG User Guide H100 80GB table; verified on an H100 80GB HBM3 with driver 580.159.04; H800 PCI ids \
                 from mig-parted's device-filter 'H100-80GB, H800-80GB'",
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
        source: "MIG User Guide H100 96GB table (H20 and H100 on GH200: Supported GPUs, 96GB); PCI ids from \
                 mig-parted's device-filter 'H100-96GB, PG506-96GB, GH200, H20'. ASSUMED: 7g.96gb id 0 and \
                 placements equal H100-80GB",
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
    GpuModel {
        name: "GB200-186GB",
        nvml_names: &["NVIDIA GB200"],
        pci_device_ids: &[0x2941],
        memory_slots: 8,
        compute_slices: 7,
        profiles: eight_slot!("23", "47", "93", "186"),
        source: "MIG User Guide Supported GPUs (GB200, 186GB, 7 instances); names and counts from mig-parted's \
                 config-default 'GB200 HGX' (device-filter 0x2941); 1g/1g+me/1g.47gb/2g ids from the -lgip dumps in \
                 NVIDIA/gpu-operator#1303 and NVIDIA/mig-parted#227. ASSUMED: 3g/4g/7g ids, all placements, NVML name",
    },
    GpuModel {
        name: "B300-269GB",
        nvml_names: &["NVIDIA B300 SXM6 AC"],
        pci_device_ids: &[0x3182],
        memory_slots: 8,
        compute_slices: 7,
        profiles: eight_slot!("34", "67", "135", "269"),
        source: "MIG User Guide Deployment Considerations (B300, R580+); names and counts from mig-parted's \
                 config-default (device-filter 0x3182). ASSUMED: ids, placements and NVML name follow B200",
    },
    GpuModel {
        name: "GB300-278GB",
        nvml_names: &["NVIDIA GB300"],
        pci_device_ids: &[0x31C2],
        memory_slots: 8,
        compute_slices: 7,
        profiles: eight_slot!("35", "70", "139", "278"),
        source: "MIG User Guide Deployment Considerations (GB300, R595+); names and counts from mig-parted's \
                 config-default (device-filter 0x31C2). ASSUMED: ids, placements and NVML name follow B200",
    },
    GpuModel {
        name: "RTX-PRO-6000-96GB",
        nvml_names: &[
            "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
            "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
        ],
        pci_device_ids: &[0x2BB5],
        memory_slots: 4,
        compute_slices: 4,
        profiles: four_slot_rtx!("24", "48", "96"),
        source: "MIG User Guide Supported GPUs (three editions, 96GB, 4 instances); names, ids and counts from public \
                 nvidia-smi mig -lgip dumps (GoogleCloudPlatform/container-engine-accelerators#564) and mig-parted's \
                 config-default (device-filter 0x2BB5, Server Edition). ASSUMED: placements (1g at 0-3, 2g at 0/2); \
                 the Workstation editions' PCI ids are not listed (none in an NVIDIA source)",
    },
    GpuModel {
        name: "RTX-PRO-5000-48GB",
        nvml_names: &["NVIDIA RTX PRO 5000 Blackwell"],
        pci_device_ids: &[],
        memory_slots: 2,
        compute_slices: 2,
        profiles: two_slot_rtx!("24", "48"),
        source: "MIG User Guide Supported GPUs (RTX PRO 5000 Blackwell, 48GB, 2 instances). ASSUMED: profile names, \
                 ids, a two-slot axis and placements (by analogy with the RTX PRO 6000); no PCI id; verify with NVML",
    },
    GpuModel {
        name: "RTX-PRO-4500-32GB",
        nvml_names: &["NVIDIA RTX PRO 4500 Blackwell", "NVIDIA RTX PRO 4500 Blackwell Server Edition"],
        pci_device_ids: &[],
        memory_slots: 2,
        compute_slices: 2,
        profiles: two_slot_rtx!("16", "32"),
        source: "MIG User Guide Supported GPUs (RTX PRO 4500 Blackwell, GB203, 32GB, 2 instances); 1g.16gb and 2g.32gb \
                 named in NVIDIA's vGPU reference. ASSUMED: ids, +me/+gfx variants, two-slot axis, placements, NVML \
                 names; no PCI id; verify with NVML",
    },
];
