//! Mamba-2 configuration: the HF `config.json` (`Mamba2Config`) and the `mamba_ssm` form.

use std::path::Path;

use serde_json::Value;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::models::common::json::{number, strict_json, time_step_limit};

/// The shape and numerics of a Mamba-2 model.
///
/// The fields are public, so a config may be built or changed by hand: every entry point that
/// takes one ([`Mamba2::new`](super::Mamba2::new), [`Mamba2Weights::load`](super::Mamba2Weights::load),
/// [`Mamba2Weights::random`](super::Mamba2Weights::random), [`Mamba2Weights::types`](super::Mamba2Weights::types)
/// and the graph builders of [`block`](super::block)) calls [`Mamba2Config::validate`] first, a
/// few comparisons.
#[derive(Debug, Clone, PartialEq)]
pub struct Mamba2Config {
    /// Model width `d_model`.
    pub hidden_size: usize,
    /// Number of blocks.
    pub num_layers: usize,
    /// SSM state size `N`.
    pub state_size: usize,
    /// Head dimension `P`.
    pub head_dim: usize,
    /// Number of heads `H` (`d_inner / head_dim`).
    pub num_heads: usize,
    /// Number of B/C groups `G`.
    pub n_groups: usize,
    /// Width of the depthwise causal convolution.
    pub conv_kernel: usize,
    /// SSD chunk length.
    pub chunk_size: usize,
    /// Vocabulary size of the embedding and the head (already padded).
    pub vocab_size: usize,
    /// `(min, max)` clamp of `dt` after the softplus (`max` may be infinite).
    pub time_step_limit: (f64, f64),
    /// Epsilon of the RMS norms.
    pub norm_eps: f64,
    /// Whether the residual stream is kept in f32 (it always is here; recorded for fidelity).
    pub residual_in_fp32: bool,
    /// Whether `lm_head` shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Whether `in_proj` and `out_proj` have biases.
    pub use_bias: bool,
    /// Whether the convolution has a bias.
    pub use_conv_bias: bool,
    /// Whether the gated norm normalises before gating (`false` in HF and mamba_ssm defaults).
    pub norm_before_gate: bool,
    /// `(time_step_min, time_step_max, time_step_floor)`: the range `dt` is drawn from at
    /// initialisation (used by the random initialisation only).
    pub time_step_init: (f64, f64, f64),
    /// The dtype of the SSD's decay arithmetic (prefill and decode): `A * dt`, its cumulative
    /// sums, `segsum` and their exponentials, converted back to f32 after the `exp`. F32, the
    /// default and what checkpoints assume; BF16 only as a precision ablation. Not read from
    /// `config.json`.
    pub scan_dtype: DType,
}

impl Mamba2Config {
    /// The inner width `d_inner = num_heads * head_dim` (saturating at `usize::MAX`, which
    /// [`Mamba2Config::validate`] rejects).
    pub fn d_inner(&self) -> usize {
        self.num_heads.saturating_mul(self.head_dim)
    }

    /// The convolved channels: `x`, `B` and `C`, `d_inner + 2 * n_groups * state_size`
    /// (saturating, like [`Mamba2Config::d_inner`]).
    pub fn conv_dim(&self) -> usize {
        self.d_inner()
            .saturating_add(self.bc_dim().saturating_mul(2))
    }

    /// Rows of `in_proj`: `z`, `xBC` and `dt` (saturating, like [`Mamba2Config::d_inner`]).
    pub fn in_proj_dim(&self) -> usize {
        self.d_inner()
            .saturating_add(self.conv_dim())
            .saturating_add(self.num_heads)
    }

    /// `n_groups * state_size`, the width of `B` (and of `C`), saturating.
    fn bc_dim(&self) -> usize {
        self.n_groups.saturating_mul(self.state_size)
    }

    /// The most layers a config may have: far beyond any published model, and a bound on what
    /// a config file can make the loader allocate before it reads a tensor.
    pub const MAX_LAYERS: usize = 1 << 16;

    /// Whether every tensor of the model and of its per-row state has a size in bytes (as f32)
    /// that fits an `isize`, computed without overflow.
    fn sizes_fit(&self) -> bool {
        let bytes = |dims: &[usize]| {
            dims.iter()
                .try_fold(4usize, |n, &d| n.checked_mul(d))
                .is_some_and(|n| isize::try_from(n).is_ok())
        };
        let d_inner = self.num_heads.checked_mul(self.head_dim);
        let bc = self.n_groups.checked_mul(self.state_size);
        let conv = d_inner
            .zip(bc)
            .and_then(|(d, bc)| bc.checked_mul(2)?.checked_add(d));
        let in_proj = d_inner
            .zip(conv)
            .and_then(|(d, c)| d.checked_add(c)?.checked_add(self.num_heads));
        let (Some(d_inner), Some(conv), Some(in_proj)) = (d_inner, conv, in_proj) else {
            return false;
        };
        bytes(&[in_proj, self.hidden_size])
            && bytes(&[self.hidden_size, d_inner])
            && bytes(&[conv, self.conv_kernel])
            && bytes(&[self.vocab_size, self.hidden_size])
            && bytes(&[self.num_heads, self.head_dim, self.state_size])
    }

    /// The small byte-level shape the `train` example trains from scratch: a vocabulary of the
    /// 256 byte values, `num_layers` blocks of width `hidden_size` (expand 2, heads of 32 channels,
    /// state 32, one group, kernel 4, chunk 64, tied embedding). An error when `hidden_size` is
    /// not a positive multiple of 16 (the heads must tile `2 * hidden_size`) or `num_layers` is 0.
    pub fn byte_level(num_layers: usize, hidden_size: usize) -> Result<Mamba2Config> {
        if hidden_size == 0 || !hidden_size.is_multiple_of(16) {
            return Err(Error::InvalidArgument(format!(
                "byte_level: hidden_size {hidden_size} is not a positive multiple of 16 (heads of \
                 32 channels tile 2 * hidden_size)"
            )));
        }
        let cfg = Mamba2Config {
            hidden_size,
            num_layers,
            state_size: 32,
            head_dim: 32,
            num_heads: 2 * hidden_size / 32,
            chunk_size: 64,
            vocab_size: 256,
            ..Mamba2Config::mamba2_130m()
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The 130M shape (768 wide, 24 layers, state 128, head_dim 64, vocab 50288, chunk 256).
    pub fn mamba2_130m() -> Mamba2Config {
        Mamba2Config {
            hidden_size: 768,
            num_layers: 24,
            state_size: 128,
            head_dim: 64,
            num_heads: 24,
            n_groups: 1,
            conv_kernel: 4,
            chunk_size: 256,
            vocab_size: 50288,
            time_step_limit: (0.0, f64::INFINITY),
            norm_eps: 1e-5,
            residual_in_fp32: true,
            tie_word_embeddings: true,
            use_bias: false,
            use_conv_bias: true,
            norm_before_gate: false,
            time_step_init: (1e-3, 1e-1, 1e-4),
            scan_dtype: DType::F32,
        }
    }

    /// The names [`Mamba2Config::sized`] takes: the paper's five released sizes.
    pub const SIZES: [&'static str; 5] = ["130m", "370m", "780m", "1.3b", "2.7b"];

    /// The shape of one of the paper's five released sizes (the `mamba2-*` checkpoints'
    /// configs), by name: `130m` (24 layers, 768 wide), `370m` (48, 1024), `780m` (48, 1536),
    /// `1.3b` (48, 2048) or `2.7b` (64, 2560); all with expand 2, heads of 64 channels, state
    /// 128, one group and the 50288-entry vocabulary, as [`Mamba2Config::mamba2_130m`]. Any
    /// other name is an error listing these.
    pub fn sized(name: &str) -> Result<Mamba2Config> {
        let (num_layers, hidden_size) = match name.to_ascii_lowercase().as_str() {
            "130m" => (24, 768),
            "370m" => (48, 1024),
            "780m" => (48, 1536),
            "1.3b" => (48, 2048),
            "2.7b" => (64, 2560),
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "Mamba2Config::sized: unknown size {name:?}; the sizes are {}",
                    Self::SIZES.join(", ")
                )))
            }
        };
        Ok(Mamba2Config {
            num_layers,
            hidden_size,
            num_heads: 2 * hidden_size / 64,
            ..Mamba2Config::mamba2_130m()
        })
    }

    /// Reads a `config.json` file (HF or mamba_ssm form).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Mamba2Config> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        Mamba2Config::from_json(&text)
            .map_err(|e| Error::InvalidArgument(format!("{}: {e}", path.display())))
    }

    /// Parses a config. HF's `"time_step_limit": [0.0, Infinity]` (not strict JSON) and
    /// transformers 5's `{"__float__": "Infinity"}` are both accepted. Inconsistent fields are
    /// an error naming them.
    pub fn from_json(text: &str) -> Result<Mamba2Config> {
        let v: Value = serde_json::from_str(&strict_json(text))
            .map_err(|e| Error::InvalidArgument(format!("config is not JSON: {e}")))?;
        let obj = v
            .as_object()
            .ok_or_else(|| Error::InvalidArgument("config is not a JSON object".into()))?;
        if obj.contains_key("d_model") {
            from_mamba_ssm(&v)
        } else {
            from_hf(&v)
        }
    }

    /// Checks every field and that they agree with each other: no size is 0 (`hidden_size`,
    /// `num_layers`, `state_size`, `head_dim`, `num_heads`, `n_groups`, `conv_kernel`,
    /// `chunk_size`, `vocab_size`); `n_groups` divides `num_heads`; every weight's size in bytes
    /// fits an `isize`; `num_layers` is at most [`Mamba2Config::MAX_LAYERS`]; `vocab_size` fits the `i32` token ids of the programs;
    /// `time_step_limit` is a range of `dt >= 0` with a finite lower end; `time_step_init` is
    /// finite with `0 < min <= max` and `floor >= 0`; `norm_eps` is finite and positive;
    /// `scan_dtype` is a float type. One error lists every problem, naming the fields.
    pub fn validate(&self) -> Result<()> {
        let mut problems = Vec::new();
        let positive = [
            ("hidden_size", self.hidden_size),
            ("num_layers", self.num_layers),
            ("state_size", self.state_size),
            ("head_dim", self.head_dim),
            ("num_heads", self.num_heads),
            ("n_groups", self.n_groups),
            ("conv_kernel", self.conv_kernel),
            ("chunk_size", self.chunk_size),
            ("vocab_size", self.vocab_size),
        ];
        for (name, v) in positive {
            if v == 0 {
                problems.push(format!("{name} is 0"));
            }
        }
        if self.n_groups > 0 && !self.num_heads.is_multiple_of(self.n_groups) {
            problems.push(format!(
                "num_heads ({}) is not a multiple of n_groups ({})",
                self.num_heads, self.n_groups
            ));
        }
        if !self.sizes_fit() {
            problems.push(format!(
                "the weights are too large to address (hidden_size {}, num_heads {}, head_dim \
                 {}, n_groups {}, state_size {}, conv_kernel {}, vocab_size {})",
                self.hidden_size,
                self.num_heads,
                self.head_dim,
                self.n_groups,
                self.state_size,
                self.conv_kernel,
                self.vocab_size
            ));
        }
        if self.num_layers > Mamba2Config::MAX_LAYERS {
            problems.push(format!(
                "num_layers ({}) is more than {}",
                self.num_layers,
                Mamba2Config::MAX_LAYERS
            ));
        }
        if i32::try_from(self.vocab_size).is_err() {
            problems.push(format!(
                "vocab_size ({}) is larger than the i32 token ids allow",
                self.vocab_size
            ));
        }
        let (lo, hi) = self.time_step_limit;
        if !lo.is_finite() || hi.is_nan() || lo < 0.0 || lo > hi {
            problems.push(format!(
                "time_step_limit ({lo}, {hi}) is not a range of dt >= 0"
            ));
        }
        let (dmin, dmax, floor) = self.time_step_init;
        let finite = dmin.is_finite() && dmax.is_finite() && floor.is_finite();
        if !(finite && dmin > 0.0 && dmin <= dmax && floor >= 0.0) {
            problems.push(format!(
                "time_step_init: time_step_min ({dmin}) and time_step_max ({dmax}) are not a \
                 finite range of positive numbers, or time_step_floor ({floor}) is not finite \
                 and >= 0"
            ));
        }
        if !self.norm_eps.is_finite() || self.norm_eps <= 0.0 {
            problems.push(format!(
                "norm_eps ({}) is not a finite positive number",
                self.norm_eps
            ));
        }
        if !self.scan_dtype.is_float() {
            problems.push(format!(
                "scan_dtype {} is not a float type",
                self.scan_dtype
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "inconsistent Mamba-2 config: {}",
                problems.join("; ")
            )))
        }
    }
}

struct Fields<'a> {
    v: &'a Value,
    missing: Vec<String>,
}

impl Fields<'_> {
    fn usize(&mut self, name: &str) -> usize {
        match self.v.get(name).and_then(Value::as_u64) {
            Some(n) => n as usize,
            None => {
                self.missing.push(name.to_string());
                0
            }
        }
    }

    fn usize_or(&self, name: &str, default: usize) -> usize {
        self.v
            .get(name)
            .and_then(Value::as_u64)
            .map_or(default, |n| n as usize)
    }

    fn f64_or(&self, name: &str, default: f64) -> f64 {
        self.v.get(name).and_then(number).unwrap_or(default)
    }

    fn bool_or(&self, name: &str, default: bool) -> bool {
        self.v.get(name).and_then(Value::as_bool).unwrap_or(default)
    }

    fn finish(self) -> Result<()> {
        if self.missing.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "the Mamba-2 config lacks {}",
                self.missing.join(", ")
            )))
        }
    }
}

/// `vocab` rounded up to a multiple of `multiple`; an error if that overflows.
fn padded_vocab(vocab: usize, multiple: usize) -> Result<usize> {
    if multiple <= 1 {
        return Ok(vocab);
    }
    vocab
        .div_ceil(multiple)
        .checked_mul(multiple)
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "vocab_size ({vocab}) padded to a multiple of pad_vocab_size_multiple \
                 ({multiple}) is too large"
            ))
        })
}

/// `expand * hidden_size`, or an error naming both when it overflows.
fn inner_width(expand: usize, hidden_size: usize) -> Result<usize> {
    expand.checked_mul(hidden_size).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "inconsistent Mamba-2 config: expand ({expand}) * hidden_size ({hidden_size}) is \
             too large"
        ))
    })
}

fn from_hf(v: &Value) -> Result<Mamba2Config> {
    let mut f = Fields { v, missing: vec![] };
    let hidden_size = f.usize("hidden_size");
    let num_layers = f.usize("num_hidden_layers");
    let state_size = f.usize("state_size");
    let head_dim = f.usize("head_dim");
    let vocab = f.usize("vocab_size");
    let expand = f.usize_or("expand", 2);
    let n_groups = f.usize_or("n_groups", 1);
    let conv_kernel = f.usize_or("conv_kernel", 4);
    let chunk_size = f.usize_or("chunk_size", 256);
    let pad_multiple = f.usize_or("pad_vocab_size_multiple", 1);
    let norm_eps = f.f64_or("layer_norm_epsilon", f.f64_or("rms_norm_eps", 1e-5));
    let residual_in_fp32 = f.bool_or("residual_in_fp32", true);
    let tie = f.bool_or("tie_word_embeddings", true);
    let use_bias = f.bool_or("use_bias", false);
    let use_conv_bias = f.bool_or("use_conv_bias", true);
    let norm_before_gate = f.bool_or("norm_before_gate", false);
    let rms_norm = f.bool_or("rms_norm", true);
    let heads_field = v
        .get("num_heads")
        .and_then(Value::as_u64)
        .map(|n| n as usize);
    let time_step_init = (
        f.f64_or("time_step_min", 1e-3),
        f.f64_or("time_step_max", 1e-1),
        f.f64_or("time_step_floor", 1e-4),
    );
    f.finish()?;
    if !rms_norm {
        return Err(Error::InvalidArgument(
            "rms_norm = false (a LayerNorm model) is not supported".into(),
        ));
    }
    let d_inner = inner_width(expand, hidden_size)?;
    let num_heads = heads_field.unwrap_or(d_inner.checked_div(head_dim).unwrap_or(0));
    if num_heads.checked_mul(head_dim) != Some(d_inner) {
        return Err(Error::InvalidArgument(format!(
            "inconsistent Mamba-2 config: num_heads ({num_heads}) * head_dim ({head_dim}) != \
             expand ({expand}) * hidden_size ({hidden_size})"
        )));
    }
    let config = Mamba2Config {
        hidden_size,
        num_layers,
        state_size,
        head_dim,
        num_heads,
        n_groups,
        conv_kernel,
        chunk_size,
        vocab_size: padded_vocab(vocab, pad_multiple)?,
        time_step_limit: time_step_limit(v.get("time_step_limit"))?,
        norm_eps,
        residual_in_fp32,
        tie_word_embeddings: tie,
        use_bias,
        use_conv_bias,
        norm_before_gate,
        time_step_init,
        scan_dtype: DType::F32,
    };
    config.validate()?;
    Ok(config)
}

fn from_mamba_ssm(v: &Value) -> Result<Mamba2Config> {
    let mut f = Fields { v, missing: vec![] };
    let hidden_size = f.usize("d_model");
    let num_layers = f.usize("n_layer");
    let vocab = f.usize("vocab_size");
    let pad_multiple = f.usize_or("pad_vocab_size_multiple", 8);
    let tie = f.bool_or("tie_embeddings", true);
    let residual_in_fp32 = f.bool_or("residual_in_fp32", true);
    let rms_norm = f.bool_or("rms_norm", true);
    f.finish()?;
    if !rms_norm {
        return Err(Error::InvalidArgument(
            "rms_norm = false (a LayerNorm model) is not supported".into(),
        ));
    }
    let empty = Value::Object(Default::default());
    let ssm = v.get("ssm_cfg").unwrap_or(&empty);
    let s = Fields {
        v: ssm,
        missing: vec![],
    };
    if let Some(layer) = ssm.get("layer").and_then(Value::as_str) {
        if layer != "Mamba2" {
            return Err(Error::InvalidArgument(format!(
                "ssm_cfg.layer is {layer:?}; only Mamba2 is supported"
            )));
        }
    }
    let expand = s.usize_or("expand", 2);
    let head_dim = s.usize_or("headdim", 64);
    let d_inner = inner_width(expand, hidden_size)?;
    let config = Mamba2Config {
        hidden_size,
        num_layers,
        state_size: s.usize_or("d_state", 128),
        head_dim,
        num_heads: d_inner.checked_div(head_dim).unwrap_or(0),
        n_groups: s.usize_or("ngroups", 1),
        conv_kernel: s.usize_or("d_conv", 4),
        chunk_size: s.usize_or("chunk_size", 256),
        vocab_size: padded_vocab(vocab, pad_multiple)?,
        time_step_limit: time_step_limit(ssm.get("dt_limit"))?,
        norm_eps: 1e-5,
        residual_in_fp32,
        tie_word_embeddings: tie,
        use_bias: s.bool_or("bias", false),
        use_conv_bias: s.bool_or("conv_bias", true),
        norm_before_gate: s.bool_or("norm_before_gate", false),
        time_step_init: (
            s.f64_or("dt_min", 1e-3),
            s.f64_or("dt_max", 1e-1),
            s.f64_or("dt_init_floor", 1e-4),
        ),
        scan_dtype: DType::F32,
    };
    if config.num_heads.checked_mul(head_dim) != Some(d_inner) {
        return Err(Error::InvalidArgument(format!(
            "inconsistent Mamba-2 config: d_inner ({d_inner}) is not a multiple of headdim \
             ({head_dim})"
        )));
    }
    config.validate()?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HF: &str = r#"{"model_type": "mamba2", "hidden_size": 64, "num_hidden_layers": 2,
        "state_size": 16, "head_dim": 16, "expand": 2, "n_groups": 2, "num_heads": 8,
        "conv_kernel": 4, "chunk_size": 8, "vocab_size": 100, "pad_vocab_size_multiple": 8,
        "time_step_limit": [0.0, Infinity], "layer_norm_epsilon": 1e-05,
        "tie_word_embeddings": false, "note": "Infinity inside a string stays"}"#;

    #[test]
    fn reads_hf_configs_with_bare_infinity() {
        let c = Mamba2Config::from_json(HF).unwrap();
        assert_eq!(
            (c.hidden_size, c.num_layers, c.num_heads, c.n_groups),
            (64, 2, 8, 2)
        );
        assert_eq!(c.vocab_size, 104);
        assert_eq!(c.time_step_limit, (0.0, f64::INFINITY));
        assert_eq!(
            (c.d_inner(), c.conv_dim(), c.in_proj_dim()),
            (128, 192, 328)
        );
        assert!(!c.tie_word_embeddings);
    }

    #[test]
    fn reads_the_transformers_5_float_encoding() {
        let text = HF.replace("[0.0, Infinity]", r#"[0.0, {"__float__": "Infinity"}]"#);
        let c = Mamba2Config::from_json(&text).unwrap();
        assert_eq!(c.time_step_limit, (0.0, f64::INFINITY));
    }

    #[test]
    fn reads_mamba_ssm_configs() {
        let text = r#"{"d_model": 768, "n_layer": 24, "vocab_size": 50277,
            "ssm_cfg": {"layer": "Mamba2"}, "rms_norm": true, "residual_in_fp32": true,
            "pad_vocab_size_multiple": 16, "tie_embeddings": true}"#;
        let c = Mamba2Config::from_json(text).unwrap();
        assert_eq!(c, Mamba2Config::mamba2_130m());
    }

    #[test]
    fn inconsistent_configs_name_the_fields() {
        let bad = HF.replace("\"num_heads\": 8", "\"num_heads\": 7");
        let e = Mamba2Config::from_json(&bad).unwrap_err().to_string();
        assert!(
            e.contains("num_heads (7)") && e.contains("head_dim (16)"),
            "{e}"
        );
        let bad = HF.replace("\"n_groups\": 2", "\"n_groups\": 3");
        let e = Mamba2Config::from_json(&bad).unwrap_err().to_string();
        assert!(e.contains("n_groups (3)"), "{e}");
        let e = Mamba2Config::from_json(r#"{"hidden_size": 8}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("num_hidden_layers") && e.contains("vocab_size"),
            "{e}"
        );
        assert!(Mamba2Config::from_json("not json").is_err());
        let bad = HF.replace("[0.0, Infinity]", "[1.0, 0.5]");
        let e = Mamba2Config::from_json(&bad).unwrap_err().to_string();
        assert!(e.contains("time_step_limit"), "{e}");
    }
}
