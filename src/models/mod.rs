//! Models built only from the public graph API: the families (Mamba-2, Mamba-1 and
//! Falcon-Mamba, the hybrids), what they share ([`common`]), and loading any of them by its
//! checkpoint ([`family`]).

pub mod common;
pub(crate) mod engine;
pub mod family;
pub mod gemma2;
pub mod hybrid;
pub mod llama;
mod loaded;
pub mod mamba1;
pub mod mamba2;
pub mod quant;
pub mod text;
pub mod training;

pub use crate::sampling::{Penalties, Sampling};
pub use common::{
    GenerateOptions, LayerState, LoadOptions, Matrix, ModelState, Parallel, MAX_NEW_TOKENS,
};
pub use engine::slots::{FamilySlots, SlotSnapshot};
pub use loaded::{Completion, Model, TokenLogprob};
pub use text::Text;
pub use training::{FineTuner, Gradients};
