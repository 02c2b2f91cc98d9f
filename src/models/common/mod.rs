//! What every family shares: reading checkpoints and their configs, the layers they are made
//! of (products in any weight dtype, norms, the recurrent state of an SSM layer), and the
//! options of a generation call.

pub(crate) mod checkpoint;
pub(crate) mod json;
pub(crate) mod layers;
pub(crate) mod materialize;
mod options;
mod state;

pub use checkpoint::LoadOptions;
pub use layers::LayerState;
pub(crate) use options::generate_capacity;
pub use options::{GenerateOptions, MAX_NEW_TOKENS};
pub use state::ModelState;
