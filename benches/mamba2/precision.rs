//! Section 5: the largest logit difference of bf16 matrices against f32, and of the SSD's decay
//! arithmetic in bf16 (`Mamba2Config::scan_dtype`) against f32, over a prefill and decode steps.

use anyhow::Result;
use serde_json::{json, Value};
use stablegraph::models::mamba2::{Mamba2, Mamba2Config, Mamba2Weights};
use stablegraph::DType;

use crate::common::show;
use crate::context::{argmax, greedy, max_abs, max_abs_diff, prompt, Ctx};
use crate::table::Table;
use crate::SEED;

/// Prefill logits (all positions) and those of `steps` decode steps fed `tokens`.
fn logits_trace(model: &Mamba2, prompt: &[u32], tokens: &[u32]) -> Result<(Vec<f64>, Vec<f64>)> {
    let pre = model.prefill(&[prompt.to_vec()])?;
    let mut state = pre.state;
    let mut steps = Vec::new();
    for &t in tokens {
        let (logits, s) = model.step(&[t], state)?;
        steps.extend(logits.to_f64_vec());
        state = s;
    }
    Ok((pre.logits.to_f64_vec(), steps))
}

/// Runs the section.
pub fn bench(ctx: &mut Ctx) -> Result<Value> {
    let len = ctx.plan.precision_len;
    let p = prompt(len, 0);
    // The f32 model's greedy continuation feeds every variant.
    let steps = ctx.plan.precision_steps;
    let tokens = ctx
        .model(DType::F32)?
        .generate(std::slice::from_ref(&p), &greedy(steps))?
        .remove(0);
    let (pf, sf) = logits_trace(ctx.get(DType::F32), &p, &tokens)?;
    ctx.model(DType::BF16)?;
    let (pb, sb) = logits_trace(ctx.get(DType::BF16), &p, &tokens)?;
    let scan_cfg = Mamba2Config {
        scan_dtype: DType::BF16,
        ..ctx.cfg.clone()
    };
    let scan_model = Mamba2::new(
        &ctx.client,
        scan_cfg,
        &Mamba2Weights::random(&ctx.cfg, DType::F32, SEED)?,
    )?;
    let (ps, ss) = logits_trace(&scan_model, &p, &tokens)?;
    drop(scan_model);
    let vocab = ctx.cfg.vocab_size;
    let agree = |a: &[f64], b: &[f64]| {
        let same = a
            .chunks(vocab)
            .zip(b.chunks(vocab))
            .filter(|(x, y)| argmax(x) == argmax(y))
            .count();
        same as f64 / (a.len() / vocab) as f64
    };
    let scale = max_abs(&pf);
    let mut table = Table::new(
        format!(
            "precision against f32 (prompt {len}, then {} decode steps; largest |logit| {})",
            tokens.len(),
            show(scale)
        ),
        &[
            "variant",
            "prefill max |dlogit|",
            "decode max |dlogit|",
            "same argmax",
        ],
    );
    let mut rows = Vec::new();
    for (name, pv, sv) in [
        ("bf16 matrices", &pb, &sb),
        ("f32, scan (A dt, cumsum, segsum, exp) in bf16", &ps, &ss),
    ] {
        let (dp, ds) = (max_abs_diff(&pf, pv), max_abs_diff(&sf, sv));
        let same = agree(&pf, pv);
        table.row(vec![
            name.into(),
            show(dp),
            show(ds),
            format!("{:.1}%", same * 100.0),
        ]);
        rows.push(json!({
            "variant": name, "prefill_max_abs_diff": dp, "decode_max_abs_diff": ds,
            "prefill_argmax_agreement": same,
        }));
    }
    table.print();
    Ok(
        json!({"prompt_len": len, "decode_steps": tokens.len(), "max_abs_logit": scale, "rows": rows}),
    )
}
