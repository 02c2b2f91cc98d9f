//! The compile cache: each client compiles a given module text with given options once, and a
//! per-user directory keeps serialized executables so that later processes load them instead of
//! compiling.
//!
//! An entry is keyed by the SHA-256 of a format version, the module text, the encoded
//! `CompileOptionsProto` and the identity of the plugin and client that compiled it (the plugin
//! file's canonical path, size and modification time, its PJRT API version and attributes, the
//! platform name and version, the number of devices, and the `XLA_FLAGS` environment variable,
//! which XLA reads compiler flags from). Changing any of them makes a new key, so an entry is
//! never used by another plugin build or under other flags.
//!
//! Entry files are `<dir>/<hex key>.pjrt`: an 88-byte header (magic, format version, the key, the
//! payload length and the payload's SHA-256) and then the bytes of `PJRT_Executable_Serialize`. A
//! file that fails any check, or that the plugin refuses to deserialize, is a miss: the program
//! is compiled and the entry rewritten. Entries are written to a unique temporary file in the same
//! directory and renamed into place, so a reader (in any process) sees a whole file or none, and
//! concurrent writers of one key each publish a complete, equivalent entry. Nothing the disk cache
//! does can fail a compile: its errors are counted in [`CacheStats`] and, with
//! `STABLEGRAPH_CACHE_DEBUG=1`, described on stderr.
//!
//! Anyone who can write the cache directory can make this process run code of their choosing, as
//! with any cache of compiled code; the default directory is private to the user and directories
//! the cache creates are made `0700`.

use std::collections::HashMap;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};

use super::api::pjrt_call;
use super::client::Client;
use super::executable::LoadedProgram;
use super::ffi;
use crate::error::{Error, Result};

/// Bumped whenever the key derivation or the entry layout changes; old entries then never match.
const FORMAT_VERSION: u32 = 1;
/// The first bytes of every entry file.
const MAGIC: [u8; 8] = *b"SGXLAEX\0";
/// Magic, version, reserved word, key, payload length, payload SHA-256.
const HEADER_LEN: usize = 8 + 4 + 4 + 32 + 8 + 32;
/// The extension of entry files.
const ENTRY_EXTENSION: &str = "pjrt";

/// A cache key: SHA-256 of what determines the compiled program.
type Key = [u8; 32];

/// The programs a client keeps in memory beyond those its callers still hold: past this, the
/// least recently used ones that nobody holds are dropped (their machine code unmapped; the
/// disk cache still has them). Without a bound, a process that builds many programs over its
/// life (a test binary, a server meeting new shapes) runs out of memory mappings: XLA's CPU
/// code takes from two (a tiny program) to hundreds (a model's) per program, and Linux allows
/// 65,530 by default. A model keeps the programs it uses itself, so this bounds only what a
/// new model of the same shapes would find already compiled.
const MEMORY_PROGRAMS: usize = 64;

/// How a client caches compiled programs. [`Client`] starts from [`CompileCache::from_env`];
/// [`Client::set_compile_cache`] changes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileCache {
    /// Whether to cache at all. When `false`, every compile runs the compiler and nothing is read
    /// or written, in memory or on disk.
    pub enabled: bool,
    /// The directory of serialized executables, or `None` to cache only in memory (per client).
    pub dir: Option<PathBuf>,
}

impl CompileCache {
    /// The configuration given by the environment:
    ///
    /// - `STABLEGRAPH_CACHE`: `0`, `off`, `false` or `no` turns caching off; `memory` keeps only
    ///   the in-process cache; anything else (or unset) caches in memory and on disk;
    /// - `STABLEGRAPH_CACHE_DIR`: the directory, by default `$XDG_CACHE_HOME/stablegraph/executables`,
    ///   else `$HOME/.cache/stablegraph/executables` (memory only when neither is set).
    pub fn from_env() -> CompileCache {
        let mode = std::env::var("STABLEGRAPH_CACHE").unwrap_or_default();
        let mode = mode.trim().to_ascii_lowercase();
        if matches!(mode.as_str(), "0" | "off" | "false" | "no") {
            return CompileCache::disabled();
        }
        if mode == "memory" {
            return CompileCache::memory_only();
        }
        CompileCache {
            enabled: true,
            dir: default_dir(),
        }
    }

    /// No caching.
    pub fn disabled() -> CompileCache {
        CompileCache {
            enabled: false,
            dir: None,
        }
    }

    /// The in-process cache only.
    pub fn memory_only() -> CompileCache {
        CompileCache {
            enabled: true,
            dir: None,
        }
    }

    /// The in-process cache and a disk cache in `dir` (created when first written).
    pub fn in_dir(dir: impl Into<PathBuf>) -> CompileCache {
        CompileCache {
            enabled: true,
            dir: Some(dir.into()),
        }
    }
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// `STABLEGRAPH_CACHE_DIR`, else the per-user default.
fn default_dir() -> Option<PathBuf> {
    env_path("STABLEGRAPH_CACHE_DIR")
        .or_else(|| env_path("XDG_CACHE_HOME").map(|d| d.join("stablegraph").join("executables")))
        .or_else(|| {
            env_path("HOME").map(|h| h.join(".cache").join("stablegraph").join("executables"))
        })
}

/// Counters of what a client's compile cache did, since the client was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Compiles answered from this client's memory.
    pub memory_hits: u64,
    /// Compiles answered by loading a serialized executable from disk.
    pub disk_hits: u64,
    /// Times the compiler ran (including failed compiles).
    pub compiles: u64,
    /// Entries written to disk.
    pub disk_writes: u64,
    /// Entries found on disk but refused: stale, truncated, corrupt, or refused by the plugin.
    pub disk_rejects: u64,
    /// Disk cache operations that failed for another reason (unreadable file, failed write); the
    /// compile went on without the cache.
    pub disk_errors: u64,
}

#[derive(Default)]
struct Counters {
    memory_hits: AtomicU64,
    disk_hits: AtomicU64,
    compiles: AtomicU64,
    disk_writes: AtomicU64,
    disk_rejects: AtomicU64,
    disk_errors: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A client's cache state: its configuration, its compiled programs and its counters.
pub(crate) struct ClientCache {
    config: Mutex<CompileCache>,
    /// Each program with the tick of its last use.
    programs: Mutex<HashMap<Key, (Arc<LoadedProgram>, u64)>>,
    /// Counts uses, for the ticks.
    ticks: AtomicU64,
    identity: OnceLock<Key>,
    counters: Counters,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl ClientCache {
    /// A cache configured by the environment.
    pub(crate) fn from_env() -> ClientCache {
        ClientCache {
            config: Mutex::new(CompileCache::from_env()),
            programs: Mutex::new(HashMap::new()),
            ticks: AtomicU64::new(0),
            identity: OnceLock::new(),
            counters: Counters::default(),
        }
    }

    /// Drops every cached program; the client calls this before it destroys itself.
    pub(crate) fn clear(&self) {
        // Take the map out first, so the programs are destroyed without holding the lock.
        let programs = std::mem::take(&mut *lock(&self.programs));
        drop(programs);
    }
}

impl Client {
    /// What this client's compile cache has done so far.
    pub fn cache_stats(&self) -> CacheStats {
        let c = &self.inner.compile_cache.counters;
        CacheStats {
            memory_hits: c.memory_hits.load(Ordering::Relaxed),
            disk_hits: c.disk_hits.load(Ordering::Relaxed),
            compiles: c.compiles.load(Ordering::Relaxed),
            disk_writes: c.disk_writes.load(Ordering::Relaxed),
            disk_rejects: c.disk_rejects.load(Ordering::Relaxed),
            disk_errors: c.disk_errors.load(Ordering::Relaxed),
        }
    }

    /// This client's compile cache configuration.
    pub fn compile_cache(&self) -> CompileCache {
        lock(&self.inner.compile_cache.config).clone()
    }

    /// Changes how this client caches compiles from now on. Programs it already holds in memory
    /// stay there unless `cache` is disabled, which empties the in-memory cache.
    pub fn set_compile_cache(&self, cache: CompileCache) {
        let enabled = cache.enabled;
        *lock(&self.inner.compile_cache.config) = cache;
        if !enabled {
            self.inner.compile_cache.clear();
        }
    }
}

/// Says `message` on stderr when `STABLEGRAPH_CACHE_DEBUG` is set.
fn note(message: impl FnOnce() -> String) {
    static DEBUG: OnceLock<bool> = OnceLock::new();
    let debug = *DEBUG.get_or_init(|| {
        std::env::var("STABLEGRAPH_CACHE_DEBUG")
            .map(|v| !matches!(v.trim(), "" | "0" | "false" | "no" | "off"))
            .unwrap_or(false)
    });
    if debug {
        eprintln!("stablegraph: compile cache: {}", message());
    }
}

/// Compiles `mlir` with the encoded `options` through `client`'s cache: memory, then disk, then
/// `compile`, whose result is stored in both.
pub(crate) fn compile_cached(
    client: &Client,
    mlir: &str,
    options: &[u8],
    compile: impl FnOnce() -> Result<Arc<LoadedProgram>>,
) -> Result<Arc<LoadedProgram>> {
    let cache = &client.inner.compile_cache;
    let counters = &cache.counters;
    let config = client.compile_cache();
    if !config.enabled {
        bump(&counters.compiles);
        return compile();
    }
    let identity = cache.identity.get_or_init(|| client_identity(client));
    let key = key(identity, mlir, options);
    if let Some((program, used)) = lock(&cache.programs).get_mut(&key) {
        bump(&counters.memory_hits);
        *used = cache.ticks.fetch_add(1, Ordering::Relaxed);
        return Ok(program.clone());
    }
    let entry = config.dir.as_ref().map(|dir| entry_path(dir, &key));
    if let Some(path) = &entry {
        match load(client, path, &key, mlir) {
            Ok(Some(program)) => {
                bump(&counters.disk_hits);
                return Ok(remember(cache, key, program));
            }
            Ok(None) => {}
            Err(Miss::Rejected(why)) => {
                bump(&counters.disk_rejects);
                note(|| format!("refused {}: {why}; recompiling", path.display()));
            }
            Err(Miss::Io(why)) => {
                bump(&counters.disk_errors);
                note(|| format!("cannot read {}: {why}; recompiling", path.display()));
            }
        }
    }
    bump(&counters.compiles);
    let program = compile()?;
    if let Some(path) = &entry {
        match program
            .serialize(client)
            .and_then(|payload| store(path, &key, &payload))
        {
            Ok(()) => bump(&counters.disk_writes),
            Err(e) => {
                bump(&counters.disk_errors);
                note(|| format!("cannot write {}: {e}", path.display()));
                // Whatever was there (perhaps a refused entry) should not be read again.
                let _ = fs::remove_file(path);
            }
        }
    }
    Ok(remember(cache, key, program))
}

/// Keeps `program` in memory under `key`, unless another thread got there first, and returns the
/// kept one; past [`MEMORY_PROGRAMS`], drops the least recently used programs nobody holds.
fn remember(cache: &ClientCache, key: Key, program: Arc<LoadedProgram>) -> Arc<LoadedProgram> {
    let tick = cache.ticks.fetch_add(1, Ordering::Relaxed);
    let mut programs = lock(&cache.programs);
    let kept = programs.entry(key).or_insert((program, tick)).0.clone();
    let mut dropped = Vec::new();
    if programs.len() > MEMORY_PROGRAMS {
        let mut idle: Vec<(u64, Key)> = programs
            .iter()
            .filter(|(_, (p, _))| Arc::strong_count(p) == 1)
            .map(|(k, (_, used))| (*used, *k))
            .collect();
        idle.sort_unstable();
        let excess = programs.len() - MEMORY_PROGRAMS;
        for (_, k) in idle.into_iter().take(excess) {
            dropped.extend(programs.remove(&k));
        }
    }
    drop(programs);
    // Destroyed without holding the lock.
    drop(dropped);
    kept
}

/// Why a disk entry was not used.
enum Miss {
    /// The file is not a valid entry for this key, or the plugin refused it.
    Rejected(String),
    /// The file could not be read.
    Io(std::io::Error),
}

/// Loads the entry at `path`: `Ok(None)` when there is none.
fn load(
    client: &Client,
    path: &Path,
    key: &Key,
    mlir: &str,
) -> std::result::Result<Option<Arc<LoadedProgram>>, Miss> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Miss::Io(e)),
    };
    let payload = decode_entry(&bytes, key).map_err(Miss::Rejected)?;
    deserialize(client, payload, mlir)
        .map(Some)
        .map_err(|e| Miss::Rejected(format!("the plugin refused it: {e}")))
}

/// Loads a serialized executable onto `client`'s devices.
fn deserialize(client: &Client, payload: &[u8], mlir: &str) -> Result<Arc<LoadedProgram>> {
    let mut args = ffi::PJRT_Executable_DeserializeAndLoad_Args::new();
    args.client = client.raw();
    args.serialized_executable = payload.as_ptr().cast();
    args.serialized_executable_size = payload.len();
    // Null overridden options: use the options stored in the executable (they are in the key).
    // SAFETY: a live client; the payload is valid for its length and only read during the call.
    unsafe { pjrt_call!(client.api(), PJRT_Executable_DeserializeAndLoad, &mut args) }?;
    LoadedProgram::new(client, args.loaded_executable, mlir)
}

/// Writes the entry for `key` to `path` atomically: a unique temporary file in the same
/// directory, renamed over `path`.
fn store(path: &Path, key: &Key, payload: &[u8]) -> Result<()> {
    static SEQUENCE: AtomicU64 = AtomicU64::new(0);
    let dir = path
        .parent()
        .ok_or_else(|| Error::InvalidArgument(format!("{} has no parent", path.display())))?;
    create_private_dir(dir)
        .map_err(|e| Error::io(format!("creating the compile cache {}", dir.display()), e))?;
    let temp = dir.join(format!(
        ".{}.{}-{}.tmp",
        hex(key),
        std::process::id(),
        SEQUENCE.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)?;
        file.write_all(&encode_header(key, payload))?;
        file.write_all(payload)?;
        drop(file);
        fs::rename(&temp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&temp);
    }
    written.map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// `<dir>/<hex key>.pjrt`.
fn entry_path(dir: &Path, key: &Key) -> PathBuf {
    dir.join(format!("{}.{ENTRY_EXTENSION}", hex(key)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256(bytes: &[u8]) -> Key {
    Sha256::digest(bytes).into()
}

/// The header that precedes `payload` in the entry for `key`.
fn encode_header(key: &Key, payload: &[u8]) -> Vec<u8> {
    let mut header = Vec::with_capacity(HEADER_LEN);
    header.extend_from_slice(&MAGIC);
    header.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    header.extend_from_slice(&0u32.to_le_bytes());
    header.extend_from_slice(key);
    header.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    header.extend_from_slice(&sha256(payload));
    header
}

/// Checks an entry file's bytes against `key` and returns its payload, or says what is wrong.
fn decode_entry<'a>(bytes: &'a [u8], key: &Key) -> std::result::Result<&'a [u8], String> {
    if bytes.len() < HEADER_LEN {
        return Err(format!(
            "truncated: {} bytes, shorter than the {HEADER_LEN}-byte header",
            bytes.len()
        ));
    }
    let (header, payload) = bytes.split_at(HEADER_LEN);
    if header[..8] != MAGIC {
        return Err("not a stablegraph cache entry (wrong magic)".into());
    }
    let field = |at: usize, n: usize| &header[at..at + n];
    let version = u32::from_le_bytes(field(8, 4).try_into().unwrap_or_default());
    if version != FORMAT_VERSION {
        return Err(format!(
            "stale: format version {version}, this build writes {FORMAT_VERSION}"
        ));
    }
    if field(16, 32) != key {
        return Err("the entry is for another key".into());
    }
    let length = u64::from_le_bytes(field(48, 8).try_into().unwrap_or_default());
    if length != payload.len() as u64 {
        return Err(format!(
            "truncated or extended: the header says {length} payload bytes, the file has {}",
            payload.len()
        ));
    }
    if field(56, 32) != sha256(payload) {
        return Err("corrupt: the payload's SHA-256 does not match the header".into());
    }
    Ok(payload)
}

/// Appends `bytes` with its length, so that concatenated fields cannot be confused.
fn put(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_le_bytes());
    hasher.update(bytes);
}

/// A digest of everything about `client` and its plugin that decides what a compile produces.
fn client_identity(client: &Client) -> Key {
    let plugin = client.plugin();
    let mut h = Sha256::new();
    put(&mut h, plugin.path().as_os_str().as_encoded_bytes());
    let (size, mtime) = match fs::metadata(plugin.path()) {
        Ok(m) => (
            m.len(),
            m.modified()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos()),
        ),
        Err(_) => (0, 0),
    };
    put(&mut h, &size.to_le_bytes());
    put(&mut h, &mtime.to_le_bytes());
    let (major, minor) = plugin.api_version();
    put(&mut h, format!("{major}.{minor}").as_bytes());
    for (name, value) in plugin.attributes() {
        put(&mut h, format!("{name}={value:?}").as_bytes());
    }
    put(
        &mut h,
        client.platform_name().unwrap_or_default().as_bytes(),
    );
    put(
        &mut h,
        client.platform_version().unwrap_or_default().as_bytes(),
    );
    put(&mut h, &(client.device_count() as u64).to_le_bytes());
    // XLA reads compiler flags from this variable too: an executable compiled under other
    // flags is another executable.
    put(
        &mut h,
        std::env::var_os("XLA_FLAGS")
            .unwrap_or_default()
            .as_encoded_bytes(),
    );
    h.finalize().into()
}

/// The cache key of `mlir` compiled with `options` by a client of the given identity.
fn key(identity: &Key, mlir: &str, options: &[u8]) -> Key {
    let mut h = Sha256::new();
    put(&mut h, b"stablegraph compile cache");
    put(&mut h, &FORMAT_VERSION.to_le_bytes());
    put(&mut h, identity);
    put(&mut h, mlir.as_bytes());
    put(&mut h, options);
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: Key = [7; 32];

    fn entry(payload: &[u8]) -> Vec<u8> {
        let mut bytes = encode_header(&KEY, payload);
        bytes.extend_from_slice(payload);
        bytes
    }

    #[test]
    fn an_entry_reads_back_its_payload() {
        let bytes = entry(b"serialized executable");
        assert_eq!(bytes.len(), HEADER_LEN + 21);
        assert_eq!(
            decode_entry(&bytes, &KEY),
            Ok(&b"serialized executable"[..])
        );
    }

    #[test]
    fn every_damaged_entry_is_refused_with_its_reason() {
        let good = entry(b"serialized executable");
        let refuse = |bytes: &[u8], key: &Key, why: &str| {
            let err = decode_entry(bytes, key).unwrap_err();
            assert!(err.contains(why), "{err:?} should mention {why:?}");
        };
        refuse(&good[..HEADER_LEN - 1], &KEY, "truncated");
        refuse(&good[..good.len() - 1], &KEY, "truncated");
        refuse(b"", &KEY, "truncated");
        let mut extended = good.clone();
        extended.push(0);
        refuse(&extended, &KEY, "extended");
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 0xff;
        refuse(&flipped, &KEY, "corrupt");
        let mut magic = good.clone();
        magic[0] ^= 1;
        refuse(&magic, &KEY, "magic");
        let mut stale = good.clone();
        stale[8] = stale[8].wrapping_add(1);
        refuse(&stale, &KEY, "stale");
        refuse(&good, &[8; 32], "another key");
        refuse(&[0x55; 200], &KEY, "magic");
    }

    #[test]
    fn keys_separate_text_options_and_identity() {
        let id = [1; 32];
        let base = key(&id, "module", b"opts");
        assert_eq!(base, key(&id, "module", b"opts"));
        assert_ne!(base, key(&id, "module2", b"opts"));
        assert_ne!(base, key(&id, "module", b"opts2"));
        assert_ne!(base, key(&[2; 32], "module", b"opts"));
        // Length prefixes: moving a byte from the text to the options changes the key.
        assert_ne!(key(&id, "ab", b"c"), key(&id, "a", b"bc"));
    }

    #[test]
    fn store_publishes_one_whole_file_and_no_temporaries() {
        let dir = std::env::temp_dir().join(format!(
            "stablegraph-cache-unit-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&dir);
        let path = entry_path(&dir.join("nested"), &KEY);
        store(&path, &KEY, b"first").unwrap();
        store(&path, &KEY, b"second").unwrap();
        let bytes = fs::read(&path).unwrap();
        assert_eq!(decode_entry(&bytes, &KEY), Ok(&b"second"[..]));
        let names: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        let _ = fs::remove_dir_all(&dir);
    }
}
