//! The runtime's `@main` signature reader: see `stablegraph::fuzzing::main_signature`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| stablegraph::fuzzing::main_signature(data));
