//! OpenAI completion request bodies as the server reads them: see
//! `stablegraph::fuzzing::completion_request`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| stablegraph::fuzzing::completion_request(data));
