//! What every family shares: reading checkpoints and their configs, the layers they are made
//! of (products in any weight dtype, norms, the recurrent state of an SSM layer), and the
//! options of a generation call.

pub(crate) mod checkpoint;
pub(crate) mod json;
pub(crate) mod layers;
pub(crate) mod materialize;
mod matrix;
mod options;
mod parallel;
mod state;
mod write;

pub use checkpoint::LoadOptions;
pub use layers::LayerState;
pub use matrix::Matrix;
pub(crate) use matrix::{by_name, check_matrix_dtype, quantized_like, scaled_matrix};
pub(crate) use options::generate_capacity;
pub use options::{GenerateOptions, MAX_NEW_TOKENS};
pub use parallel::Parallel;
pub use state::ModelState;
pub(crate) use write::write_tensors;
