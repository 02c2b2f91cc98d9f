//! The loss curve of `train` as a small SVG line chart (the style of the bench's latency plot:
//! white ground, light grid, labelled axes, a legend).

use std::fmt::Write as _;

/// Train and validation loss (bits per byte) against the step, with the unigram entropy as a
/// dashed horizontal line. Points whose loss is not finite are left out.
pub(crate) fn loss_svg(
    title: &str,
    train: &[(usize, f64)],
    val: &[(usize, f64)],
    entropy: f64,
) -> String {
    let (w, ht, left, right, top, bottom) = (760.0, 420.0, 70.0, 20.0, 40.0, 50.0);
    let finite = |v: &[(usize, f64)]| -> Vec<(usize, f64)> {
        v.iter().copied().filter(|(_, y)| y.is_finite()).collect()
    };
    let (train, val) = (finite(train), finite(val));
    let ys: Vec<f64> = train
        .iter()
        .chain(&val)
        .map(|&(_, y)| y)
        .chain([entropy].into_iter().filter(|e| e.is_finite()))
        .collect();
    let (mut lo, mut hi) = ys
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &y| {
            (a.min(y), b.max(y))
        });
    if !lo.is_finite() {
        (lo, hi) = (0.0, 8.0);
    }
    let tick = nice_step((hi - lo).max(1e-3) / 5.0);
    let (y0, y1) = ((lo / tick).floor() * tick, (hi / tick).ceil() * tick);
    let y1 = if y1 > y0 { y1 } else { y0 + tick };
    let last = train
        .iter()
        .chain(&val)
        .map(|&(s, _)| s)
        .max()
        .unwrap_or(1)
        .max(1);
    let x = |step: f64| left + (w - left - right) * step / last as f64;
    let y = |v: f64| top + (ht - top - bottom) * (y1 - v) / (y1 - y0);

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{ht}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{ht}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>"#,
        w / 2.0,
        escape(title)
    );
    // Horizontal grid with the loss ticks.
    let mut v = y0;
    while v <= y1 + tick / 2.0 {
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{x2}" y1="{yy:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{tx}" y="{ty:.1}" text-anchor="end">{label}</text>"##,
            x2 = w - right,
            yy = y(v),
            tx = left - 6.0,
            ty = y(v) + 4.0,
            label = format_tick(v, tick)
        );
        v += tick;
    }
    // Vertical grid with the step ticks.
    let step_tick = nice_step(last as f64 / 8.0).max(1.0);
    let mut t = 0.0;
    while t <= last as f64 + step_tick / 2.0 {
        let _ = writeln!(
            s,
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="{top}" y2="{1}" stroke="#eee"/><text x="{0:.1}" y="{2}" text-anchor="middle">{3}</text>"##,
            x(t),
            ht - bottom,
            ht - bottom + 16.0,
            t as u64
        );
        t += step_tick;
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">optimizer step</text>"#,
        (left + w - right) / 2.0,
        ht - 12.0
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{0}" text-anchor="middle" transform="rotate(-90 16 {0})">loss (bits per byte)</text>"#,
        (top + ht - bottom) / 2.0
    );
    if entropy.is_finite() {
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{x2}" y1="{yy:.1}" y2="{yy:.1}" stroke="#7f7f7f" stroke-width="1.5" stroke-dasharray="6 4"/>"##,
            x2 = w - right,
            yy = y(entropy)
        );
    }
    let points = |v: &[(usize, f64)]| -> String {
        v.iter()
            .map(|&(step, loss)| format!("{:.1},{:.1}", x(step as f64), y(loss)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let _ = writeln!(
        s,
        r##"<polyline fill="none" stroke="#1f77b4" stroke-width="1.2" points="{}"/>"##,
        points(&train)
    );
    let _ = writeln!(
        s,
        r##"<polyline fill="none" stroke="#d62728" stroke-width="1.5" points="{}"/>"##,
        points(&val)
    );
    for &(step, loss) in &val {
        let _ = writeln!(
            s,
            r##"<circle cx="{:.1}" cy="{:.1}" r="3" fill="#d62728"/>"##,
            x(step as f64),
            y(loss)
        );
    }
    let legend = [
        (
            "#1f77b4",
            "",
            "train (mean over each step's batch)".to_string(),
        ),
        (
            "#d62728",
            "",
            "validation (the held-out last 5%)".to_string(),
        ),
        (
            "#7f7f7f",
            r#" stroke-dasharray="6 4""#,
            format!("unigram entropy of the training bytes ({entropy:.3})"),
        ),
    ];
    for (i, (color, dash, text)) in legend.iter().enumerate() {
        let ly = top + 16.0 + 18.0 * i as f64;
        let lx = w - right - 330.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" x2="{0}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/><text x="{1}" y="{2}">{3}</text>"#,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0,
            escape(text)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * p)
}

/// A tick label with as many decimals as the tick spacing needs.
fn format_tick(v: f64, tick: f64) -> String {
    let decimals = (-tick.log10().floor()).max(0.0) as usize;
    format!("{v:.decimals$}")
}

/// Text safe inside SVG.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
