//! The einsum spec parser and `Tensor::einsum`: see `stablegraph::fuzzing::einsum_spec`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| stablegraph::fuzzing::einsum_spec(data));
