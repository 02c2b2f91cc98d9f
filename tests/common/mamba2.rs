//! The tiny Mamba-2 shapes, models and state comparisons the model tests share.

use stablegraph::models::mamba2::{
    Mamba2, Mamba2Config, Mamba2State, Mamba2Weights, Penalties, Sampling,
};
use stablegraph::models::GenerateOptions;
use stablegraph::DType;

use super::{buffer_diff, client};

/// A tiny Mamba-2 shape for model tests: 2 layers, 32 wide, 8 heads in 2 groups, chunk 8,
/// vocabulary 64, untied head.
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

/// An even smaller shape for checkpoint and validation tests: 16 wide, state 4, 4 heads in 2
/// groups, vocabulary 24, tied embeddings (the rest as [`tiny_mamba2`]).
pub fn micro_mamba2() -> Mamba2Config {
    Mamba2Config {
        hidden_size: 16,
        state_size: 4,
        num_heads: 4,
        vocab_size: 24,
        tie_word_embeddings: true,
        ..tiny_mamba2()
    }
}

/// [`tiny_mamba2`] with random weights of `dtype` (seed 7) on the shared client.
pub fn tiny_model(dtype: DType) -> Mamba2 {
    let cfg = tiny_mamba2();
    let w = Mamba2Weights::random(&cfg, dtype, 7).unwrap();
    Mamba2::new(&client(), cfg, &w).unwrap()
}

/// The largest difference between two states (every layer's conv and SSM state).
pub fn state_diff(a: &Mamba2State, b: &Mamba2State) -> f64 {
    a.layers
        .iter()
        .zip(&b.layers)
        .map(|(x, y)| buffer_diff(&x.conv, &y.conv).max(buffer_diff(&x.ssm, &y.ssm)))
        .fold(0.0, f64::max)
}

/// Greedy generation of `n` tokens, with no end token.
pub fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: n,
        sampling: Sampling::Greedy,
        eos: None,
        penalties: Penalties::NONE,
    }
}
