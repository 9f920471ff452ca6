//! CEL rules, generated from the MIG catalog, with which the API server itself refuses a layout
//! that cannot fit the catalog product it names: at `kubectl apply`, before a rollout starts and
//! before a GitOps sync can look green.
//!
//! Fit is downward-closed (take an instance away from a layout that fits and the rest still fits),
//! so a multiset of profiles fits a board iff it is contained in the multiset of one of the board's
//! maximal layouts. Each catalog board gets one rule on `spec.layouts[]`: when `gpuProduct`
//! resolves to the board (the normalisation of [`catalog::lookup`], done in CEL), the non-zero
//! counts must be at most those of one maximal multiset. Its message expression names the product
//! and the reason in the solver's order. Products outside the catalog pass (new boards: the
//! operator checks them against the table the node agent reads from the driver).

use std::collections::BTreeMap;

use schemars::Schema;
use serde_json::{Value, json};

use crate::catalog::{self, GpuModel, MODELS, ProfileSpec};
use crate::solver;

/// Profile name -> most instances: one maximal layout of a board, as a multiset.
pub type Limits = BTreeMap<&'static str, u32>;

/// The maximal layouts of `model` as multisets, without duplicates and without any multiset that
/// another one contains (two placements can realise one multiset; a placement-maximal layout can
/// be count-dominated by another). A layout fits iff it is at most one of these, profile by profile.
pub fn maximal_multisets(model: &GpuModel) -> Vec<Limits> {
    let mut sets: Vec<Limits> = solver::maximal_layouts(model, None)
        .iter()
        .map(|layout| {
            let mut counts = Limits::new();
            for spec in layout.iter().filter_map(|p| model.profile(&p.profile)) {
                *counts.entry(spec.name).or_default() += 1;
            }
            counts
        })
        .collect();
    sets.sort();
    sets.dedup();
    let dominated = |a: &Limits| sets.iter().any(|b| b != a && contains(b, a));
    let keep: Vec<Limits> = sets.iter().filter(|a| !dominated(a)).cloned().collect();
    keep
}

/// Whether `outer` holds at least as many of every profile as `inner`.
pub fn contains(outer: &Limits, inner: &Limits) -> bool {
    inner.iter().all(|(p, n)| outer.get(p).is_some_and(|m| m >= n))
}

/// Every string that [`catalog::lookup`] compares a normalised product against for `model`: its
/// short name, its NVML names, and those without the `nvidia-` prefix (GFD labels).
pub fn product_keys(model: &GpuModel) -> Vec<String> {
    let mut keys = vec![catalog::normalize_product(model.name)];
    for n in model.nvml_names {
        let n = catalog::normalize_product(n);
        if let Some(short) = n.strip_prefix("nvidia-") {
            keys.push(short.to_string());
        }
        keys.push(n);
    }
    keys.sort();
    keys.dedup();
    keys
}

/// CEL for the layout's product as [`catalog::lookup`] compares it (trim, ASCII lower case, spaces
/// and underscores to dashes, a `-shared` suffix dropped, then everything from the first `-mig-`),
/// bound to `p` through a one-element list, as CRD rules have no variables.
pub const PRODUCT_KEY: &str = "[self.gpuProduct.trim().lowerAscii().replace(' ', '-').replace('_', '-')]\
     .map(s, s.endsWith('-shared') ? s.substring(0, size(s) - 7) : s)\
     .map(s, s.indexOf('-mig-') >= 0 ? s.substring(0, s.indexOf('-mig-')) : s)";

/// Whole GPUs carry no MIG instances, whatever the product.
const MIG_DISABLED_RULE: &str = "!has(self.migEnabled) || self.migEnabled || !has(self.profiles) || \
     self.profiles.all(k, self.profiles[k] <= 0)";

/// `x-kubernetes-validations` for one `spec.layouts[]` item: the `migEnabled: false` rule, then
/// one fit rule per catalog board.
pub fn layout_rules() -> Vec<Value> {
    let mut rules = vec![json!({
        "rule": MIG_DISABLED_RULE,
        "message": "profiles must be empty when migEnabled is false (whole GPUs have no MIG instances)",
        "fieldPath": ".profiles",
    })];
    rules.extend(MODELS.iter().map(fit_rule));
    rules
}

/// The fit rule of one board (see the module comment).
pub fn fit_rule(model: &GpuModel) -> Value {
    let keys = cel_list(product_keys(model).iter().map(|k| cel_str(k)));
    let maximal = cel_list(maximal_multisets(model).iter().map(|m| cel_map(m.iter().map(|(k, v)| (*k, *v)))));
    let rule = format!(
        "{PRODUCT_KEY}.all(p, !(p in {keys})) || (has(self.migEnabled) && !self.migEnabled) || \
         !has(self.profiles) || {maximal}.exists(m, self.profiles.all(k, self.profiles[k] <= 0 || \
         (k in m && self.profiles[k] <= m[k])))"
    );
    json!({
        "rule": rule,
        "messageExpression": fit_message(model),
        "message": format!("the layout does not fit {0}; `tessera-operator mig fit --gpu {0}` says why", model.name),
        "fieldPath": ".profiles",
    })
}

/// CEL for why a layout does not fit `model`, in the solver's order: unknown profiles, over a
/// profile's maximum count, more than one `+me`, compute slices, memory slices, placement. Runs
/// only when the fit rule failed, so the product is `model` and MIG is on.
///
/// The API server estimates the cost of every string it builds from the longest string it could
/// be; a map key or `string(int)` could be megabytes, and concatenating one breaks the budget a
/// hundredfold. So the message concatenates only literals: an unknown profile is named when some
/// catalog board has it, and numbers come from tables of digits.
fn fit_message(model: &GpuModel) -> String {
    let name = model.name;
    let own = cel_list(model.profiles.iter().map(|p| cel_str(p.name)));
    let everywhere = catalog_profile_names();
    // Catalog names this board lacks, each `, name` when present. Literals only: a list `join()`
    // would be shorter, but the API server cannot bound its cost and refuses the CRD.
    let named: Vec<String> = everywhere
        .iter()
        .filter(|n| model.profile(n).is_none())
        .map(|f| format!("({} in self.profiles ? {} : '')", cel_str(f), cel_str(&format!(", {f}"))))
        .collect();
    let named = chunked_sum(&named);
    // A name no catalog board has (a typo: `3g.40b`) is named too: the first one in key order,
    // taken from a filter and indexed, so only one key of unknown length is concatenated.
    let everywhere_list = cel_list(everywhere.iter().map(|n| cel_str(n)));
    let strangers = format!("self.profiles.filter(k, self.profiles[k] > 0 && !(k in {everywhere_list}))");
    let unknown = format!(
        "{} + ({} + ({strangers}.size() > 0 ? ', ' + {strangers}[0] + ({strangers}.size() > 1 ? {} : {}) : '')).substring(2) + {}",
        cel_str(&format!("profiles that do not exist on {name}: ")),
        named,
        cel_str(" and more that no catalog GPU has"),
        cel_str(" (no catalog GPU has it)"),
        cel_str(&format!("; valid profiles: {}", model.profile_names().join(", "))),
    );
    // The first profile over its maximum in name order, as the solver reports it.
    let mut by_name: Vec<&ProfileSpec> = model.profiles.iter().collect();
    by_name.sort_by_key(|p| p.name);
    let over_one = |p: &ProfileSpec| format!("{} > {}", count(p.name), p.max_count);
    let first_over = |each: &dyn Fn(&ProfileSpec) -> String, none: &str| first_over(&by_name, &over_one, each, none);
    let any_over = by_name.iter().map(|p| over_one(p)).collect::<Vec<_>>().join(" || ");
    let over_n = cel_number(&first_over(&|p| format!("self.profiles[{}]", cel_str(p.name)), "0"));
    let over_msg = first_over(
        &|p| cel_str(&format!(" x {} requested, but one {name} holds at most {}", p.name, p.max_count)),
        "''",
    );
    // Sums over the board's own profiles, written out: CRD rules have no fold. They run once no
    // profile is unknown or over its maximum, which bounds them (see `weighted_max`).
    let total = |weight: fn(&ProfileSpec) -> u8| {
        let terms: Vec<String> = model
            .profiles
            .iter()
            .filter(|p| weight(p) > 0)
            .map(|p| match weight(p) {
                1 => count(p.name),
                w => format!("{} * {w}", count(p.name)),
            })
            .collect();
        if terms.is_empty() { "0".to_string() } else { format!("({})", terms.join(" + ")) }
    };
    let media = total(|p| u8::from(p.media_extensions));
    let compute = total(|p| p.compute_slices);
    let memory = total(|p| p.memory_slices);
    format!(
        "{prefix} + (self.profiles.exists(k, self.profiles[k] > 0 && !(k in {own})) ? {unknown} \
         : {any_over} ? {over_n} + {over_msg} \
         : {media} > 1 ? {media_n} + {media_msg} \
         : {compute} > {cs} ? 'the layout needs ' + {compute_n} + {compute_msg} \
         : {memory} > {ms} ? 'the layout needs ' + {memory_n} + {memory_msg} \
         : {placement})",
        prefix = cel_str(&format!("does not fit {name}: ")),
        media_n = cel_table(&media, weighted_max(model, |p| u8::from(p.media_extensions))),
        media_msg = cel_str(" instances with media extensions (+me) requested, but a GPU holds at most one"),
        cs = model.compute_slices,
        compute_n = cel_table(&compute, weighted_max(model, |p| p.compute_slices)),
        compute_msg = cel_str(&format!(" compute slices, but one {name} has {}", model.compute_slices)),
        ms = model.memory_slots,
        memory_n = cel_table(&memory, weighted_max(model, |p| p.memory_slices)),
        memory_msg = cel_str(&format!(" memory slices, but one {name} has {}", model.memory_slots)),
        placement = cel_str(&format!(
            "no non-overlapping placement exists on {name}; `tessera-operator mig fit --gpu {name}` shows the \
             best partial one"
        )),
    )
}

/// `terms` added up as a chain of parenthesised chains of about the square root of their number:
/// one flat chain of 80 terms (every catalog profile name) nests 80 deep in an evaluator's tree,
/// a balanced tree nests as deep in a parser's; this nests about 18 and 2.
fn chunked_sum(terms: &[String]) -> String {
    let size = (terms.len() as f64).sqrt().ceil().max(1.0) as usize;
    let chunks: Vec<String> = terms.chunks(size).map(|c| format!("({})", c.join(" + "))).collect();
    chunks.join(" + ")
}

/// CEL for `each` of the first profile (in `profiles`' order) for which `over` holds, `none` if
/// none does: a balanced tree of conditionals (is any in the first half over? then the first
/// half's answer, else the second's), so eleven profiles nest four deep, not eleven.
fn first_over(
    profiles: &[&ProfileSpec],
    over: &dyn Fn(&ProfileSpec) -> String,
    each: &dyn Fn(&ProfileSpec) -> String,
    none: &str,
) -> String {
    match profiles {
        [] => none.to_string(),
        [p] => format!("({} ? {} : {none})", over(p), each(p)),
        _ => {
            let (l, r) = profiles.split_at(profiles.len() / 2);
            let any: Vec<String> = l.iter().map(|p| over(p)).collect();
            format!(
                "(({}) ? {} : {})",
                any.join(" || "),
                first_over(l, over, each, none),
                first_over(r, over, each, none)
            )
        }
    }
}

/// CEL for a profile's count in the layout, 0 when absent.
fn count(profile: &str) -> String {
    format!("self.profiles[?{}].orValue(0)", cel_str(profile))
}

/// The largest weighted sum a layout can reach while no profile is over its maximum count.
pub fn weighted_max(model: &GpuModel, weight: fn(&ProfileSpec) -> u8) -> u32 {
    model.profiles.iter().map(|p| u32::from(p.max_count) * u32::from(weight(p))).sum()
}

/// Every profile name some catalog board has, sorted.
fn catalog_profile_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = MODELS.iter().flat_map(|m| m.profile_names()).collect();
    names.sort();
    names.dedup();
    names
}

/// CEL for the decimal form of an int expression known to lie in `0..=max`: an index into a table
/// of literals, so that the API server knows how long the string can be.
fn cel_table(expr: &str, max: u32) -> String {
    format!("{}[{expr}]", cel_list((0..=max).map(|n| cel_str(&n.to_string()))))
}

/// CEL for the decimal form of a non-negative int expression, `over 64` from 65 on (a count
/// requested by the user: no board holds more than 7 of anything).
fn cel_number(expr: &str) -> String {
    format!("({expr} <= 64 ? {} : 'over 64')", cel_table(expr, 64))
}

/// A schemars transform for `GpuLayout`: appends [`layout_rules`] to its `x-kubernetes-validations`.
pub fn add_layout_rules(schema: &mut Schema) {
    let obj = schema.ensure_object();
    let rules = obj.entry("x-kubernetes-validations").or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(rules) = rules {
        rules.extend(layout_rules());
    }
}

/// A CEL string literal. Catalog names hold no quotes or backslashes (a test checks).
fn cel_str(s: &str) -> String {
    debug_assert!(!s.contains(['\'', '\\']), "{s:?} needs escaping");
    format!("'{s}'")
}

fn cel_list(items: impl Iterator<Item = String>) -> String {
    format!("[{}]", items.collect::<Vec<_>>().join(", "))
}

fn cel_map<'a>(entries: impl Iterator<Item = (&'a str, u32)>) -> String {
    format!("{{{}}}", entries.map(|(k, v)| format!("{}: {v}", cel_str(k))).collect::<Vec<_>>().join(", "))
}

#[cfg(test)]
mod tests;
