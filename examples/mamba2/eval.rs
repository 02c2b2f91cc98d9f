//! `eval`: how well a model of any family predicts a text: the mean next-token cross-entropy
//! (nats and bits per token) and the perplexity over windows of the text, with any matrix
//! dtype, so that bf16 and 8-bit weights can be compared with f32 on held-out text.

use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use clap::Args;
use serde_json::json;
use stablegraph::models::family::CausalLm;
use stablegraph::HostArray;

use crate::data::Data;
use crate::load::ModelArgs;
use crate::text::{bytes_to_ids, Codec};
use crate::{progress, write_run_json};

/// The flags of `eval`.
#[derive(Args)]
pub(crate) struct EvalArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Files or directories (read recursively, in sorted order) whose bytes are the text.
    /// Default: the `.md` files of the crate's docs/, which the shipped model (trained on
    /// src/ and README.md) has not seen.
    #[arg(long, value_name = "PATH", num_args = 1..)]
    data: Vec<PathBuf>,
    /// Tokens per window: the text is cut into windows of this many tokens, each scored from
    /// an empty state (its first token is context only); a shorter tail is left out.
    #[arg(long, default_value_t = 512, value_name = "N")]
    window: usize,
    /// Score at most this many windows (from the start of the text).
    #[arg(long, default_value_t = 64, value_name = "N")]
    max_windows: usize,
    /// Also write the figures as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// The `.md` files of the crate's docs/.
fn default_data() -> Result<Vec<PathBuf>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    files.sort();
    ensure!(!files.is_empty(), "no .md files in {}", dir.display());
    Ok(files)
}

/// The negative log-likelihood (nats) of each next token of `row` under `logits` `[L, vocab]`
/// (position `t` predicts token `t + 1`), summed, and how many tokens it covers.
fn row_nll(logits: &[f32], vocab: usize, row: &[u32]) -> (f64, usize) {
    let mut nll = 0.0;
    for (t, next) in row.iter().skip(1).enumerate() {
        let l = &logits[t * vocab..(t + 1) * vocab];
        let max = l.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
        let sum: f64 = l.iter().map(|&x| (x as f64 - max).exp()).sum();
        nll += max + sum.ln() - l[*next as usize] as f64;
    }
    (nll, row.len().saturating_sub(1))
}

/// The summed negative log-likelihood of every window's next tokens, and their count.
fn score(model: &dyn CausalLm, windows: &[Vec<u32>], window: usize) -> Result<(f64, usize)> {
    let vocab = model.vocab_size();
    // Rows per call: the logits of a call ([rows, window, vocab] f32) within 64 MiB.
    let rows = ((1usize << 24) / (window * vocab)).clamp(1, windows.len());
    progress(&format!(
        "scoring {} windows of {window} tokens, {rows} per call",
        windows.len()
    ));
    let (mut nll, mut count) = (0.0, 0);
    for batch in windows.chunks(rows) {
        let mut batch = batch.to_vec();
        // The last call is padded with copies of its first window to the same shape (one
        // compiled program); the copies are not counted.
        let real = batch.len();
        batch.resize(rows, batch[0].clone());
        let logits: HostArray = model.prefill_logits(&batch)?;
        // Each row's window fills the last positions of its padded length.
        let padded = logits.dims()[1];
        let values = logits.as_array::<f32>()?;
        let flat = values.as_slice().context("logits not contiguous")?;
        for (r, row) in batch.iter().take(real).enumerate() {
            let start = (r * padded + padded - window) * vocab;
            let (n, c) = row_nll(&flat[start..start + window * vocab], vocab, row);
            nll += n;
            count += c;
        }
    }
    Ok((nll, count))
}

/// `eval`.
pub(crate) fn eval(a: EvalArgs) -> Result<()> {
    ensure!(
        a.window >= 2,
        "--window must be at least 2 (one token to predict)"
    );
    ensure!(a.max_windows >= 1, "--max-windows must be at least 1");
    let sources = if a.data.is_empty() {
        default_data()?
    } else {
        a.data.clone()
    };
    let data = Data::read(&sources)?;
    let text = [data.train, data.val].concat();
    let opened = a.model.open_any(false)?;
    let (model, codec, description) = (opened.model, opened.codec, opened.description);
    let tokens = match &codec {
        c if c.is_bytes() => bytes_to_ids(&text),
        Codec::None { .. } => bail!(
            "eval needs the text as tokens: {} has no tokenizer.json and its vocabulary ({} \
             tokens) is not bytes",
            a.model
                .model
                .as_deref()
                .map_or("the random shape".into(), |d| d.display().to_string()),
            model.vocab_size()
        ),
        codec => codec.encode(&String::from_utf8_lossy(&text))?,
    };
    let windows: Vec<Vec<u32>> = tokens
        .chunks_exact(a.window)
        .take(a.max_windows)
        .map(<[u32]>::to_vec)
        .collect();
    ensure!(
        !windows.is_empty(),
        "the text has {} tokens, fewer than one --window of {}",
        tokens.len(),
        a.window
    );
    let (nll, count) = score(model.as_ref(), &windows, a.window)?;
    let nats = nll / count as f64;
    let bits = nats / std::f64::consts::LN_2;
    let unit = if codec.is_bytes() { "byte" } else { "token" };
    println!("model       {description}");
    println!(
        "text        {} files, {} tokens; scored {count} predictions in {} windows of {}",
        data.files.len(),
        tokens.len(),
        windows.len(),
        a.window
    );
    println!(
        "loss        {nats:.5} nats, {bits:.5} bits per {unit}; perplexity {:.4}",
        nats.exp()
    );
    if let Some(path) = &a.json {
        let value = json!({
            "files": data.files.len(),
            "predictions": count,
            "windows": windows.len(),
            "window": a.window,
            "loss_nats": nats,
            "loss_bits": bits,
            "perplexity": nats.exp(),
        });
        write_run_json(path, value, model.as_ref())?;
    }
    Ok(())
}
