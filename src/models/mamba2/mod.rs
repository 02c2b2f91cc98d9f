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
mod mixed;
mod model;
mod parallel;
mod save;
mod slots;
pub mod ssd;
mod state;
pub mod train;
mod tune;
mod weights;

/// Re-exported from [`crate::sampling`], where they live.
pub use crate::sampling::{Penalties, Sampling};
pub use block::Remat;
pub use config::Mamba2Config;
pub use model::{Mamba2, Prefill, CPU_MAX_CHUNK, MAX_PREFILL_CHUNK};
pub use parallel::Parallel;
pub use state::Mamba2State;
pub use train::{lm_loss, lm_loss_with, loss_and_grads, TrainOptions, Trainer};
pub use weights::{HostWeights, LayerWeights, Mamba2Weights};

/// Moved to [`crate::models::GenerateOptions`]: it is every family's.
#[deprecated(since = "0.1.0", note = "use stablegraph::models::GenerateOptions")]
pub type GenerateOptions = crate::models::common::GenerateOptions;

/// Moved to [`crate::models::LoadOptions`]: it is every family's.
#[deprecated(since = "0.1.0", note = "use stablegraph::models::LoadOptions")]
pub type LoadOptions = crate::models::common::LoadOptions;

/// Moved to [`crate::models::LayerState`]: Mamba-1 and the hybrids hold it too.
#[deprecated(since = "0.1.0", note = "use stablegraph::models::LayerState")]
pub type LayerState<T> = crate::models::common::LayerState<T>;

/// Mamba-2's serving slots are every family's now ([`crate::models::FamilySlots`]).
#[deprecated(since = "0.1.0", note = "use stablegraph::models::FamilySlots")]
pub type Mamba2Slots = crate::models::FamilySlots;

/// Moved to [`crate::models::MAX_NEW_TOKENS`]: it is every family's.
#[deprecated(since = "0.1.0", note = "use stablegraph::models::MAX_NEW_TOKENS")]
pub const MAX_NEW_TOKENS: usize = crate::models::common::MAX_NEW_TOKENS;
