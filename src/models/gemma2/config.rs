//! A Gemma 2 `config.json` read into the layer stack's [`HybridConfig`].

use serde_json::Value;

use crate::error::{Error, Result};
use crate::models::engine::attention::{rope_from_config, sliding_layers, AttentionConfig};
use crate::models::hybrid::config::{attention_then_mlp, Fields};
use crate::models::hybrid::{Activation, HybridConfig, HybridFamily, MlpConfig};

/// The config from its fields. A size that is missing is noted in `f.missing`; a setting
/// Gemma 2 cannot have here is an error naming the field.
pub(crate) fn read(f: &mut Fields<'_>) -> Result<HybridConfig> {
    let v = f.v;
    let hidden_size = f.size("hidden_size");
    let vocab_size = f.size("vocab_size");
    let layers = f.size("num_hidden_layers");
    let heads = f.size("num_attention_heads");
    let intermediate = f.size("intermediate_size");
    let head_dim = f.size_or("head_dim", 256);
    let act = ["hidden_activation", "hidden_act"]
        .iter()
        .find_map(|n| v.get(*n).and_then(Value::as_str))
        .unwrap_or("gelu_pytorch_tanh");
    if act != "gelu_pytorch_tanh" {
        return Err(Error::InvalidArgument(format!(
            "hidden_activation {act:?} is not supported (expected \"gelu_pytorch_tanh\")"
        )));
    }
    let (rope_theta, rope_scaling) = rope_from_config(v)?;
    let window = v
        .get("sliding_window")
        .and_then(Value::as_u64)
        .map(|w| w as usize);
    // Older configs have no layer_types: transformers' Gemma 2 slides in the even layers.
    let sliding = match window {
        Some(_) => sliding_layers(v, layers, |l| l % 2 == 0)?,
        None => vec![false; layers],
    };
    let cap = |name: &str| v.get(name).and_then(crate::models::common::json::number);
    let bias = f.flag_or("attention_bias", false);
    let attention = AttentionConfig {
        num_heads: heads,
        num_kv_heads: f.size_or("num_key_value_heads", heads),
        head_dim,
        rotary_dim: head_dim,
        rope_theta,
        rope_scaling,
        scale: f
            .float_or("query_pre_attn_scalar", head_dim as f64)
            .powf(-0.5),
        qkv_bias: bias,
        o_bias: bias,
        qk_norm: None,
        softcap: cap("attn_logit_softcapping"),
        sliding_window: window,
    };
    let mlp = MlpConfig {
        intermediate,
        activation: Activation::GeluTanhGlu,
        bias: false,
    };
    let sizes = (hidden_size, vocab_size);
    let stack = attention_then_mlp(f, HybridFamily::Gemma2, sizes, attention, mlp, &sliding);
    Ok(HybridConfig {
        embedding_multiplier: (hidden_size as f64).sqrt(),
        tie_word_embeddings: f.flag_or("tie_word_embeddings", true),
        post_norms: true,
        norm_offset: 1.0,
        final_softcap: cap("final_logit_softcapping"),
        ..stack
    })
}
