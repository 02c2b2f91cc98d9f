//! Continuing from a state: a prompt fed in pieces equals the whole prompt (logits, states and
//! the tokens generated after it), `generate_from` hands back the state after what it emitted,
//! and states survive a safetensors round trip.

use crate::common;

use common::{array_diff, client, greedy, state_diff, tiny_mamba2, tiny_model};
use stablegraph::models::mamba2::{Mamba2, Mamba2State, Mamba2Weights, Penalties, Sampling};
use stablegraph::models::GenerateOptions;
use stablegraph::DType;

fn joined(a: &[Vec<u32>], b: &[Vec<u32>]) -> Vec<Vec<u32>> {
    a.iter()
        .zip(b)
        .map(|(x, y)| [x.clone(), y.clone()].concat())
        .collect()
}

/// Two rows of different lengths in both pieces, so both prefills pad, one piece shorter than
/// the convolution kernel.
fn pieces() -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    (
        vec![
            vec![3, 17, 42, 5, 9, 60, 1, 33, 8, 21, 14, 2],
            vec![7, 7, 30],
        ],
        vec![vec![11, 4], vec![50, 2, 19, 23, 61, 6, 44, 12, 9]],
    )
}

#[test]
fn a_prompt_in_pieces_equals_the_whole_prompt() {
    let (a, b) = pieces();
    let whole = joined(&a, &b);
    for chunk in [None, Some(2), Some(5)] {
        let m = tiny_model(DType::F32).with_prefill_chunk(chunk).unwrap();
        let first = m.prefill(&a).unwrap();
        let second = m.prefill_from(&b, first.state).unwrap();
        let want = m.prefill(&whole).unwrap();
        let d = array_diff(&second.logits, &want.logits);
        assert!(d < 1e-5, "chunk {chunk:?}: last logits differ by {d}");
        let d = state_diff(&second.state, &want.state);
        assert!(d < 1e-5, "chunk {chunk:?}: states differ by {d}");
        // And the tokens generated after it, greedy and sampled.
        let sampled = GenerateOptions {
            max_new_tokens: 7,
            sampling: Sampling::Sample {
                temperature: 0.9,
                top_k: 20,
                top_p: 0.95,
                seed: 3,
            },
            eos: None,
            penalties: Penalties::NONE,
        };
        for options in [greedy(7), sampled] {
            let first = m.prefill(&a).unwrap();
            let (tokens, _) = m.generate_from(&b, Some(first.state), &options).unwrap();
            assert_eq!(tokens, m.generate(&whole, &options).unwrap(), "{options:?}");
        }
    }
}

#[test]
fn generate_from_returns_the_state_after_what_it_emitted() {
    let (a, c) = pieces();
    let m = tiny_model(DType::F32);
    let free = m.generate(&a, &greedy(5)).unwrap();
    // Row 1 stops at its third token; row 0 runs to the end (unless it meets the same token).
    let eos = free[1][2];
    let options = GenerateOptions {
        eos: Some(eos),
        ..greedy(5)
    };
    let (tokens, state) = m.generate_from(&a, None, &options).unwrap();
    let emitted: Vec<Vec<u32>> = tokens
        .iter()
        .map(|row| match row.iter().position(|&t| t == eos) {
            Some(p) => row[..=p].to_vec(),
            None => row.clone(),
        })
        .collect();
    assert_eq!(emitted[1].len(), 3);
    let (next, _) = m.generate_from(&c, Some(state), &greedy(6)).unwrap();
    let history = joined(&joined(&a, &emitted), &c);
    assert_eq!(next, m.generate(&history, &greedy(6)).unwrap());
    // Zero new tokens: the state after the prompts alone.
    let (none, state) = m.generate_from(&a, None, &greedy(0)).unwrap();
    assert_eq!(none, vec![Vec::<u32>::new(); 2]);
    assert!(state_diff(&state, &m.prefill(&a).unwrap().state) < 1e-6);
}

#[test]
fn states_survive_a_file() {
    let (a, b) = pieces();
    let m = tiny_model(DType::F32);
    let dir = crate::common::TempDir::new("state");
    let path = dir.join("state.safetensors");
    m.prefill(&a).unwrap().state.save(&path).unwrap();
    let loaded = Mamba2State::load(&path, &client()).unwrap();
    assert_eq!(loaded.batch(), 2);
    let got = m.prefill_from(&b, loaded).unwrap();
    let want = m.prefill_from(&b, m.prefill(&a).unwrap().state).unwrap();
    assert_eq!(got.logits.to_f64_vec(), want.logits.to_f64_vec());

    // A state for another batch, another model or a damaged file is an error naming it.
    let e = m
        .prefill_from(&b[..1], Mamba2State::load(&path, &client()).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("layers.0.conv") && e.contains("(1 rows)"), "{e}");
    let mut one_layer = Mamba2State::load(&path, &client()).unwrap();
    one_layer.layers.pop();
    let e = m.prefill_from(&b, one_layer).unwrap_err().to_string();
    assert!(e.contains("1 layers, the model has 2"), "{e}");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let e = Mamba2State::load(&path, &client()).unwrap_err().to_string();
    assert!(e.contains("state.safetensors"), "{e}");
    let e = Mamba2State::load(&dir.join("missing"), &client())
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn streamed_generation_equals_one_program() {
    let (a, _) = pieces();
    let m = tiny_model(DType::F32);
    let free = m.generate(&a, &greedy(9)).unwrap();
    let sampled = GenerateOptions {
        max_new_tokens: 9,
        sampling: Sampling::Sample {
            temperature: 1.1,
            top_k: 0,
            top_p: 0.9,
            seed: 5,
        },
        eos: None,
        penalties: Penalties::NONE,
    };
    let with_eos = GenerateOptions {
        eos: Some(free[1][3]),
        ..greedy(9)
    };
    for options in [greedy(9), sampled, with_eos] {
        let want = m.generate(&a, &options).unwrap();
        for segment in [1, 4, 9, 16] {
            let mut seen: Vec<Vec<u32>> = vec![Vec::new(); 2];
            let mut calls = 0;
            let got = m
                .generate_stream(&a, &options, segment, |fresh| {
                    calls += 1;
                    for (s, f) in seen.iter_mut().zip(fresh) {
                        s.extend(f);
                    }
                    true
                })
                .unwrap();
            assert_eq!(got, want, "{options:?} segment {segment}");
            // The callback saw every token up to each row's eos, in order.
            for (s, w) in seen.iter().zip(&want) {
                let cut = options
                    .eos
                    .and_then(|e| w.iter().position(|&t| t == e))
                    .map_or(w.len(), |p| p + 1);
                assert_eq!(s[..], w[..cut], "{options:?} segment {segment}");
            }
            assert!(calls <= 9usize.div_ceil(segment), "{calls} calls");
        }
    }
    // Stopping early: the callback says no after the first segment.
    let got = m.generate_stream(&a, &greedy(9), 2, |_| false).unwrap();
    assert_eq!(got[0], free[0][..2]);
    assert!(m.generate_stream(&a, &greedy(9), 0, |_| true).is_err());
}

#[test]
fn a_kernel_of_one_continues_too() {
    let cfg = stablegraph::models::mamba2::Mamba2Config {
        conv_kernel: 1,
        ..tiny_mamba2()
    };
    let w = Mamba2Weights::random(&cfg, DType::F32, 9).unwrap();
    let m = Mamba2::new(&client(), cfg, &w).unwrap();
    let (a, b) = pieces();
    let first = m.prefill(&a).unwrap();
    let second = m.prefill_from(&b, first.state).unwrap();
    let want = m.prefill(&joined(&a, &b)).unwrap();
    let d = array_diff(&second.logits, &want.logits);
    assert!(d < 1e-5, "last logits differ by {d}");
}
