//! The README's "Troubleshooting by condition reason" table names exactly the condition reasons
//! the code sets, per kind: `plan` rows those of `plan_reasons`, `quota` rows `quota_reasons`,
//! `GpuNode` rows `gpunode_reasons`. A reason added in code needs its row; a row needs its reason.

use std::collections::{BTreeMap, BTreeSet};

use tessera_crds::conditions::{
    CAPACITY_AVAILABLE, CONFLICT, DEMAND_MET, READY, RECONCILING, STALLED, gpunode_reasons, plan_reasons, quota_reasons,
};

/// The heading of the table.
const HEADING: &str = "## Troubleshooting by condition reason";

/// The condition types rows name in their kind column (`DraInSync` and `ClaimPolicyBound` are
/// defined by the planner, which this crate cannot depend on).
const CONDITION_TYPES: &[&str] =
    &[READY, RECONCILING, STALLED, CONFLICT, CAPACITY_AVAILABLE, DEMAND_MET, "DraInSync", "ClaimPolicyBound"];

/// The README at the workspace root.
fn readme() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The table's body rows as (kind / condition, reason) cells, header and separator left out.
fn rows(readme: &str) -> Vec<(String, String)> {
    let start = readme.find(HEADING).expect("the README has the reason table");
    let table = readme[start + HEADING.len()..].lines().skip_while(|l| !l.starts_with('|'));
    let lines: Vec<&str> = table.take_while(|l| l.starts_with('|')).collect();
    assert!(lines.len() > 2, "the reason table has no rows");
    assert!(lines[0].contains("kind / condition") && lines[0].contains("reason"), "unexpected header: {}", lines[0]);
    lines[2..]
        .iter()
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            assert!(cells.len() >= 4, "a row has three cells: {l}");
            (cells[1].to_string(), cells[2].to_string())
        })
        .collect()
}

/// The `backticked` words of `cell`, in order.
fn backticked(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// Rows that name no reason of a condition: Events (a node's `Warning` Events) and rows about a
/// condition's message only.
fn not_a_condition_reason(kind: &str) -> bool {
    kind.starts_with("node Event") || kind.ends_with(" message")
}

/// The reasons each kind's rows name. A kind column may name two kinds (`plan / GpuNode ...`):
/// the reason column holds for both, unless a kind's part names a backticked word that is no
/// condition type: that word is its own reason in the shared row (`... / GpuNode DynamicMig`).
fn reasons_by_kind(rows: &[(String, String)]) -> BTreeMap<&'static str, BTreeSet<String>> {
    let mut out: BTreeMap<&'static str, BTreeSet<String>> = BTreeMap::new();
    for (kind, reason) in rows.iter().filter(|(kind, _)| !not_a_condition_reason(kind)) {
        let shared = backticked(reason);
        assert!(!shared.is_empty(), "row `{kind}` names no backticked reason: {reason}");
        for part in kind.split(" / ") {
            let word = part.split_whitespace().next().unwrap_or_default().trim_matches('`');
            let kind = match word {
                "plan" => "plan",
                "quota" => "quota",
                "GpuNode" => "GpuNode",
                other => panic!("row `{kind}`: unknown kind `{other}`; name its reasons' module here or skip it"),
            };
            let own: Vec<&str> =
                backticked(part).into_iter().filter(|w| *w != word && !CONDITION_TYPES.contains(w)).collect();
            let names = if own.is_empty() { &shared } else { &own };
            out.entry(kind).or_default().extend(names.iter().map(|n| n.to_string()));
        }
    }
    out
}

/// Every reason the code sets is in the table under its kind, and the table names no other.
#[test]
fn the_readme_lists_exactly_the_condition_reasons_per_kind() {
    let found = reasons_by_kind(&rows(&readme()));
    for (kind, all) in [("plan", plan_reasons::ALL), ("quota", quota_reasons::ALL), ("GpuNode", gpunode_reasons::ALL)] {
        let listed = found.get(kind).cloned().unwrap_or_default();
        let code: BTreeSet<String> = all.iter().map(|r| r.to_string()).collect();
        let missing: Vec<&String> = code.difference(&listed).collect();
        let unknown: Vec<&String> = listed.difference(&code).collect();
        assert!(missing.is_empty(), "{kind}: reasons set in code but not in the README's table: {missing:?}");
        assert!(unknown.is_empty(), "{kind}: reasons in the README's table that no code sets: {unknown:?}");
    }
}

/// The parse itself: shared rows, own reasons in a kind's part, skipped rows.
#[test]
fn rows_are_read_per_kind_and_events_and_messages_are_skipped() {
    let rows: Vec<(String, String)> = [
        ("plan / `GpuNode` `DraInSync` = False", "`SlicesStale`"),
        ("plan `DraInSync` = False / `GpuNode` `DynamicMig`", "`DynamicMigRefused`"),
        ("quota `Conflict` (and `Stalled` `Conflict`)", "`NamespaceClaimedTwice`"),
        ("plan `Reconciling`", "`RollingOut` / `Paused`"),
        ("node Event (Warning)", "`DraSlicesStale`"),
        ("plan `DemandMet` message", "\"left out\""),
    ]
    .iter()
    .map(|(k, r)| (k.to_string(), r.to_string()))
    .collect();
    let found = reasons_by_kind(&rows);
    let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(found["plan"], set(&["SlicesStale", "DynamicMigRefused", "RollingOut", "Paused"]));
    assert_eq!(found["GpuNode"], set(&["SlicesStale", "DynamicMig"]));
    assert_eq!(found["quota"], set(&["NamespaceClaimedTwice"]));
}
