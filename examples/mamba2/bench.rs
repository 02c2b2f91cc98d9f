//! `bench` (generation throughput over repeated runs) and `emit` (the StableHLO programs).

use std::path::PathBuf;

use anyhow::{ensure, Result};
use clap::Args;
use serde_json::json;
use stablegraph::models::GenerateOptions;

use crate::family;
use crate::generate::{warm_up, Timed};
use crate::load::{ModelArgs, PromptArgs, SamplingArgs};
use crate::open::{load, Loaded};
use crate::{bars, cache_hits, peak_rss_mb, progress, write_run_json};

/// The flags of `emit`.
#[derive(Args)]
pub(crate) struct EmitArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Output directory (created if missing).
    #[arg(long, value_name = "DIR")]
    out_dir: PathBuf,
}

/// The flags of `bench`.
#[derive(Args)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Timed runs after the compiling one.
    #[arg(long, default_value_t = 5, value_name = "N")]
    repeat: usize,
    /// Write every run and the medians as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// Over several devices, the collectives XLA inserted in the step program, grouped by kind
/// and size: `all-reduce 24 x 3352, ...` (elements per device).
fn step_collectives(l: &Loaded) -> Result<Option<String>> {
    if l.devices == 1 {
        return Ok(None);
    }
    let Some(program) = l.model.step_program(l.prompts.len())? else {
        return Ok(None);
    };
    let mut groups: Vec<(String, u64, usize)> = Vec::new();
    for c in program.executable().collectives()? {
        match groups
            .iter_mut()
            .find(|(o, e, _)| *o == c.opcode && *e == c.elements)
        {
            Some(g) => g.2 += 1,
            None => groups.push((c.opcode, c.elements, 1)),
        }
    }
    groups.sort();
    let text: Vec<String> = groups
        .iter()
        .map(|(op, elements, count)| format!("{op} {count} x {elements}"))
        .collect();
    Ok(Some(text.join(", ")))
}

/// `emit`: the prefill, step and generate programs' text, for any family.
pub(crate) fn emit(a: EmitArgs) -> Result<()> {
    let l = load(&a.model, &a.prompt, &a.sampling, false)?;
    family::emit_face(&l.face(), &a.out_dir)
}

/// The median of the finite values of `v`.
pub(crate) fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// `bench`: the 130M shape unless --model or --shape says otherwise.
pub(crate) fn bench(a: BenchArgs) -> Result<()> {
    ensure!(a.repeat > 0, "--repeat must be at least 1");
    let l = load(&a.model, &a.prompt, &a.sampling, true)?;
    let options = l.options.clone();
    let (first_s, cached) = warm_up(&l, &options, true)?;
    let prompt_tokens = l.prompt_tokens();
    let runs = timed_runs(&l, &options, a.repeat)?;
    println!("model     {}", l.description);
    l.print_devices();
    let (batch, bucket) = l.shape();
    println!(
        "shape     {batch} row(s), {prompt_tokens} prompt tokens (padded to {bucket}), {} new tokens per row",
        options.max_new_tokens
    );
    let med = print_runs(&runs, prompt_tokens);
    let compile_s = first_s - med.generate_s;
    println!(
        "compile   {compile_s:.2} s ({})",
        if cached {
            "loaded from the compile cache"
        } else {
            "compiled"
        }
    );
    let peak = peak_rss_mb();
    if let Some(mb) = peak {
        println!("memory    peak RSS {mb:.0} MB");
    }
    let collectives = step_collectives(&l)?;
    if let Some(c) = &collectives {
        println!("collectives in one step (batch {}): {c}", l.prompts.len());
    }
    if let Some(path) = &a.json {
        let rows: Vec<_> = runs.iter().map(|r| run_json(r, prompt_tokens)).collect();
        let value = json!({
            "runs": rows,
            "median": {
                "prefill_tokens_per_s": med.prefill_tps,
                "decode_tokens_per_s": med.decode_tps,
                "ms_per_token": med.ms_per_token,
                "generate_s": med.generate_s,
            },
            "step_collectives": collectives,
            "devices": l.devices,
            "parallel": l.parallel_name(),
            "weight_bytes_per_device": l.model.weight_bytes(),
            "prompt_len": l.prompts.iter().map(Vec::len).collect::<Vec<_>>(),
            "max_new_tokens": options.max_new_tokens,
            "compile_s": compile_s,
            "compile_from_cache": cached,
            "compiles": l.client.cache_stats().compiles,
            "cache_hits": cache_hits(&l.client),
            "model": l.description,
        });
        write_run_json(path, value, l.model.as_ref())?;
    }
    Ok(())
}

/// `repeat` timed runs of prefill and generate. On a terminal a bar over the runs (with the
/// time left and the last run's throughput); elsewhere a line per run.
fn timed_runs(l: &Loaded, options: &GenerateOptions, repeat: usize) -> Result<Vec<Timed>> {
    let mut runs = Vec::new();
    let bar = bars::bar(
        repeat as u64,
        "{elapsed} [{wide_bar}] timed run {pos}/{len}, {eta} left: {msg}",
    );
    for i in 0..repeat {
        if bar.is_hidden() {
            progress(&format!("timed run {}/{}", i + 1, repeat));
        }
        let run = Timed::run(l, options, true)?;
        bar.inc(1);
        bar.set_message(match run.decode_tps() {
            Some(tps) => format!("decode {tps:.1} tok/s"),
            None => format!("prefill {:.1} tok/s", run.prefill_tps(l.prompt_tokens())),
        });
        runs.push(run);
    }
    bar.finish_and_clear();
    Ok(runs)
}

/// The medians over the timed runs (of those that have the figure).
struct Medians {
    prefill_tps: Option<f64>,
    decode_tps: Option<f64>,
    ms_per_token: Option<f64>,
    /// Seconds of a generate call; 0 when no run has one.
    generate_s: f64,
}

/// Prints the table of the runs (prefill and decode tokens/s, ms per token), one row per run
/// and one of the medians, which it returns.
fn print_runs(runs: &[Timed], prompt_tokens: usize) -> Medians {
    println!(
        "{:<8} {:>14} {:>14} {:>14}",
        "run", "prefill tok/s", "decode tok/s", "ms per token"
    );
    for (i, r) in runs.iter().enumerate() {
        print_row(
            &(i + 1).to_string(),
            Some(r.prefill_tps(prompt_tokens)),
            r.decode_tps(),
            r.ms_per_token(),
        );
    }
    let med = |f: &dyn Fn(&Timed) -> Option<f64>| median(runs.iter().filter_map(f).collect());
    let m = Medians {
        prefill_tps: med(&|r| Some(r.prefill_tps(prompt_tokens))),
        decode_tps: med(&|r| r.decode_tps()),
        ms_per_token: med(&|r| r.ms_per_token()),
        generate_s: med(&|r| Some(r.generate_s)).unwrap_or(0.0),
    };
    print_row("median", m.prefill_tps, m.decode_tps, m.ms_per_token);
    m
}

/// One row of the runs table: tokens/s to 0.1, ms per token to 0.01, `-` where unknown.
pub(crate) fn print_row(
    label: &str,
    prefill_tps: Option<f64>,
    decode_tps: Option<f64>,
    ms: Option<f64>,
) {
    let fmt =
        |x: Option<f64>, decimals: usize| x.map_or("-".to_string(), |x| format!("{x:.decimals$}"));
    println!(
        "{label:<8} {:>14} {:>14} {:>14}",
        fmt(prefill_tps, 1),
        fmt(decode_tps, 1),
        fmt(ms, 2)
    );
}

/// One timed run as JSON.
fn run_json(r: &Timed, prompt_tokens: usize) -> serde_json::Value {
    json!({
        "prefill_s": r.prefill_s,
        "generate_s": r.generate_s,
        "streamed_decode": r.streamed.map(|(s, steps)| json!({"seconds": s, "steps": steps})),
        "prefill_tokens_per_s": r.prefill_tps(prompt_tokens),
        "decode_tokens_per_s": r.decode_tps(),
        "ms_per_token": r.ms_per_token(),
        "generated_tokens": r.generated(),
    })
}
