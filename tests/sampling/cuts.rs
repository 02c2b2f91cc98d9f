//! `stablegraph::sampling` against a host reference that sorts: the top-k and top-p cuts of
//! `filtered_logits` (on the device and in the interpreter), and the distribution of `sample`
//! with a fixed seed and enough draws to see a cut one token off.

use crate::common::{client, Rng};
use stablegraph::ops::Graph;
use stablegraph::sampling::{self, SampleSettings, Sampling};
use stablegraph::{CompiledGraph, DType, HostArray};

/// One row's settings.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
}

pub fn settings_arrays(rows: &[Row]) -> [HostArray; 3] {
    let b = rows.len();
    [
        HostArray::from_vec(&[b], rows.iter().map(|r| r.temperature).collect()).unwrap(),
        HostArray::from_vec(&[b], rows.iter().map(|r| r.top_k).collect()).unwrap(),
        HostArray::from_vec(&[b], rows.iter().map(|r| r.top_p).collect()).unwrap(),
    ]
}

/// The host reference: which tokens of `logits` survive top-k then top-p, by sorting.
pub fn kept(logits: &[f32], row: Row) -> Vec<bool> {
    let x: Vec<f32> = logits.iter().map(|l| l / row.temperature).collect();
    let v = x.len();
    let mut keep = vec![true; v];
    let mut sorted = x.clone();
    sorted.sort_by(|a, b| b.total_cmp(a));
    if row.top_k > 0 && (row.top_k as usize) < v {
        let kth = sorted[row.top_k as usize - 1];
        for (k, &xi) in keep.iter_mut().zip(&x) {
            *k = xi >= kth;
        }
    }
    if row.top_p < 1.0 {
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let e: Vec<f64> = x
            .iter()
            .zip(&keep)
            .map(|(&xi, &k)| if k { (xi as f64 - max).exp() } else { 0.0 })
            .collect();
        let total: f64 = e.iter().sum();
        let mut order: Vec<usize> = (0..v).collect();
        order.sort_by(|&a, &b| x[b].total_cmp(&x[a]));
        let mut mass = 0.0;
        let mut cut = x[order[0]];
        for &i in &order {
            mass += e[i] / total;
            cut = x[i];
            if mass >= f64::from(row.top_p) {
                break;
            }
        }
        for (k, &xi) in keep.iter_mut().zip(&x) {
            *k = *k && xi >= cut;
        }
    }
    keep
}

fn filter_program(batch: usize, vocab: usize) -> (Graph, CompiledGraph) {
    let g = Graph::new();
    let logits = g.parameter("logits", DType::F32, &[batch, vocab]).unwrap();
    let s = SampleSettings::parameters(&g, batch).unwrap();
    let out = sampling::filtered_logits(&logits, &s).unwrap();
    g.set_outputs(&[&out]).unwrap();
    let compiled = g.compile(&client()).unwrap();
    (g, compiled)
}

#[test]
fn filtered_logits_cut_where_a_sort_cuts() {
    let (batch, vocab) = (48, 37);
    let mut rng = Rng::new(7);
    // Half the rows have many ties (logits on a grid of quarters), half are continuous.
    let logits: Vec<f32> = (0..batch * vocab)
        .map(|i| {
            if (i / vocab) % 2 == 0 {
                rng.int(-8, 8) as f32 / 4.0
            } else {
                rng.uniform(-6.0, 6.0) as f32
            }
        })
        .collect();
    let rows: Vec<Row> = (0..batch)
        .map(|r| Row {
            temperature: [1.0, 0.5, 2.0, 0.9][r % 4],
            top_k: [0, 1, 2, 5, 17, 36, 37, 0][r % 8],
            top_p: [1.0, 0.9, 0.5, 0.05, 0.999, 1.0][r % 6],
        })
        .collect();
    let (g, program) = filter_program(batch, vocab);
    let mut inputs = vec![HostArray::from_vec(&[batch, vocab], logits.clone()).unwrap()];
    inputs.extend(settings_arrays(&rows));
    let device = program.run(&inputs).unwrap().remove(0).to_f64_vec();
    let interp = g.evaluate(&inputs).unwrap().remove(0).to_f64_vec();
    for (r, row) in rows.iter().enumerate() {
        let l = &logits[r * vocab..(r + 1) * vocab];
        let want = kept(l, *row);
        for (name, got) in [("device", &device), ("interpreter", &interp)] {
            let got = &got[r * vocab..(r + 1) * vocab];
            for (i, (&k, &x)) in want.iter().zip(got).enumerate() {
                if k {
                    // XLA may divide by the temperature as a multiply by its reciprocal.
                    let want = f64::from(l[i] / row.temperature);
                    assert!(
                        (x - want).abs() <= 1e-6 * want.abs().max(1.0),
                        "{name} row {r} {row:?}: token {i} is kept, scaled: {x} vs {want}"
                    );
                } else {
                    assert_eq!(
                        x,
                        f64::NEG_INFINITY,
                        "{name} row {r} {row:?}: token {i} is cut"
                    );
                }
            }
        }
    }
}

/// Draws `rounds * batch` tokens from one row of logits with `row`'s settings; returns the
/// count of each token.
pub fn draw(logits: &[f32], row: Row, batch: usize, rounds: u64) -> Vec<usize> {
    let vocab = logits.len();
    let g = Graph::new();
    let l = g.parameter("logits", DType::F32, &[batch, vocab]).unwrap();
    let s = SampleSettings::parameters(&g, batch).unwrap();
    let key = g.parameter("key", DType::U32, &[2]).unwrap();
    let (tokens, next) = sampling::sample(&l, &s, &key).unwrap();
    g.set_outputs(&[&tokens, &next]).unwrap();
    let program = g.compile(&client()).unwrap();
    let all: Vec<f32> = (0..batch).flat_map(|_| logits.iter().copied()).collect();
    let mut inputs = vec![HostArray::from_vec(&[batch, vocab], all).unwrap()];
    inputs.extend(settings_arrays(&vec![row; batch]));
    inputs.push(
        HostArray::from_vec(
            &[2],
            Sampling::Sample {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                seed: 2024,
            }
            .key()
            .to_vec(),
        )
        .unwrap(),
    );
    let mut counts = vec![0; vocab];
    let mut seen_keys = Vec::new();
    for _ in 0..rounds {
        let mut out = program.run(&inputs).unwrap();
        let next = out.pop().unwrap();
        for t in out[0].to_f64_vec() {
            counts[t as usize] += 1;
        }
        seen_keys.push(next.to_f64_vec());
        inputs[4] = next;
    }
    seen_keys.sort_by(|a, b| a.partial_cmp(b).unwrap());
    seen_keys.dedup();
    assert_eq!(
        seen_keys.len(),
        rounds as usize,
        "every draw gets a new key"
    );
    counts
}

#[test]
fn samples_follow_the_filtered_distribution() {
    // Probabilities 0.3, 0.25, 0.2, 0.1, 0.06, 0.04, 0.03, 0.02 (and their logs as logits),
    // shuffled so that order in the vocabulary says nothing.
    let probs = [0.06, 0.3, 0.02, 0.2, 0.04, 0.25, 0.1, 0.03];
    let logits: Vec<f32> = probs.iter().map(|p: &f64| p.ln() as f32).collect();
    let cases = [
        Row {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
        },
        Row {
            temperature: 0.7,
            top_k: 4,
            top_p: 1.0,
        },
        // 0.3 + 0.25 < 0.7 <= 0.3 + 0.25 + 0.2: three tokens.
        Row {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.7,
        },
        Row {
            temperature: 1.5,
            top_k: 5,
            top_p: 0.8,
        },
        Row {
            temperature: 1.0,
            top_k: 1,
            top_p: 1.0,
        },
    ];
    for row in cases {
        follows_the_filtered_distribution(&logits, row, 1000, 8);
    }
}

/// Draws `batch * rounds` tokens from `logits` with `row`'s settings and checks their counts
/// against the softmax of the tokens the host reference keeps (a chi-square test at 0.001 over
/// the tokens with a probability above 1e-6; no cut token is ever drawn).
pub fn follows_the_filtered_distribution(logits: &[f32], row: Row, batch: usize, rounds: u64) {
    let n = (batch as u64 * rounds) as f64;
    let keep = kept(logits, row);
    let counts = draw(logits, row, batch, rounds);
    let weights: Vec<f64> = logits
        .iter()
        .zip(&keep)
        .map(|(&l, &k)| {
            if k {
                (f64::from(l) / f64::from(row.temperature)).exp()
            } else {
                0.0
            }
        })
        .collect();
    let total: f64 = weights.iter().sum();
    let (mut chi2, mut classes) = (0.0, 0);
    for (i, (&c, &w)) in counts.iter().zip(&weights).enumerate() {
        if w == 0.0 {
            assert_eq!(c, 0, "{row:?}: token {i} is cut but was drawn {c} times");
        } else if w / total > 1e-6 {
            let expected = n * w / total;
            chi2 += (c as f64 - expected).powi(2) / expected;
            classes += 1;
        }
    }
    // At most 7 degrees of freedom (8 likely tokens), whose chi-square exceeds 24.3 with
    // probability 0.001. A cut one token short puts a whole token's mass at 0.
    assert!(
        classes <= 8,
        "{row:?}: {classes} likely tokens, the bound is for 8"
    );
    let likely: Vec<(usize, usize)> = counts
        .iter()
        .copied()
        .enumerate()
        .filter(|c| c.1 > 0)
        .collect();
    assert!(chi2 < 24.3, "{row:?}: counts {likely:?}, chi2 {chi2}");
}

#[test]
fn sampling_settings_are_checked() {
    let bad = [
        (
            Sampling::Sample {
                temperature: -0.5,
                top_k: 0,
                top_p: 1.0,
                seed: 0,
            },
            "temperature",
        ),
        (
            Sampling::Sample {
                temperature: f32::NAN,
                top_k: 0,
                top_p: 1.0,
                seed: 0,
            },
            "temperature",
        ),
        (
            Sampling::Sample {
                temperature: f32::INFINITY,
                top_k: 0,
                top_p: 1.0,
                seed: 0,
            },
            "temperature",
        ),
        (
            Sampling::Sample {
                temperature: 1.0,
                top_k: 0,
                top_p: 0.0,
                seed: 0,
            },
            "top_p",
        ),
        (
            Sampling::Sample {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.5,
                seed: 0,
            },
            "top_p",
        ),
    ];
    for (s, name) in bad {
        let e = s.check(10).unwrap_err().to_string();
        assert!(e.contains(&format!("sampling.{name}")), "{s:?}: {e}");
        assert!(SampleSettings::host_values(&s, 2, 10).is_err());
    }
    Sampling::Greedy.check(10).unwrap();
    let g = Graph::new();
    let logits = g.parameter("l", DType::F32, &[2, 10]).unwrap();
    let s = SampleSettings::parameters(&g, 3).unwrap();
    let e = sampling::filtered_logits(&logits, &s)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("settings.temperature") && e.contains("f32[2]"),
        "{e}"
    );
    let g = Graph::new();
    let logits = g.parameter("l", DType::F32, &[2, 10]).unwrap();
    let key = g.parameter("key", DType::U32, &[3]).unwrap();
    let s = SampleSettings::parameters(&g, 2).unwrap();
    let e = sampling::sample(&logits, &s, &key).unwrap_err().to_string();
    assert!(e.contains("key"), "{e}");
    let flat = g.parameter("flat", DType::F32, &[10]).unwrap();
    assert!(sampling::greedy(&flat)
        .unwrap_err()
        .to_string()
        .contains("logits"));
}

/// Top-k 1 takes the most likely token, the first of equal ones, as greedy decoding does:
/// never the other tied token, whatever the key.
#[test]
fn top_k_one_is_the_argmax_first_on_ties() {
    let row = Row {
        temperature: 0.7,
        top_k: 1,
        top_p: 1.0,
    };
    let counts = draw(&[0.5, 2.0, -1.0, 2.0, 1.9], row, 16, 8);
    assert_eq!(counts, [0, 128, 0, 0, 0]);
}

/// Temperature 0 is a greedy row (temperature 1, top-k 1: the argmax), as a server reads it;
/// a top-k beyond the vocabulary is the vocabulary (off), as 0 is.
#[test]
fn temperature_zero_is_greedy_and_top_k_beyond_the_vocabulary_is_off() {
    let sample = |temperature: f32, top_k: usize| Sampling::Sample {
        temperature,
        top_k,
        top_p: 0.9,
        seed: 3,
    };
    let rows = [
        Sampling::Greedy,
        sample(0.0, 5),
        sample(0.8, 1000),
        sample(0.8, 10),
    ];
    for s in &rows {
        s.check(10).unwrap();
    }
    let [t, k, p] = SampleSettings::row_host_values(&rows, 10).unwrap();
    assert_eq!(t.to_f64_vec(), [1.0, 1.0, 0.8f32 as f64, 0.8f32 as f64]);
    assert_eq!(k.to_f64_vec(), [1.0, 1.0, 10.0, 10.0]);
    assert_eq!(p.to_f64_vec(), [1.0, 1.0, 0.9f32 as f64, 0.9f32 as f64]);
}
