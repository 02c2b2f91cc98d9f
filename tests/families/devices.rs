//! Every family over several devices (`family::load_parallel`, the CPU plugin's devices):
//! split over heads and over the batch, the prompt logits of a ragged batch stay within 1e-4
//! of transformers' and the greedy tokens equal theirs; devices that do not divide the heads
//! or the rows are an error naming them.

use crate::common;

use common::{client4, max_abs, read_safetensors};
use stablegraph::models::family;
use stablegraph::models::Parallel;
use stablegraph::DType;

#[test]
fn heads_and_batch_over_two_devices_match_transformers() {
    let mut dirs = common::other_family_fixtures();
    dirs.push(common::one_fixture_per_family()[0].clone());
    for dir in dirs {
        let cases = read_safetensors(&dir.join("cases.safetensors"));
        let rows = common::fixture_prompts(&cases, 3);
        let want = &cases["case3.logits"];
        let (len, vocab) = (want.shape[1], want.shape[2]);
        let hf = &cases["case3.greedy"];
        let n = hf.shape[1];
        for parallel in [Parallel::Heads, Parallel::Batch] {
            let name = format!("{} over 2 devices by {}", dir.display(), parallel.name());
            let model = family::load_parallel(&client4(), &dir, DType::F32, parallel, 2).unwrap();
            let got = model.prefill_logits(&rows).unwrap().to_f64_vec();
            let longest = rows.iter().map(Vec::len).max().unwrap();
            for (r, row) in rows.iter().enumerate() {
                for t in 0..row.len() {
                    let theirs = &want.values[(r * len + len - row.len() + t) * vocab..][..vocab];
                    let ours = &got[(r * longest + longest - row.len() + t) * vocab..][..vocab];
                    let d = max_abs(ours, theirs);
                    assert!(d < 1e-4, "{name}: row {r} position {t}: {d}");
                }
            }
            let tokens = model.generate(&rows, &common::greedy(n)).unwrap();
            for (r, toks) in tokens.iter().enumerate() {
                let theirs: Vec<u32> = hf.values[r * n..(r + 1) * n]
                    .iter()
                    .map(|&t| t as u32)
                    .collect();
                assert_eq!(toks, &theirs, "{name}: row {r}");
            }
        }
    }
}

#[test]
fn devices_that_do_not_divide_are_an_error_naming_them() {
    let bamba = common::hybrid::fixture("bamba");
    let e = family::load_parallel(&client4(), &bamba, DType::F32, Parallel::Heads, 3)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("heads") && e.contains("3 equal parts"), "{e}");
    let falcon = common::mamba1::fixture("falcon");
    let model = family::load_parallel(&client4(), &falcon, DType::F32, Parallel::Batch, 2).unwrap();
    let e = model
        .generate(&[vec![3, 4, 5]], &common::greedy(2))
        .unwrap_err()
        .to_string();
    assert!(e.contains("1 rows do not divide into 2"), "{e}");
}

#[test]
fn eight_bit_matrices_over_two_devices_equal_one_device() {
    // Falcon-Mamba and Granite 4.0-H with experts (each 8-bit matrix split along its input
    // dimension, scales whole), and the batch split for one of them.
    let prompts = vec![vec![5, 9, 14, 20, 33, 7], vec![40, 41, 42]];
    let dirs = [
        common::mamba1::fixture("falcon"),
        common::hybrid::fixture("granite"),
    ];
    for (i, dir) in dirs.into_iter().enumerate() {
        let one = family::load(&client4(), &dir, stablegraph::models::quant::QUANTIZED).unwrap();
        let want = one.prefill_logits(&prompts).unwrap().to_f64_vec();
        let scale = want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        let tokens = one.generate(&prompts, &common::greedy(6)).unwrap();
        let ways = [Parallel::Heads, Parallel::Batch];
        for parallel in ways.into_iter().take(1 + i) {
            let name = format!("{} 8-bit by {}", dir.display(), parallel.name());
            let two = family::load_parallel(
                &client4(),
                &dir,
                stablegraph::models::quant::QUANTIZED,
                parallel,
                2,
            )
            .unwrap();
            let got = two.prefill_logits(&prompts).unwrap().to_f64_vec();
            let d = max_abs(&got, &want);
            assert!(d < 1e-4 * scale, "{name}: {d} of {scale}");
            assert_eq!(
                two.generate(&prompts, &common::greedy(6)).unwrap(),
                tokens,
                "{name}"
            );
        }
    }
}
