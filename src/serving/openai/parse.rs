//! Request bodies: `POST /v1/completions` and `POST /v1/chat/completions` read into a
//! [`Completion`] or a [`ChatCompletion`], every field's type and range checked; an OpenAI
//! field that would change the output and is not supported is refused by name.

use serde_json::{Map, Value};

use super::ApiError;
use crate::sampling::{Penalties, Sampling};
use crate::serving::chat::Message;

/// The prompt: text, or token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Text, for the model's tokenizer.
    Text(String),
    /// Token ids.
    Ids(Vec<u32>),
}

/// What both endpoints take besides the prompt or the messages.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The most new tokens (`max_tokens`, or chat's `max_completion_tokens`); `None`: the
    /// endpoint's default (16 for completions, as OpenAI; for chat, what the context leaves).
    pub max_tokens: Option<usize>,
    /// Choices (`n`, 1 when absent).
    pub n: usize,
    /// Greedy for temperature 0, else sampled with the request's (or the server's) seed.
    pub sampling: Sampling,
    /// `presence_penalty`, `frequency_penalty` and `repetition_penalty` (an extension, as in
    /// vLLM); [`Penalties::NONE`] when absent.
    pub penalties: Penalties,
    /// `logit_bias`: (token, bias in [-100, 100]) added to the logits.
    pub logit_bias: Vec<(u32, f32)>,
    /// Log-probabilities: `None`, or how many of the most likely tokens to report besides the
    /// chosen one (0 to 20).
    pub logprobs: Option<usize>,
    /// Up to four stop sequences, none empty.
    pub stop: Vec<String>,
    /// Stream the reply as server-sent events.
    pub stream: bool,
    /// With `stream`: a last chunk with `usage` (`stream_options.include_usage`).
    pub stream_usage: bool,
}

/// A checked `POST /v1/completions` body.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The prompt.
    pub prompt: Prompt,
    /// The reply's text starts with the prompt's (`echo`).
    pub echo: bool,
    /// The rest.
    pub generation: Generation,
}

/// A checked `POST /v1/chat/completions` body.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatCompletion {
    /// The conversation (content parts of type text joined by newlines).
    pub messages: Vec<Message>,
    /// Open the assistant's turn after the messages (`add_generation_prompt`, an extension as
    /// in vLLM; true when absent).
    pub add_generation_prompt: bool,
    /// The rest.
    pub generation: Generation,
}

/// OpenAI's default `max_tokens` for completions.
const DEFAULT_MAX_TOKENS: usize = 16;
/// The most stop sequences, as OpenAI.
const MAX_STOPS: usize = 4;
/// The most `top_logprobs` (chat) or `logprobs` (completions), as OpenAI's chat.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// The fields of both endpoints that change the output and that this server does not support:
/// a request naming one (with a value other than its default) is refused.
const UNSUPPORTED: [&str; 11] = [
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "response_format",
    "audio",
    "prediction",
    "web_search_options",
    "reasoning_effort",
    "suffix",
    "guided_json",
];

/// The body as a JSON object; `null` fields are absent.
fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid("body", format!("the body is not valid JSON: {e}")))?;
    let Value::Object(mut map) = value else {
        return Err(ApiError::invalid(
            "body",
            "the body must be a JSON object".into(),
        ));
    };
    map.retain(|_, v| !v.is_null());
    Ok(map)
}

/// Checks `model` against the id this server lists (404 for another).
fn check_model(map: &Map<String, Value>, model: &str) -> Result<(), ApiError> {
    let Some(m) = map.get("model") else {
        return Ok(());
    };
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
    Ok(())
}

/// Refuses the unsupported fields that are set to something other than their defaults.
fn refuse_unsupported(map: &Map<String, Value>) -> Result<(), ApiError> {
    let default = |name: &str, v: &Value| match name {
        "tool_choice" => v == "none",
        "response_format" => v.get("type").is_some_and(|t| t == "text"),
        "tools" | "functions" => v.as_array().is_some_and(Vec::is_empty),
        "suffix" => v == "",
        _ => false,
    };
    for name in UNSUPPORTED {
        if map.get(name).is_some_and(|v| !default(name, v)) {
            return Err(ApiError::invalid(
                name,
                format!("{name} is not supported by this server"),
            ));
        }
    }
    if map
        .get("modalities")
        .is_some_and(|v| v != &serde_json::json!(["text"]))
    {
        return Err(ApiError::invalid(
            "modalities",
            "only the text modality is supported".into(),
        ));
    }
    Ok(())
}

/// Reads a `POST /v1/completions` body. `model` is the id this server lists; `seed` the seed
/// of a sampled request that names none. Fields outside OpenAI's API are ignored (clients send
/// many); `null` is absent. Never panics: any other input is an [`ApiError`] (400, or 404 for
/// another model).
pub fn parse_completion(body: &[u8], model: &str, seed: u64) -> Result<Completion, ApiError> {
    let map = object(body)?;
    check_model(&map, model)?;
    let prompt = match map.get("prompt") {
        None => return Err(ApiError::invalid("prompt", "prompt is required".into())),
        Some(p) => parse_prompt(p)?,
    };
    if let Some(b) = map.get("best_of") {
        let n = map.get("n").and_then(Value::as_u64).unwrap_or(1);
        if whole(b, "best_of")? != n {
            return Err(ApiError::invalid(
                "best_of",
                "best_of must equal n (choices are not ranked)".into(),
            ));
        }
    }
    let echo = flag(&map, "echo")?;
    let logprobs = match map.get("logprobs") {
        None => None,
        Some(v) => Some(top_count(v, "logprobs")?),
    };
    let mut generation = parse_generation(&map, seed, logprobs)?;
    if generation.max_tokens.is_none() {
        generation.max_tokens = Some(DEFAULT_MAX_TOKENS);
    }
    Ok(Completion {
        prompt,
        echo,
        generation,
    })
}

/// Reads a `POST /v1/chat/completions` body, as [`parse_completion`] reads its own:
/// `messages` (system, user, developer (as system) and assistant; string content or content
/// parts of type text), `max_completion_tokens` (or `max_tokens`), `logprobs` with
/// `top_logprobs`.
pub fn parse_chat(body: &[u8], model: &str, seed: u64) -> Result<ChatCompletion, ApiError> {
    let map = object(body)?;
    check_model(&map, model)?;
    let messages = match map.get("messages") {
        None => return Err(ApiError::invalid("messages", "messages is required".into())),
        Some(m) => parse_messages(m)?,
    };
    let top = match map.get("top_logprobs") {
        None => 0,
        Some(v) => top_count(v, "top_logprobs")?,
    };
    let logprobs = match flag(&map, "logprobs")? {
        true => Some(top),
        false if map.contains_key("top_logprobs") && top > 0 => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs needs logprobs: true".into(),
            ))
        }
        false => None,
    };
    let mut generation = parse_generation(&map, seed, logprobs)?;
    if let Some(v) = map.get("max_completion_tokens") {
        generation.max_tokens = Some(whole(v, "max_completion_tokens")? as usize);
    }
    let add_generation_prompt = match map.get("add_generation_prompt") {
        None => true,
        Some(_) => flag(&map, "add_generation_prompt")?,
    };
    Ok(ChatCompletion {
        messages,
        add_generation_prompt,
        generation,
    })
}

/// The fields both endpoints share.
fn parse_generation(
    map: &Map<String, Value>,
    seed: u64,
    logprobs: Option<usize>,
) -> Result<Generation, ApiError> {
    refuse_unsupported(map)?;
    let max_tokens = match map.get("max_tokens") {
        None => None,
        Some(v) => Some(whole(v, "max_tokens")? as usize),
    };
    let n = match map.get("n") {
        None => 1,
        Some(v) => match whole(v, "n")? {
            0 => return Err(ApiError::invalid("n", "n must be at least 1".into())),
            n => usize::try_from(n).unwrap_or(usize::MAX),
        },
    };
    Ok(Generation {
        max_tokens,
        n,
        sampling: parse_sampling(map, seed)?,
        penalties: parse_penalties(map)?,
        logit_bias: parse_logit_bias(map.get("logit_bias"))?,
        logprobs,
        stop: parse_stop(map.get("stop"))?,
        stream: flag(map, "stream")?,
        stream_usage: map
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .is_some_and(|v| v == &Value::Bool(true)),
    })
}

/// The messages: each an object with a known `role` and text `content`.
fn parse_messages(v: &Value) -> Result<Vec<Message>, ApiError> {
    let Some(items) = v.as_array().filter(|a| !a.is_empty()) else {
        return Err(ApiError::invalid(
            "messages",
            "messages must be a non-empty array of messages".into(),
        ));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let at = |field: &str| format!("messages[{i}].{field}");
            let role = m.get("role").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid(&at("role"), format!("{} must be a string", at("role")))
            })?;
            let role = match role {
                "system" | "developer" => "system",
                "user" | "assistant" => role,
                other => {
                    return Err(ApiError::invalid(
                        &at("role"),
                        format!(
                            "{} is {other:?}; this server takes system, developer, user and \
                             assistant messages",
                            at("role")
                        ),
                    ))
                }
            };
            for refused in ["tool_calls", "function_call", "audio"] {
                if m.get(refused).is_some_and(|v| !v.is_null()) {
                    return Err(ApiError::invalid(
                        &at(refused),
                        format!("{} is not supported by this server", at(refused)),
                    ));
                }
            }
            let content = parse_content(m.get("content"), &at("content"))?;
            Ok(Message {
                role: role.to_string(),
                content,
            })
        })
        .collect()
}

/// A message's content: a string, or content parts of type text (joined by newlines).
fn parse_content(v: Option<&Value>, at: &str) -> Result<String, ApiError> {
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let texts = parts
                .iter()
                .enumerate()
                .map(|(j, p)| {
                    let kind = p.get("type").and_then(Value::as_str);
                    let text = p.get("text").and_then(Value::as_str);
                    match (kind, text) {
                        (Some("text"), Some(t)) => Ok(t),
                        (Some("text"), None) => Err(ApiError::invalid(
                            &format!("{at}[{j}].text"),
                            format!("{at}[{j}].text must be a string"),
                        )),
                        (kind, _) => Err(ApiError::invalid(
                            &format!("{at}[{j}].type"),
                            format!(
                                "{at}[{j}].type is {kind:?}; this server takes text parts only"
                            ),
                        )),
                    }
                })
                .collect::<Result<Vec<&str>, ApiError>>()?;
            Ok(texts.join("\n"))
        }
        _ => Err(ApiError::invalid(
            at,
            format!("{at} must be a string or an array of text parts"),
        )),
    }
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

/// A boolean field (false when absent).
fn flag(map: &Map<String, Value>, name: &str) -> Result<bool, ApiError> {
    match map.get(name) {
        None => Ok(false),
        Some(v) => v
            .as_bool()
            .ok_or_else(|| ApiError::invalid(name, format!("{name} must be true or false"))),
    }
}

/// A count of most likely tokens to report, 0 to [`MAX_TOP_LOGPROBS`].
fn top_count(v: &Value, name: &str) -> Result<usize, ApiError> {
    let k = whole(v, name)?;
    if k > MAX_TOP_LOGPROBS as u64 {
        return Err(ApiError::invalid(
            name,
            format!("{name} ({k}) must be at most {MAX_TOP_LOGPROBS}"),
        ));
    }
    Ok(k as usize)
}

/// `temperature` (0, or anything that rounds to 0 as an f32, is greedy; default 1, as OpenAI),
/// `top_p` (0, 1] as an f32, `top_k` (0: off) and `seed`.
fn parse_sampling(map: &Map<String, Value>, seed: u64) -> Result<Sampling, ApiError> {
    let temperature = map
        .get("temperature")
        .map(|v| number(v, "temperature"))
        .transpose()?
        .unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid(
            "temperature",
            format!("temperature ({temperature}) must be in [0, 2]"),
        ));
    }
    let top_p = map
        .get("top_p")
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
    let top_k = map
        .get("top_k")
        .map(|v| whole(v, "top_k"))
        .transpose()?
        .unwrap_or(0);
    let seed = match map.get("seed") {
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

/// `presence_penalty` and `frequency_penalty` in [-2, 2] (OpenAI's range), and
/// `repetition_penalty` > 0.
fn parse_penalties(map: &Map<String, Value>) -> Result<Penalties, ApiError> {
    let mut p = Penalties::NONE;
    for (name, slot) in [
        ("presence_penalty", &mut p.presence_penalty),
        ("frequency_penalty", &mut p.frequency_penalty),
    ] {
        if let Some(v) = map.get(name) {
            let x = number(v, name)?;
            if !(-2.0..=2.0).contains(&x) {
                return Err(ApiError::invalid(
                    name,
                    format!("{name} ({x}) must be in [-2, 2]"),
                ));
            }
            *slot = x as f32;
        }
    }
    if let Some(v) = map.get("repetition_penalty") {
        let x = number(v, "repetition_penalty")?;
        if !(x as f32 > 0.0 && (x as f32).is_finite()) {
            return Err(ApiError::invalid(
                "repetition_penalty",
                format!("repetition_penalty ({x}) must be above 0 (a finite f32)"),
            ));
        }
        p.repetition_penalty = x as f32;
    }
    Ok(p)
}

/// `logit_bias`: an object from token ids (as strings) to biases in [-100, 100].
fn parse_logit_bias(v: Option<&Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(v) = v else {
        return Ok(Vec::new());
    };
    let bad = |why: String| ApiError::invalid("logit_bias", why);
    let map = v
        .as_object()
        .ok_or_else(|| bad("logit_bias must be an object from token ids to biases".into()))?;
    map.iter()
        .map(|(k, b)| {
            let token = k
                .parse::<u32>()
                .map_err(|_| bad(format!("logit_bias key {k:?} is not a token id")))?;
            let bias = b
                .as_f64()
                .filter(|x| (-100.0..=100.0).contains(x))
                .ok_or_else(|| bad(format!("logit_bias[{k:?}] must be in [-100, 100], got {b}")))?;
            Ok((token, bias as f32))
        })
        .collect()
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
