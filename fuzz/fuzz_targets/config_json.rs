//! `config.json` parsing, both forms: see `stablegraph::fuzzing::config_json`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| stablegraph::fuzzing::config_json(data));
