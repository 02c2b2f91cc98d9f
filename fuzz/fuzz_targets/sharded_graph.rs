//! Random graphs over random meshes, compiled as SPMD programs with a four-device CPU client:
//! see `stablegraph::fuzzing::sharded_graph`.
#![no_main]

use std::sync::OnceLock;

use stablegraph::runtime::{Client, CompileCache};

/// One four-device CPU client per process, with the on-disk compile cache off.
fn client() -> Option<&'static Client> {
    static CLIENT: OnceLock<Option<Client>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            let client = Client::cpu_with_devices(4).ok()?;
            client.set_compile_cache(CompileCache::disabled());
            Some(client)
        })
        .as_ref()
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| stablegraph::fuzzing::sharded_graph(data, client()));
