//! Runtime benchmark: what the CPU PJRT plugin costs and delivers through stablegraph.
//!
//! On the plugin that `Client::cpu()` resolves, it measures:
//!
//! 1. client creation (plugin load + `Client::new`), once;
//! 2. compile time of a small program (`a + b` on two `tensor<1024xf32>`), best and median of 5;
//! 3. execute round-trip latency of that program on device buffers, median and p99 of 2000 calls;
//! 4. read bandwidth of an f32 matrix-vector product over a 512 MiB matrix (in = 8192,
//!    out = 16384) in both layouts: `x @ W` with `W` stored `[in, out]`, and `x @ W.T` with `W`
//!    stored `[out, in]`; best of 8 after a warm-up, as matrix bytes / time;
//! 5. f32 matmul throughput, 2048 x 2048 x 2048, as 2 n^3 / time;
//! 6. host-to-device and device-to-host bandwidth of a 256 MiB buffer, best of 3.
//!
//! Inputs are built and uploaded once; only executions (which wait for completion) and transfers
//! are timed. Every result is checked against the host on a few entries, and the bench fails
//! rather than report the speed of a wrong program.
//!
//! The table goes to stdout and the same figures, as JSON, to
//! `target/bench/runtime-<plugin>.json` (`runtime-<plugin>-quick.json` with `--quick`), where
//! `<plugin>` is the pinned package name, or else the plugin file's stem.
//!
//! ```text
//! cargo bench --bench runtime                                    # default: lammps-jax-pjrt-cpu
//! STABLEGRAPH_CPU_PLUGIN=xla-cpu-pjrt cargo bench --bench runtime
//! STABLEGRAPH_PJRT_PLUGIN=/path/to/plugin.so cargo bench --bench runtime
//! cargo bench --bench runtime -- --quick                         # 1/16 sizes: a smoke test
//! ```

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use stablegraph::runtime::{install, Buffer, Client, CompileCache, Plugin};

/// Problem sizes: the full run, or 1/16 of the data for `--quick`.
struct Sizes {
    small_len: usize,
    compile_runs: usize,
    latency_runs: usize,
    mv_in: usize,
    mv_out: usize,
    mm_n: usize,
    transfer_len: usize,
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        // In quick mode each matrix and buffer holds 1/16 of the elements.
        let (div, side) = if quick { (16, 4) } else { (1, 1) };
        Sizes {
            small_len: 1024,
            compile_runs: 5,
            latency_runs: if quick { 200 } else { 2000 },
            mv_in: 8192 / side,
            mv_out: 16384 / side,
            mm_n: 2048 / side,
            transfer_len: (256 << 20) / 4 / div,
        }
    }
}

const BANDWIDTH_RUNS: usize = 8;
const TRANSFER_RUNS: usize = 3;

/// One line of the report.
struct Figure {
    key: &'static str,
    label: String,
    value: f64,
    unit: &'static str,
}

/// Timings of repeated calls, sorted.
struct Times(Vec<Duration>);

impl Times {
    fn best(&self) -> Duration {
        self.0[0]
    }

    /// The `q`-quantile (nearest rank), e.g. 0.5 for the median.
    fn quantile(&self, q: f64) -> Duration {
        let rank = (q * self.0.len() as f64).ceil() as usize;
        self.0[rank.clamp(1, self.0.len()) - 1]
    }
}

/// Runs `f` `runs` times (at least once), timing each call; returns the times and the last
/// result. Earlier results are dropped outside the timed region.
fn timed<T>(runs: usize, mut f: impl FnMut() -> Result<T>) -> Result<(Times, T)> {
    let mut times = Vec::with_capacity(runs);
    let mut last = None;
    for _ in 0..runs.max(1) {
        let start = Instant::now();
        let value = f()?;
        times.push(start.elapsed());
        last = Some(value);
    }
    times.sort();
    Ok((Times(times), last.expect("at least one run")))
}

/// A cheap deterministic fill: `(i % modulus) * scale`.
fn fill(len: usize, modulus: usize, scale: f32) -> Vec<f32> {
    (0..len).map(|i| (i % modulus) as f32 * scale).collect()
}

/// Fails unless `got` is within `tol` (relative) of the host's `want`.
fn check_close(what: &str, got: f32, want: f64, tol: f64) -> Result<()> {
    let err = (got as f64 - want).abs() / want.abs().max(f64::MIN_POSITIVE);
    ensure!(
        err <= tol,
        "{what}: device {got}, host {want} (relative error {err:.1e} > {tol:.0e}); refusing to \
         report the speed of a wrong result"
    );
    Ok(())
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn program_add(n: usize) -> String {
    format!(
        r#"func.func @main(%a: tensor<{n}xf32>, %b: tensor<{n}xf32>) -> tensor<{n}xf32> {{
  %0 = stablehlo.add %a, %b : tensor<{n}xf32>
  return %0 : tensor<{n}xf32>
}}
"#
    )
}

/// How the matrix of the matrix-vector product is stored.
#[derive(Clone, Copy)]
enum Layout {
    /// `W` is `[in, out]`: `x @ W`.
    InOut,
    /// `W` is `[out, in]`: `x @ W.T`.
    OutIn,
}

impl Layout {
    fn dims(self, n_in: usize, n_out: usize) -> [usize; 2] {
        match self {
            Layout::InOut => [n_in, n_out],
            Layout::OutIn => [n_out, n_in],
        }
    }

    /// The row-major index of `W[i, j]` (input `i`, output `j`).
    fn index(self, n_in: usize, n_out: usize, i: usize, j: usize) -> usize {
        match self {
            Layout::InOut => i * n_out + j,
            Layout::OutIn => j * n_in + i,
        }
    }
}

/// `x @ W` (or `x @ W.T`) for `x: tensor<n_in>`, contracting `W` on its input dimension.
fn program_matvec(n_in: usize, n_out: usize, layout: Layout) -> String {
    let [d0, d1] = layout.dims(n_in, n_out);
    let contract = match layout {
        Layout::InOut => 0,
        Layout::OutIn => 1,
    };
    format!(
        r#"func.func @main(%x: tensor<{n_in}xf32>, %w: tensor<{d0}x{d1}xf32>) -> tensor<{n_out}xf32> {{
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [0] x [{contract}] : (tensor<{n_in}xf32>, tensor<{d0}x{d1}xf32>) -> tensor<{n_out}xf32>
  return %0 : tensor<{n_out}xf32>
}}
"#
    )
}

fn program_matmul(n: usize) -> String {
    format!(
        r#"func.func @main(%a: tensor<{n}x{n}xf32>, %b: tensor<{n}x{n}xf32>) -> tensor<{n}x{n}xf32> {{
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<{n}x{n}xf32>, tensor<{n}x{n}xf32>) -> tensor<{n}x{n}xf32>
  return %0 : tensor<{n}x{n}xf32>
}}
"#
    )
}

/// Figures 2 and 3: compile time and execute latency of a small elementwise add.
fn bench_small(client: &Client, s: &Sizes, out: &mut Vec<Figure>) -> Result<()> {
    let n = s.small_len;
    let program = program_add(n);
    let (compile, exe) = timed(s.compile_runs, || Ok(client.compile(&program)?))?;
    let label = format!("compile add tensor<{n}xf32>");
    out.push(Figure {
        key: "compile_best",
        label: format!("{label}, best of {}", s.compile_runs),
        value: secs(compile.best()) * 1e3,
        unit: "ms",
    });
    out.push(Figure {
        key: "compile_median",
        label: format!("{label}, median"),
        value: secs(compile.quantile(0.5)) * 1e3,
        unit: "ms",
    });

    let (a, b) = (fill(n, 13, 0.01), fill(n, 7, 0.1));
    let (da, db) = (
        client.buffer_from_slice(&a, &[n])?,
        client.buffer_from_slice(&b, &[n])?,
    );
    for _ in 0..10 {
        exe.execute(&[&da, &db])?;
    }
    let (latency, result) = timed(s.latency_runs, || Ok(exe.execute(&[&da, &db])?))?;
    let got = result[0].to_vec::<f32>()?;
    for i in [0, 1, n / 2, n - 1] {
        check_close(&format!("add[{i}]"), got[i], (a[i] + b[i]) as f64, 1e-6)?;
    }
    let label = format!("execute add, {} calls", s.latency_runs);
    out.push(Figure {
        key: "execute_latency_median",
        label: format!("{label}, median"),
        value: secs(latency.quantile(0.5)) * 1e6,
        unit: "us",
    });
    out.push(Figure {
        key: "execute_latency_p99",
        label: format!("{label}, p99"),
        value: secs(latency.quantile(0.99)) * 1e6,
        unit: "us",
    });
    Ok(())
}

/// Figure 4: matrix-vector read bandwidth for one layout of `w`.
fn bench_matvec(
    client: &Client,
    s: &Sizes,
    layout: Layout,
    x: (&[f32], &Buffer),
    w: &[f32],
) -> Result<Figure> {
    let (n_in, n_out) = (s.mv_in, s.mv_out);
    let exe = client.compile(&program_matvec(n_in, n_out, layout))?;
    let dw = client.buffer_from_slice(w, &layout.dims(n_in, n_out))?;
    exe.execute(&[x.1, &dw])?;
    let (times, result) = timed(BANDWIDTH_RUNS, || Ok(exe.execute(&[x.1, &dw])?))?;
    let got = result[0].to_vec::<f32>()?;
    for j in [0, 1, n_out / 2 + 3, n_out - 1] {
        let want: f64 = (0..n_in)
            .map(|i| x.0[i] as f64 * w[layout.index(n_in, n_out, i, j)] as f64)
            .sum();
        check_close(&format!("matvec[{j}]"), got[j], want, 1e-3)?;
    }
    let bytes = (w.len() * 4) as f64;
    let (key, name) = match layout {
        Layout::InOut => ("matvec_in_out", "x @ W, W [in, out]"),
        Layout::OutIn => ("matvec_out_in", "x @ W.T, W [out, in]"),
    };
    Ok(Figure {
        key,
        label: format!(
            "matvec {name} {n_in}x{n_out} ({} MiB), best of {BANDWIDTH_RUNS}",
            (w.len() * 4) >> 20
        ),
        value: bytes / secs(times.best()) / 1e9,
        unit: "GB/s",
    })
}

/// Figure 5: f32 matmul throughput.
fn bench_matmul(client: &Client, s: &Sizes) -> Result<Figure> {
    let n = s.mm_n;
    let exe = client.compile(&program_matmul(n))?;
    let (a, b) = (fill(n * n, 13, 0.01), fill(n * n, 7, 0.1));
    let (da, db) = (
        client.buffer_from_slice(&a, &[n, n])?,
        client.buffer_from_slice(&b, &[n, n])?,
    );
    exe.execute(&[&da, &db])?;
    let (times, result) = timed(BANDWIDTH_RUNS, || Ok(exe.execute(&[&da, &db])?))?;
    let got = result[0].to_vec::<f32>()?;
    for (i, j) in [(0, 0), (1, n - 1), (n / 2, 7), (n - 1, n / 3)] {
        let want: f64 = (0..n)
            .map(|k| a[i * n + k] as f64 * b[k * n + j] as f64)
            .sum();
        check_close(&format!("matmul[{i}, {j}]"), got[i * n + j], want, 1e-3)?;
    }
    let flops = 2.0 * (n as f64).powi(3);
    Ok(Figure {
        key: "matmul",
        label: format!("matmul f32 {n}x{n}x{n}, best of {BANDWIDTH_RUNS}"),
        value: flops / secs(times.best()) / 1e9,
        unit: "GFLOP/s",
    })
}

/// Figure 6: host-to-device and device-to-host bandwidth.
fn bench_transfer(client: &Client, s: &Sizes, out: &mut Vec<Figure>) -> Result<()> {
    let len = s.transfer_len;
    let host = fill(len, 13, 0.01);
    let (h2d, buffer) = timed(TRANSFER_RUNS, || {
        Ok(client.buffer_from_slice(&host, &[len])?)
    })?;
    let (d2h, bytes) = timed(TRANSFER_RUNS, || Ok(buffer.to_bytes()?))?;
    for i in [0, 1, len / 2 + 5, len - 1] {
        let got = f32::from_ne_bytes(bytes[4 * i..4 * i + 4].try_into()?);
        check_close(&format!("transfer[{i}]"), got, host[i] as f64, 0.0)?;
    }
    let mib = (len * 4) >> 20;
    let gb = (len * 4) as f64 / 1e9;
    out.push(Figure {
        key: "host_to_device",
        label: format!("host -> device {mib} MiB, best of {TRANSFER_RUNS}"),
        value: gb / secs(h2d.best()),
        unit: "GB/s",
    });
    out.push(Figure {
        key: "device_to_host",
        label: format!("device -> host {mib} MiB, best of {TRANSFER_RUNS}"),
        value: gb / secs(d2h.best()),
        unit: "GB/s",
    });
    Ok(())
}

/// The pinned package the plugin file is (same file name and size), or else its file stem.
fn plugin_id(path: &Path) -> String {
    let name = path.file_name().and_then(|n| n.to_str());
    let size = std::fs::metadata(path).map(|m| m.len()).ok();
    install::CPU_PLUGINS
        .iter()
        .find(|w| name == Some(w.so_name()) && size == Some(w.so_size))
        .map(|w| w.package.to_string())
        .unwrap_or_else(|| {
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "plugin".into())
        })
}

/// A value with about four significant digits.
fn show(v: f64) -> String {
    match v.abs() {
        a if a >= 1000.0 => format!("{v:.0}"),
        a if a >= 100.0 => format!("{v:.1}"),
        a if a >= 1.0 => format!("{v:.2}"),
        _ => format!("{v:.3}"),
    }
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

fn json_number(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "null".into()
    }
}

fn report_json(header: &[(&str, String)], quick: bool, figures: &[Figure]) -> String {
    let mut json = String::from("{\n");
    for (key, value) in header {
        let _ = writeln!(json, "  {}: {},", json_string(key), json_string(value));
    }
    let _ = writeln!(json, "  \"quick\": {quick},\n  \"figures\": [");
    for (i, f) in figures.iter().enumerate() {
        let comma = if i + 1 < figures.len() { "," } else { "" };
        let _ = writeln!(
            json,
            "    {{\"key\": {}, \"figure\": {}, \"value\": {}, \"unit\": {}}}{comma}",
            json_string(f.key),
            json_string(&f.label),
            json_number(f.value),
            json_string(f.unit)
        );
    }
    json.push_str("  ]\n}\n");
    json
}

fn main() -> Result<()> {
    // Cargo passes `--bench` to harness-less benches; anything but `--quick` is ignored.
    let quick = std::env::args().skip(1).any(|a| a == "--quick");
    let s = Sizes::new(quick);

    let path = install::resolve_cpu_plugin()?;
    let start = Instant::now();
    let plugin = Plugin::load(&path)?;
    let client = Client::new(&plugin, &[])?;
    // Every compile below is a real one: no memory or disk cache hits.
    client.set_compile_cache(CompileCache::disabled());
    let create = start.elapsed();

    let (major, minor) = plugin.api_version();
    let header = [
        ("plugin", plugin.path().display().to_string()),
        ("api_version", format!("{major}.{minor}")),
        ("platform", client.platform_name()?),
        ("platform_version", client.platform_version()?),
    ];
    let mut figures = vec![Figure {
        key: "client_create",
        label: "client creation (plugin load + Client::new)".into(),
        value: secs(create) * 1e3,
        unit: "ms",
    }];

    eprintln!("measuring compile time and execute latency");
    bench_small(&client, &s, &mut figures).context("small program")?;
    {
        eprintln!("measuring matrix-vector read bandwidth");
        let x = fill(s.mv_in, 7, 0.1);
        let dx = client.buffer_from_slice(&x, &[s.mv_in])?;
        let w = fill(s.mv_in * s.mv_out, 13, 0.01);
        for layout in [Layout::InOut, Layout::OutIn] {
            figures.push(bench_matvec(&client, &s, layout, (&x, &dx), &w).context("matvec")?);
        }
    }
    eprintln!("measuring matmul throughput");
    figures.push(bench_matmul(&client, &s).context("matmul")?);
    eprintln!("measuring transfer bandwidth");
    bench_transfer(&client, &s, &mut figures).context("transfers")?;

    let mode = if quick { " (--quick: 1/16 sizes)" } else { "" };
    println!("stablegraph runtime bench{mode}");
    println!("plugin    {} (PJRT C API {major}.{minor})", header[0].1);
    println!("platform  {}, version {}", header[2].1, header[3].1);
    println!();
    let width = figures.iter().map(|f| f.label.len()).max().unwrap_or(0);
    let values: Vec<String> = figures.iter().map(|f| show(f.value)).collect();
    let vwidth = values.iter().map(|v| v.len()).max().unwrap_or(0).max(5);
    println!("{:<width$}  {:>vwidth$}  unit", "figure", "value");
    for (f, v) in figures.iter().zip(&values) {
        println!("{:<width$}  {v:>vwidth$}  {}", f.label, f.unit);
    }

    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let suffix = if quick { "-quick" } else { "" };
    let file = dir.join(format!("runtime-{}{suffix}.json", plugin_id(plugin.path())));
    std::fs::write(&file, report_json(&header, quick, &figures))
        .with_context(|| format!("writing {}", file.display()))?;
    println!("\nwrote {}", file.display());
    Ok(())
}
