//! Continuation: a ragged batch fed in two pieces (the second through `prefill_from`, the
//! Mamba-2 states and the attention caches carried over, padding between the pieces) gives the
//! whole prompt's logits and next step, for every hybrid and the sliding-window transformers
//! (whose rings wrap); decoding past the caches' first capacity (which then grow, rings
//! included) gives the same tokens as caches sized for the whole run; gathered and dense
//! experts agree; bf16 matrices stay near f32; long prompts attended in blocks of queries and
//! keys equal the same prompts fed in short pieces.

use crate::common;

use common::{client, max_abs};
use stablegraph::models::hybrid::Hybrid;
use stablegraph::DType;

const NAMES: [&str; 4] = ["bamba", "granite", "granite_dense", "nemotron"];

/// The layer stack's transformers whose fixtures slide (window 4, shorter than the prompts).
const SLIDING: [&str; 2] = ["mistral", "gemma2"];

fn model(name: &str) -> Hybrid {
    Hybrid::load(&client(), &common::hybrid::stack_fixture(name), DType::F32).unwrap()
}

/// Two rows of different lengths with ids in the fixtures' range.
fn rows() -> Vec<Vec<u32>> {
    vec![
        (0..12).map(|i| 3 + (i * 7 % 90)).collect(),
        (0..7).map(|i| 5 + (i * 11 % 88)).collect(),
    ]
}

#[test]
fn two_pieces_equal_the_whole_prompt() {
    let rows = rows();
    let cuts = [5, 3];
    for name in NAMES.into_iter().chain(SLIDING) {
        let m = model(name);
        let vocab = m.config().vocab_size;
        let whole = m.prefill(&rows).unwrap();
        let first: Vec<Vec<u32>> = rows
            .iter()
            .zip(cuts)
            .map(|(r, c)| r[..c].to_vec())
            .collect();
        let rest: Vec<Vec<u32>> = rows
            .iter()
            .zip(cuts)
            .map(|(r, c)| r[c..].to_vec())
            .collect();
        let a = m.prefill(&first).unwrap();
        let b = m.prefill_from(&rest, a.state).unwrap();
        let (w, p) = (whole.logits.to_f64_vec(), b.logits.to_f64_vec());
        let (lw, lp) = (whole.logits.dims()[1], b.logits.dims()[1]);
        for (r, piece) in rest.iter().enumerate() {
            for j in 0..piece.len() {
                let ours = &p[(r * lp + lp - piece.len() + j) * vocab..][..vocab];
                let all = &w[(r * lw + lw - piece.len() + j) * vocab..][..vocab];
                let d = max_abs(ours, all);
                assert!(
                    d < 1e-4,
                    "{name} row {r} position {j}: pieces differ by {d}"
                );
            }
        }
        let next = [7, 9];
        let (s1, _) = m.step(&next, whole.state).unwrap();
        let (s2, _) = m.step(&next, b.state).unwrap();
        let d = max_abs(&s1.to_f64_vec(), &s2.to_f64_vec());
        assert!(d < 1e-4, "{name}: the step after the pieces differs by {d}");
    }
}

#[test]
fn long_prompts_in_blocks_equal_short_pieces() {
    // Past 512 cache columns a prompt attends in blocks, and past 512 queries its queries in
    // blocks too (a loop over them, the key blocks no query of a block sees skipped): the whole
    // ragged prompt (1,100 and 700 tokens) against thirds of all but its last two tokens (at
    // most 366 queries a piece), whose attention is one block of queries over the key blocks,
    // then those two as decode steps over a cache of more than 512 columns. A sliding window
    // of 4 skips nearly every key block; Gemma 2 adds soft-capping and alternating windows.
    let rows: Vec<Vec<u32>> = [1100usize, 700]
        .iter()
        .enumerate()
        .map(|(r, &n)| {
            (0..n)
                .map(|i| 3 + ((i * (7 + 4 * r)) % 90) as u32)
                .collect()
        })
        .collect();
    for name in ["llama", "mistral", "gemma2"] {
        let m = model(name);
        let vocab = m.config().vocab_size;
        let whole = m.prefill(&rows).unwrap();
        let lw = whole.logits.dims()[1];
        let w = whole.logits.to_f64_vec();
        let mut state = None;
        for k in 0..3 {
            // Each row but its last two tokens in thirds.
            let cut = |r: &Vec<u32>, k: usize| k * (r.len() - 2) / 3;
            let piece: Vec<Vec<u32>> = rows
                .iter()
                .map(|r| r[cut(r, k)..cut(r, k + 1)].to_vec())
                .collect();
            let out = match state.take() {
                None => m.prefill(&piece).unwrap(),
                Some(s) => m.prefill_from(&piece, s).unwrap(),
            };
            let (lp, p) = (out.logits.dims()[1], out.logits.to_f64_vec());
            for (r, part) in piece.iter().enumerate() {
                for j in 0..part.len() {
                    let at = cut(&rows[r], k) + j; // the token's index in its row
                    let ours = &p[(r * lp + lp - part.len() + j) * vocab..][..vocab];
                    let all = &w[(r * lw + lw - rows[r].len() + at) * vocab..][..vocab];
                    // Relative to the logits' size: Gemma 2's rounding over 1,100 positions
                    // reaches 2e-5 of it (the others stay under 2e-5 absolute).
                    let size = all.iter().fold(1f64, |a, b| a.max(b.abs()));
                    let d = max_abs(ours, all);
                    assert!(
                        d < 1e-4 * size,
                        "{name} row {r} token {at}: blocks differ by {d} (logits up to {size})"
                    );
                }
            }
            state = Some(out.state);
        }
        let mut state = state.unwrap();
        for back in [2, 1] {
            let tokens: Vec<u32> = rows.iter().map(|r| r[r.len() - back]).collect();
            let (logits, next) = m.step(&tokens, state).unwrap();
            assert!(next.capacity() > 512, "{name}: {} columns", next.capacity());
            let p = logits.to_f64_vec();
            for (r, row) in rows.iter().enumerate() {
                let all = &w[(r * lw + lw - back) * vocab..][..vocab];
                let size = all.iter().fold(1f64, |a, b| a.max(b.abs()));
                let d = max_abs(&p[r * vocab..][..vocab], all);
                assert!(
                    d < 1e-4 * size,
                    "{name} row {r} token {}: a step differs by {d} (logits up to {size})",
                    row.len() - back
                );
            }
            state = next;
        }
    }
}

#[test]
fn caches_grow_past_their_capacity() {
    // Mistral's window widened to 80: its rings start at the prefill's 64 columns (no position
    // wrapped), grow to 80 and then wrap; caches sized for the whole run are rings of 80 from
    // the start.
    let wide = common::hybrid::copy_with(
        "mistral",
        "ring-grows",
        |c| c.replace("\"sliding_window\": 4", "\"sliding_window\": 80"),
        |_| true,
    );
    let models = [
        ("bamba", model("bamba")),
        ("nemotron", model("nemotron")),
        (
            "mistral window 80",
            Hybrid::load(&client(), &wide, DType::F32).unwrap(),
        ),
    ];
    let rows = rows();
    for (name, m) in models {
        let sized = m.greedy(&rows, 70).unwrap();
        let pre = m.prefill(&rows).unwrap();
        assert!(pre.state.capacity() < 12 + 70, "{name}: no growth to test");
        let vocab = m.config().vocab_size;
        let len = pre.logits.dims()[1];
        let last = pre.logits.to_f64_vec();
        let argmax = |v: &[f64]| {
            (0..v.len()).fold(0, |best, i| if v[i] > v[best] { i } else { best }) as u32
        };
        let mut picks: Vec<u32> = (0..2)
            .map(|r| argmax(&last[(r * len + len - 1) * vocab..][..vocab]))
            .collect();
        let mut grown: Vec<Vec<u32>> = picks.iter().map(|&t| vec![t]).collect();
        let mut state = pre.state;
        for _ in 1..70 {
            let (logits, next) = m.step(&picks, state).unwrap();
            state = next;
            let v = logits.to_f64_vec();
            picks = (0..2).map(|r| argmax(&v[r * vocab..][..vocab])).collect();
            for (g, &t) in grown.iter_mut().zip(&picks) {
                g.push(t);
            }
        }
        assert!(
            state.capacity() >= 12 + 70,
            "{name}: the caches did not grow"
        );
        if let Some(w) = m.config().attention.sliding_window {
            assert_eq!(w, 80, "{name}: the config edit did not take");
            // Memory flat past the window: every layer of Mistral slides.
            for s in &state.sublayers {
                if let Some(k) = s.tensors().first() {
                    assert_eq!(k.dims()[3], w, "{name}: a ring of the wrong width");
                }
            }
        }
        assert_eq!(grown, sized, "{name}: grown caches decode differently");
    }
}

#[test]
fn gathered_and_dense_experts_agree() {
    let rows = rows();
    for name in ["granite", "nemotron"] {
        let pre = model(name).prefill(&rows).unwrap();
        let (gathered, _) = model(name).step(&[7, 9], pre.state.clone()).unwrap();
        let dense = model(name).with_gathered_experts(false);
        let (all, _) = dense.step(&[7, 9], pre.state).unwrap();
        let d = max_abs(&gathered.to_f64_vec(), &all.to_f64_vec());
        assert!(d < 1e-5, "{name}: gathered and dense experts differ by {d}");
    }
}

#[test]
fn bf16_matrices_stay_near_f32() {
    // bf16 keeps 8 bits of mantissa, and the products take bf16 inputs: logits within 10% of
    // their largest magnitude (Granite's fixture, with its x12 embedding and large branch
    // weights, moves by 8.6%; the others by less): a smoke test of the bf16 path, not a
    // measure of its precision.
    let rows = rows();
    for name in NAMES {
        let f32 = model(name).prefill(&rows).unwrap().logits.to_f64_vec();
        let dir = common::hybrid::fixture(name);
        let bf16 = Hybrid::load(&client(), &dir, DType::BF16).unwrap();
        let low = bf16.prefill(&rows).unwrap().logits.to_f64_vec();
        let scale = f32.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let d = max_abs(&f32, &low);
        assert!(
            d < 0.1 * scale,
            "{name}: bf16 logits differ by {d} (largest {scale})"
        );
        assert!(d > 0.0, "{name}: bf16 changed nothing");
        let tokens = bf16.greedy(&rows, 4).unwrap();
        assert!(tokens.iter().all(|t| t.len() == 4), "{name}");
    }
}
