//! The `completion_request` target: OpenAI completion bodies as a server reads them
//! ([`parse_completion`]), on raw bytes and on nearly valid bodies.

use super::Bytes;
use crate::sampling::Sampling;
use crate::serving::openai::{parse_completion, Prompt};

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
            if let Sampling::Sample {
                temperature, top_p, ..
            } = c.sampling
            {
                assert!(
                    temperature > 0.0 && temperature.is_finite(),
                    "temperature {temperature}"
                );
                assert!(top_p > 0.0 && top_p <= 1.0, "top_p {top_p}");
            }
            assert!(c.stop.len() <= 4 && c.stop.iter().all(|s| !s.is_empty()));
            if let Prompt::Ids(ids) = &c.prompt {
                assert!(ids.iter().all(|&t| u64::from(t) <= u64::from(u32::MAX)));
            }
        }
        Err(e) => {
            assert!((400..500).contains(&e.status), "status {}", e.status);
            assert!(!e.message.is_empty());
            let _ = e.body().to_string();
        }
    }
}

/// A JSON object of keys and values `b` picks.
fn body_text(b: &mut Bytes<'_>) -> String {
    let mut fields = Vec::new();
    if !b.one_in(8) {
        fields.push("\"prompt\": \"hello\"".to_string());
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
