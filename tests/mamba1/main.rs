//! Mamba-1 and Falcon-Mamba on tiny shapes: [`fixtures`] (logits, states, decode logits and
//! greedy tokens against HF transformers), [`consistency`] (the two scans, and steps against
//! prefills, on random weights), [`checkpoints`] (configs and checkpoints that do not fit are
//! errors naming what is wrong).

#[path = "../common/mod.rs"]
mod common;

mod checkpoints;
mod consistency;
mod fixtures;
