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

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use stablegraph::runtime::{install, Client, CompileCache, Plugin};

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
fn run(client: &Client, exe: &stablegraph::runtime::Executable) -> Result<Vec<f32>> {
    let n = SIDE * SIDE;
    let x: Vec<f32> = (0..n).map(|i| ((i % 97) as f32 - 48.0) / 48.0).collect();
    let w: Vec<f32> = (0..n).map(|i| ((i % 89) as f32 - 44.0) / 440.0).collect();
    let dx = client.buffer_from_slice(&x, &[SIDE, SIDE])?;
    let dw = client.buffer_from_slice(&w, &[SIDE, SIDE])?;
    Ok(exe.execute(&[&dx, &dw])?[0].to_vec::<f32>()?)
}

fn sorted(mut times: Vec<Duration>) -> Vec<Duration> {
    times.sort();
    times
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
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
    fn new(key: &'static str, label: &'static str, times: Vec<Duration>) -> Figure {
        let times = sorted(times);
        Figure {
            key,
            label,
            best_ms: ms(times[0]),
            median_ms: ms(times[times.len() / 2]),
            runs: times.len(),
        }
    }
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

fn report_json(header: &[(&str, String)], figures: &[Figure]) -> String {
    let mut json = String::from("{\n");
    for (key, value) in header {
        let _ = writeln!(json, "  {}: {},", json_string(key), json_string(value));
    }
    json.push_str("  \"figures\": [\n");
    for (i, f) in figures.iter().enumerate() {
        let comma = if i + 1 < figures.len() { "," } else { "" };
        let _ = writeln!(
            json,
            "    {{\"key\": {}, \"figure\": {}, \"best_ms\": {}, \"median_ms\": {}, \"runs\": {}}}{comma}",
            json_string(f.key),
            json_string(f.label),
            f.best_ms,
            f.median_ms,
            f.runs
        );
    }
    json.push_str("  ]\n}\n");
    json
}

/// An empty scratch directory under `target/bench`.
fn scratch(root: &Path, name: &str) -> Result<PathBuf> {
    let dir = root.join(format!("compile-cache-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn main() -> Result<()> {
    let plugin = Plugin::load(install::resolve_cpu_plugin()?)?;
    let text = program();
    let bench_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("bench");
    std::fs::create_dir_all(&bench_dir)
        .with_context(|| format!("creating {}", bench_dir.display()))?;

    // The compiler alone.
    let mut uncached = Vec::new();
    let mut reference = None;
    for _ in 0..COLD_RUNS {
        let client = Client::new(&plugin, &[])?;
        client.set_compile_cache(CompileCache::disabled());
        let start = Instant::now();
        let exe = client.compile(&text)?;
        uncached.push(start.elapsed());
        reference.get_or_insert(run(&client, &exe)?);
    }
    let reference = reference.context("no compile ran")?;

    // Cold: compile into an empty directory, serialize and write the entry.
    let mut cold = Vec::new();
    let mut dir = PathBuf::new();
    for i in 0..COLD_RUNS {
        dir = scratch(&bench_dir, &format!("cold{i}"))?;
        let client = Client::new(&plugin, &[])?;
        client.set_compile_cache(CompileCache::in_dir(&dir));
        let start = Instant::now();
        let exe = client.compile(&text)?;
        cold.push(start.elapsed());
        let s = client.cache_stats();
        ensure!(s.compiles == 1 && s.disk_writes == 1, "cold run: {s:?}");
        ensure!(run(&client, &exe)? == reference, "cold executable differs");
    }
    let entry_bytes: u64 = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();

    // Warm: fresh clients load the last cold run's entry; then memory hits on the last of them.
    let mut warm = Vec::new();
    let mut memory = Vec::new();
    for _ in 0..WARM_RUNS {
        let client = Client::new(&plugin, &[])?;
        client.set_compile_cache(CompileCache::in_dir(&dir));
        let start = Instant::now();
        let exe = client.compile(&text)?;
        warm.push(start.elapsed());
        let s = client.cache_stats();
        ensure!(s.disk_hits == 1 && s.compiles == 0, "warm run: {s:?}");
        ensure!(
            run(&client, &exe)? == reference,
            "the executable loaded from disk computes something else"
        );
        if memory.is_empty() {
            for _ in 0..MEMORY_RUNS {
                let start = Instant::now();
                let again = client.compile(&text)?;
                memory.push(start.elapsed());
                drop(again);
            }
            let s = client.cache_stats();
            ensure!(s.memory_hits == MEMORY_RUNS as u64, "memory runs: {s:?}");
        }
    }
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
    for f in &figures {
        println!(
            "{:<38} {:>10.3} {:>10.3} {:>5}",
            f.label, f.best_ms, f.median_ms, f.runs
        );
    }
    let speedup = figures[1].median_ms / figures[2].median_ms;
    println!("\nwarm from disk is {speedup:.0}x faster than cold (medians)");

    let file = bench_dir.join("compile_cache.json");
    std::fs::write(&file, report_json(&header, &figures))
        .with_context(|| format!("writing {}", file.display()))?;
    println!("wrote {}", file.display());
    Ok(())
}
