//! Fine-tuning every family through the face (`CausalLm::fine_tuner`): the loss falls on a
//! small text in a few steps, the written checkpoint loads back (through `family::load`) with
//! the trained weights, the batch split over two devices steps as one device does, and bad
//! input is refused with nothing updated.

use std::path::PathBuf;

use crate::common;

use common::{client, client4, TempDir};
use stablegraph::models::family;
use stablegraph::models::mamba2::{Remat, TrainOptions};
use stablegraph::optim::AdamW;
use stablegraph::DType;

/// Every fixture: one per family, and Granite's dense one.
fn fixtures() -> Vec<PathBuf> {
    let mut dirs = common::one_fixture_per_family();
    dirs.push(common::hybrid::fixture("granite_dense"));
    dirs
}

/// AdamW as `train` runs it.
fn adamw(lr: f64) -> AdamW {
    AdamW {
        lr,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
        clip_norm: Some(1.0),
    }
}

/// A learnable text: `count` windows of `len` tokens, each a stretch of a short cycle of ids
/// (from 3 up, below 96, every fixture's vocabulary).
fn cyclic(count: usize, len: usize, start: usize) -> Vec<u32> {
    let cycle = [7u32, 21, 3, 50, 12, 88, 41];
    (0..count * len)
        .map(|i| cycle[(start + i / len + i % len) % cycle.len()])
        .collect()
}

fn options(batch: usize, seq_len: usize, remat: Remat) -> TrainOptions {
    TrainOptions {
        batch,
        seq_len,
        micro_steps: 1,
        remat,
    }
}

#[test]
fn every_family_learns_a_small_text_and_reloads_what_it_learned() {
    for dir in fixtures() {
        let model = family::load(&client(), &dir, DType::F32).unwrap();
        let name = format!("{} ({})", dir.display(), model.family());
        let (b, len) = (4, 24);
        let remat = match model.family() {
            "Bamba" | "Mamba-1" => Remat::PerLayer,
            _ => Remat::Off,
        };
        let mut tuner = model
            .fine_tuner(adamw(3e-3), options(b, len, remat), 1)
            .unwrap();
        let held = cyclic(b, len + 1, 3);
        let before = tuner.eval_loss(&held).unwrap();
        let mut losses = Vec::new();
        for step in 0..12 {
            losses.push(tuner.step(&cyclic(b, len + 1, step), 3e-3).unwrap());
        }
        let after = tuner.eval_loss(&held).unwrap();
        assert!(
            after < 0.7 * before && losses[11] < 0.7 * losses[0],
            "{name}: held-out {before} -> {after}, train {losses:?}"
        );
        // The checkpoint written holds the trained weights under the names it was read from.
        let out = TempDir::new("tuned");
        tuner.save(&out, &dir).unwrap();
        let reloaded = family::load(&client(), &out, DType::F32).unwrap();
        assert_eq!(reloaded.family(), model.family(), "{name}");
        let rows: Vec<Vec<u32>> = held.chunks(len + 1).map(<[u32]>::to_vec).collect();
        let loss = reloaded.loss_and_grads(&rows).unwrap().loss;
        assert!(
            (loss - after).abs() < 1e-4 * after,
            "{name}: reloaded {loss} vs trained {after}"
        );
        assert_eq!(tuner.steps_done(), 12);
    }
}

/// The batch split over two devices (data parallel) steps as one device: the losses within
/// float32 rounding and the weights after three steps within 1% of one step's rate, for a family with attention and experts
/// (Granite 4.0-H) and one without (Mamba-1).
#[test]
fn two_devices_step_as_one() {
    for dir in [
        common::hybrid::fixture("granite"),
        common::mamba1::fixture("tiny"),
    ] {
        let model = family::load(&client4(), &dir, DType::F32).unwrap();
        let mut runs = Vec::new();
        for devices in [1, 2] {
            let mut tuner = model
                .fine_tuner(adamw(3e-3), options(4, 16, Remat::Off), devices)
                .unwrap();
            assert_eq!(tuner.devices(), devices);
            let losses: Vec<f32> = (0..3)
                .map(|s| tuner.step(&cyclic(4, 17, s), 3e-3).unwrap())
                .collect();
            runs.push((losses, tuner.checkpoint_tensors().unwrap()));
        }
        let name = dir.display();
        for (a, b) in runs[0].0.iter().zip(&runs[1].0) {
            assert!((a - b).abs() < 1e-5 * a.abs(), "{name}: losses {a} vs {b}");
        }
        // AdamW divides by the root of the second moment, so gradients that differ by
        // rounding (the all-reduce sums in another order) move a weight apart by a small
        // fraction of the rate at most: within 1% of lr (3e-5) after three steps.
        for ((n, a), (_, b)) in runs[0].1.iter().zip(&runs[1].1) {
            let d = common::array_diff(a, b);
            assert!(d < 0.01 * 3e-3, "{name}: {n} differs by {d}");
        }
    }
}

#[test]
fn bad_input_is_refused_and_nothing_changes() {
    let dir = common::hybrid::fixture("bamba");
    let model = family::load(&client4(), &dir, DType::F32).unwrap();
    let err = |r: stablegraph::Result<stablegraph::models::FineTuner>| r.unwrap_err().to_string();
    let e = err(model.fine_tuner(adamw(1e-3), options(3, 8, Remat::Off), 2));
    assert!(e.contains("does not split over 2 devices"), "{e}");
    let e = err(model.fine_tuner(adamw(1e-3), options(0, 8, Remat::Off), 1));
    assert!(e.contains("batch is 0"), "{e}");
    let e = err(model.fine_tuner(adamw(1e-3), options(2, 8, Remat::Off), 8));
    assert!(e.contains("8 devices"), "{e}");
    let mut tuner = model
        .fine_tuner(adamw(1e-3), options(2, 8, Remat::Off), 1)
        .unwrap();
    let before = tuner.checkpoint_tensors().unwrap();
    let mut bad = cyclic(2, 9, 0);
    bad[5] = 96;
    let e = tuner.step(&bad, 1e-3).unwrap_err().to_string();
    assert!(e.contains("token id 96") && e.contains("position 5"), "{e}");
    let e = tuner.step(&bad[1..], 1e-3).unwrap_err().to_string();
    assert!(e.contains("17 ids, expected 18"), "{e}");
    assert_eq!(tuner.steps_done(), 0);
    let after = tuner.checkpoint_tensors().unwrap();
    assert!(before.iter().zip(&after).all(|(a, b)| a.1 == b.1));
    // Weights in bf16 are refused by name.
    let low = family::load(&client(), &dir, DType::BF16).unwrap();
    let e = low
        .loss_and_grads(&[vec![5, 6, 7]])
        .unwrap_err()
        .to_string();
    assert!(e.contains("f32 weights"), "{e}");
}
