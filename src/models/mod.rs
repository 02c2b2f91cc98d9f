//! Models built only from the public graph API.

pub mod mamba1;
pub mod mamba2;
