//! Generation in one program (prefill and the device-side decode loop) for every family through
//! `family::load` and `CausalLm`: greedy equals transformers' greedy tokens (the fixtures'), ragged batches
//! included; sampling with `top_k` 1 is greedy; a seed repeats its draw; a row stops at
//! `eos`, where it ends; penalties hold; a stream in segments gives the same tokens; state
//! files carry a conversation across calls.

use crate::common;

use common::{client, read_safetensors};
use stablegraph::models::family;
use stablegraph::models::mamba2::{Penalties, Sampling};
use stablegraph::models::GenerateOptions;
use stablegraph::DType;

#[test]
fn greedy_generation_in_one_program_equals_transformers() {
    for dir in common::other_family_fixtures() {
        let model = family::load(&client(), &dir, DType::F32).unwrap();
        let cases = read_safetensors(&dir.join("cases.safetensors"));
        for k in [1, 3] {
            let rows = common::fixture_prompts(&cases, k);
            let want = &cases[&format!("case{k}.greedy")];
            let new = want.shape[1];
            let got = model.generate(&rows, &common::greedy(new)).unwrap();
            for (r, toks) in got.iter().enumerate() {
                let hf: Vec<u32> = want.values[r * new..(r + 1) * new]
                    .iter()
                    .map(|&t| t as u32)
                    .collect();
                assert_eq!(toks, &hf, "{} case {k} row {r}", dir.display());
            }
        }
    }
}

#[test]
fn sampling_options_behave_in_one_program() {
    let rows = vec![vec![5, 9, 14, 20, 33], vec![40, 41]];
    for dir in common::other_family_fixtures() {
        let model = family::load(&client(), &dir, DType::F32).unwrap();
        let name = dir.display();
        let plain = model.generate(&rows, &common::greedy(12)).unwrap();
        assert_eq!(plain, model.greedy(&rows, 12).unwrap(), "{name}: host loop");
        let sample = |seed, top_k| GenerateOptions {
            sampling: Sampling::Sample {
                temperature: 1.0,
                top_k,
                top_p: 1.0,
                seed,
            },
            ..common::greedy(12)
        };
        assert_eq!(
            model.generate(&rows, &sample(3, 1)).unwrap(),
            plain,
            "{name}: top_k 1 is greedy"
        );
        let a = model.generate(&rows, &sample(7, 0)).unwrap();
        assert_eq!(
            a,
            model.generate(&rows, &sample(7, 0)).unwrap(),
            "{name}: seed"
        );
        let draws: Vec<_> = (0..4)
            .map(|s| model.generate(&rows, &sample(s, 0)).unwrap())
            .collect();
        assert!(
            draws.iter().any(|d| d != &a),
            "{name}: seeds all drew the same"
        );
        // A row stops at its first eos, where it ends.
        let eos = plain[0][3];
        let stopped = model
            .generate(
                &rows,
                &GenerateOptions {
                    eos: Some(eos),
                    ..common::greedy(12)
                },
            )
            .unwrap();
        let first = plain[0].iter().position(|&t| t == eos).unwrap();
        assert_eq!(stopped[0], plain[0][..=first], "{name}");
        // No repeated bigram: the greedy path changes where it repeated one.
        let penalties = Penalties {
            no_repeat_ngram_size: 2,
            ..Penalties::NONE
        };
        let fresh = model
            .generate(
                &rows,
                &GenerateOptions {
                    penalties,
                    ..common::greedy(12)
                },
            )
            .unwrap();
        for (r, row) in fresh.iter().enumerate() {
            let mut all = rows[r].clone();
            all.extend(row);
            let pairs: Vec<_> = all.windows(2).collect();
            for (i, p) in pairs.iter().enumerate() {
                assert!(
                    !pairs[..i].contains(p),
                    "{name} row {r}: bigram {p:?} repeated"
                );
            }
        }
    }
}

#[test]
fn streams_equal_one_program_generation() {
    let rows = vec![vec![5, 9, 14, 20, 33], vec![40, 41]];
    let options = GenerateOptions {
        max_new_tokens: 13,
        sampling: Sampling::Sample {
            temperature: 0.8,
            top_k: 20,
            top_p: 0.9,
            seed: 5,
        },
        eos: None,
        penalties: Penalties {
            repetition_penalty: 1.3,
            ..Penalties::NONE
        },
    };
    for dir in common::other_family_fixtures() {
        let model = family::load(&client(), &dir, DType::F32).unwrap();
        let name = dir.display();
        let whole = model.generate(&rows, &options).unwrap();
        let mut seen: Vec<Vec<u32>> = vec![Vec::new(); 2];
        let mut calls = 0;
        let streamed = model
            .generate_stream(&rows, &options, 5, &mut |fresh: &[Vec<u32>]| {
                calls += 1;
                for (s, f) in seen.iter_mut().zip(fresh) {
                    s.extend(f);
                }
                true
            })
            .unwrap();
        assert_eq!(streamed, whole, "{name}: streamed tokens");
        assert_eq!(seen, whole, "{name}: tokens handed over");
        assert_eq!(calls, 3, "{name}: 13 tokens in segments of 5");
        // Stopping after the first segment.
        let first = model
            .generate_stream(&rows, &options, 5, &mut |_: &[Vec<u32>]| false)
            .unwrap();
        assert_eq!(first[0], whole[0][..5], "{name}: the first segment");
    }
}

#[test]
fn state_files_continue_as_the_whole_prompt_does() {
    // Generating after a prompt fed in two calls (the state saved and loaded between them)
    // equals generating after the whole prompt; the second call's state file holds the rest.
    let (first, rest, whole) = crate::conversation();
    let dir = crate::common::TempDir::new("states");
    for fixture in common::other_family_fixtures() {
        let model = family::load(&client(), &fixture, DType::F32).unwrap();
        let name = fixture.display();
        let family = fixture
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap();
        let case = fixture.file_name().unwrap().to_str().unwrap();
        let path = dir.join(format!("{family}-{case}.safetensors"));
        let none = common::greedy(0);
        let made = model
            .generate_with_state_files(&first, &none, None, Some(&path))
            .unwrap();
        assert!(made.iter().all(Vec::is_empty), "{name}");
        let continued = model
            .generate_with_state_files(&rest, &common::greedy(10), Some(&path), Some(&path))
            .unwrap();
        assert_eq!(
            continued,
            model.generate(&whole, &common::greedy(10)).unwrap(),
            "{name}"
        );
        // The state after those 10 tokens continues too: one more call against the host loop.
        let more = model
            .generate_with_state_files(&[vec![3], vec![4]], &common::greedy(4), Some(&path), None)
            .unwrap();
        let longer: Vec<Vec<u32>> = whole
            .iter()
            .zip(&continued)
            .zip([3, 4])
            .map(|((w, c), t)| w.iter().chain(c).chain(&[t]).copied().collect())
            .collect();
        assert_eq!(
            more,
            model.greedy(&longer, 4).unwrap(),
            "{name}: a third call"
        );
    }
    // A state of another family is an error naming the file.
    let bamba = family::load(&client(), &common::hybrid::fixture("bamba"), DType::F32).unwrap();
    let e = bamba
        .generate_with_state_files(
            &rest,
            &common::greedy(2),
            Some(&dir.join("mamba1-tiny.safetensors")),
            None,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("mamba1-tiny.safetensors"), "{e}");
}
