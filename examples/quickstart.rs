//! The quick start: load the XLA CPU plugin (fetched into the per-user cache on first use), build
//! a small graph with the DSL, compile it, run it on device buffers, and check the result against
//! the host and the reference interpreter. `--print-stablehlo` shows what XLA compiled.

use std::time::Instant;

use anyhow::{ensure, Context, Result};
use clap::Parser;
use stablegraph::ops::Graph;
use stablegraph::runtime::{Client, Plugin, Value};
use stablegraph::{DType, HostArray};

/// Build a small graph, compile it through a PJRT plugin, run it, and check it.
#[derive(Parser)]
struct Args {
    /// A PJRT plugin shared object (default: the XLA CPU plugin, resolved as docs/runtime.md says).
    #[arg(long)]
    plugin: Option<std::path::PathBuf>,
    /// Number of CPU devices to create (CPU plugin only).
    #[arg(long)]
    cpu_devices: Option<i64>,
    /// Matrix size n of the n x n program.
    #[arg(long, default_value_t = 256)]
    n: usize,
    /// How many times to run the compiled program.
    #[arg(long, default_value_t = 100)]
    runs: usize,
    /// Print the lowered StableHLO text.
    #[arg(long)]
    print_stablehlo: bool,
}

/// `softmax(a @ b)` row by row, plus the sum of all entries of `a @ b` (two outputs), built with
/// the graph DSL.
fn graph(n: usize) -> stablegraph::Result<Graph> {
    let g = Graph::new();
    let a = g.parameter("a", DType::F32, &[n, n])?;
    let b = g.parameter("b", DType::F32, &[n, n])?;
    let ab = a.matmul(&b)?;
    let shifted = ab.sub(&ab.max_keepdims(&[-1])?)?;
    let e = shifted.exp()?;
    let soft = e.div(&e.sum_keepdims(&[-1])?)?;
    let total = ab.sum_all()?;
    g.set_outputs(&[&soft, &total])?;
    Ok(g)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let n = args.n;
    let client = connect(&args)?;

    let g = graph(n)?;
    let text = g.to_stablehlo()?;
    let t = Instant::now();
    if args.print_stablehlo {
        println!("{text}");
    }
    let program = g.compile(&client).context("compiling the program")?;
    println!(
        "compiled  softmax(a @ b) for {n}x{n} f32 ({} lines of StableHLO) in {:.2?}",
        text.lines().count(),
        t.elapsed()
    );

    let (a, b) = inputs(n);
    let da = client.buffer_from_slice(&a, &[n, n])?;
    let db = client.buffer_from_slice(&b, &[n, n])?;
    let t = Instant::now();
    let mut outputs = program.run_buffers(&[&da, &db])?;
    for _ in 1..args.runs {
        outputs = program.run_buffers(&[&da, &db])?;
    }
    let per_run = t.elapsed() / args.runs.max(1) as u32;
    let soft = outputs[0].to_vec::<f32>()?;
    let total = outputs[1].to_scalar::<f32>()?;

    let worst = check_on_host(n, &b, &soft, total)?;
    check_with_interpreter(&g, n, &a, &b, &soft)?;
    println!(
        "ran       {} times, {per_run:.2?} per run; results match the host and the interpreter (max rel. error {worst:.1e})",
        args.runs
    );
    Ok(())
}

/// Loads the plugin (--plugin, else the XLA CPU plugin) and creates a client with
/// --cpu-devices, saying which plugin and platform.
fn connect(args: &Args) -> Result<Client> {
    let t0 = Instant::now();
    let plugin_path = match &args.plugin {
        Some(p) => p.clone(),
        None => stablegraph::runtime::resolve_cpu_plugin()?,
    };
    let plugin = Plugin::load(&plugin_path)?;
    let options: Vec<(&str, Value)> = args
        .cpu_devices
        .map(|d| vec![("cpu_device_count", Value::Int64(d))])
        .unwrap_or_default();
    let client = Client::new(&plugin, &options)?;
    let (major, minor) = plugin.api_version();
    println!(
        "plugin    {} (PJRT C API {major}.{minor})",
        plugin.path().display()
    );
    println!(
        "platform  {} {} with {} device(s), loaded in {:.2?}",
        client.platform_name()?,
        client.platform_version()?,
        client.device_count(),
        t0.elapsed()
    );
    Ok(client)
}

/// The inputs: a = I * 0.5 (so a @ b = b / 2); b[i][j] = (i + 2j) mod 7.
fn inputs(n: usize) -> (Vec<f32>, Vec<f32>) {
    let a: Vec<f32> = (0..n * n)
        .map(|k| if k / n == k % n { 0.5 } else { 0.0 })
        .collect();
    let b: Vec<f32> = (0..n * n)
        .map(|k| ((k / n + 2 * (k % n)) % 7) as f32)
        .collect();
    (a, b)
}

/// Checks the device's outputs against the host, where row i of a @ b is b[i] / 2; returns the
/// softmax's largest relative error.
fn check_on_host(n: usize, b: &[f32], soft: &[f32], total: f32) -> Result<f32> {
    let expected_total: f32 = b.iter().map(|x| x / 2.0).sum();
    ensure!(
        (total - expected_total).abs() <= 1e-4 * expected_total.abs(),
        "sum of a @ b: device {total}, host {expected_total}"
    );
    let mut worst = 0.0f32;
    for i in 0..n {
        let row: Vec<f32> = b[i * n..(i + 1) * n].iter().map(|x| x / 2.0).collect();
        let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let z: f32 = row.iter().map(|x| (x - m).exp()).sum();
        for j in 0..n {
            let want = (row[j] - m).exp() / z;
            worst = worst.max((soft[i * n + j] - want).abs() / want);
        }
    }
    ensure!(
        worst <= 1e-5,
        "softmax differs from the host by {worst} (relative)"
    );
    Ok(worst)
}

/// Checks the device's softmax against the same graph run by the reference interpreter.
fn check_with_interpreter(g: &Graph, n: usize, a: &[f32], b: &[f32], soft: &[f32]) -> Result<()> {
    let reference = g.evaluate(&[
        HostArray::from_vec(&[n, n], a.to_vec())?,
        HostArray::from_vec(&[n, n], b.to_vec())?,
    ])?;
    let interp_worst = reference[0]
        .to_f64_vec()
        .iter()
        .zip(soft)
        .map(|(r, &d)| ((r - f64::from(d)) / r).abs())
        .fold(0.0, f64::max);
    ensure!(
        interp_worst <= 1e-5,
        "device and interpreter differ by {interp_worst} (relative)"
    );
    Ok(())
}
