//! `grad`: the gradient of the mean next-token cross-entropy over the prompts (plus the router
//! loss a config asks for) for every weight of a checkpoint of any family, written as
//! safetensors under the checkpoint's names.

use std::path::PathBuf;

use anyhow::{bail, ensure, Context, Result};
use clap::Args;
use stablegraph::models::family;
use stablegraph::DType;

use crate::load::{parse_prompt_ids, shipped_model, SHIPPED_MODEL};
use crate::text::Codec;
use crate::{progress, write_json};

/// The flags of `grad`.
#[derive(Args)]
pub(crate) struct GradArgs {
    /// Checkpoint directory (default: the shipped byte-level model, models/mamba2-bytes/).
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// Prompt text (with the model's tokenizer.json, or as UTF-8 bytes for a 256-token byte
    /// vocabulary).
    #[arg(
        long,
        conflicts_with = "prompt_ids",
        required_unless_present = "prompt_ids"
    )]
    prompt: Option<String>,
    /// Prompt token ids, comma-separated; `;` separates prompts: `1,2,3;4,5`. A prompt of T
    /// tokens contributes T - 1 predictions; the loss is their mean over all prompts.
    #[arg(long, value_name = "IDS")]
    prompt_ids: Option<String>,
    /// Write the gradients to FILE (safetensors, f32): one tensor per checkpoint tensor, under
    /// its name and in its shape there (the conv weight as [conv_dim, 1, K], each expert
    /// apart where the checkpoint holds them apart).
    #[arg(long, value_name = "FILE")]
    dump_grads: PathBuf,
    /// Also write {"loss_nats", "loss_bits", "predicted_tokens", "grad_norm"} to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// PJRT plugin: a shared object's path, or `cuda` for the CUDA plugin of the JAX installed
    /// in STABLEGRAPH_PYTHON (default python3). Default: the XLA CPU plugin, resolved as
    /// docs/runtime.md says.
    #[arg(long, value_name = "PATH|cuda")]
    plugin: Option<PathBuf>,
}

/// `grad`.
pub(crate) fn grad(a: GradArgs) -> Result<()> {
    let dir = match a.model.clone().or_else(shipped_model) {
        Some(dir) => dir,
        None => bail!("grad needs --model DIR ({SHIPPED_MODEL}/ is not in this checkout)"),
    };
    ensure!(dir.is_dir(), "--model {}: not a directory", dir.display());
    let client = crate::client(a.plugin.as_deref(), 1)?;
    progress(&format!("loading weights from {}", dir.display()));
    let model = family::load(&client, &dir, DType::F32)
        .with_context(|| format!("--model {}", dir.display()))?;
    let codec = Codec::for_model(Some(&dir), model.vocab_size())?;
    let prompts = match (&a.prompt, &a.prompt_ids) {
        (Some(text), _) => vec![codec.encode(text)?],
        (None, Some(ids)) => parse_prompt_ids(ids)?,
        (None, None) => bail!("give --prompt or --prompt-ids"),
    };
    let vocab = model.vocab_size();
    ensure!(
        prompts.iter().any(|p| p.len() >= 2),
        "the loss needs a prompt of at least two tokens (one to predict)"
    );
    for (r, row) in prompts.iter().enumerate() {
        if let Some(bad) = row.iter().find(|&&t| t as usize >= vocab) {
            bail!("token id {bad} (prompt {r}) is outside the vocabulary of {vocab}");
        }
    }
    progress("compiling and running the loss and its gradient");
    let grads = model.loss_and_grads(&prompts).context("loss_and_grads")?;
    grads
        .save(&a.dump_grads)
        .with_context(|| format!("--dump-grads {}", a.dump_grads.display()))?;
    let norm = grads.norm();
    let loss = grads.loss;
    let bits = f64::from(loss) / std::f64::consts::LN_2;
    println!(
        "loss      {loss:.6} nats ({bits:.4} bits) per token, mean over {} predicted \
         tokens in {} prompt(s) ({})",
        grads.predicted,
        prompts.len(),
        model.family()
    );
    if let Some(aux) = grads.aux_loss {
        println!("router    load-balancing loss {aux:.6} (included above times its coefficient)");
    }
    println!(
        "grads     {} tensors, global norm {norm:.6e}, written to {}",
        grads.tensors.len(),
        a.dump_grads.display()
    );
    if let Some(path) = &a.json {
        let value = serde_json::json!({
            "family": model.family(),
            "loss_nats": loss,
            "loss_bits": bits,
            "aux_loss": grads.aux_loss,
            "predicted_tokens": grads.predicted,
            "grad_norm": norm,
        });
        write_json(path, &value)?;
    }
    Ok(())
}
