//! Pure MIG layout solver: does a multiset of profiles fit on one GPU, and where.
//!
//! Placement rules (MIG User Guide, "concepts"): an instance of a profile occupies
//! `memory_slices` consecutive positions on the memory axis starting at one of the profile's valid
//! starts; instances never overlap; per-profile maximum counts hold; compute slices add up to at
//! most the GPU's; at most one `+me` instance per GPU. All functions are deterministic.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use crate::catalog::{GpuModel, ProfileSpec, normalize_profile};

/// A profile name -> count multiset, e.g. `{3g.40gb: 1, 2g.20gb: 2}`.
pub type ProfileCounts = BTreeMap<String, u32>;

/// One GPU instance at a position on the memory-slice axis.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Placement {
    pub start: u8,
    pub size: u8,
    pub profile: String,
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}:{}", self.profile, self.start, self.size)
    }
}

/// Why a layout does not fit. Each variant names the exact reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FitError {
    #[error("profile {profile:?} does not exist on {product}; valid profiles: {}", known.join(", "))]
    UnknownProfile { profile: String, product: String, known: Vec<String> },
    #[error("{requested} x {profile} requested, but one {product} holds at most {max}")]
    OverMaxCount { profile: String, requested: u32, max: u8, product: String },
    #[error("{requested} instances with media extensions (+me) requested, but a GPU holds at most one")]
    TooManyMediaExtensions { requested: u32 },
    #[error("the layout needs {requested} compute slices, but one {product} has {available}")]
    ComputeExceeded { requested: u32, available: u8, product: String },
    #[error("the layout needs {requested} memory slices, but one {product} has {available}")]
    MemoryExceeded { requested: u32, available: u8, product: String },
    #[error(
        "no non-overlapping placement exists on {product}; best partial placement: [{}]; left over: {}",
        join(best_partial),
        join_counts(unplaced)
    )]
    NoPlacement { product: String, best_partial: Vec<Placement>, unplaced: ProfileCounts },
}

fn join(p: &[Placement]) -> String {
    p.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

fn join_counts(c: &ProfileCounts) -> String {
    c.iter().map(|(k, v)| format!("{v} x {k}")).collect::<Vec<_>>().join(", ")
}

/// The multiset that a list of placements realises.
pub fn counts_of(placements: &[Placement]) -> ProfileCounts {
    let mut counts = ProfileCounts::new();
    for p in placements {
        *counts.entry(p.profile.clone()).or_default() += 1;
    }
    counts
}

/// Places `request` on an empty GPU of `model`. Returns placements sorted by start.
pub fn fit(model: &GpuModel, request: &ProfileCounts) -> Result<Vec<Placement>, FitError> {
    fit_around(model, &[], request)
}

/// Places `request` on a GPU that already holds `kept` (which stay where they are). Returns only
/// the new placements, sorted by start. The node agent uses this to keep matching instances.
pub fn fit_around(model: &GpuModel, kept: &[Placement], request: &ProfileCounts) -> Result<Vec<Placement>, FitError> {
    let mut total = counts_of(kept);
    for (name, n) in request {
        let t = total.entry(normalize_profile(name)).or_default();
        *t = t.saturating_add(*n);
    }
    // Unknown names, then the counting rules, and only then one entry per instance: the counting
    // rules bound every count by a profile's maximum (a count of 2^31 would exhaust memory).
    for name in request.keys() {
        resolve_one(model, name)?;
    }
    check_totals(model, &total)?;
    let wanted = resolve(model, request)?;
    let mut occupied = 0u32;
    for k in kept {
        occupied |= mask(k.start, k.size);
    }
    let mut instances: Vec<&ProfileSpec> = wanted;
    // Largest first, then the most constrained, then by name: a deterministic search order.
    instances.sort_by(|a, b| (b.memory_slices, a.starts.len(), a.name).cmp(&(a.memory_slices, b.starts.len(), b.name)));
    let mut chosen = Vec::with_capacity(instances.len());
    if place_all(model, &instances, 0, occupied, &mut chosen) {
        let mut out: Vec<Placement> = chosen.iter().map(|&(spec, start)| placement(spec, start)).collect();
        out.sort();
        return Ok(out);
    }
    let best = best_partial(model, &instances, occupied);
    let mut unplaced = counts_of(&instances.iter().map(|s| placement(s, 0)).collect::<Vec<_>>());
    for p in &best {
        if let Some(n) = unplaced.get_mut(&p.profile) {
            *n -= 1;
        }
    }
    unplaced.retain(|_, n| *n > 0);
    Err(FitError::NoPlacement { product: model.name.to_string(), best_partial: best, unplaced })
}

fn resolve_one(model: &GpuModel, name: &str) -> Result<&'static ProfileSpec, FitError> {
    model.profile(name).ok_or_else(|| FitError::UnknownProfile {
        profile: name.to_string(),
        product: model.name.to_string(),
        known: model.profile_names().iter().map(|s| s.to_string()).collect(),
    })
}

/// Expands the multiset into one spec per instance, refusing unknown names.
fn resolve(model: &GpuModel, request: &ProfileCounts) -> Result<Vec<&'static ProfileSpec>, FitError> {
    let mut out = Vec::new();
    for (name, &n) in request {
        let spec = resolve_one(model, name)?;
        out.extend(std::iter::repeat_n(spec, n as usize));
    }
    Ok(out)
}

/// The counting rules, checked before any placement search so the error names the real reason.
fn check_totals(model: &GpuModel, total: &ProfileCounts) -> Result<(), FitError> {
    let (mut compute, mut memory, mut media) = (0u32, 0u32, 0u32);
    for (name, &n) in total {
        let spec = resolve_one(model, name)?;
        if n > u32::from(spec.max_count) {
            return Err(FitError::OverMaxCount {
                profile: spec.name.to_string(),
                requested: n,
                max: spec.max_count,
                product: model.name.to_string(),
            });
        }
        compute += n * u32::from(spec.compute_slices);
        memory += n * u32::from(spec.memory_slices);
        if spec.media_extensions {
            media += n;
        }
    }
    if media > 1 {
        return Err(FitError::TooManyMediaExtensions { requested: media });
    }
    if compute > u32::from(model.compute_slices) {
        return Err(FitError::ComputeExceeded {
            requested: compute,
            available: model.compute_slices,
            product: model.name.to_string(),
        });
    }
    if memory > u32::from(model.memory_slots) {
        return Err(FitError::MemoryExceeded {
            requested: memory,
            available: model.memory_slots,
            product: model.name.to_string(),
        });
    }
    Ok(())
}

fn mask(start: u8, size: u8) -> u32 {
    ((1u32 << size) - 1) << start
}

fn placement(spec: &ProfileSpec, start: u8) -> Placement {
    Placement { start, size: spec.memory_slices, profile: spec.name.to_string() }
}

/// Valid starts for `spec` given occupied slots; a repeated profile starts after its twin, which
/// removes symmetric duplicates from the search.
fn free_starts<'a>(
    model: &'a GpuModel,
    spec: &'a ProfileSpec,
    occupied: u32,
    after: Option<u8>,
) -> impl Iterator<Item = u8> + 'a {
    spec.starts.iter().copied().filter(move |&s| {
        s + spec.memory_slices <= model.memory_slots
            && occupied & mask(s, spec.memory_slices) == 0
            && after.is_none_or(|a| s > a)
    })
}

fn twin_start(instances: &[&ProfileSpec], idx: usize, chosen: &[(&ProfileSpec, u8)]) -> Option<u8> {
    (idx > 0 && instances[idx - 1].name == instances[idx].name).then(|| chosen[idx - 1].1)
}

fn place_all<'a>(
    model: &GpuModel,
    instances: &[&'a ProfileSpec],
    idx: usize,
    occupied: u32,
    chosen: &mut Vec<(&'a ProfileSpec, u8)>,
) -> bool {
    let Some(&spec) = instances.get(idx) else { return true };
    let after = twin_start(instances, idx, chosen);
    for start in free_starts(model, spec, occupied, after) {
        chosen.push((spec, start));
        if place_all(model, instances, idx + 1, occupied | mask(start, spec.memory_slices), chosen) {
            return true;
        }
        chosen.pop();
    }
    false
}

/// The placement of the largest part of the request that does fit: most instances, then most
/// memory slices, first found in search order on ties.
fn best_partial(model: &GpuModel, instances: &[&ProfileSpec], occupied: u32) -> Vec<Placement> {
    struct Search<'s> {
        model: &'s GpuModel,
        instances: &'s [&'s ProfileSpec],
        best: Vec<(usize, u8)>,
        best_score: (usize, u32),
    }
    fn go(s: &mut Search<'_>, idx: usize, occupied: u32, cur: &mut Vec<(usize, u8)>, slices: u32) {
        let score = (cur.len(), slices);
        if score > s.best_score {
            s.best_score = score;
            s.best = cur.clone();
        }
        if idx == s.instances.len() || cur.len() + (s.instances.len() - idx) <= s.best_score.0 {
            return;
        }
        let spec = s.instances[idx];
        let after = cur.iter().rev().find(|(i, _)| s.instances[*i].name == spec.name).map(|&(_, st)| st);
        for start in free_starts(s.model, spec, occupied, after).collect::<Vec<_>>() {
            cur.push((idx, start));
            let used = occupied | mask(start, spec.memory_slices);
            go(s, idx + 1, used, cur, slices + u32::from(spec.memory_slices));
            cur.pop();
        }
        go(s, idx + 1, occupied, cur, slices);
    }
    let mut s = Search { model, instances, best: Vec::new(), best_score: (0, 0) };
    go(&mut s, 0, occupied, &mut Vec::new(), 0);
    let mut out: Vec<Placement> = s.best.iter().map(|&(i, start)| placement(instances[i], start)).collect();
    out.sort();
    out
}

/// Every valid set of placements on one GPU (the empty set included), restricted to `profiles`
/// when given. Deterministic order.
pub fn all_layouts(model: &GpuModel, profiles: Option<&[&str]>) -> Vec<Vec<Placement>> {
    let candidates = candidates(model, profiles);
    let mut out = Vec::new();
    enumerate(model, &candidates, 0, &mut Vec::new(), &mut out);
    out
}

/// Every valid layout to which no further instance (of the considered profiles) can be added.
pub fn maximal_layouts(model: &GpuModel, profiles: Option<&[&str]>) -> Vec<Vec<Placement>> {
    let candidates = candidates(model, profiles);
    all_layouts(model, profiles)
        .into_iter()
        .filter(|layout| {
            !candidates.iter().any(|&(spec, start)| {
                let mut grown = layout.clone();
                grown.push(placement(spec, start));
                is_valid(model, &grown)
            })
        })
        .collect()
}

fn candidates(model: &GpuModel, profiles: Option<&[&str]>) -> Vec<(&'static ProfileSpec, u8)> {
    let allowed = |spec: &ProfileSpec| profiles.is_none_or(|ps| ps.iter().any(|p| normalize_profile(p) == spec.name));
    model
        .profiles
        .iter()
        .filter(|s| allowed(s))
        .flat_map(|s| s.starts.iter().filter(|&&st| st + s.memory_slices <= model.memory_slots).map(move |&st| (s, st)))
        .collect()
}

fn enumerate(
    model: &GpuModel,
    candidates: &[(&'static ProfileSpec, u8)],
    idx: usize,
    cur: &mut Vec<Placement>,
    out: &mut Vec<Vec<Placement>>,
) {
    if idx == candidates.len() {
        let mut layout = cur.clone();
        layout.sort();
        out.push(layout);
        return;
    }
    let (spec, start) = candidates[idx];
    cur.push(placement(spec, start));
    if is_valid(model, cur) {
        enumerate(model, candidates, idx + 1, cur, out);
    }
    cur.pop();
    enumerate(model, candidates, idx + 1, cur, out);
}

/// Checks a complete set of placements against every rule. Used as the test oracle and by the
/// node agent to check what it reads back from a GPU.
pub fn is_valid(model: &GpuModel, placements: &[Placement]) -> bool {
    let mut occupied = 0u32;
    for p in placements {
        let Some(spec) = model.profile(&p.profile) else { return false };
        let m = mask(p.start, p.size);
        if p.size != spec.memory_slices
            || !spec.starts.contains(&p.start)
            || p.start + p.size > model.memory_slots
            || occupied & m != 0
        {
            return false;
        }
        occupied |= m;
    }
    check_totals(model, &counts_of(placements)).is_ok()
}

#[cfg(test)]
mod tests;
