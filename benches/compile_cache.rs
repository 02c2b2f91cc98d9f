//! Compile cache benchmark: what the cache saves on a moderately large program.
//!
//! The program is a chain of `BLOCKS` blocks of `y = tanh(y @ w) + x` over `tensor<64x64xf32>`
//! (three ops each, about 200 in all). On the plugin that `Client::cpu()` resolves, it measures:
//!
//! 1. compile with the cache off (the compiler alone);
//! 2. cold: compile into an empty cache directory (compile, serialize, write the entry);
//! 3. warm from disk: a fresh client, same directory (read, check, deserialize; no compile);
//! 4. memory hit: the same client compiling the same text again.
//!
//! Client creation is outside every timed region. Each warm load is checked through the cache
//! counters to have come from disk, and the cold and warm executables' outputs are compared
//! bit for bit before anything is reported.
//!
//! The table goes to stdout, the same figures as JSON to `target/bench/compile_cache.json`.
//!
//! ```text
//! cargo bench --bench compile_cache
//! ```

mod common;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use common::{
    bench_dir, json_number, json_object, json_string, median, report_json, secs_since, sorted,
    write_report,
};
use stablegraph::runtime::{install, Client, CompileCache, Executable, Plugin};

const SIDE: usize = 64;
const BLOCKS: usize = 70;
const COLD_RUNS: usize = 3;
const WARM_RUNS: usize = 5;
const MEMORY_RUNS: usize = 1000;

/// The benchmark program: `BLOCKS` blocks of `y = tanh(y @ w) + x`, starting from `y = x`.
fn program() -> String {
    let t = format!("tensor<{SIDE}x{SIDE}xf32>");
    let mut text = format!("func.func @main(%x: {t}, %w: {t}) -> {t} {{\n");
    let mut y = "%x".to_string();
    for i in 0..BLOCKS {
        let _ = writeln!(
            text,
            "  %d{i} = stablehlo.dot_general {y}, %w, contracting_dims = [1] x [0] : ({t}, {t}) -> {t}"
        );
        let _ = writeln!(text, "  %t{i} = stablehlo.tanh %d{i} : {t}");
        let _ = writeln!(text, "  %y{i} = stablehlo.add %t{i}, %x : {t}");
        y = format!("%y{i}");
    }
    let _ = writeln!(text, "  return {y} : {t}\n}}");
    text
}

/// Runs `exe` on fixed inputs and returns the output.
fn run(client: &Client, exe: &Executable) -> Result<Vec<f32>> {
    let n = SIDE * SIDE;
    let x: Vec<f32> = (0..n).map(|i| ((i % 97) as f32 - 48.0) / 48.0).collect();
    let w: Vec<f32> = (0..n).map(|i| ((i % 89) as f32 - 44.0) / 440.0).collect();
    let dx = client.buffer_from_slice(&x, &[SIDE, SIDE])?;
    let dw = client.buffer_from_slice(&w, &[SIDE, SIDE])?;
    Ok(exe.execute(&[&dx, &dw])?[0].to_vec::<f32>()?)
}

/// One line of the report.
struct Figure {
    key: &'static str,
    label: &'static str,
    best_ms: f64,
    median_ms: f64,
    runs: usize,
}

impl Figure {
    /// A figure from the times of its runs, in seconds.
    fn new(key: &'static str, label: &'static str, times: Vec<f64>) -> Figure {
        let times = sorted(times);
        Figure {
            key,
            label,
            best_ms: times[0] * 1e3,
            median_ms: median(&times) * 1e3,
            runs: times.len(),
        }
    }

    /// The figure as a one-line JSON object.
    fn json(&self) -> String {
        json_object(&[
            ("key", json_string(self.key)),
            ("figure", json_string(self.label)),
            ("best_ms", json_number(self.best_ms)),
            ("median_ms", json_number(self.median_ms)),
            ("runs", self.runs.to_string()),
        ])
    }
}

/// An empty scratch directory under `target/bench`.
fn scratch(root: &Path, name: &str) -> Result<PathBuf> {
    let dir = root.join(format!("compile-cache-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// A fresh client of `plugin` with `cache` compiles `text`: the client, the executable and the
/// compile's seconds (client creation is not timed).
fn fresh_compile(
    plugin: &Plugin,
    cache: CompileCache,
    text: &str,
) -> Result<(Client, Executable, f64)> {
    let client = Client::new(plugin, &[])?;
    client.set_compile_cache(cache);
    let start = Instant::now();
    let exe = client.compile(text)?;
    let secs = secs_since(start);
    Ok((client, exe, secs))
}

fn main() -> Result<()> {
    let plugin = Plugin::load(install::resolve_cpu_plugin()?)?;
    let text = program();
    let bench_dir = bench_dir()?;
    let (uncached, reference) = uncached_compiles(&plugin, &text)?;
    let (cold, dir) = cold_compiles(&plugin, &text, &bench_dir, &reference)?;
    let entry_bytes: u64 = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    let (warm, memory) = warm_loads(&plugin, &text, &dir, &reference)?;
    for i in 0..COLD_RUNS {
        let _ = std::fs::remove_dir_all(
            bench_dir.join(format!("compile-cache-{}-cold{i}", std::process::id())),
        );
    }
    let figures = [
        Figure::new("compile_uncached", "compile, cache off", uncached),
        Figure::new("cold", "cold: compile + serialize + write", cold),
        Figure::new("warm_disk", "warm: fresh client, load from disk", warm),
        Figure::new("memory_hit", "memory hit, same client", memory),
    ];
    report(&plugin, &text, entry_bytes, &figures)
}

/// The compiler alone, [`COLD_RUNS`] times in fresh clients with the cache off: the times, and
/// the output of the first executable (the reference the cached ones must match).
fn uncached_compiles(plugin: &Plugin, text: &str) -> Result<(Vec<f64>, Vec<f32>)> {
    let mut uncached = Vec::new();
    let mut reference = None;
    for _ in 0..COLD_RUNS {
        let (client, exe, secs) = fresh_compile(plugin, CompileCache::disabled(), text)?;
        uncached.push(secs);
        reference.get_or_insert(run(&client, &exe)?);
    }
    Ok((uncached, reference.context("no compile ran")?))
}

/// Cold: [`COLD_RUNS`] compiles, each into an empty directory (serializing and writing the
/// entry), checked against `reference`; the times and the last directory.
fn cold_compiles(
    plugin: &Plugin,
    text: &str,
    bench_dir: &Path,
    reference: &[f32],
) -> Result<(Vec<f64>, PathBuf)> {
    let mut cold = Vec::new();
    let mut dir = PathBuf::new();
    for i in 0..COLD_RUNS {
        dir = scratch(bench_dir, &format!("cold{i}"))?;
        let (client, exe, secs) = fresh_compile(plugin, CompileCache::in_dir(&dir), text)?;
        cold.push(secs);
        let s = client.cache_stats();
        ensure!(s.compiles == 1 && s.disk_writes == 1, "cold run: {s:?}");
        ensure!(run(&client, &exe)? == reference, "cold executable differs");
    }
    Ok((cold, dir))
}

/// Warm: [`WARM_RUNS`] fresh clients load `dir`'s entry (checked to come from disk and to match
/// `reference`); then [`MEMORY_RUNS`] memory hits on the first of them. The times of both.
fn warm_loads(
    plugin: &Plugin,
    text: &str,
    dir: &Path,
    reference: &[f32],
) -> Result<(Vec<f64>, Vec<f64>)> {
    let mut warm = Vec::new();
    let mut memory = Vec::new();
    for _ in 0..WARM_RUNS {
        let (client, exe, secs) = fresh_compile(plugin, CompileCache::in_dir(dir), text)?;
        warm.push(secs);
        let s = client.cache_stats();
        ensure!(s.disk_hits == 1 && s.compiles == 0, "warm run: {s:?}");
        ensure!(
            run(&client, &exe)? == reference,
            "the executable loaded from disk computes something else"
        );
        if memory.is_empty() {
            for _ in 0..MEMORY_RUNS {
                let start = Instant::now();
                let again = client.compile(text)?;
                memory.push(secs_since(start));
                drop(again);
            }
            let s = client.cache_stats();
            ensure!(s.memory_hits == MEMORY_RUNS as u64, "memory runs: {s:?}");
        }
    }
    Ok((warm, memory))
}

/// Prints the header and the table of `figures` and writes them as JSON.
fn report(plugin: &Plugin, text: &str, entry_bytes: u64, figures: &[Figure; 4]) -> Result<()> {
    let (major, minor) = plugin.api_version();
    let header = [
        ("plugin", plugin.path().display().to_string()),
        ("api_version", format!("{major}.{minor}")),
        (
            "program",
            format!(
                "{BLOCKS} x (dot_general, tanh, add) on tensor<{SIDE}x{SIDE}xf32>, {} ops",
                3 * BLOCKS
            ),
        ),
        ("text_bytes", text.len().to_string()),
        ("entry_bytes", entry_bytes.to_string()),
    ];
    for (key, value) in &header {
        println!("{key:<12} {value}");
    }
    println!();
    println!(
        "{:<38} {:>10} {:>10} {:>5}",
        "figure", "best ms", "median ms", "runs"
    );
    for f in figures {
        println!(
            "{:<38} {:>10.3} {:>10.3} {:>5}",
            f.label, f.best_ms, f.median_ms, f.runs
        );
    }
    let speedup = figures[1].median_ms / figures[2].median_ms;
    println!("\nwarm from disk is {speedup:.0}x faster than cold (medians)");

    let json: Vec<String> = figures.iter().map(Figure::json).collect();
    let file = write_report("compile_cache.json", &report_json(&header, &[], &json))?;
    println!("wrote {}", file.display());
    Ok(())
}
