//! Mamba-2 against HF transformers' pure-torch Mamba2ForCausalLM (fixtures made by
//! `tests/fixtures/mamba2/make_fixtures.py`; see its header for the exact command): prompt logits
//! at every position within 1e-4, final SSM and conv states, and 32 greedy tokens identical, for
//! a prompt shorter than a chunk, one of exactly two chunks, one not a multiple of the chunk, a
//! batch of two, a left-padded batch, and n_groups = 2; plus the step API against HF's decode.

use crate::common;

use std::collections::HashMap;

use common::{client, max_abs, read_safetensors, Stored};
use stablegraph::models::mamba2::{Mamba2, Mamba2Config, Mamba2Weights};
use stablegraph::DType;

/// The cases of a fixture: `case{k}.<what>` tensors by name.
type Cases = HashMap<String, Stored>;

fn fixture(name: &str) -> (Mamba2, Cases) {
    let dir = common::fixtures_dir().join("mamba2").join(name);
    let config = Mamba2Config::from_file(dir.join("config.json")).unwrap();
    let weights = Mamba2Weights::load(&dir, &config, DType::F32).unwrap();
    let model = Mamba2::new(&client(), config, &weights).unwrap();
    (model, read_safetensors(&dir.join("cases.safetensors")))
}

/// The real tokens of each row (the attention mask's ones), in order.
fn prompts(cases: &Cases, k: usize) -> Vec<Vec<u32>> {
    let ids = &cases[&format!("case{k}.input_ids")];
    let (dims, ids) = (&ids.shape, &ids.values);
    let mask = match cases.get(&format!("case{k}.attention_mask")) {
        Some(m) => m.values.clone(),
        None => vec![1.0; ids.len()],
    };
    (0..dims[0])
        .map(|r| {
            (0..dims[1])
                .filter(|&t| mask[r * dims[1] + t] == 1.0)
                .map(|t| ids[r * dims[1] + t] as u32)
                .collect()
        })
        .collect()
}

fn check_config(name: &str) {
    let (model, cases) = fixture(name);
    let cfg = model.config().clone();
    let vocab = cfg.vocab_size;
    let mut k = 0;
    while cases.contains_key(&format!("case{k}.input_ids")) {
        let rows = prompts(&cases, k);
        let pre = model.prefill_all_positions(&rows).unwrap();
        // The default prefill returns the last position of the same (what generate runs).
        let last = model.prefill(&rows).unwrap().logits.to_f64_vec();
        let t = pre.logits.dims()[1];
        for (r, want) in last.chunks(vocab).enumerate() {
            let all = &pre.logits.to_f64_vec()[(r * t + t - 1) * vocab..][..vocab];
            let d = all
                .iter()
                .zip(want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            assert!(
                d < 1e-5,
                "{name} case {k} row {r}: last logits differ by {d}"
            );
        }

        // Logits at every real position.
        let logits = &cases[&format!("case{k}.logits")];
        let (ldims, want) = (&logits.shape, &logits.values);
        let got = pre.logits.to_f64_vec();
        let (t_hf, t_ours) = (ldims[1], pre.logits.dims()[1]);
        for (r, row) in rows.iter().enumerate() {
            let n = row.len();
            for j in 0..n {
                let ours = &got[(r * t_ours + t_ours - n + j) * vocab..][..vocab];
                let hf = &want[(r * t_hf + t_hf - n + j) * vocab..][..vocab];
                let d = max_abs(ours, hf);
                assert!(
                    d < 1e-4,
                    "{name} case {k} row {r} position {j}: logits differ by {d}"
                );
            }
        }

        // Final states.
        for (l, state) in pre.state.layers.iter().enumerate() {
            let ssm = &cases[&format!("case{k}.ssm_state.L{l}")].values;
            let conv = &cases[&format!("case{k}.conv_state.L{l}")].values;
            let (ssm_got, conv_got) = (state.ssm.to_vec::<f32>(), state.conv.to_vec::<f32>());
            let f64s = |v: Vec<f32>| v.into_iter().map(f64::from).collect::<Vec<_>>();
            let d_ssm = max_abs(&f64s(ssm_got.unwrap()), ssm);
            let d_conv = max_abs(&f64s(conv_got.unwrap()), conv);
            assert!(
                d_ssm < 1e-4,
                "{name} case {k} layer {l}: ssm state differs by {d_ssm}"
            );
            assert!(
                d_conv < 1e-5,
                "{name} case {k} layer {l}: conv state differs by {d_conv}"
            );
        }

        // The step API reproduces HF's decode logits, token by token.
        let greedy = &cases[&format!("case{k}.greedy")];
        let (gdims, greedy) = (&greedy.shape, &greedy.values);
        let decode = &cases[&format!("case{k}.decode_logits")];
        let (ddims, decode) = (&decode.shape, &decode.values);
        let mut state = pre.state;
        for s in 1..ddims[1] {
            let tokens: Vec<u32> = (0..gdims[0])
                .map(|r| greedy[r * gdims[1] + s - 1] as u32)
                .collect();
            let (logits, next) = model.step(&tokens, state).unwrap();
            state = next;
            let got = logits.to_f64_vec();
            for r in 0..gdims[0] {
                let hf = &decode[(r * ddims[1] + s) * vocab..][..vocab];
                let d = max_abs(&got[r * vocab..(r + 1) * vocab], hf);
                assert!(
                    d < 1e-4,
                    "{name} case {k} row {r} step {s}: logits differ by {d}"
                );
            }
        }

        // 32 greedy tokens in one program.
        let options = common::greedy(gdims[1]);
        let tokens = model.generate(&rows, &options).unwrap();
        for (r, row) in tokens.iter().enumerate() {
            let want: Vec<u32> = greedy[r * gdims[1]..(r + 1) * gdims[1]]
                .iter()
                .map(|&t| t as u32)
                .collect();
            assert_eq!(row, &want, "{name} case {k} row {r}: greedy tokens");
        }
        k += 1;
    }
    assert!(k >= 4, "{name}: only {k} cases found");
}

#[test]
fn tiny_matches_transformers() {
    check_config("tiny");
}

#[test]
fn two_groups_match_transformers() {
    check_config("groups2");
}
