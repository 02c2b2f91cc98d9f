//! Choosing tokens: the sampler's top-k and top-p cuts and its distribution ([`cuts`]), and the
//! penalties on repeated tokens ([`penalties`]), each against a host reference written from the
//! definitions.

#[path = "../common/mod.rs"]
mod common;

mod cuts;
mod large;
mod penalties;
