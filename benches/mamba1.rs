//! Mamba-1 benchmark on the 130M-class shape (24 layers, 768 wide, state 16, vocab 50280; random
//! weights), through the CPU plugin that `Client::cpu()` resolves:
//!
//! 1. `prefill`: one prompt of 128, 512 and 2048 tokens, the selective scan as a log-depth
//!    associative scan (`Scan::Associative`) and as a `fori_loop` over positions (`Scan::Loop`,
//!    the CPU's default), the two taking turns run by run; their logits are compared before
//!    anything is reported;
//! 2. `step`: `Mamba1::step` at batch 1 after a 128-token prompt, per-token latency over 32
//!    steps (a host loop: each step uploads the token and the states and downloads the logits
//!    and the states);
//! 3. `generate`: device-side decoding (the shared decode loop) after a 128-token prompt:
//!    `Mamba1::generate_stream`, greedy, 64 tokens in segments of 16 steps, timed between the
//!    segments after the first: ms per token.
//!
//! Tables go to stdout, the figures to `target/bench/mamba1.json`.
//!
//! ```text
//! cargo bench --bench mamba1             # about 5 minutes on 2 cores
//! cargo bench --bench mamba1 -- --quick  # 128 and 512 tokens, fewer runs
//! ```

mod common;

use std::time::Instant;

use anyhow::{ensure, Result};
use common::{
    json_number, json_object, json_string, median, quantile, report_json, secs_since, sorted,
    write_report,
};
use stablegraph::models::mamba1::{Mamba1, Mamba1Config, Mamba1Weights, Scan};
use stablegraph::models::mamba2::{Penalties, Sampling};
use stablegraph::models::GenerateOptions;
use stablegraph::runtime::Client;
use stablegraph::DType;

/// The Mamba-1 130M shape (state-spaces/mamba-130m-hf).
fn shape() -> Mamba1Config {
    Mamba1Config {
        hidden_size: 768,
        num_layers: 24,
        state_size: 16,
        d_inner: 1536,
        conv_kernel: 4,
        time_step_rank: 48,
        vocab_size: 50280,
        norm_eps: 1e-5,
        tie_word_embeddings: true,
        use_bias: false,
        use_conv_bias: true,
        mixer_rms_eps: None,
    }
}

/// A deterministic prompt of `len` tokens.
fn prompt(len: usize) -> Vec<Vec<u32>> {
    vec![(0..len).map(|i| ((i * 7919 + 13) % 50280) as u32).collect()]
}

fn main() -> Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let (lens, runs): (&[usize], usize) = if quick {
        (&[128, 512], 2)
    } else {
        (&[128, 512, 2048], 3)
    };
    let client = Client::cpu()?;
    let cfg = shape();
    let t = Instant::now();
    let weights = Mamba1Weights::random(&cfg, DType::F32, 0)?;
    let assoc = Mamba1::new(&client, cfg.clone(), &weights)?.with_scan(Scan::Associative);
    let looped = Mamba1::new(&client, cfg.clone(), &weights)?.with_scan(Scan::Loop);
    common::progress::note(format!("random weights + upload {:.1}s", secs_since(t)));
    let mut figures = prefill_section(&assoc, &looped, lens, runs)?;
    figures.push(step_section(&looped)?);
    figures.push(generate_section(&looped, runs)?);
    let json = report_json(
        &[("bench", "mamba1".into())],
        &[("quick", quick.to_string())],
        &figures,
    );
    let file = write_report(
        if quick {
            "mamba1-quick.json"
        } else {
            "mamba1.json"
        },
        &json,
    )?;
    println!("wrote {}", file.display());
    Ok(())
}

/// Prefill at each of `lens` with both scans, `runs` times each taking turns, after checking
/// that their logits agree: prints the table, returns the figures.
fn prefill_section(
    assoc: &Mamba1,
    looped: &Mamba1,
    lens: &[usize],
    runs: usize,
) -> Result<Vec<String>> {
    let mut figures = Vec::new();
    println!("Mamba-1 130M shape (random weights), batch 1, prefill: logits at every position and the states (median of {runs} runs, the scans taking turns)");
    println!(
        "{:>6}  {:>16}  {:>16}  {:>12}  {:>16}",
        "prompt", "associative ms", "loop ms", "loop/assoc", "max |dlogit|"
    );
    for &len in lens {
        let p = prompt(len);
        // First calls compile; their outputs are the comparison.
        let a = assoc.prefill(&p)?;
        let l = looped.prefill(&p)?;
        let diff = a
            .logits
            .to_f64_vec()
            .iter()
            .zip(l.logits.to_f64_vec())
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        ensure!(
            diff < 1e-3,
            "prompt {len}: the scans' logits differ by {diff}"
        );
        let (mut ta, mut tl) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let t = Instant::now();
            assoc.prefill(&p)?;
            ta.push(secs_since(t));
            let t = Instant::now();
            looped.prefill(&p)?;
            tl.push(secs_since(t));
        }
        let (ma, ml) = (median(&sorted(ta)), median(&sorted(tl)));
        println!(
            "{len:>6}  {:>16.1}  {:>16.1}  {:>11.2}x  {diff:>16.2e}",
            ma * 1e3,
            ml * 1e3,
            ml / ma
        );
        for (scan, m) in [("associative", ma), ("loop", ml)] {
            figures.push(json_object(&[
                ("section", json_string("prefill")),
                ("scan", json_string(scan)),
                ("prompt", json_number(len as f64)),
                ("ms", json_number(m * 1e3)),
                ("tokens_per_s", json_number(len as f64 / m)),
            ]));
        }
    }
    Ok(figures)
}

/// The host-loop step at batch 1 after a 128-token prompt: P50 and P99 over 32 steps.
fn step_section(model: &Mamba1) -> Result<String> {
    let mut states = model.prefill(&prompt(128))?.states;
    let mut times = Vec::new();
    let mut token = 1u32;
    for i in 0..33 {
        let t = Instant::now();
        let (logits, next) = model.step(&[token], &states)?;
        if i > 0 {
            times.push(secs_since(t)); // the first call compiles
        }
        states = next;
        let v = logits.to_f64_vec();
        token = (0..v.len()).fold(0, |best, j| if v[j] > v[best] { j } else { best }) as u32;
    }
    let times = sorted(times);
    let (p50, p99) = (median(&times), quantile(&times, 0.99));
    println!(
        "step (host loop, batch 1, after 128 tokens): P50 {:.2} ms, P99 {:.2} ms, {:.1} tokens/s",
        p50 * 1e3,
        p99 * 1e3,
        1.0 / p50
    );
    Ok(json_object(&[
        ("section", json_string("step")),
        ("p50_ms", json_number(p50 * 1e3)),
        ("p99_ms", json_number(p99 * 1e3)),
    ]))
}

/// Device-side decoding after a 128-token prompt: a stream of 64 tokens in segments of 16
/// (`Mamba1::generate_stream`, each segment one program call of 16 steps), timed between the
/// segments after the first (whose call holds the prefill); the median ms per token over `runs`
/// streams.
fn generate_section(model: &Mamba1, runs: usize) -> Result<String> {
    let p = prompt(128);
    let options = GenerateOptions {
        max_new_tokens: 64,
        sampling: Sampling::Greedy,
        eos: None,
        penalties: Penalties::NONE,
    };
    let mut per_token = Vec::new();
    for run in 0..=runs {
        let mut marks = Vec::new();
        model.generate_stream(&p, &options, 16, |_| {
            marks.push(Instant::now());
            true
        })?;
        if run > 0 {
            // The first stream compiles.
            per_token.extend(
                marks
                    .windows(2)
                    .map(|w| w[1].duration_since(w[0]).as_secs_f64() / 16.0),
            );
        }
    }
    let ms = median(&sorted(per_token)) * 1e3;
    println!(
        "decode on the device (segments of 16 steps, batch 1, after 128 tokens): {ms:.2} ms per token, {:.1} tokens/s",
        1e3 / ms
    );
    Ok(json_object(&[
        ("section", json_string("generate")),
        ("decode_ms_per_token", json_number(ms)),
    ]))
}
