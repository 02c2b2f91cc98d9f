//! A Llama-architecture `config.json` (`llama`, `qwen2`, `qwen3`, `mistral`) read into the
//! layer stack's [`HybridConfig`]: attention then an MLP per layer.

use serde_json::Value;

use crate::error::{Error, Result};
use crate::models::engine::attention::{rope_from_config, sliding_layers, AttentionConfig};
use crate::models::hybrid::config::{attention_then_mlp, Fields};
use crate::models::hybrid::{Activation, HybridConfig, HybridFamily, MlpConfig};

/// The `model_type`s of the Llama architecture.
pub const MODEL_TYPES: [&str; 4] = ["llama", "qwen2", "qwen3", "mistral"];

/// The config of a model of `family` (one of [`MODEL_TYPES`]) from its fields. A size that
/// is missing is noted in `f.missing`; a setting this family cannot run is an error naming the
/// field.
pub(crate) fn read(f: &mut Fields<'_>, family: HybridFamily) -> Result<HybridConfig> {
    let v = f.v;
    let hidden_size = f.size("hidden_size");
    let vocab_size = f.size("vocab_size");
    let layers = f.size("num_hidden_layers");
    let heads = f.size("num_attention_heads");
    let intermediate = f.size("intermediate_size");
    let head_dim = match v.get("head_dim").and_then(Value::as_u64) {
        Some(d) => d as usize,
        None => hidden_size / heads.max(1),
    };
    if let Some(act) = v.get("hidden_act").and_then(Value::as_str) {
        if act != "silu" {
            return Err(Error::InvalidArgument(format!(
                "hidden_act {act:?} is not supported (expected \"silu\")"
            )));
        }
    }
    let (rope_theta, rope_scaling) = rope_from_config(v)?;
    // Qwen 2 and 3 slide only with use_sliding_window, from layer max_window_layers on;
    // Mistral everywhere when sliding_window is a number.
    let qwen = matches!(family, HybridFamily::Qwen2 | HybridFamily::Qwen3);
    let window = v
        .get("sliding_window")
        .and_then(Value::as_u64)
        .map(|w| w as usize)
        .filter(|_| !qwen || f.flag_or("use_sliding_window", false));
    let from = if qwen {
        f.size_or("max_window_layers", layers)
    } else {
        0
    };
    let sliding = match window {
        Some(_) => sliding_layers(v, layers, |l| l >= from)?,
        None => vec![false; layers],
    };
    let bias = f.flag_or("attention_bias", false);
    let attention = AttentionConfig {
        num_heads: heads,
        num_kv_heads: f.size_or("num_key_value_heads", heads),
        head_dim,
        rotary_dim: head_dim,
        rope_theta,
        rope_scaling,
        scale: 1.0 / (head_dim.max(1) as f64).sqrt(),
        qkv_bias: family == HybridFamily::Qwen2 || bias,
        o_bias: family != HybridFamily::Qwen2 && bias,
        qk_norm: (family == HybridFamily::Qwen3).then(|| f.float_or("rms_norm_eps", 1e-6)),
        softcap: None,
        sliding_window: window,
    };
    let mlp = MlpConfig {
        intermediate,
        activation: Activation::SwiGlu,
        bias: f.flag_or("mlp_bias", false),
    };
    let sizes = (hidden_size, vocab_size);
    Ok(attention_then_mlp(
        f, family, sizes, attention, mlp, &sliding,
    ))
}
