//! The layer stack's families against HF transformers' pure-torch models: the hybrids
//! (BambaForCausalLM, GraniteMoeHybridForCausalLM, NemotronHForCausalLM; fixtures made by
//! `tests/fixtures/hybrid/make_fixtures.py`) and the transformers (Llama with llama3 and linear
//! rotary scaling, Qwen2, Qwen3, Mistral with a sliding window, Gemma 2; fixtures made by
//! `tests/fixtures/transformers/make_fixtures.py`; each header says how): prompt logits at
//! every real position within 1e-4, the logits of the first decode steps, and 16 greedy tokens
//! identical, for prompts of 5 and 19 tokens, a batch of two and a left-padded batch.

use crate::common;

use std::collections::HashMap;

use common::{client, fixture_prompts as prompts, max_abs, read_safetensors, Stored};
use stablegraph::models::hybrid::Hybrid;
use stablegraph::DType;

/// The cases of a fixture: `case{k}.<what>` tensors by name.
type Cases = HashMap<String, Stored>;

/// Logits within this of transformers' float32 forward.
const TOL: f64 = 1e-4;

fn fixture(name: &str) -> (Hybrid, Cases) {
    let dir = common::hybrid::stack_fixture(name);
    let model = Hybrid::load(&client(), &dir, DType::F32).unwrap();
    (model, read_safetensors(&dir.join("cases.safetensors")))
}

/// Every case of the fixture `name` against transformers.
fn check(name: &str) {
    let (model, cases) = fixture(name);
    let mut k = 0;
    while cases.contains_key(&format!("case{k}.input_ids")) {
        let rows = prompts(&cases, k);
        check_prefill(&model, &cases, k, &rows, name);
        let greedy = &cases[&format!("case{k}.greedy")];
        let new = greedy.shape[1];
        let ours = model.greedy(&rows, new).unwrap();
        for (r, toks) in ours.iter().enumerate() {
            let hf: Vec<u32> = greedy.values[r * new..(r + 1) * new]
                .iter()
                .map(|&t| t as u32)
                .collect();
            assert_eq!(toks, &hf, "{name} case {k} row {r}: greedy tokens");
        }
        check_decode_logits(&model, &cases, k, &rows, name);
        k += 1;
    }
    assert!(k >= 4, "{name}: only {k} cases");
}

/// The prefill's logits at every real position against HF's.
fn check_prefill(model: &Hybrid, cases: &Cases, k: usize, rows: &[Vec<u32>], name: &str) {
    let vocab = model.config().vocab_size;
    let pre = model.prefill(rows).unwrap();
    let (got, want) = (pre.logits.to_f64_vec(), &cases[&format!("case{k}.logits")]);
    let (t_ours, t_hf) = (pre.logits.dims()[1], want.shape[1]);
    for (r, row) in rows.iter().enumerate() {
        for j in 0..row.len() {
            let ours = &got[(r * t_ours + t_ours - row.len() + j) * vocab..][..vocab];
            let hf = &want.values[(r * t_hf + t_hf - row.len() + j) * vocab..][..vocab];
            let d = max_abs(ours, hf);
            assert!(
                d < TOL,
                "{name} case {k} row {r} position {j}: logits differ by {d}"
            );
        }
    }
}

/// The step's logits along HF's greedy path against HF's decode logits (the first from the
/// prefill's last position).
fn check_decode_logits(model: &Hybrid, cases: &Cases, k: usize, rows: &[Vec<u32>], name: &str) {
    let vocab = model.config().vocab_size;
    let want = &cases[&format!("case{k}.decode_logits")];
    let greedy = &cases[&format!("case{k}.greedy")];
    let (steps, new) = (want.shape[1], greedy.shape[1]);
    let pre = model.prefill(rows).unwrap();
    let len = pre.logits.dims()[1];
    let first = pre.logits.to_f64_vec();
    for r in 0..rows.len() {
        let d = max_abs(
            &first[(r * len + len - 1) * vocab..][..vocab],
            &want.values[r * steps * vocab..][..vocab],
        );
        assert!(
            d < TOL,
            "{name} case {k} row {r}: first decode logits differ by {d}"
        );
    }
    let mut state = pre.state;
    for i in 1..steps {
        let picks: Vec<u32> = (0..rows.len())
            .map(|r| greedy.values[r * new + i - 1] as u32)
            .collect();
        let (logits, next) = model.step(&picks, state).unwrap();
        state = next;
        let got = logits.to_f64_vec();
        for r in 0..rows.len() {
            let hf = &want.values[(r * steps + i) * vocab..][..vocab];
            let d = max_abs(&got[r * vocab..][..vocab], hf);
            assert!(
                d < TOL,
                "{name} case {k} row {r} decode step {i}: logits differ by {d}"
            );
        }
    }
}

#[test]
fn bamba_matches_transformers() {
    check("bamba");
}

#[test]
fn granite_with_experts_matches_transformers() {
    check("granite");
}

#[test]
fn granite_dense_matches_transformers() {
    check("granite_dense");
}

#[test]
fn nemotron_h_matches_transformers() {
    check("nemotron");
}

#[test]
fn llama_with_llama3_scaling_and_biases_matches_transformers() {
    check("llama");
}

#[test]
fn llama_with_linear_scaling_and_a_tied_head_matches_transformers() {
    check("llama_linear");
}

#[test]
fn llama_with_mlp_biases_matches_transformers() {
    check("llama_mlp_bias");
}

#[test]
fn qwen2_matches_transformers() {
    check("qwen2");
}

#[test]
fn qwen3_matches_transformers() {
    check("qwen3");
}

#[test]
fn mistral_with_a_sliding_window_matches_transformers() {
    check("mistral");
}

#[test]
fn gemma2_matches_transformers() {
    check("gemma2");
}
