//! Mamba-1 against HF transformers' pure-torch MambaForCausalLM and FalconMambaForCausalLM
//! (fixtures made by `tests/fixtures/mamba1/make_fixtures.py`; its header says how): prompt
//! logits at every real position within 1e-4, the states after the prompt, the logits of the
//! first decode steps, and 16 greedy tokens identical, for prompts of 5 and 19 tokens, a batch
//! of two and a left-padded batch.

use crate::common;

use std::collections::HashMap;

use common::{client, fixture_prompts as prompts, max_abs, read_safetensors, Stored};
use stablegraph::models::mamba1::{Mamba1, Scan};
use stablegraph::DType;

/// The cases of a fixture: `case{k}.<what>` tensors by name.
type Cases = HashMap<String, Stored>;

/// Logits and states within this of transformers' float32 forward.
const TOL: f64 = 1e-4;

fn fixture(name: &str) -> (Mamba1, Cases) {
    let dir = common::mamba1::fixture(name);
    let model = Mamba1::load(&client(), &dir, DType::F32).unwrap();
    (model, read_safetensors(&dir.join("cases.safetensors")))
}

/// Every case of the fixture `name` against transformers: the prefill with both scans, the
/// greedy tokens and the decode logits.
fn check(name: &str) {
    let (model, cases) = fixture(name);
    let associative = fixture(name).0.with_scan(Scan::Associative);
    let mut k = 0;
    while cases.contains_key(&format!("case{k}.input_ids")) {
        let rows = prompts(&cases, k);
        for m in [&model, &associative] {
            check_prefill(m, &cases, k, &rows, name);
        }
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

/// The prefill's logits at every real position and its states against HF's.
fn check_prefill(model: &Mamba1, cases: &Cases, k: usize, rows: &[Vec<u32>], name: &str) {
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
    for (l, s) in pre.states.iter().enumerate() {
        let ssm = &cases[&format!("case{k}.ssm_state.L{l}")].values;
        let d = max_abs(&s.ssm.to_f64_vec(), ssm);
        assert!(
            d < TOL,
            "{name} case {k} layer {l}: ssm state differs by {d}"
        );
        let conv = &cases[&format!("case{k}.conv_state.L{l}")].values;
        let d = max_abs(&s.conv.to_f64_vec(), conv);
        assert!(
            d < TOL,
            "{name} case {k} layer {l}: conv state differs by {d}"
        );
    }
}

/// The step's logits along HF's greedy path against HF's decode logits.
fn check_decode_logits(model: &Mamba1, cases: &Cases, k: usize, rows: &[Vec<u32>], name: &str) {
    let vocab = model.config().vocab_size;
    let want = &cases[&format!("case{k}.decode_logits")];
    let greedy = &cases[&format!("case{k}.greedy")];
    let (steps, new) = (want.shape[1], greedy.shape[1]);
    let mut states = model.prefill(rows).unwrap().states;
    for i in 1..steps {
        let picks: Vec<u32> = (0..rows.len())
            .map(|r| greedy.values[r * new + i - 1] as u32)
            .collect();
        let (logits, next) = model.step(&picks, &states).unwrap();
        states = next;
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
fn mamba_matches_transformers() {
    check("tiny");
}

#[test]
fn falcon_mamba_matches_transformers() {
    check("falcon");
}
