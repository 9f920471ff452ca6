use std::collections::BTreeMap;

use proptest::prelude::*;

use super::{Holder, blocked, over, usage, written_limits};

const KEY: &str = "requests.nvidia.com/gpu";

fn holder(name: &str, created: &str, n: i64, placed: bool) -> Holder {
    Holder { name: name.into(), created: created.into(), charges: [(KEY.to_string(), n)].into(), placed }
}

fn share(n: i64) -> BTreeMap<String, i64> {
    [(KEY.to_string(), n)].into()
}

fn refs(hs: &[Holder]) -> Vec<&Holder> {
    hs.iter().collect()
}

/// Twenty gated pods made before the namespace joined, against a share of 2: exactly the first
/// two made are let through; deleting the extras lets nothing more through than the share.
#[test]
fn of_twenty_pods_made_before_joining_the_first_two_made_are_let_through() {
    let pods: Vec<Holder> =
        (0..20).map(|i| holder(&format!("p{i:02}"), &format!("2026-12-01T00:00:{:02}Z", 59 - i), 1, false)).collect();
    let b = blocked(&share(2), &refs(&pods));
    assert_eq!(b.len(), 18);
    // The last two listed were made first.
    assert!(!b.contains("p19") && !b.contains("p18"), "{b:?}");
    // Once those two are bound, the rest stay blocked; once one finishes, one more goes.
    let mut pods = pods;
    for p in pods.iter_mut().filter(|p| p.name == "p19" || p.name == "p18") {
        p.placed = true;
    }
    assert_eq!(blocked(&share(2), &refs(&pods)).len(), 18);
    pods.retain(|p| p.name != "p19");
    let b = blocked(&share(2), &refs(&pods));
    assert_eq!(b.len(), 17);
    assert!(!b.contains("p17"), "the next made goes next: {b:?}");
}

#[test]
fn an_all_claim_past_the_share_is_blocked_and_a_smaller_later_one_fits() {
    let claims =
        vec![holder("all", "2026-12-01T00:00:00Z", 32, false), holder("one", "2026-12-01T00:00:01Z", 1, false)];
    let b = blocked(&share(2), &refs(&claims));
    assert_eq!(b.into_iter().collect::<Vec<_>>(), vec!["all".to_string()]);
}

#[test]
fn what_is_placed_beyond_the_share_stays_and_nothing_more_goes() {
    let hs =
        vec![holder("running", "2026-12-01T00:00:00Z", 3, true), holder("waiting", "2026-12-01T00:00:01Z", 1, false)];
    assert_eq!(blocked(&share(2), &refs(&hs)).len(), 1);
    let u = usage(None, &refs(&hs));
    assert_eq!(u[KEY], 4);
    assert!(over(&share(2), &u).contains(KEY));
}

#[test]
fn a_key_without_a_share_lets_nothing_through() {
    let hs = vec![Holder {
        name: "p".into(),
        created: "2026-12-01T00:00:00Z".into(),
        charges: [("requests.nvidia.com/mig-1g.10gb".to_string(), 1)].into(),
        placed: false,
    }];
    assert_eq!(blocked(&share(4), &refs(&hs)).len(), 1);
}

#[test]
fn usage_is_the_larger_of_the_shown_and_the_counted() {
    let hs = vec![holder("a", "t", 2, true)];
    assert_eq!(usage(Some(&share(5)), &refs(&hs))[KEY], 5, "the ResourceQuota counts more (the cache is behind)");
    assert_eq!(usage(Some(&share(1)), &refs(&hs))[KEY], 2, "Tessera counts more (made before the ResourceQuota)");
    assert_eq!(usage(None, &refs(&hs))[KEY], 2, "no status yet");
}

#[test]
fn the_written_limit_leaves_room_only_for_what_the_resource_quota_counts() {
    let hs = vec![holder("early", "t", 3, false)];
    // The ResourceQuota shows 1 of the 3: admitting up to its limit must keep the total at 4.
    assert_eq!(written_limits(&share(4), Some(&share(1)), &refs(&hs))[KEY], 2);
    // Shown in full: the share.
    assert_eq!(written_limits(&share(4), Some(&share(3)), &refs(&hs))[KEY], 4);
    // More uncounted than the share: 0, never negative.
    assert_eq!(written_limits(&share(1), Some(&share(0)), &refs(&hs))[KEY], 0);
    // No status yet: the share (nothing is admitted until the status is there).
    assert_eq!(written_limits(&share(4), None, &refs(&hs))[KEY], 4);
}

proptest! {
    /// Whatever was made before and in whatever order: what is placed plus what is let through
    /// stays within the share on every key, or within what was placed already where that
    /// passes it. And what is let through is as much as fits: each blocked holder would pass
    /// the share on some key.
    #[test]
    fn placed_and_let_through_never_pass_the_share(
        share_a in 0i64..6,
        share_b in 0i64..6,
        hs in proptest::collection::vec((0i64..4, 0i64..4, any::<bool>(), 0u8..60), 0..25),
    ) {
        let share: BTreeMap<String, i64> = [("a".to_string(), share_a), ("b".to_string(), share_b)].into();
        let holders: Vec<Holder> = hs.iter().enumerate().map(|(i, (a, b, placed, at))| Holder {
            name: format!("h{i}"),
            created: format!("2026-12-01T00:00:{at:02}Z"),
            charges: [("a".to_string(), *a), ("b".to_string(), *b)].into_iter().filter(|(_, n)| *n > 0).collect(),
            placed: *placed,
        }).collect();
        let b = blocked(&share, &refs(&holders));
        for key in ["a", "b"] {
            let sum = |f: &dyn Fn(&Holder) -> bool| -> i64 {
                holders.iter().filter(|h| f(h)).map(|h| h.charges.get(key).copied().unwrap_or(0)).sum()
            };
            let placed = sum(&|h| h.placed);
            let through = sum(&|h| !h.placed && !b.contains(&h.name));
            prop_assert!(placed + through <= share[key].max(placed), "{key}: {placed} placed + {through} through > {}", share[key]);
        }
        let through = |key: &str| -> i64 {
            holders.iter().filter(|h| h.placed || !b.contains(&h.name)).map(|h| h.charges.get(key).copied().unwrap_or(0)).sum()
        };
        for h in holders.iter().filter(|h| b.contains(&h.name)) {
            prop_assert!(h.charges.iter().any(|(k, n)| through(k) + n > share[k]), "{} was blocked but fits", h.name);
        }
    }
}

proptest! {
    /// Quota admission against the written limit, with the ResourceQuota showing only part of
    /// what Tessera counts: the objects it admits, added to everything that exists, never pass
    /// the share (or what existed already, where that passes it).
    #[test]
    fn quota_admission_against_the_written_limit_keeps_the_total_within_the_share(
        share_n in 0i64..8,
        counted in 0i64..10,
        shown_part in 0i64..10,
        asks in proptest::collection::vec(1i64..4, 0..12),
    ) {
        let shown_n = shown_part.min(counted);
        let hs = vec![holder("early", "t", counted, false)];
        let limit = written_limits(&share(share_n), Some(&share(shown_n)), &refs(&hs))[KEY];
        // The API server admits each ask while its `used` plus the ask stays within the limit.
        let mut used = shown_n;
        for n in asks {
            if used + n <= limit {
                used += n;
            }
        }
        let admitted = used - shown_n;
        prop_assert!(counted + admitted <= share_n.max(counted), "{counted} existing + {admitted} admitted > {share_n}");
    }
}
