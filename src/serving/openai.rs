//! The wire format of OpenAI's completions API, for servers built on the [`super::Scheduler`]:
//! a request body read into a [`Completion`] (every field's type and range checked, with an
//! error that names it and the HTTP status to answer), and the JSON of replies, stream chunks
//! and errors. No HTTP here: the `serve` subcommand of the example CLI puts it on a socket.

use serde_json::{json, Map, Value};

use crate::sampling::Sampling;

/// An API error: its HTTP status, OpenAI's `type`, and a message naming what was wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status to answer with (4xx for the request's faults).
    pub status: u16,
    /// OpenAI's error `type` (`invalid_request_error`, ...).
    pub kind: &'static str,
    /// What was wrong, naming the field.
    pub message: String,
    /// The field at fault, when one is.
    pub param: Option<String>,
}

impl ApiError {
    /// A 400 about `param`.
    pub fn invalid(param: &str, message: String) -> ApiError {
        ApiError {
            status: 400,
            kind: "invalid_request_error",
            message,
            param: Some(param.to_string()),
        }
    }

    /// Another status, about no field.
    pub fn status(status: u16, kind: &'static str, message: String) -> ApiError {
        ApiError {
            status,
            kind,
            message,
            param: None,
        }
    }

    /// OpenAI's error body.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": Value::Null,
        }})
    }
}

/// The prompt: text, or token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Text, for the model's tokenizer.
    Text(String),
    /// Token ids.
    Ids(Vec<u32>),
}

/// A checked `POST /v1/completions` body.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The prompt.
    pub prompt: Prompt,
    /// The most new tokens (16 when absent, as OpenAI; the scheduler checks the range).
    pub max_tokens: usize,
    /// Greedy for temperature 0, else sampled with the request's (or the server's) seed.
    pub sampling: Sampling,
    /// Up to four stop sequences, none empty.
    pub stop: Vec<String>,
    /// Stream the reply as server-sent events.
    pub stream: bool,
    /// With `stream`: a last chunk with `usage` (`stream_options.include_usage`).
    pub stream_usage: bool,
}

/// OpenAI's default `max_tokens` for completions.
const DEFAULT_MAX_TOKENS: usize = 16;
/// The most stop sequences, as OpenAI.
const MAX_STOPS: usize = 4;

/// Reads a request body. `model` is the id this server lists; `seed` the seed of a sampled
/// request that names none. Unknown fields are ignored (clients send many); `null` is absent.
/// Never panics: any other input is an [`ApiError`] (400, or 404 for another model).
pub fn parse_completion(body: &[u8], model: &str, seed: u64) -> Result<Completion, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid("body", format!("the body is not valid JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(ApiError::invalid(
            "body",
            "the body must be a JSON object".into(),
        ));
    };
    let field = |name: &str| map.get(name).filter(|v| !v.is_null());
    if let Some(m) = field("model") {
        let m = m
            .as_str()
            .ok_or_else(|| ApiError::invalid("model", "model must be a string".into()))?;
        if m != model {
            return Err(ApiError {
                status: 404,
                kind: "invalid_request_error",
                message: format!("the model {m:?} does not exist; this server has {model:?}"),
                param: Some("model".into()),
            });
        }
    }
    let prompt = match field("prompt") {
        None => return Err(ApiError::invalid("prompt", "prompt is required".into())),
        Some(p) => parse_prompt(p)?,
    };
    let max_tokens = match field("max_tokens") {
        None => DEFAULT_MAX_TOKENS,
        Some(v) => whole(v, "max_tokens")? as usize,
    };
    if let Some(n) = field("n") {
        if whole(n, "n")? != 1 {
            return Err(ApiError::invalid(
                "n",
                "n must be 1 (one choice per request)".into(),
            ));
        }
    }
    for flag in ["echo", "logprobs"] {
        if field(flag).is_some_and(|v| v != &Value::Bool(false)) {
            return Err(ApiError::invalid(flag, format!("{flag} is not supported")));
        }
    }
    let sampling = parse_sampling(&map, seed)?;
    let stop = parse_stop(field("stop"))?;
    let stream = match field("stream") {
        None => false,
        Some(v) => v
            .as_bool()
            .ok_or_else(|| ApiError::invalid("stream", "stream must be true or false".into()))?,
    };
    let stream_usage = field("stream_options")
        .and_then(|o| o.get("include_usage"))
        .is_some_and(|v| v == &Value::Bool(true));
    Ok(Completion {
        prompt,
        max_tokens,
        sampling,
        stop,
        stream,
        stream_usage,
    })
}

fn parse_prompt(p: &Value) -> Result<Prompt, ApiError> {
    let bad = || {
        ApiError::invalid(
            "prompt",
            "prompt must be a string or an array of token ids (one prompt per request)".into(),
        )
    };
    match p {
        Value::String(s) => Ok(Prompt::Text(s.clone())),
        Value::Array(items) => {
            if let [Value::String(s)] = items.as_slice() {
                return Ok(Prompt::Text(s.clone()));
            }
            let ids = items
                .iter()
                .map(|v| {
                    v.as_u64()
                        .and_then(|t| u32::try_from(t).ok())
                        .ok_or_else(bad)
                })
                .collect::<Result<Vec<u32>, ApiError>>()?;
            Ok(Prompt::Ids(ids))
        }
        _ => Err(bad()),
    }
}

/// A non-negative integer field.
fn whole(v: &Value, name: &str) -> Result<u64, ApiError> {
    v.as_u64().ok_or_else(|| {
        ApiError::invalid(
            name,
            format!("{name} must be a non-negative integer, got {v}"),
        )
    })
}

/// A finite number field.
fn number(v: &Value, name: &str) -> Result<f64, ApiError> {
    v.as_f64()
        .filter(|x| x.is_finite())
        .ok_or_else(|| ApiError::invalid(name, format!("{name} must be a finite number, got {v}")))
}

/// `temperature` (0, or anything that rounds to 0 as an f32, is greedy; default 1, as OpenAI),
/// `top_p` (0, 1] as an f32, `top_k` (0: off) and `seed`.
fn parse_sampling(map: &Map<String, Value>, seed: u64) -> Result<Sampling, ApiError> {
    let field = |name: &str| map.get(name).filter(|v| !v.is_null());
    let temperature = field("temperature")
        .map(|v| number(v, "temperature"))
        .transpose()?;
    let temperature = temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid(
            "temperature",
            format!("temperature ({temperature}) must be in [0, 2]"),
        ));
    }
    let top_p = field("top_p")
        .map(|v| number(v, "top_p"))
        .transpose()?
        .unwrap_or(1.0);
    // Checked as the f32 the sampler takes: 1e-50 is above 0 but rounds to it.
    if !(top_p as f32 > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid(
            "top_p",
            format!("top_p ({top_p}) must be in (0, 1] (as an f32)"),
        ));
    }
    let top_k = field("top_k")
        .map(|v| whole(v, "top_k"))
        .transpose()?
        .unwrap_or(0);
    let seed = match field("seed") {
        None => seed,
        Some(v) => v
            .as_u64()
            .or_else(|| v.as_i64().map(|s| s as u64))
            .ok_or_else(|| {
                ApiError::invalid("seed", format!("seed must be an integer, got {v}"))
            })?,
    };
    // A temperature that rounds to 0 in f32 is 0: greedy.
    if temperature as f32 == 0.0 {
        return Ok(Sampling::Greedy);
    }
    Ok(Sampling::Sample {
        temperature: temperature as f32,
        top_k: usize::try_from(top_k).unwrap_or(usize::MAX),
        top_p: top_p as f32,
        seed,
    })
}

fn parse_stop(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let bad = || {
        ApiError::invalid(
            "stop",
            "stop must be a string or an array of strings".into(),
        )
    };
    let stops = match v {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|s| s.as_str().map(str::to_string).ok_or_else(bad))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad()),
    };
    if stops.len() > MAX_STOPS {
        return Err(ApiError::invalid(
            "stop",
            format!("at most {MAX_STOPS} stop sequences, got {}", stops.len()),
        ));
    }
    if stops.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "a stop sequence is empty".into()));
    }
    Ok(stops)
}

/// What every reply and chunk of one request shares.
#[derive(Debug, Clone)]
pub struct ReplyHead {
    /// The completion's id (`cmpl-...`).
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The model's id.
    pub model: String,
}

/// Token counts for `usage`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt: usize,
    /// Generated tokens.
    pub completion: usize,
}

impl Usage {
    fn json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
        })
    }
}

impl ReplyHead {
    /// The completion object with these `choices`, and `usage` when given.
    fn object(&self, choices: Value, usage: Option<Usage>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u.json();
        }
        v
    }

    /// The one choice: its text, tokens (`token_ids`, an extension some servers have: a
    /// client of a model without a tokenizer reads the tokens there) and finish reason.
    fn choice(text: &str, ids: &[u32], finish: Option<&str>) -> Value {
        json!([{
            "text": text,
            "index": 0,
            "logprobs": Value::Null,
            "finish_reason": finish,
            "token_ids": ids,
        }])
    }

    /// A whole (non-streamed) reply.
    pub fn reply(&self, text: &str, ids: &[u32], finish: &str, usage: Usage) -> Value {
        self.object(Self::choice(text, ids, Some(finish)), Some(usage))
    }

    /// A stream chunk: new text (and its tokens), and the finish reason on the last.
    pub fn chunk(&self, text: &str, ids: &[u32], finish: Option<&str>) -> Value {
        self.object(Self::choice(text, ids, finish), None)
    }

    /// The usage chunk after the last (`stream_options.include_usage`).
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        self.object(json!([]), Some(usage))
    }
}
