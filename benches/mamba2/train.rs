//! Section 9: the training step of the small byte-level model the `train` example trains
//! (`Mamba2Config::byte_level(4, 128)`, batch 8 x 256 bytes, AdamW): compile time, time per
//! step and tokens/s of the one compiled program (forward, backward and update, weights and
//! optimizer state donated), with one and with four optimizer steps per program call (a
//! `fori_loop` over micro-batches), one step with each layer rematerialised (`Remat::PerLayer`),
//! peak memory and the step program's temporaries; each in a child process (this binary
//! again) so its peak is its own, without and with huge pages for malloc's large mappings
//! (`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`, which the `train` example sets). Then the same model, data shape and optimizer in PyTorch
//! (HF's pure-torch `Mamba2ForCausalLM`, `scripts/torch_train_bench.py`), same machine, same
//! run, when a Python with torch and transformers is found (`STABLEGRAPH_TORCH_PYTHON`, else
//! `/root/venvs/mamba2-fixtures/bin/python`); skipped with a note otherwise.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use stablegraph::models::mamba2::{Mamba2Config, Mamba2Weights, Remat, TrainOptions, Trainer};
use stablegraph::optim::AdamW;
use stablegraph::rng::SplitMix64;
use stablegraph::runtime::{Client, CompileCache};
use stablegraph::DType;

use crate::common::{median, progress, secs_since, show, sorted, status_kib};
use crate::context::Ctx;
use crate::table::Table;
use crate::TRAIN_CHILD_ENV;

/// Layers and width of the model (the `train` example's default).
const SHAPE: (usize, usize) = (4, 128);
/// Rows and bytes per row of one optimizer step.
const BATCH: usize = 8;
/// See `BATCH`.
const SEQ_LEN: usize = 256;
/// The learning rate of the timed steps.
const LR: f64 = 3e-3;

/// The child: builds the trainer with `micro` optimizer steps per call, times `calls` calls
/// after one warm-up call, prints the figures as JSON.
pub fn child(arg: &str) -> Result<()> {
    let parts: Vec<&str> = arg.split(',').collect();
    let [micro, calls, remat] = parts[..] else {
        bail!("child argument: micro,calls,remat (0 or 1)");
    };
    let (micro, calls): (usize, usize) = (micro.parse()?, calls.parse()?);
    let remat = match remat {
        "1" => Remat::PerLayer,
        _ => Remat::Off,
    };
    let client = Client::cpu()?;
    client.set_compile_cache(CompileCache::memory_only());
    let cfg = Mamba2Config::byte_level(SHAPE.0, SHAPE.1)?;
    let weights = Mamba2Weights::random(&cfg, DType::F32, 0)?;
    let t = Instant::now();
    // The `train` example's clipping (at a global norm of 1; AdamW's defaults do not clip).
    let opt = AdamW {
        clip_norm: Some(1.0),
        ..AdamW::default()
    };
    let options = TrainOptions {
        batch: BATCH,
        seq_len: SEQ_LEN,
        micro_steps: micro,
        remat,
    };
    let mut trainer = Trainer::with_options(&client, &cfg, weights, opt, options)?;
    let compile_s = trainer.compile_seconds();
    let temporaries = trainer
        .step_program()
        .executable()
        .memory_stats()?
        .temporaries;
    let build_s = secs_since(t);
    // Seeded random bytes: the step's time does not depend on the values.
    let mut rng = SplitMix64::new(7);
    let mut batch = || -> Vec<u32> {
        (0..micro * BATCH * (SEQ_LEN + 1))
            .map(|_| (rng.next_u64() % 256) as u32)
            .collect()
    };
    let first = trainer.step(&batch(), LR)?;
    let mut times = Vec::new();
    let mut last = first;
    for _ in 0..calls {
        let tokens = batch();
        let t = Instant::now();
        last = trainer.step(&tokens, LR)?;
        times.push(secs_since(t));
    }
    let per_step = median(&sorted(times)) / micro as f64;
    println!(
        "{}",
        json!({
            "micro_steps": micro, "calls": calls, "build_s": build_s,
            "compile_s": compile_s, "ms_per_step": per_step * 1e3,
            "remat": remat == Remat::PerLayer,
            "temporaries_mb": temporaries as f64 / 1e6,
            "tokens_per_s": (BATCH * SEQ_LEN) as f64 / per_step,
            "peak_rss_mb": status_kib("VmHWM:")? as f64 / 1024.0,
            "first_loss": first, "last_loss": last,
        })
    );
    Ok(())
}

/// The glibc tunable the `train` example sets (see its `with_huge_pages`): transparent huge
/// pages for malloc's large mappings, such as XLA's per-call temporaries.
const HUGE_PAGES: &str = "glibc.malloc.hugetlb=1";

/// `cmd` with `GLIBC_TUNABLES` set to [`HUGE_PAGES`] or to nothing.
fn tunables(cmd: &mut Command, huge: bool) -> &mut Command {
    cmd.env("GLIBC_TUNABLES", if huge { HUGE_PAGES } else { "" })
}

/// Runs one child and parses its JSON line.
fn run_child(micro: usize, calls: usize, huge: bool, remat: bool) -> Result<Value> {
    let out = tunables(&mut Command::new(std::env::current_exe()?), huge)
        .env(TRAIN_CHILD_ENV, format!("{micro},{calls},{}", remat as u8))
        .output()?;
    if !out.status.success() {
        bail!(
            "train child ({micro} micro-steps) failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8(out.stdout)?;
    let line = stdout
        .lines()
        .last()
        .context("train child printed nothing")?;
    Ok(serde_json::from_str(line)?)
}

/// The PyTorch baseline, or why there is none.
fn torch(steps: usize, huge: bool) -> Result<Value, String> {
    let python = std::env::var("STABLEGRAPH_TORCH_PYTHON")
        .unwrap_or_else(|_| "/root/venvs/mamba2-fixtures/bin/python".to_string());
    if !Path::new(&python).exists() {
        return Err(format!(
            "no PyTorch baseline: {python} does not exist (set STABLEGRAPH_TORCH_PYTHON to a \
             Python with torch and transformers)"
        ));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/torch_train_bench.py");
    let out = tunables(&mut Command::new(&python), huge)
        .arg(&script)
        .args([
            "--layers",
            &SHAPE.0.to_string(),
            "--d-model",
            &SHAPE.1.to_string(),
        ])
        .args([
            "--seq-len",
            &SEQ_LEN.to_string(),
            "--batch",
            &BATCH.to_string(),
        ])
        .args(["--steps", &steps.to_string(), "--lr", &LR.to_string()])
        .output()
        .map_err(|e| format!("running {python}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "the PyTorch baseline failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .ok_or("the PyTorch baseline printed no JSON")?;
    serde_json::from_str(line).map_err(|e| format!("the PyTorch baseline's JSON: {e}"))
}

/// Runs the section.
pub fn bench(ctx: &mut Ctx) -> Result<Value> {
    let calls = if ctx.plan.quick { 4 } else { 12 };
    let torch_steps = if ctx.plan.quick { 8 } else { 24 };
    let mut table = Table::new(
        format!(
            "training step: byte-level Mamba-2 ({} layers x {} wide, vocab 256), batch {BATCH} x \
             {SEQ_LEN} bytes, AdamW, f32; one child process each; huge pages: \
             GLIBC_TUNABLES={HUGE_PAGES}",
            SHAPE.0, SHAPE.1
        ),
        &[
            "implementation",
            "huge pages",
            "compile s",
            "ms/step",
            "tokens/s",
            "peak RSS MB",
            "temporaries MB",
        ],
    );
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for huge in [false, true] {
        // Remat (each layer recomputed in the backward pass) beside the plain step it trades
        // memory with.
        for (micro, remat) in [(1, false), (1, true), (4, false)] {
            let v = run_child(micro, (calls / micro).max(2), huge, remat)?;
            let how = if remat { ", remat per layer" } else { "" };
            table.row(vec![
                format!("stablegraph, {micro} step(s) per call{how}"),
                if huge { "yes" } else { "no" }.into(),
                show(f(&v, "compile_s")),
                show(f(&v, "ms_per_step")),
                show(f(&v, "tokens_per_s")),
                show(f(&v, "peak_rss_mb")),
                show(f(&v, "temporaries_mb")),
            ]);
            ours.push(json!({"huge_pages": huge, "result": v}));
        }
        match torch(torch_steps, huge) {
            Ok(v) => {
                table.row(vec![
                    format!(
                        "PyTorch {} eager, {} threads",
                        v["versions"]["torch"].as_str().unwrap_or("?"),
                        v["threads"]
                    ),
                    if huge { "yes" } else { "no" }.into(),
                    "-".into(),
                    show(f(&v, "ms_per_step_median")),
                    show(f(&v, "tokens_per_s")),
                    show(f(&v, "peak_rss_mb")),
                    "-".into(),
                ]);
                theirs.push(json!({"huge_pages": huge, "result": v}));
            }
            Err(why) => {
                progress::out(&why);
                theirs.push(json!({"huge_pages": huge, "skipped": why}));
            }
        }
    }
    table.print();
    // The best of each, as a user would run them: our `train` (huge pages, 4 steps per call)
    // against PyTorch's faster setting.
    let best = |rows: &[Value]| {
        rows.iter()
            .filter_map(|r| r["result"]["tokens_per_s"].as_f64())
            .fold(f64::NAN, f64::max)
    };
    let ratio = best(&ours) / best(&theirs);
    if ratio.is_finite() {
        progress::out(format!(
            "stablegraph / PyTorch tokens/s, the best setting of each: {ratio:.2}x"
        ));
        ctx.set_figure("train_vs_torch", ratio);
    }
    Ok(json!({"stablegraph": ours, "torch": theirs}))
}
