//! MIG geometry catalog: every GPU-instance profile of the MIG-capable boards Tessera knows, with
//! its slices, maximum count and valid placements on the memory-slice axis.
//!
//! This table is for *offline* validation (CLI, admission-time checks, capacity maths). On a real
//! node the agent reads profiles and placements from NVML at run time and only cross-checks them
//! against this catalog, because names and IDs drift between boards and drivers.

mod tables;

use std::fmt;

pub use tables::MODELS;

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// One GPU-instance profile of one board, e.g. `3g.40gb` on H100-80GB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileSpec {
    /// Profile name as NVML and `nvidia-smi` print it, without the `MIG ` prefix.
    pub name: &'static str,
    /// GPU-instance profile id as `nvidia-smi mig -lgip` shows it (NVML `GpuInstanceProfileInfo.id`).
    pub id: u32,
    /// SM slices (out of [`GpuModel::compute_slices`]).
    pub compute_slices: u8,
    /// Memory slices; also the width of every placement on the memory axis.
    pub memory_slices: u8,
    /// Most instances of this profile one GPU can hold.
    pub max_count: u8,
    /// Valid start positions on the memory-slice axis (`nvidia-smi mig -lgipp`).
    pub starts: &'static [u8],
    /// `+me` profiles carry the media engines; at most one such instance per GPU.
    pub media_extensions: bool,
}

impl ProfileSpec {
    /// Memory in whole GB as the profile name states it (`3g.40gb` -> 40).
    pub fn memory_gb(&self) -> u32 {
        parse_profile_name(self.name).map(|p| p.memory_gb).unwrap_or(0)
    }

    /// The extended resource name the NVIDIA device plugin's mixed strategy advertises.
    pub fn resource_name(&self) -> String {
        mig_resource_name(self.name)
    }
}

/// A MIG-capable board.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuModel {
    /// Short, stable name used in plans and output, e.g. `H100-80GB`.
    pub name: &'static str,
    /// Product names as NVML (`nvmlDeviceGetName`) reports them.
    pub nvml_names: &'static [&'static str],
    /// PCI device ids (the upper 16 bits of NVML's `pciDeviceId`).
    pub pci_device_ids: &'static [u16],
    /// Positions on the memory-slice axis (8, or 4 on A30).
    pub memory_slots: u8,
    /// SM slices a whole GPU has (7, or 4 on A30).
    pub compute_slices: u8,
    pub profiles: &'static [ProfileSpec],
    /// Where the numbers come from and what was assumed.
    pub source: &'static str,
}

impl GpuModel {
    /// Looks a profile up by name, case-insensitively; the `.me` resource spelling is accepted too.
    pub fn profile(&self, name: &str) -> Option<&'static ProfileSpec> {
        let wanted = normalize_profile(name);
        self.profiles.iter().find(|p| p.name == wanted)
    }

    pub fn profile_names(&self) -> Vec<&'static str> {
        self.profiles.iter().map(|p| p.name).collect()
    }
}

impl fmt::Display for GpuModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// Finds a board by its short name (`H100-80GB`), NVML product name (`NVIDIA H100 80GB HBM3`) or
/// GPU Feature Discovery label (`NVIDIA-H100-80GB-HBM3`), case-insensitively. GFD suffixes such as
/// `-SHARED` or `-MIG-1g.10gb` are ignored.
pub fn lookup(product: &str) -> Option<&'static GpuModel> {
    let key = normalize_product(product);
    let key = strip_gfd_suffix(&key);
    NORMALIZED_NAMES
        .iter()
        .zip(MODELS.iter())
        .find(|((name, nvml), _)| {
            name == key || nvml.iter().any(|n| n == key || n.strip_prefix("nvidia-") == Some(key))
        })
        .map(|(_, m)| m)
}

/// Every model's name and NVML names, normalized once: `lookup` runs per GPU per pass.
static NORMALIZED_NAMES: std::sync::LazyLock<Vec<(String, Vec<String>)>> = std::sync::LazyLock::new(|| {
    MODELS
        .iter()
        .map(|m| (normalize_product(m.name), m.nvml_names.iter().map(|n| normalize_product(n)).collect()))
        .collect()
});

/// One GPU-instance profile of a GPU, as its driver reports it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct GpuProfileInfo {
    pub name: String,
    #[serde(default)]
    pub id: u32,
    pub compute_slices: u8,
    pub memory_slices: u8,
    pub max_count: u8,
    /// Valid start slots on the memory axis.
    #[serde(default)]
    #[schemars(extend("maxItems" = 16))]
    pub starts: Vec<u8>,
}

/// Whether a reported profile table describes a geometry the solver can work with: 1 to 8
/// memory and compute slices per profile, every placement inside an 8-slot axis. Anything else
/// (a buggy or hostile report) is treated as an unknown board.
pub fn valid_table(table: &[GpuProfileInfo]) -> bool {
    !table.is_empty()
        && table.iter().all(|p| {
            (1..=8).contains(&p.memory_slices)
                && (1..=8).contains(&p.compute_slices)
                && p.max_count >= 1
                && parse_profile_name(&p.name).is_some()
                && p.starts.iter().all(|s| u16::from(*s) + u16::from(p.memory_slices) <= 8)
        })
}

/// A geometry model built from a profile table read from the driver (by the agent at run time,
/// or by the operator from an agent's report, for boards the catalog lacks), named as the
/// catalog names the board when it knows it. Leaked once per distinct table: a fleet has a
/// handful of GPU models.
pub fn model_from_table(product: &str, table: &[GpuProfileInfo]) -> &'static GpuModel {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static CACHE: Mutex<Option<HashMap<String, &'static GpuModel>>> = Mutex::new(None);
    let key = format!("{product}:{table:?}");
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    let cache = cache.get_or_insert_with(HashMap::new);
    if let Some(m) = cache.get(&key) {
        return m;
    }
    let specs: Vec<ProfileSpec> = table
        .iter()
        .map(|p| ProfileSpec {
            name: Box::leak(normalize_profile(&p.name).into_boxed_str()),
            id: p.id,
            compute_slices: p.compute_slices,
            memory_slices: p.memory_slices,
            max_count: p.max_count,
            starts: Box::leak(p.starts.clone().into_boxed_slice()),
            media_extensions: parse_profile_name(&p.name).is_some_and(|n| n.media_extensions),
        })
        .collect();
    let model: &'static GpuModel = Box::leak(Box::new(GpuModel {
        name: lookup(product).map(|m| m.name).unwrap_or_else(|| Box::leak(product.to_string().into_boxed_str())),
        nvml_names: &[],
        pci_device_ids: &[],
        memory_slots: table.iter().map(|p| p.memory_slices).max().unwrap_or(8),
        compute_slices: table.iter().map(|p| p.compute_slices).max().unwrap_or(7),
        profiles: Box::leak(specs.into_boxed_slice()),
        source: "read from NVML",
    }));
    cache.insert(key, model);
    model
}

/// Finds a board by PCI device id, e.g. `0x2330` (H100 SXM5 80GB).
pub fn lookup_pci(device_id: u16) -> Option<&'static GpuModel> {
    MODELS.iter().find(|m| m.pci_device_ids.contains(&device_id))
}

/// Short names of every board in the catalog, for error messages.
pub fn known_products() -> Vec<&'static str> {
    MODELS.iter().map(|m| m.name).collect()
}

pub(crate) fn normalize_product(s: &str) -> String {
    s.trim().to_ascii_lowercase().replace([' ', '_'], "-")
}

fn strip_gfd_suffix(s: &str) -> &str {
    let s = s.strip_suffix("-shared").unwrap_or(s);
    match s.find("-mig-") {
        Some(i) => &s[..i],
        None => s,
    }
}

/// Variant suffixes a profile name may carry, in NVML spelling, longest first: `+me` (media
/// extensions), `+me.all` (all media engines), `+gfx` (graphics-capable, RTX PRO Blackwell) and
/// `-me` (no media engines). The device plugin's resource names replace `+` with `.`.
pub const PROFILE_SUFFIXES: &[&str] = &["+me.all", "+gfx", "+me", "-me"];

/// `1g.10gb.me` (resource spelling) and `1G.10GB+ME` both become `1g.10gb+me`; likewise
/// `.me.all` and `.gfx` become `+me.all` and `+gfx`. `-me` has one spelling.
pub fn normalize_profile(name: &str) -> String {
    let lower = name.trim().to_ascii_lowercase();
    for suffix in ["+me.all", "+gfx", "+me"] {
        let dotted = suffix.replace('+', ".");
        if let Some(base) = lower.strip_suffix(dotted.as_str()) {
            return format!("{base}{suffix}");
        }
    }
    lower
}

/// Whether `name` ends in the device plugin's resource spelling of a suffix (`.me`, `.me.all`,
/// `.gfx`): plans name profiles as NVML does (`+me`), quotas as the device plugin does.
pub fn has_resource_suffix(name: &str) -> bool {
    let lower = name.trim().to_ascii_lowercase();
    [".me", ".me.all", ".gfx"].iter().any(|s| lower.ends_with(s))
}

/// The parts of a profile name `<G>g.<M>gb[suffix]` (see [`PROFILE_SUFFIXES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileName {
    pub compute_slices: u32,
    pub memory_gb: u32,
    /// `+me` or `+me.all`: holds media engines another instance cannot have (one per GPU).
    pub media_extensions: bool,
    /// The suffix as NVML spells it (`+gfx`, `-me`, ...), empty for a plain profile.
    pub suffix: &'static str,
}

/// Parses `<G>g.<M>gb` with an optional suffix (`+me`, `+me.all`, `+gfx`, `-me`, or the resource
/// spellings `.me`, `.me.all`, `.gfx`); `None` if it is not of that form.
pub fn parse_profile_name(name: &str) -> Option<ProfileName> {
    let n = normalize_profile(name);
    let (base, suffix) =
        PROFILE_SUFFIXES.iter().find_map(|s| n.strip_suffix(s).map(|b| (b, *s))).unwrap_or((n.as_str(), ""));
    let (g, m) = base.split_once("g.")?;
    let m = m.strip_suffix("gb")?;
    let digits = |s: &str| !s.is_empty() && s.len() <= 4 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(g) || !digits(m) {
        return None;
    }
    Some(ProfileName {
        compute_slices: g.parse().ok()?,
        memory_gb: m.parse().ok()?,
        media_extensions: suffix.starts_with("+me"),
        suffix,
    })
}

/// Mixed-strategy resource name: `1g.10gb+me` -> `nvidia.com/mig-1g.10gb.me`, `1g.24gb+gfx` ->
/// `nvidia.com/mig-1g.24gb.gfx`, `1g.24gb-me` -> `nvidia.com/mig-1g.24gb-me`.
pub fn mig_resource_name(profile: &str) -> String {
    format!("nvidia.com/mig-{}", normalize_profile(profile).replace('+', "."))
}

/// Inverse of [`mig_resource_name`]: `nvidia.com/mig-1g.10gb.me` -> `1g.10gb+me`.
pub fn profile_of_resource(resource: &str) -> Option<String> {
    let p = resource.strip_prefix("nvidia.com/mig-")?;
    parse_profile_name(p).map(|_| normalize_profile(p))
}

#[cfg(test)]
mod tests;
