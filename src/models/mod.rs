//! Models built only from the public graph API.

pub(crate) mod engine;
pub mod family;
pub mod hybrid;
pub mod mamba1;
pub mod mamba2;
pub mod quant;
