//! The compile cache: one compile per client for the same text and options, and serialized
//! executables on disk that fresh clients and other processes load instead of compiling. Every
//! observation is through `Client::cache_stats` (counters), never through timing.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};
use stablegraph::runtime::{CacheStats, Client, CompileCache, CompileOptions, Executable};

const N: usize = 8;

/// `a * b + a` over two `tensor<8xf32>`; `tag` makes distinct module texts.
fn program(tag: &str) -> String {
    format!(
        "// {tag}
func.func @main(%a: tensor<{N}xf32>, %b: tensor<{N}xf32>) -> tensor<{N}xf32> {{
  %0 = stablehlo.multiply %a, %b : tensor<{N}xf32>
  %1 = stablehlo.add %0, %a : tensor<{N}xf32>
  return %1 : tensor<{N}xf32>
}}"
    )
}

/// Runs `exe` (a [`program`]) and checks its result against the host.
fn check_runs(exe: &Executable) {
    let client = exe.client();
    let a: Vec<f32> = (0..N).map(|i| i as f32 * 0.5 - 1.0).collect();
    let b: Vec<f32> = (0..N).map(|i| 3.0 - i as f32).collect();
    let want: Vec<f32> = a.iter().zip(&b).map(|(a, b)| a * b + a).collect();
    let da = client.buffer_from_slice(&a, &[N]).unwrap();
    let db = client.buffer_from_slice(&b, &[N]).unwrap();
    let out = exe.execute(&[&da, &db]).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), want);
}

/// A new client of the test plugin whose cache is `cache`.
fn fresh_client(cache: CompileCache) -> Client {
    let client = Client::new(common::client().plugin(), &[]).unwrap();
    client.set_compile_cache(cache);
    client
}

/// An empty directory for one test.
fn empty_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("compile-cache-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// Every file in `dir`, sorted.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

/// The one entry in `dir`; fails if there are other files.
fn only_entry(dir: &Path) -> PathBuf {
    let files = files(dir);
    assert_eq!(files.len(), 1, "expected exactly one file: {files:?}");
    assert_eq!(files[0].extension().unwrap(), "pjrt", "{files:?}");
    files[0].clone()
}

/// Compiles and runs `mlir` on a fresh client with the disk cache in `dir`, returning its stats.
fn compile_fresh(dir: &Path, mlir: &str) -> CacheStats {
    let client = fresh_client(CompileCache::in_dir(dir));
    let exe = client.compile(mlir).unwrap();
    check_runs(&exe);
    client.cache_stats()
}

fn stats(memory_hits: u64, disk_hits: u64, compiles: u64, disk_writes: u64) -> CacheStats {
    CacheStats {
        memory_hits,
        disk_hits,
        compiles,
        disk_writes,
        disk_rejects: 0,
        disk_errors: 0,
    }
}

#[test]
fn the_same_text_compiles_once_per_client() {
    let client = fresh_client(CompileCache::memory_only());
    let text = program("memory");
    let first = client.compile(&text).unwrap();
    let second = client.compile(&text).unwrap();
    assert_eq!(client.cache_stats(), stats(1, 0, 1, 0));
    check_runs(&first);
    drop(first);
    // The cache, not the caller, keeps the program: dropping every executable keeps the hit.
    drop(second);
    check_runs(&client.compile(&text).unwrap());
    assert_eq!(client.cache_stats(), stats(2, 0, 1, 0));
}

#[test]
fn memory_keeps_the_recent_programs_and_those_still_held() {
    // 64 programs stay in memory beyond those held: after 300 others, the first (dropped by
    // its caller) compiles again, the one still held and the most recent are memory hits.
    let client = fresh_client(CompileCache::memory_only());
    let first = program("first");
    drop(client.compile(&first).unwrap());
    let held = client.compile(&program("held")).unwrap();
    for i in 0..300 {
        drop(client.compile(&program(&format!("other {i}"))).unwrap());
    }
    let before = client.cache_stats();
    assert_eq!((before.compiles, before.memory_hits), (302, 0));
    check_runs(&client.compile(&program("held")).unwrap());
    check_runs(&client.compile(&program("other 299")).unwrap());
    assert_eq!(client.cache_stats().memory_hits, 2);
    check_runs(&client.compile(&first).unwrap());
    assert_eq!(client.cache_stats().compiles, 303);
    drop(held);
}

#[test]
fn a_fresh_client_loads_from_disk_without_compiling() {
    let dir = empty_dir("fresh");
    let text = program("fresh");
    assert_eq!(compile_fresh(&dir, &text), stats(0, 0, 1, 1));
    only_entry(&dir);
    assert_eq!(compile_fresh(&dir, &text), stats(0, 1, 0, 0));
    let _ = fs::remove_dir_all(&dir);
}

/// Damages the one entry in `dir` with `damage`, then checks that a fresh client refuses it,
/// compiles, and rewrites an entry that the next fresh client loads.
fn check_recovers(name: &str, damage: impl Fn(&Path)) {
    let dir = empty_dir(name);
    let text = program(name);
    compile_fresh(&dir, &text);
    let entry = only_entry(&dir);
    damage(&entry);
    let recovered = compile_fresh(&dir, &text);
    assert_eq!(
        recovered,
        CacheStats {
            disk_rejects: 1,
            ..stats(0, 0, 1, 1)
        },
        "{name}"
    );
    assert_eq!(only_entry(&dir), entry);
    assert_eq!(compile_fresh(&dir, &text), stats(0, 1, 0, 0), "{name}");
    let _ = fs::remove_dir_all(&dir);
}

/// The entry header's length; the payload follows it (see `runtime::cache`).
const HEADER_LEN: usize = 88;

#[test]
fn a_same_length_corruption_is_recompiled() {
    check_recovers("corrupt", |entry| {
        let mut bytes = fs::read(entry).unwrap();
        let len = bytes.len();
        assert!(len > HEADER_LEN + 64, "{len}");
        for b in &mut bytes[len / 2..len / 2 + 16] {
            *b ^= 0x5a;
        }
        fs::write(entry, &bytes).unwrap();
        assert_eq!(fs::metadata(entry).unwrap().len() as usize, len);
    });
}

#[test]
fn a_truncated_entry_is_recompiled() {
    check_recovers("truncated", |entry| {
        let bytes = fs::read(entry).unwrap();
        fs::write(entry, &bytes[..bytes.len() / 2]).unwrap();
    });
}

#[test]
fn a_garbage_file_is_recompiled() {
    check_recovers("garbage", |entry| {
        fs::write(entry, "this is not a serialized executable\n".repeat(10)).unwrap();
    });
}

#[test]
fn an_empty_file_is_recompiled() {
    check_recovers("empty", |entry| fs::write(entry, b"").unwrap());
}

#[test]
fn a_well_formed_entry_the_plugin_refuses_is_recompiled() {
    // The header checks pass (its SHA-256 is recomputed), so the plugin itself sees the garbage.
    check_recovers("refused", |entry| {
        let mut bytes = fs::read(entry).unwrap();
        for (i, b) in bytes[HEADER_LEN..].iter_mut().enumerate() {
            *b = (i * 131 % 251) as u8;
        }
        let digest: [u8; 32] = Sha256::digest(&bytes[HEADER_LEN..]).into();
        bytes[HEADER_LEN - 32..HEADER_LEN].copy_from_slice(&digest);
        fs::write(entry, &bytes).unwrap();
    });
}

#[test]
fn a_disabled_cache_always_compiles_and_writes_nothing() {
    let dir = empty_dir("disabled");
    let client = fresh_client(CompileCache {
        enabled: false,
        dir: Some(dir.clone()),
    });
    let text = program("disabled");
    check_runs(&client.compile(&text).unwrap());
    check_runs(&client.compile(&text).unwrap());
    assert_eq!(client.cache_stats(), stats(0, 0, 2, 0));
    assert!(files(&dir).is_empty(), "{:?}", files(&dir));
    // Nothing on disk either for a disk-less, enabled cache.
    let client = fresh_client(CompileCache::disabled());
    client.compile(&text).unwrap();
    assert_eq!(client.cache_stats(), stats(0, 0, 1, 0));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn different_options_or_text_make_different_entries() {
    let dir = empty_dir("keys");
    let client = fresh_client(CompileCache::in_dir(&dir));
    let text = program("keys");
    client.compile(&text).unwrap();
    let pinned = CompileOptions {
        device_ordinal: Some(0),
        ..CompileOptions::default()
    };
    check_runs(&client.compile_with(&text, &pinned).unwrap());
    check_runs(&client.compile(&program("keys, other text")).unwrap());
    assert_eq!(client.cache_stats(), stats(0, 0, 3, 3));
    assert_eq!(files(&dir).len(), 3);
    // Each is found again under its own key.
    client.compile_with(&text, &pinned).unwrap();
    client.compile(&text).unwrap();
    assert_eq!(client.cache_stats(), stats(2, 0, 3, 3));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn concurrent_clients_share_one_directory_safely() {
    let dir = empty_dir("concurrent");
    let text = program("concurrent");
    let barrier = std::sync::Barrier::new(4);
    let all: Vec<CacheStats> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let client = fresh_client(CompileCache::in_dir(&dir));
                    barrier.wait();
                    let exe = client.compile(&text).unwrap();
                    check_runs(&exe);
                    client.cache_stats()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for s in &all {
        assert_eq!(s.compiles + s.disk_hits, 1, "{s:?}");
        assert_eq!(s.disk_rejects + s.disk_errors, 0, "{s:?}");
    }
    only_entry(&dir);
    assert_eq!(compile_fresh(&dir, &text), stats(0, 1, 0, 0));
    let _ = fs::remove_dir_all(&dir);
}

/// Where the parent test tells [`child_process_helper`] to find the cache.
const CHILD_DIR_VAR: &str = "STABLEGRAPH_TEST_COMPILE_CACHE_CHILD_DIR";

#[test]
fn a_second_process_loads_from_disk() {
    let dir = empty_dir("process");
    assert_eq!(compile_fresh(&dir, &program("process")), stats(0, 0, 1, 1));
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "child_process_helper",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_DIR_VAR, &dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("stats memory_hits=0 disk_hits=1 compiles=0 disk_rejects=0 ran=ok"),
        "{stdout}"
    );
    let _ = fs::remove_dir_all(&dir);
}

/// Run by [`a_second_process_loads_from_disk`] in a child process; does nothing on its own.
#[test]
#[ignore = "a helper of a_second_process_loads_from_disk, run in a child process"]
fn child_process_helper() {
    let Some(dir) = std::env::var_os(CHILD_DIR_VAR) else {
        return;
    };
    let client = Client::cpu().unwrap();
    client.set_compile_cache(CompileCache::in_dir(dir));
    let exe = client.compile(&program("process")).unwrap();
    check_runs(&exe);
    let s = client.cache_stats();
    println!(
        "stats memory_hits={} disk_hits={} compiles={} disk_rejects={} ran=ok",
        s.memory_hits, s.disk_hits, s.compiles, s.disk_rejects
    );
}
