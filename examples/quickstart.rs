//! The quick start: load the XLA CPU plugin (fetched into the per-user cache on first use),
//! compile a small StableHLO program, run it on device buffers, and check the result on the host.

use anyhow::{ensure, Context, Result};
use clap::Parser;
use stablegraph::runtime::{Client, Plugin, Value};

/// Compile and run a small StableHLO program through a PJRT plugin.
#[derive(Parser)]
struct Args {
    /// A PJRT plugin shared object (default: the XLA CPU plugin, resolved as the README says).
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
}

/// `softmax(a @ b)` row by row, plus the sum of all entries of `a @ b` (two outputs).
fn program(n: usize) -> String {
    format!(
        r#"func.func @main(%a: tensor<{n}x{n}xf32>, %b: tensor<{n}x{n}xf32>) -> (tensor<{n}x{n}xf32>, tensor<f32>) {{
  %ab = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<{n}x{n}xf32>, tensor<{n}x{n}xf32>) -> tensor<{n}x{n}xf32>
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %max = stablehlo.reduce(%ab init: %ninf) applies stablehlo.maximum across dimensions = [1] : (tensor<{n}x{n}xf32>, tensor<f32>) -> tensor<{n}xf32>
  %maxb = stablehlo.broadcast_in_dim %max, dims = [0] : (tensor<{n}xf32>) -> tensor<{n}x{n}xf32>
  %shifted = stablehlo.subtract %ab, %maxb : tensor<{n}x{n}xf32>
  %e = stablehlo.exponential %shifted : tensor<{n}x{n}xf32>
  %sum = stablehlo.reduce(%e init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<{n}x{n}xf32>, tensor<f32>) -> tensor<{n}xf32>
  %sumb = stablehlo.broadcast_in_dim %sum, dims = [0] : (tensor<{n}xf32>) -> tensor<{n}x{n}xf32>
  %soft = stablehlo.divide %e, %sumb : tensor<{n}x{n}xf32>
  %total = stablehlo.reduce(%ab init: %zero) applies stablehlo.add across dimensions = [0, 1] : (tensor<{n}x{n}xf32>, tensor<f32>) -> tensor<f32>
  return %soft, %total : tensor<{n}x{n}xf32>, tensor<f32>
}}
"#
    )
}

fn main() -> Result<()> {
    let args = Args::parse();
    let n = args.n;
    let t0 = std::time::Instant::now();
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

    let t = std::time::Instant::now();
    let exe = client
        .compile(&program(n))
        .context("compiling the program")?;
    println!(
        "compiled  softmax(a @ b) for {n}x{n} f32 in {:.2?}",
        t.elapsed()
    );

    // a = I * 0.5 (so a @ b = b / 2); b[i][j] = (i + 2j) mod 7.
    let a: Vec<f32> = (0..n * n)
        .map(|k| if k / n == k % n { 0.5 } else { 0.0 })
        .collect();
    let b: Vec<f32> = (0..n * n)
        .map(|k| ((k / n + 2 * (k % n)) % 7) as f32)
        .collect();
    let da = client.buffer_from_slice(&a, &[n, n])?;
    let db = client.buffer_from_slice(&b, &[n, n])?;

    let t = std::time::Instant::now();
    let mut outputs = exe.execute(&[&da, &db])?;
    for _ in 1..args.runs {
        outputs = exe.execute(&[&da, &db])?;
    }
    let per_run = t.elapsed() / args.runs.max(1) as u32;
    let soft = outputs[0].to_vec::<f32>()?;
    let total = outputs[1].to_scalar::<f32>()?;

    // Check against the host: row i of a @ b is b[i] / 2.
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
    println!(
        "ran       {} times, {per_run:.2?} per run; results match the host (max rel. error {worst:.1e})",
        args.runs
    );
    Ok(())
}
