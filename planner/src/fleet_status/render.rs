//! The status report as text, with ANSI colour for a terminal or plain for a pipe.

use std::borrow::Cow;
use std::fmt::Write as _;

use super::{FleetStatus, GpuStatus, Holder, NodeStatus};

/// SGR codes used.
#[derive(Clone, Copy)]
enum Paint {
    Bold,
    Dim,
    Red,
    Green,
    Yellow,
    Cyan,
}

struct Pen {
    on: bool,
}

impl Pen {
    fn paint(&self, p: Paint, s: &str) -> String {
        if !self.on || s.is_empty() {
            return s.to_string();
        }
        let code = match p {
            Paint::Bold => "1",
            Paint::Dim => "2",
            Paint::Red => "31",
            Paint::Green => "32",
            Paint::Yellow => "33",
            Paint::Cyan => "36",
        };
        format!("\x1b[{code}m{s}\x1b[0m")
    }

    fn phase(&self, phase: &str) -> String {
        let p = match phase {
            "Idle" => Paint::Green,
            "Failed" => Paint::Red,
            "-" => Paint::Dim,
            _ => Paint::Yellow,
        };
        self.paint(p, phase)
    }

    fn ready(&self, ready: &str) -> String {
        self.paint(if ready == "True" { Paint::Green } else { Paint::Red }, ready)
    }
}

/// Text from the cluster made safe for a terminal, on one line: line breaks and tabs become
/// spaces, other control characters (ESC, BEL, the C1 CSI/OSC introducers) and bidi overrides
/// become `?`. A name or message cannot retitle the terminal, move the cursor or fake a line.
pub fn clean(s: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(
        s.chars()
            .map(|c| match c {
                '\n' | '\r' | '\t' => ' ',
                c if unsafe_char(c) => '?',
                c => c,
            })
            .collect(),
    )
}

/// Width of a column of cleaned values, in characters (what `{:<w$}` pads to).
fn width<'a>(values: impl Iterator<Item = &'a str>) -> usize {
    values.map(|v| clean(v).chars().count()).max().unwrap_or(0)
}

/// Plain text when `colour` is false: no escape codes at all, and none from the cluster's
/// strings either (see `clean`).
pub fn text(s: &FleetStatus, colour: bool) -> String {
    let pen = Pen { on: colour };
    let mut out = String::new();
    if !s.plans.is_empty() {
        let _ = writeln!(out, "{}", pen.paint(Paint::Bold, "PLANS"));
        let w = width(s.plans.iter().map(|p| p.name.as_str()));
        for p in &s.plans {
            let mut line = format!(
                "  {:<w$}  ready {}  {}/{} updated",
                clean(&p.name),
                pen.ready(&clean(&p.ready)),
                p.updated,
                p.matched
            );
            if p.in_progress > 0 {
                let _ = write!(line, ", {} in progress", p.in_progress);
            }
            if p.failed > 0 {
                let _ = write!(line, ", {}", pen.paint(Paint::Red, &format!("{} failed", p.failed)));
            }
            if p.paused {
                let _ = write!(line, " {}", pen.paint(Paint::Yellow, "(paused)"));
            }
            if !p.reason.is_empty() {
                let _ = write!(line, "  {}: {}", clean(&p.reason), clean(&p.message));
            }
            let _ = writeln!(out, "{line}");
        }
        out.push('\n');
    }
    let _ = writeln!(out, "{}", pen.paint(Paint::Bold, "NODES"));
    if s.unreadable.iter().any(|u| u.resource.starts_with("gpunodes.")) {
        let _ = writeln!(out, "  (GpuNodes could not be read)");
    } else if s.nodes.is_empty() {
        let _ = writeln!(out, "  (no GpuNodes: no node agent has reported)");
    }
    // Why no device is known to be free, when none is.
    let unknown = if s.holders_known {
        None
    } else if s.unreadable.iter().any(|u| u.resource == "pods") {
        Some("pods unreadable")
    } else {
        Some("resource claims unreadable")
    };
    let mut inexact = false;
    for n in &s.nodes {
        inexact |= node(&mut out, n, &pen, unknown);
    }
    if !s.tenants.is_empty() {
        let _ = writeln!(out, "\n{}", pen.paint(Paint::Bold, "HELD BY TENANT"));
        let w = width(s.tenants.keys().map(|t| tenant_label(t)));
        for (t, held) in &s.tenants {
            let list: Vec<String> = held.iter().map(|(r, n)| format!("{}={n}", clean(r))).collect();
            let label = format!("{:<w$}", clean(tenant_label(t)));
            let _ = writeln!(out, "  {}  {}", pen.paint(Paint::Cyan, &label), list.join(" "));
        }
    }
    let any_idle = s
        .nodes
        .iter()
        .flat_map(|n| &n.gpus)
        .any(|g| g.idle_since.is_some() || g.instances.iter().any(|i| i.idle_since.is_some()));
    if any_idle {
        let _ = writeln!(
            out,
            "\nlower case / idle since: held, idle past the tenant's idleAfter (`kubectl tessera idle` lists them)"
        );
    }
    if inexact {
        let _ = writeln!(
            out,
            "\n~ the API does not say which device a pod got: pods are shown on the lowest GPU and slot \
             of their resource"
        );
    }
    out
}

fn tenant_label(t: &str) -> &str {
    if t.is_empty() { "(no quota)" } else { t }
}

fn holder(h: &Holder, pen: &Pen) -> String {
    let tenant = h.tenant.as_deref().unwrap_or("(no quota)");
    let claim = h.claim.as_deref().map(|c| format!(" (claim {})", clean(c))).unwrap_or_default();
    format!("{}  {}{claim}", pen.paint(Paint::Cyan, &clean(tenant)), clean(&h.pod))
}

/// Writes one node; returns whether any attribution on it is inexact. `unknown`: why holders
/// are unknown, if they are.
fn node(out: &mut String, n: &NodeStatus, pen: &Pen, unknown: Option<&str>) -> bool {
    let plan = n.plan.as_deref().map(|p| format!("  plan {}", clean(p))).unwrap_or_default();
    let _ = writeln!(
        out,
        "{}  phase {}  ready {}{plan}",
        pen.paint(Paint::Bold, &clean(&n.name)),
        pen.phase(&clean(&n.phase)),
        pen.ready(&clean(&n.ready))
    );
    if !n.message.is_empty() {
        let _ = writeln!(out, "  {}", pen.paint(Paint::Yellow, &clean(&n.message)));
    }
    if n.gpus.is_empty() {
        let _ = writeln!(out, "  (no GPUs reported)");
    }
    let pw = width(n.gpus.iter().map(|g| g.product.as_str()));
    let dw = n.gpus.iter().map(|g| g.slots.len() + 2).max().unwrap_or(0).max(7);
    let mut inexact = false;
    for g in &n.gpus {
        inexact |= gpu(out, g, pen, pw, dw, unknown);
    }
    for u in &n.unplaced {
        let what = if u.resource == super::claims::UNKNOWN_DEVICE {
            "a device of a claim that was not read".to_string()
        } else {
            format!("{} {} the node does not report", u.count, clean(&u.resource))
        };
        let _ = writeln!(out, "  {} {} holds {what}", pen.paint(Paint::Yellow, "unplaced:"), holder(&u.holder, pen));
    }
    inexact
}

/// `unknown`: why holders are unknown (pods or claims unread); then nothing is shown as free.
fn gpu(out: &mut String, g: &GpuStatus, pen: &Pen, pw: usize, dw: usize, unknown: Option<&str>) -> bool {
    let known = unknown.is_none();
    let head = format!("  gpu{:<2} {:<pw$}  ", g.index, clean(&g.product));
    let mut inexact = false;
    let mut line = head.clone();
    if g.mode == "mig" {
        let diagram = format!("[{}]", g.slots);
        let pad = " ".repeat(dw.saturating_sub(diagram.len()));
        let _ = write!(line, "{}{pad}", slots(g, pen, known));
        if g.instances.is_empty() {
            line.push_str("  no instances");
        }
        let mut by_letter: Vec<_> = g.instances.iter().collect();
        by_letter.sort_by_key(|i| i.letter);
        for i in &by_letter {
            let _ = write!(line, "  {} {}", i.letter, clean(&i.profile));
        }
        let busy = g.instances.iter().filter(|i| i.holder.is_some()).count();
        if !g.instances.is_empty() && !known {
            let why = format!("(busy: unknown, {})", unknown.unwrap_or_default());
            let _ = write!(line, "  {}", pen.paint(Paint::Yellow, &why));
        } else if !g.instances.is_empty() {
            let _ = write!(line, "  ({busy}/{} busy)", g.instances.len());
        }
        tail(&mut line, g, pen);
        let _ = writeln!(out, "{line}");
        for i in by_letter.iter().filter(|i| i.holder.is_some()) {
            let mark = if i.exact { " " } else { "~" };
            inexact |= !i.exact;
            let indent = " ".repeat(head.chars().count());
            let h = i.holder.as_ref().map(|h| holder(h, pen)).unwrap_or_default();
            let _ = write!(out, "{indent}{}{mark} {h}", pen.paint(Paint::Red, &i.letter.to_string()));
            let _ = writeln!(out, "{}", idle(i.idle_since, pen));
        }
    } else {
        let what = if g.mode == "whole" { "whole GPU" } else { "whole GPU (no MIG)" };
        let _ = write!(line, "{what:<dw$}");
        match &g.holder {
            Some(h) => {
                let mark = if g.exact { "" } else { "~" };
                inexact |= !g.exact;
                let _ = write!(line, "  {}{mark}  {}", pen.paint(Paint::Red, "busy"), holder(h, pen));
                line.push_str(&idle(g.idle_since, pen));
            }
            None if !known => {
                let _ = write!(line, "  {}", pen.paint(Paint::Yellow, "busy: unknown"));
            }
            None => {
                let _ = write!(line, "  {}", pen.paint(Paint::Green, "free"));
            }
        }
        tail(&mut line, g, pen);
        let _ = writeln!(out, "{line}");
    }
    inexact
}

/// The diagram with busy instances red and free ones green (yellow when pods are unreadable).
fn slots(g: &GpuStatus, pen: &Pen, known: bool) -> String {
    let mut s = String::from("[");
    for c in g.slots.chars() {
        let busy = g.instances.iter().any(|i| i.letter == c && i.holder.is_some());
        // Lower case: held but idle (readable without colour).
        let idle = g.instances.iter().any(|i| i.letter == c && i.idle_since.is_some());
        let p = match c {
            '.' => Paint::Dim,
            _ if !known => Paint::Yellow,
            _ if idle => Paint::Yellow,
            _ if busy => Paint::Red,
            _ => Paint::Green,
        };
        let c = if idle { c.to_ascii_lowercase() } else { c };
        s.push_str(&pen.paint(p, &c.to_string()));
    }
    s.push(']');
    s
}

/// `  idle since T` for a device idle past its tenant's `idleAfter`, else nothing.
fn idle(since: Option<k8s_openapi::jiff::Timestamp>, pen: &Pen) -> String {
    since.map(|t| format!("  {}", pen.paint(Paint::Yellow, &format!("idle since {t}")))).unwrap_or_default()
}

fn tail(line: &mut String, g: &GpuStatus, pen: &Pen) {
    if let Some(t) = &g.target {
        let _ = write!(line, "  {}", pen.paint(Paint::Yellow, &format!("-> {}", clean(t))));
    }
    if g.mig_pending {
        let _ = write!(line, "  {}", pen.paint(Paint::Yellow, "(MIG mode change pending a reset)"));
    }
}
