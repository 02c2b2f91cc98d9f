//! `serve` with a real HTTP client against servers on ephemeral ports, the shipped byte model:
//! 32 concurrent greedy requests each equal to offline `generate` of that prompt alone,
//! streamed and whole replies equal, a seeded request the same alone and under load, every
//! bad input answered 4xx with an OpenAI error body, the queue limit, the API key, a client
//! that disconnects, and a graceful stop on SIGTERM; every other family answering concurrent
//! token-id requests with transformers' greedy tokens, and its context limit.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stablegraph::models::mamba2::{Mamba2, Mamba2Config, Mamba2Weights, Penalties, Sampling};
use stablegraph::models::GenerateOptions;
use stablegraph::DType;

use crate::binary;
use crate::common::client;

const SHIPPED: &str = "models/mamba2-bytes";

/// A `mamba2 serve` process on an ephemeral port taking prompts of up to 64 tokens (one
/// prompt bucket to compile), killed when dropped.
pub(crate) struct Server {
    child: Child,
    url: String,
}

impl Server {
    pub(crate) fn start(args: &[&str]) -> Server {
        let mut child = Command::new(binary())
            .args(["serve", "--port", "0", "--max-prompt", "64"])
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_remove("STABLEGRAPH_API_KEY")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting mamba2 serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("serve printed {line:?}"))
            .to_string();
        Server { child, url }
    }

    pub(crate) fn post(&self, body: &Value) -> Result<Value, (u16, Value)> {
        self.post_with(body, None)
    }

    /// A chat completion.
    pub(crate) fn chat(&self, body: &Value) -> Result<Value, (u16, Value)> {
        let req = ureq::post(&format!("{}/v1/chat/completions", self.url))
            .set("Content-Type", "application/json");
        answer(req.send_string(&body.to_string()))
    }

    fn post_with(&self, body: &Value, key: Option<&str>) -> Result<Value, (u16, Value)> {
        let mut req = ureq::post(&format!("{}/v1/completions", self.url))
            .set("Content-Type", "application/json");
        if let Some(k) = key {
            req = req.set("Authorization", &format!("Bearer {k}"));
        }
        answer(req.send_string(&body.to_string()))
    }

    pub(crate) fn get(&self, path: &str, key: Option<&str>) -> Result<String, (u16, Value)> {
        let mut req = ureq::get(&format!("{}{path}", self.url));
        if let Some(k) = key {
            req = req.set("Authorization", &format!("Bearer {k}"));
        }
        match req.call() {
            Ok(r) => Ok(r.into_string().unwrap()),
            Err(ureq::Error::Status(code, r)) => Err((
                code,
                serde_json::from_str(&r.into_string().unwrap()).unwrap(),
            )),
            Err(e) => panic!("GET {path}: {e}"),
        }
    }

    /// The events of a streamed request, parsed, up to `[DONE]`.
    fn stream(&self, body: &Value) -> Vec<Value> {
        self.stream_from("/v1/completions", body)
    }

    /// The events of a request streamed from endpoint `path`, parsed, up to `[DONE]`.
    pub(crate) fn stream_from(&self, path: &str, body: &Value) -> Vec<Value> {
        let r = ureq::post(&format!("{}{path}", self.url))
            .send_string(&body.to_string())
            .expect("a streamed request");
        assert_eq!(r.content_type(), "text/event-stream");
        let mut events = Vec::new();
        for line in BufReader::new(r.into_reader()).lines() {
            let line = line.unwrap();
            let Some(data) = line.strip_prefix("data: ") else {
                assert!(line.is_empty(), "unexpected line {line:?}");
                continue;
            };
            if data == "[DONE]" {
                return events;
            }
            events.push(serde_json::from_str(data).unwrap());
        }
        panic!("the stream ended without [DONE]");
    }

    pub(crate) fn host_port(&self) -> &str {
        self.url.strip_prefix("http://").unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The JSON of a reply, or the status and JSON of an error (with its Retry-After header as
/// `retry_after`).
fn answer(r: Result<ureq::Response, ureq::Error>) -> Result<Value, (u16, Value)> {
    match r {
        Ok(r) => {
            assert_eq!(r.content_type(), "application/json");
            Ok(serde_json::from_str(&r.into_string().unwrap()).unwrap())
        }
        Err(ureq::Error::Status(code, r)) => {
            assert_eq!(r.content_type(), "application/json");
            let retry = r.header("Retry-After").map(str::to_string);
            let mut body: Value = serde_json::from_str(&r.into_string().unwrap()).unwrap();
            if let Some(s) = retry {
                body["retry_after"] = json!(s);
            }
            Err((code, body))
        }
        Err(e) => panic!("request failed: {e}"),
    }
}

/// The shipped model loaded through the library, for offline references.
pub(crate) fn shipped_model() -> Mamba2 {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(SHIPPED);
    let config = Mamba2Config::from_file(dir.join("config.json")).unwrap();
    let w = Mamba2Weights::load(&dir, &config, DType::F32).unwrap();
    Mamba2::new(&client(), config, w).unwrap()
}

pub(crate) fn offline(model: &Mamba2, prompt: &[u8], max_tokens: usize) -> Vec<u32> {
    let options = GenerateOptions {
        max_new_tokens: max_tokens,
        sampling: Sampling::Greedy,
        eos: None,
        penalties: Penalties::NONE,
    };
    let ids: Vec<u32> = prompt.iter().map(|&b| u32::from(b)).collect();
    model.generate(&[ids], &options).unwrap().remove(0)
}

fn ids(v: &Value) -> Vec<u32> {
    v["choices"][0]["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

/// Prompt `i`: a different line of Rust-like text per request, 3 to 60 bytes.
fn prompt(i: usize) -> String {
    let words = [
        "fn ", "let ", "mut ", "state", ".step(", "x", " = ", "self", "{\n", ");",
    ];
    (0..1 + i % 13)
        .map(|j| words[(i * 7 + j * 3) % words.len()])
        .collect()
}

#[test]
fn concurrent_greedy_requests_equal_offline_generate_and_streams_equal_whole_replies() {
    let server = Server::start(&["--slots", "8", "--segment", "8"]);
    let asks: Vec<(String, usize)> = (0..32).map(|i| (prompt(i), 4 + (i * 11) % 37)).collect();
    let replies: Vec<Value> = std::thread::scope(|s| {
        let handles: Vec<_> = asks
            .iter()
            .map(|(p, n)| {
                let server = &server;
                s.spawn(move || {
                    server
                        .post(&json!({"prompt": p, "max_tokens": n, "temperature": 0}))
                        .unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let model = shipped_model();
    for ((p, n), reply) in asks.iter().zip(&replies) {
        let want = offline(&model, p.as_bytes(), *n);
        assert_eq!(ids(reply), want, "prompt {p:?}");
        let text = String::from_utf8_lossy(&want.iter().map(|&t| t as u8).collect::<Vec<_>>())
            .into_owned();
        assert_eq!(reply["choices"][0]["text"], json!(text));
        assert_eq!(reply["choices"][0]["finish_reason"], "length");
        assert_eq!(reply["usage"]["prompt_tokens"], json!(p.len()));
        assert_eq!(reply["usage"]["completion_tokens"], json!(n));
        assert_eq!(reply["object"], "text_completion");
    }
    // Streamed and whole replies are equal, with and without a stop sequence.
    for stop in [Value::Null, json!(["\n"])] {
        let body =
            json!({"prompt": "fn main() {", "max_tokens": 40, "temperature": 0, "stop": stop});
        let whole = server.post(&body).unwrap();
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let events = server.stream(&streamed);
        let text: String = events
            .iter()
            .map(|e| e["choices"][0]["text"].as_str().unwrap())
            .collect();
        assert_eq!(json!(text), whole["choices"][0]["text"]);
        // The chunks' tokens, the last chunk's included, are the whole reply's.
        let streamed_ids: Vec<Value> = events
            .iter()
            .flat_map(|e| e["choices"][0]["token_ids"].as_array().unwrap().clone())
            .collect();
        assert_eq!(json!(streamed_ids), whole["choices"][0]["token_ids"]);
        let last = &events.last().unwrap()["choices"][0]["finish_reason"];
        assert_eq!(last, &whole["choices"][0]["finish_reason"]);
        assert!(events[..events.len() - 1]
            .iter()
            .all(|e| e["choices"][0]["finish_reason"].is_null()));
        if stop.is_null() {
            assert_eq!(whole["choices"][0]["finish_reason"], "length");
        } else {
            assert_eq!(whole["choices"][0]["finish_reason"], "stop");
            assert!(!text.contains('\n'), "{text:?} holds the stop sequence");
            let free = offline(&model, b"fn main() {", 40);
            let free: Vec<u8> = free.iter().map(|&t| t as u8).collect();
            let free = String::from_utf8_lossy(&free);
            assert_eq!(text, free.split('\n').next().unwrap());
        }
    }
    // A seeded sampled request gives the same text alone and under load.
    let seeded =
        json!({"prompt": "let x", "max_tokens": 48, "temperature": 0.8, "top_p": 0.9, "seed": 42});
    let alone = server.post(&seeded).unwrap();
    let loaded = std::thread::scope(|s| {
        let others: Vec<_> = (0..7)
            .map(|i| {
                let server = &server;
                s.spawn(move || {
                    let body = json!({"prompt": prompt(i), "max_tokens": 30 + i, "temperature": 1.0, "seed": i});
                    server.post(&body).unwrap();
                })
            })
            .collect();
        let mine = server.post(&seeded).unwrap();
        for o in others {
            o.join().unwrap();
        }
        mine
    });
    assert_eq!(ids(&loaded), ids(&alone));
    let other_seed = server.post(&json!({"prompt": "let x", "max_tokens": 48, "temperature": 0.8, "top_p": 0.9, "seed": 43})).unwrap();
    assert_ne!(ids(&other_seed), ids(&alone), "the seed is used");
}

#[test]
fn bad_requests_get_openai_errors() {
    let server = Server::start(&["--max-tokens", "100", "--max-body", "4096"]);
    let cases: Vec<(Value, u16, &str)> = vec![
        (json!({"max_tokens": 3}), 400, "prompt is required"),
        (json!({"prompt": 5}), 400, "prompt must be"),
        (json!({"prompt": ["a", "b"]}), 400, "prompt must be"),
        (json!({"prompt": [1, 300]}), 400, "outside the vocabulary"),
        (json!({"prompt": ""}), 400, "prompt is empty"),
        (
            json!({"prompt": "x".repeat(65)}),
            400,
            "the most this server takes is 64",
        ),
        (
            json!({"prompt": "x", "max_tokens": 101}),
            400,
            "max_tokens (101)",
        ),
        (
            json!({"prompt": "x", "max_tokens": 0}),
            400,
            "max_tokens (0)",
        ),
        (
            json!({"prompt": "x", "max_tokens": -1}),
            400,
            "max_tokens must be",
        ),
        (
            json!({"prompt": "x", "max_tokens": 2.5}),
            400,
            "max_tokens must be",
        ),
        (
            json!({"prompt": "x", "temperature": "hot"}),
            400,
            "temperature must be",
        ),
        (
            json!({"prompt": "x", "temperature": 2.5}),
            400,
            "temperature (2.5)",
        ),
        (
            json!({"prompt": "x", "temperature": -1}),
            400,
            "temperature (-1)",
        ),
        (json!({"prompt": "x", "top_p": 0}), 400, "top_p (0)"),
        (json!({"prompt": "x", "top_p": 1.5}), 400, "top_p (1.5)"),
        // Above 0, but 0 as the f32 the sampler takes (found by fuzzing).
        (
            json!({"prompt": "x", "top_p": 1e-50}),
            400,
            "must be in (0, 1] (as an f32)",
        ),
        (json!({"prompt": "x", "top_k": -2}), 400, "top_k must be"),
        (json!({"prompt": "x", "seed": "s"}), 400, "seed must be"),
        (json!({"prompt": "x", "stop": 3}), 400, "stop must be"),
        (
            json!({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}),
            400,
            "at most 4",
        ),
        (
            json!({"prompt": "x", "stream": "yes"}),
            400,
            "stream must be",
        ),
        (json!({"prompt": "x", "n": 9}), 400, "n (9) is not in 1..=8"),
        (json!({"prompt": "x", "n": 0}), 400, "n must be at least 1"),
        (
            json!({"prompt": "x", "suffix": "y"}),
            400,
            "suffix is not supported",
        ),
        (
            json!({"prompt": "x", "best_of": 3}),
            400,
            "best_of must equal n",
        ),
        (
            json!({"prompt": "x", "logit_bias": {"5": 200}}),
            400,
            "must be in [-100, 100]",
        ),
        (
            json!({"prompt": "x", "presence_penalty": 3}),
            400,
            "presence_penalty (3)",
        ),
        (
            json!({"prompt": "x", "model": "gpt-4"}),
            404,
            "does not exist",
        ),
        (json!([1, 2]), 400, "JSON object"),
        (
            json!({"prompt": "x".repeat(5000)}),
            413,
            "larger than 4096 bytes",
        ),
    ];
    for (body, status, want) in cases {
        let (code, err) = server.post(&body).expect_err(&body.to_string());
        assert_eq!(code, status, "{body}: {err}");
        let message = err["error"]["message"].as_str().unwrap();
        assert!(message.contains(want), "{body}: {message:?} lacks {want:?}");
        assert!(err["error"]["type"].is_string());
    }
    // Not JSON at all, and a body larger than the limit sent in chunks (no length declared).
    let raw = |head: &str, body: &[u8]| -> String {
        let mut s = TcpStream::connect(server.host_port()).unwrap();
        s.write_all(head.as_bytes()).unwrap();
        let _ = s.write_all(body);
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    };
    let out = raw(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\nConnection: close\r\n\r\n",
        b"{not json",
    );
    assert!(
        out.starts_with("HTTP/1.1 400") && out.contains("not valid JSON"),
        "{out}"
    );
    let mut chunked = Vec::new();
    for _ in 0..10 {
        chunked.extend_from_slice(b"400\r\n");
        chunked.extend(std::iter::repeat_n(b' ', 0x400));
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let out = raw(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        &chunked,
    );
    assert!(out.starts_with("HTTP/1.1 413"), "{out}");
    let (code, err) = server.get("/v2/nothing", None).unwrap_err();
    assert_eq!(
        (code, err["error"]["type"].as_str()),
        (404, Some("invalid_request_error"))
    );
    // The server still answers.
    assert!(server
        .post(&json!({"prompt": "x", "max_tokens": 2}))
        .is_ok());
    // The metrics count the refusals, and the one request served: 1 prompt token, 2 new.
    let metrics = server.get("/metrics", None).unwrap();
    for line in [
        "stablegraph_requests_total{outcome=\"invalid\"} 32",
        "stablegraph_requests_total{outcome=\"completed\"} 1",
        "stablegraph_prompt_tokens_total 1\n",
        "stablegraph_generated_tokens_total 2\n",
        "stablegraph_time_to_first_token_seconds_count 1\n",
    ] {
        assert!(metrics.contains(line), "{line} not in {metrics}");
    }
}

#[test]
fn the_queue_limit_the_api_key_and_a_disconnecting_client() {
    let key = "sk-test-123";
    let server = Server::start(&[
        "--slots",
        "1",
        "--segment",
        "4",
        "--max-queue",
        "1",
        "--api-key",
        key,
    ]);
    // /health needs no key; everything else does.
    assert!(server.get("/health", None).is_ok());
    for path in ["/v1/models", "/metrics"] {
        assert_eq!(server.get(path, None).unwrap_err().0, 401, "{path}");
        assert_eq!(
            server.get(path, Some("sk-test-124")).unwrap_err().0,
            401,
            "{path}"
        );
        assert!(server.get(path, Some(key)).is_ok(), "{path}");
    }
    let body = json!({"prompt": "x", "max_tokens": 3});
    assert_eq!(server.post_with(&body, None).unwrap_err().0, 401);
    assert!(server.post_with(&body, Some(key)).is_ok());
    let models: Value =
        serde_json::from_str(&server.get("/v1/models", Some(key)).unwrap()).unwrap();
    assert_eq!(models["data"][0]["id"], "mamba2-bytes");
    // One long streamed request holds the only slot; its client reads a chunk and leaves.
    let mut long = TcpStream::connect(server.host_port()).unwrap();
    let body = json!({"prompt": "fn", "max_tokens": 2000, "stream": true}).to_string();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    long.write_all(head.as_bytes()).unwrap();
    let mut first = [0u8; 64];
    long.read_exact(&mut first).unwrap();
    assert!(first.starts_with(b"HTTP/1.1 200"));
    // With the slot taken, one request may wait in the queue; the next is refused.
    let queued_body = json!({"prompt": "y", "max_tokens": 5});
    let (codes, retry) = std::thread::scope(|s| {
        let queued = s.spawn(|| server.post_with(&queued_body, Some(key)).map(|_| ()));
        let started = Instant::now();
        let refused = loop {
            std::thread::sleep(Duration::from_millis(50));
            match server.post_with(&queued_body, Some(key)) {
                Err((429, err)) => break err,
                _ if started.elapsed() > Duration::from_secs(20) => panic!("no 429"),
                _ => {}
            }
        };
        drop(long);
        // The queued request runs once the departed client's slot is free.
        let done = queued.join().unwrap();
        (done.map_err(|e| e.0), refused["retry_after"].clone())
    });
    assert_eq!(codes, Ok(()));
    assert_eq!(retry, json!("1"));
    let metrics = server.get("/metrics", Some(key)).unwrap();
    for line in [
        "outcome=\"disconnected\"} 1",
        "outcome=\"unauthorized\"} 5",
        "stablegraph_slots_active 0",
    ] {
        assert!(metrics.contains(line), "{line} not in {metrics}");
    }
    assert!(metrics.contains("outcome=\"queue_full\"}"), "{metrics}");
}

#[test]
fn sigterm_finishes_the_streams_in_flight_then_exits_0() {
    let mut server = Server::start(&[]);
    let body = json!({"prompt": "fn", "max_tokens": 300, "temperature": 0, "stream": true});
    let r = ureq::post(&format!("{}/v1/completions", server.url))
        .send_string(&body.to_string())
        .unwrap();
    let mut lines = BufReader::new(r.into_reader()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("data: {"), "{first}");
    let pid = server.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    std::thread::sleep(Duration::from_millis(300));
    // No one new is let in...
    let late = ureq::post(&format!("{}/v1/completions", server.url))
        .timeout(Duration::from_secs(10))
        .send_string(&json!({"prompt": "x", "max_tokens": 2}).to_string());
    match late {
        Err(ureq::Error::Status(code, _)) => assert_eq!(code, 503),
        Err(ureq::Error::Transport(_)) => {}
        Ok(_) => panic!("a request after SIGTERM was served"),
    }
    // ...and the stream in flight runs to its end.
    let mut tokens = 0;
    let mut done = false;
    for line in std::iter::once(Ok(first)).chain(lines) {
        let line = line.unwrap();
        if line == "data: [DONE]" {
            done = true;
            break;
        }
        if let Some(data) = line.strip_prefix("data: ") {
            let v: Value = serde_json::from_str(data).unwrap();
            tokens += v["choices"][0]["token_ids"].as_array().unwrap().len();
        }
    }
    assert!(done);
    assert_eq!(tokens, 300);
    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status}");
}

#[test]
fn every_family_serves_two_concurrent_requests_with_transformers_tokens() {
    // The two rows of case 3 (a ragged batch) of each fixture, as token-id prompts sent at
    // once: each reply is transformers' greedy continuation of that row.
    for dir in [
        "tests/fixtures/mamba1/falcon",
        "tests/fixtures/hybrid/bamba",
        "tests/fixtures/hybrid/granite",
        "tests/fixtures/hybrid/nemotron",
    ] {
        let cases = crate::common::read_safetensors(&Path::new(dir).join("cases.safetensors"));
        let rows = crate::common::fixture_prompts(&cases, 3);
        let want = &cases["case3.greedy"];
        let n = want.shape[1];
        let server = Server::start(&["--model", dir, "--slots", "2", "--max-tokens", "16"]);
        let replies: Vec<Value> = std::thread::scope(|s| {
            let handles: Vec<_> = rows
                .iter()
                .map(|row| {
                    let body = json!({"prompt": row, "max_tokens": n, "temperature": 0});
                    let server = &server;
                    s.spawn(move || server.post(&body).unwrap())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (r, reply) in replies.iter().enumerate() {
            let hf: Vec<u32> = want.values[r * n..(r + 1) * n]
                .iter()
                .map(|&t| t as u32)
                .collect();
            assert_eq!(ids(reply), hf, "{dir}: row {r}");
        }
    }
    // A request beyond the context is a 400 naming it.
    let long = Server::start(&[
        "--model",
        "tests/fixtures/hybrid/bamba",
        "--max-context",
        "20",
    ]);
    let (status, body) = long
        .post(&json!({"prompt": vec![5; 12], "max_tokens": 10}))
        .unwrap_err();
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("context is 20 tokens"), "{body}");
}
