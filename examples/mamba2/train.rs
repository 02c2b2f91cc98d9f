//! `train`: a small byte-level Mamba-2 trained from scratch on local files with the library's
//! [`Trainer`] (AdamW, the whole optimizer step in one compiled program), writing the
//! checkpoint, the loss curve as CSV and as an SVG chart.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use clap::Args;
use serde_json::json;
use stablegraph::models::mamba2::{Mamba2Config, Mamba2Weights};
use stablegraph::runtime::Client;
use stablegraph::tree::Tree;
use stablegraph::{DType, HostArray};

use crate::data::{default_sources, eval_batches, unigram_entropy_bits, Data, Sampler};
use crate::plot::loss_svg;
use crate::text::BYTE_VOCAB;
use crate::{bars, peak_rss_mb, progress, seconds};
use stablegraph::models::mamba2::{Remat, TrainOptions, Trainer};
use stablegraph::models::FineTuner;
use stablegraph::optim::{AdamW, WarmupCosine};

/// The fixed shape of the trained model (`Mamba2Config::byte_level`), besides --layers and
/// --d-model.
const HEAD_DIM: usize = 32;
const STATE_SIZE: usize = 32;
const CONV_KERNEL: usize = 4;
/// The SSD chunk of training: --seq-len must be a multiple of it.
const CHUNK: usize = 64;
/// `d_inner = EXPAND * d_model`.
const EXPAND: usize = 2;
/// At most this many batches of the validation windows per evaluation.
const MAX_EVAL_BATCHES: usize = 8;
/// A progress line every this many steps (and at every evaluation).
const LOG_EVERY: usize = 10;
/// Seed offsets: the weights use --seed itself, the batches these streams.
const BATCH_STREAM: u64 = 0xDA7A_5EED;

/// Shown after `train --help`.
pub(crate) const AFTER_HELP: &str = "\
Data: the files of --data (directories recursively, regular files only, hidden entries \
skipped) are read as bytes in sorted path order and concatenated; the last 5% of those bytes \
is held out for validation and never trained on. Each step trains on --batch windows of \
--seq-len + 1 bytes at random offsets of the rest (seeded by --seed), predicting each byte \
after the first. Validation loss is the mean over fixed, evenly spaced windows of the held-out \
bytes (up to 8 batches), the same windows at every evaluation. Losses are printed in bits per \
byte (nats / ln 2); the unigram entropy of the training bytes is what knowing only byte \
frequencies achieves.\n\n\
Model: vocab 256 (token = byte), head_dim 32, state 32, one B/C group, conv kernel 4, SSD \
chunk 64 (--seq-len must be a multiple of it), expand 2, tied embeddings, no projection \
biases, f32; the weights are Mamba2Weights::random(config, F32, --seed).\n\n\
Optimizer: AdamW (beta1 0.9, beta2 0.95, eps 1e-8, weight decay 0.1, gradients clipped to \
global norm 1). Learning rate: stablegraph::optim::WarmupCosine::new(--lr, --steps), a linear \
warm-up from --lr/W to --lr over the first W = clamp(steps / 20, 1, 100) steps, then cosine \
decay to --lr / 10 at the last step. With \
--micro-steps K, one program call runs K optimizer steps (all at the rate of the first).\n\n\
Fine-tuning (--model DIR, any family): the data is tokenized with DIR/tokenizer.json (or read \
as bytes for a 256-token vocabulary), each part on its own; windows of --seq-len + 1 tokens, any \
length; the same optimizer and schedule; --devices N splits each batch over N devices. Output: \
model.safetensors under DIR's tensor names, DIR's other files copied, loss.csv \
(step,train_bpt,val_bpt, bits per token) and loss.svg.\n\n\
Output from scratch (in --out): config.json and model.safetensors (an HF-format checkpoint that `generate \
--model` and transformers' Mamba2ForCausalLM load), loss.csv (step,train_bpb,val_bpb; val_bpb \
empty between evaluations) and loss.svg.\n\n\
Speed: on Linux, train runs itself again with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (huge \
pages for the ~300 MB of temporaries XLA's CPU runtime maps on every call; about 1.4x faster \
steps here) unless GLIBC_TUNABLES is already set; set it empty to opt out.";

/// The flags of `train`.
#[derive(Args)]
pub(crate) struct TrainArgs {
    /// Training text: files or directories, read as bytes (repeatable); the last 5% of the
    /// concatenated bytes is held out for validation. Default: this crate's src/ tree and
    /// README.md.
    #[arg(long, value_name = "FILE|DIR")]
    pub(crate) data: Vec<PathBuf>,
    /// Fine-tune the checkpoint in DIR (any family: Mamba-2, Mamba-1, Falcon-Mamba, Bamba,
    /// Granite 4.0-H, Nemotron-H) instead of training a byte-level Mamba-2 from scratch: the
    /// data is tokenized with its tokenizer.json (or read as bytes for a 256-token
    /// vocabulary), and --out gets a checkpoint of the same family and names.
    #[arg(long, value_name = "DIR")]
    pub(crate) model: Option<PathBuf>,
    /// Split each batch over N devices (data parallel: every device holds the weights and
    /// batch / N rows; XLA all-reduces the gradients). With --model.
    #[arg(long, default_value_t = 1, value_name = "N", requires = "model")]
    pub(crate) devices: usize,
    /// Number of Mamba-2 blocks (from scratch).
    #[arg(long, default_value_t = 4, value_name = "N", conflicts_with = "model")]
    layers: usize,
    /// Model width (from scratch; a multiple of 16: 2 x d_model must divide into heads of 32).
    #[arg(
        long,
        default_value_t = 128,
        value_name = "N",
        conflicts_with = "model"
    )]
    d_model: usize,
    /// Tokens predicted per window (from scratch, a multiple of the SSD chunk, 64; any length
    /// with --model); windows hold one more.
    #[arg(long, default_value_t = 256, value_name = "N")]
    pub(crate) seq_len: usize,
    /// Windows per optimizer step.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub(crate) batch: usize,
    /// Optimizer steps (a multiple of --micro-steps; 0 writes the initial model). The default
    /// takes about 10 minutes on a 2-core machine.
    #[arg(long, default_value_t = 2400, value_name = "N")]
    pub(crate) steps: usize,
    /// Peak learning rate (see the schedule below; default 3e-3 from scratch, 1e-4 when
    /// fine-tuning with --model).
    #[arg(long, value_name = "LR")]
    pub(crate) lr: Option<f64>,
    /// Seed of the initial weights and of the batches.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Output directory (created if missing).
    #[arg(long, default_value = "target/mamba2-train", value_name = "DIR")]
    pub(crate) out: PathBuf,
    /// Evaluate on the validation bytes every N steps (and after the last).
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub(crate) eval_every: usize,
    /// Optimizer steps per program call: fewer host round trips, one compiled program that
    /// takes K batches at once. Default: 4 when --steps is a multiple of 4, else 1.
    #[arg(long, value_name = "K")]
    pub(crate) micro_steps: Option<usize>,
    /// Recompute each layer in the backward pass instead of keeping its activations
    /// (`Remat::PerLayer`): the step program's temporaries 303 -> 89 MB at the default shape,
    /// 27-29% slower per step with huge pages.
    #[arg(long)]
    pub(crate) remat: bool,
    /// Print only a JSON summary on stdout at the end (progress goes to stderr): steps, final
    /// train and validation bits per byte, unigram entropy, tokens/s, compile seconds, peak RSS.
    #[arg(long)]
    pub(crate) json: bool,
    /// PJRT plugin: a shared object's path, or `cuda` for the CUDA plugin of the JAX installed
    /// in STABLEGRAPH_PYTHON (default python3). Default: the XLA CPU plugin, resolved as
    /// docs/runtime.md says.
    #[arg(long, value_name = "PATH|cuda")]
    pub(crate) plugin: Option<PathBuf>,
}

impl TrainArgs {
    /// Optimizer steps per program call: `--micro-steps`, else 4 when it divides `--steps`
    /// (four steps per call ran about 1.3x faster per step than one, measured), else 1.
    pub(crate) fn micro_steps(&self) -> usize {
        self.micro_steps
            .unwrap_or(if self.steps.is_multiple_of(4) { 4 } else { 1 })
    }

    /// The peak learning rate: --lr, else 3e-3 from scratch and 1e-4 fine-tuning (a checkpoint's
    /// weights are not to be moved as far as a fresh model's).
    pub(crate) fn lr(&self) -> f64 {
        self.lr
            .unwrap_or(if self.model.is_some() { 1e-4 } else { 3e-3 })
    }

    /// Prints a line of the run's report: on stdout, or on stderr with --json (stdout then holds
    /// the summary only).
    pub(crate) fn say(&self, line: String) {
        if self.json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }

    /// Checks the flags every run has: batch, steps and micro steps, evaluation, rate.
    pub(crate) fn check_schedule(&self) -> Result<()> {
        ensure!(self.batch > 0, "--batch must be at least 1");
        ensure!(self.micro_steps() > 0, "--micro-steps must be at least 1");
        ensure!(
            self.steps.is_multiple_of(self.micro_steps()),
            "--steps {} is not a multiple of --micro-steps {}",
            self.steps,
            self.micro_steps()
        );
        ensure!(self.eval_every > 0, "--eval-every must be at least 1");
        ensure!(
            self.lr().is_finite() && self.lr() > 0.0,
            "--lr must be a positive number"
        );
        Ok(())
    }

    /// AdamW as `train` runs it: beta1 0.9, beta2 0.95, eps 1e-8, weight decay 0.1, clipped at
    /// a global norm of 1 (AdamW's defaults, PyTorch's, do not clip).
    pub(crate) fn adamw(&self) -> AdamW {
        AdamW {
            lr: self.lr(),
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            clip_norm: Some(1.0),
        }
    }

    /// The step's shape: batch, window, micro steps, rematerialisation.
    pub(crate) fn options(&self) -> TrainOptions {
        TrainOptions {
            batch: self.batch,
            seq_len: self.seq_len,
            micro_steps: self.micro_steps(),
            remat: match self.remat {
                true => Remat::PerLayer,
                false => Remat::Off,
            },
        }
    }

    /// Checks the flags (before anything slow) and builds the model's config.
    fn config(&self) -> Result<Mamba2Config> {
        ensure!(self.layers > 0, "--layers must be at least 1");
        ensure!(
            self.d_model > 0 && (EXPAND * self.d_model).is_multiple_of(HEAD_DIM),
            "--d-model {} must be a positive multiple of 16 (2 x d_model is split into heads \
             of {HEAD_DIM})",
            self.d_model
        );
        ensure!(
            self.seq_len > 0 && self.seq_len.is_multiple_of(CHUNK),
            "--seq-len {} is not a multiple of the SSD chunk ({CHUNK})",
            self.seq_len
        );
        self.check_schedule()?;
        let config = Mamba2Config::byte_level(self.layers, self.d_model)?;
        // The constants the help text and this module state, checked against the library's.
        ensure!(
            (
                config.head_dim,
                config.state_size,
                config.conv_kernel,
                config.chunk_size
            ) == (HEAD_DIM, STATE_SIZE, CONV_KERNEL, CHUNK)
                && config.vocab_size == BYTE_VOCAB
                && config.tie_word_embeddings,
            "Mamba2Config::byte_level changed its shape; update the train example's constants"
        );
        Ok(config)
    }
}

/// One row of loss.csv (losses in bits per byte or per token).
pub(crate) struct Row {
    pub(crate) step: usize,
    pub(crate) train_bpb: f64,
    pub(crate) val_bpb: Option<f64>,
}

/// What the optimizer steps left: the rows of loss.csv and the seconds spent compiling (the
/// training and evaluation programs) and in the steps; empty for `--steps 0`.
#[derive(Default)]
struct Outcome {
    rows: Vec<Row>,
    compile_s: f64,
    train_s: f64,
}

impl Outcome {
    /// The last step's training loss, in bits per byte.
    fn final_train(&self) -> Option<f64> {
        self.rows.last().map(|r| r.train_bpb)
    }

    /// The last evaluation's validation loss, in bits per byte.
    fn final_val(&self) -> Option<f64> {
        self.rows.iter().rev().find_map(|r| r.val_bpb)
    }

    /// Tokens trained on per second of training steps (none for `--steps 0`).
    fn tokens_per_s(&self, a: &TrainArgs) -> Option<f64> {
        (a.steps > 0).then(|| (a.steps * a.batch * a.seq_len) as f64 / self.train_s)
    }
}

/// `train`.
pub(crate) fn train(a: TrainArgs) -> Result<()> {
    if let Some(dir) = a.model.clone() {
        return crate::tune::fine_tune(&a, &dir);
    }
    let started = Instant::now();
    let config = a.config()?;
    with_huge_pages();
    let say = |line: String| a.say(line);
    let (data, entropy) = read_data(&a, &say)?;
    let weights = Mamba2Weights::random(&config, DType::F32, a.seed)?;
    let parameters: usize = weights
        .named()
        .iter()
        .map(|(_, w)| w.dims().iter().product::<usize>())
        .sum();
    say_plan(&a, &config, parameters, &say);

    let client = crate::client(a.plugin.as_deref(), 1)?;
    let (final_weights, outcome) = if a.steps == 0 {
        (weights, Outcome::default())
    } else {
        optimize(&a, &client, &config, weights, &data, &say)?
    };

    final_weights
        .save(&a.out, &config)
        .with_context(|| format!("--out {}", a.out.display()))?;
    let title = format!(
        "Byte-level Mamba-2 ({} layer{}, {} wide, {parameters} parameters): loss",
        config.num_layers,
        if config.num_layers == 1 { "" } else { "s" },
        config.hidden_size
    );
    write_loss_files(&a.out, &outcome.rows, &title, "bpb", Some(entropy))?;
    let peak = peak_rss_mb();
    say_results(&a, &outcome, started, entropy, peak, &say);
    if a.json {
        let summary = json!({
            "steps": a.steps,
            "final_train_bpb": outcome.final_train(),
            "final_val_bpb": outcome.final_val(),
            "unigram_entropy_bpb": entropy,
            "tokens_per_s": outcome.tokens_per_s(&a),
            "train_s": outcome.train_s,
            "compile_s": outcome.compile_s,
            "peak_rss_mb": peak,
            "parameters": parameters,
            "train_bytes": data.train.len(),
            "val_bytes": data.val.len(),
            "out": a.out.display().to_string(),
        });
        println!("{}", serde_json::to_string_pretty(&summary)?);
    }
    Ok(())
}

/// The bytes of --data (by default this crate's sources), split into training and validation
/// bytes and checked to hold a window, and the unigram entropy of the training bytes; says how
/// many through `say`.
fn read_data(a: &TrainArgs, say: &dyn Fn(String)) -> Result<(Data, f64)> {
    let sources = if a.data.is_empty() {
        default_sources()
    } else {
        a.data.clone()
    };
    let data = Data::read(&sources)?;
    data.check_window(a.seq_len + 1)?;
    let entropy = unigram_entropy_bits(&data.train);
    say(format!(
        "data      {} files, {} bytes: {} to train on, {} held out (the last 5%)",
        data.files.len(),
        data.train.len() + data.val.len(),
        data.train.len(),
        data.val.len()
    ));
    say(format!(
        "unigram   {entropy:.3} bits per byte (entropy of the training bytes' frequencies)"
    ));
    Ok((data, entropy))
}

/// Says what is trained (the model, with its `parameters`) and how (steps, batch, rate).
fn say_plan(a: &TrainArgs, config: &Mamba2Config, parameters: usize, say: &dyn Fn(String)) {
    say(format!(
        "model     {} layers, {} wide, {} heads of {HEAD_DIM}, state {STATE_SIZE}, vocab 256 \
         (bytes): {parameters} parameters, f32",
        config.num_layers, config.hidden_size, config.num_heads
    ));
    say(format!(
        "training  {} steps of {} x {} bytes, peak lr {}, {} step(s) per call",
        a.steps,
        a.batch,
        a.seq_len,
        a.lr(),
        a.micro_steps()
    ));
}

/// Compiles the trainer of `weights` (AdamW, clipped) and runs the optimizer steps on `data`;
/// returns the trained weights and what the steps left.
fn optimize(
    a: &TrainArgs,
    client: &Client,
    config: &Mamba2Config,
    weights: Mamba2Weights<HostArray>,
    data: &Data,
    say: &dyn Fn(String),
) -> Result<(Mamba2Weights<HostArray>, Outcome)> {
    progress("compiling the training and evaluation programs");
    let mut trainer = Trainer::with_options(client, config, weights, a.adamw(), a.options())
        .context("building the trainer")?;
    say(format!(
        "compile   {:.2} s (the training step)",
        trainer.compile_seconds()
    ));
    let (rows, train_s) = run_steps(a, &mut trainer, (&data.train, &data.val), "byte", say)?;
    let outcome = Outcome {
        rows,
        // Now with the evaluation program's compile too.
        compile_s: trainer.compile_seconds(),
        train_s,
    };
    let weights = trainer.weights().context("reading the trained weights")?;
    Ok((weights, outcome))
}

/// loss.csv (`rows`, losses in `unit`: `bpb` bits per byte or `bpt` bits per token) and
/// loss.svg (their chart, titled `title`, with the unigram `entropy` when known) in `out`.
pub(crate) fn write_loss_files(
    out: &Path,
    rows: &[Row],
    title: &str,
    unit: &str,
    entropy: Option<f64>,
) -> Result<()> {
    let csv_path = out.join("loss.csv");
    let mut csv = format!("step,train_{unit},val_{unit}\n");
    for r in rows {
        let val = r.val_bpb.map(|v| format!("{v:.6}")).unwrap_or_default();
        let _ = writeln!(csv, "{},{:.6},{val}", r.step, r.train_bpb);
    }
    std::fs::write(&csv_path, csv).with_context(|| format!("writing {}", csv_path.display()))?;
    let svg_path = out.join("loss.svg");
    let train_pts: Vec<(usize, f64)> = rows.iter().map(|r| (r.step, r.train_bpb)).collect();
    let val_pts: Vec<(usize, f64)> = rows
        .iter()
        .filter_map(|r| r.val_bpb.map(|v| (r.step, v)))
        .collect();
    std::fs::write(
        &svg_path,
        loss_svg(title, &train_pts, &val_pts, entropy.unwrap_or(f64::NAN)),
    )
    .with_context(|| format!("writing {}", svg_path.display()))
}

/// The closing lines: the final losses and speed (after any steps), what was written, and the
/// `peak` memory when known.
fn say_results(
    a: &TrainArgs,
    outcome: &Outcome,
    started: Instant,
    entropy: f64,
    peak: Option<f64>,
    say: &dyn Fn(String),
) {
    let (train_s, compile_s) = (outcome.train_s, outcome.compile_s);
    if let (Some(train_bpb), Some(val_bpb), Some(tps)) = (
        outcome.final_train(),
        outcome.final_val(),
        outcome.tokens_per_s(a),
    ) {
        say(format!(
            "done      {} steps in {:.1} s ({train_s:.1} s training at {tps:.0} tokens/s, \
             {compile_s:.2} s compiling); final train {train_bpb:.3}, val {val_bpb:.3} bits per \
             byte (unigram {entropy:.3})",
            a.steps,
            seconds(started)
        ));
    }
    say(format!(
        "wrote     {}/config.json, model.safetensors, loss.csv, loss.svg",
        a.out.display()
    ));
    if let Some(mb) = peak {
        say(format!("memory    peak RSS {mb:.0} MB"));
    }
}

/// The optimizer steps of `train` on `data` (the learning rate from `WarmupCosine::new(--lr,
/// --steps)`), printing a line every [`LOG_EVERY`] steps and at each evaluation through `say`
/// (above the progress bar, on a terminal); returns the rows of loss.csv and the seconds spent
/// in the training steps.
pub(crate) fn run_steps<T: Copy + Into<u32>>(
    a: &TrainArgs,
    trainer: &mut dyn Learner,
    (train, val): (&[T], &[T]),
    unit: &str,
    say: &dyn Fn(String),
) -> Result<(Vec<Row>, f64)> {
    let window = a.seq_len + 1;
    let schedule = WarmupCosine::new(a.lr(), a.steps as u64);
    let mut rows = Vec::new();
    let mut train_s = 0.0;
    let mut sampler = Sampler::new(train, window, a.seed ^ BATCH_STREAM);
    let evals = eval_batches(val, window, a.batch, MAX_EVAL_BATCHES);
    let short = if unit == "byte" { "bpb" } else { "bpt" };
    let evaluate = |trainer: &dyn Learner| -> Result<f64> {
        let mut sum = 0.0;
        for batch in &evals {
            sum += f64::from(trainer.eval_loss(batch).context("evaluating")?);
        }
        Ok(sum / evals.len() as f64 / std::f64::consts::LN_2)
    };
    let k = a.micro_steps();
    // On a terminal: a bar over the optimizer steps, with the time left, the latest loss
    // and the rate in tokens/s; the step lines are printed above it.
    let bar = bars::bar(
        a.steps as u64,
        "{elapsed} [{wide_bar}] step {pos}/{len}, {eta} left: {msg}",
    );
    for call in 0..a.steps / k {
        let first = call * k + 1;
        let step = first + k - 1;
        let lr = schedule.lr(first as u64);
        let tokens = sampler.batch(k * a.batch);
        let t = Instant::now();
        let loss = trainer
            .step(&tokens, lr)
            .with_context(|| format!("training step {first}"))?;
        train_s += seconds(t);
        let train_bpb = f64::from(loss) / std::f64::consts::LN_2;
        if !train_bpb.is_finite() {
            bail!(
                "the training loss is {loss} at step {step}: training diverged (try a \
                 lower --lr)"
            );
        }
        let eval_now = step / a.eval_every > (first - 1) / a.eval_every || step == a.steps;
        let val_bpb = if eval_now {
            Some(evaluate(&*trainer)?)
        } else {
            None
        };
        let tokens_per_s = (step * a.batch * a.seq_len) as f64 / train_s;
        bar.set_position(step as u64);
        bar.set_message(format!(
            "train {train_bpb:.3} {short}, {tokens_per_s:.0} tokens/s"
        ));
        if eval_now || step.is_multiple_of(LOG_EVERY) || call == 0 {
            let mut line = format!("step {step:>6}/{}  train {train_bpb:.3} {short}", a.steps);
            if let Some(v) = val_bpb {
                let _ = write!(line, "  val {v:.3} {short}");
            }
            let _ = write!(line, "  lr {lr:.2e}  {tokens_per_s:.0} tokens/s");
            bar.suspend(|| say(line));
        }
        rows.push(Row {
            step,
            train_bpb,
            val_bpb,
        });
    }
    bar.finish_and_clear();
    Ok((rows, train_s))
}

/// What the optimizer loop drives: a from-scratch [`Trainer`] or a [`FineTuner`].
pub(crate) trait Learner {
    /// One call's optimizer steps on `tokens` at rate `lr`: the mean loss in nats.
    fn step(&mut self, tokens: &[u32], lr: f64) -> stablegraph::Result<f32>;
    /// The loss in nats on `tokens`, without updating.
    fn eval_loss(&self, tokens: &[u32]) -> stablegraph::Result<f32>;
}

impl Learner for Trainer {
    fn step(&mut self, tokens: &[u32], lr: f64) -> stablegraph::Result<f32> {
        Trainer::step(self, tokens, lr)
    }
    fn eval_loss(&self, tokens: &[u32]) -> stablegraph::Result<f32> {
        Trainer::eval_loss(self, tokens)
    }
}

impl Learner for FineTuner {
    fn step(&mut self, tokens: &[u32], lr: f64) -> stablegraph::Result<f32> {
        FineTuner::step(self, tokens, lr)
    }
    fn eval_loss(&self, tokens: &[u32]) -> stablegraph::Result<f32> {
        FineTuner::eval_loss(self, tokens)
    }
}

/// The tunable that backs glibc malloc's large mappings with transparent huge pages.
const HUGE_PAGES: &str = "glibc.malloc.hugetlb=1";

/// XLA's CPU runtime maps each execution's temporaries afresh (about 300 MB per training step
/// of the default shape: 77k page faults of 4 KiB per call). glibc's `hugetlb` tunable backs
/// such mappings with transparent huge pages (about 1k faults), which made training steps about
/// 1.4x faster here. glibc reads tunables when a process starts, so `train` runs itself again
/// once with `GLIBC_TUNABLES` set, unless it is already set (to anything: set it empty to opt
/// out). Where that fails it goes on as it is.
pub(crate) fn with_huge_pages() {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        if std::env::var_os("GLIBC_TUNABLES").is_some() {
            return;
        }
        let Ok(exe) = std::env::current_exe() else {
            return;
        };
        // `exec` returns only on failure.
        let _ = std::process::Command::new(exe)
            .args(std::env::args_os().skip(1))
            .env("GLIBC_TUNABLES", HUGE_PAGES)
            .exec();
    }
}
