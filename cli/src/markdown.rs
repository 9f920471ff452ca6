//! `plan preview -o markdown`: a pull-request comment. Counts and capacity first; long node lists
//! folded into `<details>`; every cell escaped so a name cannot break the table, inject HTML or
//! mention anyone; and the whole kept under GitHub's 65,536-character comment limit.

use std::fmt::Write as _;

use super::preview::{Preview, layout_summary};

/// First line of every comment: CI jobs find their earlier comment by it to update it.
pub const MARKER: &str = "<!-- tessera-plan-preview -->";
/// Node tables longer than this are folded.
const FOLD_ROWS: usize = 10;
/// Rows shown per table; the rest are counted.
const MAX_ROWS: usize = 100;
/// Pods named per node; the rest are counted.
const MAX_PODS: usize = 5;
/// Characters per cell.
const MAX_CELL: usize = 300;
/// Below GitHub's limit (65,536) with room for what a CI job adds.
const MAX_COMMENT: usize = 60_000;

/// Text made safe for a table cell or a heading: one line, `|` and Markdown punctuation escaped,
/// HTML and `@mentions` neutralised, control characters and bidi overrides dropped, at most
/// `MAX_CELL` characters.
pub fn cell(s: &str) -> String {
    let mut out = String::new();
    for (n, c) in s.chars().enumerate() {
        if n == MAX_CELL {
            out.push('…');
            break;
        }
        match c {
            '\n' | '\r' | '\t' => out.push(' '),
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '@' => out.push_str("&#64;"),
            '\\' | '|' | '`' | '*' | '_' | '[' | ']' | '~' | '#' | '!' => {
                out.push('\\');
                out.push(c);
            }
            // Other controls (ESC, BEL) and bidi overrides, which would reorder what a reviewer reads.
            c if c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}') => {}
            c => out.push(c),
        }
    }
    out
}

/// The comment for the previews of one run.
pub fn preview(previews: &[Preview]) -> String {
    let full = render(previews, true);
    if full.len() <= MAX_COMMENT {
        return full;
    }
    let mut short = render(previews, false);
    if short.len() > MAX_COMMENT {
        // So many plans that even their summaries are too long: whole lines only.
        let cut = short[..char_boundary_at_or_before(&short, MAX_COMMENT - 500)].rfind('\n').unwrap_or(0);
        short.truncate(cut + 1);
    }
    short.push_str(
        "\n_The node lists are too long for a comment; run `tessera-operator plan preview -o json` \
         (or see this job's log) for all of them._\n",
    );
    short
}

/// The largest index `<= at` that is a char boundary of `s`: a byte index may fall inside a
/// multi-byte character of a name.
fn char_boundary_at_or_before(s: &str, at: usize) -> usize {
    let mut i = at.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn render(previews: &[Preview], details: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{MARKER}\n### Tessera plan preview\n");
    let _ = writeln!(
        out,
        "| Plan | Nodes that change | Pods evicted | Drain blockers | Quotas left short | Unchanged | Skipped |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
    for p in previews {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            cell(&p.plan),
            p.changes.len(),
            evicted(p),
            blockers(p),
            p.quotas_short.len(),
            p.unchanged.len(),
            p.skipped.len()
        );
    }
    for p in previews {
        plan(&mut out, p, details);
    }
    out
}

fn evicted(p: &Preview) -> usize {
    p.changes.iter().map(|c| c.evict.len()).sum()
}

/// Refused pods and budget refusals: what holds the drains.
fn blockers(p: &Preview) -> usize {
    p.changes.iter().map(|c| c.refused.len() + c.budget_blocked.len()).sum()
}

/// One plan's section: warnings, the capacity table, then (with `details`) the node tables.
fn plan(out: &mut String, p: &Preview, details: bool) {
    let _ = writeln!(out, "\n#### Plan {}\n", cell(&p.plan));
    warnings(out, p);
    capacity_table(out, p);
    if !details {
        return;
    }
    changes_table(out, p);
    quotas_table(out, p);
    skipped_table(out, p);
    unchanged_list(out, p);
}

/// What a reviewer must not miss: pods that block the drain, quotas the plan leaves short.
fn warnings(out: &mut String, p: &Preview) {
    if blockers(p) > 0 {
        let _ = writeln!(
            out,
            "**Warning:** {} pod(s) would block the drain until the plan opts in to evicting them or a \
             PodDisruptionBudget allows it (see the Drain blockers column).\n",
            blockers(p)
        );
    }
    if !p.quotas_short.is_empty() {
        let names: Vec<String> = p.quotas_short.iter().map(|q| q.quota.clone()).collect();
        let _ = writeln!(
            out,
            "**Warning:** {} tenant quota(s) would go CapacityAvailable=False: {} (see Quota shortfalls).\n",
            names.len(),
            list(&names, MAX_PODS)
        );
    }
}

/// Capacity per resource, before and after, with the signed change; never folded.
fn capacity_table(out: &mut String, p: &Preview) {
    let _ = writeln!(out, "| Resource | Before | After | Change |\n|---|---:|---:|---:|");
    let rows = p.capacity_rows();
    if rows.is_empty() {
        let _ = writeln!(out, "| (no GPUs on the matched nodes) | | | |");
    }
    for (r, b, a) in rows {
        let delta = match a - b {
            0 => "0".to_string(),
            d if d > 0 => format!("+{d}"),
            d => d.to_string(),
        };
        let _ = writeln!(out, "| {} | {b} | {a} | {delta} |", cell(r));
    }
}

/// The nodes that change: new layout, pods evicted, what blocks the drain.
fn changes_table(out: &mut String, p: &Preview) {
    if p.changes.is_empty() {
        return;
    }
    let rows: Vec<String> = p
        .changes
        .iter()
        .map(|c| {
            format!(
                "| {} | {} | {} | {} |",
                cell(&c.node),
                cell(&layout_summary(&c.gpus)),
                list(&c.evict, MAX_PODS),
                list(&c.blockers(), 3)
            )
        })
        .collect();
    table(out, "Nodes that change", "| Node | New layout | Pods evicted | Drain blockers |\n|---|---|---|---|", &rows);
}

/// One row per quota and resource the fleet would no longer supply.
fn quotas_table(out: &mut String, p: &Preview) {
    if p.quotas_short.is_empty() {
        return;
    }
    let rows: Vec<String> = p
        .quotas_short
        .iter()
        .flat_map(|q| {
            q.resources.iter().map(|r| {
                format!(
                    "| {} | {} | {} | {} -> {} | {} |",
                    cell(&q.quota),
                    cell(&r.resource),
                    r.quotas,
                    r.fleet_before,
                    r.fleet_after,
                    r.short
                )
            })
        })
        .collect();
    table(
        out,
        "Quota shortfalls",
        "| Quota | Resource | Quotas ask | Fleet (before -> after) | Short |\n|---|---|---:|---:|---:|",
        &rows,
    );
}

/// The matched nodes the plan leaves alone, and why.
fn skipped_table(out: &mut String, p: &Preview) {
    if p.skipped.is_empty() {
        return;
    }
    let rows: Vec<String> = p.skipped.iter().map(|(n, why)| format!("| {} | {} |", cell(n), cell(why))).collect();
    table(out, "Skipped nodes", "| Node | Why |\n|---|---|", &rows);
}

/// The nodes already in the plan's layout: names only, always folded.
fn unchanged_list(out: &mut String, p: &Preview) {
    if !p.unchanged.is_empty() {
        let _ = writeln!(
            out,
            "\n<details><summary>Unchanged nodes ({})</summary>\n\n{}\n\n</details>",
            p.unchanged.len(),
            list(&p.unchanged, MAX_ROWS)
        );
    }
}

/// A titled table, folded when long, at most `MAX_ROWS` rows.
fn table(out: &mut String, title: &str, header: &str, rows: &[String]) {
    let fold = rows.len() > FOLD_ROWS;
    if fold {
        let _ = writeln!(out, "\n<details><summary>{title} ({})</summary>\n", rows.len());
    } else {
        let _ = writeln!(out, "\n**{title} ({})**\n", rows.len());
    }
    let _ = writeln!(out, "{header}");
    for r in rows.iter().take(MAX_ROWS) {
        let _ = writeln!(out, "{r}");
    }
    if rows.len() > MAX_ROWS {
        let _ = writeln!(out, "\n… and {} more (`-o json` lists every one)", rows.len() - MAX_ROWS);
    }
    if fold {
        let _ = writeln!(out, "\n</details>");
    }
}

/// `a, b, c and 4 more`, escaped; `-` when empty.
fn list(items: &[String], max: usize) -> String {
    if items.is_empty() {
        return "-".into();
    }
    let mut text = items.iter().take(max).map(|i| cell(i)).collect::<Vec<_>>().join(", ");
    if items.len() > max {
        let _ = write!(text, " and {} more", items.len() - max);
    }
    text
}

#[cfg(test)]
mod tests;
