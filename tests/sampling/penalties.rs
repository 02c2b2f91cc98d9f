//! Penalties on repeated tokens (`stablegraph::sampling::penalize` and generation with
//! `GenerateOptions::penalties`), against host references written here from the published
//! formulas: transformers' `repetition_penalty` (CTRL: a seen token's logit divided by the
//! penalty when positive, multiplied when negative) and `no_repeat_ngram_size` (its n-gram
//! enumeration), llama.cpp's / OpenAI's `presence_penalty` and `frequency_penalty`
//! (`x -= count * frequency + (count > 0) * presence`) over llama.cpp's `repeat_last_n` window.
//! Generation with penalties (greedy, so deterministic) is compared with a host loop over the
//! step program that applies the host reference; the settings' errors name the setting; the
//! `generation_config.json` reader is checked on good and bad files.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use crate::common::{client, Rng};
use stablegraph::models::mamba2::{Mamba2, Mamba2Config, Mamba2Weights};
use stablegraph::models::GenerateOptions;
use stablegraph::ops::Graph;
use stablegraph::sampling::{
    penalize, GenerationConfig, Penalties, PenaltySettings, Sampling, TokenHistory,
    MAX_NO_REPEAT_NGRAM_SIZE,
};
use stablegraph::{DType, HostArray};

// ---- the host reference, from the formulas ----

/// The logits of one row after the penalties for `context` (the real tokens, oldest first).
fn reference(logits: &[f32], context: &[u32], p: &Penalties) -> Vec<f32> {
    let window = match p.repeat_last_n {
        None => context,
        Some(n) => &context[context.len() - n.min(context.len())..],
    };
    let mut counts: HashMap<u32, f32> = HashMap::new();
    for &t in window {
        *counts.entry(t).or_default() += 1.0;
    }
    let mut out: Vec<f32> = logits
        .iter()
        .enumerate()
        .map(|(v, &x)| {
            let c = counts.get(&(v as u32)).copied().unwrap_or(0.0);
            if c == 0.0 {
                return x;
            }
            // transformers: torch.where(score < 0, score * penalty, score / penalty).
            let x = if x < 0.0 {
                x * p.repetition_penalty
            } else {
                x / p.repetition_penalty
            };
            // llama.cpp: logit -= count * freq + (count > 0) * presence.
            x - (c * p.frequency_penalty + p.presence_penalty)
        })
        .collect();
    let banned = banned_tokens(context, p.no_repeat_ngram_size);
    // A row whose every token would be banned keeps its logits (our documented choice).
    if banned.len() < logits.len() {
        for t in banned {
            out[t as usize] = f32::NEG_INFINITY;
        }
    }
    out
}

/// transformers' no-repeat-n-gram: every n-gram of the context, keyed by its first n - 1
/// tokens; the tokens banned are the last tokens of those whose key is the context's last n - 1
/// tokens (none while the context is shorter than n - 1 ... as `cur_len + 1 < n` there).
fn banned_tokens(context: &[u32], n: usize) -> HashSet<u32> {
    let mut banned = HashSet::new();
    if n == 0 || context.len() + 1 < n {
        return banned;
    }
    let key = &context[context.len() + 1 - n..];
    for gram in context.windows(n) {
        if &gram[..n - 1] == key {
            banned.insert(gram[n - 1]);
        }
    }
    banned
}

/// The first index of the largest value.
fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

fn close(got: &[f32], want: &[f32]) -> bool {
    got.iter().zip(want).all(|(&g, &w)| {
        if w.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= 1e-5 * w.abs() + 1e-6
        }
    })
}

// ---- penalize on the device and in the interpreter ----

/// The program `penalize(logits, settings, history)`, parameters in that order.
fn penalize_graph(batch: usize, vocab: usize, width: usize) -> Graph {
    let g = Graph::new();
    let logits = g.parameter("logits", DType::F32, &[batch, vocab]).unwrap();
    let settings = PenaltySettings::parameters(&g, batch).unwrap();
    let history = TokenHistory::parameters(&g, batch, width).unwrap();
    let out = penalize(&logits, &settings, &history).unwrap();
    g.set_outputs(&[&out]).unwrap();
    g
}

/// The settings arrays of one program, a row each (the window's "whole context" as i32::MAX,
/// as `PenaltySettings` documents).
fn settings_arrays(rows: &[Penalties]) -> Vec<HostArray> {
    let b = rows.len();
    let f = |get: fn(&Penalties) -> f32| {
        HostArray::from_vec(&[b], rows.iter().map(get).collect::<Vec<f32>>()).unwrap()
    };
    let window = rows
        .iter()
        .map(|p| p.repeat_last_n.map_or(i32::MAX, |n| n as i32))
        .collect::<Vec<i32>>();
    let ngram = rows
        .iter()
        .map(|p| p.no_repeat_ngram_size as i32)
        .collect::<Vec<i32>>();
    vec![
        f(|p| p.repetition_penalty),
        f(|p| p.presence_penalty),
        f(|p| p.frequency_penalty),
        HostArray::from_vec(&[b], window).unwrap(),
        HostArray::from_vec(&[b], ngram).unwrap(),
    ]
}

fn random_penalties(rng: &mut Rng, context_len: usize) -> Penalties {
    let len = context_len;
    let (any_penalty, any_window, any_n) = (
        rng.uniform(0.2, 3.0) as f32,
        rng.below(len + 1),
        1 + rng.below(4),
    );
    Penalties {
        repetition_penalty: rng.pick(&[1.0, 0.5, 1.3, 2.0, any_penalty]),
        presence_penalty: rng.pick(&[0.0, 0.7, -0.5]),
        frequency_penalty: rng.pick(&[0.0, 0.3, -0.2]),
        repeat_last_n: rng.pick(&[
            None,
            Some(0),
            Some(1),
            Some(len.saturating_sub(1)),
            Some(len),
            Some(len + 3),
            Some(any_window),
        ]),
        no_repeat_ngram_size: rng.pick(&[0, 1, 2, 3, len, len + 1, any_n]),
    }
}

/// The longest `k` with `context[j - k..j] == context[len - k..]`: what `matched` holds.
fn common_suffix(context: &[u32], j: usize) -> usize {
    let len = context.len();
    (0..=j)
        .take_while(|&k| k == 0 || context[j - k] == context[len - k])
        .last()
        .unwrap_or(0)
}

#[test]
fn penalize_matches_the_formulas_on_device_and_in_the_interpreter() {
    let (batch, vocab, prompt_width, width) = (4, 12, 10, 14);
    let program = penalize_graph(batch, vocab, width);
    let compiled = program.compile(&client()).unwrap();
    let mut rng = Rng::new(11);
    for trial in 0..60 {
        // Small alphabets make repeats and repeated n-grams common.
        let alphabet = rng.pick(&[2, 3, 5, vocab]);
        let prompts: Vec<Vec<u32>> = (0..batch)
            .map(|r| {
                let len = if r == 0 {
                    prompt_width
                } else {
                    1 + rng.below(prompt_width)
                };
                (0..len).map(|_| rng.below(alphabet) as u32).collect()
            })
            .collect();
        let rows: Vec<Penalties> = prompts
            .iter()
            .map(|p| random_penalties(&mut rng, p.len()))
            .collect();
        // Logits with negatives, zeros and ties.
        let logits: Vec<f32> = (0..batch * vocab)
            .map(|_| match rng.below(6) {
                0 => 0.0,
                1 => 1.5,
                _ => rng.uniform(-4.0, 4.0) as f32,
            })
            .collect();
        let history = TokenHistory::host_values(&prompts, prompt_width, width).unwrap();
        // The history's `matched` is the common suffix the docs define.
        let matched = history[1].1.as_array::<i32>().unwrap();
        for (r, p) in prompts.iter().enumerate() {
            let pad = prompt_width - p.len();
            for j in 0..p.len() {
                let got = matched[[r, pad + j]] as usize;
                assert_eq!(
                    got,
                    common_suffix(p, j),
                    "trial {trial} row {r} position {j}"
                );
            }
        }
        let mut inputs = vec![HostArray::from_vec(&[batch, vocab], logits.clone()).unwrap()];
        inputs.extend(settings_arrays(&rows));
        inputs.extend(history.into_iter().map(|(_, a)| a));
        let device = compiled.run(&inputs).unwrap()[0].to_f64_vec();
        let interp = program.evaluate(&inputs).unwrap()[0].to_f64_vec();
        for r in 0..batch {
            let row = &logits[r * vocab..(r + 1) * vocab];
            let want = reference(row, &prompts[r], &rows[r]);
            for (what, got) in [("device", &device), ("interpreter", &interp)] {
                let got: Vec<f32> = got[r * vocab..(r + 1) * vocab]
                    .iter()
                    .map(|&x| x as f32)
                    .collect();
                assert!(
                    close(&got, &want),
                    "trial {trial} row {r} ({what}): context {:?}, {:?}\ngot  {got:?}\nwant {want:?}",
                    prompts[r],
                    rows[r]
                );
            }
        }
    }
}

#[test]
fn penalize_edge_cases() {
    let (vocab, width) = (4, 8);
    let program = penalize_graph(1, vocab, width);
    let run = |context: &[u32], p: Penalties, logits: [f32; 4]| -> Vec<f32> {
        let history = TokenHistory::host_values(&[context.to_vec()], context.len(), width).unwrap();
        let mut inputs = vec![HostArray::from_vec(&[1, vocab], logits.to_vec()).unwrap()];
        inputs.extend(settings_arrays(&[p]));
        inputs.extend(history.into_iter().map(|(_, a)| a));
        let out = program.evaluate(&inputs).unwrap()[0].to_f64_vec();
        out.iter().map(|&x| x as f32).collect()
    };
    let off = Penalties::NONE;
    let inf = f32::NEG_INFINITY;
    // Negative logits are multiplied, positive divided, zero stays; unseen tokens untouched.
    let rep = Penalties {
        repetition_penalty: 2.0,
        ..off
    };
    assert_eq!(
        run(&[0, 1, 2], rep, [-1.0, 3.0, 0.0, 5.0]),
        [-2.0, 1.5, 0.0, 5.0]
    );
    // A repeated token counts for the frequency penalty, once for the presence penalty.
    let fp = Penalties {
        frequency_penalty: 0.5,
        presence_penalty: 0.25,
        ..off
    };
    assert_eq!(run(&[1, 1, 1, 2], fp, [0.0; 4]), [0.0, -1.75, -0.75, 0.0]);
    // The window: the last 2 tokens only; 0 tokens: nothing.
    let last2 = Penalties {
        repeat_last_n: Some(2),
        ..fp
    };
    assert_eq!(
        run(&[3, 1, 1, 2], last2, [0.0; 4]),
        [0.0, -0.75, -0.75, 0.0]
    );
    let none = Penalties {
        repeat_last_n: Some(0),
        ..fp
    };
    assert_eq!(run(&[3, 1, 1, 2], none, [0.0; 4]), [0.0; 4]);
    // n = 1 bans every token of the context; n = 2 the tokens that followed the last one; an
    // n-gram starting at the first position counts.
    let ngram = |n| Penalties {
        no_repeat_ngram_size: n,
        ..off
    };
    assert_eq!(run(&[2, 0, 2], ngram(1), [1.0; 4]), [inf, 1.0, inf, 1.0]);
    assert_eq!(run(&[2, 0, 2], ngram(2), [1.0; 4]), [inf, 1.0, 1.0, 1.0]);
    assert_eq!(
        run(&[2, 0, 3, 2, 0], ngram(3), [1.0; 4]),
        [1.0, 1.0, 1.0, inf]
    );
    // Longer than the context, or no earlier occurrence: nothing is banned.
    assert_eq!(run(&[2, 0, 2], ngram(4), [1.0; 4]), [1.0; 4]);
    assert_eq!(run(&[0, 1, 2, 3], ngram(2), [1.0; 4]), [1.0; 4]);
    // Every token banned: the row keeps its logits.
    assert_eq!(run(&[0, 1, 2, 3], ngram(1), [1.0; 4]), [1.0; 4]);
}

#[test]
fn push_extends_the_history_like_a_longer_prompt() {
    let (width, k) = (12, 5);
    let mut rng = Rng::new(3);
    for trial in 0..20 {
        let full: Vec<Vec<u32>> = (0..3)
            .map(|_| {
                let len = k + 1 + rng.below(4);
                (0..len).map(|_| rng.below(3) as u32).collect()
            })
            .collect();
        let heads: Vec<Vec<u32>> = full.iter().map(|p| p[..p.len() - k].to_vec()).collect();
        let head_width = 4;
        let g = Graph::new();
        let mut h = TokenHistory::parameters(&g, 3, width).unwrap();
        let tail = g.parameter("tail", DType::I32, &[3, k]).unwrap();
        for i in 0..k {
            let t = tail.narrow(1, i, 1).unwrap().reshape(&[3]).unwrap();
            h = h.push(&t).unwrap();
        }
        g.set_outputs(&[&h.tokens, &h.matched, &h.len]).unwrap();
        let mut inputs: Vec<HostArray> = TokenHistory::host_values(&heads, head_width, width)
            .unwrap()
            .into_iter()
            .map(|(_, a)| a)
            .collect();
        let tails: Vec<i32> = full
            .iter()
            .flat_map(|p| p[p.len() - k..].iter().map(|&t| t as i32))
            .collect();
        inputs.push(HostArray::from_vec(&[3, k], tails).unwrap());
        let got = g.compile(&client()).unwrap().run(&inputs).unwrap();
        let want = TokenHistory::host_values(&full, head_width + k, width).unwrap();
        for (i, (name, w)) in want.iter().enumerate() {
            assert_eq!(got[i].to_f64_vec(), w.to_f64_vec(), "trial {trial}: {name}");
        }
    }
}

// ---- generation on the tiny fixture, against a host loop over the step program ----

fn tiny() -> Mamba2 {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mamba2/tiny");
    let config = Mamba2Config::from_file(dir.join("config.json")).unwrap();
    let weights = Mamba2Weights::load(&dir, &config, DType::F32).unwrap();
    Mamba2::new(&client(), config, &weights).unwrap()
}

/// Greedy generation of one row, one `Mamba2::step` at a time, with the host reference
/// penalties: the tokens `generate` must return (after `eos`, `eos` repeated).
fn host_loop(m: &Mamba2, prompt: &[u32], options: &GenerateOptions) -> Vec<u32> {
    let pre = m.prefill(&[prompt.to_vec()]).unwrap();
    let mut logits: Vec<f32> = pre.logits.to_f64_vec().iter().map(|&x| x as f32).collect();
    let mut state = pre.state;
    let mut context = prompt.to_vec();
    let mut out = Vec::new();
    while out.len() < options.max_new_tokens {
        let t = argmax(&reference(&logits, &context, &options.penalties));
        out.push(t);
        if Some(t) == options.eos {
            out.resize(options.max_new_tokens, t);
            break;
        }
        context.push(t);
        let (next, s) = m.step(&[t], state).unwrap();
        logits = next.to_f64_vec().iter().map(|&x| x as f32).collect();
        state = s;
    }
    out
}

fn greedy(n: usize, penalties: Penalties) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: n,
        sampling: Sampling::Greedy,
        eos: None,
        penalties,
    }
}

/// Settings that change the tiny model's greedy output, each alone and together.
fn penalty_cases() -> Vec<Penalties> {
    let off = Penalties::NONE;
    vec![
        Penalties {
            repetition_penalty: 1.5,
            ..off
        },
        Penalties {
            repetition_penalty: 1.3,
            repeat_last_n: Some(4),
            ..off
        },
        Penalties {
            presence_penalty: 0.4,
            frequency_penalty: 0.3,
            repeat_last_n: Some(9),
            ..off
        },
        Penalties {
            no_repeat_ngram_size: 2,
            ..off
        },
        Penalties {
            no_repeat_ngram_size: 1,
            ..off
        },
        Penalties {
            repetition_penalty: 1.2,
            frequency_penalty: 0.2,
            no_repeat_ngram_size: 3,
            ..off
        },
    ]
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![5, 17, 5, 17, 5, 3, 9, 5, 17, 8, 21, 5],
        vec![42],
        vec![7, 7, 7, 60, 7],
    ]
}

#[test]
fn greedy_generation_with_penalties_equals_the_host_loop() {
    let m = tiny();
    let prompts = prompts();
    for penalties in penalty_cases() {
        let options = greedy(20, penalties);
        let want: Vec<Vec<u32>> = prompts.iter().map(|p| host_loop(&m, p, &options)).collect();
        let got = m.generate(&prompts, &options).unwrap();
        assert_eq!(got, want, "generate, {penalties:?}");
        // The batch rows differ in length: each row equals its prompt alone.
        for (r, p) in prompts.iter().enumerate() {
            let alone = m.generate(std::slice::from_ref(p), &options).unwrap();
            assert_eq!(alone[0], want[r], "row {r} alone, {penalties:?}");
        }
        // The program that also returns the state steps every token (no pick after the loop).
        let (from, _) = m.generate_from(&prompts, None, &options).unwrap();
        assert_eq!(from, want, "generate_from, {penalties:?}");
        for segment in [1, 3, 7, 32] {
            let got = m
                .generate_stream(&prompts, &options, segment, |_| true)
                .unwrap();
            assert_eq!(
                got, want,
                "generate_stream segment {segment}, {penalties:?}"
            );
        }
    }
    // The penalties change the output (else this test would show little).
    let plain = m.generate(&prompts, &greedy(20, Penalties::NONE)).unwrap();
    let banned = m
        .generate(&prompts, &greedy(20, penalty_cases()[4]))
        .unwrap();
    assert_ne!(plain, banned);
}

#[test]
fn penalties_with_eos_stop_rows_like_the_host_loop() {
    let m = tiny();
    let prompts = prompts();
    let penalties = penalty_cases()[5];
    let free = m.generate(&prompts, &greedy(16, penalties)).unwrap();
    for eos in [free[0][4], free[2][1]] {
        let options = GenerateOptions {
            eos: Some(eos),
            ..greedy(16, penalties)
        };
        let want: Vec<Vec<u32>> = prompts.iter().map(|p| host_loop(&m, p, &options)).collect();
        assert_eq!(m.generate(&prompts, &options).unwrap(), want, "eos {eos}");
        let streamed = m.generate_stream(&prompts, &options, 3, |_| true).unwrap();
        assert_eq!(streamed, want, "eos {eos}, streamed");
    }
}

#[test]
fn penalties_apply_before_sampling() {
    let m = tiny();
    let prompts = prompts();
    for penalties in penalty_cases() {
        // Top-k 1 keeps the most likely token after the penalties: greedy with them.
        let top1 = GenerateOptions {
            sampling: Sampling::Sample {
                temperature: 0.7,
                top_k: 1,
                top_p: 1.0,
                seed: 3,
            },
            ..greedy(12, penalties)
        };
        let want = m.generate(&prompts, &greedy(12, penalties)).unwrap();
        assert_eq!(m.generate(&prompts, &top1).unwrap(), want, "{penalties:?}");
        let streamed = m.generate_stream(&prompts, &top1, 5, |_| true).unwrap();
        assert_eq!(streamed, want, "streamed, {penalties:?}");
    }
    // Hot sampling with bigrams banned never repeats a bigram of its context.
    let options = GenerateOptions {
        sampling: Sampling::Sample {
            temperature: 2.0,
            top_k: 0,
            top_p: 1.0,
            seed: 9,
        },
        ..greedy(
            24,
            Penalties {
                no_repeat_ngram_size: 2,
                ..Penalties::NONE
            },
        )
    };
    let got = m.generate(&prompts, &options).unwrap();
    assert_eq!(got, m.generate(&prompts, &options).unwrap(), "reproducible");
    for (p, row) in prompts.iter().zip(&got) {
        let context: Vec<u32> = p.iter().chain(row).copied().collect();
        for end in p.len()..context.len() {
            let banned = banned_tokens(&context[..end], 2);
            assert!(!banned.contains(&context[end]), "{context:?} at {end}");
        }
    }
}

// ---- errors ----

#[test]
fn bad_penalties_are_errors_naming_the_setting() {
    let m = tiny();
    let off = Penalties::NONE;
    let cases = [
        (
            Penalties {
                repetition_penalty: f32::NAN,
                ..off
            },
            "penalties.repetition_penalty",
        ),
        (
            Penalties {
                repetition_penalty: 0.0,
                ..off
            },
            "penalties.repetition_penalty",
        ),
        (
            Penalties {
                repetition_penalty: -1.5,
                ..off
            },
            "penalties.repetition_penalty",
        ),
        (
            Penalties {
                repetition_penalty: f32::INFINITY,
                ..off
            },
            "penalties.repetition_penalty",
        ),
        (
            Penalties {
                presence_penalty: f32::NAN,
                ..off
            },
            "penalties.presence_penalty",
        ),
        (
            Penalties {
                frequency_penalty: f32::NEG_INFINITY,
                ..off
            },
            "penalties.frequency_penalty",
        ),
        (
            Penalties {
                no_repeat_ngram_size: MAX_NO_REPEAT_NGRAM_SIZE + 1,
                ..off
            },
            "penalties.no_repeat_ngram_size",
        ),
    ];
    for (penalties, name) in cases {
        assert!(penalties.check().unwrap_err().to_string().contains(name));
        let options = greedy(4, penalties);
        let errors = [
            m.generate(&prompts(), &options).unwrap_err(),
            m.generate_stream(&prompts(), &options, 2, |_| true)
                .unwrap_err(),
            m.stablehlo(1, 16, &options).unwrap_err(),
        ];
        for e in errors {
            assert!(e.to_string().contains(name), "{penalties:?}: {e}");
        }
    }
    // Negative presence and frequency penalties (favouring repeats) are allowed.
    let favour = Penalties {
        presence_penalty: -1.0,
        frequency_penalty: -0.5,
        ..off
    };
    assert!(favour.check().is_ok());
    assert!(TokenHistory::host_values(&[vec![1, 2, 3]], 2, 8).is_err());
    assert!(TokenHistory::host_values(&[vec![1]], 9, 8).is_err());
}

// ---- generation_config.json ----

#[test]
fn generation_config_reads_what_it_uses_and_ignores_the_rest() {
    let c = GenerationConfig::from_json(
        r#"{"do_sample": true, "temperature": 0.8, "top_k": 400, "top_p": 0.95,
            "repetition_penalty": 1.2, "no_repeat_ngram_size": 4, "presence_penalty": 0.1,
            "frequency_penalty": 0.05, "repeat_last_n": 64, "num_beams": 1,
            "eos_token_id": [0, 2], "pad_token_id": null, "transformers_version": "5.24.0"}"#,
    )
    .unwrap();
    assert_eq!(
        c.sampling(7, 256),
        Sampling::Sample {
            temperature: 0.8,
            top_k: 256,
            top_p: 0.95,
            seed: 7
        }
    );
    assert_eq!(
        c.penalties(),
        Penalties {
            repetition_penalty: 1.2,
            presence_penalty: 0.1,
            frequency_penalty: 0.05,
            repeat_last_n: Some(64),
            no_repeat_ngram_size: 4,
        }
    );
    // Nothing set: greedy, no penalties; sampling without values: temperature 1, no cuts.
    let empty = GenerationConfig::from_json(r#"{"bos_token_id": 0, "top_k": null}"#).unwrap();
    assert_eq!(empty, GenerationConfig::default());
    assert_eq!(empty.sampling(0, 100), Sampling::Greedy);
    assert_eq!(empty.penalties(), Penalties::NONE);
    let bare = GenerationConfig::from_json(r#"{"do_sample": true}"#).unwrap();
    assert_eq!(
        bare.sampling(1, 100),
        Sampling::Sample {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 1
        }
    );
    // do_sample false or temperature 0: greedy, whatever the rest says.
    for text in [
        r#"{"do_sample": false, "temperature": 0.7}"#,
        r#"{"do_sample": true, "temperature": 0}"#,
    ] {
        let c = GenerationConfig::from_json(text).unwrap();
        assert_eq!(c.sampling(0, 100), Sampling::Greedy, "{text}");
    }
    let whole = GenerationConfig::from_json(r#"{"repeat_last_n": -1}"#).unwrap();
    assert_eq!(whole.repeat_last_n, Some(None));
}

#[test]
fn bad_generation_configs_are_errors_naming_the_key() {
    for (text, key) in [
        (r#"{"do_sample": "yes"}"#, "do_sample"),
        (r#"{"temperature": -1}"#, "temperature"),
        (r#"{"temperature": "hot"}"#, "temperature"),
        (r#"{"top_k": 2.5}"#, "top_k"),
        (r#"{"top_k": -1}"#, "top_k"),
        (r#"{"top_p": 0}"#, "top_p"),
        (r#"{"top_p": 1.5}"#, "top_p"),
        (r#"{"repetition_penalty": 0}"#, "repetition_penalty"),
        (r#"{"no_repeat_ngram_size": -2}"#, "no_repeat_ngram_size"),
        (
            r#"{"no_repeat_ngram_size": 99999999999}"#,
            "no_repeat_ngram_size",
        ),
        (r#"{"presence_penalty": true}"#, "presence_penalty"),
        (r#"{"frequency_penalty": [1]}"#, "frequency_penalty"),
        (r#"{"repeat_last_n": -2}"#, "repeat_last_n"),
        ("[1, 2]", "JSON object"),
        ("{", "not JSON"),
    ] {
        let e = GenerationConfig::from_json(text).unwrap_err().to_string();
        assert!(e.contains(key), "{text}: {e}");
    }
    let dir = std::env::temp_dir().join(format!("penalties-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("generation_config.json");
    std::fs::write(&path, r#"{"top_p": 2}"#).unwrap();
    let e = GenerationConfig::from_file(&path).unwrap_err().to_string();
    assert!(
        e.contains("generation_config.json") && e.contains("top_p"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();
    let e = GenerationConfig::from_file("/nonexistent/generation_config.json").unwrap_err();
    assert!(
        e.to_string()
            .contains("/nonexistent/generation_config.json"),
        "{e}"
    );
}

#[test]
fn penalties_are_a_separate_program_variant() {
    let m = tiny();
    let text = |penalties: Penalties, sampling: Sampling| {
        let options = GenerateOptions {
            sampling,
            ..greedy(8, penalties)
        };
        m.stablehlo(2, 16, &options).unwrap()[2].clone()
    };
    let sample = Sampling::Sample {
        temperature: 0.8,
        top_k: 10,
        top_p: 0.9,
        seed: 1,
    };
    let on = Penalties {
        repetition_penalty: 1.1,
        ..Penalties::NONE
    };
    // A window alone changes no logit: the program is the one without penalties.
    let window_only = Penalties {
        repeat_last_n: Some(5),
        ..Penalties::NONE
    };
    for sampling in [Sampling::Greedy, sample] {
        let off = text(Penalties::NONE, sampling);
        assert_eq!(text(window_only, sampling), off);
        assert!(!off.contains("stablehlo.scatter"));
        let penalized = text(on, sampling);
        assert_ne!(penalized, off);
        // Still one device loop for the tokens (greedy); two scatter-adds per pick (counts
        // and bans); nothing sorted.
        if sampling == Sampling::Greedy {
            assert_eq!(penalized.matches("stablehlo.while").count(), 1);
        }
        assert!(penalized.contains("stablehlo.scatter"));
        assert!(!penalized.contains("stablehlo.sort"));
    }
}

#[test]
fn penalties_over_two_devices_equal_one() {
    use stablegraph::models::mamba2::Parallel;
    let client = stablegraph::runtime::Client::cpu_with_devices(2).unwrap();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mamba2/tiny");
    let config = Mamba2Config::from_file(dir.join("config.json")).unwrap();
    let weights = Mamba2Weights::load(&dir, &config, DType::F32).unwrap();
    let one = Mamba2::new(&client, config.clone(), &weights).unwrap();
    let mut prompts = prompts();
    prompts.push(vec![9, 9, 8, 9, 9]);
    let options = greedy(12, penalty_cases()[5]);
    let want = one.generate(&prompts, &options).unwrap();
    for parallel in [Parallel::Heads, Parallel::Batch] {
        let two = Mamba2::new_parallel(&client, config.clone(), &weights, parallel, 2).unwrap();
        assert_eq!(
            two.generate(&prompts, &options).unwrap(),
            want,
            "{parallel:?}"
        );
        let streamed = two
            .generate_stream(&prompts, &options, 5, |_| true)
            .unwrap();
        assert_eq!(streamed, want, "{parallel:?} streamed");
    }
}
