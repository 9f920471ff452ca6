//! A small SVG line chart for the benchmarks (no plotting dependency): one panel per series,
//! fleet size on a logarithmic x axis, each point labelled with its value.

use std::fmt::Write;

/// One panel: a title, and (x, y) points in x order.
pub struct Series<'a> {
    pub title: &'a str,
    pub points: Vec<(f64, f64)>,
}

const PANEL_W: f64 = 360.0;
const PANEL_H: f64 = 240.0;
const MARGIN: f64 = 48.0;

/// Panels side by side, sharing the x axis's label.
pub fn svg(title: &str, x_label: &str, panels: &[Series]) -> String {
    let width = PANEL_W * panels.len().max(1) as f64;
    let height = PANEL_H + 40.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ =
        writeln!(out, r#"<text x="{}" y="18" text-anchor="middle" font-size="14">{}</text>"#, width / 2.0, esc(title));
    for (i, panel) in panels.iter().enumerate() {
        let left = i as f64 * PANEL_W;
        panel_svg(&mut out, left, 30.0, x_label, panel);
    }
    out.push_str("</svg>\n");
    out
}

fn panel_svg(out: &mut String, left: f64, top: f64, x_label: &str, s: &Series) {
    let (x0, x1) = (left + MARGIN, left + PANEL_W - 16.0);
    let (y0, y1) = (top + PANEL_H - MARGIN, top + 24.0);
    let xs: Vec<f64> = s.points.iter().map(|p| p.0.max(1.0).log10()).collect();
    let (lo, hi) =
        (xs.iter().copied().fold(f64::INFINITY, f64::min), xs.iter().copied().fold(f64::NEG_INFINITY, f64::max));
    let (lo, hi) = if lo.is_finite() && hi > lo { (lo, hi) } else { (lo.min(0.0), lo.max(0.0) + 1.0) };
    let y_max = s.points.iter().map(|p| p.1).fold(0.0, f64::max).max(f64::MIN_POSITIVE) * 1.15;
    let px = |x: f64| x0 + (x.max(1.0).log10() - lo) / (hi - lo) * (x1 - x0);
    let py = |y: f64| y0 - y / y_max * (y0 - y1);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle" font-size="12">{}</text>"#,
        (x0 + x1) / 2.0,
        top + 12.0,
        esc(s.title)
    );
    let _ = writeln!(out, r#"<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="black"/>"#);
    let _ = writeln!(out, r#"<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="black"/>"#);
    for k in 0..=4 {
        let v = y_max * f64::from(k) / 4.0;
        let y = py(v);
        let _ = writeln!(out, r##"<line x1="{x0}" y1="{y}" x2="{x1}" y2="{y}" stroke="#ddd"/>"##);
        let _ = writeln!(out, r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#, x0 - 4.0, y + 4.0, num(v));
    }
    let points: Vec<String> = s.points.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
    let _ =
        writeln!(out, r##"<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="{}"/>"##, points.join(" "));
    for &(x, y) in &s.points {
        let (cx, cy) = (px(x), py(y));
        let _ = writeln!(out, r##"<circle cx="{cx:.1}" cy="{cy:.1}" r="3" fill="#1f77b4"/>"##);
        let _ = writeln!(out, r#"<text x="{cx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#, cy - 7.0, num(y));
        let _ = writeln!(out, r#"<text x="{cx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#, y0 + 14.0, num(x));
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        (x0 + x1) / 2.0,
        y0 + 30.0,
        esc(x_label)
    );
}

fn num(v: f64) -> String {
    if v >= 100.0 || v == v.trunc() { format!("{v:.0}") } else { format!("{v:.1}") }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_point_is_drawn_and_labelled_in_its_panel() {
        let cpu = Series { title: "CPU ms / node", points: vec![(100.0, 4.2), (1000.0, 4.5), (5000.0, 4.9)] };
        let wall = Series { title: "wall s", points: vec![(100.0, 9.0), (1000.0, 38.0), (5000.0, 190.0)] };
        let out = svg("Rollout cost <by size>", "nodes (log)", &[cpu, wall]);
        assert!(out.starts_with("<svg") && out.ends_with("</svg>\n"));
        assert_eq!(out.matches("<polyline").count(), 2);
        assert_eq!(out.matches("<circle").count(), 6);
        for label in ["4.2", "4.9", "190", "5000", "&lt;by size&gt;"] {
            assert!(out.contains(&format!(">{label}<")) || out.contains(label), "{label} missing");
        }
        // Log x: 1,000 sits at two thirds of the way from 100 to 5,000 only on a log scale.
        let xs: Vec<f64> = out
            .lines()
            .filter(|l| l.starts_with("<circle"))
            .take(3)
            .map(|l| l.split("cx=\"").nth(1).unwrap().split('"').next().unwrap().parse().unwrap())
            .collect();
        let frac = (xs[1] - xs[0]) / (xs[2] - xs[0]);
        assert!((frac - (10f64.log10() / 50f64.log10())).abs() < 0.01, "{frac}");
    }

    #[test]
    fn one_point_or_none_draws_without_dividing_by_zero() {
        let out =
            svg("t", "x", &[Series { title: "a", points: vec![(100.0, 0.0)] }, Series { title: "b", points: vec![] }]);
        assert!(!out.contains("NaN") && !out.contains("inf"), "{out}");
    }
}
