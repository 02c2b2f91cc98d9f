//! Section 6: peak resident memory (VmHWM) of a child process (this binary again) per number of
//! generated tokens. The child compiles first, then resets the high-water mark, so the run's own
//! peak is reported too.

use std::process::Command;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};
use stablegraph::models::mamba2::{Mamba2, Mamba2Config, Mamba2Weights};
use stablegraph::runtime::{Client, CompileCache};
use stablegraph::DType;

use crate::common::{secs_since, show, status_kib};
use crate::context::{greedy, prompt, Ctx};
use crate::table::Table;
use crate::{DECODE_PROMPT, MEMORY_CHILD_ENV, SEED};

/// The child: compile the generate program for `tokens` tokens, reset the high-water mark, run
/// it once after a 128-token prompt; print the peaks (KiB) as JSON.
pub fn child(tokens: usize) -> Result<()> {
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

/// Runs the section (one child per setting); records `memory_growth`.
pub fn bench(ctx: &mut Ctx) -> Result<Value> {
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
