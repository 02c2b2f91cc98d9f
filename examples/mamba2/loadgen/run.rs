//! The requests of one setting and sending them: seeded prompts (a shared prefix and a drawn
//! tail), lengths and arrival times; each request streamed, its chunks timed and counted.

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stablegraph::rng::SplitMix64;

use super::sse::{message_of, Clock, Outcome, Stream};
use super::LoadgenArgs;

/// A request chosen to be dropped is dropped after this many chunks with tokens.
const DISCONNECT_AFTER: usize = 2;

/// One request to send.
#[derive(Clone)]
pub(super) struct Job {
    /// Seconds after the start (open loop).
    at: f64,
    /// Text, or a list of token ids.
    prompt: Value,
    max_tokens: usize,
    /// The client drops the connection after its first few chunks.
    disconnect: bool,
}

/// What one request saw.
pub(super) struct Seen {
    pub(super) outcome: Outcome,
    /// `usage.prompt_tokens_details.cached_tokens`, when the server reported it.
    pub(super) cached: Option<usize>,
    /// The server's `usage.completion_tokens` differed from the tokens of the chunks.
    pub(super) mismatch: bool,
    /// Seconds to the first token of any choice.
    pub(super) ttft: Option<f64>,
    /// Each token's share of the gap before its chunk.
    pub(super) itl: Vec<f64>,
    /// When it ended, seconds after the setting's start.
    pub(super) end: f64,
}

impl Seen {
    fn lost(why: &str) -> Seen {
        Seen {
            outcome: Outcome::Aborted(why.into()),
            cached: None,
            mismatch: false,
            ttft: None,
            itl: Vec::new(),
            end: 0.0,
        }
    }
}

/// `lo..=hi`, uniform.
fn uniform(rng: &mut SplitMix64, [lo, hi]: [usize; 2]) -> usize {
    lo + rng.below(hi - lo + 1)
}

/// A prompt of `len` tokens: ids below `--ids`, else `len` bytes of `corpus` from a random
/// place.
fn draw(a: &LoadgenArgs, len: usize, corpus: &str, rng: &mut SplitMix64) -> Value {
    match a.ids {
        Some(vocab) => json!((0..len)
            .map(|_| rng.below(vocab as usize))
            .collect::<Vec<_>>()),
        None => {
            let bytes = corpus.as_bytes();
            let start = rng.below(bytes.len().saturating_sub(len));
            let end = (start + len).min(bytes.len());
            json!(String::from_utf8_lossy(&bytes[start..end]))
        }
    }
}

/// `prefix` followed by `tail` (both text or both ids).
fn join(prefix: &Value, tail: Value) -> Value {
    match (prefix, tail) {
        (Value::String(p), Value::String(t)) => json!(p.clone() + &t),
        (Value::Array(p), Value::Array(t)) => json!([p.as_slice(), &t].concat()),
        (_, tail) => tail,
    }
}

/// The requests of setting number `index`: lengths, arrival gaps and the requests to drop the
/// same in every setting (seeded by `--seed`); the prompts' tails drawn anew for each setting,
/// so that only the shared prefix is seen again.
pub(super) fn jobs(
    a: &LoadgenArgs,
    index: usize,
    rate: f64,
    corpus: &str,
    closed: bool,
) -> Vec<Job> {
    let mut rng = SplitMix64::new(a.seed);
    let mixed = (index as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut tails = SplitMix64::new(a.seed ^ mixed);
    let prefix = match a.shared_prefix {
        0 => None,
        n => Some(draw(a, n, corpus, &mut SplitMix64::new(!a.seed))),
    };
    let mut at = 0.0;
    let mut out = Vec::with_capacity(a.requests);
    for _ in 0..a.requests {
        let len = uniform(&mut rng, a.prompt_len);
        let max_tokens = uniform(&mut rng, a.output_len);
        let disconnect = rng.uniform(0.0, 1.0) < a.disconnect_frac;
        let tail = draw(a, len, corpus, &mut tails);
        let prompt = match &prefix {
            Some(p) => join(p, tail),
            None => tail,
        };
        out.push(Job {
            at,
            prompt,
            max_tokens,
            disconnect,
        });
        if !closed {
            // Exponential gap: -ln(1 - u) / rate.
            at += -(1.0 - rng.uniform(0.0, 1.0)).ln() / rate;
        }
    }
    out
}

/// The request body: standard OpenAI fields (and `ignore_eos`, which llama-server reads and
/// other servers ignore, for outputs of the drawn lengths).
fn body(a: &LoadgenArgs, job: &Job) -> Value {
    let mut body = json!({
        "max_tokens": job.max_tokens, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true}, "ignore_eos": true,
    });
    if a.chat {
        body["messages"] = json!([{"role": "user", "content": job.prompt}]);
    } else {
        body["prompt"] = job.prompt.clone();
    }
    if a.n > 1 {
        body["n"] = json!(a.n);
    }
    body
}

/// Sends one streamed request; times its chunks from `t0`.
fn send(a: &LoadgenArgs, job: &Job, t0: Instant) -> Seen {
    let path = if a.chat {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    let mut req = ureq::post(&format!("{}{path}", a.url.trim_end_matches('/')))
        .timeout(Duration::from_secs(600));
    if let Some(k) = &a.api_key {
        req = req.set("Authorization", &format!("Bearer {k}"));
    }
    let now = || t0.elapsed().as_secs_f64();
    let mut clock = Clock::new(now());
    let mut stream = Stream::default();
    let mut dropped = false;
    match req.send_string(&body(a, job).to_string()) {
        Err(ureq::Error::Status(code, r)) => {
            let text = r.into_string().unwrap_or_default();
            stream.fail(format!("HTTP {code}: {}", message_of(&text)));
        }
        Err(e) => stream.fail(e.to_string()),
        Ok(r) => {
            for line in BufReader::new(r.into_reader()).lines() {
                let line = match line {
                    Ok(line) => line,
                    Err(e) => {
                        stream.fail(format!("reading the stream: {e}"));
                        break;
                    }
                };
                clock.tick(stream.line(&line), now());
                if stream.over() {
                    break;
                }
                // Dropping the reader closes the connection.
                if job.disconnect && stream.chunks >= DISCONNECT_AFTER {
                    dropped = true;
                    break;
                }
            }
        }
    }
    Seen {
        outcome: match dropped {
            true => Outcome::Disconnected,
            false => stream.outcome(),
        },
        cached: stream.cached,
        mismatch: stream.usage.is_some_and(|u| u != stream.counted),
        ttft: clock.ttft,
        itl: clock.itl,
        end: now(),
    }
}

/// Each job at its time.
pub(super) fn run_open(a: &LoadgenArgs, jobs: &[Job]) -> Vec<Seen> {
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
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Seen::lost("the client panicked"))
            })
            .collect()
    })
}

/// `clients` loops, each sending the next job when its last one ends.
pub(super) fn run_closed(a: &LoadgenArgs, jobs: &[Job], clients: usize) -> Vec<Seen> {
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
            .flat_map(|h| {
                h.join()
                    .unwrap_or_else(|_| vec![Seen::lost("the client panicked")])
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loadgen::tests::args;

    #[test]
    fn prompts_share_the_prefix_then_differ() {
        let corpus = "abcdefghijklmnopqrstuvwxyz0123456789".repeat(20);
        let a = args(&[
            "--clients",
            "1",
            "--shared-prefix",
            "8",
            "--prompt-len",
            "3,5",
        ]);
        let jobs = jobs(&a, 0, 1.0, &corpus, true);
        let texts: Vec<&str> = jobs.iter().map(|j| j.prompt.as_str().unwrap()).collect();
        assert!(texts.iter().all(|t| (11..=13).contains(&t.len())));
        assert!(texts.iter().all(|t| t[..8] == texts[0][..8]));
        assert!(texts.iter().any(|t| t[8..] != texts[0][8..]));
        // Another setting: the same prefix and lengths, tails of its own.
        let other = jobs_of(&a, 1, &corpus);
        let lens = |v: &[Job]| {
            v.iter()
                .map(|j| (j.max_tokens, j.prompt.as_str().unwrap().len()))
                .collect::<Vec<_>>()
        };
        assert_eq!(lens(&other), lens(&jobs));
        assert_eq!(other[0].prompt.as_str().unwrap()[..8], texts[0][..8]);
        let ids = args(&[
            "--clients",
            "1",
            "--shared-prefix",
            "4",
            "--ids",
            "50",
            "--prompt-len",
            "2,2",
        ]);
        let jobs = jobs_of(&ids, 0, &corpus);
        let first = jobs[0].prompt.as_array().unwrap();
        assert_eq!(first.len(), 6);
        assert!(jobs
            .iter()
            .all(|j| j.prompt.as_array().unwrap()[..4] == first[..4]));
    }

    fn jobs_of(a: &LoadgenArgs, index: usize, corpus: &str) -> Vec<Job> {
        jobs(a, index, 1.0, corpus, true)
    }

    #[test]
    fn the_seeded_fraction_is_dropped_and_bodies_are_standard() {
        let a = args(&[
            "--clients",
            "1",
            "--requests",
            "400",
            "--disconnect-frac",
            "0.25",
        ]);
        let jobs = jobs(&a, 0, 1.0, "some text to cut prompts from", true);
        let dropped = jobs.iter().filter(|j| j.disconnect).count();
        assert!((70..130).contains(&dropped), "{dropped}");
        let chat = args(&["--clients", "1", "--chat", "--n", "2"]);
        let b = body(&chat, &jobs[0]);
        assert_eq!(b["messages"][0]["role"], "user");
        assert_eq!(b["messages"][0]["content"], jobs[0].prompt);
        assert_eq!(
            (
                b["n"].as_u64(),
                b["stream_options"]["include_usage"].as_bool()
            ),
            (Some(2), Some(true))
        );
        assert!(b.get("prompt").is_none() && b.get("logprobs").is_none());
        assert!(body(&a, &jobs[0]).get("n").is_none());
    }
}
