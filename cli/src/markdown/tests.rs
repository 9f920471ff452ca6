use tessera_crds::gpunode::GpuIntent;

use super::*;
use crate::preview::NodeChange;

fn change(node: &str, evict: usize, refused: &[&str]) -> NodeChange {
    NodeChange {
        node: node.into(),
        gpus: vec![GpuIntent { index: 0, mig_enabled: true, profiles: [("3g.40gb".to_string(), 2)].into() }],
        evict: (0..evict).map(|i| format!("ml/pod-{i}")).collect(),
        refused: refused.iter().map(|s| s.to_string()).collect(),
        budget_blocked: Vec::new(),
    }
}

fn plan(name: &str, changes: Vec<NodeChange>) -> Preview {
    Preview {
        plan: name.into(),
        changes,
        unchanged: vec!["quiet-1".into()],
        skipped: [("new-1".to_string(), "no GPU inventory reported by a node agent".to_string())].into(),
        capacity_before: [("nvidia.com/gpu".to_string(), 4)].into(),
        capacity_after: [("nvidia.com/gpu".to_string(), 2), ("nvidia.com/mig-3g.40gb".to_string(), 4)].into(),
        quotas_short: Vec::new(),
    }
}

#[test]
fn cells_cannot_break_the_table_or_inject_anything() {
    let table = [
        ("a|b", "a\\|b"),
        ("line\nbreak\r\n", "line break  "),
        ("<img src=x onerror=alert(1)>", "&lt;img src=x onerror=alert(1)&gt;"),
        ("ping @octocat", "ping &#64;octocat"),
        (
            "**bold** _it_ `code` [link](x) ~~s~~ # h !",
            "\\*\\*bold\\*\\* \\_it\\_ \\`code\\` \\[link\\](x) \\~\\~s\\~\\~ \\# h \\!",
        ),
        ("back\\slash", "back\\\\slash"),
        ("a&amp;", "a&amp;amp;"),
        ("bell\u{7}", "bell"),
    ];
    for (input, want) in table {
        assert_eq!(cell(input), want, "{input:?}");
    }
    let long = "x".repeat(1000);
    assert_eq!(cell(&long).chars().count(), MAX_CELL + 1, "cut, with an ellipsis");
}

#[test]
fn the_comment_leads_with_counts_and_capacity() {
    let md = preview(&[plan(
        "inference",
        vec![change("gpu-1", 2, &[]), change("gpu-2", 0, &["pod ml/nb has no controller"])],
    )]);
    assert!(md.starts_with(MARKER), "{md}");
    assert!(md.contains("| inference | 2 | 2 | 1 | 0 | 1 | 1 |"), "{md}");
    assert!(md.contains("| nvidia.com/gpu | 4 | 2 | -2 |"), "{md}");
    assert!(md.contains("| nvidia.com/mig-3g.40gb | 0 | 4 | +4 |"), "{md}");
    assert!(md.contains("**Warning:** 1 pod(s) would block the drain"), "{md}");
    assert!(md.contains("**Nodes that change (2)**"), "short lists are shown open: {md}");
    assert!(md.contains("| gpu-1 | gpu0=2x3g.40gb | ml/pod-0, ml/pod-1 | - |"), "{md}");
    assert!(md.contains("| new-1 | no GPU inventory reported by a node agent |"), "{md}");
    assert!(md.contains("<details><summary>Unchanged nodes (1)</summary>"), "{md}");
}

#[test]
fn long_node_lists_fold_and_are_capped() {
    let many: Vec<NodeChange> = (0..150).map(|i| change(&format!("gpu-{i:03}"), 7, &[])).collect();
    let md = preview(&[plan("big", many)]);
    assert!(md.contains("<details><summary>Nodes that change (150)</summary>"), "{md}");
    assert_eq!(md.matches("<details>").count(), md.matches("</details>").count(), "every fold is closed");
    assert!(md.contains("| gpu-099 |") && !md.contains("| gpu-100 |"), "at most {MAX_ROWS} rows");
    assert!(md.contains("… and 50 more (`-o json` lists every one)"), "{md}");
    assert!(md.contains("ml/pod-4 and 2 more"), "pods per node are capped too");
}

#[test]
fn a_comment_that_would_pass_githubs_limit_keeps_only_the_summary() {
    let reason = "r".repeat(2000);
    let plans: Vec<Preview> = (0..20)
        .map(|p| plan(&format!("p{p}"), (0..100).map(|i| change(&format!("n{i}"), 5, &[&reason])).collect()))
        .collect();
    let md = preview(&plans);
    assert!(md.len() <= MAX_COMMENT, "{} characters", md.len());
    assert!(md.contains("| p19 | 100 | 500 | 100 | 0 | 1 | 1 |"), "the counts stay");
    assert!(md.contains("#### Plan p19"), "and each plan's capacity");
    assert!(md.contains("too long for a comment"), "and it says what was left out");
    assert!(!md.contains("<details>"));
}

#[test]
fn names_are_escaped_in_headings_and_rows() {
    let md = preview(&[plan("a_b", vec![change("n|1", 0, &["x <b>"])])]);
    assert!(md.contains("#### Plan a\\_b"), "{md}");
    assert!(md.contains("| n\\|1 |"), "{md}");
    assert!(md.contains("x &lt;b&gt;"), "{md}");
    let md = preview(&[Preview { plan: "e".into(), ..Default::default() }]);
    assert!(md.contains("| (no GPUs on the matched nodes) | | | |"), "{md}");
}

#[test]
fn even_thousands_of_plans_stay_under_the_limit() {
    let plans: Vec<Preview> = (0..3000).map(|p| plan(&format!("plan-{p}"), vec![])).collect();
    let md = preview(&plans);
    assert!(md.len() <= MAX_COMMENT, "{} characters", md.len());
    assert!(md.ends_with("for all of them._\n"), "it says what was left out");
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config::with_cases(48))]
    /// Names of any script (multi-byte characters) in a comment that must be cut: no panic, and
    /// the comment stays under the limit.
    #[test]
    fn any_unicode_names_are_cut_without_panic_and_under_the_limit(
        names in proptest::collection::vec("\\PC{1,300}", 20..80),
        profiles in proptest::collection::vec("\\PC{1,300}", 0..8),
        pad in 0usize..4,
    ) {
        let plans: Vec<Preview> = names
            .iter()
            .map(|n| Preview {
                plan: format!("{}{n}", "é".repeat(pad)),
                capacity_before: profiles.iter().map(|p| (p.clone(), 1)).collect(),
                capacity_after: profiles.iter().map(|p| (format!("{p}ü"), 2)).collect(),
                ..Default::default()
            })
            .collect();
        let md = preview(&plans);
        proptest::prop_assert!(md.len() <= MAX_COMMENT, "{} bytes", md.len());
        proptest::prop_assert!(md.starts_with(MARKER));
    }
}
