//! Hybrid configuration: HF's `config.json` for `model_type` `bamba`, `granitemoehybrid` and
//! `nemotron_h`, read into one description of sublayers (Mamba-2 mixers, attention, MLPs and
//! mixtures of experts, each behind its own RMS norm and residual).

use std::path::Path;

use serde_json::Value;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::models::common::json::{number, strict_json, time_step_limit};
use crate::models::mamba2::Mamba2Config;

use crate::models::engine::attention::rope_from_config;
pub use crate::models::engine::attention::{AttentionConfig, RopeScaling};

/// The `model_type`s a [`HybridConfig`] reads.
pub const MODEL_TYPES: [&str; 3] = ["bamba", "granitemoehybrid", "nemotron_h"];

/// The family a hybrid checkpoint belongs to (its `model_type`), which fixes its tensor names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HybridFamily {
    /// IBM's Bamba: Mamba-2 or attention, each followed by a gated MLP; rotary on the leading
    /// `partial_rotary_factor` (half by default) of each head.
    Bamba,
    /// IBM's Granite 4.0-H (`granitemoehybrid`): Mamba-2 or attention, each followed by a
    /// mixture of experts with a shared expert (or the shared MLP alone); embedding, residual,
    /// attention and logit multipliers.
    Granite,
    /// NVIDIA's Nemotron-H: one mixer per layer (Mamba-2, attention, squared-ReLU MLP or
    /// mixture of experts) after the pattern of `layers_block_type`; no rotary.
    NemotronH,
    /// Llama ([`crate::models::llama`]): attention then a SwiGLU MLP per layer.
    Llama,
    /// Qwen 2: Llama with biases on the query, key and value projections.
    Qwen2,
    /// Qwen 3: Llama with per-head query and key norms.
    Qwen3,
    /// Mistral: Llama with a sliding window.
    Mistral,
    /// Gemma 2 ([`crate::models::gemma2`]).
    Gemma2,
}

impl HybridFamily {
    /// The `model_type` of the family.
    pub fn model_type(self) -> &'static str {
        match self {
            HybridFamily::Bamba => "bamba",
            HybridFamily::Granite => "granitemoehybrid",
            HybridFamily::NemotronH => "nemotron_h",
            HybridFamily::Llama => "llama",
            HybridFamily::Qwen2 => "qwen2",
            HybridFamily::Qwen3 => "qwen3",
            HybridFamily::Mistral => "mistral",
            HybridFamily::Gemma2 => "gemma2",
        }
    }

    /// The family's name as people write it.
    pub fn name(self) -> &'static str {
        match self {
            HybridFamily::Bamba => "Bamba",
            HybridFamily::Granite => "Granite 4.0-H",
            HybridFamily::NemotronH => "Nemotron-H",
            HybridFamily::Llama => "Llama",
            HybridFamily::Qwen2 => "Qwen2",
            HybridFamily::Qwen3 => "Qwen3",
            HybridFamily::Mistral => "Mistral",
            HybridFamily::Gemma2 => "Gemma 2",
        }
    }

    /// Whether the family is a transformer of the Llama or Gemma 2 layout (attention then an
    /// MLP per layer, named as transformers' `LlamaForCausalLM` names them).
    pub fn is_transformer(self) -> bool {
        !matches!(
            self,
            HybridFamily::Bamba | HybridFamily::Granite | HybridFamily::NemotronH
        )
    }
}

/// What a sublayer computes between its RMS norm and its residual.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SublayerKind {
    /// A Mamba-2 mixer (its state: the convolution inputs and the SSM state).
    Mamba,
    /// Causal self-attention (its state: the keys and values).
    Attention,
    /// A dense MLP.
    Mlp,
    /// A mixture of experts (with the shared expert, if the config has one).
    Moe,
}

/// An MLP's activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) * up`: the up projection holds the gate's rows, then the up rows.
    SwiGlu,
    /// `relu(up)^2`, no gate.
    Relu2,
    /// `gelu_tanh(gate) * up` (Gemma's GeGLU, GELU's tanh approximation), laid out as
    /// [`Activation::SwiGlu`].
    GeluTanhGlu,
}

/// How a mixture of experts picks and weighs its experts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Routing {
    /// Granite: the `top_k` largest router logits, weighed by the softmax over them.
    SoftmaxTopK,
    /// Nemotron-H: sigmoid scores; the choice adds a correction bias, keeps the `topk_group`
    /// groups whose two best scores sum highest, then the `top_k` best; the weights are the
    /// chosen scores (divided by their sum when `normalize`) times `scale`.
    SigmoidGrouped {
        /// Groups the experts are split into.
        n_group: usize,
        /// Groups kept.
        topk_group: usize,
        /// Whether the chosen scores are divided by their sum.
        normalize: bool,
        /// The factor on the weights (`routed_scaling_factor`).
        scale: f64,
    },
}

/// An MLP's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlpConfig {
    /// Hidden width.
    pub intermediate: usize,
    /// Activation.
    pub activation: Activation,
    /// Biases on the projections (Llama's `mlp_bias`).
    pub bias: bool,
}

/// A mixture of experts' shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeConfig {
    /// Routed experts.
    pub num_experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Each routed expert's MLP.
    pub expert: MlpConfig,
    /// The shared expert's MLP, run on every token beside the routed ones.
    pub shared: Option<MlpConfig>,
    /// How experts are chosen.
    pub routing: Routing,
    /// The coefficient of the router load-balancing loss added to the training loss, when
    /// the config asks for it (transformers' `router_aux_loss_coef` with
    /// `output_router_logits`).
    pub router_aux_loss: Option<f64>,
}

/// The shape and numerics of a hybrid model.
#[derive(Debug, Clone, PartialEq)]
pub struct HybridConfig {
    /// The family (fixes tensor names).
    pub family: HybridFamily,
    /// The sublayers in order, each `h + residual_multiplier * f(rms_norm(h))`.
    pub sublayers: Vec<SublayerKind>,
    /// The checkpoint layer each sublayer belongs to.
    pub layer_of: Vec<usize>,
    /// The Mamba-2 mixers' config (`num_layers`: how many there are). Its `time_step_limit`
    /// clamps `dt` in the prefill only, as transformers does (Nemotron-H's is
    /// `(time_step_min, inf)`).
    pub mamba: Mamba2Config,
    /// The attention sublayers' shape.
    pub attention: AttentionConfig,
    /// The dense MLPs' shape, if there are any.
    pub mlp: Option<MlpConfig>,
    /// The mixtures of experts' shape, if there are any.
    pub moe: Option<MoeConfig>,
    /// Model width.
    pub hidden_size: usize,
    /// Vocabulary size of the embedding and the head.
    pub vocab_size: usize,
    /// Epsilon of every RMS norm.
    pub norm_eps: f64,
    /// Factor on the embeddings (Granite).
    pub embedding_multiplier: f64,
    /// Factor on every sublayer's output before the residual (Granite).
    pub residual_multiplier: f64,
    /// Divisor of the logits (Granite).
    pub logits_scaling: f64,
    /// Whether the head is the embedding.
    pub tie_word_embeddings: bool,
    /// Per sublayer: whether it is an attention sublayer that attends only within
    /// `attention.sliding_window`.
    pub sliding: Vec<bool>,
    /// Whether each sublayer's output is normed again before the residual (Gemma 2).
    pub post_norms: bool,
    /// Added to every RMS norm's weight: 1 for Gemma's `(1 + w)`, else 0.
    pub norm_offset: f64,
    /// The logits soft-capped to `cap * tanh(logits / cap)` (Gemma 2).
    pub final_softcap: Option<f64>,
}

/// Reads sizes, numbers and flags of a config object, collecting what is missing.
pub(crate) struct Fields<'a> {
    /// The config.
    pub(crate) v: &'a Value,
    /// The required fields it lacks.
    pub(crate) missing: Vec<String>,
}

impl Fields<'_> {
    /// A required size (0 and noted as missing when absent).
    pub(crate) fn size(&mut self, name: &str) -> usize {
        match self.v.get(name).and_then(Value::as_u64) {
            Some(n) => n as usize,
            None => {
                self.missing.push(name.to_string());
                0
            }
        }
    }
    /// A size, or `default` when absent.
    pub(crate) fn size_or(&self, name: &str, default: usize) -> usize {
        self.v
            .get(name)
            .and_then(Value::as_u64)
            .map_or(default, |n| n as usize)
    }
    /// A number, or `default` when absent.
    pub(crate) fn float_or(&self, name: &str, default: f64) -> f64 {
        self.v.get(name).and_then(number).unwrap_or(default)
    }
    /// A flag, or `default` when absent.
    pub(crate) fn flag_or(&self, name: &str, default: bool) -> bool {
        self.v.get(name).and_then(Value::as_bool).unwrap_or(default)
    }
}

impl HybridConfig {
    /// The window sublayer `i` attends within, if it slides.
    pub fn window(&self, i: usize) -> Option<usize> {
        self.attention
            .sliding_window
            .filter(|_| self.sliding.get(i) == Some(&true))
    }

    /// The columns of sublayer `i`'s key/value cache in a state of `capacity` columns: a
    /// sliding sublayer's cache is a ring of its window (or of `capacity`, when smaller).
    pub fn cache_columns(&self, i: usize, capacity: usize) -> usize {
        self.window(i).map_or(capacity, |w| w.min(capacity))
    }

    /// Reads `config.json` from the checkpoint directory `dir`.
    pub fn load(dir: &Path) -> Result<HybridConfig> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        HybridConfig::from_json(&text)
            .map_err(|e| Error::InvalidArgument(format!("{}: {e}", path.display())))
    }

    /// Parses HF's config of a `bamba`, `granitemoehybrid` or `nemotron_h` model (as
    /// transformers 5 writes it, and the older spellings on the hub: top-level `rope_theta`,
    /// Granite's `mamba`/`attention` layer types, Nemotron-H's `hybrid_override_pattern`).
    /// Another `model_type`, a missing size or inconsistent fields are an error naming them.
    pub fn from_json(text: &str) -> Result<HybridConfig> {
        let v: Value = serde_json::from_str(&strict_json(text))
            .map_err(|e| Error::InvalidArgument(format!("config is not JSON: {e}")))?;
        let family = match v.get("model_type").and_then(Value::as_str).unwrap_or("") {
            "bamba" => HybridFamily::Bamba,
            "granitemoehybrid" => HybridFamily::Granite,
            "nemotron_h" => HybridFamily::NemotronH,
            "llama" => HybridFamily::Llama,
            "qwen2" => HybridFamily::Qwen2,
            "qwen3" => HybridFamily::Qwen3,
            "mistral" => HybridFamily::Mistral,
            "gemma2" => HybridFamily::Gemma2,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "model_type {other:?} is not a model of the layer stack (expected one of \
                     {MODEL_TYPES:?}, {:?} or {:?})",
                    crate::models::llama::MODEL_TYPES,
                    crate::models::gemma2::MODEL_TYPE
                )))
            }
        };
        let mut f = Fields {
            v: &v,
            missing: Vec::new(),
        };
        let config = match family {
            HybridFamily::NemotronH => nemotron_h(&mut f)?,
            HybridFamily::Bamba | HybridFamily::Granite => bamba_or_granite(&mut f, family)?,
            HybridFamily::Gemma2 => crate::models::gemma2::read(&mut f)?,
            llama => crate::models::llama::read(&mut f, llama)?,
        };
        if !f.missing.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "the {} config lacks {}",
                family.model_type(),
                f.missing.join(", ")
            )));
        }
        config.validate()?;
        Ok(config)
    }

    /// How many sublayers of `kind` the model has.
    pub fn count(&self, kind: SublayerKind) -> usize {
        self.sublayers.iter().filter(|&&k| k == kind).count()
    }
}

/// The Mamba-2 mixers' config from the `mamba_*` fields (`prefix` "mamba_" for Bamba and
/// Granite; Nemotron-H names some fields without it, which `alt` maps).
fn mamba_config(
    f: &mut Fields<'_>,
    hidden_size: usize,
    vocab_size: usize,
    num_layers: usize,
    names: [&str; 8],
) -> Result<Mamba2Config> {
    let [heads, head_dim, groups, state, conv, expand, chunk, bias] = names;
    let num_heads = f.size_or(heads, 128);
    let expand = f.size_or(expand, 2);
    let head_dim = match f.v.get(head_dim) {
        Some(v) if v.as_u64().is_some() => v.as_u64().unwrap_or(0) as usize,
        _ => expand.saturating_mul(hidden_size) / num_heads.max(1),
    };
    if num_layers > 0 && num_heads.saturating_mul(head_dim) != expand.saturating_mul(hidden_size) {
        return Err(Error::InvalidArgument(format!(
            "{heads} ({num_heads}) * {names1} ({head_dim}) is not {expand} * hidden_size \
             ({hidden_size})",
            names1 = names[1]
        )));
    }
    let limit_name = if f.v.get("mamba_dt_limit").is_some() {
        "mamba_dt_limit"
    } else {
        "time_step_limit"
    };
    Ok(Mamba2Config {
        hidden_size,
        num_layers,
        state_size: f.size_or(state, 128),
        head_dim,
        num_heads,
        n_groups: f.size_or(groups, 1),
        conv_kernel: f.size_or(conv, 4),
        chunk_size: f.size_or(chunk, 256),
        vocab_size,
        time_step_limit: time_step_limit(f.v.get(limit_name))?,
        norm_eps: 1e-5,
        residual_in_fp32: true,
        tie_word_embeddings: false,
        use_bias: f.flag_or(bias, false),
        use_conv_bias: f.flag_or("mamba_conv_bias", true) && f.flag_or("use_conv_bias", true),
        norm_before_gate: false,
        time_step_init: (1e-3, 1e-1, 1e-4),
        scan_dtype: DType::F32,
    })
}

/// The Mamba-2 config of a stack without Mamba-2 mixers (attention and MLPs only): unused but
/// for its chunk, which pads prompts to a multiple of 64 positions (or of the power of two
/// above a shorter prompt).
fn no_mamba(hidden_size: usize, vocab_size: usize) -> Mamba2Config {
    Mamba2Config {
        hidden_size,
        num_layers: 0,
        state_size: 16,
        head_dim: 64,
        num_heads: 1,
        n_groups: 1,
        conv_kernel: 4,
        chunk_size: 64,
        vocab_size,
        time_step_limit: (0.0, f64::INFINITY),
        norm_eps: 1e-5,
        residual_in_fp32: true,
        tie_word_embeddings: false,
        use_bias: false,
        use_conv_bias: true,
        norm_before_gate: false,
        time_step_init: (1e-3, 1e-1, 1e-4),
        scan_dtype: DType::F32,
    }
}

/// A transformer's stack: `layers` layers of `attention` then an MLP of `mlp`, the layers
/// marked in `sliding` attending within the window; plain RMS norms (`rms_norm_eps`), no
/// multipliers, no post norms or final cap (the family sets those it has). The sizes come
/// from `f`.
pub(crate) fn attention_then_mlp(
    f: &Fields<'_>,
    family: HybridFamily,
    (hidden_size, vocab_size): (usize, usize),
    attention: AttentionConfig,
    mlp: MlpConfig,
    sliding: &[bool],
) -> HybridConfig {
    let layers = sliding.len();
    HybridConfig {
        family,
        sublayers: (0..layers)
            .flat_map(|_| [SublayerKind::Attention, SublayerKind::Mlp])
            .collect(),
        layer_of: (0..layers).flat_map(|l| [l, l]).collect(),
        mamba: no_mamba(hidden_size, vocab_size),
        attention,
        mlp: Some(mlp),
        moe: None,
        hidden_size,
        vocab_size,
        norm_eps: f.float_or("rms_norm_eps", 1e-6),
        embedding_multiplier: 1.0,
        residual_multiplier: 1.0,
        logits_scaling: 1.0,
        tie_word_embeddings: f.flag_or("tie_word_embeddings", false),
        sliding: sliding.iter().flat_map(|&s| [s, false]).collect(),
        post_norms: false,
        norm_offset: 0.0,
        final_softcap: None,
    }
}

/// Bamba's `partial_rotary_factor`: from `rope_parameters` (transformers 5) or the top level,
/// else the 0.5 transformers' `BambaConfig` sets.
fn partial_rotary_factor(v: &Value) -> f64 {
    v.get("rope_parameters")
        .and_then(|p| p.get("partial_rotary_factor"))
        .or_else(|| v.get("partial_rotary_factor"))
        .and_then(number)
        .unwrap_or(0.5)
}

/// Refuses an activation other than `want`.
fn check_act(f: &Fields<'_>, name: &str, want: &[&str]) -> Result<()> {
    match f.v.get(name).and_then(Value::as_str) {
        Some(a) if !want.contains(&a) => Err(Error::InvalidArgument(format!(
            "{name} {a:?} is not supported (expected {})",
            want.join(" or ")
        ))),
        _ => Ok(()),
    }
}

/// Refuses `mlp_bias` (no published hybrid has MLP biases).
fn refuse_mlp_bias(f: &Fields<'_>) -> Result<()> {
    if f.flag_or("mlp_bias", false) {
        return Err(Error::InvalidArgument(
            "mlp_bias = true is not supported".into(),
        ));
    }
    Ok(())
}

/// Which layers of Bamba or Granite are attention (the others Mamba-2): Granite's
/// `layer_types` (`mamba`/`attention`, or transformers 5's `linear_attention`/`full_attention`),
/// Bamba's `attn_layer_indices`.
fn attention_layers(f: &Fields<'_>, granite: bool, layers: usize) -> Result<Vec<bool>> {
    Ok(if granite {
        match f
            .v
            .get("layer_types")
            .or_else(|| f.v.get("layers_block_type"))
        {
            Some(Value::Array(types)) => types
                .iter()
                .map(|t| match t.as_str() {
                    Some("mamba" | "linear_attention") => Ok(false),
                    Some("attention" | "full_attention") => Ok(true),
                    _ => Err(Error::InvalidArgument(format!(
                        "layer_types holds {t}, expected \"mamba\" or \"attention\""
                    ))),
                })
                .collect::<Result<_>>()?,
            _ => vec![false; layers],
        }
    } else {
        let indices: Vec<u64> = match f.v.get("attn_layer_indices") {
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).collect(),
            _ => Vec::new(),
        };
        if let Some(&i) = indices.iter().find(|&&i| i as usize >= layers) {
            return Err(Error::InvalidArgument(format!(
                "attn_layer_indices holds {i}, beyond num_hidden_layers ({layers})"
            )));
        }
        (0..layers).map(|l| indices.contains(&(l as u64))).collect()
    })
}

/// Bamba's or Granite's feed-forward part: Granite's experts with the shared MLP, or the
/// shared MLP alone (no experts), or Bamba's MLP.
fn feed_forward(
    f: &mut Fields<'_>,
    granite: bool,
) -> (SublayerKind, Option<MlpConfig>, Option<MoeConfig>) {
    let experts = if granite {
        f.size_or("num_local_experts", 0)
    } else {
        0
    };
    let gated = |intermediate| MlpConfig {
        intermediate,
        activation: Activation::SwiGlu,
        bias: false,
    };
    if experts > 0 {
        let moe = MoeConfig {
            num_experts: experts,
            top_k: f.size_or("num_experts_per_tok", 2),
            expert: gated(f.size("intermediate_size")),
            shared: Some(gated(f.size("shared_intermediate_size"))),
            routing: Routing::SoftmaxTopK,
            router_aux_loss: f
                .flag_or("output_router_logits", false)
                .then(|| f.float_or("router_aux_loss_coef", 0.001)),
        };
        (SublayerKind::Moe, None, Some(moe))
    } else if granite {
        let shared = gated(f.size("shared_intermediate_size"));
        (SublayerKind::Mlp, Some(shared), None)
    } else {
        (
            SublayerKind::Mlp,
            Some(gated(f.size("intermediate_size"))),
            None,
        )
    }
}

/// Bamba and Granite: every layer is a mixer (Mamba-2 or attention) then a feed-forward part.
fn bamba_or_granite(f: &mut Fields<'_>, family: HybridFamily) -> Result<HybridConfig> {
    let granite = family == HybridFamily::Granite;
    check_act(f, "hidden_act", &["silu", "swish"])?;
    let (rope_theta, rope_scaling) = rope_from_config(f.v)?;
    refuse_mlp_bias(f)?;
    let hidden_size = f.size("hidden_size");
    let vocab_size = f.size("vocab_size");
    let layers = f.size("num_hidden_layers");
    let heads = f.size("num_attention_heads");
    let kv_heads = f.size_or("num_key_value_heads", heads);
    let head_dim = f.size_or("head_dim", hidden_size / heads.max(1));
    let mixers = attention_layers(f, granite, layers)?;
    if mixers.len() != layers {
        return Err(Error::InvalidArgument(format!(
            "layer_types has {} entries, num_hidden_layers is {layers}",
            mixers.len()
        )));
    }
    let (ff, mlp, moe) = feed_forward(f, granite);
    let mut sublayers = Vec::new();
    let mut layer_of = Vec::new();
    for (l, &attention) in mixers.iter().enumerate() {
        let mixer = if attention {
            SublayerKind::Attention
        } else {
            SublayerKind::Mamba
        };
        sublayers.extend([mixer, ff]);
        layer_of.extend([l, l]);
    }
    let mamba_layers = mixers.iter().filter(|a| !**a).count();
    let names = [
        "mamba_n_heads",
        "mamba_d_head",
        "mamba_n_groups",
        "mamba_d_state",
        "mamba_d_conv",
        "mamba_expand",
        "mamba_chunk_size",
        "mamba_proj_bias",
    ];
    let mut mamba = mamba_config(f, hidden_size, vocab_size, mamba_layers, names)?;
    let eps = f.float_or("rms_norm_eps", if granite { 1e-6 } else { 1e-5 });
    mamba.norm_eps = eps;
    let rope =
        !granite || f.v.get("position_embedding_type").and_then(Value::as_str) == Some("rope");
    let rotary_dim = match (rope, granite) {
        (false, _) => 0,
        (true, true) => head_dim,
        // Bamba turns the leading `partial_rotary_factor` of each head (0.5 unless the config
        // says otherwise), as many channels as transformers' frequencies cover.
        (true, false) => ((head_dim as f64 * partial_rotary_factor(f.v)) as usize).div_ceil(2) * 2,
    };
    let scale = if granite {
        f.float_or("attention_multiplier", 1.0)
    } else {
        1.0 / (head_dim as f64).sqrt()
    };
    let multiplier = |name: &str| if granite { f.float_or(name, 1.0) } else { 1.0 };
    let n = sublayers.len();
    Ok(HybridConfig {
        family,
        sublayers,
        layer_of,
        mamba,
        attention: AttentionConfig {
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            rotary_dim,
            rope_theta,
            rope_scaling,
            scale,
            qkv_bias: f.flag_or("attention_bias", false),
            o_bias: f.flag_or("attention_bias", false),
            qk_norm: None,
            softcap: None,
            sliding_window: None,
        },
        mlp,
        moe,
        hidden_size,
        vocab_size,
        norm_eps: eps,
        embedding_multiplier: multiplier("embedding_multiplier"),
        residual_multiplier: multiplier("residual_multiplier"),
        logits_scaling: multiplier("logits_scaling"),
        tie_word_embeddings: f.flag_or("tie_word_embeddings", false),
        sliding: vec![false; n],
        post_norms: false,
        norm_offset: 0.0,
        final_softcap: None,
    })
}

/// Nemotron-H's sublayers: `layers_block_type` (or the older `hybrid_override_pattern`
/// string: `M` Mamba-2, `*` attention, `-` MLP, `E` experts), checked against
/// `num_hidden_layers` when both are given.
fn nemotron_pattern(f: &mut Fields<'_>) -> Result<Vec<SublayerKind>> {
    let kinds: Vec<SublayerKind> = match (
        f.v.get("layers_block_type")
            .or_else(|| f.v.get("layer_types")),
        f.v.get("hybrid_override_pattern").and_then(Value::as_str),
    ) {
        (Some(Value::Array(types)), _) => types
            .iter()
            .map(|t| match t.as_str() {
                Some("mamba" | "linear_attention") => Ok(SublayerKind::Mamba),
                Some("attention" | "full_attention") => Ok(SublayerKind::Attention),
                Some("mlp") => Ok(SublayerKind::Mlp),
                Some("moe") => Ok(SublayerKind::Moe),
                _ => Err(Error::InvalidArgument(format!(
                    "layers_block_type holds {t}, expected one of \"mamba\", \"attention\", \
                     \"mlp\", \"moe\""
                ))),
            })
            .collect::<Result<_>>()?,
        (_, Some(pattern)) => pattern
            .chars()
            .map(|c| match c {
                'M' => Ok(SublayerKind::Mamba),
                '*' => Ok(SublayerKind::Attention),
                '-' => Ok(SublayerKind::Mlp),
                'E' => Ok(SublayerKind::Moe),
                _ => Err(Error::InvalidArgument(format!(
                    "hybrid_override_pattern holds {c:?}, expected M, *, - or E"
                ))),
            })
            .collect::<Result<_>>()?,
        _ => {
            f.missing.push("layers_block_type".into());
            Vec::new()
        }
    };
    if let Some(n) = f.v.get("num_hidden_layers").and_then(Value::as_u64) {
        if f.v.get("hybrid_override_pattern").is_some() && n as usize != kinds.len() {
            return Err(Error::InvalidArgument(format!(
                "hybrid_override_pattern has {} layers, num_hidden_layers is {n}",
                kinds.len()
            )));
        }
    }
    Ok(kinds)
}

/// Nemotron-H: one mixer per layer, after `layers_block_type` (or the older
/// `hybrid_override_pattern` string: `M` Mamba-2, `*` attention, `-` MLP, `E` experts).
fn nemotron_h(f: &mut Fields<'_>) -> Result<HybridConfig> {
    check_act(f, "mlp_hidden_act", &["relu2"])?;
    check_act(f, "mamba_hidden_act", &["silu", "swish"])?;
    refuse_mlp_bias(f)?;
    let hidden_size = f.size("hidden_size");
    let vocab_size = f.size("vocab_size");
    let kinds = nemotron_pattern(f)?;
    let heads = f.size_or("num_attention_heads", 1);
    let head_dim =
        f.v.get("head_dim")
            .or_else(|| f.v.get("attention_head_dim"))
            .and_then(Value::as_u64)
            .map_or(hidden_size / heads.max(1), |n| n as usize);
    let names = [
        "mamba_num_heads",
        "mamba_head_dim",
        "n_groups",
        "ssm_state_size",
        "conv_kernel",
        "expand",
        "chunk_size",
        "mamba_proj_bias",
    ];
    let mamba_layers = kinds.iter().filter(|k| **k == SublayerKind::Mamba).count();
    let mut mamba = mamba_config(f, hidden_size, vocab_size, mamba_layers, names)?;
    let eps = f.float_or("layer_norm_epsilon", 1e-5);
    mamba.norm_eps = eps;
    // Nemotron-H's mixer clamps dt from below at time_step_min (its time_step_limit unused).
    let dt_min = f.float_or("time_step_min", f.float_or("mamba_dt_min", 1e-3));
    mamba.time_step_limit = (dt_min, f64::INFINITY);
    let relu2 = |intermediate| MlpConfig {
        intermediate,
        activation: Activation::Relu2,
        bias: false,
    };
    let has = |k| kinds.contains(&k);
    let mlp = has(SublayerKind::Mlp).then(|| relu2(f.size("intermediate_size")));
    let moe = if has(SublayerKind::Moe) {
        if f.v.get("moe_latent_size").is_some_and(|v| !v.is_null()) {
            return Err(Error::InvalidArgument(
                "moe_latent_size (latent expert projections) is not supported".into(),
            ));
        }
        let shared = f.size_or("n_shared_experts", 1);
        Some(MoeConfig {
            num_experts: f.size("n_routed_experts"),
            top_k: f.size_or("num_experts_per_tok", 2),
            expert: relu2(f.size("moe_intermediate_size")),
            shared: (shared > 0).then(|| relu2(f.size("moe_shared_expert_intermediate_size"))),
            routing: Routing::SigmoidGrouped {
                n_group: f.size_or("n_group", 1),
                topk_group: f.size_or("topk_group", 1),
                normalize: f.flag_or("norm_topk_prob", true),
                scale: f.float_or("routed_scaling_factor", 1.0),
            },
            router_aux_loss: None,
        })
    } else {
        None
    };
    let n = kinds.len();
    Ok(HybridConfig {
        family: HybridFamily::NemotronH,
        layer_of: (0..kinds.len()).collect(),
        sublayers: kinds,
        mamba,
        attention: AttentionConfig {
            num_heads: heads,
            num_kv_heads: f.size_or("num_key_value_heads", heads),
            head_dim,
            rotary_dim: 0,
            rope_theta: 10000.0,
            rope_scaling: RopeScaling::None,
            scale: 1.0 / (head_dim.max(1) as f64).sqrt(),
            // Nemotron-H's projections have no bias, whatever attention_bias says.
            qkv_bias: false,
            o_bias: false,
            qk_norm: None,
            softcap: None,
            sliding_window: None,
        },
        mlp,
        moe,
        hidden_size,
        vocab_size,
        norm_eps: eps,
        embedding_multiplier: 1.0,
        residual_multiplier: 1.0,
        logits_scaling: 1.0,
        // transformers' NemotronHForCausalLM never ties its head (no tied weights keys): it
        // reads `lm_head.weight` whatever `tie_word_embeddings` says.
        tie_word_embeddings: false,
        sliding: vec![false; n],
        post_norms: false,
        norm_offset: 0.0,
        final_softcap: None,
    })
}
