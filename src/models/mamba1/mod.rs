//! Mamba-1 and Falcon-Mamba language-model inference from HF and `mamba_ssm` checkpoints: the
//! prefill over prompts (the selective scan as a log-depth associative scan or a loop over
//! positions, whichever the platform runs faster), the O(1) recurrent step, and greedy decoding.
//! Built only from the public graph API; checked against HF transformers' pure-torch models.
//! See `docs/mamba1.md`.

mod block;
mod config;
mod family;
mod model;
mod tune;
mod weights;

pub use block::{Mamba1State, Scan};
pub use config::{Mamba1Config, MODEL_TYPES};
pub use model::{Mamba1, Mamba1Prefill};
pub use weights::{Mamba1Layer, Mamba1Weights};
