//! Mamba-2 benchmark on the 130M shape (`Mamba2Config::mamba2_130m()`, random weights), through
//! the CPU PJRT plugin that `Client::cpu()` resolves. Sections, in order of the report:
//!
//! 1. `ceilings`: the machine through the same plugin: f32 matrix-vector read bandwidth over a
//!    512 MiB matrix (both layouts) and f32 matmul FLOP/s (2048³), as in `benches/runtime.rs`;
//! 2. `prefill`: tokens/s at prompt lengths 128, 512 and 2048, f32 and bf16, batch 1 and 8
//!    (batch 8 at 2048 timed once). The timed program is what `generate` runs before its loop:
//!    the chunked SSD over the prompt (padded to a multiple of the 256 chunk), the final states
//!    and the last position's logits, downloaded (built here from the public block functions
//!    over the model's own weights);
//! 3. `decode`: (a) the on-device loop (`Mamba2::generate`, greedy, after a 128-token prompt):
//!    time per step = (generate time - prefill time) / tokens, one figure per run (a device loop
//!    has no per-token host timestamps), so its P50/P99 are over repeated runs; (b) a host loop
//!    calling `Mamba2::step` once per token with a host argmax: real per-token latencies, P50/P99
//!    over the 256 steps ending at each context (256, 1024, 4096; bf16 only to the first);
//!    (c) recomputation without a cache: for each new token the whole prefix is prefilled again
//!    (the prefill of 2., last logits only) and the argmax taken on the host; a few tokens per
//!    context, whose logits are checked against (b)'s; other contexts are interpolated from the
//!    prefill times;
//! 4. `ssd`: the chunked SSD (`ssd::ssd_chunked`, static masks; chunks 256, 128 and 64) against
//!    the same scan as a `fori_loop` over positions (`ssd::ssd_recurrent`) on one layer's inputs
//!    of the 130M shape, outputs checked against each other;
//! 5. `precision`: the largest logit difference of bf16 matrices against f32, and of the SSD's
//!    decay arithmetic in bf16 (`Mamba2Config::scan_dtype`) against f32, over a prefill and
//!    decode steps;
//! 6. `memory`: peak resident memory (VmHWM) of a child process (this binary again) per number
//!    of generated tokens (128, 1024, 4096); the child compiles first, then resets the
//!    high-water mark, so the run's own peak is reported too;
//! 7. `compile`: cold compile of the step and generate programs against a warm start from the
//!    disk cache in a fresh client.
//!
//! Utilisation: decode bytes read per step (every weight once, the tied embedding as the head,
//! plus the recurrent state of each row) x steps/s over the measured `[out, in]` read bandwidth;
//! prefill FLOPs per token (see [`prefill_flops_per_token`]) x tokens/s over the measured matmul
//! FLOP/s. A summary compares them with the issue's targets. Tables go to stdout, everything to
//! `target/bench/mamba2.json`, and per-token decode latency against position to
//! `target/bench/decode_latency.svg` (`-quick` names with `--quick`).
//!
//! ```text
//! cargo bench --bench mamba2                      # the full run (about 14 minutes on 2 cores)
//! cargo bench --bench mamba2 -- --quick           # shorter lengths, fewer repetitions
//! cargo bench --bench mamba2 -- --only ssd,memory # some sections (plus what they need)
//! ```

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};
use stablegraph::models::mamba2::{
    ssd, GenerateOptions, Mamba2, Mamba2Config, Mamba2State, Mamba2Weights, Sampling,
};
use stablegraph::ops::Graph;
use stablegraph::runtime::{Buffer, Client, CompileCache};
use stablegraph::{DType, HostArray, TensorType};

/// Set in a child process: generate this many tokens and report peak memory.
const MEMORY_CHILD_ENV: &str = "STABLEGRAPH_BENCH_MAMBA2_MEMORY_TOKENS";
/// Seed of the random weights.
const SEED: u64 = 0;
/// Prompt length of the decode measurements.
const DECODE_PROMPT: usize = 128;
const SECTIONS: [&str; 7] = [
    "ceilings",
    "prefill",
    "decode",
    "ssd",
    "precision",
    "memory",
    "compile",
];

/// Sizes and repetitions: the full run or `--quick`.
struct Plan {
    quick: bool,
    prefill_lens: Vec<usize>,
    /// Batch 8 only up to this prompt length.
    batch8_max_len: usize,
    /// Device loop `(batch, generated tokens, timed runs)`.
    device_loops: Vec<(usize, usize, usize)>,
    contexts: Vec<usize>,
    /// SSD chunk lengths tried in the ablation (the model's first).
    ssd_chunks: Vec<usize>,
    ssd_lens: Vec<usize>,
    precision_len: usize,
    precision_steps: usize,
    memory_tokens: Vec<usize>,
    /// Matrix-vector `(in, out)` and matmul `n` of the ceilings.
    matvec: (usize, usize),
    matmul: usize,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                quick,
                prefill_lens: vec![128, 512],
                batch8_max_len: 128,
                device_loops: vec![(1, 32, 3), (8, 16, 2)],
                contexts: vec![256, 512],
                ssd_chunks: vec![256, 128, 64],
                ssd_lens: vec![256, 512],
                precision_len: 256,
                precision_steps: 8,
                memory_tokens: vec![32, 128, 512],
                matvec: (2048, 4096),
                matmul: 512,
            }
        } else {
            Plan {
                quick,
                prefill_lens: vec![128, 512, 2048],
                batch8_max_len: 2048,
                device_loops: vec![(1, 128, 8), (8, 64, 4)],
                contexts: vec![256, 1024, 4096],
                ssd_chunks: vec![256, 128, 64],
                ssd_lens: vec![512, 2048],
                precision_len: 512,
                precision_steps: 32,
                memory_tokens: vec![128, 1024, 4096],
                matvec: (8192, 16384),
                matmul: 2048,
            }
        }
    }

    /// Timed repetitions of a prefill of `tokens` (padded) tokens in all, and whether to run
    /// it once untimed first.
    fn prefill_reps(&self, tokens: usize) -> (usize, bool) {
        let reps = match tokens {
            t if t <= 512 => 7,
            t if t <= 2048 => 5,
            t if t <= 4096 => 3,
            _ => 1,
        };
        let reps = if self.quick { reps.min(3) } else { reps };
        (reps, tokens < 4096)
    }

    /// Recomputed tokens measured at a context.
    fn recompute_tokens(&self, context: usize) -> usize {
        match context {
            c if c <= 512 => 5,
            c if c <= 2048 => 4,
            _ => 3,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Timing, statistics, tables.

fn secs_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

/// Runs `f` `reps` times (at least once); returns the sorted times in seconds and the last value.
fn timed<T>(reps: usize, mut f: impl FnMut() -> Result<T>) -> Result<(Vec<f64>, T)> {
    let mut times = Vec::with_capacity(reps);
    let mut last = None;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let v = f()?;
        times.push(secs_since(t));
        last = Some(v);
    }
    times.sort_by(f64::total_cmp);
    Ok((times, last.expect("at least one run")))
}

/// The `q`-quantile (nearest rank) of sorted values.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn median(sorted: &[f64]) -> f64 {
    quantile(sorted, 0.5)
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// A value with about four significant digits.
fn show(v: f64) -> String {
    match v.abs() {
        a if !a.is_finite() => "-".into(),
        a if a >= 1000.0 => format!("{v:.0}"),
        a if a >= 100.0 => format!("{v:.1}"),
        a if a >= 10.0 => format!("{v:.2}"),
        a if a >= 0.01 || a == 0.0 => format!("{v:.3}"),
        _ => format!("{v:.2e}"),
    }
}

/// A printed table: first column left-aligned, the others right-aligned.
struct Table {
    title: String,
    head: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(title: impl Into<String>, head: &[&str]) -> Table {
        Table {
            title: title.into(),
            head: head.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn print(&self) {
        let cols = self.head.len();
        let width: Vec<usize> = (0..cols)
            .map(|c| {
                self.rows
                    .iter()
                    .chain(std::iter::once(&self.head))
                    .map(|r| r.get(c).map_or(0, String::len))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        println!("\n{}", self.title);
        for r in std::iter::once(&self.head).chain(&self.rows) {
            let mut line = String::new();
            for (c, w) in width.iter().enumerate() {
                let cell = r.get(c).map_or("", String::as_str);
                if c == 0 {
                    let _ = write!(line, "{cell:<w$}");
                } else {
                    let _ = write!(line, "  {cell:>w$}");
                }
            }
            println!("{}", line.trim_end());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The model, its inputs and the prefill program.

/// A deterministic prompt of `len` token ids (row `row` of a batch).
fn prompt(len: usize, row: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((i * 7919 + row * 104_729 + 17) % 50_000) as u32)
        .collect()
}

fn greedy(max_new_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens,
        sampling: Sampling::Greedy,
        eos: None,
    }
}

/// The index of the largest value of each row of `logits` `[b, vocab]`.
fn argmax_rows(logits: &HostArray) -> Result<Vec<u32>> {
    let a = logits.as_array::<f32>()?;
    let vocab = *a.shape().last().context("logits without axes")?;
    let flat = a.as_slice().context("logits not contiguous")?;
    Ok(flat
        .chunks(vocab)
        .map(|row| {
            let mut best = 0;
            for (i, &v) in row.iter().enumerate() {
                if v > row[best] {
                    best = i;
                }
            }
            best as u32
        })
        .collect())
}

fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn max_abs(a: &[f64]) -> f64 {
    a.iter().fold(0.0, |m, x| m.max(x.abs()))
}

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::BF16 => "bf16",
        _ => "f32",
    }
}

/// The models of a run (made on first use), prefill times and figures.
struct Ctx {
    plan: Plan,
    client: Client,
    cfg: Mamba2Config,
    models: Vec<(DType, Mamba2)>,
    /// Median seconds of prefill programs: (dtype, batch, bucket) -> seconds.
    prefill_secs: Vec<((DType, usize, usize), f64)>,
    /// Figures the utilisation and plot read: key -> value.
    figures: Vec<(String, f64)>,
}

impl Ctx {
    fn model(&mut self, dtype: DType) -> Result<&Mamba2> {
        if let Some(i) = self.models.iter().position(|(d, _)| *d == dtype) {
            return Ok(&self.models[i].1);
        }
        let t = Instant::now();
        let weights = Mamba2Weights::random(&self.cfg, dtype, SEED)?;
        let model = Mamba2::new(&self.client, self.cfg.clone(), &weights)?;
        eprintln!(
            "  {} model: random weights + upload {:.1}s",
            dtype_name(dtype),
            secs_since(t)
        );
        self.models.push((dtype, model));
        Ok(&self.models.last().expect("pushed").1)
    }

    /// A model already made by [`Ctx::model`].
    fn get(&self, dtype: DType) -> &Mamba2 {
        &self
            .models
            .iter()
            .find(|(d, _)| *d == dtype)
            .expect("model made")
            .1
    }

    fn figure(&self, key: &str) -> Option<f64> {
        self.figures.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    /// Records (or replaces) a figure.
    fn set_figure(&mut self, key: impl Into<String>, v: f64) {
        let key = key.into();
        self.figures.retain(|(k, _)| *k != key);
        self.figures.push((key, v));
    }

    /// Median seconds of `Mamba2::prefill` (what `generate` runs before its loop: states and
    /// the last position's logits) of `batch` prompts of `len` tokens, measured on first use;
    /// and the prompt bucket.
    fn prefill_time(&mut self, dtype: DType, batch: usize, len: usize) -> Result<(f64, usize)> {
        self.model(dtype)?;
        let bucket = self
            .get(dtype)
            .prompt_bucket(len)
            .context("prompt too long")?;
        if let Some((_, s)) = self
            .prefill_secs
            .iter()
            .find(|(k, _)| *k == (dtype, batch, bucket))
        {
            return Ok((*s, bucket));
        }
        let model = self.get(dtype);
        let prompts: Vec<Vec<u32>> = (0..batch).map(|r| prompt(len, r)).collect();
        let t = Instant::now();
        model.prefill(&prompts)?;
        eprintln!(
            "  prefill {} b{batch} l{bucket} (chunk {}): first call (compile + run) {:.1}s",
            dtype_name(dtype),
            model.prefill_chunk(len),
            secs_since(t)
        );
        let (reps, warm_up) = self.plan.prefill_reps(batch * bucket);
        if warm_up {
            model.prefill(&prompts)?;
        }
        let (times, _) = timed(reps, || Ok(model.prefill(&prompts)?))?;
        let s = median(&times);
        self.prefill_secs.push(((dtype, batch, bucket), s));
        Ok((s, bucket))
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Ceilings.

fn program_matvec(n_in: usize, n_out: usize, out_in: bool) -> String {
    let (d0, d1, contract) = if out_in {
        (n_out, n_in, 1)
    } else {
        (n_in, n_out, 0)
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

/// A cheap deterministic fill.
fn fill(len: usize, modulus: usize, scale: f32) -> Vec<f32> {
    (0..len).map(|i| (i % modulus) as f32 * scale).collect()
}

fn check_close(what: &str, got: f32, want: f64, tol: f64) -> Result<()> {
    let err = (f64::from(got) - want).abs() / want.abs().max(f64::MIN_POSITIVE);
    ensure!(
        err <= tol,
        "{what}: device {got}, host {want}; refusing to report the speed of a wrong result"
    );
    Ok(())
}

fn bench_ceilings(ctx: &mut Ctx) -> Result<Value> {
    let client = ctx.client.clone();
    let (n_in, n_out) = ctx.plan.matvec;
    let x = fill(n_in, 7, 0.1);
    let w = fill(n_in * n_out, 13, 0.01);
    let dx = client.buffer_from_slice(&x, &[n_in])?;
    let mut table = Table::new(
        "machine ceilings (same plugin, best of 8)",
        &["figure", "value", "unit"],
    );
    let mut out = serde_json::Map::new();
    for out_in in [false, true] {
        let exe = client.compile(&program_matvec(n_in, n_out, out_in))?;
        let dims = if out_in { [n_out, n_in] } else { [n_in, n_out] };
        let dw = client.buffer_from_slice(&w, &dims)?;
        exe.execute(&[&dx, &dw])?;
        let (times, res) = timed(8, || Ok(exe.execute(&[&dx, &dw])?))?;
        let got = res[0].to_vec::<f32>()?;
        for j in [0, n_out / 2 + 3, n_out - 1] {
            let want: f64 = (0..n_in)
                .map(|i| {
                    let k = if out_in { j * n_in + i } else { i * n_out + j };
                    f64::from(x[i]) * f64::from(w[k])
                })
                .sum();
            check_close(&format!("matvec[{j}]"), got[j], want, 1e-3)?;
        }
        let gbs = (w.len() * 4) as f64 / times[0] / 1e9;
        let (key, name) = if out_in {
            ("read_bandwidth_out_in", "x @ W.T, W [out, in]")
        } else {
            ("read_bandwidth_in_out", "x @ W, W [in, out]")
        };
        table.row(vec![
            format!("f32 matvec {name}, {} MiB", (w.len() * 4) >> 20),
            show(gbs),
            "GB/s".into(),
        ]);
        out.insert(key.into(), json!(gbs));
        ctx.set_figure(key, gbs * 1e9);
    }
    drop(w);
    let n = ctx.plan.matmul;
    let exe = client.compile(&program_matmul(n))?;
    let (a, b) = (fill(n * n, 13, 0.01), fill(n * n, 7, 0.1));
    let (da, db) = (
        client.buffer_from_slice(&a, &[n, n])?,
        client.buffer_from_slice(&b, &[n, n])?,
    );
    exe.execute(&[&da, &db])?;
    let (times, res) = timed(8, || Ok(exe.execute(&[&da, &db])?))?;
    let got = res[0].to_vec::<f32>()?;
    for (i, j) in [(0, 0), (n / 2, 7), (n - 1, n / 3)] {
        let want: f64 = (0..n)
            .map(|k| f64::from(a[i * n + k]) * f64::from(b[k * n + j]))
            .sum();
        check_close(&format!("matmul[{i}, {j}]"), got[i * n + j], want, 1e-3)?;
    }
    let flops = 2.0 * (n as f64).powi(3) / times[0];
    table.row(vec![
        format!("f32 matmul {n}x{n}x{n}"),
        show(flops / 1e9),
        "GFLOP/s".into(),
    ]);
    out.insert("matmul_gflops".into(), json!(flops / 1e9));
    ctx.set_figure("matmul_flops", flops);
    table.print();
    Ok(Value::Object(out))
}

// ---------------------------------------------------------------------------------------------
// 2. Prefill.

/// Parameters read by the matrices per token of the layers (in_proj and out_proj), and of the
/// head (once per sequence in prefill, once per token in decode).
fn matmul_params(cfg: &Mamba2Config) -> (f64, f64) {
    let layer = cfg.in_proj_dim() * cfg.hidden_size + cfg.hidden_size * cfg.d_inner();
    (
        (layer * cfg.num_layers) as f64,
        (cfg.vocab_size * cfg.hidden_size) as f64,
    )
}

/// SSD FLOPs per token (chunked, all layers): per head, the within-chunk `C B^T` (2 Q N) and
/// its product with `X` (2 Q P) over the whole Q x Q block (the masked half is computed too), the
/// chunk state (2 N P) and the state's contribution to the output (2 N P).
fn ssd_flops_per_token(cfg: &Mamba2Config, chunk: usize) -> f64 {
    let (q, n, p) = (chunk as f64, cfg.state_size as f64, cfg.head_dim as f64);
    (cfg.num_layers * cfg.num_heads) as f64 * (2.0 * q * (n + p) + 4.0 * n * p)
}

/// Prefill FLOPs per real token: 2 x layer matmul params + SSD FLOPs, plus the head's
/// 2 x vocab x hidden once per sequence of `len` tokens (padded positions do the same work).
fn prefill_flops_per_token(cfg: &Mamba2Config, len: usize, bucket: usize, chunk: usize) -> f64 {
    let (layers, head) = matmul_params(cfg);
    ((2.0 * layers + ssd_flops_per_token(cfg, chunk)) * bucket as f64 + 2.0 * head) / len as f64
}

fn bench_prefill(ctx: &mut Ctx) -> Result<Value> {
    let mut table = Table::new(
        "prefill: states + last-position logits (median)",
        &[
            "prompt",
            "batch",
            "dtype",
            "bucket",
            "chunk",
            "ms",
            "tokens/s",
            "GFLOP/s",
            "of matmul peak",
        ],
    );
    let peak = ctx.figure("matmul_flops");
    let mut rows = Vec::new();
    let lens = ctx.plan.prefill_lens.clone();
    for &len in &lens {
        for batch in [1, 8] {
            if batch == 8 && len > ctx.plan.batch8_max_len {
                continue;
            }
            for dtype in [DType::F32, DType::BF16] {
                let (s, bucket) = ctx.prefill_time(dtype, batch, len)?;
                let chunk = ctx.get(dtype).prefill_chunk(len);
                let tps = (batch * len) as f64 / s;
                let flops = prefill_flops_per_token(&ctx.cfg, len, bucket, chunk) * tps;
                let util = peak.map(|p| flops / p);
                table.row(vec![
                    len.to_string(),
                    batch.to_string(),
                    dtype_name(dtype).into(),
                    bucket.to_string(),
                    chunk.to_string(),
                    show(s * 1e3),
                    show(tps),
                    show(flops / 1e9),
                    util.map_or("-".into(), |u| format!("{:.0}%", u * 100.0)),
                ]);
                ctx.set_figure(
                    format!("prefill_tps_{}_b{batch}_{len}", dtype_name(dtype)),
                    tps,
                );
                rows.push(json!({
                    "prompt_len": len, "batch": batch, "dtype": dtype_name(dtype),
                    "bucket": bucket, "chunk": chunk, "median_ms": s * 1e3, "tokens_per_s": tps,
                    "gflops": flops / 1e9, "flop_utilisation": util,
                }));
            }
        }
    }
    table.print();
    Ok(json!({
        "flops_per_token_formula": "(2 * layer matmul params + SSD flops) per bucket position \
            + 2 * vocab * hidden per sequence, over real tokens; SSD per layer and head \
            2 Q (N + P) + 4 N P",
        "flops_per_token_2048": prefill_flops_per_token(
            &ctx.cfg,
            2048,
            2048,
            ctx.get(DType::F32).prefill_chunk(2048)
        ),
        "rows": rows,
    }))
}

// ---------------------------------------------------------------------------------------------
// 3. Decode.

/// Bytes a decode step reads: every weight once (the tied embedding as the head) and the
/// recurrent state of `batch` rows.
fn decode_bytes_per_step(cfg: &Mamba2Config, dtype: DType, batch: usize) -> Result<f64> {
    let types = Mamba2Weights::<TensorType>::types(cfg, dtype)?;
    let weights: usize = types
        .named()
        .iter()
        .map(|(_, t)| t.byte_size().unwrap_or(0))
        .sum();
    let state = cfg.num_layers
        * batch
        * 4
        * (cfg.conv_dim() * cfg.conv_kernel + cfg.num_heads * cfg.head_dim * cfg.state_size);
    Ok((weights + state) as f64)
}

/// Segment length of the streamed decode of the device-loop table.
const STREAM_SEGMENT: usize = 16;

/// The sampled decode of the device-loop table: temperature 0.8, top-k 50, top-p 0.9.
const SAMPLED: Sampling = Sampling::Sample {
    temperature: 0.8,
    top_k: 50,
    top_p: 0.9,
    seed: 7,
};

/// (a) the device loop: seconds per step (one token per row) of each run, from `generate`
/// minus the prefill.
fn device_loop(
    ctx: &mut Ctx,
    dtype: DType,
    batch: usize,
    n: usize,
    runs: usize,
    sampling: Sampling,
    stream: Option<usize>,
) -> Result<Vec<f64>> {
    let (pre, _) = ctx.prefill_time(dtype, batch, DECODE_PROMPT)?;
    let model = ctx.get(dtype);
    let prompts: Vec<Vec<u32>> = (0..batch).map(|r| prompt(DECODE_PROMPT, r)).collect();
    let options = GenerateOptions {
        sampling,
        ..greedy(n)
    };
    let run = || -> Result<Vec<Vec<u32>>> {
        Ok(match stream {
            Some(k) => model.generate_stream(&prompts, &options, k, |_| true)?,
            None => model.generate(&prompts, &options)?,
        })
    };
    let t = Instant::now();
    let first = run()?;
    eprintln!(
        "  generate {} b{batch} n{n} {}{}: first call (compile + run) {:.1}s",
        dtype_name(dtype),
        sampling_name(&sampling),
        stream.map_or(String::new(), |k| format!(" streamed K={k}")),
        secs_since(t)
    );
    let (times, last) = timed(runs, run)?;
    ensure!(first == last, "generate is not deterministic");
    Ok(sorted(times.iter().map(|t| (t - pre) / n as f64).collect()))
}

fn sampling_name(s: &Sampling) -> String {
    match *s {
        Sampling::Greedy => "greedy".into(),
        Sampling::Sample {
            temperature,
            top_k,
            top_p,
            ..
        } => format!("t{temperature} k{top_k} p{top_p}"),
    }
}

/// (b) the host loop: greedy tokens through `Mamba2::step`, timing each step with its logits
/// download and argmax. Returns the sequence (prompt and generated), each step's seconds (step
/// `i` consumes token `DECODE_PROMPT + i`), and the logits after consuming each context.
struct HostLoop {
    seq: Vec<u32>,
    step_secs: Vec<f64>,
    logits_at: Vec<(usize, Vec<f64>)>,
}

fn host_loop(model: &Mamba2, total: usize, contexts: &[usize]) -> Result<HostLoop> {
    let mut seq = prompt(DECODE_PROMPT, 0);
    let pre = model.prefill(std::slice::from_ref(&seq))?;
    let vocab = model.config().vocab_size;
    let last = pre.logits.to_f64_vec();
    let last = &last[last.len() - vocab..];
    let mut next = argmax_rows(&HostArray::from_vec(
        &[1, vocab],
        last.iter().map(|&v| v as f32).collect(),
    )?)?[0];
    let mut state: Mamba2State = pre.state;
    // Compile and warm the step program on a throwaway copy of the state.
    {
        let warm = model.prefill(std::slice::from_ref(&seq))?;
        model.step(&[next], warm.state)?;
    }
    let mut step_secs = Vec::with_capacity(total);
    let mut logits_at = Vec::new();
    while seq.len() < total {
        seq.push(next);
        let t = Instant::now();
        let (logits, s) = model.step(&[next], state)?;
        next = argmax_rows(&logits)?[0];
        step_secs.push(secs_since(t));
        state = s;
        if contexts.contains(&seq.len()) {
            logits_at.push((seq.len(), logits.to_f64_vec()));
        }
    }
    Ok(HostLoop {
        seq,
        step_secs,
        logits_at,
    })
}

/// The host loop's step seconds for the 256 steps ending at `context`.
fn window(h: &HostLoop, context: usize) -> Vec<f64> {
    let end = context - DECODE_PROMPT; // step i consumes token DECODE_PROMPT + i
    let start = end.saturating_sub(256);
    sorted(h.step_secs[start..end].to_vec())
}

/// (c) recomputation: per-token seconds at `context` (prefill the whole prefix, download the last
/// logits, argmax), checking the logits against the cached decode.
fn recompute(ctx: &mut Ctx, h: &HostLoop, context: usize) -> Result<Vec<f64>> {
    let k = ctx.plan.recompute_tokens(context);
    let model = ctx.get(DType::F32);
    let mut times = Vec::new();
    model.prefill(&[h.seq[..context].to_vec()])?;
    for len in context + 1 - k..=context {
        let t = Instant::now();
        let logits = model.prefill(&[h.seq[..len].to_vec()])?.logits;
        let token = argmax_rows(&logits)?[0];
        times.push(secs_since(t));
        if len == context {
            let (_, cached) = h
                .logits_at
                .iter()
                .find(|(c, _)| *c == context)
                .context("no cached logits at the context")?;
            let d = max_abs_diff(&logits.to_f64_vec(), cached);
            ensure!(
                d < 1e-3,
                "recomputed logits at {context} differ from the cached decode by {d}"
            );
        }
        std::hint::black_box(token);
    }
    Ok(sorted(times))
}

fn bench_decode(ctx: &mut Ctx) -> Result<Value> {
    let bandwidth = ctx.figure("read_bandwidth_out_in");
    let mut table = Table::new(
        format!(
            "decode (a): on-device loop (generate) after a {DECODE_PROMPT}-token prompt; \
             ms/step = (generate - prefill) / tokens, P50/P99 over the runs (one figure per run)"
        ),
        &[
            "batch",
            "dtype",
            "sampling",
            "tokens x runs",
            "tokens/s",
            "ms/step P50",
            "P99",
            "MB read/step",
            "GB/s",
            "of read bw",
        ],
    );
    let mut device = Vec::new();
    for (batch, n, runs) in ctx.plan.device_loops.clone() {
        for (dtype, sampling, stream) in [
            (DType::F32, Sampling::Greedy, None),
            (DType::F32, Sampling::Greedy, Some(STREAM_SEGMENT)),
            (DType::F32, SAMPLED, None),
            (DType::BF16, Sampling::Greedy, None),
        ] {
            let per_step = device_loop(ctx, dtype, batch, n, runs, sampling, stream)?;
            let (p50, p99) = (median(&per_step), quantile(&per_step, 0.99));
            let tps = batch as f64 / p50;
            let bytes = decode_bytes_per_step(&ctx.cfg, dtype, batch)?;
            let gbs = bytes / p50;
            let util = bandwidth.map(|b| gbs / b);
            let mut name = sampling_name(&sampling);
            if let Some(k) = stream {
                name += &format!(", streamed K={k}");
            }
            table.row(vec![
                batch.to_string(),
                dtype_name(dtype).into(),
                name.clone(),
                format!("{n} x {runs}"),
                show(tps),
                show(p50 * 1e3),
                show(p99 * 1e3),
                show(bytes / 1e6),
                show(gbs / 1e9),
                util.map_or("-".into(), |u| format!("{:.0}%", u * 100.0)),
            ]);
            if stream.is_some() || sampling != Sampling::Greedy {
                let what = if stream.is_some() {
                    "streamed"
                } else {
                    "sampled"
                };
                ctx.set_figure(format!("device_loop_{what}_f32_b{batch}"), p50);
                device.push(json!({
                    "batch": batch, "dtype": dtype_name(dtype), "sampling": name, "tokens": n,
                    "runs": runs, "tokens_per_s": tps, "ms_per_step_p50": p50 * 1e3,
                    "ms_per_step_p99": p99 * 1e3,
                }));
                continue;
            }
            ctx.set_figure(format!("device_loop_{}_b{batch}", dtype_name(dtype)), p50);
            if let Some(u) = util {
                ctx.set_figure(
                    format!("device_loop_util_{}_b{batch}", dtype_name(dtype)),
                    u,
                );
            }
            device.push(json!({
                "batch": batch, "dtype": dtype_name(dtype), "sampling": name, "tokens": n,
                "runs": runs, "tokens_per_s": tps, "ms_per_step_p50": p50 * 1e3,
                "ms_per_step_p99": p99 * 1e3, "bytes_read_per_step": bytes,
                "read_gbs": gbs / 1e9, "bandwidth_utilisation": util,
            }));
        }
    }
    table.print();

    // (b) host loop, f32 and bf16, and (c) recomputation (f32).
    let contexts = ctx.plan.contexts.clone();
    let total = *contexts.iter().max().context("no contexts")?;
    let shortest = *contexts.iter().min().context("no contexts")?;
    let mut hosts = Vec::new();
    // bf16 only to the shortest context: its step program is slow on XLA CPU (see the README).
    for (dtype, len) in [(DType::F32, total), (DType::BF16, shortest)] {
        ctx.model(dtype)?;
        let t = Instant::now();
        let h = host_loop(ctx.get(dtype), len, &contexts)?;
        eprintln!(
            "  host loop {}: {} steps in {:.1}s",
            dtype_name(dtype),
            h.step_secs.len(),
            secs_since(t)
        );
        hosts.push((dtype, h));
    }
    let mut table = Table::new(
        "decode (b) host loop of Mamba2::step (batch 1, per-token latency over the 256 steps \
         ending at the context) against (c) recomputing the whole prefix per token (f32)",
        &[
            "context",
            "dtype",
            "cached P50 ms",
            "P99 ms",
            "tokens/s",
            "of read bw",
            "recompute ms",
            "recompute/cached",
        ],
    );
    let mut rows = Vec::new();
    let mut recomputed = Vec::new();
    for &c in &contexts {
        let host_f32 = &hosts[0].1;
        let re = recompute(ctx, host_f32, c)?;
        let re_ms = median(&re) * 1e3;
        recomputed.push((c, median(&re)));
        for (dtype, h) in &hosts {
            if h.seq.len() < c {
                continue;
            }
            let w = window(h, c);
            let (p50, p99) = (median(&w), quantile(&w, 0.99));
            let bytes = decode_bytes_per_step(&ctx.cfg, *dtype, 1)?;
            let util = bandwidth.map(|b| bytes / p50 / b);
            let f32_row = *dtype == DType::F32;
            if f32_row {
                ctx.set_figure(format!("host_loop_p50_{c}"), p50);
                ctx.set_figure(format!("recompute_over_cached_{c}"), re_ms / (p50 * 1e3));
            }
            table.row(vec![
                c.to_string(),
                dtype_name(*dtype).into(),
                show(p50 * 1e3),
                show(p99 * 1e3),
                show(1.0 / p50),
                util.map_or("-".into(), |u| format!("{:.0}%", u * 100.0)),
                if f32_row { show(re_ms) } else { "".into() },
                if f32_row {
                    format!("{:.1}x", re_ms / (p50 * 1e3))
                } else {
                    "".into()
                },
            ]);
            rows.push(json!({
                "context": c, "dtype": dtype_name(*dtype), "cached_ms_p50": p50 * 1e3,
                "cached_ms_p99": p99 * 1e3, "cached_tokens_per_s": 1.0 / p50,
                "bandwidth_utilisation": util, "samples": w.len(),
                "recompute_ms_median": f32_row.then_some(re_ms),
                "recompute_tokens_measured": f32_row.then_some(re.len()),
                "recompute_over_cached": f32_row.then_some(re_ms / (p50 * 1e3)),
            }));
        }
    }
    table.print();

    // Recompute cost at every bucket up to the longest context, interpolating linearly between
    // measured buckets; the total time to generate every position by recomputation.
    for (dtype_len, secs) in ctx
        .prefill_secs
        .iter()
        .filter(|((d, b, _), _)| *d == DType::F32 && *b == 1)
        .map(|((_, _, l), s)| (*l, *s))
        .collect::<Vec<_>>()
    {
        if !recomputed.iter().any(|(c, _)| *c == dtype_len) {
            recomputed.push((dtype_len, secs));
        }
    }
    recomputed.sort_by_key(|(c, _)| *c);
    let chunk = ctx.cfg.chunk_size;
    let per_position = |p: usize| interpolate(&recomputed, p.div_ceil(chunk) * chunk);
    let host = &hosts[0].1;
    let cached_total: f64 = host.step_secs.iter().sum();
    let recompute_total: f64 = (DECODE_PROMPT + 1..=total).map(per_position).sum();
    let steps = host.step_secs.len();
    println!(
        "generating positions {}..={total} ({steps} tokens): cached host loop {:.1}s measured, \
         recomputation {:.1}s (extrapolated from the prefill times at {:?}), {:.0}x",
        DECODE_PROMPT + 1,
        cached_total,
        recompute_total,
        recomputed.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
        recompute_total / cached_total
    );
    let svg = latency_svg(host, &recomputed, chunk, total);
    let name = if ctx.plan.quick {
        "decode_latency-quick.svg"
    } else {
        "decode_latency.svg"
    };
    let file = bench_dir()?.join(name);
    std::fs::write(&file, svg).with_context(|| format!("writing {}", file.display()))?;
    println!("wrote {}", file.display());
    Ok(json!({
        "device_loop": device,
        "host_loop_and_recompute": rows,
        "recompute_prefill_secs_by_bucket": recomputed,
        "generate_all_positions": {
            "from": DECODE_PROMPT + 1, "to": total, "cached_host_loop_s": cached_total,
            "recompute_s_extrapolated": recompute_total,
        },
        "host_loop_step_ms": host.step_secs.iter().map(|s| s * 1e3).collect::<Vec<_>>(),
    }))
}

/// Linear interpolation (and extrapolation from the last two points) of sorted `(x, y)` at `x`.
fn interpolate(points: &[(usize, f64)], x: usize) -> f64 {
    let i = points.partition_point(|(px, _)| *px < x);
    if let Some(&(px, py)) = points.get(i) {
        if px == x {
            return py;
        }
    }
    let (a, b) = match i {
        0 => (points[0], points[1.min(points.len() - 1)]),
        i if i >= points.len() => (
            points[points.len().saturating_sub(2)],
            points[points.len() - 1],
        ),
        i => (points[i - 1], points[i]),
    };
    if a.0 == b.0 {
        return a.1;
    }
    a.1 + (b.1 - a.1) * (x as f64 - a.0 as f64) / (b.0 as f64 - a.0 as f64)
}

// ---------------------------------------------------------------------------------------------
// The plot.

/// Per-token latency (log scale) against position: the cached host loop (every step) and
/// recomputation (a staircase over prefill buckets; dots where measured).
fn latency_svg(h: &HostLoop, recomputed: &[(usize, f64)], chunk: usize, total: usize) -> String {
    let (w, ht, left, right, top, bottom) = (760.0, 420.0, 70.0, 20.0, 40.0, 50.0);
    let all_ms: Vec<f64> = h
        .step_secs
        .iter()
        .chain(recomputed.iter().map(|(_, s)| s))
        .map(|s| s * 1e3)
        .collect();
    let lo = all_ms.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = all_ms.iter().cloned().fold(0.0, f64::max);
    let (y0, y1) = (lo.log10().floor(), hi.log10().ceil());
    let x = |p: f64| left + (w - left - right) * p / total as f64;
    let y = |ms: f64| top + (ht - top - bottom) * (y1 - ms.log10()) / (y1 - y0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{ht}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{ht}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="14">Mamba-2 130M decode, per-token latency (batch 1, f32)</text>"#,
        w / 2.0
    );
    // Grid and axes.
    let mut d = y0;
    while d <= y1 {
        let ms = 10f64.powf(d);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{x2}" y1="{yy:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{tx}" y="{ty:.1}" text-anchor="end">{label}</text>"##,
            x2 = w - right,
            yy = y(ms),
            tx = left - 6.0,
            ty = y(ms) + 4.0,
            label = if ms >= 1.0 {
                format!("{ms:.0} ms")
            } else {
                format!("{ms} ms")
            }
        );
        d += 1.0;
    }
    let step = if total > 2048 { 512 } else { 128 };
    for p in (0..=total).step_by(step) {
        let _ = writeln!(
            s,
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="{top}" y2="{1}" stroke="#eee"/><text x="{0:.1}" y="{2}" text-anchor="middle">{p}</text>"##,
            x(p as f64),
            ht - bottom,
            ht - bottom + 16.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">position (tokens in the context)</text>"#,
        (left + w - right) / 2.0,
        ht - 12.0
    );
    // Cached: one point per step.
    let pts: Vec<String> = h
        .step_secs
        .iter()
        .enumerate()
        .map(|(i, sec)| {
            format!(
                "{:.1},{:.1}",
                x((DECODE_PROMPT + i + 1) as f64),
                y(sec * 1e3)
            )
        })
        .collect();
    let _ = writeln!(
        s,
        r##"<polyline fill="none" stroke="#1f77b4" stroke-width="0.8" points="{}"/>"##,
        pts.join(" ")
    );
    // Recomputed: a staircase over buckets, interpolated between measured buckets.
    let mut stairs = Vec::new();
    let mut b = chunk;
    while b - chunk < total {
        let ms = interpolate(recomputed, b) * 1e3;
        stairs.push(format!("{:.1},{:.1}", x((b - chunk) as f64), y(ms)));
        stairs.push(format!("{:.1},{:.1}", x(b.min(total) as f64), y(ms)));
        b += chunk;
    }
    let _ = writeln!(
        s,
        r##"<polyline fill="none" stroke="#d62728" stroke-width="1.5" points="{}"/>"##,
        stairs.join(" ")
    );
    for (c, sec) in recomputed {
        let _ = writeln!(
            s,
            r##"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="#d62728"/>"##,
            x(*c as f64),
            y(sec * 1e3)
        );
    }
    let legend = [
        ("#1f77b4", "cached: host loop of Mamba2::step, every token"),
        (
            "#d62728",
            "recomputed: prefill of the whole prefix (dots measured, steps interpolated)",
        ),
    ];
    // The legend sits in the empty band between the two curves (geometric middle).
    let cached = median(&sorted(h.step_secs.clone())) * 1e3;
    let fastest_recompute = recomputed
        .iter()
        .map(|(_, s)| s * 1e3)
        .fold(f64::INFINITY, f64::min);
    let band = y((cached * fastest_recompute).sqrt()) - 9.0;
    for (i, (color, text)) in legend.iter().enumerate() {
        let ly = band + 18.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{0}" x2="{1}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"/><text x="{2}" y="{3}">{text}</text>"#,
            left + 150.0,
            left + 174.0,
            left + 180.0,
            ly + 4.0
        );
    }
    s.push_str("</svg>\n");
    s
}

// ---------------------------------------------------------------------------------------------
// 4. Static masks against a loop.

/// A deterministic uniform fill in `[lo, hi)` (SplitMix64).
fn uniform(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (lo + (hi - lo) * ((z >> 11) as f64 / (1u64 << 53) as f64)) as f32
        })
        .collect()
}

/// One layer's SSD at length `len` (130M shape), chunked (`Some(chunk)`) or as a loop over
/// positions (`None`).
fn ssd_graph(cfg: &Mamba2Config, len: usize, chunk: Option<usize>) -> Result<Graph> {
    let (h, p, n) = (cfg.num_heads, cfg.head_dim, cfg.state_size);
    let g = Graph::new();
    let x = g.parameter("x", DType::F32, &[1, len, h, p])?;
    let dt = g.parameter("dt", DType::F32, &[1, len, h])?;
    let a = g.parameter("a", DType::F32, &[h])?;
    let b = g.parameter("b", DType::F32, &[1, len, h, n])?;
    let c = g.parameter("c", DType::F32, &[1, len, h, n])?;
    let (y, s) = match chunk {
        Some(q) => ssd::ssd_chunked(&x, &dt, &a, &b, &c, None, q)?,
        None => {
            let init = g.zeros(DType::F32, &[1, h, p, n])?;
            ssd::ssd_recurrent(&x, &dt, &a, &b, &c, &init)?
        }
    };
    g.set_outputs(&[&y, &s])?;
    Ok(g)
}

fn bench_ssd(ctx: &mut Ctx) -> Result<Value> {
    let cfg = ctx.cfg.clone();
    let (h, p, n) = (cfg.num_heads, cfg.head_dim, cfg.state_size);
    let chunks = ctx.plan.ssd_chunks.clone();
    let mut head: Vec<String> = vec!["L".into(), "loop ms".into()];
    head.extend(chunks.iter().map(|q| format!("chunk {q} ms")));
    head.extend(chunks.iter().map(|q| format!("loop/chunk {q}")));
    head.push("max rel. diff".into());
    let mut table = Table::new(
        format!(
            "SSD of one layer (130M shape, batch 1, median): a fori_loop over positions \
             (ssd_recurrent) against the chunked form with static tril masks (ssd_chunked; \
             the model uses chunk {})",
            cfg.chunk_size
        ),
        &head.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let mut rows = Vec::new();
    for len in ctx.plan.ssd_lens.clone() {
        let host = [
            (vec![1, len, h, p], uniform(len * h * p, 1, -1.0, 1.0)),
            (vec![1, len, h], uniform(len * h, 2, 0.001, 0.1)),
            (vec![h], uniform(h, 3, -16.0, -1.0)),
            (vec![1, len, h, n], uniform(len * h * n, 4, -1.0, 1.0)),
            (vec![1, len, h, n], uniform(len * h * n, 5, -1.0, 1.0)),
        ];
        let bufs = host
            .iter()
            .map(|(d, v)| Ok(ctx.client.buffer_from_slice(v, d)?))
            .collect::<Result<Vec<_>>>()?;
        let args: Vec<&Buffer> = bufs.iter().collect();
        let mut ms = Vec::new();
        let mut reference: Option<Vec<f32>> = None;
        let mut worst: f64 = 0.0;
        let variants = std::iter::once(None).chain(chunks.iter().map(|&q| Some(q)));
        for chunk in variants {
            let program = ssd_graph(&cfg, len, chunk)?.compile(&ctx.client)?;
            program.run_buffers(&args)?;
            let reps = if chunk.is_some() { 10 } else { 5 };
            let (times, outs) = timed(reps, || Ok(program.run_buffers(&args)?))?;
            let y = outs[0].to_vec::<f32>()?;
            match &reference {
                None => reference = Some(y),
                Some(r) => {
                    let scale = r.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let d = r
                        .iter()
                        .zip(&y)
                        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                    worst = worst.max(f64::from(d / scale));
                }
            }
            ms.push(median(&times) * 1e3);
        }
        ensure!(
            worst < 1e-3,
            "chunked and looped SSD disagree at L = {len}: {worst}"
        );
        let mut row = vec![len.to_string()];
        row.extend(ms.iter().map(|&m| show(m)));
        row.extend(ms[1..].iter().map(|m| format!("{:.2}x", ms[0] / m)));
        row.push(show(worst));
        table.row(row);
        rows.push(json!({
            "len": len, "loop_ms": ms[0],
            "chunked_ms": chunks.iter().zip(&ms[1..]).map(|(q, m)| json!({"chunk": q, "ms": m}))
                .collect::<Vec<_>>(),
            "max_rel_diff": worst,
        }));
        ctx.set_figure(format!("ssd_loop_over_chunked_{len}"), ms[0] / ms[1]);
    }
    table.print();
    Ok(json!(rows))
}

// ---------------------------------------------------------------------------------------------
// 5. Precision.

/// Prefill logits (all positions) and those of `steps` decode steps fed `tokens`.
fn logits_trace(model: &Mamba2, prompt: &[u32], tokens: &[u32]) -> Result<(Vec<f64>, Vec<f64>)> {
    let pre = model.prefill(&[prompt.to_vec()])?;
    let mut state = pre.state;
    let mut steps = Vec::new();
    for &t in tokens {
        let (logits, s) = model.step(&[t], state)?;
        steps.extend(logits.to_f64_vec());
        state = s;
    }
    Ok((pre.logits.to_f64_vec(), steps))
}

fn bench_precision(ctx: &mut Ctx) -> Result<Value> {
    let len = ctx.plan.precision_len;
    let p = prompt(len, 0);
    // The f32 model's greedy continuation feeds every variant.
    let steps = ctx.plan.precision_steps;
    let tokens = ctx
        .model(DType::F32)?
        .generate(std::slice::from_ref(&p), &greedy(steps))?
        .remove(0);
    let (pf, sf) = logits_trace(ctx.get(DType::F32), &p, &tokens)?;
    ctx.model(DType::BF16)?;
    let (pb, sb) = logits_trace(ctx.get(DType::BF16), &p, &tokens)?;
    let scan_cfg = Mamba2Config {
        scan_dtype: DType::BF16,
        ..ctx.cfg.clone()
    };
    let scan_model = Mamba2::new(
        &ctx.client,
        scan_cfg,
        &Mamba2Weights::random(&ctx.cfg, DType::F32, SEED)?,
    )?;
    let (ps, ss) = logits_trace(&scan_model, &p, &tokens)?;
    drop(scan_model);
    let vocab = ctx.cfg.vocab_size;
    let agree = |a: &[f64], b: &[f64]| {
        let same = a
            .chunks(vocab)
            .zip(b.chunks(vocab))
            .filter(|(x, y)| argmax(x) == argmax(y))
            .count();
        same as f64 / (a.len() / vocab) as f64
    };
    let scale = max_abs(&pf);
    let mut table = Table::new(
        format!(
            "precision against f32 (prompt {len}, then {} decode steps; largest |logit| {})",
            tokens.len(),
            show(scale)
        ),
        &[
            "variant",
            "prefill max |dlogit|",
            "decode max |dlogit|",
            "same argmax",
        ],
    );
    let mut rows = Vec::new();
    for (name, pv, sv) in [
        ("bf16 matrices", &pb, &sb),
        ("f32, scan (A dt, cumsum, segsum, exp) in bf16", &ps, &ss),
    ] {
        let (dp, ds) = (max_abs_diff(&pf, pv), max_abs_diff(&sf, sv));
        let same = agree(&pf, pv);
        table.row(vec![
            name.into(),
            show(dp),
            show(ds),
            format!("{:.1}%", same * 100.0),
        ]);
        rows.push(json!({
            "variant": name, "prefill_max_abs_diff": dp, "decode_max_abs_diff": ds,
            "prefill_argmax_agreement": same,
        }));
    }
    table.print();
    Ok(
        json!({"prompt_len": len, "decode_steps": tokens.len(), "max_abs_logit": scale, "rows": rows}),
    )
}

fn argmax(v: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

// ---------------------------------------------------------------------------------------------
// 6. Memory.

/// A `/proc/self/status` field in KiB.
fn status_kib(field: &str) -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .with_context(|| format!("no {field} in /proc/self/status"))?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .context("malformed status line")?
        .parse()?)
}

/// The child: compile the generate program for `tokens` tokens, reset the high-water mark, run
/// it once after a 128-token prompt; print the peaks (KiB) as JSON.
fn memory_child(tokens: usize) -> Result<()> {
    let client = Client::cpu()?;
    client.set_compile_cache(CompileCache::memory_only());
    let cfg = Mamba2Config::mamba2_130m();
    let model = Mamba2::new(
        &client,
        cfg.clone(),
        &Mamba2Weights::random(&cfg, DType::F32, SEED)?,
    )?;
    let options = greedy(tokens);
    // Compiling the program's text puts it in the client's memory cache; generate reuses it.
    // The text is that of the prompt's own bucket (a short prompt gets a short chunk).
    let bucket = model
        .prompt_bucket(DECODE_PROMPT)
        .context("prompt too long")?;
    let [_, _, text] = model.stablehlo(1, bucket, &options)?;
    client.compile(&text)?;
    let compile_peak = status_kib("VmHWM:")?;
    // Reset the high-water mark (Linux >= 4.0) to see the run's own peak.
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let rss_before = status_kib("VmRSS:")?;
    let t = Instant::now();
    let out = model.generate(&[prompt(DECODE_PROMPT, 0)], &options)?;
    let run_s = secs_since(t);
    ensure!(
        client.cache_stats().compiles == 1,
        "generate compiled again"
    );
    ensure!(out[0].len() == tokens, "wrong number of tokens");
    let run_peak = status_kib("VmHWM:")?;
    println!(
        "{}",
        json!({
            "tokens": tokens, "vmhwm_kib": compile_peak.max(run_peak),
            "compile_peak_kib": compile_peak, "hwm_reset": reset,
            "rss_before_run_kib": rss_before, "run_peak_kib": run_peak, "run_s": run_s,
        })
    );
    Ok(())
}

fn bench_memory(ctx: &mut Ctx) -> Result<Value> {
    let exe = std::env::current_exe()?;
    let mut table = Table::new(
        format!(
            "peak resident memory, one child process per setting (f32, batch 1, \
             {DECODE_PROMPT}-token prompt)"
        ),
        &[
            "generated",
            "VmHWM MiB",
            "vs first",
            "compile peak MiB",
            "RSS before run MiB",
            "run peak MiB",
            "run adds MiB",
            "run s",
        ],
    );
    let mut rows: Vec<Value> = Vec::new();
    for tokens in ctx.plan.memory_tokens.clone() {
        let out = Command::new(&exe)
            .env(MEMORY_CHILD_ENV, tokens.to_string())
            .output()?;
        if !out.status.success() {
            bail!(
                "memory child ({tokens} tokens) failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let stdout = String::from_utf8(out.stdout)?;
        let line = stdout.lines().last().context("child printed nothing")?;
        let v: Value = serde_json::from_str(line)?;
        let kib = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
        let first = |k: &str| {
            rows.first()
                .map_or(kib(k), |r| r[k].as_f64().unwrap_or(f64::NAN))
        };
        let growth = |k: &str| kib(k) / first(k) - 1.0;
        table.row(vec![
            tokens.to_string(),
            show(kib("vmhwm_kib") / 1024.0),
            format!("{:+.2}%", growth("vmhwm_kib") * 100.0),
            show(kib("compile_peak_kib") / 1024.0),
            show(kib("rss_before_run_kib") / 1024.0),
            show(kib("run_peak_kib") / 1024.0),
            show((kib("run_peak_kib") - kib("rss_before_run_kib")) / 1024.0),
            show(kib("run_s")),
        ]);
        ctx.set_figure("memory_growth", growth("vmhwm_kib"));

        rows.push(v);
    }
    table.print();
    Ok(json!(rows))
}

// ---------------------------------------------------------------------------------------------
// 7. Compile: cold against warm.

fn bench_compile(ctx: &mut Ctx) -> Result<Value> {
    let n = ctx.plan.device_loops[0].1;
    ctx.model(DType::F32)?;
    let model = ctx.get(DType::F32);
    let t = Instant::now();
    let [_, step, generate] = model.stablehlo(1, ctx.cfg.chunk_size, &greedy(n))?;
    let lower_s = secs_since(t);
    let dir = std::env::temp_dir().join(format!("stablegraph-bench-mamba2-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let fresh = || -> Result<Client> {
        let c = Client::new(ctx.client.plugin(), &[])?;
        c.set_compile_cache(CompileCache::in_dir(&dir));
        Ok(c)
    };
    let mut table = Table::new(
        format!(
            "compile: cold (empty disk cache) against warm (fresh client, same cache); \
             building and lowering the three programs took {:.2}s",
            lower_s
        ),
        &["program", "StableHLO KiB", "cold s", "warm ms", "cold/warm"],
    );
    let mut rows = Vec::new();
    for (name, text) in [("step", &step), ("generate", &generate)] {
        let cold_client = fresh()?;
        let t = Instant::now();
        cold_client.compile(text)?;
        let cold = secs_since(t);
        let warm_client = fresh()?;
        let t = Instant::now();
        warm_client.compile(text)?;
        let warm = secs_since(t);
        ensure!(
            warm_client.cache_stats().disk_hits == 1,
            "the warm start did not load from the disk cache: {:?}",
            warm_client.cache_stats()
        );
        table.row(vec![
            format!("{name} (b1, prompt bucket 256, {n} tokens)"),
            show(text.len() as f64 / 1024.0),
            show(cold),
            show(warm * 1e3),
            format!("{:.0}x", cold / warm),
        ]);
        rows.push(json!({
            "program": name, "stablehlo_bytes": text.len(), "cold_s": cold, "warm_s": warm,
        }));
    }
    let _ = std::fs::remove_dir_all(&dir);
    table.print();
    Ok(json!({"lower_three_programs_s": lower_s, "rows": rows}))
}

// ---------------------------------------------------------------------------------------------
// Summary and main.

/// The issue's targets and the f32/bf16 comparison, from the figures the sections recorded.
fn summary(ctx: &Ctx) -> Value {
    let mut table = Table::new("summary", &["figure", "measured", "target / reference"]);
    let mut out = serde_json::Map::new();
    let mut add = |key: &str,
                   label: String,
                   value: Option<f64>,
                   fmt: &dyn Fn(f64) -> String,
                   target: &str| {
        if let Some(v) = value {
            table.row(vec![label, fmt(v), target.into()]);
            out.insert(key.into(), json!(v));
        }
    };
    let pct = |v: f64| format!("{:.0}%", v * 100.0);
    let times = |v: f64| format!("{v:.1}x");
    add(
        "decode_bandwidth_utilisation",
        "decode f32 batch 1 (device loop): bytes read x tokens/s / read bandwidth".into(),
        ctx.figure("device_loop_util_f32_b1"),
        &pct,
        ">= 60%",
    );
    let longest = ctx.plan.contexts.iter().max().copied().unwrap_or(0);
    add(
        "recompute_over_cached",
        format!("recomputation / cached decode, per token at context {longest}"),
        ctx.figure(&format!("recompute_over_cached_{longest}")),
        &times,
        ">= 27x (paper: 27x-36x at 4096)",
    );
    let tokens = &ctx.plan.memory_tokens;
    add(
        "memory_growth",
        format!(
            "peak memory, {} against {} generated tokens",
            tokens.last().unwrap_or(&0),
            tokens.first().unwrap_or(&0)
        ),
        ctx.figure("memory_growth"),
        &|v| format!("{:+.2}%", v * 100.0),
        "within 3%",
    );
    for &len in &ctx.plan.ssd_lens {
        add(
            &format!("ssd_loop_over_chunked_{len}"),
            format!(
                "SSD loop / chunked (chunk {}), L = {len}",
                ctx.cfg.chunk_size
            ),
            ctx.figure(&format!("ssd_loop_over_chunked_{len}")),
            &times,
            "paper: ~5.8x",
        );
    }
    let ratio = |a: &str, b: &str| Some(ctx.figure(a)? / ctx.figure(b)?);
    if let Some(&len) = ctx.plan.prefill_lens.last() {
        add(
            "prefill_bf16_over_f32",
            format!("prefill tokens/s bf16 / f32, batch 1, prompt {len}"),
            ratio(
                &format!("prefill_tps_bf16_b1_{len}"),
                &format!("prefill_tps_f32_b1_{len}"),
            ),
            &times,
            "",
        );
    }
    add(
        "decode_bf16_over_f32",
        "decode tokens/s bf16 / f32, batch 1 (device loop)".into(),
        ratio("device_loop_f32_b1", "device_loop_bf16_b1"),
        &times,
        "",
    );
    add(
        "sampling_over_greedy_ms",
        format!(
            "decode f32 batch 1: {} minus greedy, ms per step",
            sampling_name(&SAMPLED)
        ),
        ctx.figure("device_loop_sampled_f32_b1")
            .zip(ctx.figure("device_loop_f32_b1"))
            .map(|(s, g)| (s - g) * 1e3),
        &|v| format!("{v:+.2} ms"),
        "within 1 ms",
    );
    add(
        "streamed_over_one_program",
        format!("decode f32 batch 1: streamed in segments of {STREAM_SEGMENT} / one program, ms per step"),
        ratio("device_loop_streamed_f32_b1", "device_loop_f32_b1"),
        &|v| format!("{:+.1}%", (v - 1.0) * 100.0),
        "within 3%",
    );
    table.print();
    Value::Object(out)
}

fn bench_dir() -> Result<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

struct Args {
    quick: bool,
    only: Vec<String>,
}

fn parse_args() -> Result<Args> {
    // Cargo passes `--bench` to harness-less benches.
    let mut args = std::env::args().skip(1);
    let mut out = Args {
        quick: false,
        only: SECTIONS.iter().map(|s| s.to_string()).collect(),
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => out.quick = true,
            "--only" => {
                let list = args.next().context("--only needs a list of sections")?;
                out.only = list.split(',').map(str::to_string).collect();
                for s in &out.only {
                    ensure!(
                        SECTIONS.contains(&s.as_str()),
                        "unknown section {s}; sections: {}",
                        SECTIONS.join(", ")
                    );
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

fn main() -> Result<()> {
    if let Ok(tokens) = std::env::var(MEMORY_CHILD_ENV) {
        return memory_child(tokens.parse()?);
    }
    let args = parse_args()?;
    let start = Instant::now();
    let client = Client::cpu()?;
    // Every program is compiled here, not loaded from (or written to) the user's disk cache.
    client.set_compile_cache(CompileCache::memory_only());
    let mut ctx = Ctx {
        plan: Plan::new(args.quick),
        client,
        cfg: Mamba2Config::mamba2_130m(),
        models: Vec::new(),
        prefill_secs: Vec::new(),
        figures: Vec::new(),
    };
    let plugin = ctx.client.plugin().path().display().to_string();
    println!(
        "stablegraph Mamba-2 bench{}: 130M shape, random weights; plugin {plugin}",
        if args.quick { " (--quick)" } else { "" }
    );
    let mut report = serde_json::Map::new();
    report.insert("plugin".into(), json!(plugin));
    report.insert("quick".into(), json!(args.quick));
    type Section = fn(&mut Ctx) -> Result<Value>;
    let sections: [(&str, Section); 7] = [
        ("ceilings", bench_ceilings),
        ("prefill", bench_prefill),
        ("decode", bench_decode),
        ("ssd", bench_ssd),
        ("precision", bench_precision),
        ("memory", bench_memory),
        ("compile", bench_compile),
    ];
    for (name, run) in sections {
        if !args.only.iter().any(|s| s == name) {
            continue;
        }
        let t = Instant::now();
        eprintln!("[{name}]");
        let value = run(&mut ctx).with_context(|| format!("section {name}"))?;
        let s = secs_since(t);
        eprintln!("[{name}] {s:.0}s");
        report.insert(name.into(), json!({"seconds": s, "result": value}));
    }
    report.insert("summary".into(), summary(&ctx));
    let total = secs_since(start);
    report.insert("total_seconds".into(), json!(total));
    let file = bench_dir()?.join(if args.quick {
        "mamba2-quick.json"
    } else {
        "mamba2.json"
    });
    std::fs::write(&file, serde_json::to_string_pretty(&Value::Object(report))?)
        .with_context(|| format!("writing {}", file.display()))?;
    println!("\nwrote {} ({total:.0}s in all)", file.display());
    Ok(())
}
