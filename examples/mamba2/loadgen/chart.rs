//! The chart: throughput and goodput against the setting, one color per server, from this
//! run's rows and earlier `--json` files.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use serde_json::Value;

/// One server's figures for the chart: its label and (setting, tokens/s, goodput) points.
pub(super) type Series = (String, Vec<[f64; 3]>);

/// The series of an earlier `--json` file.
pub(super) fn series_of(path: &PathBuf) -> Result<Series> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: Value = serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?;
    let rows = v["rows"].as_array().map(Vec::as_slice).unwrap_or_default();
    let point = |r: &Value| {
        let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
        [f("setting"), f("tokens_per_s"), f("goodput_per_s")]
    };
    let label = v["label"].as_str().unwrap_or("earlier run").to_string();
    Ok((label, rows.iter().map(point).collect()))
}

/// Throughput (tokens/s, left axis, solid) and goodput (requests/s, right axis, dashed) against
/// the setting, one color per server.
pub(super) fn chart(what: &str, series: &[Series]) -> String {
    let (w, h, l, r, t, b) = (720.0, 430.0, 70.0, 70.0, 56.0, 70.0);
    let all = || series.iter().flat_map(|(_, p)| p.iter());
    let top = |k: usize| all().map(|p| p[k]).fold(0.0, f64::max).max(1e-9);
    let (xmax, tmax, gmax) = (top(0), top(1) * 1.1, top(2) * 1.1);
    let x = |v: f64| l + (w - l - r) * v / xmax;
    let y = |v: f64, max: f64| t + (h - t - b) * (1.0 - v / max);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{l}\" y=\"24\" font-size=\"15\">Throughput (solid) and goodput (dashed) against {what}</text>\n"
    );
    for i in 0..=4 {
        let f = i as f64 / 4.0;
        let yy = y(f * tmax, tmax);
        let _ = writeln!(
            s,
            "<line x1=\"{l}\" x2=\"{}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{:.0}</text>\
             <text x=\"{}\" y=\"{:.1}\">{:.2}</text>",
            w - r,
            l - 6.0,
            yy + 4.0,
            f * tmax,
            w - r + 6.0,
            yy + 4.0,
            f * gmax
        );
    }
    let mut ticks: Vec<f64> = all().map(|p| p[0]).collect();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    for v in ticks {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{v}</text>",
            x(v),
            h - b + 18.0
        );
    }
    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
    for (k, (label, points)) in series.iter().enumerate() {
        let color = colors[k % colors.len()];
        for (i, max, dash) in [(1, tmax, ""), (2, gmax, " stroke-dasharray=\"6 4\"")] {
            let pts: Vec<String> = points
                .iter()
                .map(|p| format!("{:.1},{:.1}", x(p[0]), y(p[i], max)))
                .collect();
            let _ = writeln!(
                s,
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"{dash} points=\"{}\"/>",
                pts.join(" ")
            );
        }
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" fill=\"{color}\">{label}</text>",
            l + 180.0 * k as f64,
            h - 12.0
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{what}</text>\
         <text x=\"{l}\" y=\"{}\">tokens/s</text>\
         <text x=\"{}\" y=\"{}\" text-anchor=\"end\">goodput (requests/s in SLO)</text>\n</svg>",
        (l + w - r) / 2.0,
        h - b + 36.0,
        t - 6.0,
        w - r,
        t - 6.0
    );
    s
}
