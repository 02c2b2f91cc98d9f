//! What every bench shares: timing and order statistics, value formatting, JSON reports under
//! `target/bench`, a deterministic generator, peak memory from `/proc`, the machine's ceilings
//! (matrix-vector read bandwidth, matmul throughput) through the plugin, and progress bars on a
//! terminal (`progress`).
//!
//! Each bench includes it with `mod common;` (`#[path = "../common/mod.rs"]` from a bench in
//! its own folder); not every bench uses every item.
#![allow(dead_code)]

pub mod ceilings;
pub mod progress;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{ensure, Context, Result};

// ---------------------------------------------------------------------------------------------
// Timing and order statistics (seconds, sorted ascending).

/// Seconds since `t`.
pub fn secs_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

/// Runs `f` `reps` times (at least once), timing each call; returns the sorted times in seconds
/// and the last value. Earlier values are dropped outside the timed region, and a progress bar
/// (on a terminal) moves between calls.
pub fn timed<T>(reps: usize, mut f: impl FnMut() -> Result<T>) -> Result<(Vec<f64>, T)> {
    let reps = reps.max(1);
    let mut times = Vec::with_capacity(reps);
    let mut last = None;
    let bar = progress::bar(
        reps as u64,
        "  [{wide_bar}] timed run {pos}/{len}, {eta} left: {msg}",
    );
    for _ in 0..reps {
        let t = Instant::now();
        let v = f()?;
        let s = secs_since(t);
        times.push(s);
        last = Some(v);
        bar.inc(1);
        bar.set_message(format!("{} s per run", show(s)));
    }
    progress::done(&bar);
    Ok((sorted(times), last.expect("at least one run")))
}

/// `v` sorted ascending.
pub fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// The `q`-quantile (nearest rank) of sorted values, e.g. 0.99 for P99.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The median (nearest rank) of sorted values.
pub fn median(sorted: &[f64]) -> f64 {
    quantile(sorted, 0.5)
}

// ---------------------------------------------------------------------------------------------
// Results.

/// Fails unless `got` is within `tol` (relative) of the host's `want`, so that no bench reports
/// the speed of a wrong program.
pub fn check_close(what: &str, got: f32, want: f64, tol: f64) -> Result<()> {
    let err = (f64::from(got) - want).abs() / want.abs().max(f64::MIN_POSITIVE);
    ensure!(
        err <= tol,
        "{what}: device {got}, host {want} (relative error {err:.1e} > {tol:.0e}); refusing to \
         report the speed of a wrong result"
    );
    Ok(())
}

/// A value with about four significant digits (`-` when not finite).
pub fn show(v: f64) -> String {
    match v.abs() {
        a if !a.is_finite() => "-".into(),
        a if a >= 1000.0 => format!("{v:.0}"),
        a if a >= 100.0 => format!("{v:.1}"),
        a if a >= 10.0 => format!("{v:.2}"),
        a if a >= 0.01 || a == 0.0 => format!("{v:.3}"),
        _ => format!("{v:.2e}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Inputs.

/// A cheap deterministic fill: `(i % modulus) * scale`.
pub fn fill(len: usize, modulus: usize, scale: f32) -> Vec<f32> {
    (0..len).map(|i| (i % modulus) as f32 * scale).collect()
}

pub use stablegraph::rng::SplitMix64;

/// `n` values uniform in `[lo, hi)` from a SplitMix64 seeded with `seed`.
pub fn uniform(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    (0..n).map(|_| rng.uniform(lo, hi) as f32).collect()
}

// ---------------------------------------------------------------------------------------------
// Memory.

/// A `/proc/self/status` field in KiB (`"VmHWM:"`, the peak resident memory; `"VmRSS:"`).
pub fn status_kib(field: &str) -> Result<u64> {
    proc_kib("/proc/self/status", field)
}

/// A `field: N kB` line of a `/proc` file (`/proc/self/status`, `/proc/meminfo`), in KiB.
pub fn proc_kib(path: &str, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(path)?;
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .with_context(|| format!("no {field} in {path}"))?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .context("malformed status line")?
        .parse()?)
}

// ---------------------------------------------------------------------------------------------
// Reports.

/// `target/bench` of this checkout, created if missing.
pub fn bench_dir() -> Result<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Writes `contents` to `target/bench/<name>` and returns the file's path.
pub fn write_report(name: &str, contents: &str) -> Result<PathBuf> {
    let file = bench_dir()?.join(name);
    write_file(&file, contents)?;
    Ok(file)
}

/// Writes `contents` to `file`, naming it on failure.
pub fn write_file(file: &Path, contents: &str) -> Result<()> {
    std::fs::write(file, contents).with_context(|| format!("writing {}", file.display()))
}

/// `s` as a JSON string literal.
pub fn json_string(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// `v` as a JSON number, or `null` when it is not finite (JSON has no NaN or infinity).
pub fn json_number(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "null".into()
    }
}

/// A one-line JSON object of `fields` in their order; values are JSON text already.
pub fn json_object(fields: &[(&str, String)]) -> String {
    let body: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("{}: {v}", json_string(k)))
        .collect();
    format!("{{{}}}", body.join(", "))
}

/// A report: the `text` fields as JSON strings, then the `raw` fields (values that are JSON text
/// already), then a `"figures"` array of one-line objects, one per line, in the given order.
pub fn report_json(text: &[(&str, String)], raw: &[(&str, String)], figures: &[String]) -> String {
    let mut json = String::from("{\n");
    let text = text.iter().map(|(k, v)| (*k, json_string(v)));
    for (key, value) in text.chain(raw.iter().map(|(k, v)| (*k, v.clone()))) {
        let _ = writeln!(json, "  {}: {value},", json_string(key));
    }
    json.push_str("  \"figures\": [\n");
    for (i, f) in figures.iter().enumerate() {
        let comma = if i + 1 < figures.len() { "," } else { "" };
        let _ = writeln!(json, "    {f}{comma}");
    }
    json.push_str("  ]\n}\n");
    json
}
