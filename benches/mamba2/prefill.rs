//! Section 2: prefill tokens/s at several prompt lengths, f32 and bf16, batch 1 and 8, and the
//! FLOP/s that makes against the measured matmul ceiling.

use anyhow::Result;
use serde_json::{json, Value};
use stablegraph::models::mamba2::Mamba2Config;
use stablegraph::DType;

use crate::common::show;
use crate::context::Ctx;
use crate::table::Table;

/// Parameters read by the matrices per token of the layers (in_proj and out_proj), and of the
/// head (once per sequence in prefill, once per token in decode).
fn matmul_params(cfg: &Mamba2Config) -> (f64, f64) {
    let layer = cfg.in_proj_dim() * cfg.hidden_size + cfg.hidden_size * cfg.d_inner();
    (
        (layer * cfg.num_layers) as f64,
        (cfg.vocab_size * cfg.hidden_size) as f64,
    )
}

/// SSD FLOPs per token (chunked, all layers): per head, the within-chunk `C B^T` (2 Q N) and
/// its product with `X` (2 Q P) over the whole Q x Q block (the masked half is computed too), the
/// chunk state (2 N P) and the state's contribution to the output (2 N P).
fn ssd_flops_per_token(cfg: &Mamba2Config, chunk: usize) -> f64 {
    let (q, n, p) = (chunk as f64, cfg.state_size as f64, cfg.head_dim as f64);
    (cfg.num_layers * cfg.num_heads) as f64 * (2.0 * q * (n + p) + 4.0 * n * p)
}

/// Prefill FLOPs per real token: 2 x layer matmul params + SSD FLOPs, plus the head's
/// 2 x vocab x hidden once per sequence of `len` tokens (padded positions do the same work).
pub fn prefill_flops_per_token(cfg: &Mamba2Config, len: usize, bucket: usize, chunk: usize) -> f64 {
    let (layers, head) = matmul_params(cfg);
    ((2.0 * layers + ssd_flops_per_token(cfg, chunk)) * bucket as f64 + 2.0 * head) / len as f64
}

/// Runs the section; records `prefill_tps_<dtype>_b<batch>_<len>` (tokens/s).
pub fn bench(ctx: &mut Ctx) -> Result<Value> {
    let mut table = Table::new(
        "prefill: states + last-position logits (median)",
        &[
            "prompt",
            "batch",
            "dtype",
            "bucket",
            "chunk",
            "ms",
            "tokens/s",
            "GFLOP/s",
            "of matmul peak",
        ],
    );
    let peak = ctx.figure("matmul_flops");
    let mut rows = Vec::new();
    let lens = ctx.plan.prefill_lens.clone();
    for &len in &lens {
        for batch in [1, 8] {
            if batch == 8 && len > ctx.plan.batch8_max_len {
                continue;
            }
            for dtype in [DType::F32, DType::BF16] {
                let (s, bucket) = ctx.prefill_time(dtype, batch, len)?;
                let chunk = ctx.get(dtype).prefill_chunk(len);
                let tps = (batch * len) as f64 / s;
                let flops = prefill_flops_per_token(&ctx.cfg, len, bucket, chunk) * tps;
                let util = peak.map(|p| flops / p);
                table.row(vec![
                    len.to_string(),
                    batch.to_string(),
                    dtype.name().into(),
                    bucket.to_string(),
                    chunk.to_string(),
                    show(s * 1e3),
                    show(tps),
                    show(flops / 1e9),
                    util.map_or("-".into(), |u| format!("{:.0}%", u * 100.0)),
                ]);
                ctx.set_figure(format!("prefill_tps_{}_b{batch}_{len}", dtype.name()), tps);
                rows.push(json!({
                    "prompt_len": len, "batch": batch, "dtype": dtype.name(),
                    "bucket": bucket, "chunk": chunk, "median_ms": s * 1e3, "tokens_per_s": tps,
                    "gflops": flops / 1e9, "flop_utilisation": util,
                }));
            }
        }
    }
    table.print();
    Ok(json!({
        "flops_per_token_formula": "(2 * layer matmul params + SSD flops) per bucket position \
            + 2 * vocab * hidden per sequence, over real tokens; SSD per layer and head \
            2 Q (N + P) + 4 N P",
        "flops_per_token_2048": prefill_flops_per_token(
            &ctx.cfg,
            2048,
            2048,
            ctx.get(DType::F32).prefill_chunk(2048)
        ),
        "rows": rows,
    }))
}
