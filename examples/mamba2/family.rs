//! What every subcommand shares over the engine's face (`dyn CausalLm`), whatever the family:
//! loading a checkpoint of another family than Mamba-2 (Mamba-1, Falcon-Mamba, Bamba, Granite
//! 4.0-H, Nemotron-H; Mamba-2's own flags refused by name), `emit`'s program texts, and
//! `generate --state-in/--state-out`. `load::load` puts every family behind the same face, so
//! `generate`, `bench`, `emit`, `eval` and `serve` have one path each.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::json;
use stablegraph::models::family::{self, CausalLm};
use stablegraph::models::GenerateOptions;
use stablegraph::runtime::Client;
use stablegraph::DType;

use crate::generate::{cut_at_eos, describe_settings, print_rows, settings_json};
use crate::load::{Bf16Dots, ModelArgs};
use crate::text::Codec;
use crate::{progress, seconds, write_run_json};

/// The state-file flags of `generate`.
pub(crate) struct Outputs<'a> {
    /// `--state-in FILE`.
    pub(crate) state_in: Option<&'a Path>,
    /// `--state-out FILE`.
    pub(crate) state_out: Option<&'a Path>,
    /// `--json FILE`.
    pub(crate) json: Option<&'a Path>,
}

/// The flags' check: the Mamba-2-only ones are an error naming them.
fn refuse(family: &str, m: &ModelArgs) -> Result<()> {
    let mut given: Vec<&str> = Vec::new();
    let set = [
        (m.prefill_chunk.is_some(), "--prefill-chunk"),
        (!matches!(m.bf16_dots, Bf16Dots::Auto), "--bf16-dots"),
    ];
    given.extend(set.iter().filter(|(on, _)| *on).map(|(_, name)| *name));
    if !given.is_empty() {
        bail!(
            "{family} checkpoints do not take {} yet (only Mamba-2's engine has them)",
            given.join(", ")
        );
    }
    Ok(())
}

/// The family of the checkpoint in `dir` by its `model_type` (for the refusal message).
fn family_name(dir: &Path) -> &'static str {
    match crate::load::model_type(dir).ok().flatten().as_deref() {
        Some("falcon_mamba") => "Falcon-Mamba",
        Some("bamba") => "Bamba",
        Some("granitemoehybrid") => "Granite 4.0-H",
        Some("nemotron_h") => "Nemotron-H",
        Some("llama") => "Llama",
        Some("qwen2") => "Qwen2",
        Some("qwen3") => "Qwen3",
        Some("mistral") => "Mistral",
        Some("gemma2") => "Gemma 2",
        _ => "Mamba-1",
    }
}

/// Loads the checkpoint in `dir` as the flags say (the Mamba-2-only ones refused by name): the
/// client, the model, and a line describing it.
pub(crate) fn load_model(dir: &Path, m: &ModelArgs) -> Result<(Client, Box<dyn CausalLm>, String)> {
    refuse(family_name(dir), m)?;
    crate::speak_as(family_name(dir));
    anyhow::ensure!(m.devices > 0, "--devices must be at least 1");
    let client = crate::client(m.plugin.as_deref(), m.devices)?;
    let dtype = m.dtype.dtype();
    progress(&format!("loading weights from {}", dir.display()));
    let parallel = m.parallel.kind();
    let model = family::load_parallel(&client, dir, dtype, parallel, m.devices)
        .with_context(|| format!("--model {}", dir.display()))?;
    let mut description = describe(dir, model.as_ref(), dtype);
    if m.devices > 1 {
        description.push_str(&format!(
            ", over {} devices by {}",
            m.devices,
            parallel.name()
        ));
    }
    Ok((client, model, description))
}

/// Writes the prefill, step and generate programs' text of a model of any family to `out_dir`.
pub(crate) fn emit_face(l: &Face, out_dir: &Path) -> Result<()> {
    progress("lowering the programs");
    let texts = l.model.stablehlo(l.prompts, l.options)?;
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    for (name, text) in ["prefill", "step", "generate"].iter().zip(&texts) {
        let path = out_dir.join(format!("{name}.mlir"));
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("{} ({} lines)", path.display(), text.lines().count());
    }
    println!(
        "{}: batch {}, longest prompt {}, {} new tokens",
        l.description,
        l.prompts.len(),
        l.prompts.iter().map(Vec::len).max().unwrap_or(0),
        l.options.max_new_tokens
    );
    Ok(())
}

/// What `generate` and `emit` work with once a model of any family is loaded: the model on
/// the engine's face, its text, the prompts and the options.
pub(crate) struct Face<'a> {
    pub(crate) model: &'a dyn CausalLm,
    pub(crate) codec: &'a Codec,
    pub(crate) prompts: &'a [Vec<u32>],
    pub(crate) options: &'a GenerateOptions,
    pub(crate) settings_from: Option<&'a Path>,
    pub(crate) description: &'a str,
}

/// `generate --state-in/--state-out`: one generation from the given state file (or none),
/// writing the state after it.
pub(crate) fn with_state_files(l: &Face, o: &Outputs) -> Result<()> {
    progress("compiling and running generate from the state");
    let t = Instant::now();
    let tokens = l
        .model
        .generate_with_state_files(l.prompts, l.options, o.state_in, o.state_out)
        .context("generate")?;
    let taken = seconds(t);
    let tokens = cut_at_eos(tokens, l.options.eos);
    print_rows(l.codec, &tokens)?;
    println!("model     {}", l.description);
    println!(
        "settings  {}",
        describe_settings(l.options, l.settings_from)
    );
    println!(
        "generate  {} prompt tokens and {} new in {taken:.2} s (compile included)",
        l.prompts.iter().map(Vec::len).sum::<usize>(),
        tokens.iter().map(Vec::len).sum::<usize>()
    );
    if let Some(path) = o.state_in {
        println!("state     continued from {}", path.display());
    }
    if let Some(path) = o.state_out {
        println!("state     written to {}", path.display());
    }
    if let Some(path) = o.json {
        let value = json!({
            "tokens": tokens,
            "model": l.description,
            "settings": settings_json(l.options, l.settings_from),
        });
        write_run_json(path, value, l.model)?;
    }
    Ok(())
}

/// One line on the model.
fn describe(dir: &Path, model: &dyn CausalLm, dtype: DType) -> String {
    format!(
        "{} ({}): {}, {} matrices",
        dir.display(),
        model.family(),
        model.describe(),
        crate::load::dtype_name(dtype)
    )
}
