//! Section 10: the paper's five sizes (`Mamba2Config::sized`, 130M to 2.7B, random weights) with
//! f32, bf16 and 8-bit matrices, one child process (this binary again) per size and dtype:
//! prefill tokens/s at 512, decode ms per token, its share of the read bandwidth, peak resident
//! memory, and the decode run's own peak at two lengths (flat: an SSM's state does not grow with
//! the context). A setting whose weights and working memory would not fit the memory available
//! is reported as such, not run; a child that fails is reported with its error.

use std::process::Command;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};
use stablegraph::models::mamba2::{Mamba2, Mamba2Config, Mamba2Weights};
use stablegraph::runtime::{Client, CompileCache};
use stablegraph::DType;

use crate::common::{median, proc_kib, secs_since, show, status_kib, timed};
use crate::context::{greedy, prompt, Ctx};
use crate::decode::{decode_bytes_per_step, weight_bytes};
use crate::table::Table;
use crate::{DECODE_PROMPT, SEED, SIZES_CHILD_ENV};

/// The prompt length of the prefill column.
const PREFILL_LEN: usize = 512;
/// The matrix dtypes, by the CLI's names.
const DTYPES: [(&str, DType); 3] = [
    ("f32", DType::F32),
    ("bf16", DType::BF16),
    ("int8", DType::U8),
];
/// Memory a child needs besides its weights (runtime, compiler, activations), a guess that
/// only decides whether to try: the child's measured peak is what the table reports.
const OVERHEAD_BYTES: f64 = 1.5e9;

fn dtype_of(name: &str) -> Result<DType> {
    DTYPES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, d)| *d)
        .with_context(|| format!("unknown dtype {name}"))
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
fn mem_available() -> Result<f64> {
    Ok(proc_kib("/proc/meminfo", "MemAvailable:")? as f64 * 1024.0)
}

/// Resets the high-water mark (Linux >= 4.0); whether it worked.
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The child (`size,dtype,short,long,prefill_reps`): random weights, a prefill of
/// [`PREFILL_LEN`] tokens (one untimed call, then the timed ones), then greedy `generate` after a
/// [`DECODE_PROMPT`]-token prompt for `short` and for `long` tokens (one program: the capacity
/// covers both); decode seconds per token = (long run - short run) / (long - short), which
/// cancels the prefill and the per-call costs. Prints one JSON line.
pub fn child(arg: &str) -> Result<()> {
    let parts: Vec<&str> = arg.split(',').collect();
    let [size, dtype, short, long, reps] = parts[..] else {
        bail!("{SIZES_CHILD_ENV}: expected size,dtype,short,long,reps, got {arg}");
    };
    let (short, long, reps): (usize, usize, usize) = (short.parse()?, long.parse()?, reps.parse()?);
    ensure!(
        long > short && short.next_power_of_two() == long.next_power_of_two(),
        "short {short} and long {long}: long must exceed short, both under one power of two \
         (one compiled capacity)"
    );
    let dtype = dtype_of(dtype)?;
    let client = Client::cpu()?;
    client.set_compile_cache(CompileCache::memory_only());
    let cfg = Mamba2Config::sized(size)?;
    let t = Instant::now();
    let weights = Mamba2Weights::random(&cfg, dtype, SEED)?;
    // Owned weights: each host tensor is freed once on the device.
    let model = Mamba2::new(&client, cfg, weights)?;
    let load_s = secs_since(t);
    let long_prompt = vec![prompt(PREFILL_LEN, 0)];
    let t = Instant::now();
    model.prefill(&long_prompt)?;
    let prefill_first_s = secs_since(t);
    let (times, _) = timed(reps, || Ok(model.prefill(&long_prompt)?))?;
    let prefill_s = median(&times);
    let decode_prompt = vec![prompt(DECODE_PROMPT, 0)];
    let t = Instant::now();
    model.generate(&decode_prompt, &greedy(short))?;
    let generate_first_s = secs_since(t);
    let peak_before_runs = status_kib("VmHWM:")?;
    let run = |tokens: usize| -> Result<(f64, u64, bool)> {
        let reset = reset_peak();
        let t = Instant::now();
        let out = model.generate(&decode_prompt, &greedy(tokens))?;
        let s = secs_since(t);
        ensure!(
            out[0].len() == tokens,
            "generate gave {} tokens",
            out[0].len()
        );
        Ok((s, status_kib("VmHWM:")?, reset))
    };
    let (short_s, short_peak, reset) = run(short)?;
    let (long_s, long_peak, _) = run(long)?;
    ensure!(
        client.cache_stats().compiles == 2,
        "the decode runs compiled again"
    );
    println!(
        "{}",
        json!({
            "load_s": load_s, "prefill_first_s": prefill_first_s,
            "prefill_tokens_per_s": PREFILL_LEN as f64 / prefill_s,
            "generate_first_s": generate_first_s,
            "decode_s_per_token": (long_s - short_s) / (long - short) as f64,
            "peak_kib": peak_before_runs.max(short_peak).max(long_peak),
            "hwm_reset": reset, "run_peak_short_kib": short_peak, "run_peak_long_kib": long_peak,
        })
    );
    Ok(())
}

/// One setting's outcome: the child's JSON, or why there is none.
fn run_child(size: &str, dtype: &str, plan: (usize, usize, usize)) -> Result<Value> {
    let cfg = Mamba2Config::sized(size)?;
    let need = weight_bytes(&cfg, dtype_of(dtype)?)? as f64 + OVERHEAD_BYTES;
    let available = mem_available()?;
    if need > available {
        return Ok(json!({
            "skipped": format!(
                "does not fit: needs about {:.1} GB, {:.1} GB available",
                need / 1e9,
                available / 1e9
            )
        }));
    }
    let (short, long, reps) = plan;
    let out = Command::new(std::env::current_exe()?)
        .env(
            SIZES_CHILD_ENV,
            format!("{size},{dtype},{short},{long},{reps}"),
        )
        .output()?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr
            .lines()
            .find(|l| l.starts_with("Error:"))
            .or(stderr.lines().last())
            .unwrap_or("")
            .to_string();
        return Ok(json!({"failed": format!("child exited with {}: {last}", out.status)}));
    }
    let stdout = String::from_utf8(out.stdout)?;
    let line = stdout.lines().last().context("child printed nothing")?;
    Ok(serde_json::from_str(line)?)
}

/// Runs the section: every size of the plan in every dtype, one child each.
pub fn bench(ctx: &mut Ctx) -> Result<Value> {
    let bandwidth = ctx.figure("read_bandwidth_out_in");
    let (short, long, reps) = ctx.plan.sizes_decode;
    let mut table = Table::new(
        format!(
            "the paper's sizes (random weights, batch 1), one child process each: prefill of \
             {PREFILL_LEN} tokens (median of {reps}); decode after a {DECODE_PROMPT}-token prompt, \
             ms/token = (generate {long} - generate {short}) / {}; peak RSS of the process, and \
             the decode run's own peak at {short} and {long} tokens",
            long - short
        ),
        &[
            "size",
            "dtype",
            "weights MB",
            "prefill tok/s",
            "decode ms/token",
            "tokens/s",
            "of read bw",
            "peak RSS MB",
            "run peak MB (short / long)",
            "load s",
        ],
    );
    let mut rows = Vec::new();
    for size in ctx.plan.sizes.clone() {
        let cfg = Mamba2Config::sized(size)?;
        for (dtype, d) in DTYPES {
            let t = Instant::now();
            let v = run_child(size, dtype, (short, long, reps))?;
            crate::common::progress::note(format!("  {size} {dtype}: {:.0}s", secs_since(t)));
            let mb = weight_bytes(&cfg, d)? as f64 / 1e6;
            let mut cells = vec![size.to_string(), dtype.to_string(), show(mb)];
            if let Some(why) = v.get("skipped").or(v.get("failed")).and_then(Value::as_str) {
                cells.push(why.to_string());
                cells.resize(10, String::new());
            } else {
                let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
                let step = f("decode_s_per_token");
                let read = decode_bytes_per_step(&cfg, d, 1)? / step;
                let util =
                    bandwidth.map_or("–".to_string(), |b| format!("{:.0}%", read / b * 100.0));
                cells.extend([
                    show(f("prefill_tokens_per_s")),
                    show(step * 1e3),
                    show(1.0 / step),
                    util,
                    show(f("peak_kib") / 1024.0),
                    format!(
                        "{} / {}",
                        show(f("run_peak_short_kib") / 1024.0),
                        show(f("run_peak_long_kib") / 1024.0)
                    ),
                    show(f("load_s")),
                ]);
            }
            table.row(cells);
            rows.push(json!({"size": size, "dtype": dtype, "weights_mb": mb, "result": v}));
        }
    }
    table.print();
    Ok(json!(rows))
}
