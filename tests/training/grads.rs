//! Gradients of every family through the face (`CausalLm::loss_and_grads`) against torch
//! autograd of transformers' models (`model(input_ids, labels=input_ids).loss`, then
//! `backward()`): fixtures made by `tests/fixtures/grads/make_fixtures.py` (and Mamba-2's by
//! `tests/fixtures/mamba2/make_fixtures.py`), which check them against float64 autograd and
//! finite differences. Every checkpoint tensor's gradient within 1e-4 of its largest entry.

use std::path::{Path, PathBuf};

use crate::common;

use std::collections::HashMap;

use common::{client, read_safetensors, Stored, TempDir};
use stablegraph::models::family;
use stablegraph::DType;

/// The fixtures: (the checkpoint directory, the gradients file).
fn cases() -> Vec<(PathBuf, PathBuf)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut out = vec![
        (
            root.join("mamba2/tiny"),
            root.join("mamba2/tiny/grads.safetensors"),
        ),
        (
            root.join("mamba2/tiny"),
            root.join("mamba2/tiny/grads_ragged.safetensors"),
        ),
        (
            root.join("mamba2/groups2"),
            root.join("mamba2/groups2/grads.safetensors"),
        ),
    ];
    for (case, dir) in [
        ("mamba1_tiny", "mamba1/tiny"),
        ("falcon", "mamba1/falcon"),
        ("bamba", "hybrid/bamba"),
        ("granite", "hybrid/granite"),
        ("granite_dense", "hybrid/granite_dense"),
        ("nemotron", "hybrid/nemotron"),
    ] {
        let grads = root.join(format!("grads/{case}/grads.safetensors"));
        out.push((root.join(dir), grads));
    }
    for case in ["llama", "qwen3", "mistral", "gemma2"] {
        let grads = root.join(format!("grads/{case}/grads.safetensors"));
        out.push((root.join(format!("transformers/{case}")), grads));
    }
    out
}

/// Checks the loss and every gradient of the model in `dir` against `file`; returns the worst
/// relative difference.
fn check(dir: &Path, file: &Path) -> f64 {
    let what = file.display().to_string();
    let want = read_safetensors(file);
    let ids = &want["input_ids"];
    let t = ids.shape[1];
    let prompts: Vec<Vec<u32>> = ids
        .values
        .chunks(t)
        .map(|row| row.iter().map(|&x| x as u32).collect())
        .collect();
    let model = family::load(&client(), dir, DType::F32).unwrap();
    let got = model.loss_and_grads(&prompts).unwrap();
    let loss = want["loss"].values[0];
    let rel = (f64::from(got.loss) - loss).abs() / loss;
    assert!(rel < 1e-5, "{what}: loss {} vs {loss}", got.loss);
    if let Some(aux) = want.get("aux_loss") {
        let ours = f64::from(got.aux_loss.expect("an aux loss"));
        let want = aux.values[0];
        assert!(
            (ours - want).abs() < 1e-5 * want,
            "{what}: aux loss {ours} vs {want}"
        );
    }
    let reference = by_checkpoint_name(file, &want);
    let mut worst = 0.0f64;
    let mut seen = 0;
    for (name, g) in &got.tensors {
        let ours = g.to_f64_vec();
        let Some(reference) = reference.get(name) else {
            // Not a parameter in transformers (a buffer): no gradient may reach it.
            assert!(
                ours.iter().all(|&x| x == 0.0),
                "{what}: {name} has a gradient"
            );
            continue;
        };
        seen += 1;
        assert_eq!(g.dims(), reference.shape.as_slice(), "{what}: {name}");
        let scale = reference.values.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let err = common::max_abs(&ours, &reference.values) / scale.max(1e-30);
        worst = worst.max(err);
        assert!(err < 1e-4, "{what}: {name} differs by {err} of {scale}");
    }
    assert_eq!(
        seen,
        reference.len(),
        "{what}: gradients for every parameter"
    );
    worst
}

/// The gradients of `want` by checkpoint name: torch's parameter names mapped through the
/// `parameters.<name>.checkpoint` entries of `grads.json` beside `file` (a list of names: a
/// stack of those tensors, split along its first axis), or the names as they are (Mamba-2's).
fn by_checkpoint_name(file: &Path, want: &HashMap<String, Stored>) -> HashMap<String, Stored> {
    let json = file.with_file_name("grads.json");
    let names: serde_json::Value = match std::fs::read(&json) {
        Ok(bytes) if file.ends_with("grads.safetensors") && json.exists() => {
            serde_json::from_slice(&bytes).unwrap()
        }
        _ => serde_json::Value::Null,
    };
    let mut out = HashMap::new();
    for (key, g) in want.iter().filter(|(k, _)| k.starts_with("grad.")) {
        let param = &key["grad.".len()..];
        match &names["parameters"][param]["checkpoint"] {
            serde_json::Value::Array(list) => {
                let n = g.values.len() / list.len();
                for (k, name) in list.iter().enumerate() {
                    let stored = Stored {
                        dtype: g.dtype,
                        shape: g.shape[1..].to_vec(),
                        values: g.values[k * n..(k + 1) * n].to_vec(),
                    };
                    out.insert(name.as_str().unwrap().to_string(), stored);
                }
            }
            serde_json::Value::String(name) => {
                let stored = Stored {
                    dtype: g.dtype,
                    shape: g.shape.clone(),
                    values: g.values.clone(),
                };
                out.insert(name.clone(), stored);
            }
            _ => {
                let stored = Stored {
                    dtype: g.dtype,
                    shape: g.shape.clone(),
                    values: g.values.clone(),
                };
                out.insert(param.to_string(), stored);
            }
        }
    }
    out
}

#[test]
fn every_family_matches_torch_autograd() {
    for (dir, file) in cases() {
        let worst = check(&dir, &file);
        eprintln!("{}: worst gradient {worst:.2e}", file.display());
    }
}

/// Granite 4.0-H with `output_router_logits` and `router_aux_loss_coef`: transformers adds its
/// load-balancing loss, and its gradient reaches the routers.
#[test]
fn the_router_loss_is_added_as_transformers_adds_it() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let tmp = TempDir::new("granite-aux");
    let src = root.join("hybrid/granite");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    config["output_router_logits"] = true.into();
    config["router_aux_loss_coef"] = 0.05.into();
    std::fs::write(tmp.join("config.json"), config.to_string()).unwrap();
    std::fs::copy(src.join("model.safetensors"), tmp.join("model.safetensors")).unwrap();
    check(&tmp, &root.join("grads/granite_aux/grads.safetensors"));
}

/// Prompts of several lengths: the loss is the mean over every prediction, so it and its
/// gradients are the prediction-weighted mean of each prompt's alone.
#[test]
fn ragged_prompts_weigh_each_prediction_once() {
    let prompts = vec![vec![5, 9, 14, 20, 33, 7, 8], vec![40, 41, 42]];
    for dir in common::one_fixture_per_family() {
        let model = family::load(&client(), &dir, DType::F32).unwrap();
        let both = model.loss_and_grads(&prompts).unwrap();
        let each: Vec<_> = prompts
            .iter()
            .map(|p| model.loss_and_grads(std::slice::from_ref(p)).unwrap())
            .collect();
        let n: Vec<f64> = each.iter().map(|g| g.predicted as f64).collect();
        let total = n.iter().sum::<f64>();
        let mean = |x: f64, y: f64| (n[0] * x + n[1] * y) / total;
        let loss = mean(f64::from(each[0].loss), f64::from(each[1].loss));
        assert!(
            (f64::from(both.loss) - loss).abs() < 1e-5 * loss,
            "{}",
            dir.display()
        );
        for (k, (name, g)) in both.tensors.iter().enumerate() {
            let (a, b) = (
                each[0].tensors[k].1.to_f64_vec(),
                each[1].tensors[k].1.to_f64_vec(),
            );
            let want: Vec<f64> = a.iter().zip(&b).map(|(&x, &y)| mean(x, y)).collect();
            let scale = want.iter().fold(1e-30f64, |m, x| m.max(x.abs()));
            let err = common::max_abs(&g.to_f64_vec(), &want) / scale;
            assert!(err < 1e-4, "{}: {name} differs by {err}", dir.display());
        }
    }
}
