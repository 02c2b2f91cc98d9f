//! The decode latency plot (SVG): per-token latency against position, cached against
//! recomputed.

use std::fmt::Write as _;

use crate::common::{median, sorted};
use crate::host_loop::{interpolate, HostLoop};
use crate::DECODE_PROMPT;

/// The chart's width and height, and the margins around its plot area, in pixels.
const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

/// Where a point lands: positions `0..=total` across the plot area, latencies up it on a log
/// scale from 10^`lo` to 10^`hi` ms.
struct Scale {
    total: usize,
    lo: f64,
    hi: f64,
}

impl Scale {
    /// The decades of milliseconds that hold every step of `h` and every recomputation.
    fn new(h: &HostLoop, recomputed: &[(usize, f64)], total: usize) -> Scale {
        let all_ms: Vec<f64> = h
            .step_secs
            .iter()
            .chain(recomputed.iter().map(|(_, s)| s))
            .map(|s| s * 1e3)
            .collect();
        let lo = all_ms.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = all_ms.iter().cloned().fold(0.0, f64::max);
        Scale {
            total,
            lo: lo.log10().floor(),
            hi: hi.log10().ceil(),
        }
    }

    /// The x coordinate of position `p`.
    fn x(&self, p: f64) -> f64 {
        LEFT + (WIDTH - LEFT - RIGHT) * p / self.total as f64
    }

    /// The y coordinate of `ms` milliseconds.
    fn y(&self, ms: f64) -> f64 {
        TOP + (HEIGHT - TOP - BOTTOM) * (self.hi - ms.log10()) / (self.hi - self.lo)
    }
}

/// Per-token latency (log scale) against position: the cached host loop (every step) and
/// recomputation (a staircase over prefill buckets; dots where measured).
pub fn latency_svg(
    h: &HostLoop,
    recomputed: &[(usize, f64)],
    chunk: usize,
    total: usize,
) -> String {
    let scale = Scale::new(h, recomputed, total);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="14">Mamba-2 130M decode, per-token latency (batch 1, f32)</text>"#,
        WIDTH / 2.0
    );
    latency_grid(&mut s, &scale);
    position_grid(&mut s, &scale);
    cached_curve(&mut s, &scale, &h.step_secs);
    recomputed_curve(&mut s, &scale, recomputed, chunk);
    legend(&mut s, &scale, &h.step_secs, recomputed);
    s.push_str("</svg>\n");
    s
}

/// Horizontal grid lines at each decade of milliseconds, labelled.
fn latency_grid(s: &mut String, scale: &Scale) {
    let mut d = scale.lo;
    while d <= scale.hi {
        let ms = 10f64.powf(d);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{x2}" y1="{yy:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{tx}" y="{ty:.1}" text-anchor="end">{label}</text>"##,
            x2 = WIDTH - RIGHT,
            yy = scale.y(ms),
            tx = LEFT - 6.0,
            ty = scale.y(ms) + 4.0,
            label = if ms >= 1.0 {
                format!("{ms:.0} ms")
            } else {
                format!("{ms} ms")
            }
        );
        d += 1.0;
    }
}

/// Vertical grid lines every 128 positions (512 past 2048), labelled, and the axis caption.
fn position_grid(s: &mut String, scale: &Scale) {
    let step = if scale.total > 2048 { 512 } else { 128 };
    for p in (0..=scale.total).step_by(step) {
        let _ = writeln!(
            s,
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="{TOP}" y2="{1}" stroke="#eee"/><text x="{0:.1}" y="{2}" text-anchor="middle">{p}</text>"##,
            scale.x(p as f64),
            HEIGHT - BOTTOM,
            HEIGHT - BOTTOM + 16.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">position (tokens in the context)</text>"#,
        (LEFT + WIDTH - RIGHT) / 2.0,
        HEIGHT - 12.0
    );
}

/// The cached host loop: one point per step (step `i` at position `DECODE_PROMPT + i + 1`).
fn cached_curve(s: &mut String, scale: &Scale, step_secs: &[f64]) {
    let pts: Vec<String> = step_secs
        .iter()
        .enumerate()
        .map(|(i, sec)| {
            format!(
                "{:.1},{:.1}",
                scale.x((DECODE_PROMPT + i + 1) as f64),
                scale.y(sec * 1e3)
            )
        })
        .collect();
    let _ = writeln!(
        s,
        r##"<polyline fill="none" stroke="#1f77b4" stroke-width="0.8" points="{}"/>"##,
        pts.join(" ")
    );
}

/// Recomputation: a staircase over the prefill buckets of `chunk` positions, interpolated
/// between the measured buckets, with a dot at each measured one.
fn recomputed_curve(s: &mut String, scale: &Scale, recomputed: &[(usize, f64)], chunk: usize) {
    let total = scale.total;
    let mut stairs = Vec::new();
    let mut b = chunk;
    while b - chunk < total {
        let ms = interpolate(recomputed, b) * 1e3;
        stairs.push(format!(
            "{:.1},{:.1}",
            scale.x((b - chunk) as f64),
            scale.y(ms)
        ));
        stairs.push(format!(
            "{:.1},{:.1}",
            scale.x(b.min(total) as f64),
            scale.y(ms)
        ));
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
            scale.x(*c as f64),
            scale.y(sec * 1e3)
        );
    }
}

/// The legend, in the empty band between the two curves (their geometric middle).
fn legend(s: &mut String, scale: &Scale, step_secs: &[f64], recomputed: &[(usize, f64)]) {
    let entries = [
        ("#1f77b4", "cached: host loop of Mamba2::step, every token"),
        (
            "#d62728",
            "recomputed: prefill of the whole prefix (dots measured, steps interpolated)",
        ),
    ];
    let cached = median(&sorted(step_secs.to_vec())) * 1e3;
    let fastest_recompute = recomputed
        .iter()
        .map(|(_, s)| s * 1e3)
        .fold(f64::INFINITY, f64::min);
    let band = scale.y((cached * fastest_recompute).sqrt()) - 9.0;
    for (i, (color, text)) in entries.iter().enumerate() {
        let ly = band + 18.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{0}" x2="{1}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"/><text x="{2}" y="{3}">{text}</text>"#,
            LEFT + 150.0,
            LEFT + 174.0,
            LEFT + 180.0,
            ly + 4.0
        );
    }
}
