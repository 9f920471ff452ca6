//! Pure fleet solver: which GPUs to carve how so that the fleet's MIG supply covers the tenants'
//! demand, changing as little as possible. Minimises, in order: the shortfall (when the demand
//! cannot be met, the closest achievable answer), GPUs changed, instances destroyed, and
//! fragmentation (free compute slices no demanded profile can use). Busy instances are never
//! destroyed; GPUs a plan does not allow to change keep their layout.
//!
//! GPUs of the same product with the same layout and the same busy instances are interchangeable,
//! so the fleet is grouped into classes, and the choice "how many GPUs of each class get each
//! candidate layout" is an integer program solved exactly in four lexicographic stages (each
//! stage bounds the previous objective). Candidate layouts are the maximal layouts over the
//! demanded (and busy) profiles that keep the busy instances where they are: every layout is
//! dominated by one of them, so nothing better is left out.

use std::collections::{BTreeMap, BTreeSet};

use microlp::{ComparisonOp, OptimizationDirection, Problem, Variable};
use serde::Serialize;
use tessera_crds::catalog::{self, GpuModel};
use tessera_crds::solver::{self, Placement, ProfileCounts};
use tessera_crds::validate::GPU_RESOURCE;

mod greedy;
use greedy::greedy;

/// One GPU as the solver sees it.
#[derive(Debug, Clone)]
pub struct GpuSlot {
    pub node: String,
    pub index: i32,
    pub model: &'static GpuModel,
    pub mig_enabled: bool,
    /// Current instances (empty when MIG is off).
    pub instances: Vec<Placement>,
    /// Instances with processes: kept where they are, whatever the answer.
    pub busy: Vec<Placement>,
    /// Whether a plan allows this GPU to change.
    pub changeable: bool,
}

/// What a GPU should hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Layout {
    /// MIG off: the whole GPU is one `nvidia.com/gpu`.
    Whole,
    Mig(Vec<Placement>),
}

impl Layout {
    fn supply(&self) -> BTreeMap<String, i64> {
        let mut out = BTreeMap::new();
        match self {
            Layout::Whole => *out.entry(GPU_RESOURCE.to_string()).or_default() += 1,
            Layout::Mig(p) => {
                p.iter().for_each(|p| *out.entry(catalog::mig_resource_name(&p.profile)).or_default() += 1)
            }
        }
        out
    }

    /// The profile counts, for a plan's layout.
    pub fn profiles(&self) -> ProfileCounts {
        match self {
            Layout::Whole => ProfileCounts::new(),
            Layout::Mig(p) => solver::counts_of(p),
        }
    }
}

/// The answer for one GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuAnswer {
    pub node: String,
    pub index: i32,
    pub product: &'static str,
    pub layout: Layout,
    pub changed: bool,
    pub destroyed: u32,
}

/// The solver's answer for the fleet.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetAnswer {
    pub gpus: Vec<GpuAnswer>,
    pub changed: u32,
    pub destroyed: u32,
    /// Free compute slices no demanded profile can use, over the whole fleet.
    pub fragmentation: u32,
    pub supply_before: BTreeMap<String, i64>,
    pub supply_after: BTreeMap<String, i64>,
    /// Demand the answer cannot meet, per resource (empty when it is met).
    pub shortfall: BTreeMap<String, i64>,
    /// Whether every stage was proven optimal; `false` when a stage hit its time limit and the
    /// best answer found by then is given.
    pub optimal: bool,
}

/// Above this many (class, candidate) pairs the exact search is skipped for the greedy answer:
/// measured, branch and bound does not finish much beyond it (BENCHMARKS.md).
const EXACT_UP_TO: usize = 400;

/// How long one lexicographic stage may search before the best answer found so far is taken.
const STAGE_TIME_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
#[error("the fleet solver failed: {0}")]
pub struct SolveError(String);

/// One way to lay out every GPU of a class.
#[derive(Debug, Clone)]
struct Candidate {
    layout: Layout,
    supply: BTreeMap<String, i64>,
    changed: bool,
    destroyed: u32,
    fragmentation: u32,
}

/// Interchangeable GPUs: same product, layout, busy instances and permission to change.
struct Class {
    members: Vec<usize>,
    candidates: Vec<Candidate>,
}

/// The current layout of a GPU.
fn current(g: &GpuSlot) -> Layout {
    if g.mig_enabled {
        let mut p = g.instances.clone();
        p.sort();
        Layout::Mig(p)
    } else {
        Layout::Whole
    }
}

/// Free compute slices that no demanded profile can use once the layout is filled greedily with
/// demanded profiles (largest first).
fn fragmentation(model: &GpuModel, layout: &Layout, demanded: &[&'static str]) -> u32 {
    let Layout::Mig(placed) = layout else { return 0 };
    let mut placed = placed.clone();
    let mut by_size: Vec<&str> = demanded.to_vec();
    by_size.sort_by_key(|p| std::cmp::Reverse(model.profile(p).map(|s| s.compute_slices).unwrap_or(0)));
    'grow: loop {
        for p in &by_size {
            if let Ok(mut new) = solver::fit_around(model, &placed, &[(p.to_string(), 1)].into()) {
                placed.append(&mut new);
                continue 'grow;
            }
        }
        break;
    }
    let used: u32 = placed.iter().filter_map(|p| model.profile(&p.profile)).map(|s| u32::from(s.compute_slices)).sum();
    u32::from(model.compute_slices).saturating_sub(used)
}

fn candidate(g: &GpuSlot, layout: Layout, demanded: &[&'static str]) -> Candidate {
    let now = current(g);
    let destroyed = match (&now, &layout) {
        (Layout::Mig(old), Layout::Mig(new)) => old.iter().filter(|p| !new.contains(p)).count() as u32,
        (Layout::Mig(old), Layout::Whole) => old.len() as u32,
        (Layout::Whole, _) => 0,
    };
    Candidate {
        supply: layout.supply(),
        changed: layout != now,
        destroyed,
        fragmentation: fragmentation(g.model, &layout, demanded),
        layout,
    }
}

/// The layouts a GPU may get: its own, and (if it may change) every maximal layout over the
/// demanded and busy profiles that keeps its busy instances, and whole-GPU mode when whole GPUs
/// are demanded and nothing is busy. Dominated candidates are dropped.
fn candidates(
    g: &GpuSlot,
    demand: &BTreeMap<String, i64>,
    maximal: &mut BTreeMap<(String, Vec<String>), Vec<Vec<Placement>>>,
) -> Vec<Candidate> {
    let demanded: Vec<&'static str> = g
        .model
        .profiles
        .iter()
        .filter(|p| demand.get(&catalog::mig_resource_name(p.name)).is_some_and(|d| *d > 0))
        .map(|p| p.name)
        .collect();
    let mut out = vec![candidate(g, current(g), &demanded)];
    if !g.changeable {
        return out;
    }
    let mut allowed: BTreeSet<String> = demanded.iter().map(|p| p.to_string()).collect();
    allowed.extend(g.busy.iter().map(|p| p.profile.clone()));
    if !allowed.is_empty() {
        let key = (g.model.name.to_string(), allowed.iter().cloned().collect::<Vec<_>>());
        let layouts = maximal.entry(key).or_insert_with(|| {
            let names: Vec<&str> = allowed.iter().map(String::as_str).collect();
            solver::maximal_layouts(g.model, Some(&names))
        });
        for l in layouts.iter().filter(|l| g.busy.iter().all(|b| l.contains(b))) {
            out.push(candidate(g, Layout::Mig(l.clone()), &demanded));
        }
    }
    if g.busy.is_empty() && demand.get(GPU_RESOURCE).is_some_and(|d| *d > 0) {
        out.push(candidate(g, Layout::Whole, &demanded));
    }
    prune(out)
}

/// Drops candidates another one beats on every count (more of every demanded resource, no more
/// destroyed, changed or fragmented); the first (the current layout) always stays.
fn prune(all: Vec<Candidate>) -> Vec<Candidate> {
    let mut kept: Vec<Candidate> = Vec::new();
    for (i, c) in all.iter().enumerate() {
        let beaten = all.iter().enumerate().any(|(j, o)| {
            if i == 0 || j == i {
                return false;
            }
            let covers = c.supply.iter().all(|(r, n)| o.supply.get(r).copied().unwrap_or(0) >= *n);
            let no_worse = o.destroyed <= c.destroyed
                && o.fragmentation <= c.fragmentation
                && (o.changed as u8) <= (c.changed as u8);
            let same = o.supply == c.supply
                && o.destroyed == c.destroyed
                && o.fragmentation == c.fragmentation
                && o.changed == c.changed;
            covers && no_worse && (!same || j < i)
        });
        if !beaten {
            kept.push(c.clone());
        }
    }
    kept
}

fn total_supply(gpus: &[GpuSlot]) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for g in gpus {
        for (r, n) in current(g).supply() {
            *out.entry(r).or_default() += n;
        }
    }
    out
}

fn shortfall(demand: &BTreeMap<String, i64>, supply: &BTreeMap<String, i64>) -> BTreeMap<String, i64> {
    demand
        .iter()
        .filter_map(|(r, d)| {
            let short = d - supply.get(r).copied().unwrap_or(0);
            (short > 0).then(|| (r.clone(), short))
        })
        .collect()
}

/// Solves the fleet. `demand` is per resource name (`nvidia.com/mig-1g.10gb`, `nvidia.com/gpu`).
pub fn solve(gpus: &[GpuSlot], demand: &BTreeMap<String, i64>) -> Result<FleetAnswer, SolveError> {
    let before = total_supply(gpus);
    // Never flap: a fleet that already covers the demand changes nothing.
    if shortfall(demand, &before).is_empty() {
        return Ok(unchanged(gpus, demand, before));
    }
    let classes = classify(gpus, demand);
    let (counts, optimal) = choose_counts(&classes, demand)?;
    answer(gpus, &classes, counts, demand, before, optimal)
}

/// The answer that keeps every GPU's current layout, for a fleet that covers the demand.
fn unchanged(gpus: &[GpuSlot], demand: &BTreeMap<String, i64>, before: BTreeMap<String, i64>) -> FleetAnswer {
    let frag = gpus.iter().map(|g| candidates(g, demand, &mut BTreeMap::new())[0].fragmentation).sum();
    let list = gpus
        .iter()
        .map(|g| GpuAnswer {
            node: g.node.clone(),
            index: g.index,
            product: g.model.name,
            layout: current(g),
            changed: false,
            destroyed: 0,
        })
        .collect();
    FleetAnswer {
        gpus: list,
        changed: 0,
        destroyed: 0,
        fragmentation: frag,
        supply_after: before.clone(),
        supply_before: before,
        shortfall: BTreeMap::new(),
        optimal: true,
    }
}

/// How many GPUs of each class get each of its candidates, and whether that is proven optimal:
/// the exact search on a small enough problem, else the greedy answer; the greedy answer also
/// wins where an exact search that gave up scores worse.
fn choose_counts(classes: &[Class], demand: &BTreeMap<String, i64>) -> Result<(Vec<Vec<usize>>, bool), SolveError> {
    let size: usize = classes.iter().map(|c| c.candidates.len()).sum();
    let (mut counts, optimal) =
        if size <= EXACT_UP_TO { optimise(classes, demand)? } else { (greedy(classes, demand), false) };
    if !optimal {
        // The exact search gave up: take the greedy answer where it is better.
        let greedy = greedy(classes, demand);
        if score(classes, &greedy, demand) < score(classes, &counts, demand) {
            counts = greedy;
        }
    }
    Ok((counts, optimal))
}

/// The fleet's answer from the chosen counts: each class's members take its candidates in order,
/// and the changes, destroyed instances, fragmentation and supply are summed over the GPUs.
fn answer(
    gpus: &[GpuSlot],
    classes: &[Class],
    counts: Vec<Vec<usize>>,
    demand: &BTreeMap<String, i64>,
    before: BTreeMap<String, i64>,
    optimal: bool,
) -> Result<FleetAnswer, SolveError> {
    let mut answers: Vec<Option<GpuAnswer>> = vec![None; gpus.len()];
    let (mut changed, mut destroyed, mut frag) = (0, 0, 0);
    let mut after: BTreeMap<String, i64> = BTreeMap::new();
    for (class, per_candidate) in classes.iter().zip(counts) {
        let mut members = class.members.iter();
        for (c, n) in class.candidates.iter().zip(per_candidate) {
            for &i in members.by_ref().take(n) {
                let g = &gpus[i];
                changed += u32::from(c.changed);
                destroyed += c.destroyed;
                frag += c.fragmentation;
                for (r, k) in &c.supply {
                    *after.entry(r.clone()).or_default() += k;
                }
                answers[i] = Some(GpuAnswer {
                    node: g.node.clone(),
                    index: g.index,
                    product: g.model.name,
                    layout: c.layout.clone(),
                    changed: c.changed,
                    destroyed: c.destroyed,
                });
            }
        }
    }
    let gpus = answers
        .into_iter()
        .map(|a| a.ok_or_else(|| SolveError("a GPU got no layout".into())))
        .collect::<Result<_, _>>()?;
    Ok(FleetAnswer {
        gpus,
        changed,
        destroyed,
        fragmentation: frag,
        shortfall: shortfall(demand, &after),
        supply_before: before,
        supply_after: after,
        optimal,
    })
}

/// (shortfall, GPUs changed, destroyed, fragmentation) of an assignment: lower is better.
fn score(classes: &[Class], counts: &[Vec<usize>], demand: &BTreeMap<String, i64>) -> (i64, u32, u32, u32) {
    let mut supply: BTreeMap<&str, i64> = BTreeMap::new();
    let (mut changed, mut destroyed, mut frag) = (0, 0, 0);
    for (class, per) in classes.iter().zip(counts) {
        for (c, &n) in class.candidates.iter().zip(per) {
            let n32 = n as u32;
            changed += u32::from(c.changed) * n32;
            destroyed += c.destroyed * n32;
            frag += c.fragmentation * n32;
            for (r, k) in &c.supply {
                *supply.entry(r.as_str()).or_default() += k * n as i64;
            }
        }
    }
    let short = demand.iter().map(|(r, d)| (d - supply.get(r.as_str()).copied().unwrap_or(0)).max(0)).sum();
    (short, changed, destroyed, frag)
}

fn classify(gpus: &[GpuSlot], demand: &BTreeMap<String, i64>) -> Vec<Class> {
    let mut index: BTreeMap<(String, String, String, bool), usize> = BTreeMap::new();
    let mut classes: Vec<Class> = Vec::new();
    let mut maximal = BTreeMap::new();
    for (i, g) in gpus.iter().enumerate() {
        let mut busy = g.busy.clone();
        busy.sort();
        let key = (g.model.name.to_string(), format!("{:?}", current(g)), format!("{busy:?}"), g.changeable);
        match index.get(&key) {
            Some(&c) => classes[c].members.push(i),
            None => {
                index.insert(key, classes.len());
                classes.push(Class { members: vec![i], candidates: candidates(g, demand, &mut maximal) });
            }
        }
    }
    classes
}

/// How many GPUs of each class get each candidate, lexicographically optimal (or the best found
/// within the time limits: the flag says which).
fn optimise(classes: &[Class], demand: &BTreeMap<String, i64>) -> Result<(Vec<Vec<usize>>, bool), SolveError> {
    let stages: [Option<Weight>; 4] = [
        None, // the shortfall
        Some(|c| f64::from(u8::from(c.changed))),
        Some(|c| f64::from(c.destroyed)),
        Some(|c| f64::from(c.fragmentation)),
    ];
    let mut bounds: Vec<(Option<Weight>, f64)> = Vec::new();
    let mut last: Option<Vec<Vec<usize>>> = None;
    let mut optimal = true;
    for stage in stages {
        let (mut problem, vars) = model(classes, demand, stage, &bounds);
        problem.set_time_limit(STAGE_TIME_LIMIT);
        let outcome = problem.solve().map_err(|e| SolveError(e.to_string()))?;
        optimal &= outcome.is_optimal();
        let Ok(solution) = outcome.into_solution() else {
            // No answer within the limit: the previous stage's answer meets every bound so far.
            optimal = false;
            break;
        };
        bounds.push((stage, solution.objective()));
        last = Some(
            vars.iter()
                .map(|vs| vs.iter().map(|v| solution.var_value(*v).round().max(0.0) as usize).collect())
                .collect(),
        );
    }
    let counts = last.ok_or_else(|| SolveError(format!("no answer within {}s", STAGE_TIME_LIMIT.as_secs())))?;
    Ok((counts, optimal))
}

/// Weights the candidates in one stage's objective.
type Weight = fn(&Candidate) -> f64;

/// One stage's integer program: `objective` weights the candidates (`None`: minimise the
/// shortfall), earlier stages' optima bound their objectives.
fn model(
    classes: &[Class],
    demand: &BTreeMap<String, i64>,
    objective: Option<Weight>,
    bounds: &[(Option<Weight>, f64)],
) -> (Problem, Vec<Vec<Variable>>) {
    let mut p = Problem::new(OptimizationDirection::Minimize);
    let mut vars: Vec<Vec<Variable>> = Vec::new();
    for class in classes {
        let n = class.members.len() as i32;
        let vs: Vec<Variable> = class
            .candidates
            .iter()
            .map(|c| p.add_integer_var(objective.map(|w| w(c)).unwrap_or(0.0), (0, n)))
            .collect();
        p.add_constraint(vs.iter().map(|v| (*v, 1.0)).collect::<Vec<_>>().as_slice(), ComparisonOp::Eq, f64::from(n));
        vars.push(vs);
    }
    let slack_weight = if objective.is_none() { 1.0 } else { 0.0 };
    let mut slack = Vec::new();
    for (r, d) in demand.iter().filter(|(_, d)| **d > 0) {
        let s = p.add_var(slack_weight, (0.0, *d as f64));
        let mut expr: Vec<(Variable, f64)> = vec![(s, 1.0)];
        for (class, vs) in classes.iter().zip(&vars) {
            for (c, v) in class.candidates.iter().zip(vs) {
                if let Some(k) = c.supply.get(r).filter(|k| **k > 0) {
                    expr.push((*v, *k as f64));
                }
            }
        }
        p.add_constraint(expr.as_slice(), ComparisonOp::Ge, *d as f64);
        slack.push(s);
    }
    for (weight, optimum) in bounds {
        let limit = optimum + 0.5; // every objective is integral
        match weight {
            None => p.add_constraint(
                slack.iter().map(|s| (*s, 1.0)).collect::<Vec<_>>().as_slice(),
                ComparisonOp::Le,
                limit,
            ),
            Some(w) => {
                let expr: Vec<(Variable, f64)> = classes
                    .iter()
                    .zip(&vars)
                    .flat_map(|(class, vs)| class.candidates.iter().zip(vs).map(|(c, v)| (*v, w(c))))
                    .filter(|(_, k)| *k != 0.0)
                    .collect();
                if !expr.is_empty() {
                    p.add_constraint(expr.as_slice(), ComparisonOp::Le, limit);
                }
            }
        }
    }
    (p, vars)
}

#[cfg(test)]
mod tests;

/// Free compute slices of the GPUs' current layouts that no demanded profile can use: the
/// stranded capacity a plan reports as `fragmentedSlices`.
pub fn stranded_slices(gpus: &[GpuSlot], demand: &BTreeMap<String, i64>) -> u32 {
    gpus.iter()
        .map(|g| {
            let demanded: Vec<&'static str> = g
                .model
                .profiles
                .iter()
                .filter(|p| demand.get(&catalog::mig_resource_name(p.name)).is_some_and(|d| *d > 0))
                .map(|p| p.name)
                .collect();
            fragmentation(g.model, &current(g), &demanded)
        })
        .sum()
}
