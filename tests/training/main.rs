//! Gradients and fine-tuning of every family through the face (`CausalLm::loss_and_grads`,
//! `CausalLm::fine_tuner`): gradients against torch autograd ([`grads`]), fine-tuning on one
//! device and two, the checkpoint written back, bad input ([`tune`]). A test binary of its own:
//! the programs it compiles would add to the families binary's memory mappings.

#[path = "../common/mod.rs"]
mod common;

mod grads;
mod tune;
