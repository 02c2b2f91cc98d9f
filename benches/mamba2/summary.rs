//! The summary table: the targets and the f32/bf16 comparisons, from the figures the
//! sections recorded (a figure whose section did not run is left out).

use serde_json::{json, Value};

use crate::context::Ctx;
use crate::decode::{sampling_name, SAMPLED, STREAM_SEGMENT};
use crate::table::Table;

/// The targets and the f32/bf16 comparison, from the figures the sections recorded.
pub fn summary(ctx: &Ctx) -> Value {
    let mut table = Table::new("summary", &["figure", "measured", "target / reference"]);
    let mut out = serde_json::Map::new();
    let mut add = |key: &str,
                   label: String,
                   value: Option<f64>,
                   fmt: &dyn Fn(f64) -> String,
                   target: &str| {
        if let Some(v) = value {
            table.row(vec![label, fmt(v), target.into()]);
            out.insert(key.into(), json!(v));
        }
    };
    let pct = |v: f64| format!("{:.0}%", v * 100.0);
    let times = |v: f64| format!("{v:.1}x");
    add(
        "decode_bandwidth_utilisation",
        "decode f32 batch 1 (device loop): bytes read x tokens/s / read bandwidth".into(),
        ctx.figure("device_loop_util_f32_b1"),
        &pct,
        ">= 85%",
    );
    let longest = ctx.plan.contexts.iter().max().copied().unwrap_or(0);
    add(
        "recompute_over_cached",
        format!("recomputation / cached decode, per token at context {longest}"),
        ctx.figure(&format!("recompute_over_cached_{longest}")),
        &times,
        ">= 27x (paper: 27x-36x at 4096)",
    );
    let tokens = &ctx.plan.memory_tokens;
    add(
        "memory_growth",
        format!(
            "peak memory, {} against {} generated tokens",
            tokens.last().unwrap_or(&0),
            tokens.first().unwrap_or(&0)
        ),
        ctx.figure("memory_growth"),
        &|v| format!("{:+.2}%", v * 100.0),
        "within 3%",
    );
    for &len in &ctx.plan.ssd_lens {
        add(
            &format!("ssd_loop_over_chunked_{len}"),
            format!(
                "SSD loop / chunked (chunk {}), L = {len}",
                ctx.cfg.chunk_size
            ),
            ctx.figure(&format!("ssd_loop_over_chunked_{len}")),
            &times,
            "paper: ~5.8x",
        );
    }
    let ratio = |a: &str, b: &str| Some(ctx.figure(a)? / ctx.figure(b)?);
    if let Some(&len) = ctx.plan.prefill_lens.last() {
        add(
            "prefill_bf16_over_f32",
            format!("prefill tokens/s bf16 / f32, batch 1, prompt {len}"),
            ratio(
                &format!("prefill_tps_bf16_b1_{len}"),
                &format!("prefill_tps_f32_b1_{len}"),
            ),
            &times,
            "",
        );
    }
    add(
        "decode_bf16_over_f32",
        "decode tokens/s bf16 / f32, batch 1 (device loop; median of per-run ratios)".into(),
        ctx.figure("device_loop_f32_over_bf16_b1"),
        &times,
        ">= 1.6x",
    );
    add(
        "sampling_over_greedy_ms",
        format!(
            "decode f32 batch 1: {} minus greedy, ms per step (median of per-run differences)",
            sampling_name(&SAMPLED)
        ),
        ctx.figure("device_loop_sampled_minus_greedy_ms_b1"),
        &|v| format!("{v:+.2} ms"),
        "within 1 ms",
    );
    add(
        "streamed_over_one_program",
        format!("decode f32 batch 1: streamed in segments of {STREAM_SEGMENT} / one program, ms per step (median of per-run ratios)"),
        ctx.figure("device_loop_streamed_over_greedy_b1"),
        &|v| format!("{:+.1}%", (v - 1.0) * 100.0),
        "within 3%",
    );
    table.print();
    Value::Object(out)
}
