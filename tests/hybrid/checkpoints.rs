//! Configs and checkpoints that do not fit: one error naming the field or tensor, no panic.

use crate::common;

use std::path::Path;

use common::client;
use common::hybrid::copy_with;
use stablegraph::models::family;
use stablegraph::models::hybrid::{Hybrid, HybridConfig};
use stablegraph::DType;

fn load_error(dir: &Path) -> String {
    match Hybrid::load(&client(), dir, DType::F32) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_missing_expert_is_named() {
    let dir = copy_with("nemotron", "missing-expert", str::to_string, |n| {
        !n.contains("experts.1.up_proj")
    });
    let e = load_error(&dir);
    assert!(
        e.contains("backbone.layers.5.mixer.experts.1.up_proj.weight: missing"),
        "{e}"
    );
}

#[test]
fn a_wrong_head_count_names_the_projections() {
    let dir = copy_with(
        "bamba",
        "kv-heads",
        |c| c.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 1"),
        |_| true,
    );
    let e = load_error(&dir);
    assert!(
        e.contains("model.layers.1.self_attn.k_proj.weight: shape [16, 32]"),
        "{e}"
    );
    let dir = copy_with(
        "granite",
        "heads",
        |c| c.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3"),
        |_| true,
    );
    let e = load_error(&dir);
    assert!(e.contains("num_key_value_heads (3)"), "{e}");
}

#[test]
fn a_layer_pattern_that_does_not_match_the_layers_is_named() {
    // One layer more than the checkpoint has: the missing tensors are named.
    let dir = copy_with(
        "nemotron",
        "pattern",
        |c| c.replace("\"moe\"", "\"moe\", \"mlp\""),
        |_| true,
    );
    let e = load_error(&dir);
    assert!(
        e.contains("backbone.layers.6.mixer.up_proj.weight: missing"),
        "{e}"
    );
    // A pattern of another length than num_hidden_layers.
    let e = HybridConfig::from_json(
        r#"{"model_type": "nemotron_h", "hidden_size": 32, "vocab_size": 96,
            "hybrid_override_pattern": "M-M*", "num_hidden_layers": 5}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("hybrid_override_pattern has 4 layers, num_hidden_layers is 5"),
        "{e}"
    );
    // Granite's layer types of another length than num_hidden_layers.
    let dir = copy_with(
        "granite_dense",
        "layer-types",
        |c| c.replace("\"num_hidden_layers\": 3", "\"num_hidden_layers\": 4"),
        |_| true,
    );
    let e = load_error(&dir);
    assert!(
        e.contains("layer_types has 3 entries, num_hidden_layers is 4"),
        "{e}"
    );
}

#[test]
fn a_mamba_layer_in_place_of_attention_names_the_tensors() {
    let dir = copy_with(
        "bamba",
        "attn-indices",
        |c| {
            c.replace(
                "\"attn_layer_indices\": [\n    1,\n    3\n  ]",
                "\"attn_layer_indices\": [1]",
            )
        },
        |_| true,
    );
    let e = load_error(&dir);
    assert!(
        e.contains("model.layers.3.mamba.in_proj.weight: missing"),
        "{e}"
    );
    assert!(
        e.contains("model.layers.3.self_attn.q_proj.weight: unexpected"),
        "{e}"
    );
}

#[test]
fn unsupported_settings_are_named() {
    for (json, want) in [
        (r#""mlp_hidden_act": "gelu""#, "mlp_hidden_act \"gelu\""),
        (r#""moe_latent_size": 16"#, "moe_latent_size"),
    ] {
        let text = format!(
            r#"{{"model_type": "nemotron_h", "hidden_size": 32, "vocab_size": 96,
                "layers_block_type": ["moe"], {json}}}"#
        );
        let e = HybridConfig::from_json(&text).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
    let e = HybridConfig::from_json(
        r#"{"model_type": "bamba", "hidden_size": 32, "vocab_size": 96, "num_hidden_layers": 1,
            "num_attention_heads": 4, "rope_parameters": {"rope_type": "yarn"}}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("rope_type \"yarn\""), "{e}");
}

#[test]
fn an_unknown_model_type_lists_the_supported_ones() {
    let dir = copy_with(
        "bamba",
        "model-type",
        |c| c.replace("\"bamba\"", "\"jamba\""),
        |_| true,
    );
    let e = match family::load(&client(), &dir, DType::F32) {
        Ok(_) => panic!("jamba loaded"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("model_type \"jamba\" is not supported"), "{e}");
    for t in [
        "mamba2",
        "falcon_mamba",
        "bamba",
        "granitemoehybrid",
        "nemotron_h",
    ] {
        assert!(e.contains(t), "{e}");
    }
}

/// Bamba's rotary width follows `rope_parameters.partial_rotary_factor` (0.5 by default, as
/// transformers' `BambaConfig` sets it), and Nemotron-H's head is never tied to the embedding
/// (transformers' `NemotronHForCausalLM` reads `lm_head.weight` whatever
/// `tie_word_embeddings` says).
#[test]
fn bamba_rotary_width_and_nemotron_head_follow_transformers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hybrid");
    let bamba = std::fs::read_to_string(root.join("bamba/config.json")).unwrap();
    let rotary = |text: &str| HybridConfig::from_json(text).unwrap().attention.rotary_dim;
    assert_eq!(rotary(&bamba), 4);
    let quarter = bamba.replace(
        "\"partial_rotary_factor\": 0.5",
        "\"partial_rotary_factor\": 0.25",
    );
    assert_ne!(quarter, bamba);
    assert_eq!(rotary(&quarter), 2);
    let whole = bamba.replace(
        "\"partial_rotary_factor\": 0.5",
        "\"partial_rotary_factor\": 1.0",
    );
    assert_eq!(rotary(&whole), 8);
    let nemotron = std::fs::read_to_string(root.join("nemotron/config.json")).unwrap();
    let tied = nemotron.replace(
        "\"tie_word_embeddings\": false",
        "\"tie_word_embeddings\": true",
    );
    assert_ne!(tied, nemotron);
    assert!(!HybridConfig::from_json(&tied).unwrap().tie_word_embeddings);
}

#[test]
fn a_transformers_bad_checkpoint_names_the_field_or_tensor() {
    // A wrong head count: the projections' shapes are named (every misfit, one per line).
    let dir = copy_with(
        "qwen3",
        "qwen3-heads",
        |c| c.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 1"),
        |_| true,
    );
    let e = load_error(&dir);
    assert!(
        e.contains("model.layers.0.self_attn.k_proj.weight: shape [32, 32], expected [16, 32]"),
        "{e}"
    );
    // A rotary scaling this crate does not compute: the field and what is supported.
    let dir = copy_with(
        "llama",
        "llama-yarn",
        |c| c.replace("\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\""),
        |_| true,
    );
    let e = load_error(&dir);
    assert!(
        e.contains("rope_parameters.rope_type \"yarn\" is not supported")
            && e.contains("default, linear, llama3"),
        "{e}"
    );
    // llama3 scaling without its original context: named.
    let dir = copy_with(
        "llama",
        "llama-no-original",
        |c| c.replace("\"original_max_position_embeddings\": 400,", ""),
        |_| true,
    );
    let e = load_error(&dir);
    assert!(
        e.contains("rope_parameters.original_max_position_embeddings is missing"),
        "{e}"
    );
    // A missing tensor of Gemma 2's post norms.
    let dir = copy_with("gemma2", "gemma2-post-norm", str::to_string, |n| {
        n != "model.layers.1.post_feedforward_layernorm.weight"
    });
    let e = load_error(&dir);
    assert!(
        e.contains("model.layers.1.post_feedforward_layernorm.weight: missing"),
        "{e}"
    );
}

#[test]
fn a_missing_shard_is_named() {
    // The Mistral fixture split into two shards with an index; the second shard left out.
    let from = common::hybrid::transformer("mistral");
    let dir = common::TempDir::new("mistral-shards");
    std::fs::copy(from.join("config.json"), dir.join("config.json")).unwrap();
    let bytes = std::fs::read(from.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let (first, second) = (
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    );
    let mut map = serde_json::Map::new();
    let mut kept = Vec::new();
    for (name, view) in st.tensors() {
        let shard = if name.contains("layers.1.") {
            second
        } else {
            first
        };
        map.insert(name.clone(), serde_json::Value::from(shard));
        if shard == first {
            kept.push((name, view));
        }
    }
    safetensors::serialize_to_file(kept, None, &dir.join(first)).unwrap();
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let e = match family::load(&client(), &dir, DType::F32) {
        Ok(_) => panic!("loaded without its second shard"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains(second) && !e.contains('\n'), "{e}");
}
