use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

fn model(name: &str) -> &'static GpuModel {
    catalog::lookup(name).unwrap()
}

fn p(profile: &str, start: u8, m: &GpuModel) -> Placement {
    Placement {
        start,
        size: m.profile(profile).unwrap().memory_slices,
        profile: m.profile(profile).unwrap().name.into(),
    }
}

fn gpu(node: &str, m: &'static GpuModel, instances: Vec<Placement>, busy: Vec<Placement>) -> GpuSlot {
    GpuSlot { node: node.into(), index: 0, model: m, mig_enabled: true, instances, busy, changeable: true }
}

fn demand(list: &[(&str, i64)]) -> BTreeMap<String, i64> {
    list.iter().map(|(r, n)| (r.to_string(), *n)).collect()
}

#[test]
fn a_fleet_that_already_covers_the_demand_changes_nothing() {
    let h = model("H100-80GB");
    let gpus = vec![gpu("a", h, vec![p("3g.40gb", 0, h), p("3g.40gb", 4, h)], vec![])];
    let a = solve(&gpus, &demand(&[("nvidia.com/mig-3g.40gb", 2)])).unwrap();
    assert_eq!((a.changed, a.destroyed), (0, 0));
    assert!(a.shortfall.is_empty());
}

#[test]
fn idle_gpus_are_repartitioned_and_busy_instances_are_kept() {
    let h = model("H100-80GB");
    let busy = p("3g.40gb", 0, h);
    let gpus = vec![
        gpu("a", h, vec![busy.clone(), p("3g.40gb", 4, h)], vec![busy.clone()]),
        gpu("b", h, vec![p("7g.80gb", 0, h)], vec![]),
        gpu("c", h, vec![p("7g.80gb", 0, h)], vec![]),
    ];
    let a = solve(&gpus, &demand(&[("nvidia.com/mig-3g.40gb", 2), ("nvidia.com/mig-1g.10gb", 8)])).unwrap();
    assert!(a.shortfall.is_empty(), "{a:?}");
    let Layout::Mig(first) = &a.gpus[0].layout else { panic!() };
    assert!(first.contains(&busy), "the busy 3g stays: {first:?}");
    // GPU a's free half gives four 1g; one more GPU gives the other four: two GPUs change.
    assert_eq!(a.changed, 2, "{a:#?}");
}

#[test]
fn an_impossible_demand_reports_the_shortfall_and_the_closest_answer() {
    let h = model("H100-80GB");
    let gpus = vec![gpu("a", h, vec![], vec![])];
    let a = solve(&gpus, &demand(&[("nvidia.com/mig-1g.10gb", 9)])).unwrap();
    assert_eq!(a.shortfall, demand(&[("nvidia.com/mig-1g.10gb", 2)]));
    assert_eq!(a.supply_after.get("nvidia.com/mig-1g.10gb"), Some(&7));
}

#[test]
fn a_gpu_no_plan_allows_to_change_keeps_its_layout() {
    let h = model("H100-80GB");
    let mut fixed = gpu("a", h, vec![p("7g.80gb", 0, h)], vec![]);
    fixed.changeable = false;
    let a = solve(&[fixed], &demand(&[("nvidia.com/mig-1g.10gb", 7)])).unwrap();
    assert_eq!(a.changed, 0);
    assert_eq!(a.shortfall, demand(&[("nvidia.com/mig-1g.10gb", 7)]));
}

/// An independent exact answer: dynamic programming over the GPUs, with every valid layout (not
/// only maximal ones) over the demanded and busy profiles, and supply capped at the demand.
/// Returns (least shortfall, least GPUs changed at that shortfall).
fn exhaustive(gpus: &[GpuSlot], demand: &BTreeMap<String, i64>) -> (i64, u32) {
    let resources: Vec<&String> = demand.keys().collect();
    let mut best: BTreeMap<Vec<i64>, u32> = [(vec![0; resources.len()], 0)].into();
    for g in gpus {
        let mut options: Vec<(Layout, bool)> = vec![(current(g), false)];
        if g.changeable {
            let mut names: Vec<String> = g
                .model
                .profiles
                .iter()
                .filter(|s| demand.contains_key(&catalog::mig_resource_name(s.name)))
                .map(|s| s.name.to_string())
                .collect();
            names.extend(g.busy.iter().map(|b| b.profile.clone()));
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            for l in solver::all_layouts(g.model, Some(&refs)) {
                if g.busy.iter().all(|b| l.contains(b)) {
                    let layout = Layout::Mig(l);
                    let changed = layout != current(g);
                    options.push((layout, changed));
                }
            }
            if g.busy.is_empty() && demand.contains_key(GPU_RESOURCE) {
                options.push((Layout::Whole, current(g) != Layout::Whole));
            }
        }
        let mut next: BTreeMap<Vec<i64>, u32> = BTreeMap::new();
        for (state, changed) in &best {
            for (layout, ch) in &options {
                let supply = layout.supply();
                let s: Vec<i64> = resources
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (state[i] + supply.get(*r).copied().unwrap_or(0)).min(demand[*r]))
                    .collect();
                let c = changed + u32::from(*ch);
                let e = next.entry(s).or_insert(u32::MAX);
                *e = (*e).min(c);
            }
        }
        best = next;
    }
    best.iter()
        .map(|(s, c)| (resources.iter().enumerate().map(|(i, r)| demand[*r] - s[i]).sum::<i64>(), *c))
        .min()
        .unwrap()
}

/// GPU `i` of a drawn fleet: one of its board's maximal layouts (MIG off one time in five), the
/// instances `busy_mask` picks kept busy. Shared by the fleet strategies.
fn drawn_slot(
    i: usize,
    (model, layouts): &(&'static GpuModel, Vec<Vec<Placement>>),
    seed: u64,
    changeable: bool,
    busy_mask: u8,
) -> GpuSlot {
    let mut g = GpuSlot {
        node: format!("n{i}"),
        index: 0,
        model,
        mig_enabled: !seed.is_multiple_of(5),
        instances: vec![],
        busy: vec![],
        changeable,
    };
    if g.mig_enabled {
        g.instances = layouts[(seed as usize / 5) % layouts.len()].clone();
        g.busy =
            g.instances.iter().enumerate().filter(|(k, _)| busy_mask & (1 << k) != 0).map(|(_, p)| p.clone()).collect();
    }
    g
}

fn fleet() -> impl Strategy<Value = (Vec<GpuSlot>, BTreeMap<String, i64>)> {
    let products = ["H100-80GB", "A100-40GB", "A30-24GB"];
    let one = (0usize..3, any::<u64>(), any::<bool>(), 0u8..4);
    let tables: Vec<_> = products.iter().map(|p| (model(p), solver::maximal_layouts(model(p), None))).collect();
    (proptest::collection::vec(one, 1..=8), 0i64..6, 0i64..9, 0i64..3).prop_map(move |(gs, d3g, d1g, dgpu)| {
        let gpus = gs
            .into_iter()
            .enumerate()
            .map(|(i, (prod, seed, changeable, busy_mask))| drawn_slot(i, &tables[prod], seed, changeable, busy_mask))
            .collect();
        // One profile name per size class that several boards share, and whole GPUs.
        let mut d = BTreeMap::new();
        for (r, n) in [
            ("nvidia.com/mig-3g.40gb", d3g),
            ("nvidia.com/mig-1g.10gb", d1g),
            ("nvidia.com/mig-1g.5gb", d1g / 2),
            ("nvidia.com/gpu", dgpu),
        ] {
            if n > 0 {
                d.insert(r.to_string(), n);
            }
        }
        (gpus, d)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// The answer is exact (same shortfall and GPUs changed as exhaustive search), keeps busy
    /// instances, leaves unchangeable GPUs alone, and every layout fits its GPU.
    #[test]
    fn the_answer_is_valid_keeps_busy_instances_and_changes_as_few_gpus_as_exhaustive_search(
        (gpus, demand) in fleet()
    ) {
        let a = solve(&gpus, &demand).unwrap();
        prop_assert!(a.optimal, "small fleets are solved to proven optimality");
        let (short, changed) = exhaustive(&gpus, &demand);
        prop_assert_eq!(a.shortfall.values().sum::<i64>(), short, "{:#?}", a);
        prop_assert_eq!(a.changed, changed, "{:#?}", a);
        for (g, ans) in gpus.iter().zip(&a.gpus) {
            match &ans.layout {
                Layout::Mig(l) => {
                    prop_assert!(solver::is_valid(g.model, l), "{:?} does not fit {}", l, g.model.name);
                    for b in &g.busy {
                        prop_assert!(l.contains(b), "busy {:?} destroyed", b);
                    }
                }
                Layout::Whole => prop_assert!(g.busy.is_empty()),
            }
            if !g.changeable {
                prop_assert!(!ans.changed);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// The greedy answer used for large fleets: every GPU gets exactly one candidate, and its
    /// shortfall lies between the exact optimum and that of changing nothing.
    #[test]
    fn the_greedy_answer_is_consistent_and_never_worse_than_changing_nothing((gpus, demand) in fleet()) {
        let classes = classify(&gpus, &demand);
        let g = greedy(&classes, &demand);
        for (class, per) in classes.iter().zip(&g) {
            prop_assert_eq!(per.iter().sum::<usize>(), class.members.len());
        }
        let nothing = greedy::unchanged(&classes);
        prop_assert!(score(&classes, &g, &demand).0 <= score(&classes, &nothing, &demand).0);
        let (short, _) = exhaustive(&gpus, &demand);
        prop_assert!(score(&classes, &g, &demand).0 >= short, "no better than exact");
    }
}

/// The greedy rule as first written (maps keyed by resource name, before the dense rewrite), kept
/// as the reference the fast one must match choice for choice.
fn reference_greedy(classes: &[Class], demand: &BTreeMap<String, i64>) -> Vec<Vec<usize>> {
    let mut counts = greedy::unchanged(classes);
    let mut supply: BTreeMap<&str, i64> = BTreeMap::new();
    for class in classes {
        for (r, k) in &class.candidates[0].supply {
            *supply.entry(r.as_str()).or_default() += k * class.members.len() as i64;
        }
    }
    let get = |m: &BTreeMap<String, i64>, r: &str| m.get(r).copied().unwrap_or(0);
    loop {
        let shortfall = |supply: &BTreeMap<&str, i64>, keep: Option<(&Candidate, &Candidate)>| -> i64 {
            demand
                .iter()
                .map(|(r, d)| {
                    let mut s = supply.get(r.as_str()).copied().unwrap_or(0);
                    if let Some((from, to)) = keep {
                        s += get(&to.supply, r) - get(&from.supply, r);
                    }
                    (d - s).max(0)
                })
                .sum()
        };
        let now = shortfall(&supply, None);
        if now == 0 {
            break;
        }
        let mut best: Option<((i64, i64, i64), usize, usize)> = None;
        for (ci, class) in classes.iter().enumerate().filter(|(ci, _)| counts[*ci][0] > 0) {
            let keep = &class.candidates[0];
            for (k, cand) in class.candidates.iter().enumerate().skip(1) {
                let gain = now - shortfall(&supply, Some((keep, cand)));
                let key = (gain, -i64::from(cand.destroyed), -i64::from(cand.fragmentation));
                if gain > 0 && best.as_ref().is_none_or(|(b, _, _)| key > *b) {
                    best = Some((key, ci, k));
                }
            }
        }
        let Some((_, ci, k)) = best else { break };
        counts[ci][0] -= 1;
        counts[ci][k] += 1;
        let (keep, cand) = (&classes[ci].candidates[0], &classes[ci].candidates[k]);
        for (r, n) in &keep.supply {
            *supply.entry(r.as_str()).or_default() -= n;
        }
        for (r, n) in &cand.supply {
            *supply.entry(r.as_str()).or_default() += n;
        }
    }
    counts
}

/// Up to 24 GPUs of four products, MIG on or off, some busy instances, some not changeable, and
/// demands over ten resources including zero and negative ones.
fn mixed_fleet() -> impl Strategy<Value = (Vec<GpuSlot>, BTreeMap<String, i64>)> {
    let products = ["H100-80GB", "A100-40GB", "A100-80GB", "A30-24GB"];
    let one = (0usize..4, any::<u64>(), any::<bool>(), 0u8..4);
    let res = proptest::collection::btree_map(
        prop::sample::select(vec![
            "nvidia.com/mig-3g.40gb",
            "nvidia.com/mig-1g.10gb",
            "nvidia.com/mig-1g.5gb",
            "nvidia.com/mig-2g.20gb",
            "nvidia.com/mig-1g.6gb",
            "nvidia.com/mig-2g.12gb",
            "nvidia.com/mig-7g.80gb",
            "nvidia.com/mig-4g.20gb",
            "nvidia.com/gpu",
            "nvidia.com/mig-1g.20gb",
        ]),
        -2i64..40,
        0..8,
    );
    // Each product's maximal layouts, once (they are what the fleet is drawn from).
    let tables: Vec<_> = products.iter().map(|p| (model(p), solver::maximal_layouts(model(p), None))).collect();
    (proptest::collection::vec(one, 1..=24), res).prop_map(move |(gs, d)| {
        let gpus = gs
            .into_iter()
            .enumerate()
            .map(|(i, (prod, seed, changeable, busy_mask))| {
                drawn_slot(i, &tables[prod], seed, seed % 7 != 0 || changeable, busy_mask)
            })
            .collect();
        (gpus, d.into_iter().map(|(r, n)| (r.to_string(), n)).collect())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(60))]
    /// Same answers as the reference rule (same moves, same tie-breaking), and when it stops
    /// short no single further change would remove any shortfall.
    #[test]
    fn the_dense_greedy_chooses_exactly_as_the_reference_rule((gpus, demand) in mixed_fleet()) {
        let classes = classify(&gpus, &demand);
        let counts = greedy(&classes, &demand);
        prop_assert_eq!(&counts, &reference_greedy(&classes, &demand));
        let (short, ..) = score(&classes, &counts, &demand);
        if short > 0 {
            for (ci, class) in classes.iter().enumerate().filter(|(ci, _)| counts[*ci][0] > 0) {
                for k in 1..class.candidates.len() {
                    let mut moved = counts.clone();
                    moved[ci][0] -= 1;
                    moved[ci][k] += 1;
                    prop_assert!(score(&classes, &moved, &demand).0 >= short, "a change that helps was left");
                }
            }
        }
    }
}
