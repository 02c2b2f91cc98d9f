//! Section 3: decode. (a) The on-device loop (`Mamba2::generate`, greedy, sampled and streamed,
//! f32 and bf16) against the read bandwidth; then, in `host_loop.rs`, (b) a host loop of
//! `Mamba2::step` with per-token latencies and (c) recomputation of the whole prefix per token;
//! and the total time to generate every position both ways, with the latency plot.

use std::time::Instant;

use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};
use stablegraph::models::mamba2::{Mamba2Config, Mamba2Weights, Sampling};
use stablegraph::models::GenerateOptions;
use stablegraph::tree::Tree;
use stablegraph::{DType, TensorType};

use crate::common::{median, progress, quantile, secs_since, show, sorted, write_report};
use crate::context::{greedy, prompt, Ctx};
use crate::host_loop::{self, interpolate, HostTables};
use crate::plot::latency_svg;
use crate::table::Table;
use crate::DECODE_PROMPT;

/// Runs the section; records the device-loop, host-loop and recomputation figures the summary
/// reads.
pub fn bench(ctx: &mut Ctx) -> Result<Value> {
    let bandwidth = ctx.figure("read_bandwidth_out_in");
    let device = device_table(ctx, bandwidth)?;
    let tables = host_loop::tables(ctx, bandwidth)?;
    all_positions(ctx, device, tables)
}

/// Bytes of the weights of `cfg` with `dtype` matrices.
pub fn weight_bytes(cfg: &Mamba2Config, dtype: DType) -> Result<usize> {
    let types = Mamba2Weights::<TensorType>::types(cfg, dtype)?;
    Ok(types
        .named()
        .iter()
        .map(|(_, t)| t.byte_size().unwrap_or(0))
        .sum())
}

/// Bytes a decode step reads: every weight once (the tied embedding as the head) and the
/// recurrent state of `batch` rows.
pub fn decode_bytes_per_step(cfg: &Mamba2Config, dtype: DType, batch: usize) -> Result<f64> {
    let weights = weight_bytes(cfg, dtype)?;
    let state = cfg.num_layers
        * batch
        * 4
        * (cfg.conv_dim() * cfg.conv_kernel + cfg.num_heads * cfg.head_dim * cfg.state_size);
    Ok((weights + state) as f64)
}

/// Segment length of the streamed decode of the device-loop table.
pub const STREAM_SEGMENT: usize = 16;

/// The sampled decode of the device-loop table: temperature 0.8, top-k 50, top-p 0.9.
pub const SAMPLED: Sampling = Sampling::Sample {
    temperature: 0.8,
    top_k: 50,
    top_p: 0.9,
    seed: 7,
};

/// One row of the device-loop table: a dtype, a sampling, and streaming in segments or not.
#[derive(Clone, Copy)]
struct Variant {
    dtype: DType,
    sampling: Sampling,
    stream: Option<usize>,
}

/// The variants of the device-loop table; the first is the greedy f32 baseline the others are
/// compared with.
const VARIANTS: [Variant; 4] = [
    Variant {
        dtype: DType::F32,
        sampling: Sampling::Greedy,
        stream: None,
    },
    Variant {
        dtype: DType::F32,
        sampling: Sampling::Greedy,
        stream: Some(STREAM_SEGMENT),
    },
    Variant {
        dtype: DType::F32,
        sampling: SAMPLED,
        stream: None,
    },
    Variant {
        dtype: DType::BF16,
        sampling: Sampling::Greedy,
        stream: None,
    },
];

/// (a) the device loop: seconds per step (one token per row) of each variant in each run, from
/// `generate` minus the prefill, in run order. The variants take turns (run 1 of each, then run
/// 2 of each, ...), so a change in the machine's load between runs reaches all of them alike and
/// per-run differences compare them.
fn device_loop(
    ctx: &mut Ctx,
    batch: usize,
    n: usize,
    runs: usize,
    variants: &[Variant],
) -> Result<Vec<Vec<f64>>> {
    let mut pre = Vec::new();
    for v in variants {
        pre.push(ctx.prefill_time(v.dtype, batch, DECODE_PROMPT)?.0);
    }
    let prompts: Vec<Vec<u32>> = (0..batch).map(|r| prompt(DECODE_PROMPT, r)).collect();
    let run = |v: &Variant| -> Result<Vec<Vec<u32>>> {
        let model = ctx.get(v.dtype);
        let options = GenerateOptions {
            sampling: v.sampling,
            ..greedy(n)
        };
        Ok(match v.stream {
            Some(k) => model.generate_stream(&prompts, &options, k, |_| true)?,
            None => model.generate(&prompts, &options)?,
        })
    };
    let mut first = Vec::new();
    for v in variants {
        let t = Instant::now();
        first.push(run(v)?);
        progress::note(format!(
            "  generate {} b{batch} n{n} {}{}: first call (compile + run) {:.1}s",
            v.dtype.name(),
            sampling_name(&v.sampling),
            v.stream
                .map_or(String::new(), |k| format!(" streamed K={k}")),
            secs_since(t)
        ));
    }
    let mut per_step = vec![Vec::with_capacity(runs); variants.len()];
    for _ in 0..runs.max(1) {
        for (i, v) in variants.iter().enumerate() {
            let t = Instant::now();
            let out = run(v)?;
            let secs = secs_since(t);
            ensure!(out == first[i], "generate is not deterministic");
            per_step[i].push((secs - pre[i]) / n as f64);
        }
    }
    Ok(per_step)
}

/// The median over runs of `f(variant's figure, baseline's figure)`, run by run.
fn paired_median(variant: &[f64], baseline: &[f64], f: impl Fn(f64, f64) -> f64) -> f64 {
    median(&sorted(
        variant
            .iter()
            .zip(baseline)
            .map(|(&v, &b)| f(v, b))
            .collect(),
    ))
}

/// The sampling column of the tables (`greedy`, `t0.8 k50 p0.9`).
pub fn sampling_name(s: &Sampling) -> String {
    match *s {
        Sampling::Greedy => "greedy".into(),
        Sampling::Sample {
            temperature,
            top_k,
            top_p,
            ..
        } => format!("t{temperature} k{top_k} p{top_p}"),
    }
}

/// (a) the device-loop table; returns its JSON rows. `bandwidth` is the measured read bandwidth
/// (bytes/s), if the ceilings ran.
fn device_table(ctx: &mut Ctx, bandwidth: Option<f64>) -> Result<Vec<Value>> {
    let mut table = Table::new(
        format!(
            "decode (a): on-device loop (generate) after a {DECODE_PROMPT}-token prompt; \
             ms/step = (generate - prefill) / tokens, P50/P99 over the runs (one figure per run); \
             the rows take turns run by run, and `vs f32 greedy` is the median of the per-run \
             differences with the first row"
        ),
        &[
            "batch",
            "dtype",
            "sampling",
            "tokens x runs",
            "tokens/s",
            "ms/step P50",
            "P99",
            "vs f32 greedy, ms",
            "MB read/step",
            "GB/s",
            "of read bw",
        ],
    );
    let mut device = Vec::new();
    for (batch, n, runs) in ctx.plan.device_loops.clone() {
        let all = device_loop(ctx, batch, n, runs, &VARIANTS)?;
        let baseline = &all[0];
        for (v, per_step) in VARIANTS.iter().zip(&all) {
            let (dtype, sampling, stream) = (v.dtype, v.sampling, v.stream);
            let sorted_steps = sorted(per_step.clone());
            let (p50, p99) = (median(&sorted_steps), quantile(&sorted_steps, 0.99));
            let tps = batch as f64 / p50;
            let bytes = decode_bytes_per_step(&ctx.cfg, dtype, batch)?;
            let gbs = bytes / p50;
            let util = bandwidth.map(|b| gbs / b);
            let mut name = sampling_name(&sampling);
            if let Some(k) = stream {
                name += &format!(", streamed K={k}");
            }
            let vs_greedy = paired_median(per_step, baseline, |v, b| (v - b) * 1e3);
            table.row(vec![
                batch.to_string(),
                dtype.name().into(),
                name.clone(),
                format!("{n} x {runs}"),
                show(tps),
                show(p50 * 1e3),
                show(p99 * 1e3),
                format!("{vs_greedy:+.2}"),
                show(bytes / 1e6),
                show(gbs / 1e9),
                util.map_or("-".into(), |u| format!("{:.0}%", u * 100.0)),
            ]);
            if stream.is_some() || sampling != Sampling::Greedy {
                // The summary's comparisons: streaming as a ratio, sampling as a difference.
                if stream.is_some() {
                    ctx.set_figure(
                        format!("device_loop_streamed_over_greedy_b{batch}"),
                        paired_median(per_step, baseline, |v, b| v / b),
                    );
                } else {
                    ctx.set_figure(
                        format!("device_loop_sampled_minus_greedy_ms_b{batch}"),
                        vs_greedy,
                    );
                }
                device.push(json!({
                    "batch": batch, "dtype": dtype.name(), "sampling": name, "tokens": n,
                    "runs": runs, "tokens_per_s": tps, "ms_per_step_p50": p50 * 1e3,
                    "ms_per_step_p99": p99 * 1e3, "ms_per_step_minus_greedy": vs_greedy,
                }));
                continue;
            }
            if let Some(u) = util {
                ctx.set_figure(format!("device_loop_util_{}_b{batch}", dtype.name()), u);
            }
            if dtype != DType::F32 {
                ctx.set_figure(
                    format!("device_loop_f32_over_{}_b{batch}", dtype.name()),
                    paired_median(baseline, per_step, |b, v| b / v),
                );
            }
            device.push(json!({
                "batch": batch, "dtype": dtype.name(), "sampling": name, "tokens": n,
                "runs": runs, "tokens_per_s": tps, "ms_per_step_p50": p50 * 1e3,
                "ms_per_step_p99": p99 * 1e3, "ms_per_step_minus_greedy": vs_greedy,
                "bytes_read_per_step": bytes, "read_gbs": gbs / 1e9,
                "bandwidth_utilisation": util,
            }));
        }
    }
    table.print();
    Ok(device)
}

/// The recomputation cost at every bucket up to the longest context, interpolating linearly
/// between measured buckets (the recomputed contexts and the f32 batch-1 prefill times); the
/// total time to generate every position by recomputation against the cached host loop; the
/// latency plot. Returns the section's JSON with `device` (the device-loop rows).
fn all_positions(ctx: &Ctx, device: Vec<Value>, t: HostTables) -> Result<Value> {
    let HostTables {
        hosts,
        rows,
        mut recomputed,
    } = t;
    let total = *ctx.plan.contexts.iter().max().context("no contexts")?;
    for (dtype_len, secs) in ctx
        .prefill_secs
        .iter()
        .filter(|((d, b, _), _)| *d == DType::F32 && *b == 1)
        .map(|((_, _, l), s)| (*l, *s))
        .collect::<Vec<_>>()
    {
        if !recomputed.iter().any(|(c, _)| *c == dtype_len) {
            recomputed.push((dtype_len, secs));
        }
    }
    recomputed.sort_by_key(|(c, _)| *c);
    let chunk = ctx.cfg.chunk_size;
    let per_position = |p: usize| interpolate(&recomputed, p.div_ceil(chunk) * chunk);
    let host = &hosts[0].1;
    let cached_total: f64 = host.step_secs.iter().sum();
    let recompute_total: f64 = (DECODE_PROMPT + 1..=total).map(per_position).sum();
    let steps = host.step_secs.len();
    progress::out(format!(
        "generating positions {}..={total} ({steps} tokens): cached host loop {:.1}s measured, \
         recomputation {:.1}s (extrapolated from the prefill times at {:?}), {:.0}x",
        DECODE_PROMPT + 1,
        cached_total,
        recompute_total,
        recomputed.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
        recompute_total / cached_total
    ));
    let svg = latency_svg(host, &recomputed, chunk, total);
    let name = if ctx.plan.quick {
        "decode_latency-quick.svg"
    } else {
        "decode_latency.svg"
    };
    let file = write_report(name, &svg)?;
    progress::out(format!("wrote {}", file.display()));
    Ok(json!({
        "device_loop": device,
        "host_loop_and_recompute": rows,
        "recompute_prefill_secs_by_bucket": recomputed,
        "generate_all_positions": {
            "from": DECODE_PROMPT + 1, "to": total, "cached_host_loop_s": cached_total,
            "recompute_s_extrapolated": recompute_total,
        },
        "host_loop_step_ms": host.step_secs.iter().map(|s| s * 1e3).collect::<Vec<_>>(),
    }))
}
