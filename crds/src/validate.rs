//! Offline validation shared by the CLI (`tessera-operator validate`) and the operator itself.
//! Every error names the field (a JSON path from the object root) and the reason.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;

use crate::catalog::{self, GpuModel, parse_profile_name, profile_of_resource};
use crate::plan::{GpuLayout, GpuPartitionPlanSpec, MAX_GPUS_PER_NODE, MAX_PROFILES_PER_GPU, RolloutPolicy};
use crate::quota::{SplitPolicy, TenantGpuQuotaSpec};
use crate::solver::{self, ProfileCounts};

pub mod strict;

/// One problem with one field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldError {
    pub field: String,
    pub reason: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self { field: field.into(), reason: reason.into() }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

/// The resource name for whole GPUs.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Checks a plan: products known, layouts that fit, indices that do not overlap, a valid
/// selector and rollout policy.
pub fn validate_plan(spec: &GpuPartitionPlanSpec) -> Vec<FieldError> {
    validate_plan_with(spec, &|_| None)
}

/// Like [`validate_plan`], but a product missing from the catalog is checked against `reported`
/// (the profile table a node agent read from the driver) instead of being an error.
pub fn validate_plan_with(
    spec: &GpuPartitionPlanSpec,
    reported: &dyn Fn(&str) -> Option<&'static GpuModel>,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    validate_selector(&spec.node_selector, "spec.nodeSelector", &mut errs);
    match (&spec.layouts_from, spec.layouts.is_empty()) {
        (None, true) => errs.push(FieldError::new(
            "spec.layouts",
            "at least one layout is required (or spec.layoutsFrom, to derive them from quotas)",
        )),
        (Some(_), false) => errs.push(FieldError::new(
            "spec.layoutsFrom",
            "set either spec.layouts (fixed layouts) or spec.layoutsFrom (derived from quotas), not both",
        )),
        (Some(from), true) => validate_layouts_from(from, "spec.layoutsFrom", &mut errs),
        (None, false) => {}
    }
    too_many(&mut errs, "spec.layouts", spec.layouts.len(), 32);
    // product -> (covers-every-GPU layout, index -> layout that claims it)
    let mut coverage: BTreeMap<&str, (Option<usize>, BTreeMap<i32, usize>)> = BTreeMap::new();
    for (i, layout) in spec.layouts.iter().enumerate() {
        let at = format!("spec.layouts[{i}]");
        let Some(model) = validate_layout(layout, &at, reported, &mut errs) else { continue };
        let (all, indices) = coverage.entry(model.name).or_default();
        match &layout.gpu_indices {
            None => match all {
                Some(j) => errs.push(FieldError::new(
                    format!("{at}.gpuIndices"),
                    format!(
                        "spec.layouts[{j}] already applies to every {} GPU; give one of them gpuIndices",
                        model.name
                    ),
                )),
                None => *all = Some(i),
            },
            Some(list) => {
                if list.is_empty() {
                    errs.push(FieldError::new(
                        format!("{at}.gpuIndices"),
                        "must list at least one GPU index, or be omitted to mean every GPU",
                    ));
                }
                for (k, &idx) in list.iter().enumerate() {
                    let field = format!("{at}.gpuIndices[{k}]");
                    if idx < 0 {
                        errs.push(FieldError::new(field, format!("GPU index {idx} must be >= 0")));
                    } else if let Some(j) = indices.insert(idx, i) {
                        let owner = if j == i { "this layout".to_string() } else { format!("spec.layouts[{j}]") };
                        errs.push(FieldError::new(
                            field,
                            format!("GPU {idx} of {} is already listed by {owner}", model.name),
                        ));
                    }
                }
            }
        }
    }
    validate_rollout(&spec.rollout, "spec.rollout", &mut errs);
    errs
}

fn validate_layouts_from(from: &crate::plan::LayoutsFrom, at: &str, errs: &mut Vec<FieldError>) {
    validate_selector(&from.quota_selector, &format!("{at}.quotaSelector"), errs);
    if !(0..=1000).contains(&from.headroom_percent) {
        errs.push(FieldError::new(
            format!("{at}.headroomPercent"),
            format!("{} must be between 0 and 1000", from.headroom_percent),
        ));
    }
    if from.stabilization_seconds < 0 {
        errs.push(FieldError::new(
            format!("{at}.stabilizationSeconds"),
            format!("{} must be >= 0", from.stabilization_seconds),
        ));
    }
}

/// Checks one layout and returns its board when the product is known.
fn validate_layout(
    layout: &GpuLayout,
    at: &str,
    reported: &dyn Fn(&str) -> Option<&'static GpuModel>,
    errs: &mut Vec<FieldError>,
) -> Option<&'static GpuModel> {
    let model = catalog::lookup(&layout.gpu_product).or_else(|| reported(&layout.gpu_product));
    if model.is_none() {
        errs.push(FieldError::new(
            format!("{at}.gpuProduct"),
            format!(
                "unknown GPU product {:?}; known products: {} (a board outside the catalog is accepted \
                 where a matched node's agent reports its MIG profile table)",
                layout.gpu_product,
                catalog::known_products().join(", ")
            ),
        ));
    }
    too_many(errs, &format!("{at}.profiles"), layout.profiles.len(), MAX_PROFILES_PER_GPU);
    if let Some(list) = &layout.gpu_indices {
        too_many(errs, &format!("{at}.gpuIndices"), list.len(), MAX_GPUS_PER_NODE);
    }
    let Some(counts) = profile_counts(&layout.profiles, &format!("{at}.profiles"), errs) else {
        return model;
    };
    let any_instance = counts.values().any(|n| *n > 0);
    if !layout.mig_enabled {
        if any_instance {
            errs.push(FieldError::new(format!("{at}.profiles"), "must be empty when migEnabled is false"));
        }
        return model;
    }
    if !any_instance {
        errs.push(FieldError::new(
            format!("{at}.profiles"),
            "migEnabled is true but no instances are listed; a MIG GPU without instances offers \
             nothing (and the device plugin's mixed strategy fails on it)",
        ));
        return model;
    }
    let model = model?;
    // Every profile the board lacks, each under its own key; the solver would name only the first.
    let before = errs.len();
    for name in layout.profiles.iter().filter(|(_, n)| **n > 0).map(|(name, _)| name) {
        if model.profile(name).is_none() {
            errs.push(FieldError::new(
                format!("{at}.profiles[{name:?}]"),
                format!(
                    "profile {name:?} does not exist on {}; valid profiles: {}",
                    model.name,
                    model.profile_names().join(", ")
                ),
            ));
        }
    }
    if errs.len() == before
        && let Err(e) = solver::fit(model, &counts)
    {
        errs.push(FieldError::new(format!("{at}.profiles"), e.to_string()));
    }
    Some(model)
}

/// Turns a profile map into solver counts, reporting malformed names and negative counts.
/// Returns `None` when any entry is unusable.
pub fn profile_counts(profiles: &BTreeMap<String, i32>, at: &str, errs: &mut Vec<FieldError>) -> Option<ProfileCounts> {
    let mut counts = ProfileCounts::new();
    let before = errs.len();
    for (name, &n) in profiles {
        let field = format!("{at}[{name:?}]");
        if parse_profile_name(name).is_some() && catalog::has_resource_suffix(name) {
            // The CRD's pattern takes NVML's spelling only (`+me`, `+gfx`, `+me.all`).
            let nvml = catalog::normalize_profile(name);
            errs.push(FieldError::new(
                field,
                format!("{name:?} is not a MIG profile name (that is the device plugin's spelling): write {nvml:?}"),
            ));
        } else if parse_profile_name(name).is_none() {
            errs.push(FieldError::new(field, format!("{name:?} is not a MIG profile name like 3g.40gb or 1g.10gb+me")));
        } else if n < 0 {
            errs.push(FieldError::new(field, format!("count {n} must be >= 0")));
        } else if n > 0 {
            // Saturating: `1g.10gb` and `1G.10GB` are one profile, and counts may be huge.
            let total = counts.entry(catalog::normalize_profile(name)).or_default();
            *total = total.saturating_add(n as u32);
        }
    }
    (errs.len() == before).then_some(counts)
}

fn validate_selector(sel: &LabelSelector, at: &str, errs: &mut Vec<FieldError>) {
    for (i, expr) in sel.match_expressions.iter().flatten().enumerate() {
        let field = format!("{at}.matchExpressions[{i}]");
        let has_values = expr.values.as_ref().is_some_and(|v| !v.is_empty());
        match expr.operator.as_str() {
            "In" | "NotIn" if !has_values => errs.push(FieldError::new(
                format!("{field}.values"),
                format!("operator {} needs at least one value", expr.operator),
            )),
            "Exists" | "DoesNotExist" if has_values => errs.push(FieldError::new(
                format!("{field}.values"),
                format!("operator {} takes no values", expr.operator),
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => errs.push(FieldError::new(
                format!("{field}.operator"),
                format!("{other:?} is not one of In, NotIn, Exists, DoesNotExist"),
            )),
        }
    }
}

fn validate_rollout(r: &RolloutPolicy, at: &str, errs: &mut Vec<FieldError>) {
    if let Err(reason) = max_unavailable(&r.max_unavailable, 1) {
        errs.push(FieldError::new(format!("{at}.maxUnavailable"), reason));
    }
    if r.drain_timeout_seconds < 0 {
        errs.push(FieldError::new(format!("{at}.drainTimeoutSeconds"), "must be >= 0"));
    }
    if r.apply_timeout_seconds < 0 {
        errs.push(FieldError::new(format!("{at}.applyTimeoutSeconds"), "must be >= 0"));
    }
}

/// Nodes that may be disrupted at once out of `matched`: an integer, or a percentage rounded down
/// (at least 1, so a rollout always makes progress).
pub fn max_unavailable(value: &IntOrString, matched: usize) -> Result<usize, String> {
    match value {
        IntOrString::Int(n) if *n >= 1 => Ok(*n as usize),
        IntOrString::Int(n) => Err(format!("{n} must be >= 1")),
        IntOrString::String(s) => {
            let pct = s
                .strip_suffix('%')
                .and_then(|p| p.parse::<u32>().ok())
                .filter(|p| (1..=100).contains(p) && !s.starts_with('0'))
                .ok_or_else(|| format!("{s:?} must be an integer >= 1 or a percentage from 1% to 100%"))?;
            Ok((matched * pct as usize / 100).max(1))
        }
    }
}

/// Checks a quota: everything [`validate_quota_limits`] checks, and the reporting-only fields
/// (`spec.idleAfter`). What `validate` and `plan preview` report.
pub fn validate_quota(spec: &TenantGpuQuotaSpec) -> Vec<FieldError> {
    let mut errs = validate_quota_limits(spec);
    if let Some(reason) = spec.idle_after.as_deref().and_then(|d| crate::quota::parse_idle_after(d).err()) {
        errs.push(FieldError::new("spec.idleAfter", reason));
    }
    errs
}

/// Checks what enforcement depends on: namespaces, resource names (known MIG profiles only, so
/// a typo cannot leave a real resource unlimited), non-negative limits and a consistent split.
/// The controller enforces a quota that passes this even with a bad `idleAfter` (a reporting
/// field: the idle report then uses the default), so a typo there never stops a tenant's limits
/// from following its edits.
pub fn validate_quota_limits(spec: &TenantGpuQuotaSpec) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if spec.namespaces.is_empty() && spec.namespace_selector.is_none() {
        errs.push(FieldError::new(
            "spec.namespaces",
            "at least one namespace (spec.namespaces) or a spec.namespaceSelector is required",
        ));
    }
    if let Some(sel) = &spec.namespace_selector {
        validate_namespace_selector(spec, sel, &mut errs);
    }
    too_many(&mut errs, "spec.hard", spec.hard.len(), 64);
    let mut seen = BTreeSet::new();
    for (i, ns) in spec.namespaces.iter().enumerate() {
        let field = format!("spec.namespaces[{i}]");
        if !is_dns1123_label(ns) {
            errs.push(FieldError::new(field, format!("{ns:?} is not a valid namespace name (DNS-1123 label)")));
        } else if !seen.insert(ns.as_str()) {
            errs.push(FieldError::new(field, format!("namespace {ns:?} is listed twice")));
        }
    }
    for (res, &n) in &spec.hard {
        let field = format!("spec.hard[{res:?}]");
        if let Err(reason) = check_resource_name(res) {
            errs.push(FieldError::new(field, reason));
        } else if n < 0 {
            errs.push(FieldError::new(field, format!("limit {n} must be >= 0")));
        }
    }
    match spec.split {
        SplitPolicy::Even if !spec.namespace_hard.is_empty() => {
            errs.push(FieldError::new("spec.namespaceHard", "is only used with split: Explicit (split is Even)"))
        }
        SplitPolicy::Even => {}
        SplitPolicy::Explicit => validate_explicit_split(spec, &mut errs),
    }
    if let Some(p) = &spec.physical {
        for (name, v) in [("computeSlices", p.compute_slices), ("memoryGB", p.memory_gb)] {
            if let Some(v) = v.filter(|v| *v < 0) {
                errs.push(FieldError::new(format!("spec.physical.{name}"), format!("{v} must be >= 0")));
            }
        }
    }
    errs
}

/// A namespace selector must name a label (an empty one would claim every namespace), must not
/// read the label Tessera sets from the quotas, and cannot go with shares named per namespace.
fn validate_namespace_selector(spec: &TenantGpuQuotaSpec, sel: &LabelSelector, errs: &mut Vec<FieldError>) {
    errs.extend(namespace_selector_errors(sel));
    if spec.split == SplitPolicy::Explicit {
        errs.push(FieldError::new(
            "spec.split",
            "Explicit names each namespace's share, but spec.namespaceSelector's namespaces change with their labels: \
             use Even (each selected namespace takes a share)",
        ));
    }
}

/// What is wrong with `spec.namespaceSelector` on its own; the operator selects namespaces by
/// it only when nothing is (an empty or malformed selector claims nothing).
pub fn namespace_selector_errors(sel: &LabelSelector) -> Vec<FieldError> {
    const AT: &str = "spec.namespaceSelector";
    let mut errs = Vec::new();
    validate_selector(sel, AT, &mut errs);
    let labels = sel.match_labels.iter().flatten().map(|(k, _)| k);
    let keys: Vec<&String> = labels.chain(sel.match_expressions.iter().flatten().map(|e| &e.key)).collect();
    if keys.is_empty() {
        errs.push(FieldError::new(
            AT,
            "an empty selector would claim every namespace (kube-system and the GPU Operator's included): name a label",
        ));
    }
    // Only requirements that name what a namespace has narrow the selection: `NotIn`,
    // `DoesNotExist` alone, or `Exists` on the name label, match nearly every namespace.
    let positive = sel.match_labels.as_ref().is_some_and(|m| !m.is_empty())
        || sel
            .match_expressions
            .iter()
            .flatten()
            .any(|e| e.operator == "In" || (e.operator == "Exists" && e.key != "kubernetes.io/metadata.name"));
    if !keys.is_empty() && !positive {
        errs.push(FieldError::new(
            AT,
            "selects by what namespaces lack (NotIn, DoesNotExist) or by the name label's presence, which matches \
             kube-system and every other tenant's namespaces: add matchLabels, an In, or an Exists on a label",
        ));
    }
    if keys.iter().any(|k| k.as_str() == crate::gate::MARK) {
        errs.push(FieldError::new(
            AT,
            format!("selects by {}, which Tessera sets from the quotas themselves", crate::gate::MARK),
        ));
    }
    errs
}

fn validate_explicit_split(spec: &TenantGpuQuotaSpec, errs: &mut Vec<FieldError>) {
    // i128: shares are i64, and any number of them must add up without overflowing.
    let mut sums: BTreeMap<&str, i128> = BTreeMap::new();
    for (ns, shares) in &spec.namespace_hard {
        if !spec.namespaces.contains(ns) {
            errs.push(FieldError::new(
                format!("spec.namespaceHard[{ns:?}]"),
                format!("namespace {ns:?} is not in spec.namespaces"),
            ));
        }
        for (res, &n) in shares {
            let field = format!("spec.namespaceHard[{ns:?}][{res:?}]");
            if !spec.hard.contains_key(res) {
                errs.push(FieldError::new(field, format!("{res} has no tenant-wide limit in spec.hard")));
            } else if n < 0 {
                errs.push(FieldError::new(field, format!("share {n} must be >= 0")));
            } else {
                *sums.entry(res.as_str()).or_default() += i128::from(n);
            }
        }
    }
    for (res, sum) in sums {
        let hard = spec.hard[res];
        if sum > i128::from(hard) {
            errs.push(FieldError::new(
                "spec.namespaceHard",
                format!("the shares of {res} add up to {sum}, more than spec.hard allows ({hard})"),
            ));
        }
    }
}

/// `nvidia.com/gpu`, or `nvidia.com/mig-<profile>` for a profile some known board has.
pub fn check_resource_name(res: &str) -> Result<(), String> {
    if res == GPU_RESOURCE {
        return Ok(());
    }
    let Some(profile) = profile_of_resource(res) else {
        return Err(format!("{res:?} is not {GPU_RESOURCE} or nvidia.com/mig-<profile> (e.g. nvidia.com/mig-1g.10gb)"));
    };
    // The CRD's CEL rule takes only the device plugin's spelling (lower case, `.me`), so the
    // offline check must too: `nvidia.com/mig-1G.10GB` or `...+me` is refused by `kubectl apply`.
    let canonical = catalog::mig_resource_name(&profile);
    if res != canonical {
        return Err(format!("{res:?} is not how the device plugin names it: write {canonical:?}"));
    }
    if catalog::MODELS.iter().any(|m| m.profile(&profile).is_some()) {
        Ok(())
    } else {
        Err(format!("MIG profile {profile:?} exists on no known GPU, so this limit would never apply"))
    }
}

/// The same bounds the CRD schema sets (they keep CEL within the API server's cost budget).
fn too_many(errs: &mut Vec<FieldError>, field: &str, len: usize, max: usize) {
    if len > max {
        errs.push(FieldError::new(field, format!("has {len} entries; at most {max} are allowed")));
    }
}

/// A DNS-1123 label (a namespace name): also what makes a safe ConfigMap key prefix.
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

#[cfg(test)]
mod tests;
