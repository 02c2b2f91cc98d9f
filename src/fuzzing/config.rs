//! The `config_json` target: the Mamba-2 `config.json` reader, on raw bytes and on nearly
//! valid configs of both forms (HF and `mamba_ssm`).

use super::Bytes;
use crate::dtype::{DType, TensorType};
use crate::models::mamba1::{Mamba1Config, Mamba1Weights};
use crate::models::mamba2::{Mamba2Config, Mamba2Weights};

/// The keys of both `config.json` forms (HF, then `mamba_ssm` and its `ssm_cfg`), Mamba-2's
/// and Mamba-1's.
const CONFIG_KEYS: &[&str] = &[
    "hidden_size",
    "num_hidden_layers",
    "state_size",
    "head_dim",
    "num_heads",
    "vocab_size",
    "expand",
    "n_groups",
    "conv_kernel",
    "chunk_size",
    "pad_vocab_size_multiple",
    "layer_norm_epsilon",
    "rms_norm_eps",
    "residual_in_fp32",
    "tie_word_embeddings",
    "use_bias",
    "use_conv_bias",
    "norm_before_gate",
    "rms_norm",
    "time_step_min",
    "time_step_max",
    "time_step_floor",
    "time_step_limit",
    "d_model",
    "n_layer",
    "tie_embeddings",
    "ssm_cfg",
    "layer",
    "d_state",
    "headdim",
    "ngroups",
    "d_conv",
    "bias",
    "conv_bias",
    "dt_limit",
    "model_type",
    "intermediate_size",
    "time_step_rank",
    "dt_rank",
    "mixer_rms_eps",
    "hidden_act",
];

/// JSON values that configs hold or that parsers trip on.
const CONFIG_VALUES: &[&str] = &[
    "0",
    "1",
    "2",
    "3",
    "4",
    "8",
    "16",
    "64",
    "-1",
    "0.5",
    "1e-5",
    "1e308",
    "-1e308",
    "4294967296",
    "4294967297",
    "18446744073709551615",
    "9223372036854775807",
    "3037000500",
    "true",
    "false",
    "null",
    "Infinity",
    "-Infinity",
    "NaN",
    "\"Infinity\"",
    "\"nan\"",
    "\"Mamba2\"",
    "\"Mamba1\"",
    "[0.0, Infinity]",
    "[0.0, {\"__float__\": \"Infinity\"}]",
    "[1, 0]",
    "[NaN, 1]",
    "[]",
    "{}",
    "{\"__float__\": \"-inf\"}",
    "\"\\u00e9Infinity\"",
    "\"mamba\"",
    "\"falcon_mamba\"",
    "\"mamba2\"",
    "\"auto\"",
    "\"silu\"",
];

/// `config.json` parsing ([`Mamba2Config::from_json`], both forms, and
/// [`Mamba1Config::from_json`]). A config that parses must validate, and its derived sizes and
/// weight types must be computable.
pub fn config_json(data: &[u8]) {
    let mut b = Bytes::new(data);
    let text = if b.u8() & 1 == 0 {
        String::from_utf8_lossy(b.rest()).into_owned()
    } else {
        config_text(&mut b)
    };
    check_config(&text);
}

/// Writes a JSON object (HF or `mamba_ssm` form) whose keys and values `b` picks.
fn config_text(b: &mut Bytes<'_>) -> String {
    let mamba_ssm = b.bool();
    let mut fields: Vec<String> = Vec::new();
    let base: &[(&str, &str)] = if mamba_ssm {
        &[("d_model", "8"), ("n_layer", "1"), ("vocab_size", "10")]
    } else {
        &[
            ("hidden_size", "8"),
            ("num_hidden_layers", "1"),
            ("state_size", "4"),
            ("head_dim", "4"),
            ("vocab_size", "10"),
        ]
    };
    for (k, v) in base {
        if !b.one_in(8) {
            fields.push(format!("\"{k}\": {v}"));
        }
    }
    let mut ssm = Vec::new();
    while !b.is_empty() && fields.len() + ssm.len() < 40 {
        let key = b.pick(CONFIG_KEYS);
        let value = if b.one_in(4) {
            // A number of any size.
            format!("{}", b.u64() >> b.below(64))
        } else {
            b.pick(CONFIG_VALUES).to_string()
        };
        let entry = format!("\"{key}\": {value}");
        if mamba_ssm && b.bool() {
            ssm.push(entry);
        } else {
            fields.push(entry);
        }
    }
    if mamba_ssm {
        fields.push(format!("\"ssm_cfg\": {{{}}}", ssm.join(", ")));
    }
    format!("{{{}}}", fields.join(", "))
}

fn check_config(text: &str) {
    if let Ok(config) = Mamba1Config::from_json(text) {
        assert!(
            config.validate().is_ok(),
            "Mamba1Config::from_json returned a config that does not validate: {config:?}"
        );
        for dtype in [DType::F32, DType::BF16] {
            let _ = Mamba1Weights::<TensorType>::types(&config, dtype);
        }
    }
    let Ok(config) = Mamba2Config::from_json(text) else {
        return;
    };
    assert!(
        config.validate().is_ok(),
        "from_json returned a config that does not validate: {config:?}"
    );
    let _ = (config.d_inner(), config.conv_dim(), config.in_proj_dim());
    for dtype in [DType::F32, DType::BF16] {
        let _ = Mamba2Weights::<TensorType>::types(&config, dtype);
    }
}
