//! `train --model DIR`: fine-tunes a checkpoint of any family with the library's
//! [`stablegraph::models::FineTuner`] (AdamW and the schedule as `train` has them, the batch
//! split over `--devices`), writing a checkpoint of the same family and names, the loss curve
//! as CSV and as an SVG chart.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use serde_json::json;
use stablegraph::models::family;
use stablegraph::models::Text;
use stablegraph::DType;

use crate::data::Data;
use crate::train::{run_steps, with_huge_pages, write_loss_files, TrainArgs};
use crate::{peak_rss_mb, progress, seconds};

/// The data of `a` as the model's tokens: the training part and the held-out part (the last 5%
/// of the bytes), each tokenized on its own.
struct Tokens {
    files: usize,
    train: Vec<u32>,
    val: Vec<u32>,
}

/// `train --model DIR`.
pub(crate) fn fine_tune(a: &TrainArgs, dir: &Path) -> Result<()> {
    let started = Instant::now();
    check_flags(a, dir)?;
    with_huge_pages();
    let say = |line: String| a.say(line);
    let (model, text) = open(a, dir)?;
    let unit = if matches!(text, Text::Bytes) {
        "byte"
    } else {
        "token"
    };
    let data = tokenize(a, &text, unit)?;
    say(format!(
        "data      {} files: {} {unit}s to train on, {} held out (the last 5% of the bytes)",
        data.files,
        data.train.len(),
        data.val.len()
    ));
    say(format!(
        "model     {} ({}), f32",
        model.family(),
        model.describe()
    ));
    progress("compiling the training and evaluation programs");
    let mut tuner = model
        .fine_tuner(a.adamw(), a.options(), a.devices)
        .context("building the trainer")?;
    drop(model);
    say(format!(
        "training  {} steps of {} x {} {unit}s over {} device(s), peak lr {}, {} step(s) per \
         call; {} parameters; compile {:.2} s",
        a.steps,
        a.batch,
        a.seq_len,
        a.devices,
        a.lr(),
        a.micro_steps(),
        tuner.parameter_count(),
        tuner.compile_seconds()
    ));
    let (rows, train_s) = match a.steps {
        0 => (Vec::new(), 0.0),
        _ => run_steps(a, &mut tuner, (&data.train, &data.val), unit, &say)?,
    };
    tuner
        .save(&a.out, dir)
        .with_context(|| format!("--out {}", a.out.display()))?;
    let short = if unit == "byte" { "bpb" } else { "bpt" };
    let title = format!("Fine-tuning {} ({}): loss", model_name(dir), unit);
    write_loss_files(&a.out, &rows, &title, short, None)?;
    let last = rows.last().map(|r| r.train_bpb);
    let val = rows.iter().rev().find_map(|r| r.val_bpb);
    let first = rows.first().map(|r| r.train_bpb);
    let tokens_per_s = (a.steps > 0).then(|| (a.steps * a.batch * a.seq_len) as f64 / train_s);
    if let (Some(first), Some(last), Some(val), Some(tps)) = (first, last, val, tokens_per_s) {
        say(format!(
            "done      {} steps in {:.1} s ({train_s:.1} s training at {tps:.0} tokens/s); \
             train {first:.3} -> {last:.3}, val {val:.3} bits per {unit}",
            a.steps,
            seconds(started)
        ));
    }
    say(format!(
        "wrote     {}/model.safetensors (and {}'s other files), loss.csv, loss.svg",
        a.out.display(),
        dir.display()
    ));
    let peak = peak_rss_mb();
    if let Some(mb) = peak {
        say(format!("memory    peak RSS {mb:.0} MB"));
    }
    if a.json {
        let summary = json!({
            "model": dir.display().to_string(),
            "steps": a.steps,
            "devices": a.devices,
            "unit": unit,
            "first_train_bits": first,
            "final_train_bits": last,
            "final_val_bits": val,
            "tokens_per_s": tokens_per_s,
            "train_s": train_s,
            "compile_s": tuner.compile_seconds(),
            "peak_rss_mb": peak,
            "parameters": tuner.parameter_count(),
            "train_tokens": data.train.len(),
            "val_tokens": data.val.len(),
            "out": a.out.display().to_string(),
        });
        println!("{}", serde_json::to_string_pretty(&summary)?);
    }
    Ok(())
}

/// Checks the flags of a fine-tuning run before anything slow.
fn check_flags(a: &TrainArgs, dir: &Path) -> Result<()> {
    a.check_schedule()?;
    ensure!(a.seq_len > 0, "--seq-len must be at least 1");
    ensure!(a.devices > 0, "--devices must be at least 1");
    ensure!(
        a.batch.is_multiple_of(a.devices),
        "--batch {} does not split over --devices {}",
        a.batch,
        a.devices
    );
    ensure!(dir.is_dir(), "--model {}: not a directory", dir.display());
    Ok(())
}

/// The model in `dir` (f32) on a client of `a`'s devices, and its text.
fn open(a: &TrainArgs, dir: &Path) -> Result<(Box<dyn family::CausalLm>, Text)> {
    let client = crate::client(a.plugin.as_deref(), a.devices)?;
    progress(&format!("loading {}", dir.display()));
    let model = family::load(&client, dir, DType::F32)
        .with_context(|| format!("--model {}", dir.display()))?;
    let vocab = model.vocab_size();
    let text =
        Text::for_checkpoint(dir, vocab).with_context(|| format!("--model {}", dir.display()))?;
    let Some(text) = text else {
        bail!(
            "--model {}: no tokenizer.json, and its vocabulary of {vocab} tokens is not bytes \
             (256): train needs the text as the model's tokens",
            dir.display()
        );
    };
    Ok((model, text))
}

/// The last component of `dir`, for titles.
fn model_name(dir: &Path) -> String {
    dir.file_name().map_or_else(
        || dir.display().to_string(),
        |n| n.to_string_lossy().to_string(),
    )
}

/// The files of --data (default: this crate's sources) as the model's tokens, each part
/// checked to hold one window of `--seq-len + 1`.
fn tokenize(a: &TrainArgs, text: &Text, unit: &str) -> Result<Tokens> {
    let sources = if a.data.is_empty() {
        crate::data::default_sources()
    } else {
        a.data.clone()
    };
    let data = Data::read(&sources)?;
    let encode = |bytes: &[u8], part: &str| -> Result<Vec<u32>> {
        if bytes.is_empty() {
            return Ok(Vec::new());
        }
        text.encode(&String::from_utf8_lossy(bytes))
            .with_context(|| format!("tokenizing the {part} part of --data"))
    };
    let tokens = Tokens {
        files: data.files.len(),
        train: encode(&data.train, "training")?,
        val: encode(&data.val, "validation")?,
    };
    let window = a.seq_len + 1;
    for (part, t) in [("training", &tokens.train), ("validation", &tokens.val)] {
        ensure!(
            t.len() >= window,
            "the {part} part of --data is {} {unit}s (validation is the last 5% of {} bytes), \
             fewer than one window of --seq-len + 1 = {window}: give more --data or a shorter \
             --seq-len",
            t.len(),
            data.train.len() + data.val.len()
        );
    }
    Ok(tokens)
}
