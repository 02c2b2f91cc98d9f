//! Which model (a checkpoint, the shipped byte-level model, or a random shape), its prompts and
//! the generation options; [`load`] checks them all, then puts the model on the device.

use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use clap::{Args, ValueEnum};
use stablegraph::models::family;
use stablegraph::models::mamba2::{
    Mamba2, Mamba2Config, Mamba2Weights, Parallel, Penalties, Sampling,
};
use stablegraph::models::{GenerateOptions, LoadOptions};
use stablegraph::runtime::Client;
use stablegraph::sampling::GenerationConfig;
use stablegraph::{DType, HostArray};

use crate::progress;
use crate::text::{bytes_to_ids, Codec};

/// The checkpoint shipped with the crate, relative to its root: the byte-level model the
/// default `train` run makes.
pub(crate) const SHIPPED_MODEL: &str = "models/mamba2-bytes";

/// Which model, in which precision, on which plugin.
#[derive(Args)]
pub(crate) struct ModelArgs {
    /// Checkpoint directory (HF or mamba_ssm): config.json, *.safetensors, and tokenizer.json
    /// when present. Its config.json's model_type picks the family (mamba2, mamba,
    /// falcon_mamba, bamba, granitemoehybrid, nemotron_h, llama, qwen2, qwen3, mistral, gemma2)
    /// for every subcommand that takes it. Default: the byte-level Mamba-2 shipped
    /// in models/mamba2-bytes/ (for `bench`: the 130M shape); without that directory, the 130M
    /// shape.
    #[arg(long, value_name = "DIR", conflicts_with = "shape")]
    pub(crate) model: Option<PathBuf>,
    /// Run one of the paper's five Mamba-2 sizes with seeded random weights instead of a
    /// checkpoint (`Mamba2Config::sized`: 130m is 24 layers 768 wide, 2.7b 64 layers 2560 wide).
    #[arg(long, value_enum)]
    pub(crate) shape: Option<Shape>,
    /// Matrix dtype: bf16 keeps the matrices and their products in bf16, the rest in f32; int8
    /// quantizes the matrices (of every family; experts too) at load to 8 bits with one f32
    /// scale per row (products in f32).
    #[arg(long, value_enum, default_value_t = Precision::F32)]
    pub(crate) dtype: Precision,
    /// Seed of the random weights (with --shape, or when the 130M shape is the default).
    #[arg(long, default_value_t = 0)]
    pub(crate) weights_seed: u64,
    /// PJRT plugin: a shared object's path, or `cuda` for the CUDA plugin of the JAX installed
    /// in STABLEGRAPH_PYTHON (default python3). Default: the XLA CPU plugin, resolved as
    /// docs/runtime.md says.
    #[arg(long, value_name = "PATH|cuda")]
    pub(crate) plugin: Option<PathBuf>,
    /// How bf16 matrices enter their products: `on` as bf16 dots, `off` converted to f32 in
    /// the program first, `auto` by platform and processor (see `Mamba2::bf16_dots`).
    #[arg(long, value_enum, default_value_t = Bf16Dots::Auto)]
    pub(crate) bf16_dots: Bf16Dots,
    /// SSD chunk of the prefill (default: chosen per platform and prompt length, see
    /// `Mamba2::prefill_chunk`); prompts are padded to a multiple of it.
    #[arg(long, value_name = "N")]
    pub(crate) prefill_chunk: Option<usize>,
    /// Load a --model checkpoint even if some tensors hold NaN or infinite values (by default
    /// it is refused, naming them); for debugging such weights.
    #[arg(long)]
    pub(crate) allow_nonfinite: bool,
    /// Run every program over N devices as one SPMD program (on the CPU plugin, a client with
    /// N devices); the split is --parallel's.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(crate) devices: usize,
    /// How the model is split over --devices: `heads` (tensor parallel: each device holds
    /// 1/N of the heads and of the projections) or `batch` (data parallel: each device holds
    /// every weight and 1/N of the rows). The head count, or the batch, must divide by N.
    #[arg(long, value_enum, default_value_t = ParallelArg::Heads)]
    pub(crate) parallel: ParallelArg,
}

/// A model shape with random weights.
#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Shape {
    /// Mamba-2 130M: 24 layers, 768 wide, state 128, vocab 50288.
    #[value(name = "130m")]
    M130,
    /// Mamba-2 370M: 48 layers, 1024 wide.
    #[value(name = "370m")]
    M370,
    /// Mamba-2 780M: 48 layers, 1536 wide.
    #[value(name = "780m")]
    M780,
    /// Mamba-2 1.3B: 48 layers, 2048 wide.
    #[value(name = "1.3b")]
    B1_3,
    /// Mamba-2 2.7B: 64 layers, 2560 wide.
    #[value(name = "2.7b")]
    B2_7,
}

impl Shape {
    /// The size's name, as `Mamba2Config::sized` takes it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Shape::M130 => "130m",
            Shape::M370 => "370m",
            Shape::M780 => "780m",
            Shape::B1_3 => "1.3b",
            Shape::B2_7 => "2.7b",
        }
    }
}

/// Where the weights come from.
pub(crate) enum Source {
    /// A checkpoint directory; `shipped` when it is the crate's default model.
    Checkpoint { dir: PathBuf, shipped: bool },
    /// A shape with seeded random weights.
    Random(Shape),
}

impl ModelArgs {
    /// The model these flags select: --model, else --shape, else (unless `random_default`)
    /// the shipped checkpoint when the crate has it, else the 130M shape (saying so on stderr).
    pub(crate) fn source(&self, random_default: bool) -> Source {
        if let Some(dir) = &self.model {
            return Source::Checkpoint {
                dir: dir.clone(),
                shipped: false,
            };
        }
        if let Some(shape) = self.shape {
            return Source::Random(shape);
        }
        if random_default {
            return Source::Random(Shape::M130);
        }
        match shipped_model() {
            Some(dir) => Source::Checkpoint { dir, shipped: true },
            None => {
                eprintln!(
                    "mamba2: note: {SHIPPED_MODEL}/ is not in this checkout; running the 130M \
                     shape with random weights (--shape 130m) instead"
                );
                Source::Random(Shape::M130)
            }
        }
    }
}

/// The shipped checkpoint's directory, when this checkout has it (a config.json in it).
pub(crate) fn shipped_model() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(SHIPPED_MODEL);
    dir.join("config.json").is_file().then_some(dir)
}

/// The config of a checkpoint directory, checking that it is one and that it is Mamba-2.
pub(crate) fn read_config(dir: &Path) -> Result<Mamba2Config> {
    ensure!(dir.is_dir(), "--model {}: not a directory", dir.display());
    match model_type(dir)?.as_deref() {
        None | Some("mamba2") => {}
        Some(t) if family::model_types().contains(&t) => bail!(
            "--model {}: model_type {t:?} is not Mamba-2 (model_type \"mamba2\"), which this \
             path reads",
            dir.display()
        ),
        Some(t) => bail!(
            "--model {}: model_type {t:?} is not supported (supported: {})",
            dir.display(),
            family::model_types().join(", ")
        ),
    }
    Mamba2Config::from_file(dir.join("config.json"))
        .with_context(|| format!("--model {}", dir.display()))
}

/// The `model_type` of the checkpoint in `dir`: its config.json's, or for a `mamba_ssm`
/// config (which has none) `mamba2` when `ssm_cfg.layer` is `Mamba2` and `mamba` otherwise (as
/// `mamba_ssm` defaults to Mamba-1); `None` for a config that is neither.
pub(crate) fn model_type(dir: &Path) -> Result<Option<String>> {
    use serde_json::Value;
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("--model {}: reading {}", dir.display(), path.display()))?;
    let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    if let Some(t) = value.get("model_type").and_then(Value::as_str) {
        return Ok(Some(t.to_string()));
    }
    if value.get("d_model").is_none() {
        return Ok(None);
    }
    let layer = value.pointer("/ssm_cfg/layer").and_then(Value::as_str);
    Ok(Some(
        if layer == Some("Mamba2") {
            "mamba2"
        } else {
            "mamba"
        }
        .to_string(),
    ))
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum ParallelArg {
    Heads,
    Batch,
}

impl ParallelArg {
    pub(crate) fn kind(self) -> Parallel {
        match self {
            ParallelArg::Heads => Parallel::Heads,
            ParallelArg::Batch => Parallel::Batch,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Bf16Dots {
    Auto,
    On,
    Off,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Precision {
    F32,
    Bf16,
    Int8,
}

impl Precision {
    /// The dtype the models take for these matrices.
    pub(crate) fn dtype(self) -> DType {
        match self {
            Precision::F32 => DType::F32,
            Precision::Bf16 => DType::BF16,
            Precision::Int8 => stablegraph::models::quant::QUANTIZED,
        }
    }
}

/// The matrices' dtype for people and `--json`: `f32`, `bf16`, or `int8` for 8-bit matrices.
pub(crate) fn dtype_name(dtype: DType) -> String {
    if dtype == stablegraph::models::quant::QUANTIZED {
        "int8".into()
    } else {
        dtype.to_string()
    }
}

/// The prompts.
#[derive(Args)]
pub(crate) struct PromptArgs {
    /// Prompt text, encoded with the model's tokenizer.json, or as its UTF-8 bytes for a model
    /// with a 256-token vocabulary and no tokenizer (the shipped model).
    #[arg(long, conflicts_with = "prompt_ids")]
    pub(crate) prompt: Option<String>,
    /// Prompt token ids, comma-separated; `;` separates the prompts of a batch: `1,2,3;4,5`.
    /// Prompts of different lengths are left-padded and masked.
    #[arg(long, value_name = "IDS")]
    pub(crate) prompt_ids: Option<String>,
    /// Length of the default prompt, used when neither --prompt nor --prompt-ids is given:
    /// deterministic pseudo-random ids, or with a byte vocabulary the bytes of a fixed Rust
    /// snippet (repeated to N bytes).
    #[arg(long, default_value_t = 128, value_name = "N")]
    pub(crate) prompt_len: usize,
    /// Repeat the prompt (all of them, with --prompt-ids groups) N times: N times the rows.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub(crate) batch: usize,
}

/// Generation options. Sampling and penalty settings not given as flags come from the model's
/// generation_config.json when it has one (see [`SamplingArgs::options`]).
#[derive(Args)]
pub(crate) struct SamplingArgs {
    /// New tokens per row.
    #[arg(long, default_value_t = 128, value_name = "N")]
    pub(crate) max_new_tokens: usize,
    /// Sampling temperature. 0: greedy, and the model's generation_config.json is not read
    /// (only the flags given apply). Default: the model's generation_config.json (the shipped
    /// model has one, which samples with penalties), else greedy. Penalties apply to greedy
    /// and sampled decoding alike, before the temperature.
    #[arg(long, value_name = "T")]
    pub(crate) temperature: Option<f32>,
    /// Sample among the k most likely tokens only (0: all). Default: the generation config's
    /// top_k, else 0.
    #[arg(long, value_name = "K")]
    pub(crate) top_k: Option<usize>,
    /// Sample from the smallest set of tokens whose probability reaches P (1: all). Default:
    /// the generation config's top_p, else 1.
    #[arg(long, value_name = "P")]
    pub(crate) top_p: Option<f32>,
    /// Sampling seed (fixed, so that sampled output is reproducible).
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Repetition penalty (transformers' repetition_penalty): the logit of a token in the
    /// --repeat-last-n window is divided by P if positive, multiplied by P if negative (1: off,
    /// > 1 discourages repeats). Default: the generation config's repetition_penalty, else 1.
    #[arg(long, allow_negative_numbers = true, value_name = "P")]
    pub(crate) repeat_penalty: Option<f32>,
    /// Subtracted once from the logit of each token in the window (0: off). Default: the
    /// generation config's presence_penalty, else 0.
    #[arg(long, allow_negative_numbers = true, value_name = "X")]
    pub(crate) presence_penalty: Option<f32>,
    /// Subtracted from the logit of each token in the window once per occurrence (0: off).
    /// Default: the generation config's frequency_penalty, else 0.
    #[arg(long, allow_negative_numbers = true, value_name = "X")]
    pub(crate) frequency_penalty: Option<f32>,
    /// The window of the three penalties above: the last N tokens of the context (prompt and
    /// generated; 0: none, so they do nothing), -1: the whole context. Default: the generation
    /// config's repeat_last_n, else -1.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(crate) repeat_last_n: Option<i64>,
    /// Ban every token that would repeat an n-gram of this size already in the context
    /// (transformers' no_repeat_ngram_size; 0: off). Default: the generation config's
    /// no_repeat_ngram_size, else 0.
    #[arg(long, value_name = "N")]
    pub(crate) no_repeat_ngram_size: Option<usize>,
    /// End-of-sequence token id: a row stops after emitting it.
    #[arg(long, value_name = "ID")]
    pub(crate) eos: Option<u32>,
}

impl ModelArgs {
    /// Where the weights come from (see [`ModelArgs::source`]), the model's config and how its
    /// tokens relate to text: cheap, before anything is loaded. Also checks `--devices`.
    pub(crate) fn model_config(
        &self,
        random_default: bool,
    ) -> Result<(Source, Mamba2Config, Codec)> {
        ensure!(self.devices > 0, "--devices must be at least 1");
        let source = self.source(random_default);
        let (config, codec) = match &source {
            Source::Checkpoint { dir, .. } => {
                let config = read_config(dir)?;
                let codec = Codec::for_model(Some(dir), config.vocab_size)?;
                (config, codec)
            }
            Source::Random(shape) => (
                Mamba2Config::sized(shape.name())?,
                Codec::for_model(None, 0)?,
            ),
        };
        Ok((source, config, codec))
    }

    /// Creates the client, loads or draws the weights and uploads them: the model and a line
    /// describing it.
    pub(crate) fn place(
        &self,
        source: &Source,
        config: Mamba2Config,
    ) -> Result<(Client, Mamba2, String)> {
        let m = self;
        if matches!(m.parallel, ParallelArg::Heads) {
            ensure!(
                config.num_heads.is_multiple_of(m.devices),
                "--devices {} --parallel heads: the model's {} heads do not divide into {} \
                 equal parts",
                m.devices,
                config.num_heads,
                m.devices
            );
        }
        let client = crate::client(m.plugin.as_deref(), m.devices)?;
        let dtype = m.dtype.dtype();
        let (weights, name) = load_weights(m, source, &config, dtype)?;
        let mut description = format!(
            "{name}: {} layers, {} wide, vocab {}, {} matrices",
            config.num_layers,
            config.hidden_size,
            config.vocab_size,
            dtype_name(dtype)
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
        let model = Mamba2::new_parallel(&client, config, weights, m.parallel.kind(), m.devices)?
            .with_prefill_chunk(m.prefill_chunk)?
            .with_bf16_dots(bf16_dots);
        Ok((client, model, description))
    }
}

impl PromptArgs {
    /// The prompts these flags give (--batch copies of them), as token ids below `vocab`.
    pub(crate) fn prompts(&self, codec: &Codec, vocab: usize) -> Result<Vec<Vec<u32>>> {
        let prompts = match (&self.prompt, &self.prompt_ids) {
            (Some(text), _) => vec![codec.encode(text)?],
            (None, Some(ids)) => parse_prompt_ids(ids)?,
            (None, None) => {
                ensure!(self.prompt_len > 0, "--prompt-len must be at least 1");
                match codec.is_bytes() {
                    true => vec![default_text_prompt(self.prompt_len)],
                    false => vec![default_prompt(self.prompt_len, vocab)],
                }
            }
        };
        ensure!(self.batch > 0, "--batch must be at least 1");
        let prompts: Vec<Vec<u32>> = (0..self.batch).flat_map(|_| prompts.clone()).collect();
        for (r, row) in prompts.iter().enumerate() {
            if let Some(bad) = row.iter().find(|&&t| t as usize >= vocab) {
                bail!("token id {bad} (prompt {r}) is outside the vocabulary of {vocab}");
            }
        }
        Ok(prompts)
    }
}

/// The weights `source` names, and its name for the description.
fn load_weights(
    m: &ModelArgs,
    source: &Source,
    config: &Mamba2Config,
    dtype: DType,
) -> Result<(Mamba2Weights<HostArray>, String)> {
    Ok(match source {
        Source::Checkpoint { dir, shipped } => {
            progress(&format!("loading weights from {}", dir.display()));
            let options = LoadOptions {
                allow_nonfinite: m.allow_nonfinite,
            };
            let w = Mamba2Weights::load_with(dir, config, dtype, &options).map_err(|e| {
                let hint = if e.to_string().contains("NaN or infinite") {
                    " (--allow-nonfinite loads it anyway)"
                } else {
                    ""
                };
                anyhow::Error::new(e).context(format!("--model {}{hint}", dir.display()))
            })?;
            let name = if *shipped {
                format!("{SHIPPED_MODEL} (the shipped byte-level model)")
            } else {
                dir.display().to_string()
            };
            (w, name)
        }
        Source::Random(shape) => {
            let size = shape.name().to_uppercase();
            progress(&format!("drawing random weights for the {size} shape"));
            let w = Mamba2Weights::random(config, dtype, m.weights_seed)?;
            let source = format!("{size} shape, random weights (seed {})", m.weights_seed);
            (w, source)
        }
    })
}

/// The generation_config.json of a checkpoint directory, when it has one.
fn read_generation_config(dir: &Path) -> Result<Option<(PathBuf, GenerationConfig)>> {
    let path = dir.join("generation_config.json");
    if !path.is_file() {
        return Ok(None);
    }
    let config =
        GenerationConfig::from_file(&path).with_context(|| format!("--model {}", dir.display()))?;
    Ok(Some((path, config)))
}

/// Parses `1,2,3;4,5` into prompts.
pub(crate) fn parse_prompt_ids(text: &str) -> Result<Vec<Vec<u32>>> {
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

/// The default prompt of a byte-level model: this snippet's bytes, repeated to `len`.
const DEFAULT_TEXT: &str = "use stablegraph::ops::{Graph, Tensor};\n\n\
/// Builds the graph of one layer and returns its output.\n\
fn build(g: &Graph, x: &Tensor) -> stablegraph::Result<Tensor> {\n    ";

/// `len` bytes of [`DEFAULT_TEXT`] (repeated as needed) as byte-vocabulary ids.
fn default_text_prompt(len: usize) -> Vec<u32> {
    let bytes: Vec<u8> = DEFAULT_TEXT.bytes().cycle().take(len).collect();
    bytes_to_ids(&bytes)
}

impl SamplingArgs {
    /// The generation options for a model from `source` with `vocab` tokens (see
    /// [`SamplingArgs::options`]), and the generation_config.json they took defaults from:
    /// the checkpoint's, when it has one and --temperature is not 0.
    pub(crate) fn options_for(
        &self,
        source: &Source,
        vocab: usize,
    ) -> Result<(GenerateOptions, Option<PathBuf>)> {
        let config = match source {
            Source::Checkpoint { dir, .. } => read_generation_config(dir)?,
            Source::Random(_) => None,
        };
        let options = self.options(vocab, config.as_ref().map(|(_, c)| c))?;
        let from = config
            .filter(|_| self.temperature != Some(0.0))
            .map(|(path, _)| path);
        Ok((options, from))
    }

    /// The generation options, checked against a vocabulary of `vocab` tokens: the flags
    /// given, then `config` (the model's generation_config.json) for those not given, then
    /// greedy without penalties. `--temperature 0` is greedy and ignores `config`.
    pub(crate) fn options(
        &self,
        vocab: usize,
        config: Option<&GenerationConfig>,
    ) -> Result<GenerateOptions> {
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
        let config = match self.temperature {
            Some(0.0) => None,
            _ => config,
        };
        let from_config = config.map(|c| c.sampling(self.seed, vocab));
        let (temperature, top_k, top_p) = match (self.temperature, from_config) {
            (Some(0.0), _) | (None, None | Some(Sampling::Greedy)) => (None, 0, 1.0),
            (Some(t), None | Some(Sampling::Greedy)) => (Some(t), 0, 1.0),
            (
                t,
                Some(Sampling::Sample {
                    temperature,
                    top_k,
                    top_p,
                    ..
                }),
            ) => (Some(t.unwrap_or(temperature)), top_k, top_p),
        };
        let sampling = match temperature {
            None => Sampling::Greedy,
            Some(temperature) => {
                ensure!(
                    temperature > 0.0 && temperature.is_finite(),
                    "--temperature must be a positive number (or 0 for greedy)"
                );
                let top_p = self.top_p.unwrap_or(top_p);
                ensure!(top_p > 0.0 && top_p <= 1.0, "--top-p must be in (0, 1]");
                let top_k = self.top_k.unwrap_or(top_k);
                ensure!(
                    top_k <= vocab,
                    "--top-k {top_k} exceeds the vocabulary of {vocab}"
                );
                Sampling::Sample {
                    temperature,
                    top_k,
                    top_p,
                    seed: self.seed,
                }
            }
        };
        Ok(GenerateOptions {
            max_new_tokens: self.max_new_tokens,
            sampling,
            eos: self.eos,
            penalties: self.penalties(config)?,
        })
    }

    /// The penalties: the flags given, then `config`'s, then none.
    fn penalties(&self, config: Option<&GenerationConfig>) -> Result<Penalties> {
        let base = config.map_or(Penalties::NONE, GenerationConfig::penalties);
        let repeat_last_n = match self.repeat_last_n {
            None => base.repeat_last_n,
            Some(-1) => None,
            Some(n) => Some(usize::try_from(n).map_err(|_| {
                anyhow::anyhow!(
                    "--repeat-last-n {n}: expected a count >= 0, or -1 for the whole context"
                )
            })?),
        };
        let penalties = Penalties {
            repetition_penalty: self.repeat_penalty.unwrap_or(base.repetition_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(base.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(base.frequency_penalty),
            repeat_last_n,
            no_repeat_ngram_size: self
                .no_repeat_ngram_size
                .unwrap_or(base.no_repeat_ngram_size),
        };
        penalties.check().map_err(|e| {
            let flag = match e.to_string() {
                m if m.contains("repetition_penalty") => "--repeat-penalty",
                m if m.contains("presence_penalty") => "--presence-penalty",
                m if m.contains("frequency_penalty") => "--frequency-penalty",
                _ => "--no-repeat-ngram-size",
            };
            anyhow::Error::new(e).context(flag)
        })?;
        Ok(penalties)
    }
}
