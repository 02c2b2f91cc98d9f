//! Random graphs built, lowered and compiled with the CPU plugin: see
//! `stablegraph::fuzzing::random_graph`.
#![no_main]

use std::sync::OnceLock;

use stablegraph::runtime::{Client, CompileCache};

/// One CPU client per process, with the on-disk compile cache off (fuzzed programs would fill it).
fn client() -> Option<&'static Client> {
    static CLIENT: OnceLock<Option<Client>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            let client = Client::cpu().ok()?;
            client.set_compile_cache(CompileCache::disabled());
            Some(client)
        })
        .as_ref()
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| stablegraph::fuzzing::random_graph(data, client()));
