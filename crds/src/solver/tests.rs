use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;
use crate::catalog::{self, MODELS};

fn model(name: &str) -> &'static GpuModel {
    catalog::lookup(name).unwrap()
}

fn req(items: &[(&str, u32)]) -> ProfileCounts {
    items.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn pl(profile: &str, start: u8, size: u8) -> Placement {
    Placement { start, size, profile: profile.into() }
}

#[test]
fn fits_report_placements_sorted_by_start() {
    let got = fit(model("H100-80GB"), &req(&[("3g.40gb", 1), ("2g.20gb", 2)])).unwrap();
    assert_eq!(got, vec![pl("2g.20gb", 0, 2), pl("2g.20gb", 2, 2), pl("3g.40gb", 4, 4)]);
}

#[test]
fn non_obvious_placement_is_found_2g_2g_3g_needs_3g_at_slot_4() {
    // Largest-first would try 3g at 0, leaving 2g only at 4; the solver must backtrack.
    let got = fit(model("A100-40GB"), &req(&[("2g.10gb", 2), ("3g.20gb", 1)])).unwrap();
    assert_eq!(got, vec![pl("2g.10gb", 0, 2), pl("2g.10gb", 2, 2), pl("3g.20gb", 4, 4)]);
    // 4g + 2g + 1g needs the 1g at slot 6.
    let got = fit(model("A100-40GB"), &req(&[("4g.20gb", 1), ("2g.10gb", 1), ("1g.5gb", 1)])).unwrap();
    assert_eq!(got, vec![pl("4g.20gb", 0, 4), pl("2g.10gb", 4, 2), pl("1g.5gb", 6, 1)]);
}

#[test]
fn impossible_layouts_are_refused_with_the_right_reason() {
    let a100 = model("A100-40GB");
    let over_max = |p: &str, n: u32, max: u8| FitError::OverMaxCount {
        profile: p.into(),
        requested: n,
        max,
        product: "A100-40GB".into(),
    };
    let compute = |n: u32| FitError::ComputeExceeded { requested: n, available: 7, product: "A100-40GB".into() };
    assert_eq!(fit(a100, &req(&[("4g.20gb", 2)])), Err(over_max("4g.20gb", 2, 1)));
    assert_eq!(fit(a100, &req(&[("3g.20gb", 3)])), Err(over_max("3g.20gb", 3, 2)));
    assert_eq!(fit(a100, &req(&[("1g.5gb", 8)])), Err(over_max("1g.5gb", 8, 7)));
    assert_eq!(fit(a100, &req(&[("2g.10gb", 3), ("1g.5gb", 2)])), Err(compute(8)));
    assert_eq!(fit(a100, &req(&[("4g.20gb", 1), ("3g.20gb", 1), ("1g.5gb", 1)])), Err(compute(8)));
    // Two +me: one per GPU, whatever the profile (A30 has two +me profiles).
    let a30 = model("A30-24GB");
    assert_eq!(
        fit(a30, &req(&[("1g.6gb+me", 1), ("2g.12gb+me", 1)])),
        Err(FitError::TooManyMediaExtensions { requested: 2 })
    );
    assert_eq!(fit(a100, &req(&[("1g.5gb+me", 2)])), Err(over_max("1g.5gb+me", 2, 1)));
    // 3g + 3g + 1g: counts and compute are fine, but the memory axis is full.
    match fit(a100, &req(&[("3g.20gb", 2), ("1g.5gb", 1)])) {
        Err(FitError::MemoryExceeded { requested: 9, available: 8, .. }) => {}
        other => panic!("3g+3g+1g: {other:?}"),
    }
}

#[test]
fn no_placement_names_the_best_partial_placement() {
    // On an empty 8-slot GPU the counting rules already exclude almost everything that cannot be
    // placed, so fragmentation shows up around instances that must stay: a busy 1g.5gb at slot 2
    // blocks the only 4g.20gb placement.
    let a100 = model("A100-40GB");
    let kept = [pl("1g.5gb", 2, 1)];
    match fit_around(a100, &kept, &req(&[("4g.20gb", 1), ("1g.5gb", 1)])) {
        Err(e @ FitError::NoPlacement { .. }) => {
            let FitError::NoPlacement { best_partial, unplaced, .. } = &e else { unreachable!() };
            assert_eq!(best_partial, &vec![pl("1g.5gb", 0, 1)]);
            assert_eq!(unplaced, &req(&[("4g.20gb", 1)]));
            assert!(e.to_string().contains("best partial placement: [1g.5gb@0:1]; left over: 1 x 4g.20gb"), "{e}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn fit_around_keeps_existing_instances_in_place() {
    let a100 = model("A100-40GB");
    let kept = [pl("3g.20gb", 4, 4)];
    let got = fit_around(a100, &kept, &req(&[("2g.10gb", 1), ("1g.5gb", 2)])).unwrap();
    assert_eq!(got, vec![pl("2g.10gb", 0, 2), pl("1g.5gb", 2, 1), pl("1g.5gb", 3, 1)]);
    // Counting rules include the kept instances.
    assert!(matches!(
        fit_around(a100, &kept, &req(&[("3g.20gb", 2)])),
        Err(FitError::OverMaxCount { requested: 3, .. })
    ));
}

#[test]
fn unknown_profile_names_the_valid_ones() {
    let err = fit(model("H100-80GB"), &req(&[("1g.5gb", 1)])).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("\"1g.5gb\" does not exist on H100-80GB"), "{msg}");
    assert!(msg.contains("1g.10gb, 1g.10gb+me, 1g.20gb"), "{msg}");
}

#[test]
fn zero_counts_and_the_resource_spelling_are_accepted() {
    assert_eq!(fit(model("H100-80GB"), &req(&[("7g.80gb", 0)])).unwrap(), vec![]);
    let got = fit(model("H100-80GB"), &req(&[("1g.10gb.me", 1)])).unwrap();
    assert_eq!(got, vec![pl("1g.10gb+me", 0, 1)]);
}

/// The 19 maximal placement configurations NVIDIA's user guide draws for A100-40GB with the five
/// classic profiles. (By multiset they are 14 distinct layouts; see the closing note.)
#[test]
fn a100_40gb_maximal_configurations_are_the_19_nvidia_draws() {
    let profiles = ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"];
    let got: BTreeSet<String> = maximal_layouts(model("A100-40GB"), Some(&profiles))
        .iter()
        .map(|l| l.iter().map(ToString::to_string).collect::<Vec<_>>().join(" "))
        .collect();
    let halves_small = [
        "2g.10gb@0:2 2g.10gb@2:2",
        "2g.10gb@0:2 1g.5gb@2:1 1g.5gb@3:1",
        "1g.5gb@0:1 1g.5gb@1:1 2g.10gb@2:2",
        "1g.5gb@0:1 1g.5gb@1:1 1g.5gb@2:1 1g.5gb@3:1",
    ];
    let right_small = ["2g.10gb@4:2 1g.5gb@6:1", "1g.5gb@4:1 1g.5gb@5:1 1g.5gb@6:1"];
    let mut want: BTreeSet<String> = BTreeSet::new();
    want.insert("7g.40gb@0:8".into());
    want.insert("3g.20gb@0:4 3g.20gb@4:4".into());
    want.insert("4g.20gb@0:4 3g.20gb@4:4".into());
    for r in right_small {
        want.insert(format!("4g.20gb@0:4 {r}"));
        want.insert(format!("3g.20gb@0:4 {r}"));
    }
    for l in halves_small {
        want.insert(format!("{l} 3g.20gb@4:4"));
        for r in right_small {
            want.insert(format!("{l} {r}"));
        }
    }
    // Canonical form: sorted by start, which the solver's Placement order gives.
    let canon = |s: &String| {
        let mut parts: Vec<&str> = s.split(' ').collect();
        parts.sort_by_key(|p| p.split('@').nth(1).unwrap().split(':').next().unwrap().parse::<u8>().unwrap());
        parts.join(" ")
    };
    let want: BTreeSet<String> = want.iter().map(canon).collect();
    assert_eq!(want.len(), 19);
    assert_eq!(got, want);
    let multisets: BTreeSet<_> =
        maximal_layouts(model("A100-40GB"), Some(&profiles)).iter().map(|l| counts_of(l)).collect();
    assert_eq!(multisets.len(), 14);
}

#[test]
fn maximal_layouts_are_deterministic() {
    let a = maximal_layouts(model("H100-80GB"), None);
    let b = maximal_layouts(model("H100-80GB"), None);
    assert_eq!(a, b);
    assert!(a.iter().all(|l| is_valid(model("H100-80GB"), l)));
}

fn arb_request() -> impl Strategy<Value = (&'static GpuModel, ProfileCounts)> {
    (0..MODELS.len()).prop_flat_map(|i| {
        let m = &MODELS[i];
        proptest::collection::vec(0u32..4, m.profiles.len()).prop_map(move |counts| {
            let req =
                m.profiles.iter().zip(counts).filter(|(_, n)| *n > 0).map(|(p, n)| (p.name.to_string(), n)).collect();
            (m, req)
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Every answer is right: a fit is in bounds, non-overlapping and exactly the request; a
    /// refusal is confirmed by the brute-force oracle (no valid layout contains the request).
    #[test]
    fn fit_agrees_with_brute_force((m, request) in arb_request()) {
        let oracle = all_layouts(m, None).iter().any(|l| {
            let have = counts_of(l);
            request.iter().all(|(k, v)| have.get(k).copied().unwrap_or(0) >= *v)
        });
        match fit(m, &request) {
            Ok(placements) => {
                prop_assert!(is_valid(m, &placements));
                prop_assert_eq!(counts_of(&placements), request.clone());
                for p in &placements {
                    prop_assert!(p.start + p.size <= m.memory_slots);
                }
                prop_assert!(placements.windows(2).all(|w| w[0].start + w[0].size <= w[1].start));
                prop_assert!(oracle);
            }
            Err(FitError::NoPlacement { best_partial, .. }) => {
                prop_assert!(!oracle);
                prop_assert!(is_valid(m, &best_partial));
            }
            Err(_) => prop_assert!(!oracle),
        }
    }

    /// Kept instances never move and the result never overlaps them.
    #[test]
    fn fit_around_respects_kept((m, request) in arb_request(), pick in 0usize..64) {
        let layouts = all_layouts(m, None);
        let kept = layouts[pick % layouts.len()].clone();
        if let Ok(new) = fit_around(m, &kept, &request) {
            let mut all = kept.clone();
            all.extend(new.iter().cloned());
            prop_assert!(is_valid(m, &all));
            prop_assert_eq!(counts_of(&new), request.clone());
        }
    }
}
