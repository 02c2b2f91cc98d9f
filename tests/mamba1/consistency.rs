//! The Mamba-1 programs agree with each other: on random weights the associative scan with the
//! loop over positions, and a prefill followed by steps with a prefill of the longer prompt; on
//! the Falcon fixture, bf16 matrices with f32 ones.

use crate::common;

use common::{client, max_abs};
use stablegraph::models::mamba1::{Mamba1, Mamba1Config, Mamba1Weights, Scan};
use stablegraph::DType;

/// A small Falcon-Mamba-shaped config (the extra norms on), untied.
fn config() -> Mamba1Config {
    Mamba1Config {
        hidden_size: 24,
        num_layers: 2,
        state_size: 6,
        d_inner: 48,
        conv_kernel: 4,
        time_step_rank: 3,
        vocab_size: 50,
        norm_eps: 1e-5,
        tie_word_embeddings: false,
        use_bias: true,
        use_conv_bias: true,
        mixer_rms_eps: Some(1e-6),
    }
}

fn model(scan: Scan) -> Mamba1 {
    let cfg = config();
    let weights = Mamba1Weights::random(&cfg, DType::F32, 7).unwrap();
    Mamba1::new(&client(), cfg, &weights)
        .unwrap()
        .with_scan(scan)
}

/// Deterministic prompts of the given lengths.
fn prompts(lens: &[usize]) -> Vec<Vec<u32>> {
    lens.iter()
        .enumerate()
        .map(|(r, &n)| (0..n).map(|i| ((i * 7 + r * 13 + 1) % 50) as u32).collect())
        .collect()
}

#[test]
fn the_associative_scan_equals_the_loop() {
    let (assoc, looped) = (model(Scan::Associative), model(Scan::Loop));
    for lens in [vec![1], vec![37], vec![64, 9]] {
        let p = prompts(&lens);
        let (a, l) = (assoc.prefill(&p).unwrap(), looped.prefill(&p).unwrap());
        let d = max_abs(&a.logits.to_f64_vec(), &l.logits.to_f64_vec());
        assert!(d < 1e-4, "{lens:?}: logits differ by {d}");
        for (sa, sl) in a.states.iter().zip(&l.states) {
            let d = max_abs(&sa.ssm.to_f64_vec(), &sl.ssm.to_f64_vec());
            assert!(d < 1e-4, "{lens:?}: states differ by {d}");
        }
    }
}

#[test]
fn steps_after_a_prefill_equal_a_prefill_of_the_longer_prompt() {
    let m = model(Scan::Associative);
    let vocab = config().vocab_size;
    let whole = prompts(&[20, 13]);
    let heads: Vec<Vec<u32>> = whole.iter().map(|p| p[..p.len() - 3].to_vec()).collect();
    let mut states = m.prefill(&heads).unwrap().states;
    let mut logits = None;
    for i in 0..3 {
        let tokens: Vec<u32> = whole.iter().map(|p| p[p.len() - 3 + i]).collect();
        let (l, next) = m.step(&tokens, &states).unwrap();
        states = next;
        logits = Some(l.to_f64_vec());
    }
    let full = m.prefill(&whole).unwrap();
    let len = full.logits.dims()[1];
    let all = full.logits.to_f64_vec();
    let stepped = logits.unwrap();
    for r in 0..2 {
        let want = &all[(r * len + len - 1) * vocab..][..vocab];
        let d = max_abs(&stepped[r * vocab..][..vocab], want);
        assert!(d < 1e-4, "row {r}: logits differ by {d}");
    }
}

#[test]
fn bf16_matrices_stay_close_to_f32() {
    let dir = common::mamba1::fixture("falcon");
    let f32_model = Mamba1::load(&client(), &dir, DType::F32).unwrap();
    let bf16_model = Mamba1::load(&client(), &dir, DType::BF16).unwrap();
    let p = prompts(&[19, 7]);
    let (a, b) = (
        f32_model.prefill(&p).unwrap(),
        bf16_model.prefill(&p).unwrap(),
    );
    let (a, b) = (a.logits.to_f64_vec(), b.logits.to_f64_vec());
    let d = max_abs(&a, &b);
    let largest = a.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    // bf16 keeps 8 bits of mantissa: the matrices move by ~0.4% each, the logits by a little more.
    assert!(
        d > 0.0 && d < 0.02 * largest,
        "bf16 logits differ by {d} (largest {largest})"
    );
    assert_eq!(
        f32_model.greedy(&p, 8).unwrap(),
        bf16_model.greedy(&p, 8).unwrap()
    );
}

#[test]
fn a_prompt_fed_in_two_pieces_equals_the_whole_prompt() {
    let vocab = config().vocab_size;
    let whole = prompts(&[23, 11]);
    // Rows cut at different places, so both pieces are left-padded differently.
    let cuts = [9, 6];
    let first: Vec<Vec<u32>> = whole
        .iter()
        .zip(cuts)
        .map(|(p, c)| p[..c].to_vec())
        .collect();
    let rest: Vec<Vec<u32>> = whole
        .iter()
        .zip(cuts)
        .map(|(p, c)| p[c..].to_vec())
        .collect();
    for scan in [Scan::Associative, Scan::Loop] {
        let m = model(scan);
        let full = m.prefill(&whole).unwrap();
        let states = m.prefill(&first).unwrap().states;
        let cont = m.prefill_from(&rest, &states).unwrap();
        let (lf, lc) = (full.logits.dims()[1], cont.logits.dims()[1]);
        let (f, c) = (full.logits.to_f64_vec(), cont.logits.to_f64_vec());
        for (r, piece) in rest.iter().enumerate() {
            for j in 0..piece.len() {
                let a = &f[(r * lf + lf - piece.len() + j) * vocab..][..vocab];
                let b = &c[(r * lc + lc - piece.len() + j) * vocab..][..vocab];
                let d = max_abs(a, b);
                assert!(
                    d < 1e-4,
                    "{scan:?} row {r} position {j}: logits differ by {d}"
                );
            }
        }
        for (sf, sc) in full.states.iter().zip(&cont.states) {
            let d = max_abs(&sf.ssm.to_f64_vec(), &sc.ssm.to_f64_vec());
            assert!(d < 1e-4, "{scan:?}: ssm states differ by {d}");
            let d = max_abs(&sf.conv.to_f64_vec(), &sc.conv.to_f64_vec());
            assert!(d < 1e-4, "{scan:?}: conv states differ by {d}");
        }
    }
    let m = model(Scan::Loop);
    let states = m.prefill(&first).unwrap().states;
    let e = m.prefill_from(&rest[..1], &states).unwrap_err();
    assert!(
        e.to_string().contains("prefill_from: state 0's conv"),
        "{e}"
    );
}
