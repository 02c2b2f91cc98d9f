//! Serving on the 130M shape (`Mamba2Config::mamba2_130m()`, random weights, f32), in process
//! (the scheduler without HTTP), through the CPU plugin `Client::cpu()` resolves. The variants
//! take turns run by run:
//!
//! 1. `one`: one greedy request (a 128-token prompt, 64 new tokens): `generate` (one program
//!    call, the whole loop on the device) against the scheduler with segments of 1, 4 and 16
//!    steps: decode tokens/s after the first token (the first token's time is the prefill's),
//!    and the median time between token events against `generate`'s time per step;
//! 2. `eight`: eight such requests at once through the scheduler (segments of 4): tokens/s of
//!    the whole batch, first submission to last token;
//! 3. `prefix`: eight prompts sharing a 1,024-token prefix (different 32-token tails), the
//!    cache warmed by one of them first: time to each request's first token with the prefix
//!    cache and without it, and whether their tokens are equal.
//!
//! 4. `wave`: eight prompts of mixed lengths (17-128 tokens, over every prompt bucket) arriving
//!    together, 32 new tokens each: time to each first token (P50 and the last) and tokens/s.
//!
//! ```text
//! cargo bench --bench serving             # about 5 minutes on 2 cores
//! cargo bench --bench serving -- --quick  # fewer runs
//! cargo bench --bench serving -- --only one # one section (one, eight, wave, prefix)
//! ```

mod common;

use std::time::Instant;

use anyhow::{ensure, Result};
use common::{json_number, json_object, median, report_json, secs_since, sorted, write_report};
use stablegraph::models::mamba2::{Mamba2, Mamba2Config, Mamba2Weights};
use stablegraph::models::GenerateOptions;
use stablegraph::runtime::Client;
use stablegraph::serving::{Event, Request, Scheduler, SchedulerOptions};
use stablegraph::DType;

/// A prompt of `len` tokens of the 50,280-token vocabulary, varied by `seed`.
fn prompt(len: usize, seed: usize) -> Vec<u32> {
    (0..len)
        .map(|j| ((j * 7919 + seed * 104_729) % 50_000) as u32)
        .collect()
}

/// The 130M shape's random weights on the device, and a scheduler over them.
struct Setup {
    client: Client,
    cfg: Mamba2Config,
    weights: Mamba2Weights<stablegraph::HostArray>,
}

impl Setup {
    fn model(&self) -> Result<Mamba2> {
        Ok(Mamba2::new(&self.client, self.cfg.clone(), &self.weights)?)
    }
}

fn scheduler(setup: &Setup, segment: usize, cache: usize) -> Result<Scheduler<Mamba2>> {
    scheduler_with(setup, segment, cache, true)
}

/// [`scheduler`], prefill riding with decode or alternating with it.
fn scheduler_with(
    setup: &Setup,
    segment: usize,
    cache: usize,
    mixed: bool,
) -> Result<Scheduler<Mamba2>> {
    let model = setup.model()?;
    let o = SchedulerOptions {
        slots: 8,
        segment,
        max_prompt: 1152,
        max_tokens: 64,
        prefix_cache_bytes: cache,
        mixed,
        ..SchedulerOptions::default()
    };
    let mut s = Scheduler::new(model, o)?;
    s.warm_up()?;
    Ok(s)
}

/// Runs `requests` to the end; per request, its tokens and the seconds to its first token and
/// to its last.
fn serve(s: &mut Scheduler<Mamba2>, requests: &[Request]) -> Result<Vec<(Vec<u32>, f64, f64)>> {
    serve_timed(s, requests, &mut Vec::new())
}

/// [`serve`], also noting the seconds at which each token event came.
fn serve_timed(
    s: &mut Scheduler<Mamba2>,
    requests: &[Request],
    events: &mut Vec<f64>,
) -> Result<Vec<(Vec<u32>, f64, f64)>> {
    let t = Instant::now();
    let ids: Vec<u64> = requests
        .iter()
        .map(|r| s.submit(r.clone()).map_err(|e| anyhow::anyhow!("{e}")))
        .collect::<Result<_>>()?;
    let mut out = vec![(Vec::new(), 0.0, 0.0); ids.len()];
    while s.has_work() {
        for e in s.step()? {
            if let Event::Tokens { id, tokens, .. } = e {
                let k = ids.iter().position(|&i| i == id).unwrap_or(0);
                if out[k].0.is_empty() {
                    out[k].1 = secs_since(t);
                }
                out[k].0.extend(tokens);
                out[k].2 = secs_since(t);
                events.push(out[k].2);
            }
        }
    }
    Ok(out)
}

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request {
        prompt,
        max_tokens,
        ..Request::default()
    }
}

/// Section 1: decode tokens/s of one request, generate against segments of 1, 4 and 16, and
/// the median time between the scheduler's token events (what a streamed client waits
/// between chunks) against generate's time per step.
fn one(s4: &mut Scheduler<Mamba2>, setup: &Setup, runs: usize) -> Result<String> {
    let (p, n) = (prompt(128, 0), 64);
    let mut s1 = scheduler(setup, 1, 0)?;
    let mut s16 = scheduler(setup, 16, 0)?;
    let model = setup.model()?;
    let options = GenerateOptions {
        max_new_tokens: n,
        ..GenerateOptions::default()
    };
    let one_token = GenerateOptions {
        max_new_tokens: 1,
        ..GenerateOptions::default()
    };
    let want = model
        .generate(std::slice::from_ref(&p), &options)?
        .remove(0);
    model.generate(std::slice::from_ref(&p), &one_token)?;
    let mut gen = Vec::new();
    let (mut tps, mut gaps) = (vec![Vec::new(); 3], vec![Vec::new(); 3]);
    for _ in 0..runs {
        let t = Instant::now();
        model.generate(std::slice::from_ref(&p), &one_token)?;
        let first = secs_since(t);
        let t = Instant::now();
        model.generate(std::slice::from_ref(&p), &options)?;
        gen.push((n - 1) as f64 / (secs_since(t) - first));
        for (k, s) in [&mut s1, &mut *s4, &mut s16].into_iter().enumerate() {
            let mut events = Vec::new();
            let r = serve_timed(s, &[greedy(p.clone(), n)], &mut events)?.remove(0);
            ensure!(r.0 == want, "served tokens differ from generate's");
            tps[k].push((n - 1) as f64 / (r.2 - r.1));
            gaps[k].extend(events.windows(2).map(|w| w[1] - w[0]));
        }
    }
    let gen = median(&sorted(gen));
    println!("one request (128-token prompt, 64 new tokens, greedy), decode tokens/s after the first token and the median time between token events, median of {runs}:");
    println!(
        "  generate (one call)        {gen:6.1}            {:5.1} ms a step",
        1e3 / gen
    );
    let mut json = vec![
        ("section", "\"one\"".to_string()),
        ("generate_tps", json_number(gen)),
    ];
    let names = [("segment1", 1), ("segment4", 4), ("segment16", 16)];
    for ((name, steps), (tps, gaps)) in names.iter().zip(tps.into_iter().zip(gaps)) {
        let (tps, gap) = (median(&sorted(tps)), median(&sorted(gaps)) * 1e3);
        println!(
            "  scheduler, segments of {steps:2} {tps:6.1} ({:.2}x)   {gap:5.1} ms ({:.2}x a step)",
            tps / gen,
            gap * gen / 1e3
        );
        json.push((
            name,
            json_object(&[
                ("tps", json_number(tps)),
                ("event_gap_ms", json_number(gap)),
            ]),
        ));
    }
    Ok(json_object(&json))
}

/// Section 2: eight requests at once.
fn eight(s: &mut Scheduler<Mamba2>, runs: usize) -> Result<String> {
    let requests: Vec<Request> = (0..8).map(|i| greedy(prompt(128, i), 64)).collect();
    let mut tps = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let out = serve(s, &requests)?;
        let tokens: usize = out.iter().map(|r| r.0.len()).sum();
        tps.push(tokens as f64 / secs_since(t));
    }
    let tps = median(&sorted(tps));
    println!("eight requests at once (segments of 4): {tps:.1} tokens/s (median of {runs})");
    Ok(json_object(&[
        ("section", "\"eight\"".into()),
        ("tps", json_number(tps)),
    ]))
}

/// Section 4: eight prompts of mixed lengths (arriving together, then four more while they
/// decode), prefill riding with decode against alternating with it.
fn wave(setup: &Setup, mixed: &mut Scheduler<Mamba2>, runs: usize) -> Result<String> {
    let lens = [17, 33, 50, 70, 90, 100, 115, 128];
    let requests: Vec<Request> = lens
        .iter()
        .enumerate()
        .map(|(i, &l)| greedy(prompt(l, 200 + i), 32))
        .collect();
    let mut alternating = scheduler_with(setup, 4, 0, false)?;
    let mut figures = [
        (Vec::new(), Vec::new(), Vec::new()),
        (Vec::new(), Vec::new(), Vec::new()),
    ];
    let mut tokens = [Vec::new(), Vec::new()];
    for _ in 0..runs {
        for (k, s) in [&mut *mixed, &mut alternating].into_iter().enumerate() {
            let t = Instant::now();
            let out = serve(s, &requests)?;
            let made: usize = out.iter().map(|r| r.0.len()).sum();
            let f = sorted(out.iter().map(|r| r.1).collect());
            figures[k].0.push(median(&f));
            figures[k].1.push(f[f.len() - 1]);
            figures[k].2.push(made as f64 / secs_since(t));
            tokens[k] = out.into_iter().map(|r| r.0).collect();
        }
    }
    ensure!(
        tokens[0] == tokens[1],
        "riding with decode changed the tokens"
    );
    let mut json = vec![("section", "\"wave\"".to_string())];
    let names = [
        ("riding with decode", "mixed"),
        ("alternating", "alternating"),
    ];
    for ((name, key), (p50, last, tps)) in names.iter().zip(figures) {
        let (p50, last, tps) = (
            median(&sorted(p50)),
            median(&sorted(last)),
            median(&sorted(tps)),
        );
        println!("eight prompts of 17-128 tokens arriving together (32 new tokens each), prefill {name}: time to first token P50 {p50:.2} s, last {last:.2} s; {tps:.1} tokens/s (medians of {runs})");
        json.push((
            key,
            json_object(&[
                ("ttft_p50_s", json_number(p50)),
                ("ttft_last_s", json_number(last)),
                ("tps", json_number(tps)),
            ]),
        ));
    }
    Ok(json_object(&json))
}

/// Section 3: time to first token of eight prompts sharing a 1,024-token prefix.
fn prefix(setup: &Setup, plain: &mut Scheduler<Mamba2>, runs: usize) -> Result<String> {
    let shared = prompt(1024, 99);
    let with_tail = |i: usize| {
        let mut p = shared.clone();
        p.extend(prompt(32, 1000 + i));
        greedy(p, 8)
    };
    let requests: Vec<Request> = (0..8).map(with_tail).collect();
    let mut cached = scheduler(setup, 4, 1 << 30)?;
    serve(&mut cached, &[with_tail(99)])?;
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let a = serve(&mut cached, &requests)?;
        let b = serve(plain, &requests)?;
        ensure!(
            a.iter().zip(&b).all(|(x, y)| x.0 == y.0),
            "tokens with the cache differ from those without"
        );
        on.extend(a.iter().map(|r| r.1));
        off.extend(b.iter().map(|r| r.1));
    }
    let (on, off) = (sorted(on), sorted(off));
    let (on50, off50) = (median(&on), median(&off));
    println!("eight prompts sharing a 1,024-token prefix (32-token tails), time to first token P50: {on50:.2} s with the prefix cache, {off50:.2} s without ({:.1}x); tokens equal", off50 / on50);
    Ok(json_object(&[
        ("section", "\"prefix\"".into()),
        ("ttft_p50_cached_s", json_number(on50)),
        ("ttft_p50_uncached_s", json_number(off50)),
    ]))
}

fn main() -> Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let runs = if quick { 2 } else { 5 };
    let cfg = Mamba2Config::mamba2_130m();
    let setup = Setup {
        client: Client::cpu()?,
        weights: Mamba2Weights::random(&cfg, DType::F32, 0)?,
        cfg,
    };
    // `--only NAME` runs one section.
    let args: Vec<String> = std::env::args().collect();
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1));
    let wanted = |name: &str| only.is_none_or(|o| o == name);
    let mut s4 = scheduler(&setup, 4, 0)?;
    let mut figures = Vec::new();
    if wanted("one") {
        figures.push(one(&mut s4, &setup, runs)?);
    }
    if wanted("eight") {
        figures.push(eight(&mut s4, runs)?);
    }
    if wanted("wave") {
        figures.push(wave(&setup, &mut s4, runs)?);
    }
    if wanted("prefix") {
        figures.push(prefix(&setup, &mut s4, runs.min(3))?);
    }
    let json = report_json(
        &[("bench", "serving".into())],
        &[("quick", quick.to_string())],
        &figures,
    );
    let file = write_report(
        if quick {
            "serving-quick.json"
        } else {
            "serving.json"
        },
        &json,
    )?;
    println!("wrote {}", file.display());
    Ok(())
}
