//! `grad`: the gradient of the mean next-token cross-entropy over the prompts for every weight of
//! a checkpoint, written as safetensors under the checkpoint's names.

use std::path::PathBuf;

use anyhow::{bail, ensure, Context, Result};
use clap::Args;
use stablegraph::models::mamba2::Mamba2Weights;
use stablegraph::runtime::Client;
use stablegraph::tree::Tree;
use stablegraph::DType;

use crate::load::{parse_prompt_ids, read_config, shipped_model, SHIPPED_MODEL};
use crate::text::Codec;
use crate::{progress, write_json};
use stablegraph::models::mamba2::loss_and_grads;

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
    /// Write the gradients to FILE (safetensors, f32): one tensor per weight, under the
    /// checkpoint's HF names and shapes (the conv weight as [conv_dim, 1, K]).
    #[arg(long, value_name = "FILE")]
    dump_grads: PathBuf,
    /// Also write {"loss_nats", "loss_bits", "predicted_tokens", "grad_norm"} to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// PJRT plugin shared object (default: the XLA CPU plugin).
    #[arg(long, value_name = "PATH")]
    plugin: Option<PathBuf>,
}

/// `grad`.
pub(crate) fn grad(a: GradArgs) -> Result<()> {
    let dir = match a.model.clone().or_else(shipped_model) {
        Some(dir) => dir,
        None => bail!("grad needs --model DIR ({SHIPPED_MODEL}/ is not in this checkout)"),
    };
    let config = read_config(&dir)?;
    let codec = Codec::for_model(Some(&dir), config.vocab_size)?;
    let prompts = match (&a.prompt, &a.prompt_ids) {
        (Some(text), _) => vec![codec.encode(text)?],
        (None, Some(ids)) => parse_prompt_ids(ids)?,
        (None, None) => bail!("give --prompt or --prompt-ids"),
    };
    let vocab = config.vocab_size;
    ensure!(
        prompts.iter().any(|p| p.len() >= 2),
        "the loss needs a prompt of at least two tokens (one to predict)"
    );
    for (r, row) in prompts.iter().enumerate() {
        if let Some(bad) = row.iter().find(|&&t| t as usize >= vocab) {
            bail!("token id {bad} (prompt {r}) is outside the vocabulary of {vocab}");
        }
    }
    progress(&format!("loading weights from {}", dir.display()));
    let weights = Mamba2Weights::load(&dir, &config, DType::F32)
        .with_context(|| format!("--model {}", dir.display()))?;
    progress("loading the PJRT plugin");
    let client = match &a.plugin {
        Some(path) => Client::from_plugin_path(path),
        None => Client::cpu(),
    }
    .context("creating the PJRT client")?;
    progress("compiling and running the loss and its gradient");
    let (loss, grads) =
        loss_and_grads(&client, &config, &weights, &prompts).context("loss_and_grads")?;
    grads
        .save_tensors(&a.dump_grads)
        .with_context(|| format!("--dump-grads {}", a.dump_grads.display()))?;
    let norm = grads
        .named()
        .iter()
        .flat_map(|(_, g)| g.to_f64_vec())
        .map(|x| x * x)
        .sum::<f64>()
        .sqrt();
    let predicted: usize = prompts.iter().map(|p| p.len().saturating_sub(1)).sum();
    let bits = f64::from(loss) / std::f64::consts::LN_2;
    println!(
        "loss      {loss:.6} nats ({bits:.4} bits) per token, mean over {predicted} predicted \
         tokens in {} prompt(s)",
        prompts.len()
    );
    println!(
        "grads     {} tensors, global norm {norm:.6e}, written to {}",
        grads.named().len(),
        a.dump_grads.display()
    );
    if let Some(path) = &a.json {
        let value = serde_json::json!({
            "loss_nats": loss,
            "loss_bits": bits,
            "predicted_tokens": predicted,
            "grad_norm": norm,
        });
        write_json(path, &value)?;
    }
    Ok(())
}
