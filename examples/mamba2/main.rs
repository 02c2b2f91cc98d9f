//! Mamba-2 from the command line: `generate` tokens and report throughput, `emit` the StableHLO
//! programs, `bench` generation, `train` a small byte-level model from scratch or fine-tune a
//! checkpoint of any family, or compute the `grad`ient of the loss on a prompt, `eval`uate its loss and perplexity on a text, or
//! `serve` many clients over HTTP.
//!
//! `cargo run --release --example mamba2 -- generate` (the README's main job) runs the small
//! byte-level model shipped in `models/mamba2-bytes/` (the default `train` run made it) on a
//! 128-byte prompt and generates 128 bytes; `--shape 130m` runs the 130M shape with seeded random
//! weights instead, and `--model DIR` loads an HF or `mamba_ssm` checkpoint of any family its
//! `config.json` names (Mamba-1 and the hybrids through `family`). `--help` on each subcommand
//! lists its flags.
//!
//! Modules: `load` (which model, the prompts, the sampling options), `text` (tokenizer or byte
//! vocabulary), `generate`, `bench` (and `emit`), `data` (training bytes and batches), `train`,
//! `tune` (`train --model`), `grad`, `eval`, `serve` (the HTTP server), `loadgen` (load on it), `plot` (the loss chart), `bars` (progress bars on
//! a terminal).

mod bars;
mod bench;
mod data;
mod eval;
mod family;
mod generate;
mod grad;
mod load;
mod loadgen;
mod open;
mod plot;
mod serve;
mod text;
mod train;
mod tune;

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use stablegraph::models::family::CausalLm;
use stablegraph::runtime::{self, Client, ClientOptions, XlaLogLevel};

use bench::{BenchArgs, EmitArgs};
use eval::EvalArgs;
use generate::GenerateArgs;
use grad::GradArgs;
use loadgen::LoadgenArgs;
use serve::ServeArgs;
use train::TrainArgs;

/// How the throughput figures are measured (shown by `generate --help` and `bench --help`).
const METHOD: &str = "\
Timing: `generate` runs once to compile (or load from the compile cache) and warm up, then again \
with the same inputs: the compile time is the first call minus the second. The prefill program \
(`Mamba2::prefill`) is likewise run once, then timed on a second call on the same prompts: \
prefill tokens/s = real (unpadded) prompt tokens / that time. It also computes the logits at \
every position and copies them to the host, which the prefill inside `generate` does not, so \
it overstates the prefill inside `generate` a little. Decode tokens/s = generated tokens / \
(second generate time - prefill time), slightly optimistic for that reason; the per-token \
latency is that difference / the number of decode steps (the longest row). Generated tokens count each row up to and including its \
first --eos. Peak RSS is VmHWM from /proc/self/status. Set STABLEGRAPH_CACHE=memory to measure \
a real compile every time.";

/// State-space models with stablegraph: generate, emit StableHLO, benchmark, evaluate, serve,
/// fine-tune and differentiate (Mamba-2, Mamba-1, Falcon-Mamba, Bamba, Granite 4.0-H,
/// Nemotron-H); train a byte-level Mamba-2 from scratch.
#[derive(Parser)]
#[command(name = "mamba2")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Show XLA's own log on stderr (info, warnings and errors). Without it only XLA's errors
    /// are shown, unless STABLEGRAPH_LOG (info, warning, error, off) or TF_CPP_MIN_LOG_LEVEL
    /// says otherwise.
    #[arg(long, global = true)]
    verbose: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Generate tokens after the prompts; print them (as text with a tokenizer or a byte
    /// vocabulary) and throughput.
    #[command(after_help = METHOD)]
    Generate(GenerateArgs),
    /// Write OUT_DIR/prefill.mlir, step.mlir and generate.mlir for the prompts' batch shape.
    Emit(EmitArgs),
    /// Run generate --repeat times and print a table of prefill and decode throughput (the
    /// 130M shape unless --model is given).
    #[command(after_help = METHOD)]
    Bench(BenchArgs),
    /// Train a small byte-level Mamba-2 from scratch on local files, or fine-tune a checkpoint
    /// of any family (--model DIR, the batch split over --devices); write the checkpoint, the
    /// loss curve as CSV and SVG.
    #[command(after_help = train::AFTER_HELP)]
    Train(TrainArgs),
    /// The gradient of the mean next-token cross-entropy over the prompts (plus the router loss
    /// a config asks for), for every weight of a checkpoint of any family, written as
    /// safetensors under the checkpoint's tensor names.
    Grad(GradArgs),
    /// The mean next-token cross-entropy and perplexity of a model of any family on a text (by
    /// default the crate's docs/, held out from the shipped model's training), with any
    /// --dtype: how much bf16 or 8-bit weights cost in quality.
    Eval(EvalArgs),
    /// An OpenAI-compatible HTTP server (POST /v1/completions, plain or streamed; GET
    /// /v1/models, /health, /metrics) decoding many requests at once by continuous batching.
    Serve(ServeArgs),
    /// Load on a completions server (this one or llama-server): Poisson arrivals or closed
    /// loops; throughput, time to first token, inter-token latency and goodput.
    Loadgen(LoadgenArgs),
}

fn main() {
    let cli = Cli::parse();
    if cli.verbose {
        // Before any plugin is loaded: XLA reads its log level as its library loads.
        runtime::set_xla_log_level(XlaLogLevel::Info);
    }
    let result = match cli.command {
        Command::Generate(a) => generate::generate(a),
        Command::Emit(a) => bench::emit(a),
        Command::Bench(a) => bench::bench(a),
        Command::Train(a) => train::train(a),
        Command::Grad(a) => grad::grad(a),
        Command::Eval(a) => eval::eval(a),
        Command::Serve(a) => serve::serve(a),
        Command::Loadgen(a) => loadgen::loadgen(a),
    };
    if let Err(e) = result {
        eprintln!("error: {}", one_line(&e));
        std::process::exit(1);
    }
}

/// The error and its causes on one line, skipping a cause its parent's message already quotes.
fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What progress lines start with: `mamba2`, or the family of the checkpoint being run once
/// it is known (`bamba`, `granite-4.0-h`, ...).
static SPEAKER: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// Progress lines from now on name `family` ("Granite 4.0-H" as `granite-4.0-h`).
pub(crate) fn speak_as(family: &str) {
    if let Ok(mut s) = SPEAKER.lock() {
        *s = family.to_lowercase().replace(' ', "-");
    }
}

/// The name progress lines start with.
pub(crate) fn speaker() -> String {
    match SPEAKER.lock() {
        Ok(s) if !s.is_empty() => s.clone(),
        _ => "mamba2".into(),
    }
}

/// The PJRT client of `plugin` (default: the XLA CPU plugin with `devices` devices), saying so
/// on stderr. `cuda` is JAX's CUDA plugin of the Python `STABLEGRAPH_PYTHON` names, created with
/// the options JAX's variables set (`XLA_PYTHON_CLIENT_PREALLOCATE`, ...); anything else is a
/// path.
pub(crate) fn client(plugin: Option<&std::path::Path>, devices: usize) -> anyhow::Result<Client> {
    progress("loading the PJRT plugin");
    match (plugin, devices) {
        (Some(p), _) if p.as_os_str() == runtime::cuda::CUDA_KEYWORD => {
            ClientOptions::from_env().and_then(|options| Client::cuda(&options))
        }
        (Some(path), _) => Client::from_plugin_path(path),
        (None, 1) => Client::cpu(),
        (None, n) => Client::cpu_with_devices(n),
    }
    .context("creating the PJRT client")
}

/// A progress line on stderr.
pub(crate) fn progress(what: &str) {
    eprintln!("{}: {what}...", speaker());
}

/// Seconds since `t`.
pub(crate) fn seconds(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

/// Compiles this process answered from the compile cache, in memory or on disk.
pub(crate) fn cache_hits(client: &Client) -> u64 {
    let s = client.cache_stats();
    s.memory_hits + s.disk_hits
}

/// Peak resident memory in MB (VmHWM), where /proc says it.
pub(crate) fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Token ids as `1,2,3`.
pub(crate) fn ids_text(row: &[u32]) -> String {
    row.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// Writes `value` (an object) as pretty JSON to `path` with what every run reports besides:
/// the matrices' `dtype`, the model's `weight_bytes` and the process's `peak_rss_mb`.
pub(crate) fn write_run_json(
    path: &Path,
    mut value: serde_json::Value,
    model: &dyn CausalLm,
) -> Result<()> {
    if let Some(object) = value.as_object_mut() {
        object.insert(
            "dtype".into(),
            load::dtype_name(model.matmul_dtype()).into(),
        );
        object.insert("weight_bytes".into(), model.weight_bytes().into());
        object.insert("peak_rss_mb".into(), peak_rss_mb().into());
    }
    write_json(path, &value)
}

/// Writes `value` as pretty JSON to `path`, creating its directory.
pub(crate) fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}
