//! The Mamba-2 hybrids with attention and experts: IBM's Bamba and Granite 4.0-H
//! (`granitemoehybrid`) and NVIDIA's Nemotron-H, from HF checkpoints. Every layer is a list of
//! sublayers (a Mamba-2 mixer, causal grouped-query attention with rotary embeddings and a
//! key/value cache updated in place, an MLP, or a mixture of experts), each behind its RMS norm
//! and residual; the prefill over prompts, the one-token step and greedy decoding. Built only
//! from the public graph API; checked against HF transformers' pure-torch models. See
//! `docs/hybrid.md`.

pub(crate) mod config;
mod family;
mod generate;
mod graph;
mod layers;
mod model;
mod slots;
mod tune;
mod validate;
mod weights;

pub use config::{
    Activation, AttentionConfig, HybridConfig, HybridFamily, MlpConfig, MoeConfig, Routing,
    SublayerKind, MODEL_TYPES,
};
pub use graph::SublayerState;
pub use model::{Hybrid, HybridPrefill, HybridState};
pub use weights::{
    AttentionBiases, AttentionWeights, HybridWeights, MlpWeights, MoeWeights, Sublayer,
};
