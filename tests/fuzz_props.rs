//! Bounded versions of the fuzz targets in `fuzz/` (see `docs/fuzzing.md`): a
//! seeded SplitMix64 feeds random byte streams to the `stablegraph::fuzzing` entry points, and
//! every input a fuzzer ever crashed on (`tests/fuzz_regressions/<target>/`) is replayed.
//! Each entry point checks its own properties and panics on a violation.

mod common;

use std::path::Path;

use stablegraph::fuzzing;
use stablegraph::rng::SplitMix64;

use common::{uncached_client as client, uncached_client4 as client4};

/// Runs `target` on `count` random streams of up to `max_len` bytes (seeded by `seed`).
fn random_streams(seed: u64, count: usize, max_len: usize, mut target: impl FnMut(usize, &[u8])) {
    let mut rng = SplitMix64::new(seed);
    for k in 0..count {
        let len = rng.below(max_len + 1);
        let data = rng.bytes(len);
        target(k, &data);
    }
}

/// Every committed crash input of `target` (none is fine).
fn regressions(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz_regressions")
        .join(target);
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_file() {
                let bytes = std::fs::read(&path).expect("a readable regression input");
                out.push((path.display().to_string(), bytes));
            }
        }
    }
    out.sort();
    out
}

/// Replays the regression inputs of `target` through `run`, naming the file that fails.
fn replay(target: &str, run: impl Fn(&[u8])) {
    for (name, bytes) in regressions(target) {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&bytes)));
        assert!(result.is_ok(), "regression input {name} panicked");
    }
}

#[test]
fn config_json() {
    replay("config_json", fuzzing::config_json);
    random_streams(1, 3000, 400, |_, d| fuzzing::config_json(d));
}

#[test]
fn completion_request() {
    replay("completion_request", fuzzing::completion_request);
    random_streams(8, 3000, 300, |_, d| fuzzing::completion_request(d));
}

#[test]
fn checkpoint() {
    replay("checkpoint", fuzzing::checkpoint);
    random_streams(2, 1500, 600, |_, d| fuzzing::checkpoint(d));
}

#[test]
fn einsum_spec() {
    replay("einsum_spec", fuzzing::einsum_spec);
    random_streams(3, 600, 200, |_, d| fuzzing::einsum_spec(d));
}

#[test]
fn main_signature() {
    replay("main_signature", fuzzing::main_signature);
    random_streams(4, 3000, 300, |_, d| fuzzing::main_signature(d));
}

#[test]
fn compile_options() {
    replay("compile_options", fuzzing::compile_options);
    random_streams(5, 5000, 64, |_, d| fuzzing::compile_options(d));
}

#[test]
fn random_graph() {
    replay("random_graph", |d| fuzzing::random_graph(d, Some(client())));
    // Built and lowered: 400 graphs; compiled (and, when small, run): the first 30.
    random_streams(6, 400, 300, |k, d| {
        fuzzing::random_graph(d, (k < 30).then(client))
    });
}

#[test]
fn sharded_graph() {
    replay("sharded_graph", |d| {
        fuzzing::sharded_graph(d, Some(client4()))
    });
    random_streams(7, 300, 300, |_, d| {
        fuzzing::sharded_graph(d, Some(client4()))
    });
}
