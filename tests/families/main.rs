//! Every family through one face (`stablegraph::models::family::load`, `CausalLm`): Mamba-2,
//! Mamba-1, Falcon-Mamba, Bamba, Granite 4.0-H and Nemotron-H, each on its HF fixtures:
//! one-program generation against transformers' greedy tokens, the sampling options, streams
//! and state files ([`generate`]); the face a service holds ([`face`]); 8-bit matrices
//! ([`quant`]); several devices ([`devices`]); programs built for another platform's
//! [`stablegraph::Target`] ([`targets`]).

#[path = "../common/mod.rs"]
mod common;

mod devices;
mod face;
mod generate;
mod quant;
mod targets;

/// Token ids of prompts, one row each.
type Rows = Vec<Vec<u32>>;

/// A conversation of two rows in two turns: the first turn's prompts, the second's, and each
/// row's whole prompt.
pub(crate) fn conversation() -> (Rows, Rows, Rows) {
    let first = vec![vec![5, 9, 14, 20, 33, 7], vec![40, 41, 42]];
    let rest = vec![vec![11, 12], vec![13, 14, 15]];
    let whole = first
        .iter()
        .zip(&rest)
        .map(|(a, b)| a.iter().chain(b).copied().collect())
        .collect();
    (first, rest, whole)
}
