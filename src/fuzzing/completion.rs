//! The `completion_request` target: OpenAI completion and chat completion bodies as a server
//! reads them ([`parse_completion`], [`parse_chat`]), on raw bytes and on nearly valid bodies.

use super::Bytes;
use crate::sampling::Sampling;
use crate::serving::openai::{parse_chat, parse_completion, ApiError, Generation, Prompt};

/// The fields a completion body holds, and some it should ignore.
const KEYS: &[&str] = &[
    "model",
    "prompt",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "echo",
    "logprobs",
    "user",
    "suffix",
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "tools",
    "tool_choice",
    "response_format",
    "best_of",
    "add_generation_prompt",
];

/// JSON values the fields hold or that readers trip on.
const VALUES: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "16",
    "0.5",
    "1.0",
    "2.5",
    "1e308",
    "-1e308",
    "1e-320",
    "4294967295",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "9.9e999",
    "true",
    "false",
    "null",
    "\"\"",
    "\"x\"",
    "\"m\"",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "[]",
    "[1, 2]",
    "[\"a\"]",
    "[\"a\", \"b\"]",
    "[\"\"]",
    "[1, -1]",
    "[4294967296]",
    "[\"a\", \"b\", \"c\", \"d\", \"e\"]",
    "{}",
    "{\"include_usage\": true}",
    "{\"include_usage\": 1}",
    "[{\"role\": \"user\", \"content\": \"hi\"}]",
    "[{\"role\": \"tool\", \"content\": \"hi\"}]",
    "[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}]}]",
    "[{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]",
    "[{\"role\": \"user\"}]",
    "[{\"content\": \"x\"}]",
    "[{}]",
    "{\"5\": 100}",
    "{\"x\": 1}",
    "{\"1\": 101}",
    "{\"type\": \"text\"}",
    "\"none\"",
];

/// [`parse_completion`] never panics; a body it accepts has settings a scheduler takes (finite
/// positive temperature, top-p in (0, 1], at most four non-empty stop sequences), and a refusal
/// is a 4xx with a message.
pub fn completion_request(data: &[u8]) {
    let mut b = Bytes::new(data);
    let body = if b.u8() & 1 == 0 {
        b.rest().to_vec()
    } else {
        body_text(&mut b).into_bytes()
    };
    match parse_completion(&body, "m", 7) {
        Ok(c) => {
            check_generation(&c.generation);
            assert!(c.generation.max_tokens.is_some());
            if let Prompt::Ids(ids) = &c.prompt {
                assert!(ids.iter().all(|&t| u64::from(t) <= u64::from(u32::MAX)));
            }
        }
        Err(e) => check_refusal(&e),
    }
    match parse_chat(&body, "m", 7) {
        Ok(c) => {
            check_generation(&c.generation);
            assert!(!c.messages.is_empty());
            let roles = ["system", "user", "assistant"];
            assert!(c.messages.iter().all(|m| roles.contains(&m.role.as_str())));
        }
        Err(e) => check_refusal(&e),
    }
}

/// Settings a scheduler takes: finite positive temperature, top-p in (0, 1], at most four
/// non-empty stop sequences, at least one choice, biases and penalties in range.
fn check_generation(g: &Generation) {
    if let Sampling::Sample {
        temperature, top_p, ..
    } = g.sampling
    {
        assert!(
            temperature > 0.0 && temperature.is_finite(),
            "temperature {temperature}"
        );
        assert!(top_p > 0.0 && top_p <= 1.0, "top_p {top_p}");
    }
    assert!(g.stop.len() <= 4 && g.stop.iter().all(|s| !s.is_empty()));
    assert!(g.n >= 1);
    assert!(g.logit_bias.iter().all(|(_, b)| b.abs() <= 100.0));
    assert!(g.logprobs.is_none_or(|k| k <= 20));
    let p = g.penalties;
    assert!(p.presence_penalty.abs() <= 2.0 && p.frequency_penalty.abs() <= 2.0);
    assert!(p.repetition_penalty > 0.0 && p.repetition_penalty.is_finite());
}

/// A refusal is a 4xx with a message and a JSON body.
fn check_refusal(e: &ApiError) {
    assert!((400..500).contains(&e.status), "status {}", e.status);
    assert!(!e.message.is_empty());
    let _ = e.body().to_string();
}

/// A JSON object of keys and values `b` picks.
fn body_text(b: &mut Bytes<'_>) -> String {
    let mut fields = Vec::new();
    if !b.one_in(8) {
        fields.push("\"prompt\": \"hello\"".to_string());
    }
    if !b.one_in(4) {
        fields.push("\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]".to_string());
    }
    while !b.is_empty() && fields.len() < 20 {
        let key = b.pick(KEYS);
        let value = if b.one_in(4) {
            format!("{}", b.u64() >> b.below(64))
        } else {
            b.pick(VALUES).to_string()
        };
        fields.push(format!("\"{key}\": {value}"));
    }
    format!("{{{}}}", fields.join(", "))
}
