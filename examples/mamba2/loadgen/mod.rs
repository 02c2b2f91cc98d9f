//! `loadgen`: load on an OpenAI-compatible server (ours, or llama.cpp's `llama-server`):
//! open-loop Poisson arrivals at each `--rates` value, or `--clients` closed loops, with prompt
//! and output lengths drawn from a seeded distribution, to `/v1/completions` or (`--chat`)
//! `/v1/chat/completions`. Every request streams; the client times its first token and the
//! gaps between chunks, and counts each reply by the tokens it carried (see [`sse`]): a reply
//! with an HTTP error, an error event or no `[DONE]` is aborted and adds nothing to the
//! throughput. Prints per setting the completed, aborted and client-dropped requests,
//! throughput, time to first token and inter-token latency (P50/P99), goodput under an SLO and
//! the mean prefix-cached prompt tokens; writes them as JSON and an SVG chart when asked.

mod chart;
mod run;
mod sse;

use std::path::PathBuf;

use anyhow::{ensure, Context, Result};
use clap::Args;
use serde_json::{json, Value};

use run::Seen;
use sse::Outcome;

/// The flags of `loadgen`.
#[derive(Args)]
pub(crate) struct LoadgenArgs {
    /// The server's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Open-loop arrival rates, requests per second (comma-separated); each runs --requests
    /// requests with exponential gaps.
    #[arg(long, value_delimiter = ',', required_unless_present_any = ["clients", "with"])]
    rates: Vec<f64>,
    /// Closed loops instead: for each count, that many clients each send their next request
    /// when the last one ends, --requests in all.
    #[arg(long, value_delimiter = ',', conflicts_with = "rates")]
    clients: Vec<usize>,
    /// Requests per setting.
    #[arg(long, default_value_t = 32)]
    requests: usize,
    /// Prompt lengths, uniform in LO,HI (tokens; bytes of text for a byte model); with
    /// --shared-prefix, the length of each prompt's own tail.
    #[arg(long, value_name = "LO,HI", value_parser = range, default_value = "16,128")]
    prompt_len: [usize; 2],
    /// Output lengths (max_tokens), uniform in LO,HI.
    #[arg(long, value_name = "LO,HI", value_parser = range, default_value = "16,128")]
    output_len: [usize; 2],
    /// Every prompt starts with the same N tokens (bytes of text, or ids with --ids), then its
    /// own tail: load for a prefix cache (the mean cached prompt tokens the server reports are
    /// printed).
    #[arg(long, value_name = "N", default_value_t = 0)]
    shared_prefix: usize,
    /// Send prompts as token ids below VOCAB (a model without a tokenizer) instead of text
    /// cut from the crate's docs.
    #[arg(long, value_name = "VOCAB")]
    ids: Option<u32>,
    /// Send chat completions (/v1/chat/completions, the prompt as one user message) instead
    /// of completions.
    #[arg(long)]
    chat: bool,
    /// Choices per request (`n`); tokens are counted over all of them.
    #[arg(long, default_value_t = 1)]
    n: usize,
    /// The fraction of requests (seeded) that the client drops after its first chunks; they
    /// are counted apart, out of the throughput and latencies.
    #[arg(long, value_name = "F", default_value_t = 0.0)]
    disconnect_frac: f64,
    /// Seed of the arrivals, the lengths, the prompts and the requests dropped.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// SLO: the most seconds to the first token.
    #[arg(long, default_value_t = 1.0)]
    slo_ttft: f64,
    /// SLO: the most seconds of a request's P99 inter-token latency.
    #[arg(long, default_value_t = 0.1)]
    slo_itl: f64,
    /// Bearer token for a server started with --api-key.
    #[arg(long, env = "STABLEGRAPH_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// A name for this server in the output (e.g. "stablegraph" or "llama-server").
    #[arg(long, default_value = "server")]
    label: String,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write throughput and goodput against the setting as an SVG chart to FILE.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Draw the results of an earlier --json run in the chart too (e.g. another server's);
    /// without --rates or --clients, only draw them into --svg.
    #[arg(long, value_name = "JSON")]
    with: Vec<PathBuf>,
}

/// `LO,HI` with 1 <= LO <= HI.
fn range(s: &str) -> Result<[usize; 2], String> {
    let bad = || format!("{s:?} is not LO,HI with 1 <= LO <= HI");
    let (lo, hi) = s.split_once(',').ok_or_else(bad)?;
    let lo: usize = lo.trim().parse().map_err(|_| bad())?;
    let hi: usize = hi.trim().parse().map_err(|_| bad())?;
    if lo == 0 || lo > hi {
        return Err(bad());
    }
    Ok([lo, hi])
}

/// The figures of one setting.
struct Row {
    setting: f64,
    /// Requests that ended with `[DONE]` and no error.
    completed: usize,
    aborted: usize,
    /// Dropped by the client (`--disconnect-frac`).
    disconnected: usize,
    /// The error of the aborted request that ended first.
    first_error: Option<String>,
    seconds: f64,
    /// Tokens of the completed requests.
    tokens: usize,
    tokens_per_s: f64,
    ttft: [f64; 2],
    itl: [f64; 2],
    goodput: f64,
    /// The mean cached prompt tokens of the completed requests that reported them.
    cached: Option<f64>,
    /// Completed requests whose `usage` differed from their chunks' tokens.
    mismatched: usize,
}

pub(crate) fn loadgen(a: LoadgenArgs) -> Result<()> {
    check(&a)?;
    if a.rates.is_empty() && a.clients.is_empty() {
        return chart_only(&a);
    }
    let corpus = corpus()?;
    let closed = !a.clients.is_empty();
    let settings: Vec<f64> = if closed {
        a.clients.iter().map(|&c| c as f64).collect()
    } else {
        a.rates.clone()
    };
    ensure!(
        settings.iter().all(|&s| s > 0.0 && s.is_finite()),
        "rates and clients must be > 0"
    );
    let what = if closed { "clients" } else { "rate/s" };
    header(&a, what);
    let mut rows = Vec::new();
    for (i, &setting) in settings.iter().enumerate() {
        let jobs = run::jobs(&a, i, setting, &corpus, closed);
        let seen = if closed {
            run::run_closed(&a, &jobs, setting as usize)
        } else {
            run::run_open(&a, &jobs)
        };
        let row = summarize(&a, setting, &seen);
        print_row(&row);
        rows.push(row);
    }
    if let Some(path) = &a.json {
        let value = json_of(&a, closed, &rows);
        std::fs::write(path, serde_json::to_string_pretty(&value)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &a.svg {
        let mut series = a
            .with
            .iter()
            .map(chart::series_of)
            .collect::<Result<Vec<_>>>()?;
        let points = rows
            .iter()
            .map(|r| [r.setting, r.tokens_per_s, r.goodput])
            .collect();
        series.push((a.label.clone(), points));
        std::fs::write(path, chart::chart(what, &series))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The flags' ranges and combinations.
fn check(a: &LoadgenArgs) -> Result<()> {
    ensure!(a.requests > 0, "--requests must be at least 1");
    ensure!(a.n >= 1, "--n must be at least 1");
    ensure!(
        (0.0..=1.0).contains(&a.disconnect_frac),
        "--disconnect-frac must be within 0..1, got {}",
        a.disconnect_frac
    );
    ensure!(a.ids != Some(0), "--ids needs a vocabulary of at least 1");
    ensure!(
        !(a.chat && a.ids.is_some()),
        "--chat needs text prompts (a chat message is text), and --ids sends token ids; drop one"
    );
    Ok(())
}

/// Only the earlier runs of `--with`, drawn into `--svg`.
fn chart_only(a: &LoadgenArgs) -> Result<()> {
    let path = a
        .svg
        .as_ref()
        .context("--with without --rates or --clients needs --svg")?;
    let series = a
        .with
        .iter()
        .map(chart::series_of)
        .collect::<Result<Vec<_>>>()?;
    let mode = std::fs::read_to_string(&a.with[0]).unwrap_or_default();
    let what = if mode.contains("\"mode\": \"clients\"") {
        "clients"
    } else {
        "rate/s"
    };
    std::fs::write(path, chart::chart(what, &series))
        .with_context(|| format!("writing {}", path.display()))
}

/// What is sent, and the table's head.
fn header(a: &LoadgenArgs, what: &str) {
    let endpoint = if a.chat {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    let prefix = match a.shared_prefix {
        0 => String::new(),
        n => format!(" after a shared prefix of {n}"),
    };
    println!(
        "{}: {} requests per setting to {endpoint}, prompts {:?}{prefix}, outputs {:?}, n {}, \
         {} dropped by the client; SLO: TTFT <= {} s and ITL P99 <= {} s",
        a.label,
        a.requests,
        a.prompt_len,
        a.output_len,
        a.n,
        a.disconnect_frac,
        a.slo_ttft,
        a.slo_itl
    );
    println!(
        "{what:>8} {:>5} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}",
        "done",
        "aborted",
        "dropped",
        "tok/s",
        "TTFT p50",
        "TTFT p99",
        "ITL p50",
        "ITL p99",
        "goodput",
        "cached"
    );
}

fn print_row(r: &Row) {
    let cached = r.cached.map_or("n/a".to_string(), |c| format!("{c:.1}"));
    println!(
        "{:>8} {:>5} {:>7} {:>7} {:>9.1} {:>8.3}s {:>8.3}s {:>8.4}s {:>8.4}s {:>7.2}/s {cached:>7}",
        r.setting,
        r.completed,
        r.aborted,
        r.disconnected,
        r.tokens_per_s,
        r.ttft[0],
        r.ttft[1],
        r.itl[0],
        r.itl[1],
        r.goodput
    );
    if let Some(e) = &r.first_error {
        println!("{:>8} aborted {}, the first: {e}", "", r.aborted);
    }
    if r.mismatched > 0 {
        println!(
            "{:>8} {} completed requests' usage differed from their chunks' tokens (usage counted)",
            "", r.mismatched
        );
    }
}

fn json_of(a: &LoadgenArgs, closed: bool, rows: &[Row]) -> Value {
    json!({
        "label": a.label,
        "mode": if closed { "clients" } else { "rate" },
        "endpoint": if a.chat { "chat" } else { "completions" },
        "prompt_len": a.prompt_len, "output_len": a.output_len,
        "shared_prefix": a.shared_prefix, "n": a.n, "disconnect_frac": a.disconnect_frac,
        "slo": {"ttft_s": a.slo_ttft, "itl_p99_s": a.slo_itl},
        "rows": rows.iter().map(|r| json!({
            "setting": r.setting, "completed": r.completed, "aborted": r.aborted,
            "disconnected": r.disconnected, "first_error": r.first_error,
            "seconds": r.seconds, "tokens": r.tokens, "tokens_per_s": r.tokens_per_s,
            "ttft_p50_s": r.ttft[0], "ttft_p99_s": r.ttft[1],
            "itl_p50_s": r.itl[0], "itl_p99_s": r.itl[1], "goodput_per_s": r.goodput,
            "cached_tokens_mean": r.cached, "usage_mismatches": r.mismatched,
        })).collect::<Vec<_>>(),
    })
}

/// Text to cut prompts from: the crate's docs and README.
fn corpus() -> Result<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut text = std::fs::read_to_string(root.join("README.md")).context("reading README.md")?;
    if let Ok(dir) = std::fs::read_dir(root.join("docs")) {
        let mut paths: Vec<PathBuf> = dir.flatten().map(|e| e.path()).collect();
        paths.sort();
        for p in paths
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
        {
            text.push_str(&std::fs::read_to_string(p).unwrap_or_default());
        }
    }
    Ok(text)
}

/// The `q` quantile (0..=1) of `v` (nearest rank); 0 when empty.
fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// One setting's figures; throughput, latencies, goodput and cached tokens over the completed
/// requests only, over the setting's whole time.
fn summarize(a: &LoadgenArgs, setting: f64, seen: &[Seen]) -> Row {
    let done: Vec<(&Seen, usize)> = seen
        .iter()
        .filter_map(|s| match s.outcome {
            Outcome::Completed(tokens) => Some((s, tokens)),
            _ => None,
        })
        .collect();
    let mut errors: Vec<(f64, &String)> = seen
        .iter()
        .filter_map(|s| match &s.outcome {
            Outcome::Aborted(e) => Some((s.end, e)),
            _ => None,
        })
        .collect();
    errors.sort_by(|x, y| x.0.total_cmp(&y.0));
    let seconds = seen.iter().map(|s| s.end).fold(0.0, f64::max).max(1e-9);
    let tokens: usize = done.iter().map(|(_, t)| t).sum();
    let mut ttft: Vec<f64> = done.iter().filter_map(|(s, _)| s.ttft).collect();
    let mut itl: Vec<f64> = done.iter().flat_map(|(s, _)| s.itl.clone()).collect();
    let good = done
        .iter()
        .filter(|(s, _)| {
            let mut own = s.itl.clone();
            s.ttft.is_some_and(|t| t <= a.slo_ttft) && quantile(&mut own, 0.99) <= a.slo_itl
        })
        .count();
    let cached: Vec<usize> = done.iter().filter_map(|(s, _)| s.cached).collect();
    Row {
        setting,
        completed: done.len(),
        aborted: errors.len(),
        disconnected: seen.len() - done.len() - errors.len(),
        first_error: errors.first().map(|(_, e)| e.to_string()),
        seconds,
        tokens,
        tokens_per_s: tokens as f64 / seconds,
        ttft: [quantile(&mut ttft, 0.5), quantile(&mut ttft, 0.99)],
        itl: [quantile(&mut itl, 0.5), quantile(&mut itl, 0.99)],
        goodput: good as f64 / seconds,
        cached: (!cached.is_empty())
            .then(|| cached.iter().sum::<usize>() as f64 / cached.len() as f64),
        mismatched: done.iter().filter(|(s, _)| s.mismatch).count(),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: LoadgenArgs,
    }

    /// `loadgen`'s flags from `args`.
    pub(crate) fn args(args: &[&str]) -> LoadgenArgs {
        Cli::try_parse_from(std::iter::once("loadgen").chain(args.iter().copied()))
            .unwrap()
            .a
    }

    #[test]
    fn chat_with_token_ids_is_refused_as_needing_text() {
        let e = check(&args(&["--clients", "1", "--chat", "--ids", "100"])).unwrap_err();
        assert!(e.to_string().contains("--chat needs text"), "{e}");
        assert!(check(&args(&["--clients", "1", "--chat"])).is_ok());
        assert!(check(&args(&["--clients", "1", "--disconnect-frac", "1.5"])).is_err());
        assert!(check(&args(&["--clients", "1", "--n", "0"])).is_err());
    }

    /// A request of `tokens`, ended as `outcome`.
    fn seen(outcome: Outcome, cached: Option<usize>) -> Seen {
        Seen {
            outcome,
            cached,
            mismatch: false,
            ttft: Some(0.1),
            itl: vec![0.01; 4],
            end: 2.0,
        }
    }

    #[test]
    fn only_completed_requests_count_toward_throughput() {
        let a = args(&["--clients", "1"]);
        let all = [
            seen(Outcome::Completed(30), Some(64)),
            seen(Outcome::Completed(10), Some(0)),
            seen(Outcome::Aborted("HTTP 500: boom".into()), Some(64)),
            seen(Outcome::Disconnected, None),
        ];
        let r = summarize(&a, 1.0, &all);
        assert_eq!((r.completed, r.aborted, r.disconnected), (2, 1, 1));
        assert_eq!((r.tokens, r.tokens_per_s), (40, 20.0));
        assert_eq!(r.first_error.as_deref(), Some("HTTP 500: boom"));
        assert_eq!((r.cached, r.goodput), (Some(32.0), 1.0));
        let r = summarize(&a, 1.0, &[seen(Outcome::Completed(5), None)]);
        assert_eq!(r.cached, None);
    }
}
