//! Mamba-2 over several devices of a 4-device CPU client: split over heads and over the batch,
//! every program's results against the same model on one device (the reference: one device
//! runs the unsharded program that the fixtures check against HF transformers).

use crate::common;

use common::{array_diff, client4, state_diff, tiny_mamba2};
use stablegraph::models::mamba2::{Mamba2, Mamba2Config, Mamba2Weights, Parallel, Sampling};
use stablegraph::models::GenerateOptions;
use stablegraph::DType;

/// The tiny config with `groups` groups (G = 1 or 2).
fn config(groups: usize) -> Mamba2Config {
    Mamba2Config {
        n_groups: groups,
        ..tiny_mamba2()
    }
}

fn models(cfg: &Mamba2Config, parallel: Parallel, devices: usize) -> (Mamba2, Mamba2) {
    let w = Mamba2Weights::random(cfg, DType::F32, 11).unwrap();
    let one = Mamba2::new(&client4(), cfg.clone(), &w).unwrap();
    let many = Mamba2::new_parallel(&client4(), cfg.clone(), &w, parallel, devices).unwrap();
    assert_eq!(many.devices(), devices);
    (one, many)
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![3, 14, 15, 9, 2, 6, 5, 35, 8, 9, 7, 9, 3],
        vec![27, 18, 28, 18, 28, 4],
        vec![1, 41, 42, 13, 56, 23, 7],
        vec![61, 8, 0, 33, 2],
    ]
}

/// Prefill, step and greedy generate (with `full`: also sampled, a stream and a continued
/// state): the model over `devices` devices against one device.
fn check(groups: usize, parallel: Parallel, devices: usize, full: bool) {
    let what = format!("G={groups} {parallel:?} x{devices}");
    let (one, many) = models(&config(groups), parallel, devices);
    let p = prompts();
    let (a, b) = (one.prefill(&p).unwrap(), many.prefill(&p).unwrap());
    let d = array_diff(&a.logits, &b.logits);
    assert!(d < 1e-5, "{what}: prefill logits differ by {d}");
    assert!(
        state_diff(&a.state, &b.state) < 1e-5,
        "{what}: prefill state"
    );
    let (la, sa) = one.step(&[1, 2, 3, 4], a.state).unwrap();
    let (lb, sb) = many.step(&[1, 2, 3, 4], b.state).unwrap();
    let d = array_diff(&la, &lb);
    assert!(d < 1e-5, "{what}: step logits differ by {d}");
    assert!(state_diff(&sa, &sb) < 1e-5, "{what}: step state");

    let greedy = common::greedy(12);
    assert_eq!(
        one.generate(&p, &greedy).unwrap(),
        many.generate(&p, &greedy).unwrap(),
        "{what}: greedy tokens"
    );
    if !full {
        return;
    }
    let sampled = GenerateOptions {
        sampling: Sampling::Sample {
            temperature: 0.8,
            top_k: 20,
            top_p: 0.9,
            seed: 5,
        },
        ..greedy.clone()
    };
    assert_eq!(
        one.generate(&p, &sampled).unwrap(),
        many.generate(&p, &sampled).unwrap(),
        "{what}: sampled tokens"
    );
    let mut streamed = Vec::new();
    let all = many
        .generate_stream(&p, &greedy, 5, |t| {
            streamed.push(t.to_vec());
            true
        })
        .unwrap();
    assert_eq!(all, one.generate(&p, &greedy).unwrap(), "{what}: stream");
    // A state made on one device continues on many, and the reverse.
    let (ta, state_a) = one.generate_from(&p, None, &greedy).unwrap();
    let (tb, state_b) = many.generate_from(&p, None, &greedy).unwrap();
    assert_eq!(ta, tb, "{what}: generate_from");
    let next = vec![vec![5u32]; 4];
    let (ca, _) = many.generate_from(&next, Some(state_a), &greedy).unwrap();
    let (cb, _) = one.generate_from(&next, Some(state_b), &greedy).unwrap();
    assert_eq!(ca, cb, "{what}: continued across layouts");
}

#[test]
fn heads_over_two_and_four_devices_match_one_device() {
    check(1, Parallel::Heads, 4, false);
    check(2, Parallel::Heads, 2, false);
    check(2, Parallel::Heads, 4, true);
}

#[test]
fn batch_over_two_and_four_devices_matches_one_device() {
    check(1, Parallel::Batch, 2, false);
    check(2, Parallel::Batch, 4, true);
}

#[test]
fn splits_that_do_not_divide_are_errors() {
    let cfg = Mamba2Config {
        num_heads: 6,
        head_dim: 8,
        ..config(1)
    };
    let w = Mamba2Weights::random(&cfg, DType::F32, 1).unwrap();
    let e = Mamba2::new_parallel(&client4(), cfg.clone(), &w, Parallel::Heads, 4)
        .unwrap_err()
        .to_string();
    assert!(e.contains("6 heads") && e.contains("4"), "{e}");
    let e = Mamba2::new_parallel(&client4(), cfg.clone(), &w, Parallel::Batch, 8)
        .unwrap_err()
        .to_string();
    assert!(e.contains("cpu_device_count"), "{e}");
    let many = Mamba2::new_parallel(&client4(), cfg, &w, Parallel::Batch, 4).unwrap();
    let e = many.prefill(&prompts()[..3]).unwrap_err().to_string();
    assert!(e.contains("3 rows"), "{e}");
}
