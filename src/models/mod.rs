//! Models built only from the public graph API.

pub(crate) mod engine;
pub mod family;
pub mod hybrid;
pub mod mamba1;
pub mod mamba2;

/// The index of the largest value (the first of equals), for greedy decoding on the host.
pub(crate) fn argmax(v: &[f64]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}
