//! The `CompileOptionsProto` decoder: see `stablegraph::fuzzing::compile_options`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| stablegraph::fuzzing::compile_options(data));
