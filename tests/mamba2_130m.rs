//! The real 130M shape (768 wide, 24 layers, state 128, head_dim 64, vocab 50288, chunk 256)
//! with random weights, end to end: prefill, the step API and one-program generation. Slow, so
//! ignored by default; run it with
//! `cargo test --release --test mamba2_130m -- --ignored --nocapture`.

mod common;

use std::time::Instant;

use common::{client, max_abs};
use stablegraph::models::mamba2::{
    GenerateOptions, Mamba2, Mamba2Config, Mamba2Weights, Penalties, Sampling,
};
use stablegraph::runtime::CompileCache;
use stablegraph::DType;

#[test]
#[ignore]
fn mamba2_130m_end_to_end() {
    let c = client();
    // Measure real compiles, not the disk cache.
    c.set_compile_cache(CompileCache::memory_only());
    let cfg = Mamba2Config::mamba2_130m();
    let t = Instant::now();
    let weights = Mamba2Weights::random(&cfg, DType::F32, 0).unwrap();
    let model = Mamba2::new(&c, cfg.clone(), &weights).unwrap();
    eprintln!("random weights + upload: {:.2?}", t.elapsed());

    let prompt: Vec<u32> = (0..128).map(|i| (i * 7919 % 50000) as u32).collect();
    let options = GenerateOptions {
        max_new_tokens: 32,
        sampling: Sampling::Greedy,
        eos: None,
        penalties: Penalties::NONE,
    };
    let t = Instant::now();
    let first = model
        .generate(std::slice::from_ref(&prompt), &options)
        .unwrap();
    let cold = t.elapsed();
    let t = Instant::now();
    let second = model
        .generate(std::slice::from_ref(&prompt), &options)
        .unwrap();
    let warm = t.elapsed();
    eprintln!(
        "generate 128 + 32 tokens: first call (compile + run) {cold:.2?}, second call {warm:.2?}"
    );
    assert_eq!(first, second);
    assert_eq!(first[0].len(), 32);
    assert!(first[0].iter().all(|&t| (t as usize) < cfg.vocab_size));

    // The step API continues where prefill stopped and agrees with generate.
    let t = Instant::now();
    let pre = model.prefill(std::slice::from_ref(&prompt)).unwrap();
    let (_, state) = model.step(&[first[0][0]], pre.state).unwrap();
    eprintln!(
        "prefill + one step (with their compiles): {:.2?}",
        t.elapsed()
    );
    assert_eq!(state.layers.len(), 24);
}

/// The 130M shape over 4 devices of a CPU client, split by heads and by the batch: prefill
/// logits within 1e-5 of one device and greedy tokens identical. Slow (several compiles of
/// the 130M programs), so ignored; run it as above with `--test mamba2_130m`.
#[test]
#[ignore]
fn mamba2_130m_over_four_devices_matches_one() {
    use stablegraph::models::mamba2::Parallel;
    let c = stablegraph::runtime::Client::cpu_with_devices(4).unwrap();
    let cfg = Mamba2Config::mamba2_130m();
    let weights = Mamba2Weights::random(&cfg, DType::F32, 0).unwrap();
    let one = Mamba2::new(&c, cfg.clone(), &weights).unwrap();
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|r| {
            (0..40 + r)
                .map(|i| ((i * 7919 + r * 31) % 50000) as u32)
                .collect()
        })
        .collect();
    let options = GenerateOptions {
        max_new_tokens: 16,
        sampling: Sampling::Greedy,
        eos: None,
        penalties: Penalties::NONE,
    };
    let logits = one.prefill(&prompts).unwrap().logits.to_f64_vec();
    let tokens = one.generate(&prompts, &options).unwrap();
    for parallel in [Parallel::Heads, Parallel::Batch] {
        let many = Mamba2::new_parallel(&c, cfg.clone(), &weights, parallel, 4).unwrap();
        let got = many.prefill(&prompts).unwrap().logits.to_f64_vec();
        let d = max_abs(&got, &logits);
        eprintln!("{parallel:?}: prefill logits differ by at most {d:e}");
        assert!(d < 1e-5, "{parallel:?}: prefill logits differ by {d}");
        assert_eq!(
            many.generate(&prompts, &options).unwrap(),
            tokens,
            "{parallel:?}"
        );
    }
}
