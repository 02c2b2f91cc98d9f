//! `loadgen`: load on an OpenAI-compatible completions server (ours, or llama.cpp's
//! `llama-server`): open-loop Poisson arrivals at each `--rates` value, or `--clients` closed
//! loops, with prompt and output lengths drawn from a seeded distribution. Every request
//! streams; the client times its first token and the gaps between chunks. Prints throughput,
//! time to first token and inter-token latency (P50/P99) and goodput under an SLO per setting;
//! writes them as JSON and an SVG chart when asked.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use clap::Args;
use serde_json::{json, Value};
use stablegraph::rng::SplitMix64;

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
    /// Prompt lengths, uniform in LO,HI (tokens; bytes of text for a byte model).
    #[arg(long, value_name = "LO,HI", value_parser = range, default_value = "16,128")]
    prompt_len: [usize; 2],
    /// Output lengths (max_tokens), uniform in LO,HI.
    #[arg(long, value_name = "LO,HI", value_parser = range, default_value = "16,128")]
    output_len: [usize; 2],
    /// Send prompts as token ids below VOCAB (a model without a tokenizer) instead of text
    /// cut from the crate's docs.
    #[arg(long, value_name = "VOCAB")]
    ids: Option<u32>,
    /// Seed of the arrivals and the lengths.
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

/// One request to send.
#[derive(Clone)]
struct Job {
    /// Seconds after the start (open loop).
    at: f64,
    prompt: Value,
    max_tokens: usize,
}

/// What one request saw.
#[derive(Default)]
struct Seen {
    ok: bool,
    tokens: usize,
    ttft: Option<f64>,
    /// Each token's share of the gap before its chunk.
    itl: Vec<f64>,
    end: f64,
}

/// The figures of one setting.
struct Row {
    setting: f64,
    ok: usize,
    failed: usize,
    seconds: f64,
    tokens_per_s: f64,
    ttft: [f64; 2],
    itl: [f64; 2],
    goodput: f64,
}

pub(crate) fn loadgen(a: LoadgenArgs) -> Result<()> {
    ensure!(a.requests > 0, "--requests must be at least 1");
    if a.rates.is_empty() && a.clients.is_empty() {
        let path = a
            .svg
            .as_ref()
            .context("--with without --rates or --clients needs --svg")?;
        let series = a.with.iter().map(series_of).collect::<Result<Vec<_>>>()?;
        let mode = std::fs::read_to_string(&a.with[0]).unwrap_or_default();
        let what = if mode.contains("\"mode\": \"clients\"") {
            "clients"
        } else {
            "rate/s"
        };
        return std::fs::write(path, chart(what, &series))
            .with_context(|| format!("writing {}", path.display()));
    }
    for (name, r) in [
        ("--prompt-len", &a.prompt_len),
        ("--output-len", &a.output_len),
    ] {
        ensure!(
            r[0] >= 1 && r[0] <= r[1],
            "{name} needs 1 <= LO <= HI, got {r:?}"
        );
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
    println!(
        "{}: {} requests per setting, prompts {:?}, outputs {:?}, SLO: TTFT <= {} s and ITL P99 <= {} s",
        a.label, a.requests, a.prompt_len, a.output_len, a.slo_ttft, a.slo_itl
    );
    println!(
        "{what:>8} {:>5} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "ok", "failed", "tok/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "goodput"
    );
    let mut rows = Vec::new();
    for &setting in &settings {
        let jobs = jobs(&a, setting, &corpus, closed);
        let seen = if closed {
            run_closed(&a, &jobs, setting as usize)
        } else {
            run_open(&a, &jobs)
        };
        let row = summarize(&a, setting, &seen);
        println!(
            "{:>8} {:>5} {:>6} {:>9.1} {:>8.3}s {:>8.3}s {:>8.4}s {:>8.4}s {:>7.2}/s",
            setting,
            row.ok,
            row.failed,
            row.tokens_per_s,
            row.ttft[0],
            row.ttft[1],
            row.itl[0],
            row.itl[1],
            row.goodput
        );
        rows.push(row);
    }
    if let Some(path) = &a.json {
        let value = json!({
            "label": a.label,
            "mode": if closed { "clients" } else { "rate" },
            "slo": {"ttft_s": a.slo_ttft, "itl_p99_s": a.slo_itl},
            "rows": rows.iter().map(|r| json!({
                "setting": r.setting, "ok": r.ok, "failed": r.failed, "seconds": r.seconds,
                "tokens_per_s": r.tokens_per_s, "ttft_p50_s": r.ttft[0], "ttft_p99_s": r.ttft[1],
                "itl_p50_s": r.itl[0], "itl_p99_s": r.itl[1], "goodput_per_s": r.goodput,
            })).collect::<Vec<_>>(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&value)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &a.svg {
        let mut series = a.with.iter().map(series_of).collect::<Result<Vec<_>>>()?;
        let points = rows
            .iter()
            .map(|r| [r.setting, r.tokens_per_s, r.goodput])
            .collect();
        series.push((a.label.clone(), points));
        std::fs::write(path, chart(what, &series))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
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

/// The requests of one setting: seeded lengths and prompts, and Poisson arrival times.
fn jobs(a: &LoadgenArgs, rate: f64, corpus: &str, closed: bool) -> Vec<Job> {
    let mut rng = SplitMix64::new(a.seed);
    let mut uniform = |lo: usize, hi: usize| lo + (rng.next_u64() % (hi - lo + 1) as u64) as usize;
    let bytes = corpus.as_bytes();
    let mut at = 0.0;
    let mut out = Vec::with_capacity(a.requests);
    for _ in 0..a.requests {
        let len = uniform(a.prompt_len[0], a.prompt_len[1]);
        let max_tokens = uniform(a.output_len[0], a.output_len[1]);
        let prompt = match a.ids {
            Some(vocab) => json!((0..len)
                .map(|_| uniform(0, vocab as usize - 1))
                .collect::<Vec<_>>()),
            None => {
                let start = uniform(0, bytes.len().saturating_sub(len + 1));
                json!(String::from_utf8_lossy(
                    &bytes[start..start + len.min(bytes.len())]
                ))
            }
        };
        out.push(Job {
            at,
            prompt,
            max_tokens,
        });
        if !closed {
            // Exponential gap: -ln(1 - u) / rate.
            let u = (uniform(0, (1 << 24) - 1) as f64) / (1u64 << 24) as f64;
            at += -(1.0 - u).ln() / rate;
        }
    }
    out
}

/// Sends one streamed request; times its chunks from `t0`.
fn send(a: &LoadgenArgs, job: &Job, t0: Instant) -> Seen {
    let body = json!({
        "prompt": job.prompt, "max_tokens": job.max_tokens, "temperature": 0,
        "stream": true, "ignore_eos": true,
    });
    let mut req = ureq::post(&format!("{}/v1/completions", a.url.trim_end_matches('/')))
        .timeout(Duration::from_secs(600));
    if let Some(k) = &a.api_key {
        req = req.set("Authorization", &format!("Bearer {k}"));
    }
    let sent = t0.elapsed().as_secs_f64();
    let mut seen = Seen::default();
    let Ok(r) = req.send_string(&body.to_string()) else {
        seen.end = t0.elapsed().as_secs_f64();
        return seen;
    };
    let mut last = sent;
    for line in BufReader::new(r.into_reader()).lines() {
        let Ok(line) = line else { break };
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            seen.ok = true;
            break;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        // A server that reports usage at the end (llama-server) has the last word on the count.
        if let Some(total) = v["usage"]["completion_tokens"].as_u64() {
            seen.tokens = total as usize;
        }
        let choice = &v["choices"][0];
        // Our server lists the chunk's tokens; llama-server sends one token per chunk (its
        // text may be empty, part of a character), and a last chunk with the finish reason.
        let n = match choice["token_ids"].as_array() {
            Some(ids) => ids.len(),
            None => usize::from(choice["text"].is_string() && choice["finish_reason"].is_null()),
        };
        if n == 0 {
            continue;
        }
        let now = t0.elapsed().as_secs_f64();
        match seen.ttft {
            None => seen.ttft = Some(now - sent),
            Some(_) => seen
                .itl
                .extend(std::iter::repeat_n((now - last) / n as f64, n)),
        }
        last = now;
        seen.tokens += n;
    }
    seen.end = t0.elapsed().as_secs_f64();
    seen
}

fn run_open(a: &LoadgenArgs, jobs: &[Job]) -> Vec<Seen> {
    let t0 = Instant::now();
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|job| {
                s.spawn(move || {
                    let wait = job.at - t0.elapsed().as_secs_f64();
                    if wait > 0.0 {
                        std::thread::sleep(Duration::from_secs_f64(wait));
                    }
                    send(a, job, t0)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    })
}

fn run_closed(a: &LoadgenArgs, jobs: &[Job], clients: usize) -> Vec<Seen> {
    let t0 = Instant::now();
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let Some(job) = jobs.get(i) else { break mine };
                        mine.push(send(a, job, t0));
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    })
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

fn summarize(a: &LoadgenArgs, setting: f64, seen: &[Seen]) -> Row {
    let ok: Vec<&Seen> = seen.iter().filter(|s| s.ok).collect();
    let seconds = seen.iter().map(|s| s.end).fold(0.0, f64::max).max(1e-9);
    let tokens: usize = ok.iter().map(|s| s.tokens).sum();
    let mut ttft: Vec<f64> = ok.iter().filter_map(|s| s.ttft).collect();
    let mut itl: Vec<f64> = ok.iter().flat_map(|s| s.itl.iter().copied()).collect();
    let good = ok
        .iter()
        .filter(|s| {
            let mut own = s.itl.clone();
            s.ttft.is_some_and(|t| t <= a.slo_ttft) && quantile(&mut own, 0.99) <= a.slo_itl
        })
        .count();
    Row {
        setting,
        ok: ok.len(),
        failed: seen.len() - ok.len(),
        seconds,
        tokens_per_s: tokens as f64 / seconds,
        ttft: [quantile(&mut ttft, 0.5), quantile(&mut ttft, 0.99)],
        itl: [quantile(&mut itl, 0.5), quantile(&mut itl, 0.99)],
        goodput: good as f64 / seconds,
    }
}

/// One server's figures for the chart: its label and (setting, tokens/s, goodput) points.
type Series = (String, Vec<[f64; 3]>);

/// The series of an earlier `--json` file.
fn series_of(path: &PathBuf) -> Result<Series> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: Value = serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?;
    let rows = v["rows"].as_array().map(Vec::as_slice).unwrap_or_default();
    let point = |r: &Value| {
        let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
        [f("setting"), f("tokens_per_s"), f("goodput_per_s")]
    };
    let label = v["label"].as_str().unwrap_or("earlier run").to_string();
    Ok((label, rows.iter().map(point).collect()))
}

/// Throughput (tokens/s, left axis, solid) and goodput (requests/s, right axis, dashed) against
/// the setting, one color per server.
fn chart(what: &str, series: &[Series]) -> String {
    let (w, h, l, r, t, b) = (720.0, 430.0, 70.0, 70.0, 56.0, 70.0);
    let all = || series.iter().flat_map(|(_, p)| p.iter());
    let top = |k: usize| all().map(|p| p[k]).fold(0.0, f64::max).max(1e-9);
    let (xmax, tmax, gmax) = (top(0), top(1) * 1.1, top(2) * 1.1);
    let x = |v: f64| l + (w - l - r) * v / xmax;
    let y = |v: f64, max: f64| t + (h - t - b) * (1.0 - v / max);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{l}\" y=\"24\" font-size=\"15\">Throughput (solid) and goodput (dashed) against {what}</text>\n"
    );
    for i in 0..=4 {
        let f = i as f64 / 4.0;
        let yy = y(f * tmax, tmax);
        let _ = writeln!(
            s,
            "<line x1=\"{l}\" x2=\"{}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{:.0}</text>\
             <text x=\"{}\" y=\"{:.1}\">{:.2}</text>",
            w - r,
            l - 6.0,
            yy + 4.0,
            f * tmax,
            w - r + 6.0,
            yy + 4.0,
            f * gmax
        );
    }
    let mut ticks: Vec<f64> = all().map(|p| p[0]).collect();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    for v in ticks {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{v}</text>",
            x(v),
            h - b + 18.0
        );
    }
    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
    for (k, (label, points)) in series.iter().enumerate() {
        let color = colors[k % colors.len()];
        for (i, max, dash) in [(1, tmax, ""), (2, gmax, " stroke-dasharray=\"6 4\"")] {
            let pts: Vec<String> = points
                .iter()
                .map(|p| format!("{:.1},{:.1}", x(p[0]), y(p[i], max)))
                .collect();
            let _ = writeln!(
                s,
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"{dash} points=\"{}\"/>",
                pts.join(" ")
            );
        }
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" fill=\"{color}\">{label}</text>",
            l + 180.0 * k as f64,
            h - 12.0
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{what}</text>\
         <text x=\"{l}\" y=\"{}\">tokens/s</text>\
         <text x=\"{}\" y=\"{}\" text-anchor=\"end\">goodput (requests/s in SLO)</text>\n</svg>",
        (l + w - r) / 2.0,
        h - b + 36.0,
        t - 6.0,
        w - r,
        t - 6.0
    );
    s
}
