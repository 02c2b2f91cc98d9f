//! Google's Gemma 2 as transformers writes it (`model_type` `gemma2`): the embedding scaled by
//! `sqrt(hidden_size)`, RMS norms with `(1 + w)`, a norm before and after each sublayer,
//! GeGLU MLPs with the tanh GELU, queries scaled by `query_pre_attn_scalar^-0.5`, attention
//! and final logits soft-capped, and sliding-window and global layers alternating. The model
//! runs on the engine's layer stack ([`crate::models::hybrid::Hybrid`]) as every family does;
//! this folder is what the family adds: its config. See `docs/transformers.md`.

mod config;

pub(crate) use config::read;

/// The `model_type` of Gemma 2.
pub const MODEL_TYPE: &str = "gemma2";
