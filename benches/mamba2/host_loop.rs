//! Section 3 (b) and (c): a host loop of `Mamba2::step` (per-token latencies) against
//! recomputing the whole prefix for each new token.

use std::time::Instant;

use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};
use stablegraph::models::mamba2::{Mamba2, Mamba2State};
use stablegraph::DType;

use crate::common::{median, progress, quantile, secs_since, show, sorted};
use crate::context::{argmax, argmax_rows, max_abs_diff, prompt, Ctx};
use crate::decode::decode_bytes_per_step;
use crate::table::Table;
use crate::DECODE_PROMPT;

/// (b) the host loops (f32 to the longest context, bf16 to the shortest) and (c) recomputation
/// (f32) at each context, in one table. Returns the host loops, the table's JSON rows and the
/// recomputed `(context, median seconds)`.
pub fn tables(ctx: &mut Ctx, bandwidth: Option<f64>) -> Result<HostTables> {
    let contexts = ctx.plan.contexts.clone();
    let total = *contexts.iter().max().context("no contexts")?;
    let shortest = *contexts.iter().min().context("no contexts")?;
    let mut hosts = Vec::new();
    // bf16 only to the shortest context, to keep the run short.
    for (dtype, len) in [(DType::F32, total), (DType::BF16, shortest)] {
        ctx.model(dtype)?;
        let t = Instant::now();
        let h = host_loop(ctx.get(dtype), len, &contexts)?;
        progress::note(format!(
            "  host loop {}: {} steps in {:.1}s",
            dtype.name(),
            h.step_secs.len(),
            secs_since(t)
        ));
        hosts.push((dtype, h));
    }
    let mut table = Table::new(
        "decode (b) host loop of Mamba2::step (batch 1, per-token latency over the 256 steps \
         ending at the context) against (c) recomputing the whole prefix per token (f32)",
        &[
            "context",
            "dtype",
            "cached P50 ms",
            "P99 ms",
            "tokens/s",
            "of read bw",
            "recompute ms",
            "recompute/cached",
        ],
    );
    let mut rows = Vec::new();
    let mut recomputed = Vec::new();
    for &c in &contexts {
        let host_f32 = &hosts[0].1;
        let re = recompute(ctx, host_f32, c)?;
        let re_ms = median(&re) * 1e3;
        recomputed.push((c, median(&re)));
        for (dtype, h) in &hosts {
            if h.seq.len() < c {
                continue;
            }
            let w = window(h, c);
            let (p50, p99) = (median(&w), quantile(&w, 0.99));
            let bytes = decode_bytes_per_step(&ctx.cfg, *dtype, 1)?;
            let util = bandwidth.map(|b| bytes / p50 / b);
            let f32_row = *dtype == DType::F32;
            if f32_row {
                ctx.set_figure(format!("host_loop_p50_{c}"), p50);
                ctx.set_figure(format!("recompute_over_cached_{c}"), re_ms / (p50 * 1e3));
            }
            table.row(vec![
                c.to_string(),
                dtype.name().into(),
                show(p50 * 1e3),
                show(p99 * 1e3),
                show(1.0 / p50),
                util.map_or("-".into(), |u| format!("{:.0}%", u * 100.0)),
                if f32_row { show(re_ms) } else { "".into() },
                if f32_row {
                    format!("{:.1}x", re_ms / (p50 * 1e3))
                } else {
                    "".into()
                },
            ]);
            rows.push(json!({
                "context": c, "dtype": dtype.name(), "cached_ms_p50": p50 * 1e3,
                "cached_ms_p99": p99 * 1e3, "cached_tokens_per_s": 1.0 / p50,
                "bandwidth_utilisation": util, "samples": w.len(),
                "recompute_ms_median": f32_row.then_some(re_ms),
                "recompute_tokens_measured": f32_row.then_some(re.len()),
                "recompute_over_cached": f32_row.then_some(re_ms / (p50 * 1e3)),
            }));
        }
    }
    table.print();
    Ok(HostTables {
        hosts,
        rows,
        recomputed,
    })
}

/// What a host loop measured.
pub struct HostLoop {
    /// The prompt and the generated tokens.
    pub seq: Vec<u32>,
    /// Seconds of each step (step `i` consumes token `DECODE_PROMPT + i`).
    pub step_secs: Vec<f64>,
    /// The logits after consuming each context.
    pub logits_at: Vec<(usize, Vec<f64>)>,
}

/// What [`tables`] measured.
pub struct HostTables {
    /// The host loop of each dtype, f32 first.
    pub hosts: Vec<(DType, HostLoop)>,
    /// The table's JSON rows.
    pub rows: Vec<Value>,
    /// Recomputation: `(context, median seconds)`.
    pub recomputed: Vec<(usize, f64)>,
}

/// (b) the host loop: greedy tokens through `Mamba2::step`, timing each step with its logits
/// download and argmax. Returns the sequence (prompt and generated), each step's seconds (step
/// `i` consumes token `DECODE_PROMPT + i`), and the logits after consuming each context.
fn host_loop(model: &Mamba2, total: usize, contexts: &[usize]) -> Result<HostLoop> {
    let mut seq = prompt(DECODE_PROMPT, 0);
    let pre = model.prefill(std::slice::from_ref(&seq))?;
    let vocab = model.config().vocab_size;
    let last = pre.logits.to_f64_vec();
    let mut next = argmax(&last[last.len() - vocab..]) as u32;
    let mut state: Mamba2State = pre.state;
    // Compile and warm the step program on a throwaway copy of the state.
    {
        let warm = model.prefill(std::slice::from_ref(&seq))?;
        model.step(&[next], warm.state)?;
    }
    let mut step_secs = Vec::with_capacity(total);
    let mut logits_at = Vec::new();
    while seq.len() < total {
        seq.push(next);
        let t = Instant::now();
        let (logits, s) = model.step(&[next], state)?;
        next = argmax_rows(&logits)?[0];
        step_secs.push(secs_since(t));
        state = s;
        if contexts.contains(&seq.len()) {
            logits_at.push((seq.len(), logits.to_f64_vec()));
        }
    }
    Ok(HostLoop {
        seq,
        step_secs,
        logits_at,
    })
}

/// The host loop's step seconds for the 256 steps ending at `context`.
fn window(h: &HostLoop, context: usize) -> Vec<f64> {
    let end = context - DECODE_PROMPT; // step i consumes token DECODE_PROMPT + i
    let start = end.saturating_sub(256);
    sorted(h.step_secs[start..end].to_vec())
}

/// (c) recomputation: per-token seconds at `context` (prefill the whole prefix, download the last
/// logits, argmax), checking the logits against the cached decode.
fn recompute(ctx: &mut Ctx, h: &HostLoop, context: usize) -> Result<Vec<f64>> {
    let k = ctx.plan.recompute_tokens(context);
    let model = ctx.get(DType::F32);
    let mut times = Vec::new();
    model.prefill(&[h.seq[..context].to_vec()])?;
    for len in context + 1 - k..=context {
        let t = Instant::now();
        let logits = model.prefill(&[h.seq[..len].to_vec()])?.logits;
        let token = argmax_rows(&logits)?[0];
        times.push(secs_since(t));
        if len == context {
            let (_, cached) = h
                .logits_at
                .iter()
                .find(|(c, _)| *c == context)
                .context("no cached logits at the context")?;
            let d = max_abs_diff(&logits.to_f64_vec(), cached);
            ensure!(
                d < 1e-3,
                "recomputed logits at {context} differ from the cached decode by {d}"
            );
        }
        std::hint::black_box(token);
    }
    Ok(sorted(times))
}

/// Linear interpolation (and extrapolation from the last two points) of sorted `(x, y)` at `x`.
pub fn interpolate(points: &[(usize, f64)], x: usize) -> f64 {
    let i = points.partition_point(|(px, _)| *px < x);
    if let Some(&(px, py)) = points.get(i) {
        if px == x {
            return py;
        }
    }
    let (a, b) = match i {
        0 => (points[0], points[1.min(points.len() - 1)]),
        i if i >= points.len() => (
            points[points.len().saturating_sub(2)],
            points[points.len() - 1],
        ),
        i => (points[i - 1], points[i]),
    };
    if a.0 == b.0 {
        return a.1;
    }
    a.1 + (b.1 - a.1) * (x as f64 - a.0 as f64) / (b.0 as f64 - a.0 as f64)
}
