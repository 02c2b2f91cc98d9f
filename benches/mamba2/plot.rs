//! The decode latency plot (SVG): per-token latency against position, cached against
//! recomputed.

use std::fmt::Write as _;

use crate::common::{median, sorted};
use crate::host_loop::{interpolate, HostLoop};
use crate::DECODE_PROMPT;

/// Per-token latency (log scale) against position: the cached host loop (every step) and
/// recomputation (a staircase over prefill buckets; dots where measured).
pub fn latency_svg(
    h: &HostLoop,
    recomputed: &[(usize, f64)],
    chunk: usize,
    total: usize,
) -> String {
    let (w, ht, left, right, top, bottom) = (760.0, 420.0, 70.0, 20.0, 40.0, 50.0);
    let all_ms: Vec<f64> = h
        .step_secs
        .iter()
        .chain(recomputed.iter().map(|(_, s)| s))
        .map(|s| s * 1e3)
        .collect();
    let lo = all_ms.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = all_ms.iter().cloned().fold(0.0, f64::max);
    let (y0, y1) = (lo.log10().floor(), hi.log10().ceil());
    let x = |p: f64| left + (w - left - right) * p / total as f64;
    let y = |ms: f64| top + (ht - top - bottom) * (y1 - ms.log10()) / (y1 - y0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{ht}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{ht}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="14">Mamba-2 130M decode, per-token latency (batch 1, f32)</text>"#,
        w / 2.0
    );
    // Grid and axes.
    let mut d = y0;
    while d <= y1 {
        let ms = 10f64.powf(d);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{x2}" y1="{yy:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{tx}" y="{ty:.1}" text-anchor="end">{label}</text>"##,
            x2 = w - right,
            yy = y(ms),
            tx = left - 6.0,
            ty = y(ms) + 4.0,
            label = if ms >= 1.0 {
                format!("{ms:.0} ms")
            } else {
                format!("{ms} ms")
            }
        );
        d += 1.0;
    }
    let step = if total > 2048 { 512 } else { 128 };
    for p in (0..=total).step_by(step) {
        let _ = writeln!(
            s,
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="{top}" y2="{1}" stroke="#eee"/><text x="{0:.1}" y="{2}" text-anchor="middle">{p}</text>"##,
            x(p as f64),
            ht - bottom,
            ht - bottom + 16.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">position (tokens in the context)</text>"#,
        (left + w - right) / 2.0,
        ht - 12.0
    );
    // Cached: one point per step.
    let pts: Vec<String> = h
        .step_secs
        .iter()
        .enumerate()
        .map(|(i, sec)| {
            format!(
                "{:.1},{:.1}",
                x((DECODE_PROMPT + i + 1) as f64),
                y(sec * 1e3)
            )
        })
        .collect();
    let _ = writeln!(
        s,
        r##"<polyline fill="none" stroke="#1f77b4" stroke-width="0.8" points="{}"/>"##,
        pts.join(" ")
    );
    // Recomputed: a staircase over buckets, interpolated between measured buckets.
    let mut stairs = Vec::new();
    let mut b = chunk;
    while b - chunk < total {
        let ms = interpolate(recomputed, b) * 1e3;
        stairs.push(format!("{:.1},{:.1}", x((b - chunk) as f64), y(ms)));
        stairs.push(format!("{:.1},{:.1}", x(b.min(total) as f64), y(ms)));
        b += chunk;
    }
    let _ = writeln!(
        s,
        r##"<polyline fill="none" stroke="#d62728" stroke-width="1.5" points="{}"/>"##,
        stairs.join(" ")
    );
    for (c, sec) in recomputed {
        let _ = writeln!(
            s,
            r##"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="#d62728"/>"##,
            x(*c as f64),
            y(sec * 1e3)
        );
    }
    let legend = [
        ("#1f77b4", "cached: host loop of Mamba2::step, every token"),
        (
            "#d62728",
            "recomputed: prefill of the whole prefix (dots measured, steps interpolated)",
        ),
    ];
    // The legend sits in the empty band between the two curves (geometric middle).
    let cached = median(&sorted(h.step_secs.clone())) * 1e3;
    let fastest_recompute = recomputed
        .iter()
        .map(|(_, s)| s * 1e3)
        .fold(f64::INFINITY, f64::min);
    let band = y((cached * fastest_recompute).sqrt()) - 9.0;
    for (i, (color, text)) in legend.iter().enumerate() {
        let ly = band + 18.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{0}" x2="{1}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"/><text x="{2}" y="{3}">{text}</text>"#,
            left + 150.0,
            left + 174.0,
            left + 180.0,
            ly + 4.0
        );
    }
    s.push_str("</svg>\n");
    s
}
