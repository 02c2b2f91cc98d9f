//! Every family through one face (`stablegraph::models::family::load`, `CausalLm`): Mamba-2,
//! Mamba-1, Falcon-Mamba, Bamba, Granite 4.0-H and Nemotron-H, each on its HF fixtures:
//! one-program generation against transformers' greedy tokens, the sampling options, streams
//! and state files ([`generate`]); the face a service holds ([`face`]); 8-bit matrices
//! ([`quant`]); several devices ([`devices`]).

#[path = "../common/mod.rs"]
mod common;

mod devices;
mod face;
mod generate;
mod quant;
