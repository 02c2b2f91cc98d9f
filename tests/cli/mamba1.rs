//! `generate --model DIR` on the Mamba-1 and Falcon-Mamba fixtures: tokens and prompt logits
//! against HF transformers, a batch of two, a `mamba_ssm`-layout checkpoint, and the flags and
//! model types it refuses.

use crate::common::{max_abs, read_safetensors};
use crate::{error_line, read_npy, run_ok, scratch};

/// Case 2 of a fixture (two prompts of 12 tokens) through the CLI: `--json` tokens equal HF's
/// greedy tokens, `--dump-logits` HF's prompt logits within 1e-4.
fn check(name: &str) {
    let dir = crate::common::mamba1::fixture(name);
    let cases = read_safetensors(&dir.join("cases.safetensors"));
    let fixture = dir.to_str().unwrap().to_string();
    let ids = &cases["case2.input_ids"];
    let (rows, len) = (ids.shape[0], ids.shape[1]);
    let prompt_ids: Vec<String> = (0..rows)
        .map(|r| {
            ids.values[r * len..(r + 1) * len]
                .iter()
                .map(|v| (*v as u32).to_string())
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    let out_dir = scratch(&format!("mamba1-{name}"));
    let (json, npy) = (out_dir.join("out.json"), out_dir.join("logits.npy"));
    let greedy = &cases["case2.greedy"];
    let new = greedy.shape[1];
    let stdout = run_ok(&[
        "generate",
        "--model",
        &fixture,
        "--prompt-ids",
        &prompt_ids.join(";"),
        "--max-new-tokens",
        &new.to_string(),
        "--json",
        json.to_str().unwrap(),
        "--dump-logits",
        npy.to_str().unwrap(),
    ]);
    assert!(stdout.contains("Mamba"), "{stdout}");
    let out: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for r in 0..rows {
        let ours: Vec<u64> = out["tokens"][r]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect();
        let hf: Vec<u64> = greedy.values[r * new..(r + 1) * new]
            .iter()
            .map(|&t| t as u64)
            .collect();
        assert_eq!(ours, hf, "{name} row {r}");
    }
    let (shape, logits) = read_npy(&npy);
    let want = &cases["case2.logits"];
    assert_eq!(shape, want.shape);
    let logits: Vec<f64> = logits.iter().map(|&x| f64::from(x)).collect();
    let d = max_abs(&logits, &want.values);
    assert!(d < 1e-4, "{name}: prompt logits differ by {d}");
}

#[test]
fn generate_runs_mamba_checkpoints_as_transformers_does() {
    check("tiny");
}

#[test]
fn generate_runs_falcon_mamba_checkpoints_as_transformers_does() {
    check("falcon");
}

#[test]
fn what_mamba1_does_not_take_yet_is_a_one_line_error() {
    let e = error_line(&[
        "generate",
        "--model",
        "tests/fixtures/mamba1/tiny",
        "--top-k",
        "5",
        "--stream",
    ]);
    assert!(e.contains("--top-k") && e.contains("--stream"), "{e}");
    let e = error_line(&["bench", "--model", "tests/fixtures/mamba1/falcon"]);
    assert!(e.contains("\"falcon_mamba\" is Mamba-1"), "{e}");
}

#[test]
fn an_unknown_model_type_is_a_one_line_error_listing_the_supported_ones() {
    let dir = scratch("llama");
    std::fs::write(dir.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
    let e = error_line(&["generate", "--model", dir.to_str().unwrap()]);
    assert!(e.contains("\"llama\" is not supported"), "{e}");
    assert!(e.contains("mamba2") && e.contains("falcon_mamba"), "{e}");
}

#[test]
fn generate_runs_a_mamba_ssm_checkpoint_as_mamba1() {
    let dir = crate::common::mamba1::as_mamba_ssm();
    let stdout = run_ok(&[
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
        "--max-new-tokens",
        "4",
    ]);
    assert!(stdout.contains("(Mamba-1)"), "{stdout}");
}
