//! Section 8: the model over 1, 2 and 4 devices of a 4-device CPU client, split by heads and by
//! the batch (`Mamba2::new_parallel`): weights per device, prefill tokens/s and decode time per
//! step (batch 4, 64-token prompts), and the collectives XLA put in the step program. The
//! configurations take turns run by run, so drift hits them alike. This machine's "devices"
//! share its cores and memory: the figures are the overhead of splitting, not a speed-up.

use std::time::Instant;

use anyhow::Result;
use serde_json::{json, Value};
use stablegraph::models::mamba2::{Mamba2, Mamba2Weights, Parallel};
use stablegraph::runtime::{Client, CompileCache};
use stablegraph::DType;

use crate::common::{median, secs_since, show, sorted};
use crate::context::{greedy, prompt, Ctx};
use crate::table::Table;

/// Rows of every run, and their prompt length.
const BATCH: usize = 4;
const PROMPT: usize = 64;

/// The configurations: one device, then heads and batch over 2 and 4.
const CONFIGS: [(Parallel, usize); 5] = [
    (Parallel::Heads, 1),
    (Parallel::Heads, 2),
    (Parallel::Heads, 4),
    (Parallel::Batch, 2),
    (Parallel::Batch, 4),
];

/// Runs the section.
pub fn bench(ctx: &mut Ctx) -> Result<Value> {
    let (tokens, reps) = if ctx.plan.quick { (16, 2) } else { (64, 3) };
    let client = Client::cpu_with_devices(4)?;
    client.set_compile_cache(CompileCache::memory_only());
    let weights = Mamba2Weights::random(&ctx.cfg, DType::F32, crate::SEED)?;
    let prompts: Vec<Vec<u32>> = (0..BATCH).map(|r| prompt(PROMPT, r)).collect();
    let options = greedy(tokens);
    let mut models = Vec::new();
    for (parallel, n) in CONFIGS {
        let model = Mamba2::new_parallel(&client, ctx.cfg.clone(), &weights, parallel, n)?;
        // Compile and warm up.
        model.generate(&prompts, &options)?;
        model.prefill(&prompts)?;
        models.push(model);
    }
    let reference = models[0].generate(&prompts, &options)?;
    let mut times: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); CONFIGS.len()];
    for _ in 0..reps {
        for (model, (prefill, step)) in models.iter().zip(&mut times) {
            let t = Instant::now();
            model.prefill(&prompts)?;
            let p = secs_since(t);
            let t = Instant::now();
            let out = model.generate(&prompts, &options)?;
            let g = secs_since(t);
            anyhow::ensure!(out == reference, "the tokens differ from one device's");
            prefill.push(p);
            step.push((g - p) / tokens as f64);
        }
    }
    let mut table = Table::new(
        format!(
            "devices: batch {BATCH}, {PROMPT}-token prompts, {tokens} new tokens, medians of \
             {reps} runs taking turns (the devices share this machine's cores and memory)"
        ),
        &[
            "split",
            "devices",
            "weights MB/device",
            "prefill tok/s",
            "decode ms/step",
            "step collectives: all-reduces/layer, elements/step",
        ],
    );
    let mut rows = Vec::new();
    for (((parallel, n), model), (prefill, step)) in CONFIGS.iter().zip(&models).zip(times) {
        let (p, s) = (median(&sorted(prefill)), median(&sorted(step)));
        let collectives = if *n > 1 {
            model.step_program(BATCH)?.executable().collectives()?
        } else {
            Vec::new()
        };
        let layers = ctx.cfg.num_layers as f64;
        let reduces = collectives
            .iter()
            .filter(|c| c.opcode == "all-reduce")
            .count() as f64;
        let elements: u64 = collectives.iter().map(|c| c.elements).sum();
        let weights_mb = model.weight_bytes_per_device() as f64 / 1e6;
        let tps = (BATCH * PROMPT) as f64 / p;
        table.row(vec![
            if *n == 1 { "-" } else { parallel.name() }.to_string(),
            n.to_string(),
            show(weights_mb),
            show(tps),
            show(s * 1e3),
            if *n == 1 {
                "-".to_string()
            } else {
                format!("{}, {elements}", show(reduces / layers))
            },
        ]);
        rows.push(json!({
            "parallel": parallel.name(), "devices": n, "weight_mb_per_device": weights_mb,
            "prefill_tokens_per_s": tps, "decode_ms_per_step": s * 1e3,
            "step_all_reduces": reduces, "step_collective_elements": elements,
            "step_collectives": collectives.iter().map(|c| json!({
                "opcode": c.opcode, "computation": c.computation, "elements": c.elements,
            })).collect::<Vec<_>>(),
        }));
    }
    table.print();
    Ok(json!({"batch": BATCH, "prompt": PROMPT, "tokens": tokens, "rows": rows}))
}
