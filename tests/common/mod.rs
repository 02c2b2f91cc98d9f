//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::OnceLock;

use stablegraph::models::mamba2::Mamba2Config;
use stablegraph::rng::SplitMix64;
use stablegraph::runtime::{Buffer, Client, Executable, ShardedBuffer};
use stablegraph::DType;

/// One CPU client per test binary (the plugin is resolved, and fetched on first use, as for users).
pub fn client() -> Client {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    CLIENT
        .get_or_init(|| Client::cpu().expect("the CPU plugin must load for the tests"))
        .clone()
}

/// Compiles `mlir`, panicking with the plugin's message on failure.
pub fn compile(mlir: &str) -> Executable {
    client()
        .compile(mlir)
        .unwrap_or_else(|e| panic!("compile failed: {e}\n{mlir}"))
}

/// Uploads an f32 array.
pub fn f32_buffer(data: &[f32], dims: &[usize]) -> Buffer {
    client().buffer_from_slice(data, dims).unwrap()
}

/// The crate's SplitMix64 with the helpers tests use, so tests need no RNG crate and are
/// reproducible.
pub struct Rng(SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(SplitMix64::new(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        self.0.uniform(lo, hi)
    }

    pub fn f32s(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi) as f32).collect()
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform integer in `lo..=hi`.
    pub fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as i64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.uniform(0.0, 1.0) < p
    }

    /// One element of `items` (non-empty), uniformly.
    pub fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }

    /// Shuffles `items` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}

/// Asserts `got` and `want` agree elementwise within `rtol * |want| + atol`.
pub fn assert_close(got: &[f32], want: &[f32], rtol: f32, atol: f32) {
    assert_eq!(got.len(), want.len(), "length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= rtol * w.abs() + atol,
            "element {i}: got {g}, want {w}"
        );
    }
}

/// Resident set size in kB, from /proc/self/status.
#[cfg(target_os = "linux")]
pub fn rss_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// A tiny Mamba-2 shape for model tests: 2 layers, 32 wide, 8 heads in 2 groups, chunk 8,
/// vocabulary 64.
pub fn tiny_mamba2() -> Mamba2Config {
    Mamba2Config {
        hidden_size: 32,
        num_layers: 2,
        state_size: 8,
        head_dim: 8,
        num_heads: 8,
        n_groups: 2,
        conv_kernel: 4,
        chunk_size: 8,
        vocab_size: 64,
        time_step_limit: (0.0, f64::INFINITY),
        norm_eps: 1e-5,
        residual_in_fp32: true,
        tie_word_embeddings: false,
        use_bias: false,
        use_conv_bias: true,
        norm_before_gate: false,
        time_step_init: (1e-3, 1e-1, 1e-4),
        scan_dtype: DType::F32,
    }
}

/// The largest absolute difference between two equally long slices.
pub fn max_abs(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// The largest absolute difference between two device arrays of one shape (downloaded and
/// gathered).
pub fn buffer_diff(a: &ShardedBuffer, b: &ShardedBuffer) -> f64 {
    let host = |b: &ShardedBuffer| b.to_host_array().unwrap().to_f64_vec();
    max_abs(&host(a), &host(b))
}
