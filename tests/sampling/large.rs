//! Sampling over a vocabulary large enough (20,000 tokens) that `sample` restricts a small
//! top-k to the candidate blocks: the same distribution as the host reference, the same tokens
//! as the whole-vocabulary path for the same keys, and the whole vocabulary when ties at the
//! cut spread past the candidates. (Top-k off over a large vocabulary is the whole-vocabulary
//! path that the small vocabularies of `cuts` test, and the fallback rows here.)

use crate::common::{client, Rng};
use crate::cuts::{draw, follows_the_filtered_distribution, settings_arrays, Row};
use stablegraph::ops::Graph;
use stablegraph::sampling::{self, SampleSettings};
use stablegraph::{DType, HostArray};

const VOCAB: usize = 20_000;

fn row(temperature: f32, top_k: i32, top_p: f32) -> Row {
    Row {
        temperature,
        top_k,
        top_p,
    }
}

#[test]
fn large_vocabularies_follow_the_filtered_distribution() {
    // Eight likely tokens spread over the vocabulary (several in one block of 64), the rest
    // ~e^-40 as likely.
    let probs = [0.06, 0.3, 0.02, 0.2, 0.04, 0.25, 0.1, 0.03];
    let at = [5, 70, 71, 9_000, 12_345, 12_346, 19_990, 19_999];
    let mut logits = vec![-40.0f32; VOCAB];
    for (&p, &i) in probs.iter().zip(&at) {
        logits[i] = (p as f32).ln();
    }
    for r in [
        row(1.0, 4, 1.0),
        row(1.5, 5, 0.8),
        row(1.0, 1, 1.0),
        row(0.8, 50, 0.7),
        row(1.0, 64, 1.0),
    ] {
        follows_the_filtered_distribution(&logits, r, 125, 32);
    }
}

/// The tokens `sample` draws for each row of `logits` (`[rows.len(), VOCAB]`) with one key per
/// row, `steps` times, each step with the keys the last one returned.
fn sampled(logits: &[f32], rows: &[Row], steps: usize) -> Vec<Vec<u32>> {
    let batch = rows.len();
    let g = Graph::new();
    let l = g.parameter("logits", DType::F32, &[batch, VOCAB]).unwrap();
    let s = SampleSettings::parameters(&g, batch).unwrap();
    let key = g.parameter("key", DType::U32, &[batch, 2]).unwrap();
    let (tokens, next) = sampling::sample(&l, &s, &key).unwrap();
    g.set_outputs(&[&tokens, &next]).unwrap();
    let program = g.compile(&client()).unwrap();
    let mut inputs = vec![HostArray::from_vec(&[batch, VOCAB], logits.to_vec()).unwrap()];
    inputs.extend(settings_arrays(rows));
    let keys: Vec<u32> = (0..batch as u32).flat_map(|r| [r * 7 + 1, 99]).collect();
    inputs.push(HostArray::from_vec(&[batch, 2], keys).unwrap());
    let mut out = vec![Vec::new(); batch];
    for _ in 0..steps {
        let mut o = program.run(&inputs).unwrap();
        inputs[4] = o.pop().unwrap();
        for (r, t) in o[0].to_f64_vec().into_iter().enumerate() {
            out[r].push(t as u32);
        }
    }
    out
}

#[test]
fn candidates_draw_what_the_whole_vocabulary_draws() {
    // Continuous logits with many close contenders, so that top-k and top-p both cut.
    let mut rng = Rng::new(11);
    let rows = [
        row(1.0, 50, 0.9),
        row(0.7, 1, 1.0),
        row(1.3, 64, 1.0),
        row(1.0, 5, 0.5),
        row(2.0, 40, 0.95),
        row(0.9, 17, 0.99),
    ];
    let logits: Vec<f32> = (0..rows.len() * VOCAB)
        .map(|_| (rng.uniform(-1.0, 1.0) * rng.uniform(0.0, 1.0) * 6.0) as f32)
        .collect();
    let few = sampled(&logits, &rows, 24);
    // One more row with top-k off sends every row of the batch through the whole vocabulary;
    // each row's draws depend on its own key alone.
    let mut more = rows.to_vec();
    more.push(row(1.0, 0, 0.9));
    let mut all = logits.clone();
    all.extend_from_slice(&logits[..VOCAB]);
    let whole = sampled(&all, &more, 24);
    for (r, settings) in rows.iter().enumerate() {
        assert_eq!(few[r], whole[r], "row {r} {settings:?}");
        // And each token is one that the cuts keep.
        let keep = crate::cuts::kept(&logits[r * VOCAB..(r + 1) * VOCAB], *settings);
        for &t in &few[r] {
            assert!(keep[t as usize], "row {r} {settings:?}: token {t} is cut");
        }
    }
    // The draws differ from step to step (the keys move on).
    assert!(few[0].iter().any(|&t| t != few[0][0]), "{:?}", few[0]);
}

#[test]
fn ties_past_the_candidates_sample_the_whole_vocabulary() {
    // Every token ties at the top: top-k 5 keeps all 20,000 (ties at the cut are kept), far
    // more than the candidate blocks hold (64 x 64 = 4,096, the first ones by the blocks'
    // sort), so the draw must cover the whole vocabulary, uniformly.
    let logits = vec![0.5f32; VOCAB];
    let counts = draw(&logits, row(1.0, 5, 1.0), 100, 20);
    let n: usize = counts.iter().sum();
    let past: usize = counts[4_096..].iter().sum();
    let share = past as f64 / n as f64;
    let want = (VOCAB - 4_096) as f64 / VOCAB as f64;
    // 2,000 draws: the share's standard deviation is ~0.009.
    assert!(
        (share - want).abs() < 0.04,
        "{share} of the draws past the first 4,096 tokens, want {want}"
    );
}
