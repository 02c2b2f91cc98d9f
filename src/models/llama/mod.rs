//! The Llama architecture as transformers writes it, in its four `model_type`s: `llama`
//! (Llama 2 and 3, SmolLM2; rotary scaling of type `llama3` or `linear`, attention biases when
//! the config has them), `qwen2` (biases on the query, key and value projections), `qwen3`
//! (per-head query and key RMS norms, an explicit `head_dim`) and `mistral` (a sliding
//! window). Each layer is attention then a SwiGLU MLP, each behind its RMS norm and residual;
//! the model runs on the engine's layer stack ([`crate::models::hybrid::Hybrid`], whose
//! attention and key/value cache are the engine's), so it generates, streams, serves, splits
//! over devices, quantizes, differentiates and fine-tunes as every family does. This folder is
//! what the family adds: its config. See `docs/transformers.md`.

mod config;

pub(crate) use config::read;
pub use config::MODEL_TYPES;
