//! Mamba-2 internal consistency on a small random model: prefill then steps equals a longer
//! prefill; one-program generation equals the step API driven token by token; a batched row
//! equals its prompt alone; sampling is reproducible and respects top-k; EOS stops a row; the
//! generate program has exactly one while loop; bf16 logits stay close to f32.

use crate::common;

use common::{array_diff, buffer_diff, client, max_abs, tiny_mamba2, tiny_model};
use stablegraph::models::mamba2::{Mamba2, Mamba2Config, Mamba2Weights, Penalties, Sampling};
use stablegraph::models::GenerateOptions;
use stablegraph::tree::Tree;
use stablegraph::{DType, HostArray};

/// Row `r`'s logits at its last `n` positions of a left-padded prefill.
fn row_logits(logits: &HostArray, r: usize, n: usize) -> Vec<f64> {
    let (t, v) = (logits.dims()[1], logits.dims()[2]);
    let all = logits.to_f64_vec();
    all[(r * t + t - n) * v..(r * t + t) * v].to_vec()
}

const PROMPT: [u32; 11] = [3, 17, 42, 5, 9, 60, 1, 33, 8, 21, 14];

#[test]
fn prefill_then_steps_equals_a_longer_prefill() {
    let m = tiny_model(DType::F32);
    let (head, tail) = PROMPT.split_at(7);
    let full = m.prefill_all_positions(&[PROMPT.to_vec()]).unwrap();
    let part = m.prefill_all_positions(&[head.to_vec()]).unwrap();
    let mut state = part.state;
    let want = row_logits(&full.logits, 0, PROMPT.len());
    let v = m.config().vocab_size;
    for (j, &t) in tail.iter().enumerate() {
        let (logits, next) = m.step(&[t], state).unwrap();
        state = next;
        let pos = head.len() + j; // the logits after feeding token `pos`
        let d = max_abs(&logits.to_f64_vec(), &want[pos * v..(pos + 1) * v]);
        assert!(d < 1e-4, "position {pos}: {d}");
    }
    for (a, b) in state.layers.iter().zip(&full.state.layers) {
        let d = buffer_diff(&a.ssm, &b.ssm);
        assert!(d < 1e-4, "ssm state {d}");
        let d = buffer_diff(&a.conv, &b.conv);
        assert!(d < 1e-5, "conv state {d}");
    }
}

#[test]
fn generate_in_one_program_equals_the_step_api_and_batches_equal_rows_alone() {
    let m = tiny_model(DType::F32);
    let short: Vec<u32> = vec![11, 2, 50];
    let prompts = vec![PROMPT.to_vec(), short.clone()];
    let options = common::greedy(12);
    let batched = m.generate(&prompts, &options).unwrap();
    for (r, p) in prompts.iter().enumerate() {
        // The same prompt alone.
        assert_eq!(
            m.generate(std::slice::from_ref(p), &options).unwrap()[0],
            batched[r],
            "row {r}"
        );
        // Driven token by token through the step API.
        let pre = m.prefill_all_positions(std::slice::from_ref(p)).unwrap();
        let v = m.config().vocab_size;
        let last = row_logits(&pre.logits, 0, 1);
        let argmax = |l: &[f64]| {
            l.iter()
                .enumerate()
                .fold(
                    (0, f64::NEG_INFINITY),
                    |b, (i, &x)| if x > b.1 { (i, x) } else { b },
                )
                .0 as u32
        };
        let mut token = argmax(&last[..v]);
        let mut state = pre.state;
        let mut stepped = vec![token];
        while stepped.len() < options.max_new_tokens {
            let (logits, next) = m.step(&[token], state).unwrap();
            state = next;
            token = argmax(&logits.to_f64_vec());
            stepped.push(token);
        }
        assert_eq!(stepped, batched[r], "row {r}: generate vs step API");
    }
    // Prefill logits of a batched row equal the row alone.
    let both = m.prefill_all_positions(&prompts).unwrap();
    let alone = m
        .prefill_all_positions(std::slice::from_ref(&short))
        .unwrap();
    let d = max_abs(
        &row_logits(&both.logits, 1, 3),
        &row_logits(&alone.logits, 0, 3),
    );
    assert!(d < 1e-5, "batched row vs alone: {d}");
}

#[test]
fn the_generate_program_has_one_device_loop_and_no_sort() {
    let m = tiny_model(DType::F32);
    let mut options = GenerateOptions {
        max_new_tokens: 8,
        sampling: Sampling::Greedy,
        eos: Some(0),
        penalties: Penalties::NONE,
    };
    let [prefill, step, generate] = m.stablehlo(2, 16, &options).unwrap();
    assert_eq!(generate.matches("stablehlo.while").count(), 1, "{generate}");
    assert_eq!(prefill.matches("stablehlo.while").count(), 0);
    assert_eq!(step.matches("stablehlo.while").count(), 0);
    assert!(
        step.contains("tf.aliasing_output"),
        "the step program donates its state"
    );
    // Sampling adds three bit-by-bit searches (the top-k and top-p cuts, the inverse-CDF draw)
    // inside the token loop and three after it (the last token is picked after the loop, which
    // stops one step short: nothing needs that token stepped through the model), and sorts
    // nothing.
    options.sampling = Sampling::Sample {
        temperature: 0.8,
        top_k: 10,
        top_p: 0.9,
        seed: 1,
    };
    let [_, _, generate] = m.stablehlo(2, 16, &options).unwrap();
    assert_eq!(generate.matches("stablehlo.while").count(), 7);
    assert!(!generate.contains("stablehlo.sort"));
}

#[test]
fn sampling_is_reproducible_and_respects_top_k() {
    let m = tiny_model(DType::F32);
    let prompt = vec![PROMPT.to_vec()];
    let sample = |seed: u64, top_k: usize| GenerateOptions {
        max_new_tokens: 16,
        sampling: Sampling::Sample {
            temperature: 1.5,
            top_k,
            top_p: 1.0,
            seed,
        },
        eos: None,
        penalties: Penalties::NONE,
    };
    let a = m.generate(&prompt, &sample(1, 0)).unwrap();
    assert_eq!(
        a,
        m.generate(&prompt, &sample(1, 0)).unwrap(),
        "same seed, same tokens"
    );
    assert_ne!(
        a,
        m.generate(&prompt, &sample(2, 0)).unwrap(),
        "another seed"
    );
    // With top_k = 1 sampling is greedy.
    let greedy = common::greedy(16);
    assert_eq!(
        m.generate(&prompt, &sample(3, 1)).unwrap(),
        m.generate(&prompt, &greedy).unwrap()
    );
    // A tiny nucleus is greedy too.
    let nucleus = GenerateOptions {
        sampling: Sampling::Sample {
            temperature: 1.0,
            top_k: 0,
            top_p: 1e-6,
            seed: 4,
        },
        ..greedy.clone()
    };
    assert_eq!(
        m.generate(&prompt, &nucleus).unwrap(),
        m.generate(&prompt, &greedy).unwrap()
    );
    // Temperature 0 draws greedily, as a server reads it; a negative one is an error.
    let zero = GenerateOptions {
        sampling: Sampling::Sample {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 7,
        },
        ..greedy.clone()
    };
    assert_eq!(
        m.generate(&prompt, &zero).unwrap(),
        m.generate(&prompt, &greedy).unwrap()
    );
    let bad = GenerateOptions {
        sampling: Sampling::Sample {
            temperature: -1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        },
        ..greedy
    };
    assert!(m.generate(&prompt, &bad).is_err());
}

#[test]
fn eos_stops_a_row() {
    let m = tiny_model(DType::F32);
    let greedy = common::greedy(10);
    let free = m.generate(&[PROMPT.to_vec()], &greedy).unwrap()[0].clone();
    // Make the third generated token the EOS: the row repeats it from there on.
    let eos = free[2];
    let first = free.iter().position(|&t| t == eos).unwrap();
    let stopped = m
        .generate(
            &[PROMPT.to_vec()],
            &GenerateOptions {
                eos: Some(eos),
                ..greedy
            },
        )
        .unwrap()[0]
        .clone();
    assert_eq!(stopped[..=first], free[..=first]);
    assert!(stopped[first..].iter().all(|&t| t == eos), "{stopped:?}");
}

#[test]
fn bf16_logits_stay_close_to_f32() {
    let f = tiny_model(DType::F32).prefill(&[PROMPT.to_vec()]).unwrap();
    let lf = f.logits.to_f64_vec();
    let scale = lf.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let options = common::greedy(4);
    // bf16 dots, and bf16 matrices converted to f32 in the program.
    let mut drift = Vec::new();
    for dots in [true, false] {
        let m = tiny_model(DType::BF16).with_bf16_dots(Some(dots));
        assert_eq!(m.bf16_dots(), dots);
        let [prefill, _, _] = m.stablehlo(1, 16, &options).unwrap();
        let bf16_dot = prefill
            .lines()
            .any(|l| l.contains("stablehlo.dot_general") && l.contains("xbf16>) ->"));
        assert_eq!(bf16_dot, dots, "bf16 dots {dots}");
        let lb = m.prefill(&[PROMPT.to_vec()]).unwrap().logits.to_f64_vec();
        let d = max_abs(&lf, &lb);
        eprintln!("bf16 (dots {dots}) vs f32: largest logit difference {d:.3e} (largest |logit| {scale:.3})");
        assert!(
            d < 0.05 * scale.max(1.0),
            "bf16 drifted: {d} against logits up to {scale}"
        );
        drift.push(d);
    }
    // f32 products of the same bf16 matrices round less.
    assert!(drift[1] <= drift[0], "{drift:?}");
}

#[test]
fn a_one_row_bf16_step_reads_the_bf16_matrices_without_a_copy() {
    // The reference: an f32 model whose matrices are the bf16 values (a dot program).
    let cfg = tiny_mamba2();
    let wb = Mamba2Weights::random(&cfg, DType::BF16, 7).unwrap();
    let wf = wb
        .try_map(|_, a| {
            let values: Vec<f32> = a.to_f64_vec().iter().map(|&v| v as f32).collect();
            HostArray::from_vec(a.dims(), values)
        })
        .unwrap();
    let f = Mamba2::new(&client(), cfg.clone(), &wf).unwrap();
    let b = Mamba2::new(&client(), cfg, &wb)
        .unwrap()
        .with_bf16_dots(Some(false));
    // Batch 2: the converted copies and dots. Batch 1: no converted copy. Where the processor
    // has bf16 dot instructions, each product is a bf16 dot of the row repeated to two (the
    // form XLA hands to YNNPACK), rounded as bf16 dots round; elsewhere an f32 multiply-reduce
    // over the bf16 matrices, as exact as the f32 model's dots.
    let options = common::greedy(4);
    let program = |m: &Mamba2, batch: usize| m.stablehlo(batch, 16, &options).unwrap()[1].clone();
    let dots =
        |m: &Mamba2, batch: usize| program(m, batch).matches("stablehlo.dot_general").count();
    let two_rows = b.target().bf16_dot;
    let products = 2 * f.config().num_layers + 1;
    let one_row_dots = if two_rows { products } else { 0 };
    assert_eq!(dots(&b, 1) + products, dots(&f, 1) + one_row_dots);
    assert_eq!(dots(&b, 2), dots(&f, 2));
    let step = program(&b, 1);
    let f32_matrix = format!(
        "tensor<{}x{}xf32>",
        wf.layers[0].out_proj.dims()[0],
        wf.layers[0].out_proj.dims()[1]
    );
    // With bf16 dots the step names no f32 matrix. Without, `sum(f32(w) * x)` names one in its
    // text (the convert XLA fuses into the reduction), so only its numbers are checked below.
    if two_rows {
        assert!(
            !step.contains(&f32_matrix),
            "a converted out_proj in the one-row step"
        );
    }
    let tol = if two_rows { 2e-2 } else { 1e-4 };
    for batch in [1usize, 2] {
        let prompts = vec![PROMPT.to_vec(); batch];
        let (mut sf, mut sb) = (
            f.prefill(&prompts).unwrap().state,
            b.prefill(&prompts).unwrap().state,
        );
        for t in [5u32, 40, 2] {
            let (lf, nf) = f.step(&vec![t; batch], sf).unwrap();
            let (lb, nb) = b.step(&vec![t; batch], sb).unwrap();
            let d = array_diff(&lf, &lb);
            let scale = lf.to_f64_vec().iter().fold(1.0f64, |m, x| m.max(x.abs()));
            let bound = if batch == 1 { tol * scale } else { 1e-4 };
            assert!(
                d < bound,
                "batch {batch}, token {t}: logits differ by {d} (bound {bound})"
            );
            (sf, sb) = (nf, nb);
        }
    }
}

#[test]
fn bf16_scan_stays_close_to_f32() {
    let cfg = tiny_mamba2();
    let w = Mamba2Weights::random(&cfg, DType::F32, 7).unwrap();
    let bf16_scan = Mamba2Config {
        scan_dtype: DType::BF16,
        ..cfg.clone()
    };
    let f = Mamba2::new(&client(), cfg, &w).unwrap();
    let b = Mamba2::new(&client(), bf16_scan, &w).unwrap();
    let (pf, pb) = (
        f.prefill(&[PROMPT.to_vec()]).unwrap(),
        b.prefill(&[PROMPT.to_vec()]).unwrap(),
    );
    let (sf, sb) = (
        f.step(&[5], pf.state).unwrap().0,
        b.step(&[5], pb.state).unwrap().0,
    );
    let (lf, lb) = (pf.logits.to_f64_vec(), pb.logits.to_f64_vec());
    let scale = lf.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let (dp, ds) = (max_abs(&lf, &lb), array_diff(&sf, &sb));
    eprintln!("bf16 scan vs f32: prefill {dp:.3e}, step {ds:.3e} (largest |logit| {scale:.3})");
    // The knob takes effect (the decays are rounded) but the logits stay close.
    assert!(dp > 0.0 && ds > 0.0, "scan_dtype had no effect");
    assert!(
        dp < 0.05 * scale.max(1.0) && ds < 0.05 * scale.max(1.0),
        "bf16 scan drifted: prefill {dp}, step {ds} against logits up to {scale}"
    );
}

#[test]
fn new_sampling_values_and_shorter_runs_compile_nothing() {
    // A client of its own, so that the other tests' compiles do not count.
    let client = stablegraph::runtime::Client::cpu().unwrap();
    let cfg = tiny_mamba2();
    let m = Mamba2::new(
        &client,
        cfg.clone(),
        Mamba2Weights::random(&cfg, DType::F32, 7).unwrap(),
    )
    .unwrap();
    let prompt = vec![PROMPT.to_vec()];
    let sample = |temperature: f32, top_k: usize, top_p: f32, seed: u64| Sampling::Sample {
        temperature,
        top_k,
        top_p,
        seed,
    };
    let first = GenerateOptions {
        max_new_tokens: 12,
        sampling: sample(0.8, 10, 0.9, 1),
        eos: None,
        penalties: Penalties::NONE,
    };
    let long = m.generate(&prompt, &first).unwrap();
    let greedy = GenerateOptions {
        sampling: Sampling::Greedy,
        ..first.clone()
    };
    let long_greedy = m.generate(&prompt, &greedy).unwrap();
    let before = client.cache_stats();
    // Fewer tokens: the same tokens, cut (the count is a runtime input; 12 and 5 share the
    // capacity of 16).
    let short = GenerateOptions {
        max_new_tokens: 5,
        ..first.clone()
    };
    assert_eq!(m.generate(&prompt, &short).unwrap()[0], long[0][..5]);
    let short_greedy = GenerateOptions {
        max_new_tokens: 5,
        ..greedy.clone()
    };
    assert_eq!(
        m.generate(&prompt, &short_greedy).unwrap()[0],
        long_greedy[0][..5]
    );
    let mut outputs = Vec::new();
    for (sampling, eos, n) in [
        (sample(1.3, 1, 0.9, 1), None, 12),
        (sample(0.8, 0, 0.9, 1), None, 12),
        (sample(0.8, 3, 1.0, 1), None, 12),
        (sample(0.8, 64, 0.5, 1), None, 16),
        (sample(0.8, 10, 0.9, 9), None, 1),
        (sample(0.8, 10, 0.9, 1), Some(long[0][3]), 12),
        (Sampling::Greedy, Some(long_greedy[0][2]), 12),
    ] {
        let options = GenerateOptions {
            max_new_tokens: n,
            sampling,
            eos,
            penalties: Penalties::NONE,
        };
        let tokens = m.generate(&prompt, &options).unwrap();
        assert_eq!(tokens[0].len(), n, "{options:?}");
        outputs.push(tokens);
    }
    // A shorter prompt in the same bucket (16 positions): the same program.
    let shorter = vec![PROMPT[..9].to_vec()];
    assert_eq!(m.generate(&shorter, &short_greedy).unwrap()[0].len(), 5);
    let after = client.cache_stats();
    assert_eq!(
        (after.compiles, after.memory_hits, after.disk_hits),
        (before.compiles, before.memory_hits, before.disk_hits),
        "generate asked for a compile"
    );
    // Prompts of 33 and 47 tokens share the bucket of 48 (6 chunks of 8): one compile.
    let long_prompt = |n: usize| vec![(0..n as u32).map(|i| (i * 7 + 3) % 64).collect::<Vec<_>>()];
    m.generate(&long_prompt(33), &short_greedy).unwrap();
    let before = client.cache_stats();
    m.generate(&long_prompt(47), &short_greedy).unwrap();
    assert_eq!(
        client.cache_stats().compiles,
        before.compiles,
        "a prompt in the same bucket compiled"
    );
    // The values did reach the program: the eos rows stop where the eos first appears.
    let stopped = &outputs[5][0];
    assert!(stopped[3..].iter().all(|&t| t == long[0][3]), "{stopped:?}");
    assert_eq!(outputs[0], long_greedy, "top_k 1 is greedy");
    assert_ne!(outputs[0], long, "top_k 10 is not");
}

/// The prompt bucket by its definition: the fewest chunks covering `n` tokens whose count's odd
/// part is 1 or 3 (1, 2, 3, 4, 6, 8, 12, ... chunks).
fn bucket(n: usize, chunk: usize) -> usize {
    let chunks = (n.div_ceil(chunk)..)
        .find(|&m: &usize| matches!(m >> m.trailing_zeros(), 1 | 3))
        .unwrap();
    chunks * chunk
}

#[test]
fn prompt_buckets_are_powers_of_two_and_one_and_a_half_times_them() {
    let m = tiny_model(DType::F32);
    // The tiny config's chunk is 8: prompts of 1 to 8 tokens take one chunk (the chunk covering
    // them, at least 16, capped at 8), longer ones 2, 3, 4, 6, 8, 12, ... chunks.
    for n in 1..=200 {
        assert_eq!(m.prompt_bucket(n), Some(bucket(n, 8)), "{n} tokens");
    }
    assert_eq!(m.prompt_bucket(33), Some(48));
    assert_eq!(m.prompt_bucket(49), Some(64));
    assert_eq!(m.prompt_bucket(65), Some(96));
    assert_eq!(m.prompt_bucket(usize::MAX), None);
}

#[test]
fn any_prefill_chunk_gives_the_same_model() {
    let prompts = vec![PROMPT.to_vec(), PROMPT[..5].to_vec()];
    let m = tiny_model(DType::F32);
    // The automatic choice for an 11-token prompt on the CPU: the power of two covering it (16),
    // capped by the config's chunk (8).
    assert_eq!(m.prefill_chunk(PROMPT.len()), 8);
    assert_eq!(m.prompt_bucket(PROMPT.len()), Some(16));
    let want = m.prefill_all_positions(&prompts).unwrap();
    let greedy = common::greedy(6);
    let tokens = m.generate(&prompts, &greedy).unwrap();
    for chunk in [1, 2, 3, 5, 16] {
        let m = tiny_model(DType::F32)
            .with_prefill_chunk(Some(chunk))
            .unwrap();
        assert_eq!(
            m.prompt_bucket(PROMPT.len()),
            Some(bucket(PROMPT.len(), chunk))
        );
        let got = m.prefill_all_positions(&prompts).unwrap();
        // Compare the real positions (the buckets differ).
        for (r, p) in prompts.iter().enumerate() {
            let n = p.len();
            let d = max_abs(
                &row_logits(&got.logits, r, n),
                &row_logits(&want.logits, r, n),
            );
            assert!(d < 1e-5, "chunk {chunk} row {r}: logits differ by {d}");
        }
        for (a, b) in got.state.layers.iter().zip(&want.state.layers) {
            let d = buffer_diff(&a.ssm, &b.ssm);
            assert!(d < 1e-5, "chunk {chunk}: SSM states differ by {d}");
        }
        assert_eq!(
            m.generate(&prompts, &greedy).unwrap(),
            tokens,
            "chunk {chunk}"
        );
    }
    for bad in [0, (1 << 16) + 1, 1 << 40] {
        let e = tiny_model(DType::F32)
            .with_prefill_chunk(Some(bad))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("with_prefill_chunk") && e.contains(&bad.to_string()),
            "{e}"
        );
    }
}
