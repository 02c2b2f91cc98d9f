//! Configs and checkpoints that do not fit: one error naming what is wrong, no panic.

use crate::common;

use std::path::Path;

use common::client;
use common::mamba1::fixture;
use stablegraph::models::mamba1::{Mamba1, Mamba1Config};
use stablegraph::DType;

/// A copy of the fixture `name` in a fresh directory named for `case`, with `edit` applied to
/// its config text.
fn copy_with(name: &str, case: &str, edit: impl Fn(&str) -> String) -> common::TempDir {
    let dir = common::TempDir::new(&format!("mamba1-{case}"));
    let from = fixture(name);
    let config = std::fs::read_to_string(from.join("config.json")).unwrap();
    std::fs::write(dir.join("config.json"), edit(&config)).unwrap();
    std::fs::copy(
        from.join("model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    dir
}

fn load_error(dir: &Path) -> String {
    match Mamba1::load(&client(), dir, DType::F32) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn another_model_type_is_an_error_naming_it() {
    let e = Mamba1Config::from_json(r#"{"model_type": "mamba2", "hidden_size": 8}"#).unwrap_err();
    assert!(e.to_string().contains("\"mamba2\""), "{e}");
    assert!(e.to_string().contains("falcon_mamba"), "{e}");
}

#[test]
fn another_activation_is_an_error_naming_it() {
    let e =
        Mamba1Config::from_json(r#"{"model_type": "mamba", "hidden_act": "gelu"}"#).unwrap_err();
    assert!(e.to_string().contains("\"gelu\""), "{e}");
}

#[test]
fn a_config_without_sizes_is_an_error_naming_them() {
    let e = Mamba1Config::from_json(r#"{"model_type": "mamba", "hidden_size": 8}"#).unwrap_err();
    for field in ["num_hidden_layers", "state_size", "vocab_size"] {
        assert!(e.to_string().contains(field), "{e}");
    }
}

#[test]
fn a_checkpoint_of_another_width_names_the_tensors() {
    let dir = copy_with("tiny", "width", |c| {
        c.replace("\"state_size\": 8", "\"state_size\": 4")
    });
    let e = load_error(&dir);
    assert!(e.contains("Mamba-1 checkpoint"), "{e}");
    assert!(e.contains("backbone.layers.0.mixer.A_log"), "{e}");
    assert!(e.contains("backbone.layers.1.mixer.x_proj.weight"), "{e}");
}

#[test]
fn a_missing_layer_is_an_error_naming_its_tensors() {
    let dir = copy_with("tiny", "layers", |c| {
        c.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3")
    });
    let e = load_error(&dir);
    assert!(
        e.contains("backbone.layers.2.mixer.in_proj.weight: missing"),
        "{e}"
    );
}

#[test]
fn tokens_outside_the_vocabulary_and_wrong_states_are_errors() {
    let model = Mamba1::load(&client(), &fixture("tiny"), DType::F32).unwrap();
    let e = model.prefill(&[vec![1, 96]]).unwrap_err();
    assert!(e.to_string().contains("token 96"), "{e}");
    let e = model.prefill(&[vec![]]).unwrap_err();
    assert!(e.to_string().contains("empty prompt"), "{e}");
    let states = model.prefill(&[vec![1, 2, 3]]).unwrap().states;
    let e = model.step(&[1, 2], &states).unwrap_err();
    assert!(e.to_string().contains("state 0's conv"), "{e}");
    let e = model.step(&[1], &states[..1]).unwrap_err();
    assert!(e.to_string().contains("one per layer"), "{e}");
}

#[test]
fn a_mamba_ssm_checkpoint_loads_as_the_hf_one() {
    let ssm = common::mamba1::as_mamba_ssm();
    let hf = Mamba1::load(&client(), &fixture("tiny"), DType::F32).unwrap();
    let theirs = Mamba1::load(&client(), &ssm, DType::F32).unwrap();
    // 90 padded to a multiple of 16 is the fixture's 96; dt_rank "auto" is 2.
    assert_eq!(theirs.config(), hf.config());
    let p = vec![vec![3, 1, 4, 1, 5, 9, 2, 6]];
    let (a, b) = (hf.prefill(&p).unwrap(), theirs.prefill(&p).unwrap());
    assert_eq!(a.logits.to_f64_vec(), b.logits.to_f64_vec());
    let e = Mamba1Config::from_json(
        r#"{"d_model": 8, "n_layer": 1, "vocab_size": 8,
        "ssm_cfg": {"layer": "Mamba3"}}"#,
    )
    .unwrap_err();
    assert!(e.to_string().contains("\"Mamba3\""), "{e}");
}

#[test]
fn sizes_that_overflow_are_an_error_not_a_panic() {
    let text = format!(
        r#"{{"model_type": "mamba", "hidden_size": {}, "num_hidden_layers": 1,
            "state_size": 16, "vocab_size": 8, "expand": 4}}"#,
        usize::MAX / 4
    );
    let e = Mamba1Config::from_json(&text).unwrap_err();
    assert!(e.to_string().contains("too large"), "{e}");
    // Found by the config_json fuzz target: a layer count that no Vec can hold.
    let text = r#"{"d_model": 8, "n_layer": 4294967296, "vocab_size": 10}"#;
    let e = Mamba1Config::from_json(text).unwrap_err();
    assert!(e.to_string().contains("num_layers (4294967296)"), "{e}");
}
