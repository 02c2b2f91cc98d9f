//! One `Mamba2` shared by four threads, each calling `generate` 50 times with its own prompts
//! and sampling settings: every result equals the same call made alone, and resident memory is
//! flat over the last 152 calls. Alone in its own test binary so nothing else moves the RSS.

mod common;

use std::sync::Barrier;

use common::{client, rss_kb};
use stablegraph::models::mamba2::{Mamba2, Mamba2Weights, Penalties, Sampling};
use stablegraph::models::GenerateOptions;
use stablegraph::DType;

/// Each thread's settings: greedy, greedy with an end token, and two kinds of sampling.
fn settings(thread: usize) -> GenerateOptions {
    let sampling = match thread {
        0 | 1 => Sampling::Greedy,
        2 => Sampling::Sample {
            temperature: 0.8,
            top_k: 5,
            top_p: 0.9,
            seed: 11,
        },
        _ => Sampling::Sample {
            temperature: 1.3,
            top_k: 0,
            top_p: 1.0,
            seed: 5,
        },
    };
    GenerateOptions {
        max_new_tokens: 6,
        sampling,
        eos: (thread == 1).then_some(7),
        penalties: Penalties::NONE,
    }
}

/// Five prompts per thread (one prompt bucket: at most one chunk of 8), batches of one and two.
fn prompts(thread: usize, call: usize) -> Vec<Vec<u32>> {
    let k = (call % 5) as u32;
    let t = thread as u32;
    let a: Vec<u32> = (0..3 + k).map(|i| (i * 7 + t * 13 + k) % 64).collect();
    if call % 5 == 4 {
        let b: Vec<u32> = (0..5).map(|i| (i * 3 + t + 1) % 64).collect();
        vec![a, b]
    } else {
        vec![a]
    }
}

#[cfg(target_os = "linux")]
#[test]
fn four_threads_share_one_model_and_memory_stays_flat() {
    const THREADS: usize = 4;
    const CALLS: usize = 50;
    const WARM: usize = 12;
    let cfg = common::tiny_mamba2();
    let weights = Mamba2Weights::random(&cfg, DType::F32, 3).unwrap();
    let model = Mamba2::new(&client(), cfg, &weights).unwrap();

    // Every distinct call, made alone first (this also compiles every program).
    let alone: Vec<Vec<Vec<Vec<u32>>>> = (0..THREADS)
        .map(|t| {
            (0..5)
                .map(|c| model.generate(&prompts(t, c), &settings(t)).unwrap())
                .collect()
        })
        .collect();
    // The calls differ from each other, so equality below says something.
    assert_ne!(alone[0][0], alone[3][0]);
    assert_ne!(alone[2][0], alone[2][1]);

    let barrier = Barrier::new(THREADS + 1);
    let warm = std::thread::scope(|s| {
        for t in 0..THREADS {
            let (model, alone, barrier) = (&model, &alone, &barrier);
            s.spawn(move || {
                for call in 0..CALLS {
                    let got = model.generate(&prompts(t, call), &settings(t)).unwrap();
                    assert_eq!(got, alone[t][call % 5], "thread {t}, call {call}");
                    if call + 1 == WARM {
                        barrier.wait();
                        barrier.wait();
                    }
                }
            });
        }
        barrier.wait();
        let warm = rss_kb();
        barrier.wait();
        warm
    });
    let after = rss_kb();
    let growth_kb = after as i64 - warm as i64;
    eprintln!(
        "RSS after {} calls: {warm} kB, after {}: {after} kB",
        THREADS * WARM,
        THREADS * CALLS
    );
    assert!(
        growth_kb < 8 * 1024,
        "resident memory grew by {growth_kb} kB over the last {} generate calls",
        THREADS * (CALLS - WARM)
    );
}
