//! Mamba-2 language-model inference, compiler-first: chunked SSD prefill as einsums over static
//! causal masks, the O(1) recurrent step for decoding, and generation as one compiled program;
//! and training ([`train`]): the next-token loss, its gradients, and AdamW steps as one compiled
//! program.
//! Built only from the public graph API.

pub mod block;
pub(crate) mod checkpoint;
pub(crate) mod config;
mod decode;
mod generate;
pub(crate) mod materialize;
mod model;
mod parallel;
mod save;
mod slots;
pub mod ssd;
mod state;
pub mod train;
mod weights;

/// Re-exported from [`crate::sampling`], where they live.
pub use crate::sampling::{Penalties, Sampling};
pub use block::{LayerState, Remat};
pub use checkpoint::LoadOptions;
pub use config::Mamba2Config;
pub(crate) use generate::generate_capacity;
pub use generate::{GenerateOptions, MAX_NEW_TOKENS};
pub use model::{Mamba2, Prefill, CPU_MAX_CHUNK, MAX_PREFILL_CHUNK};
pub use parallel::Parallel;
pub use slots::Mamba2Slots;
pub use state::Mamba2State;
pub use train::{lm_loss, lm_loss_with, loss_and_grads, TrainOptions, Trainer};
pub use weights::{HostWeights, LayerWeights, Mamba2Weights};
