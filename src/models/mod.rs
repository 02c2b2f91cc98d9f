//! Models built only from the public graph API.

pub mod mamba2;
