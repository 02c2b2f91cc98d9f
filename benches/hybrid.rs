//! Hybrid benchmark on a small Bamba-style shape (12 layers, 768 wide, a Mamba-2 mixer or, in
//! layers 3, 7 and 11, grouped-query attention, each followed by a gated MLP; vocab 50280;
//! random weights), beside the same shape with Mamba-2 mixers only, through the CPU plugin
//! that `Client::cpu()` resolves:
//!
//! 1. `context`: a prompt of 128, 512 and 2048 tokens: the prefill's tokens/s (a generation
//!    of one token: the prefill with the logits of the last position only), and the decode ms
//!    per token (`Hybrid::generate_stream`, greedy, 64 tokens in segments of 16, timed between
//!    segments, each segment one program call of 16 device-side steps). The
//!    attention layers read their whole key/value cache (prompt + capacity) every step, so the
//!    hybrid's step grows with the context; the Mamba-2-only shape's stays flat. The two
//!    shapes take turns run by run.
//! 2. `experts`: a Granite-style mixture of experts (8 experts, top 2, with a shared expert)
//!    decoding as above with each token's experts gathered (the default) and with every
//!    expert run densely, taking turns.
//!
//! Tables go to stdout, the figures to `target/bench/hybrid.json`.
//!
//! ```text
//! cargo bench --bench hybrid             # about 5 minutes on 2 cores
//! cargo bench --bench hybrid -- --quick  # 128 and 512 tokens, fewer runs
//! ```

mod common;

use std::time::Instant;

use anyhow::Result;
use common::{
    json_number, json_object, json_string, median, report_json, secs_since, sorted, write_report,
};
use stablegraph::models::hybrid::{Hybrid, HybridConfig, HybridWeights};
use stablegraph::models::mamba2::{Penalties, Sampling};
use stablegraph::models::GenerateOptions;
use stablegraph::runtime::Client;
use stablegraph::DType;

/// The Bamba-style shape, with attention in `attention` layers (none: Mamba-2 only).
fn bamba(attention: &[usize]) -> Result<HybridConfig> {
    let text = format!(
        r#"{{"model_type": "bamba", "vocab_size": 50280, "hidden_size": 768,
            "num_hidden_layers": 12, "attn_layer_indices": {attention:?},
            "num_attention_heads": 12, "num_key_value_heads": 4, "intermediate_size": 2048,
            "mamba_n_heads": 24, "mamba_d_head": 64, "mamba_n_groups": 1, "mamba_d_state": 64,
            "mamba_chunk_size": 256, "tie_word_embeddings": true}}"#
    );
    Ok(HybridConfig::from_json(&text)?)
}

/// A Granite-style shape with experts (8 of width 512, top 2, a shared expert of 1024).
fn granite() -> Result<HybridConfig> {
    let text = r#"{"model_type": "granitemoehybrid", "vocab_size": 50280, "hidden_size": 768,
        "num_hidden_layers": 12, "layer_types": ["mamba", "mamba", "mamba", "attention",
        "mamba", "mamba", "mamba", "attention", "mamba", "mamba", "mamba", "attention"],
        "num_attention_heads": 12, "num_key_value_heads": 4, "num_local_experts": 8,
        "num_experts_per_tok": 2, "intermediate_size": 512, "shared_intermediate_size": 1024,
        "mamba_n_heads": 24, "mamba_d_head": 64, "mamba_d_state": 64,
        "position_embedding_type": "rope", "tie_word_embeddings": true}"#;
    Ok(HybridConfig::from_json(text)?)
}

fn model(client: &Client, cfg: &HybridConfig) -> Result<Hybrid> {
    let weights = HybridWeights::random(cfg, DType::F32, 0)?;
    Ok(Hybrid::new(client, cfg.clone(), &weights)?)
}

/// A deterministic prompt of `len` tokens.
fn prompt(len: usize) -> Vec<Vec<u32>> {
    vec![(0..len).map(|i| ((i * 7919 + 13) % 50280) as u32).collect()]
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: n,
        sampling: Sampling::Greedy,
        eos: None,
        penalties: Penalties::NONE,
    }
}

/// The prefill (a generation of one token: the prefill with the logits of the last position
/// only, and one pick) in s, and the decode s per token: a stream of 64 tokens in segments of
/// 16, timed between the segments after the first (whose call holds the prefill), so that
/// the prefill's noise stays out of the decode figure.
fn time_once(m: &Hybrid, p: &[Vec<u32>]) -> Result<(f64, f64)> {
    let t = Instant::now();
    m.generate(p, &greedy(1))?;
    let prefill = secs_since(t);
    let mut marks = Vec::new();
    m.generate_stream(p, &greedy(64), 16, |_| {
        marks.push(Instant::now());
        true
    })?;
    let per_token: Vec<f64> = marks
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_secs_f64() / 16.0)
        .collect();
    Ok((prefill, median(&sorted(per_token))))
}

fn main() -> Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let (lens, runs): (&[usize], usize) = if quick {
        (&[128, 512], 2)
    } else {
        (&[128, 512, 2048], 3)
    };
    let client = Client::cpu()?;
    let t = Instant::now();
    let hybrid = model(&client, &bamba(&[3, 7, 11])?)?;
    let plain = model(&client, &bamba(&[])?)?;
    common::progress::note(format!("random weights + upload {:.1}s", secs_since(t)));
    let mut figures = Vec::new();
    println!("Bamba-style shape (12 layers, 768 wide, random weights), batch 1: prefill, and decode in a stream of 64 tokens in segments of 16 (median of {runs} runs, the shapes taking turns)");
    println!(
        "{:>6}  {:>22}  {:>22}  {:>22}  {:>22}",
        "prompt",
        "hybrid prefill tok/s",
        "Mamba-2 prefill tok/s",
        "hybrid decode ms/tok",
        "Mamba-2 decode ms/tok"
    );
    for &len in lens {
        let p = prompt(len);
        // First calls compile.
        time_once(&hybrid, &p)?;
        time_once(&plain, &p)?;
        let (mut h, mut m) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            h.push(time_once(&hybrid, &p)?);
            m.push(time_once(&plain, &p)?);
        }
        let med = |v: &[(f64, f64)], i: usize| {
            median(&sorted(
                v.iter().map(|x| if i == 0 { x.0 } else { x.1 }).collect(),
            ))
        };
        let (hp, hd, mp, md) = (med(&h, 0), med(&h, 1), med(&m, 0), med(&m, 1));
        println!(
            "{len:>6}  {:>22.1}  {:>22.1}  {:>22.2}  {:>22.2}",
            len as f64 / hp,
            len as f64 / mp,
            hd * 1e3,
            md * 1e3
        );
        for (shape, p, d) in [("hybrid", hp, hd), ("mamba2_only", mp, md)] {
            figures.push(json_object(&[
                ("section", json_string("context")),
                ("shape", json_string(shape)),
                ("prompt", json_number(len as f64)),
                ("prefill_tokens_per_s", json_number(len as f64 / p)),
                ("decode_ms_per_token", json_number(d * 1e3)),
            ]));
        }
    }
    figures.extend(experts_section(&client, runs)?);
    let json = report_json(
        &[("bench", "hybrid".into())],
        &[("quick", quick.to_string())],
        &figures,
    );
    let file = write_report(
        if quick {
            "hybrid-quick.json"
        } else {
            "hybrid.json"
        },
        &json,
    )?;
    println!("wrote {}", file.display());
    Ok(())
}

/// Decoding with gathered and with dense experts after a 128-token prompt, taking turns.
fn experts_section(client: &Client, runs: usize) -> Result<Vec<String>> {
    let cfg = granite()?;
    let weights = HybridWeights::random(&cfg, DType::F32, 0)?;
    let gathered = Hybrid::new(client, cfg.clone(), &weights)?;
    let dense = Hybrid::new(client, cfg, &weights)?.with_gathered_experts(false);
    let p = prompt(128);
    time_once(&gathered, &p)?;
    time_once(&dense, &p)?;
    let (mut g, mut d) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        g.push(time_once(&gathered, &p)?.1);
        d.push(time_once(&dense, &p)?.1);
    }
    let (g, d) = (median(&sorted(g)), median(&sorted(d)));
    println!(
        "Granite-style experts (8 x 512, top 2, shared 1024), batch 1, decode after 128 tokens: gathered {:.2} ms/token, dense {:.2} ms/token",
        g * 1e3,
        d * 1e3
    );
    Ok(["gathered", "dense"]
        .iter()
        .zip([g, d])
        .map(|(how, ms)| {
            json_object(&[
                ("section", json_string("experts")),
                ("experts", json_string(how)),
                ("decode_ms_per_token", json_number(ms * 1e3)),
            ])
        })
        .collect())
}
