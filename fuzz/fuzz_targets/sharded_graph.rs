//! Random graphs over random meshes, compiled as SPMD programs with a four-device CPU client:
//! see `stablegraph::fuzzing::sharded_graph`.
#![no_main]

use std::sync::OnceLock;

use stablegraph::runtime::{resolve_cpu_plugin, Client, CompileCache, Plugin, Value};

/// One four-device CPU client per process, with the on-disk compile cache off.
fn client() -> Option<&'static Client> {
    static CLIENT: OnceLock<Option<Client>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            let plugin = Plugin::load(resolve_cpu_plugin().ok()?).ok()?;
            let client = Client::new(&plugin, &[("cpu_device_count", Value::Int64(4))]).ok()?;
            client.set_compile_cache(CompileCache::disabled());
            Some(client)
        })
        .as_ref()
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| stablegraph::fuzzing::sharded_graph(data, client()));
