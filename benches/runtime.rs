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

mod common;

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use common::ceilings::{matmul_best_secs, Layout, Matvec, BEST_OF};
use common::{
    check_close, fill, json_number, json_object, json_string, report_json, secs_since, show, timed,
    write_report,
};
use stablegraph::runtime::{install, Client, CompileCache, Plugin};

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

const TRANSFER_RUNS: usize = 3;

/// One line of the report.
struct Figure {
    key: &'static str,
    label: String,
    value: f64,
    unit: &'static str,
}

impl Figure {
    /// The figure as a one-line JSON object.
    fn json(&self) -> String {
        json_object(&[
            ("key", json_string(self.key)),
            ("figure", json_string(&self.label)),
            ("value", json_number(self.value)),
            ("unit", json_string(self.unit)),
        ])
    }
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

/// Figures 2 and 3: compile time and execute latency of a small elementwise add.
fn bench_small(client: &Client, s: &Sizes, out: &mut Vec<Figure>) -> Result<()> {
    let n = s.small_len;
    let program = program_add(n);
    let (compile, exe) = timed(s.compile_runs, || Ok(client.compile(&program)?))?;
    let label = format!("compile add tensor<{n}xf32>");
    out.push(Figure {
        key: "compile_best",
        label: format!("{label}, best of {}", s.compile_runs),
        value: compile[0] * 1e3,
        unit: "ms",
    });
    out.push(Figure {
        key: "compile_median",
        label: format!("{label}, median"),
        value: common::median(&compile) * 1e3,
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
        value: common::median(&latency) * 1e6,
        unit: "us",
    });
    out.push(Figure {
        key: "execute_latency_p99",
        label: format!("{label}, p99"),
        value: common::quantile(&latency, 0.99) * 1e6,
        unit: "us",
    });
    Ok(())
}

/// Figure 4: matrix-vector read bandwidth for one layout of `w`.
fn bench_matvec(client: &Client, s: &Sizes, m: &Matvec, layout: Layout) -> Result<Figure> {
    let best = m.best_secs(client, layout)?;
    let (key, name) = match layout {
        Layout::InOut => ("matvec_in_out", "x @ W, W [in, out]"),
        Layout::OutIn => ("matvec_out_in", "x @ W.T, W [out, in]"),
    };
    Ok(Figure {
        key,
        label: format!(
            "matvec {name} {}x{} ({} MiB), best of {BEST_OF}",
            s.mv_in,
            s.mv_out,
            m.matrix_bytes() >> 20
        ),
        value: m.matrix_bytes() as f64 / best / 1e9,
        unit: "GB/s",
    })
}

/// Figure 5: f32 matmul throughput.
fn bench_matmul(client: &Client, s: &Sizes) -> Result<Figure> {
    let n = s.mm_n;
    let best = matmul_best_secs(client, n)?;
    let flops = 2.0 * (n as f64).powi(3);
    Ok(Figure {
        key: "matmul",
        label: format!("matmul f32 {n}x{n}x{n}, best of {BEST_OF}"),
        value: flops / best / 1e9,
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
        value: gb / h2d[0],
        unit: "GB/s",
    });
    out.push(Figure {
        key: "device_to_host",
        label: format!("device -> host {mib} MiB, best of {TRANSFER_RUNS}"),
        value: gb / d2h[0],
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
    let create = secs_since(start);

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
        value: create * 1e3,
        unit: "ms",
    }];

    eprintln!("measuring compile time and execute latency");
    bench_small(&client, &s, &mut figures).context("small program")?;
    {
        eprintln!("measuring matrix-vector read bandwidth");
        let m = Matvec::new(&client, s.mv_in, s.mv_out)?;
        for layout in Layout::BOTH {
            figures.push(bench_matvec(&client, &s, &m, layout).context("matvec")?);
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

    let suffix = if quick { "-quick" } else { "" };
    let json: Vec<String> = figures.iter().map(Figure::json).collect();
    let file = write_report(
        &format!("runtime-{}{suffix}.json", plugin_id(plugin.path())),
        &report_json(&header, &[("quick", quick.to_string())], &json),
    )?;
    println!("\nwrote {}", file.display());
    Ok(())
}
