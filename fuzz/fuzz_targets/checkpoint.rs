//! Safetensors header and sharded index parsing of the Mamba-2 loader: see
//! `stablegraph::fuzzing::checkpoint`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| stablegraph::fuzzing::checkpoint(data));
