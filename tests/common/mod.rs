//! The one harness of the integration tests: the shared clients (one or four devices, with or
//! without the on-disk compile cache), seeded random inputs ([`random`]), host arrays
//! ([`arrays`]), the tolerance table and the comparison with a report ([`tol`]), the one-graph
//! checker [`Suite`] ([`suite`]), the tiny Mamba-2 shapes and models ([`mamba2`]), a
//! safetensors reader for fixtures, and a fake JAX CUDA install ([`cuda`]).
//!
//! A test file uses it with `mod common;` (a binary in a folder, `tests/NAME/main.rs`, with
//! `#[path = "../common/mod.rs"] mod common;`). Every binary compiles all of it and uses a part.
#![allow(dead_code, unused_imports)]

pub mod arrays;
pub mod cuda;
pub mod hybrid;
pub mod jax;
pub mod mamba1;
pub mod mamba2;
pub mod random;
pub mod suite;
pub mod tol;

use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;

use stablegraph::runtime::{Buffer, Client, CompileCache, Executable, ShardedBuffer};
use stablegraph::HostArray;

pub use arrays::*;
pub use mamba2::*;
pub use random::*;
pub use suite::*;
pub use tol::*;

/// A fresh directory under the system's temporary directory, named for `what` and the process,
/// removed with what is in it when dropped: test runs leave nothing behind.
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    /// Creates `stablegraph-{what}-{pid}` afresh (emptied if a crashed run left it).
    pub fn new(what: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("stablegraph-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

/// One CPU client per test binary (the plugin is resolved, and fetched on first use, as for users).
pub fn client() -> Client {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    CLIENT
        .get_or_init(|| Client::cpu().expect("the CPU plugin must load for the tests"))
        .clone()
}

/// `tests/fixtures/` of the source tree, or `$STABLEGRAPH_FIXTURES` when set (a test binary run
/// away from its source, as the GPU bundle runs them).
pub fn fixtures_dir() -> std::path::PathBuf {
    match std::env::var_os("STABLEGRAPH_FIXTURES") {
        Some(dir) => dir.into(),
        None => std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"),
    }
}

/// One 4-device CPU client per test binary, for programs over several devices.
pub fn client4() -> Client {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    CLIENT
        .get_or_init(|| Client::cpu_with_devices(4).expect("a 4-device CPU client"))
        .clone()
}

/// One CPU client per test binary with the on-disk compile cache off, for programs that would
/// only fill the cache (random ones) or whose compiles a test counts.
pub fn uncached_client() -> &'static Client {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let client = Client::cpu().expect("the CPU plugin must load for the tests");
        client.set_compile_cache(CompileCache::disabled());
        client
    })
}

/// As [`uncached_client`], with 4 devices.
pub fn uncached_client4() -> &'static Client {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let client = Client::cpu_with_devices(4).expect("a 4-device CPU client");
        client.set_compile_cache(CompileCache::disabled());
        client
    })
}

/// Compiles `mlir`, panicking with the plugin's message on failure.
pub fn compile(mlir: &str) -> Executable {
    client()
        .compile(mlir)
        .unwrap_or_else(|e| panic!("compile failed: {e}\n{mlir}"))
}

/// Uploads an f32 array.
pub fn f32_buffer(data: &[f32], dims: &[usize]) -> Buffer {
    client().buffer_from_slice(data, dims).unwrap()
}

/// Asserts `got` and `want` agree elementwise within `rtol * |want| + atol`.
pub fn assert_close(got: &[f32], want: &[f32], rtol: f32, atol: f32) {
    assert_eq!(got.len(), want.len(), "length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= rtol * w.abs() + atol,
            "element {i}: got {g}, want {w}"
        );
    }
}

/// Resident set size in kB, from /proc/self/status.
#[cfg(target_os = "linux")]
pub fn rss_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// The largest absolute difference between two equally long slices.
pub fn max_abs(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// The largest absolute difference between two host arrays of one size.
pub fn array_diff(a: &HostArray, b: &HostArray) -> f64 {
    max_abs(&a.to_f64_vec(), &b.to_f64_vec())
}

/// The largest absolute difference between two device arrays of one shape (downloaded and
/// gathered).
pub fn buffer_diff(a: &ShardedBuffer, b: &ShardedBuffer) -> f64 {
    array_diff(&a.to_host_array().unwrap(), &b.to_host_array().unwrap())
}

/// One tensor of a safetensors file, its values widened to f64 (exact for f32 and for integers
/// below 2^53).
pub struct Stored {
    pub dtype: safetensors::Dtype,
    pub shape: Vec<usize>,
    pub values: Vec<f64>,
}

/// The f32 and i64 tensors of a safetensors file by name, decoded here from their
/// little-endian bytes, independently of the library's loader.
pub fn read_safetensors(path: &Path) -> HashMap<String, Stored> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, t)| {
            let values = match t.dtype() {
                safetensors::Dtype::F32 => t
                    .data()
                    .chunks_exact(4)
                    .map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap())))
                    .collect(),
                safetensors::Dtype::I64 => t
                    .data()
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
                    .collect(),
                other => panic!("{name}: {other:?} is not read by the tests"),
            };
            let shape = t.shape().to_vec();
            (
                name,
                Stored {
                    dtype: t.dtype(),
                    shape,
                    values,
                },
            )
        })
        .collect()
}

/// The real tokens of each row of fixture case `k` (`case{k}.input_ids` where
/// `case{k}.attention_mask` is 1), in order.
pub fn fixture_prompts(cases: &HashMap<String, Stored>, k: usize) -> Vec<Vec<u32>> {
    let ids = &cases[&format!("case{k}.input_ids")];
    let mask = &cases[&format!("case{k}.attention_mask")].values;
    let (rows, len) = (ids.shape[0], ids.shape[1]);
    (0..rows)
        .map(|r| {
            (0..len)
                .filter(|&t| mask[r * len + t] == 1.0)
                .map(|t| ids.values[r * len + t] as u32)
                .collect()
        })
        .collect()
}

/// One fixture of every family: Mamba-2, Mamba-1, Falcon-Mamba, Bamba, Granite 4.0-H,
/// Nemotron-H, and of the transformers Llama (llama3 rotary scaling, biases), Mistral (a
/// sliding window shorter than the prompts) and Gemma 2.
pub fn one_fixture_per_family() -> Vec<std::path::PathBuf> {
    let mut dirs = vec![fixtures_dir().join("mamba2/tiny")];
    dirs.extend(["tiny", "falcon"].map(mamba1::fixture));
    dirs.extend(["bamba", "granite", "nemotron"].map(hybrid::fixture));
    dirs.extend(["llama", "mistral", "gemma2"].map(hybrid::transformer));
    dirs
}

/// Every fixture of the families other than Mamba-2: the hybrids', Mamba-1's, then the
/// transformers' (one per `model_type`).
pub fn other_family_fixtures() -> Vec<std::path::PathBuf> {
    let mut dirs: Vec<_> = ["bamba", "granite", "granite_dense", "nemotron"]
        .map(hybrid::fixture)
        .into();
    dirs.extend(["tiny", "falcon"].map(mamba1::fixture));
    dirs.extend(["llama", "qwen2", "qwen3", "mistral", "gemma2"].map(hybrid::transformer));
    dirs
}
