//! The loss curve of `train` as a small SVG line chart (the style of the bench's latency plot:
//! white ground, light grid, labelled axes, a legend).

use std::fmt::Write as _;

/// The chart's width and height, and the margins around its plot area, in pixels.
const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

/// Where a point lands: steps `0..=last` across the plot area, losses `lo..=hi` up it.
struct Scale {
    last: usize,
    lo: f64,
    hi: f64,
}

impl Scale {
    /// The x coordinate of `step`.
    fn x(&self, step: f64) -> f64 {
        LEFT + (WIDTH - LEFT - RIGHT) * step / self.last as f64
    }

    /// The y coordinate of the loss `v`.
    fn y(&self, v: f64) -> f64 {
        TOP + (HEIGHT - TOP - BOTTOM) * (self.hi - v) / (self.hi - self.lo)
    }

    /// `points` as the `points` attribute of a polyline.
    fn polyline(&self, points: &[(usize, f64)]) -> String {
        points
            .iter()
            .map(|&(step, loss)| format!("{:.1},{:.1}", self.x(step as f64), self.y(loss)))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Train and validation loss (bits per byte) against the step, with the unigram entropy as a
/// dashed horizontal line. Points whose loss is not finite are left out.
pub(crate) fn loss_svg(
    title: &str,
    train: &[(usize, f64)],
    val: &[(usize, f64)],
    entropy: f64,
) -> String {
    let finite = |v: &[(usize, f64)]| -> Vec<(usize, f64)> {
        v.iter().copied().filter(|(_, y)| y.is_finite()).collect()
    };
    let (train, val) = (finite(train), finite(val));
    let (lo, hi, tick) = loss_axis(&train, &val, entropy);
    let last = train
        .iter()
        .chain(&val)
        .map(|&(s, _)| s)
        .max()
        .unwrap_or(1)
        .max(1);
    let scale = Scale { last, lo, hi };
    let mut s = open(title);
    loss_grid(&mut s, &scale, tick);
    step_grid(&mut s, &scale);
    axis_titles(&mut s);
    curves(&mut s, &scale, &train, &val, entropy);
    legend(&mut s, entropy);
    s.push_str("</svg>\n");
    s
}

/// The loss axis as (lowest, highest, tick spacing): whole ticks around every loss and the
/// entropy (0 to 8 when there is none).
fn loss_axis(train: &[(usize, f64)], val: &[(usize, f64)], entropy: f64) -> (f64, f64, f64) {
    let ys: Vec<f64> = train
        .iter()
        .chain(val)
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
    (y0, y1, tick)
}

/// The `<svg>` element, a white ground and the title.
fn open(title: &str) -> String {
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
        r#"<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    s
}

/// Horizontal grid lines with the loss ticks.
fn loss_grid(s: &mut String, scale: &Scale, tick: f64) {
    let mut v = scale.lo;
    while v <= scale.hi + tick / 2.0 {
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{x2}" y1="{yy:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{tx}" y="{ty:.1}" text-anchor="end">{label}</text>"##,
            x2 = WIDTH - RIGHT,
            yy = scale.y(v),
            tx = LEFT - 6.0,
            ty = scale.y(v) + 4.0,
            label = format_tick(v, tick)
        );
        v += tick;
    }
}

/// Vertical grid lines with the step ticks (about eight).
fn step_grid(s: &mut String, scale: &Scale) {
    let last = scale.last as f64;
    let step_tick = nice_step(last / 8.0).max(1.0);
    let mut t = 0.0;
    while t <= last + step_tick / 2.0 {
        let _ = writeln!(
            s,
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="{TOP}" y2="{1}" stroke="#eee"/><text x="{0:.1}" y="{2}" text-anchor="middle">{3}</text>"##,
            scale.x(t),
            HEIGHT - BOTTOM,
            HEIGHT - BOTTOM + 16.0,
            t as u64
        );
        t += step_tick;
    }
}

/// The captions of the two axes.
fn axis_titles(s: &mut String) {
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">optimizer step</text>"#,
        (LEFT + WIDTH - RIGHT) / 2.0,
        HEIGHT - 12.0
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{0}" text-anchor="middle" transform="rotate(-90 16 {0})">loss (bits per byte)</text>"#,
        (TOP + HEIGHT - BOTTOM) / 2.0
    );
}

/// The entropy's dashed line (when finite), the train curve, and the validation curve with a
/// dot at each evaluation.
fn curves(
    s: &mut String,
    scale: &Scale,
    train: &[(usize, f64)],
    val: &[(usize, f64)],
    entropy: f64,
) {
    if entropy.is_finite() {
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{x2}" y1="{yy:.1}" y2="{yy:.1}" stroke="#7f7f7f" stroke-width="1.5" stroke-dasharray="6 4"/>"##,
            x2 = WIDTH - RIGHT,
            yy = scale.y(entropy)
        );
    }
    let _ = writeln!(
        s,
        r##"<polyline fill="none" stroke="#1f77b4" stroke-width="1.2" points="{}"/>"##,
        scale.polyline(train)
    );
    let _ = writeln!(
        s,
        r##"<polyline fill="none" stroke="#d62728" stroke-width="1.5" points="{}"/>"##,
        scale.polyline(val)
    );
    for &(step, loss) in val {
        let _ = writeln!(
            s,
            r##"<circle cx="{:.1}" cy="{:.1}" r="3" fill="#d62728"/>"##,
            scale.x(step as f64),
            scale.y(loss)
        );
    }
}

/// The legend, top right: a sample of each line and what it is.
fn legend(s: &mut String, entropy: f64) {
    let entries = [
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
    for (i, (color, dash, text)) in entries.iter().enumerate() {
        let ly = TOP + 16.0 + 18.0 * i as f64;
        let lx = WIDTH - RIGHT - 330.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" x2="{0}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/><text x="{1}" y="{2}">{3}</text>"#,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0,
            escape(text)
        );
    }
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
