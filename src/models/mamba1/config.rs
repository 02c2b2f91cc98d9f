//! Mamba-1 configuration: HF's `config.json` for `model_type` `mamba` and `falcon_mamba`.

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::models::common::json::{number, strict_json};
use crate::models::mamba2::Mamba2Config;

/// The shape and numerics of a Mamba-1 (or Falcon-Mamba) model.
#[derive(Debug, Clone, PartialEq)]
pub struct Mamba1Config {
    /// Model width `d_model`.
    pub hidden_size: usize,
    /// Number of blocks.
    pub num_layers: usize,
    /// SSM state size `N` per channel.
    pub state_size: usize,
    /// Width of the mixer, `expand * hidden_size`.
    pub d_inner: usize,
    /// Width of the depthwise causal convolution.
    pub conv_kernel: usize,
    /// Rank of the time step's low-rank projection (`x_proj` → `dt_proj`).
    pub time_step_rank: usize,
    /// Vocabulary size of the embedding and the head.
    pub vocab_size: usize,
    /// Epsilon of the block and final RMS norms.
    pub norm_eps: f64,
    /// Whether the head is the embedding.
    pub tie_word_embeddings: bool,
    /// Biases on `in_proj` and `out_proj`.
    pub use_bias: bool,
    /// A bias on the convolution.
    pub use_conv_bias: bool,
    /// Falcon-Mamba: the epsilon of the weightless RMS norms on `dt`, `B` and `C` (after
    /// `x_proj`); `None` for Mamba-1.
    pub mixer_rms_eps: Option<f64>,
}

/// The `model_type`s this config reads.
pub const MODEL_TYPES: [&str; 2] = ["mamba", "falcon_mamba"];

impl Mamba1Config {
    /// Reads `config.json` from the checkpoint directory `dir`.
    pub fn load(dir: &Path) -> Result<Mamba1Config> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        Mamba1Config::from_json(&text)
            .map_err(|e| Error::InvalidArgument(format!("{}: {e}", path.display())))
    }

    /// Parses HF's config of a `mamba` or `falcon_mamba` model, or `mamba_ssm`'s (`d_model`,
    /// `n_layer`, `ssm_cfg` without a `layer` or with `"Mamba1"`; the vocabulary padded to
    /// `pad_vocab_size_multiple`). `time_step_rank` (`dt_rank`) `"auto"` is
    /// `ceil(hidden_size / 16)`. Another `model_type` or layer, a missing size or inconsistent
    /// fields are an error naming them.
    pub fn from_json(text: &str) -> Result<Mamba1Config> {
        let v: Value = serde_json::from_str(&strict_json(text))
            .map_err(|e| Error::InvalidArgument(format!("config is not JSON: {e}")))?;
        if !v.is_object() {
            return Err(Error::InvalidArgument("config is not a JSON object".into()));
        }
        if v.get("d_model").is_some() && v.get("model_type").is_none() {
            return from_mamba_ssm(&v);
        }
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        if !MODEL_TYPES.contains(&model_type) {
            return Err(Error::InvalidArgument(format!(
                "model_type {model_type:?} is not a Mamba-1 model (expected one of {MODEL_TYPES:?})"
            )));
        }
        if let Some(act) = v.get("hidden_act").and_then(Value::as_str) {
            if act != "silu" && act != "swish" {
                return Err(Error::InvalidArgument(format!(
                    "hidden_act {act:?} is not supported (Mamba-1 here uses silu)"
                )));
            }
        }
        let size = |name: &str| v.get(name).and_then(Value::as_u64).map(|n| n as usize);
        let missing: Vec<&str> = [
            "hidden_size",
            "num_hidden_layers",
            "state_size",
            "vocab_size",
        ]
        .into_iter()
        .filter(|n| size(n).is_none())
        .collect();
        if !missing.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "the Mamba-1 config lacks {}",
                missing.join(", ")
            )));
        }
        let hidden_size = size("hidden_size").unwrap_or(0);
        let expand = size("expand").unwrap_or(2);
        let d_inner = size("intermediate_size")
            .or_else(|| expand.checked_mul(hidden_size))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "expand ({expand}) * hidden_size ({hidden_size}) is too large"
                ))
            })?;
        let time_step_rank = rank(v.get("time_step_rank"), hidden_size, "time_step_rank")?;
        let flag =
            |name: &str, default: bool| v.get(name).and_then(Value::as_bool).unwrap_or(default);
        let float = |name: &str, default: f64| v.get(name).and_then(number).unwrap_or(default);
        let config = Mamba1Config {
            hidden_size,
            num_layers: size("num_hidden_layers").unwrap_or(0),
            state_size: size("state_size").unwrap_or(0),
            d_inner,
            conv_kernel: size("conv_kernel").unwrap_or(4),
            time_step_rank,
            vocab_size: size("vocab_size").unwrap_or(0),
            norm_eps: float("layer_norm_epsilon", 1e-5),
            tie_word_embeddings: flag("tie_word_embeddings", true),
            use_bias: flag("use_bias", false),
            use_conv_bias: flag("use_conv_bias", true),
            mixer_rms_eps: (model_type == "falcon_mamba").then(|| float("mixer_rms_eps", 1e-6)),
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks that no size is 0, that every weight's size in bytes fits an `isize`, that
    /// `num_layers` is at most [`Mamba2Config::MAX_LAYERS`], that the vocabulary fits `i32`
    /// token ids, and that the epsilons are finite and positive. One error lists every problem, naming the fields.
    pub fn validate(&self) -> Result<()> {
        let mut problems = Vec::new();
        for (name, value) in [
            ("hidden_size", self.hidden_size),
            ("num_layers", self.num_layers),
            ("state_size", self.state_size),
            ("d_inner", self.d_inner),
            ("conv_kernel", self.conv_kernel),
            ("time_step_rank", self.time_step_rank),
            ("vocab_size", self.vocab_size),
        ] {
            if value == 0 {
                problems.push(format!("{name} is 0"));
            }
        }
        let (h, di, n, r) = (
            self.hidden_size,
            self.d_inner,
            self.state_size,
            self.time_step_rank,
        );
        let sizes = [
            ("in_proj", [2, di, h]),
            ("x_proj", [r.saturating_add(n.saturating_mul(2)), di, 1]),
            ("A_log", [di, n, 1]),
            ("the embedding", [self.vocab_size, h, 1]),
        ];
        for (name, dims) in sizes {
            let bytes = dims.iter().try_fold(4usize, |acc, &d| acc.checked_mul(d));
            if bytes.is_none_or(|b| b > isize::MAX as usize) {
                problems.push(format!("{name} ({dims:?}) is too large"));
            }
        }
        if self.num_layers > Mamba2Config::MAX_LAYERS {
            problems.push(format!(
                "num_layers ({}) is above {}",
                self.num_layers,
                Mamba2Config::MAX_LAYERS
            ));
        }
        if self.vocab_size > i32::MAX as usize {
            problems.push(format!(
                "vocab_size ({}) exceeds i32 token ids",
                self.vocab_size
            ));
        }
        for (name, eps) in [
            ("norm_eps", Some(self.norm_eps)),
            ("mixer_rms_eps", self.mixer_rms_eps),
        ] {
            if let Some(e) = eps.filter(|e| !(e.is_finite() && *e > 0.0)) {
                problems.push(format!("{name} ({e}) is not finite and positive"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "invalid Mamba-1 config: {}",
                problems.join("; ")
            )))
        }
    }
}

/// A time-step rank: `"auto"` (or absent) is `ceil(hidden_size / 16)`.
fn rank(v: Option<&Value>, hidden_size: usize, name: &str) -> Result<usize> {
    match v {
        None | Some(Value::Null) => Ok(hidden_size.div_ceil(16)),
        Some(Value::String(s)) if s == "auto" => Ok(hidden_size.div_ceil(16)),
        Some(r) => r
            .as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| Error::InvalidArgument(format!("{name} {r} is not \"auto\" or a size"))),
    }
}

/// `mamba_ssm`'s config of a Mamba-1 model (its `MambaConfig` and `Mamba` defaults).
fn from_mamba_ssm(v: &Value) -> Result<Mamba1Config> {
    let size = |v: &Value, name: &str| v.get(name).and_then(Value::as_u64).map(|n| n as usize);
    let missing: Vec<&str> = ["d_model", "n_layer", "vocab_size"]
        .into_iter()
        .filter(|n| size(v, n).is_none())
        .collect();
    if !missing.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "the mamba_ssm config lacks {}",
            missing.join(", ")
        )));
    }
    let empty = Value::Object(Default::default());
    let ssm = v.get("ssm_cfg").unwrap_or(&empty);
    match ssm.get("layer").and_then(Value::as_str) {
        None | Some("Mamba1") => {}
        Some(layer) => {
            return Err(Error::InvalidArgument(format!(
                "ssm_cfg.layer is {layer:?}, not Mamba1"
            )))
        }
    }
    let flag = |v: &Value, name: &str, default: bool| {
        v.get(name).and_then(Value::as_bool).unwrap_or(default)
    };
    if !flag(v, "rms_norm", true) {
        return Err(Error::InvalidArgument(
            "rms_norm = false (a LayerNorm model) is not supported".into(),
        ));
    }
    let hidden_size = size(v, "d_model").unwrap_or(0);
    let vocab = size(v, "vocab_size").unwrap_or(0);
    let multiple = size(v, "pad_vocab_size_multiple").unwrap_or(8).max(1);
    let vocab_size = vocab
        .div_ceil(multiple)
        .checked_mul(multiple)
        .ok_or_else(|| Error::InvalidArgument(format!("vocab_size ({vocab}) is too large")))?;
    let expand = size(ssm, "expand").unwrap_or(2);
    let config = Mamba1Config {
        hidden_size,
        num_layers: size(v, "n_layer").unwrap_or(0),
        state_size: size(ssm, "d_state").unwrap_or(16),
        d_inner: expand.checked_mul(hidden_size).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "expand ({expand}) * d_model ({hidden_size}) is too large"
            ))
        })?,
        conv_kernel: size(ssm, "d_conv").unwrap_or(4),
        time_step_rank: rank(ssm.get("dt_rank"), hidden_size, "ssm_cfg.dt_rank")?,
        vocab_size,
        norm_eps: 1e-5,
        tie_word_embeddings: flag(v, "tie_embeddings", true),
        use_bias: flag(ssm, "bias", false),
        use_conv_bias: flag(ssm, "conv_bias", true),
        mixer_rms_eps: None,
    };
    config.validate()?;
    Ok(config)
}
