//! Mamba-1 and Falcon-Mamba language-model inference, compiler-first: the selective scan over a
//! prompt as a log-depth associative scan (no loop over positions), and the O(1) recurrent step.
//! Built only from the public graph API; checked against HF transformers' pure-torch models.

mod block;
mod config;
mod model;
mod weights;

pub use block::{Mamba1State, Scan};
pub use config::{Mamba1Config, MODEL_TYPES};
pub use model::{Mamba1, Mamba1Prefill};
pub use weights::{Mamba1Layer, Mamba1Weights};
