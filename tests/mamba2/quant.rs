//! 8-bit weights: the row-wise quantization against its definition (round trip, rows that do
//! not share a scale, all-zero and huge rows, non-finite values refused), and an 8-bit Mamba-2
//! against the f32 model it was quantized from and against transformers' greedy tokens.

use crate::common;

use std::path::PathBuf;

use common::{client, greedy, max_abs, read_safetensors, tiny_mamba2};
use stablegraph::models::mamba2::{Mamba2, Mamba2Config, Mamba2Weights, Parallel};
use stablegraph::models::quant::{dequantize_rows, quantize_rows, QUANTIZED};
use stablegraph::tree::Tree;
use stablegraph::{DType, HostArray};

/// Checks `(values, scales)` against the definition: per row, the scale is the largest
/// magnitude / 127, and each value reads back within half a scale step.
fn check_round_trip(data: &[f32], rows: usize, cols: usize) {
    let (values, scales) = quantize_rows("m", data, rows, cols).unwrap();
    assert_eq!((values.len(), scales.len()), (rows * cols, rows));
    let back = dequantize_rows(&values, &scales, cols);
    for r in 0..rows {
        let row = &data[r * cols..(r + 1) * cols];
        let absmax = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let want = absmax / 127.0;
        let want = if (want * 127.0).is_infinite() {
            f32::from_bits(want.to_bits() - 1)
        } else {
            want
        };
        assert_eq!(scales[r], want, "row {r}");
        for c in 0..cols {
            let (v, b) = (row[c], back[r * cols + c]);
            // Half a step, and at the clamped end of an overflowing row, one ulp of scale more.
            // A row too small for a non-zero f32 scale (subnormal) reads back as zeros.
            let bound = if scales[r] == 0.0 {
                f64::from(absmax)
            } else {
                f64::from(scales[r]) * (0.5 + 1e-5) * (1.0 + 1e-6)
            };
            assert!(
                (f64::from(v) - f64::from(b)).abs() <= bound,
                "row {r} column {c}: {v} read back as {b} (scale {})",
                scales[r]
            );
            assert!(
                values[r * cols + c] >= 1,
                "stored values are q + 128, q >= -127"
            );
        }
    }
}

#[test]
fn quantization_reads_back_within_half_a_step_per_row() {
    let mut rng = 12345u64;
    let mut next = || {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (rng >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    // Neighbouring rows six orders of magnitude apart: each keeps its own scale.
    let (rows, cols) = (6, 37);
    let magnitude = [1e-3f32, 1e3, 1.0, 1e-3, 7.5, 1e3];
    let data: Vec<f32> = (0..rows * cols)
        .map(|i| next() * magnitude[i / cols])
        .collect();
    check_round_trip(&data, rows, cols);
    // The largest magnitude of each row reads back exactly (it is +-127 steps).
    let (values, scales) = quantize_rows("m", &[0.5, -2.0, 1.0], 1, 3).unwrap();
    assert_eq!(dequantize_rows(&values, &scales, 3)[1], -2.0);
    assert_eq!(values[1], 1);
}

#[test]
fn zero_and_huge_rows_quantize_without_overflow() {
    let cols = 4;
    let data = [
        0.0f32,
        0.0,
        -0.0,
        0.0, // all zero
        f32::MAX,
        -f32::MAX,
        1.0,
        0.0, // as large as f32 goes
        1e-44,
        -1e-44,
        0.0,
        0.0, // subnormal
    ];
    check_round_trip(&data, 3, cols);
    let (values, scales) = quantize_rows("m", &data, 3, cols).unwrap();
    assert_eq!(scales[0], 0.0);
    assert!(dequantize_rows(&values[..4], &scales[..1], cols)
        .iter()
        .all(|&v| v == 0.0));
    assert!(scales[1].is_finite());
    let huge = dequantize_rows(&values[4..8], &scales[1..2], cols);
    assert!(huge.iter().all(|v| v.is_finite()), "{huge:?}");
}

#[test]
fn non_finite_values_are_refused_naming_where() {
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let e = quantize_rows("layers.3.mixer.in_proj", &[1.0, 2.0, 3.0, bad], 2, 2)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("layers.3.mixer.in_proj") && e.contains("row 1, column 1"),
            "{e}"
        );
    }
    let e = quantize_rows("m", &[1.0; 5], 2, 2).unwrap_err().to_string();
    assert!(e.contains("5 values, expected 2 x 2"), "{e}");
}

#[test]
fn eight_bit_weights_carry_a_scale_per_row_and_fit_their_types() {
    let cfg = tiny_mamba2();
    let q = Mamba2Weights::random(&cfg, QUANTIZED, 7).unwrap();
    // Drawing in 8 bits quantizes the same f32 draw.
    let f = Mamba2Weights::random(&cfg, DType::F32, 7).unwrap();
    let named = |w: &Mamba2Weights<HostArray>| -> Vec<(String, Vec<f64>)> {
        w.named()
            .into_iter()
            .map(|(n, a)| (n, a.to_f64_vec()))
            .collect()
    };
    assert_eq!(named(&q), named(&f.to_8bit().unwrap()));
    assert_eq!(q.embedding.dtype(), DType::U8);
    let scale = q.layers[0].in_proj_scale.as_ref().unwrap();
    assert_eq!(scale.dims(), &[cfg.in_proj_dim()]);
    let types = Mamba2Weights::types(&cfg, QUANTIZED).unwrap();
    let want: Vec<_> = types
        .named()
        .into_iter()
        .map(|(n, t)| (n, t.clone()))
        .collect();
    let got: Vec<_> = q.named().into_iter().map(|(n, a)| (n, a.ty())).collect();
    assert_eq!(got, want);
}

#[test]
fn an_eight_bit_model_stays_near_the_f32_model_it_came_from() {
    let cfg = tiny_mamba2();
    let wf = Mamba2Weights::random(&cfg, DType::F32, 7).unwrap();
    let f = Mamba2::new(&client(), cfg.clone(), &wf).unwrap();
    let q = Mamba2::new(&client(), cfg, wf.to_8bit().unwrap()).unwrap();
    assert_eq!(q.matmul_dtype(), QUANTIZED);
    // Prompts of 3 rows (the integer product) and of 40 (a prefill: the matrix converted).
    for (rows, len) in [(3usize, 5usize), (1, 40)] {
        let prompts: Vec<Vec<u32>> = (0..rows)
            .map(|r| (0..len).map(|t| ((t * 7 + r * 3) % 24) as u32).collect())
            .collect();
        let (pf, pq) = (f.prefill(&prompts).unwrap(), q.prefill(&prompts).unwrap());
        let lf = pf.logits.to_f64_vec();
        let scale = lf.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        let d = max_abs(&lf, &pq.logits.to_f64_vec());
        eprintln!("8-bit prefill ({rows} x {len}): logits differ by {d:.2e} of {scale:.2}");
        assert!(d < 0.05 * scale, "prefill {rows} x {len}: {d} of {scale}");
        let (mut sf, mut sq) = (pf.state, pq.state);
        for t in [5u32, 17, 2] {
            let (lf, nf) = f.step(&vec![t; rows], sf).unwrap();
            let (lq, nq) = q.step(&vec![t; rows], sq).unwrap();
            let d = max_abs(&lf.to_f64_vec(), &lq.to_f64_vec());
            assert!(d < 0.05 * scale, "step {t} at batch {rows}: {d} of {scale}");
            (sf, sq) = (nf, nq);
        }
    }
    // generate's device loop gives the host loop's tokens.
    let prompt = vec![vec![1u32, 2, 3, 4, 5]];
    let tokens = q.generate(&prompt, &greedy(6)).unwrap();
    let mut state = q.prefill(&prompt).unwrap();
    let mut host = Vec::new();
    let mut logits = state.logits.to_f64_vec();
    for _ in 0..6 {
        let next = (0..logits.len())
            .max_by(|&a, &b| logits[a].total_cmp(&logits[b]).then(b.cmp(&a)))
            .unwrap() as u32;
        host.push(next);
        let (l, s) = q.step(&[next], state.state).unwrap();
        logits = l.to_f64_vec();
        state.state = s;
    }
    assert_eq!(tokens[0], host);
}

#[test]
fn eight_bit_golden_sets_against_transformers() {
    // transformers' greedy tokens and logits of the f32 checkpoints; the 8-bit model's
    // agreement is reported, its logits bounded (measured: within 2.5% and 6% of the largest
    // logit; these 64-wide random models quantize coarser than trained 768-wide ones).
    for name in ["tiny", "groups2"] {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/mamba2")
            .join(name);
        let config = Mamba2Config::from_file(dir.join("config.json")).unwrap();
        let weights = Mamba2Weights::load(&dir, &config, QUANTIZED).unwrap();
        let model = Mamba2::new(&client(), config.clone(), &weights).unwrap();
        let cases = read_safetensors(&dir.join("cases.safetensors"));
        let ids = &cases["case0.input_ids"];
        let prompt: Vec<u32> = ids.values.iter().map(|&v| v as u32).collect();
        let logits = &cases["case0.logits"];
        let vocab = config.vocab_size;
        let want = &logits.values[(ids.shape[1] - 1) * vocab..][..vocab];
        let got = model
            .prefill(std::slice::from_ref(&prompt))
            .unwrap()
            .logits
            .to_f64_vec();
        let scale = want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        let d = max_abs(&got, want);
        let hf = &cases["case0.greedy"];
        let n = hf.shape[1];
        let tokens = model.generate(&[prompt], &greedy(n)).unwrap();
        let agree = tokens[0]
            .iter()
            .zip(&hf.values)
            .take_while(|(a, b)| **a as f64 == **b)
            .count();
        eprintln!(
            "8-bit {name}: last prompt logits within {d:.3e} of transformers' (largest {scale:.2}); \
             greedy agrees for {agree} of {n} tokens"
        );
        assert!(d < 0.1 * scale, "{name}: {d} of {scale}");
        assert!(agree >= 1, "{name}: the first greedy token differs");
    }
}

#[test]
fn eight_bit_weights_are_refused_where_they_do_not_run_yet() {
    let cfg = tiny_mamba2();
    let q = Mamba2Weights::random(&cfg, QUANTIZED, 7).unwrap();
    let e = Mamba2::new_parallel(&common::client4(), cfg, &q, Parallel::Heads, 2)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("8-bit weights run on one device"), "{e}");
    let e = Mamba2Weights::random(&tiny_mamba2(), DType::F16, 7)
        .unwrap_err()
        .to_string();
    assert!(e.contains("f32, bf16 or u8 (8-bit weights)"), "{e}");
}

#[test]
fn eight_bit_weights_are_not_written_as_a_checkpoint() {
    let q = Mamba2Weights::random(&tiny_mamba2(), QUANTIZED, 7).unwrap();
    let dir = crate::common::TempDir::new("quant-save");
    let e = q.save(&dir, &tiny_mamba2()).unwrap_err().to_string();
    assert!(e.contains("8-bit weights are not written"), "{e}");
    assert!(!dir.join("model.safetensors").exists());
}

#[test]
fn loading_as_8_bit_equals_quantizing_the_f32_weights() {
    // The loader quantizes each matrix as it reads it; the result is the f32 model's to_8bit.
    for name in ["tiny", "groups2"] {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/mamba2")
            .join(name);
        let config = Mamba2Config::from_file(dir.join("config.json")).unwrap();
        let q = Mamba2Weights::load(&dir, &config, QUANTIZED).unwrap();
        let want = Mamba2Weights::load(&dir, &config, DType::F32)
            .unwrap()
            .to_8bit()
            .unwrap();
        let (q, want) = (q.named(), want.named());
        assert_eq!(q.len(), want.len(), "{name}");
        for ((n, a), (m, b)) in q.iter().zip(&want) {
            assert_eq!(n, m, "{name}");
            assert_eq!(a, b, "{name}: {n}");
        }
    }
}
