//! Mamba-2 benchmark on the 130M shape (`Mamba2Config::mamba2_130m()`, random weights; the
//! `sizes` section also the paper's larger ones), through
//! the CPU PJRT plugin that `Client::cpu()` resolves. Sections, in order of the report:
//!
//! 1. `ceilings`: the machine through the same plugin: f32 matrix-vector read bandwidth over a
//!    512 MiB matrix (both layouts) and f32 matmul FLOP/s (2048³), as in `benches/runtime.rs`
//!    (both use `benches/common/ceilings.rs`);
//! 2. `prefill`: tokens/s at prompt lengths 128, 512 and 2048, f32 and bf16, batch 1 and 8
//!    (batch 8 at 2048 timed once). The timed program is what `generate` runs before its loop
//!    (`Mamba2::prefill`): the chunked SSD over the prompt (padded to its bucket), the final
//!    states and the last position's logits, downloaded;
//! 3. `decode`: (a) the on-device loop (`Mamba2::generate`, greedy, after a 128-token prompt):
//!    time per step = (generate time - prefill time) / tokens, one figure per run (a device loop
//!    has no per-token host timestamps), so its P50/P99 are over repeated runs; (b) a host loop
//!    calling `Mamba2::step` once per token with a host argmax: real per-token latencies, P50/P99
//!    over the 256 steps ending at each context (256, 1024, 4096; bf16 only to the first);
//!    (c) recomputation without a cache: for each new token the whole prefix is prefilled again
//!    (the prefill of 2., last logits only) and the argmax taken on the host; a few tokens per
//!    context, whose logits are checked against (b)'s; other contexts are interpolated from the
//!    prefill times;
//! 4. `ssd`: the chunked SSD (`ssd::ssd_chunked`, static masks; chunks 256, 128 and 64) against
//!    the same scan as a `fori_loop` over positions (`ssd::ssd_recurrent`) on one layer's inputs
//!    of the 130M shape, outputs checked against each other;
//! 5. `precision`: the largest logit difference of bf16 matrices against f32, and of the SSD's
//!    decay arithmetic in bf16 (`Mamba2Config::scan_dtype`) against f32, over a prefill and
//!    decode steps;
//! 6. `memory`: peak resident memory (VmHWM) of a child process (this binary again) per number
//!    of generated tokens (128, 1024, 4096); the child compiles first, then resets the
//!    high-water mark, so the run's own peak is reported too;
//! 7. `compile`: cold compile of the step and generate programs against a warm start from the
//!    disk cache in a fresh client;
//! 8. `devices`: the model over 1, 2 and 4 devices of a 4-device CPU client, split by heads and
//!    by the batch: weights per device, prefill and decode times (overhead on this machine,
//!    whose "devices" share its cores), and the collectives in the step program;
//! 9. `sizes`: the paper's five sizes (130M to 2.7B, random weights) with f32, bf16 and 8-bit
//!    matrices, one child process each: prefill tokens/s at 512, decode ms/token and its share
//!    of the read bandwidth, peak RSS, and the decode run's own peak at two lengths; a setting
//!    that would not fit the memory available is reported as such (about 20 minutes; `--quick`:
//!    130M and 370M);
//! 10. `train`: the training step of the small byte-level model (`Mamba2Config::byte_level(4,
//!     128)`, 8 x 256 bytes, AdamW) in child processes: compile time, ms per step, tokens/s and
//!     peak memory with one and four optimizer steps per program call, against PyTorch (HF's
//!     pure-torch `Mamba2ForCausalLM`, `scripts/torch_train_bench.py`) in the same run when a
//!     Python with torch is found.
//!
//! Utilisation: decode bytes read per step (every weight once, the tied embedding as the head,
//! plus the recurrent state of each row) x steps/s over the measured `[out, in]` read bandwidth;
//! prefill FLOPs per token (see [`prefill::prefill_flops_per_token`]) x tokens/s over the measured matmul
//! FLOP/s. A summary compares them with the issue's targets. Tables go to stdout, everything to
//! `target/bench/mamba2.json`, and per-token decode latency against position to
//! `target/bench/decode_latency.svg` (`-quick` names with `--quick`).
//!
//! ```text
//! cargo bench --bench mamba2                      # the full run (about 35 minutes on 2 cores)
//! cargo bench --bench mamba2 -- --quick           # shorter lengths, fewer repetitions
//! cargo bench --bench mamba2 -- --only ssd,memory # some sections (plus what they need)
//! ```
//!
//! One module per section (`ceilings.rs` ... `compile.rs`; decode's host loop and recomputation
//! in `host_loop.rs`), with `plan.rs` (sizes and
//! repetitions), `context.rs` (the models, prompts and figures the sections share), `table.rs`,
//! `plot.rs` (the latency SVG) and `summary.rs`; timing, statistics, JSON, `/proc` reading and
//! the progress bars (on a terminal: one over the sections, one per timed loop) come from
//! `benches/common`.

#[path = "../common/mod.rs"]
mod common;

mod ceilings;
mod compile;
mod context;
mod decode;
mod devices;
mod host_loop;
mod memory;
mod plan;
mod plot;
mod precision;
mod prefill;
mod sizes;
mod ssd;
mod summary;
mod table;
mod train;

use std::time::Instant;

use anyhow::{ensure, Context, Result};
use common::{progress, secs_since, write_report};
use context::Ctx;
use plan::Plan;
use serde_json::{json, Value};
use stablegraph::runtime::{Client, CompileCache};

/// Set in a child process: generate this many tokens and report peak memory.
const MEMORY_CHILD_ENV: &str = "STABLEGRAPH_BENCH_MAMBA2_MEMORY_TOKENS";
/// Set in a child process: measure one size (`size,dtype,short,long,reps`, see `sizes.rs`).
const SIZES_CHILD_ENV: &str = "STABLEGRAPH_BENCH_MAMBA2_SIZE";
/// Set in a child process: time the training step (`micro_steps,calls`).
const TRAIN_CHILD_ENV: &str = "STABLEGRAPH_BENCH_MAMBA2_TRAIN";
/// Seed of the random weights.
const SEED: u64 = 0;
/// Prompt length of the decode measurements.
const DECODE_PROMPT: usize = 128;

/// A section of the report: it records figures in the context and returns its JSON.
type Section = fn(&mut Ctx) -> Result<Value>;

/// The sections, in the order they run and report.
const SECTIONS: [(&str, Section); 10] = [
    ("ceilings", ceilings::bench),
    ("prefill", prefill::bench),
    ("decode", decode::bench),
    ("ssd", ssd::bench),
    ("precision", precision::bench),
    ("memory", memory::bench),
    ("compile", compile::bench),
    ("devices", devices::bench),
    ("sizes", sizes::bench),
    ("train", train::bench),
];

/// The command line: `--quick`, `--only a,b`.
struct Args {
    quick: bool,
    only: Vec<String>,
}

fn parse_args() -> Result<Args> {
    // Cargo passes `--bench` to harness-less benches.
    let mut args = std::env::args().skip(1);
    let mut out = Args {
        quick: false,
        only: SECTIONS.iter().map(|(s, _)| s.to_string()).collect(),
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => out.quick = true,
            "--only" => {
                let list = args.next().context("--only needs a list of sections")?;
                out.only = list.split(',').map(str::to_string).collect();
                for s in &out.only {
                    ensure!(
                        SECTIONS.iter().any(|(name, _)| name == s),
                        "unknown section {s}; sections: {}",
                        SECTIONS.map(|(name, _)| name).join(", ")
                    );
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

fn main() -> Result<()> {
    if let Ok(tokens) = std::env::var(MEMORY_CHILD_ENV) {
        return memory::child(tokens.parse()?);
    }
    if let Ok(arg) = std::env::var(SIZES_CHILD_ENV) {
        return sizes::child(&arg);
    }
    if let Ok(arg) = std::env::var(TRAIN_CHILD_ENV) {
        return train::child(&arg);
    }
    let args = parse_args()?;
    let start = Instant::now();
    let client = Client::cpu()?;
    // Every program is compiled here, not loaded from (or written to) the user's disk cache.
    client.set_compile_cache(CompileCache::memory_only());
    let mut ctx = Ctx::new(Plan::new(args.quick), client);
    let plugin = ctx.client.plugin().path().display().to_string();
    println!(
        "stablegraph Mamba-2 bench{}: 130M shape, random weights; plugin {plugin}",
        if args.quick { " (--quick)" } else { "" }
    );
    let mut report = serde_json::Map::new();
    report.insert("plugin".into(), json!(plugin));
    report.insert("quick".into(), json!(args.quick));
    let chosen: Vec<(&str, Section)> = SECTIONS
        .into_iter()
        .filter(|(name, _)| args.only.iter().any(|s| s == name))
        .collect();
    // On a terminal, a bar over the sections (they differ too much in length for a time left:
    // the timed runs inside them have their own bars).
    let bar = progress::ticking(progress::bar(
        chosen.len() as u64,
        "{elapsed} [{wide_bar}] section {pos}/{len}: {msg}",
    ));
    for (name, run) in chosen {
        let t = Instant::now();
        bar.set_message(name);
        progress::note(format!("[{name}]"));
        let value = run(&mut ctx).with_context(|| format!("section {name}"))?;
        let s = secs_since(t);
        bar.inc(1);
        progress::note(format!("[{name}] {s:.0}s"));
        report.insert(name.into(), json!({"seconds": s, "result": value}));
    }
    progress::done(&bar);
    report.insert("summary".into(), summary::summary(&ctx));
    let total = secs_since(start);
    report.insert("total_seconds".into(), json!(total));
    let file = write_report(
        if args.quick {
            "mamba2-quick.json"
        } else {
            "mamba2.json"
        },
        &serde_json::to_string_pretty(&Value::Object(report))?,
    )?;
    println!("\nwrote {} ({total:.0}s in all)", file.display());
    Ok(())
}
