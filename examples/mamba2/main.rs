//! Mamba-2 from the command line: `generate` tokens and report throughput, `emit` the StableHLO
//! programs, or `bench` generation.
//!
//! `cargo run --release --example mamba2 -- generate` (the README's main job) runs the 130M
//! shape with seeded random weights on a 128-token prompt and generates 128 tokens. `--model DIR`
//! loads an HF or `mamba_ssm` checkpoint instead. `--help` on each subcommand lists its flags.

use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, ensure, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::json;
use stablegraph::models::mamba2::{
    GenerateOptions, LoadOptions, Mamba2, Mamba2Config, Mamba2State, Mamba2Weights, Parallel,
    Prefill, Sampling,
};
use stablegraph::runtime::Client;
use stablegraph::DType;
use tokenizers::Tokenizer;

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

/// Mamba-2 inference with stablegraph: generate, emit StableHLO, benchmark.
#[derive(Parser)]
#[command(name = "mamba2")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate tokens after the prompts; print them (as text with a tokenizer) and throughput.
    #[command(after_help = METHOD)]
    Generate(GenerateArgs),
    /// Write OUT_DIR/prefill.mlir, step.mlir and generate.mlir for the prompts' batch shape.
    Emit(EmitArgs),
    /// Run generate --repeat times and print a table of prefill and decode throughput.
    #[command(after_help = METHOD)]
    Bench(BenchArgs),
}

/// Which model, in which precision, on which plugin.
#[derive(Args)]
struct ModelArgs {
    /// Checkpoint directory (HF or mamba_ssm): config.json, *.safetensors, and tokenizer.json
    /// when present. Without it: the 130M shape with seeded random weights.
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// Matrix dtype: bf16 keeps the matrices and their products in bf16, the rest in f32.
    #[arg(long, value_enum, default_value_t = Precision::F32)]
    dtype: Precision,
    /// Seed of the random weights (without --model).
    #[arg(long, default_value_t = 0)]
    weights_seed: u64,
    /// PJRT plugin shared object (default: the XLA CPU plugin, resolved as the README says).
    #[arg(long, value_name = "PATH")]
    plugin: Option<PathBuf>,
    /// How bf16 matrices enter their products: `on` as bf16 dots, `off` converted to f32 in
    /// the program first, `auto` by platform and processor (see `Mamba2::bf16_dots`).
    #[arg(long, value_enum, default_value_t = Bf16Dots::Auto)]
    bf16_dots: Bf16Dots,
    /// SSD chunk of the prefill (default: chosen per platform and prompt length, see
    /// `Mamba2::prefill_chunk`); prompts are padded to a multiple of it.
    #[arg(long, value_name = "N")]
    prefill_chunk: Option<usize>,
    /// Load a --model checkpoint even if some tensors hold NaN or infinite values (by default
    /// it is refused, naming them); for debugging such weights.
    #[arg(long)]
    allow_nonfinite: bool,
    /// Run every program over N devices as one SPMD program (on the CPU plugin, a client with
    /// N devices); the split is --parallel's.
    #[arg(long, value_name = "N", default_value_t = 1)]
    devices: usize,
    /// How the model is split over --devices: `heads` (tensor parallel: each device holds
    /// 1/N of the heads and of the projections) or `batch` (data parallel: each device holds
    /// every weight and 1/N of the rows). The head count, or the batch, must divide by N.
    #[arg(long, value_enum, default_value_t = ParallelArg::Heads)]
    parallel: ParallelArg,
}

#[derive(Clone, Copy, ValueEnum)]
enum ParallelArg {
    Heads,
    Batch,
}

impl ParallelArg {
    fn kind(self) -> Parallel {
        match self {
            ParallelArg::Heads => Parallel::Heads,
            ParallelArg::Batch => Parallel::Batch,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Bf16Dots {
    Auto,
    On,
    Off,
}

#[derive(Clone, Copy, ValueEnum)]
enum Precision {
    F32,
    Bf16,
}

/// The prompts.
#[derive(Args)]
struct PromptArgs {
    /// Prompt text, encoded with DIR/tokenizer.json (needs --model).
    #[arg(long, conflicts_with = "prompt_ids")]
    prompt: Option<String>,
    /// Prompt token ids, comma-separated; `;` separates the prompts of a batch: `1,2,3;4,5`.
    /// Prompts of different lengths are left-padded and masked.
    #[arg(long, value_name = "IDS")]
    prompt_ids: Option<String>,
    /// Length of the default prompt: deterministic pseudo-random ids, used when neither
    /// --prompt nor --prompt-ids is given.
    #[arg(long, default_value_t = 128, value_name = "N")]
    prompt_len: usize,
    /// Repeat the prompt (all of them, with --prompt-ids groups) N times: N times the rows.
    #[arg(long, default_value_t = 1, value_name = "N")]
    batch: usize,
}

/// Generation options.
#[derive(Args)]
struct SamplingArgs {
    /// New tokens per row.
    #[arg(long, default_value_t = 128, value_name = "N")]
    max_new_tokens: usize,
    /// Sampling temperature; absent or 0: greedy (--top-k, --top-p and --seed are then unused).
    #[arg(long)]
    temperature: Option<f32>,
    /// Sample among the k most likely tokens only (0: all).
    #[arg(long, default_value_t = 0, value_name = "K")]
    top_k: usize,
    /// Sample from the smallest set of tokens whose probability reaches P (1: all).
    #[arg(long, default_value_t = 1.0, value_name = "P")]
    top_p: f32,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// End-of-sequence token id: a row stops after emitting it.
    #[arg(long, value_name = "ID")]
    eos: Option<u32>,
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Write {"tokens": [[new tokens of each row]], "prompt_len", "prefill_tokens_per_s",
    /// "decode_tokens_per_s", "compile_s", "compiles" (XLA compiles this process ran),
    /// "cache_hits", "peak_rss_mb", ...} to FILE (rows cut after --eos).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write the prompt logits to FILE.npy as float32 [batch, L, vocab], L the longest prompt:
    /// row r's prompt fills its last prompt_len[r] positions, the positions before it (left
    /// padding of a shorter prompt) are 0.
    #[arg(long, value_name = "FILE")]
    dump_logits: Option<PathBuf>,
    /// Print the text as it is produced (segments of 16 tokens; one row, with a tokenizer).
    /// Default: on when stdout is a terminal and there is a tokenizer. Streaming runs generate
    /// once (compile included) and prints no throughput; use `bench` for figures.
    #[arg(long, conflicts_with = "no_stream")]
    stream: bool,
    /// Never stream (print the rows at the end, with timings).
    #[arg(long)]
    no_stream: bool,
    /// Continue from the state in FILE (written by --state-out; one row per prompt): the
    /// prompt is fed after whatever made it, e.g. the next turn of a conversation.
    #[arg(long, value_name = "FILE")]
    state_in: Option<PathBuf>,
    /// Write the state after the prompt and the generated tokens to FILE (safetensors), for
    /// a later --state-in. With --state-in or --state-out, generate runs once (compile
    /// included) and prints no throughput.
    #[arg(long, value_name = "FILE")]
    state_out: Option<PathBuf>,
}

#[derive(Args)]
struct EmitArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Output directory (created if missing).
    #[arg(long, value_name = "DIR")]
    out_dir: PathBuf,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Timed runs after the compiling one.
    #[arg(long, default_value_t = 5, value_name = "N")]
    repeat: usize,
    /// Write every run and the medians as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(a) => generate(a),
        Command::Emit(a) => emit(a),
        Command::Bench(a) => bench(a),
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

/// A model on the device with its prompts.
struct Loaded {
    client: Client,
    model: Mamba2,
    tokenizer: Option<Tokenizer>,
    prompts: Vec<Vec<u32>>,
    options: GenerateOptions,
    description: String,
}

impl Loaded {
    /// With several devices, a line saying how the model is split and the weights per device.
    fn print_devices(&self) {
        if let Some(p) = self.model.parallel() {
            println!(
                "devices   {} ({}), weights {:.0} MB per device",
                self.model.devices(),
                p.name(),
                self.model.weight_bytes_per_device() as f64 / 1e6
            );
        }
    }

    /// `"heads"`, `"batch"`, or null on one device.
    fn parallel_name(&self) -> Option<&'static str> {
        self.model.parallel().map(Parallel::name)
    }

    fn prompt_tokens(&self) -> usize {
        self.prompts.iter().map(Vec::len).sum()
    }

    fn shape(&self) -> (usize, usize) {
        let longest = self.prompts.iter().map(Vec::len).max().unwrap_or(0);
        let bucket = self.model.prompt_bucket(longest).unwrap_or(longest);
        (self.prompts.len(), bucket)
    }
}

/// Reads the config, tokenizer, prompts and options (checking them before anything slow), then
/// creates the client and uploads the weights.
fn load(m: &ModelArgs, p: &PromptArgs, s: &SamplingArgs) -> Result<Loaded> {
    let config = match &m.model {
        Some(dir) => {
            ensure!(dir.is_dir(), "--model {}: not a directory", dir.display());
            Mamba2Config::from_file(dir.join("config.json"))
                .with_context(|| format!("--model {}", dir.display()))?
        }
        None => Mamba2Config::mamba2_130m(),
    };
    let tokenizer_path = m.model.as_ref().map(|d| d.join("tokenizer.json"));
    let tokenizer = match &tokenizer_path {
        Some(path) if path.is_file() => {
            Some(Tokenizer::from_file(path).map_err(|e| anyhow!("{}: {e}", path.display()))?)
        }
        _ => None,
    };
    let vocab = config.vocab_size;
    let options = s.options(vocab)?;
    let prompts = match (&p.prompt, &p.prompt_ids) {
        (Some(text), _) => {
            let Some(tok) = &tokenizer else {
                match &tokenizer_path {
                    Some(path) => bail!(
                        "--prompt needs a tokenizer, and {} does not exist (use --prompt-ids)",
                        path.display()
                    ),
                    None => bail!(
                        "--prompt needs --model DIR with a tokenizer.json (or use --prompt-ids)"
                    ),
                }
            };
            let ids = tok
                .encode(text.as_str(), true)
                .map_err(|e| anyhow!("encoding --prompt: {e}"))?
                .get_ids()
                .to_vec();
            ensure!(!ids.is_empty(), "--prompt encodes to no tokens");
            vec![ids]
        }
        (None, Some(ids)) => parse_prompt_ids(ids)?,
        (None, None) => {
            ensure!(p.prompt_len > 0, "--prompt-len must be at least 1");
            vec![default_prompt(p.prompt_len, vocab)]
        }
    };
    ensure!(p.batch > 0, "--batch must be at least 1");
    let prompts: Vec<Vec<u32>> = (0..p.batch).flat_map(|_| prompts.clone()).collect();
    ensure!(m.devices > 0, "--devices must be at least 1");
    match m.parallel {
        ParallelArg::Heads => ensure!(
            config.num_heads.is_multiple_of(m.devices),
            "--devices {} --parallel heads: the model's {} heads do not divide into {} equal parts",
            m.devices,
            config.num_heads,
            m.devices
        ),
        ParallelArg::Batch => ensure!(
            prompts.len().is_multiple_of(m.devices),
            "--devices {} --parallel batch: {} rows do not divide into {} equal parts (set \
             --batch or the prompts to a multiple of {})",
            m.devices,
            prompts.len(),
            m.devices,
            m.devices
        ),
    }
    for (r, row) in prompts.iter().enumerate() {
        if let Some(bad) = row.iter().find(|&&t| t as usize >= vocab) {
            bail!("token id {bad} (prompt {r}) is outside the vocabulary of {vocab}");
        }
    }

    progress("loading the PJRT plugin");
    let client = match (&m.plugin, m.devices) {
        (Some(path), _) => Client::from_plugin_path(path),
        (None, 1) => Client::cpu(),
        (None, n) => Client::cpu_with_devices(n),
    }
    .context("creating the PJRT client")?;
    let dtype = match m.dtype {
        Precision::F32 => DType::F32,
        Precision::Bf16 => DType::BF16,
    };
    let (weights, source) = match &m.model {
        Some(dir) => {
            progress(&format!("loading weights from {}", dir.display()));
            let options = LoadOptions {
                allow_nonfinite: m.allow_nonfinite,
            };
            let w = Mamba2Weights::load_with(dir, &config, dtype, &options).map_err(|e| {
                let hint = if e.to_string().contains("NaN or infinite") {
                    " (--allow-nonfinite loads it anyway)"
                } else {
                    ""
                };
                anyhow::Error::new(e).context(format!("--model {}{hint}", dir.display()))
            })?;
            (w, dir.display().to_string())
        }
        None => {
            progress("drawing random weights for the 130M shape");
            let w = Mamba2Weights::random(&config, dtype, m.weights_seed)?;
            let source = format!("130M shape, random weights (seed {})", m.weights_seed);
            (w, source)
        }
    };
    let mut description = format!(
        "{source}: {} layers, {} wide, vocab {}, {} matrices",
        config.num_layers,
        config.hidden_size,
        config.vocab_size,
        dtype.mlir_name()
    );
    if m.devices > 1 {
        let how = match m.parallel {
            ParallelArg::Heads => "heads",
            ParallelArg::Batch => "batch",
        };
        description.push_str(&format!(", over {} devices by {how}", m.devices));
    }
    progress("uploading the weights");
    let bf16_dots = match m.bf16_dots {
        Bf16Dots::Auto => None,
        Bf16Dots::On => Some(true),
        Bf16Dots::Off => Some(false),
    };
    let model = Mamba2::new_parallel(&client, config, &weights, m.parallel.kind(), m.devices)?
        .with_prefill_chunk(m.prefill_chunk)?
        .with_bf16_dots(bf16_dots);
    Ok(Loaded {
        client,
        model,
        tokenizer,
        prompts,
        options,
        description,
    })
}

/// Parses `1,2,3;4,5` into prompts.
fn parse_prompt_ids(text: &str) -> Result<Vec<Vec<u32>>> {
    text.split(';')
        .map(|group| {
            let ids = group
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| {
                    s.parse::<u32>()
                        .with_context(|| format!("--prompt-ids: {s:?} is not a token id"))
                })
                .collect::<Result<Vec<u32>>>()?;
            ensure!(!ids.is_empty(), "--prompt-ids: empty prompt in {text:?}");
            Ok(ids)
        })
        .collect()
}

/// `len` deterministic pseudo-random ids below `vocab` (SplitMix64 from a fixed seed).
fn default_prompt(len: usize, vocab: usize) -> Vec<u32> {
    let mut state = 0x5EED_u64;
    (0..len)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) % vocab as u64) as u32
        })
        .collect()
}

impl SamplingArgs {
    fn options(&self, vocab: usize) -> Result<GenerateOptions> {
        ensure!(
            self.max_new_tokens > 0,
            "--max-new-tokens must be at least 1"
        );
        if let Some(e) = self.eos {
            ensure!(
                (e as usize) < vocab,
                "--eos {e} is outside the vocabulary of {vocab}"
            );
        }
        let sampling = match self.temperature {
            None | Some(0.0) => Sampling::Greedy,
            Some(temperature) => {
                ensure!(
                    temperature > 0.0 && temperature.is_finite(),
                    "--temperature must be a positive number (or 0 for greedy)"
                );
                ensure!(
                    self.top_p > 0.0 && self.top_p <= 1.0,
                    "--top-p must be in (0, 1]"
                );
                ensure!(
                    self.top_k <= vocab,
                    "--top-k {} exceeds the vocabulary of {vocab}",
                    self.top_k
                );
                Sampling::Sample {
                    temperature,
                    top_k: self.top_k,
                    top_p: self.top_p,
                    seed: self.seed,
                }
            }
        };
        Ok(GenerateOptions {
            max_new_tokens: self.max_new_tokens,
            sampling,
            eos: self.eos,
        })
    }
}

fn progress(what: &str) {
    eprintln!("mamba2: {what}...");
}

fn seconds(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

/// Each row's tokens up to and including its first `eos`.
fn cut_at_eos(rows: Vec<Vec<u32>>, eos: Option<u32>) -> Vec<Vec<u32>> {
    rows.into_iter()
        .map(|mut row| {
            if let Some(end) = eos.and_then(|e| row.iter().position(|&t| t == e)) {
                row.truncate(end + 1);
            }
            row
        })
        .collect()
}

/// One timed prefill and one timed generate, both already compiled.
struct Timed {
    prefill_s: f64,
    generate_s: f64,
    tokens: Vec<Vec<u32>>,
}

impl Timed {
    fn run(l: &Loaded, options: &GenerateOptions) -> Result<Timed> {
        let t = Instant::now();
        drop(l.model.prefill(&l.prompts).context("prefill")?);
        let prefill_s = seconds(t);
        let t = Instant::now();
        let tokens = l.model.generate(&l.prompts, options).context("generate")?;
        let generate_s = seconds(t);
        Ok(Timed {
            prefill_s,
            generate_s,
            tokens: cut_at_eos(tokens, options.eos),
        })
    }

    fn generated(&self) -> usize {
        self.tokens.iter().map(Vec::len).sum()
    }

    fn decode_s(&self) -> Option<f64> {
        Some(self.generate_s - self.prefill_s).filter(|&d| d > 0.0)
    }

    fn prefill_tps(&self, prompt_tokens: usize) -> f64 {
        prompt_tokens as f64 / self.prefill_s
    }

    fn decode_tps(&self) -> Option<f64> {
        self.decode_s().map(|d| self.generated() as f64 / d)
    }

    /// Milliseconds per decode step (the longest row's steps).
    fn ms_per_token(&self) -> Option<f64> {
        let steps = self.tokens.iter().map(Vec::len).max().unwrap_or(0).max(1);
        self.decode_s().map(|d| 1e3 * d / steps as f64)
    }
}

/// Runs generate and prefill once each (compiling them); returns the first generate's time and
/// whether its program came from the disk cache.
fn warm_up(l: &Loaded, options: &GenerateOptions) -> Result<(f64, bool)> {
    let (batch, bucket) = l.shape();
    progress(&format!(
        "compiling and running generate ({batch} x {bucket} prompt positions, {} new tokens)",
        options.max_new_tokens
    ));
    let before = l.client.cache_stats();
    let t = Instant::now();
    l.model.generate(&l.prompts, options).context("generate")?;
    let first_s = seconds(t);
    let cached = l.client.cache_stats().disk_hits > before.disk_hits;
    progress("compiling and running prefill");
    drop(l.model.prefill(&l.prompts).context("prefill")?);
    Ok((first_s, cached))
}

/// Compiles this process answered from the compile cache, in memory or on disk.
fn cache_hits(client: &Client) -> u64 {
    let s = client.cache_stats();
    s.memory_hits + s.disk_hits
}

/// Peak resident memory in MB (VmHWM), where /proc says it.
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn generate(a: GenerateArgs) -> Result<()> {
    let l = load(&a.model, &a.prompt, &a.sampling)?;
    let options = l.options.clone();
    if a.state_in.is_some() || a.state_out.is_some() {
        return generate_with_state(&l, &a, &options);
    }
    let terminal = std::io::stdout().is_terminal() && l.tokenizer.is_some();
    if a.stream || (terminal && !a.no_stream && l.prompts.len() == 1) {
        return generate_streamed(&l, &options);
    }
    let (first_s, cached) = warm_up(&l, &options)?;
    if let Some(path) = &a.dump_logits {
        progress("prefill with the logits at every position");
        let all = l
            .model
            .prefill_all_positions(&l.prompts)
            .context("prefill")?;
        dump_logits(path, &all)?;
    }
    let run = Timed::run(&l, &options)?;
    let compile_s = first_s - run.generate_s;
    let prompt_tokens = l.prompt_tokens();
    let peak = peak_rss_mb();

    print_rows(&l, &run.tokens)?;
    let (batch, bucket) = l.shape();
    println!("model     {}", l.description);
    l.print_devices();
    println!("prompt    {batch} row(s), {prompt_tokens} tokens in all (padded to {bucket})");
    println!(
        "compile   {compile_s:.2} s (first generate {first_s:.2} s - second {:.2} s; {})",
        run.generate_s,
        if cached {
            "loaded from the compile cache"
        } else {
            "compiled"
        }
    );
    println!(
        "prefill   {prompt_tokens} tokens in {:.3} s: {:.1} tokens/s",
        run.prefill_s,
        run.prefill_tps(prompt_tokens)
    );
    match (run.decode_s(), run.decode_tps(), run.ms_per_token()) {
        (Some(d), Some(tps), Some(ms)) => println!(
            "decode    {} tokens in {d:.3} s: {tps:.1} tokens/s, {ms:.2} ms per step",
            run.generated()
        ),
        _ => println!("decode    too fast to separate from the prefill"),
    }
    if let Some(mb) = peak {
        println!("memory    peak RSS {mb:.0} MB");
    }

    if let Some(path) = &a.json {
        let value = json!({
            "tokens": run.tokens,
            "prompt_len": l.prompts.iter().map(Vec::len).collect::<Vec<_>>(),
            "prefill_tokens_per_s": run.prefill_tps(prompt_tokens),
            "decode_tokens_per_s": run.decode_tps(),
            "compile_s": compile_s,
            "compile_from_cache": cached,
            "compiles": l.client.cache_stats().compiles,
            "cache_hits": cache_hits(&l.client),
            "peak_rss_mb": peak,
            "prefill_s": run.prefill_s,
            "generate_s": run.generate_s,
            "generated_tokens": run.generated(),
            "max_new_tokens": options.max_new_tokens,
            "model": l.description,
            "devices": l.model.devices(),
            "parallel": l.parallel_name(),
            "weight_bytes_per_device": l.model.weight_bytes_per_device(),
        });
        write_json(path, &value)?;
    }
    Ok(())
}

/// Over several devices, the collectives XLA inserted in the step program, grouped by kind
/// and size: `all-reduce 24 x 3352, ...` (elements per device).
fn step_collectives(l: &Loaded) -> Result<Option<String>> {
    if l.model.devices() == 1 {
        return Ok(None);
    }
    let program = l.model.step_program(l.prompts.len())?;
    let mut groups: Vec<(String, u64, usize)> = Vec::new();
    for c in program.executable().collectives()? {
        match groups
            .iter_mut()
            .find(|(o, e, _)| *o == c.opcode && *e == c.elements)
        {
            Some(g) => g.2 += 1,
            None => groups.push((c.opcode, c.elements, 1)),
        }
    }
    groups.sort();
    let text: Vec<String> = groups
        .iter()
        .map(|(op, elements, count)| format!("{op} {count} x {elements}"))
        .collect();
    Ok(Some(text.join(", ")))
}

/// Prints each row's new tokens, as text when there is a tokenizer.
fn print_rows(l: &Loaded, rows: &[Vec<u32>]) -> Result<()> {
    for (r, row) in rows.iter().enumerate() {
        let shown = match &l.tokenizer {
            Some(tok) => format!(
                "{:?}",
                tok.decode(row, false)
                    .map_err(|e| anyhow!("decoding row {r}: {e}"))?
            ),
            None => ids_text(row),
        };
        println!("row {r:<5} {shown}");
    }
    Ok(())
}

/// Segment length of `generate --stream`.
const STREAM_SEGMENT: usize = 16;

/// `generate --stream`: prints each row's text (or ids) as its tokens arrive.
fn generate_streamed(l: &Loaded, options: &GenerateOptions) -> Result<()> {
    ensure!(
        l.prompts.len() == 1,
        "--stream prints one row; give one prompt (or --no-stream)"
    );
    progress("compiling and running prefill and the generate segment");
    let t = Instant::now();
    let mut all: Vec<u32> = Vec::new();
    let mut printed = String::new();
    let mut failure = None;
    let mut out = std::io::stdout();
    let tokens = l
        .model
        .generate_stream(&l.prompts, options, STREAM_SEGMENT, |fresh| {
            all.extend(&fresh[0]);
            let shown = match &l.tokenizer {
                Some(tok) => match tok.decode(&all, false) {
                    Ok(text) => text,
                    Err(e) => {
                        failure = Some(anyhow!("decoding: {e}"));
                        return false;
                    }
                },
                None => ids_text(&all) + ",",
            };
            // Print what is new; a decode that rewrote earlier text waits for the next one.
            if let Some(new) = shown.strip_prefix(printed.as_str()) {
                print!("{new}");
                let _ = out.flush();
                printed = shown;
            }
            true
        })
        .context("generate")?;
    println!();
    if let Some(e) = failure {
        return Err(e);
    }
    let generated = cut_at_eos(tokens, options.eos)[0].len();
    println!("model     {}", l.description);
    println!(
        "generate  {} prompt tokens and {generated} new in {:.2} s, streamed in segments of \
         {STREAM_SEGMENT} (compile included)",
        l.prompt_tokens(),
        seconds(t)
    );
    Ok(())
}

/// `generate --state-in/--state-out`: one `generate_from` from the given state (or none),
/// writing the state after it.
fn generate_with_state(l: &Loaded, a: &GenerateArgs, options: &GenerateOptions) -> Result<()> {
    let state = match &a.state_in {
        Some(path) => Some(
            Mamba2State::load(path, &l.client)
                .with_context(|| format!("--state-in {}", path.display()))?,
        ),
        None => None,
    };
    progress("compiling and running generate from the state");
    let t = Instant::now();
    let (tokens, state) = l
        .model
        .generate_from(&l.prompts, state, options)
        .context("generate")?;
    let seconds_taken = seconds(t);
    let tokens = cut_at_eos(tokens, options.eos);
    print_rows(l, &tokens)?;
    println!("model     {}", l.description);
    println!(
        "generate  {} prompt tokens and {} new in {seconds_taken:.2} s (compile included)",
        l.prompt_tokens(),
        tokens.iter().map(Vec::len).sum::<usize>()
    );
    if let Some(path) = &a.state_in {
        println!("state     continued from {}", path.display());
    }
    if let Some(path) = &a.state_out {
        state
            .save(path)
            .with_context(|| format!("--state-out {}", path.display()))?;
        println!("state     written to {}", path.display());
    }
    if let Some(path) = &a.json {
        write_json(path, &json!({ "tokens": tokens, "model": l.description }))?;
    }
    Ok(())
}

fn ids_text(row: &[u32]) -> String {
    row.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// Writes the prompt logits as `[batch, longest prompt, vocab]` f32 (see `--dump-logits`).
fn dump_logits(path: &Path, prefill: &Prefill) -> Result<()> {
    let logits = prefill.logits.as_array::<f32>()?;
    let logits = logits.as_standard_layout();
    let data = logits.as_slice().context("logits are not contiguous")?;
    let &[batch, bucket, vocab] = logits.shape() else {
        bail!("prefill logits have shape {:?}", logits.shape());
    };
    let longest = prefill.prompt_len.iter().copied().max().unwrap_or(0);
    let mut out = vec![0f32; batch * longest * vocab];
    for (r, &len) in prefill.prompt_len.iter().enumerate() {
        for p in longest - len..longest {
            let src = (r * bucket + bucket - longest + p) * vocab;
            let dst = (r * longest + p) * vocab;
            out[dst..dst + vocab].copy_from_slice(&data[src..src + vocab]);
        }
    }
    write_npy(path, &[batch, longest, vocab], &out)
        .with_context(|| format!("writing {}", path.display()))
}

/// NumPy `.npy` version 1.0: magic, header length, a dict padded to a multiple of 64, data.
fn write_npy(path: &Path, dims: &[usize], data: &[f32]) -> Result<()> {
    let shape = match dims {
        [d] => format!("({d},)"),
        _ => format!(
            "({})",
            dims.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    f.write_all(b"\x93NUMPY\x01\x00")?;
    f.write_all(&u16::try_from(header.len())?.to_le_bytes())?;
    f.write_all(header.as_bytes())?;
    for x in data {
        f.write_all(&x.to_le_bytes())?;
    }
    f.flush()?;
    Ok(())
}

fn emit(a: EmitArgs) -> Result<()> {
    let l = load(&a.model, &a.prompt, &a.sampling)?;
    let options = l.options.clone();
    let (batch, bucket) = l.shape();
    progress("lowering the programs");
    let texts = l.model.stablehlo(batch, bucket, &options)?;
    std::fs::create_dir_all(&a.out_dir)
        .with_context(|| format!("creating {}", a.out_dir.display()))?;
    for (name, text) in ["prefill", "step", "generate"].iter().zip(&texts) {
        let path = a.out_dir.join(format!("{name}.mlir"));
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("{} ({} lines)", path.display(), text.lines().count());
    }
    println!(
        "batch {batch}, prompt bucket {bucket}, {} new tokens",
        options.max_new_tokens
    );
    Ok(())
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

fn bench(a: BenchArgs) -> Result<()> {
    ensure!(a.repeat > 0, "--repeat must be at least 1");
    let l = load(&a.model, &a.prompt, &a.sampling)?;
    let options = l.options.clone();
    let (first_s, cached) = warm_up(&l, &options)?;
    let prompt_tokens = l.prompt_tokens();
    let mut runs = Vec::new();
    for i in 0..a.repeat {
        progress(&format!("timed run {}/{}", i + 1, a.repeat));
        runs.push(Timed::run(&l, &options)?);
    }
    let fmt = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.1}"));
    let fmt2 = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2}"));
    println!("model     {}", l.description);
    l.print_devices();
    let (batch, bucket) = l.shape();
    println!(
        "shape     {batch} row(s), {prompt_tokens} prompt tokens (padded to {bucket}), {} new tokens per row",
        options.max_new_tokens
    );
    println!(
        "{:<8} {:>14} {:>14} {:>14}",
        "run", "prefill tok/s", "decode tok/s", "ms per token"
    );
    let mut rows = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        println!(
            "{:<8} {:>14} {:>14} {:>14}",
            i + 1,
            fmt(Some(r.prefill_tps(prompt_tokens))),
            fmt(r.decode_tps()),
            fmt2(r.ms_per_token())
        );
        rows.push(json!({
            "prefill_s": r.prefill_s,
            "generate_s": r.generate_s,
            "prefill_tokens_per_s": r.prefill_tps(prompt_tokens),
            "decode_tokens_per_s": r.decode_tps(),
            "ms_per_token": r.ms_per_token(),
            "generated_tokens": r.generated(),
        }));
    }
    let med = |f: &dyn Fn(&Timed) -> Option<f64>| median(runs.iter().filter_map(f).collect());
    let prefill_tps = med(&|r| Some(r.prefill_tps(prompt_tokens)));
    let decode_tps = med(&|r| r.decode_tps());
    let ms = med(&|r| r.ms_per_token());
    let generate_s = med(&|r| Some(r.generate_s)).unwrap_or(0.0);
    println!(
        "{:<8} {:>14} {:>14} {:>14}",
        "median",
        fmt(prefill_tps),
        fmt(decode_tps),
        fmt2(ms)
    );
    let compile_s = first_s - generate_s;
    println!(
        "compile   {compile_s:.2} s ({})",
        if cached {
            "loaded from the compile cache"
        } else {
            "compiled"
        }
    );
    let peak = peak_rss_mb();
    if let Some(mb) = peak {
        println!("memory    peak RSS {mb:.0} MB");
    }
    let collectives = step_collectives(&l)?;
    if let Some(c) = &collectives {
        println!(
            "collectives in one step (batch {}, {} layers): {c}",
            l.prompts.len(),
            l.model.config().num_layers
        );
    }
    if let Some(path) = &a.json {
        let value = json!({
            "runs": rows,
            "median": {
                "prefill_tokens_per_s": prefill_tps,
                "decode_tokens_per_s": decode_tps,
                "ms_per_token": ms,
                "generate_s": generate_s,
            },
            "step_collectives": collectives,
            "devices": l.model.devices(),
            "parallel": l.parallel_name(),
            "weight_bytes_per_device": l.model.weight_bytes_per_device(),
            "prompt_len": l.prompts.iter().map(Vec::len).collect::<Vec<_>>(),
            "max_new_tokens": options.max_new_tokens,
            "compile_s": compile_s,
            "compile_from_cache": cached,
            "compiles": l.client.cache_stats().compiles,
            "cache_hits": cache_hits(&l.client),
            "peak_rss_mb": peak,
            "model": l.description,
        });
        write_json(path, &value)?;
    }
    Ok(())
}
