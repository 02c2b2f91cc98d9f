//! The Mamba-2 hybrids (Bamba, Granite 4.0-H dense and with experts, Nemotron-H) on tiny
//! shapes: [`fixtures`] (logits, decode logits and greedy tokens against HF transformers),
//! [`consistency`] (continuation in pieces, KV cache included, equals the whole prompt),
//! [`checkpoints`] (configs and checkpoints that do not fit are errors naming what is wrong).

#[path = "../common/mod.rs"]
mod common;

mod checkpoints;
mod consistency;
mod fixtures;
