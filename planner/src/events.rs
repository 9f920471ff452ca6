//! Pure: a pass's rollout Events, aggregated. The planner says what happened to each node; the
//! controller publishes one Event per (plan, reason, type) per pass that names the nodes, so a
//! wave of a thousand nodes costs a few Events instead of several per node. Warnings (a failed
//! node) are also published on each Node, where an admin looking at that node finds them.

use std::collections::BTreeMap;

/// What the planner reported for one node, once its actions before the Event succeeded.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeEvent {
    pub plan: String,
    pub node: String,
    pub reason: &'static str,
    pub message: String,
    pub warning: bool,
}

/// One Event to publish on a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanEvent {
    pub plan: String,
    pub reason: &'static str,
    pub warning: bool,
    pub note: String,
}

/// Nodes named in one Event; the rest are counted ("and 980 more"): the status lists them all.
pub const NAMED: usize = 20;
/// `events.k8s.io/v1` limits a note to 1 kB.
pub const NOTE_LIMIT: usize = 1000;

/// One Event per (plan, reason, type), nodes in name order; a single node keeps its own message.
pub fn aggregate(events: impl IntoIterator<Item = NodeEvent>) -> Vec<PlanEvent> {
    let mut groups: BTreeMap<(String, &'static str, bool), Vec<NodeEvent>> = BTreeMap::new();
    for e in events {
        groups.entry((e.plan.clone(), e.reason, e.warning)).or_default().push(e);
    }
    groups
        .into_iter()
        .map(|((plan, reason, warning), mut list)| {
            list.sort_by(|a, b| a.node.cmp(&b.node));
            let note = match list.as_slice() {
                [one] => one.message.clone(),
                _ if warning => {
                    // Each failure says why: keep the messages, as many as fit.
                    let parts: Vec<&str> = list.iter().map(|e| e.message.as_str()).collect();
                    format!("{} nodes: {}", list.len(), named(&parts, "; "))
                }
                _ => {
                    let names: Vec<&str> = list.iter().map(|e| e.node.as_str()).collect();
                    format!("{}: {}", summary(reason, list.len()), named(&names, ", "))
                }
            };
            PlanEvent { plan, reason, warning, note: truncate(&note) }
        })
        .collect()
}

/// What happened to `k` nodes, by reason.
fn summary(reason: &str, k: usize) -> String {
    match reason {
        "DrainStarted" => format!("draining {k} nodes to change their MIG layout (cordoned first where schedulable)"),
        "Applying" => format!("{k} nodes drained; handed to their node agents"),
        "Applied" => format!("{k} nodes have their new MIG layout (uncordoned where Tessera cordoned them)"),
        "DrainWithdrawn" => {
            format!(
                "{k} nodes already held their MIG layout: drains withdrawn (uncordoned where Tessera cordoned them)"
            )
        }
        _ => format!("{reason} on {k} nodes"),
    }
}

/// The first [`NAMED`] items, then how many more.
fn named(items: &[&str], separator: &str) -> String {
    let shown = items.iter().take(NAMED).copied().collect::<Vec<_>>().join(separator);
    match items.len().saturating_sub(NAMED) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}

fn truncate(note: &str) -> String {
    if note.chars().count() <= NOTE_LIMIT {
        return note.to_string();
    }
    let mut out: String = note.chars().take(NOTE_LIMIT - 1).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(plan: &str, node: &str, reason: &'static str, warning: bool) -> NodeEvent {
        NodeEvent { plan: plan.into(), node: node.into(), reason, message: format!("{node}: {reason}"), warning }
    }

    #[test]
    fn a_wave_is_one_event_per_plan_and_reason_naming_its_nodes() {
        let mut all: Vec<NodeEvent> = (0..3).rev().map(|i| ev("p", &format!("n{i}"), "DrainStarted", false)).collect();
        all.push(ev("q", "m0", "DrainStarted", false));
        all.push(ev("p", "n9", "Applied", false));
        let out = aggregate(all);
        assert_eq!(out.len(), 3, "{out:?}");
        let p = out.iter().find(|e| e.plan == "p" && e.reason == "DrainStarted").unwrap();
        assert!(p.note.starts_with("draining 3 nodes"), "{}", p.note);
        assert!(p.note.ends_with(": n0, n1, n2"), "{}", p.note);
        // One node keeps the planner's own message.
        let q = out.iter().find(|e| e.plan == "q").unwrap();
        assert_eq!(q.note, "m0: DrainStarted");
        assert!(out.iter().all(|e| !e.warning));
    }

    #[test]
    fn warnings_keep_each_nodes_reason_and_are_never_merged_with_normal_events() {
        let out = aggregate(vec![ev("p", "b", "Failed", true), ev("p", "a", "Failed", true)]);
        assert_eq!(out.len(), 1);
        assert!(out[0].warning);
        assert_eq!(out[0].note, "2 nodes: a: Failed; b: Failed");
    }

    #[test]
    fn a_thousand_nodes_are_named_up_to_the_limit_then_counted_within_the_note_limit() {
        let all = (0..1000).map(|i| ev("p", &format!("gpu-{i:04}"), "Applied", false));
        let out = aggregate(all);
        assert_eq!(out.len(), 1);
        assert!(out[0].note.contains("gpu-0019 and 980 more"), "{}", out[0].note);
        assert!(!out[0].note.contains("gpu-0020"));
        let long =
            (0..100).map(|i| NodeEvent { message: "x".repeat(300), ..ev("p", &format!("n{i:03}"), "Failed", true) });
        let out = aggregate(long);
        assert_eq!(out[0].note.chars().count(), NOTE_LIMIT);
        assert!(out[0].note.ends_with('…'));
    }
}
