//! `serve`'s chat completions and the OpenAI fields clients send, on the shipped byte model
//! and its chat template (`role: content` lines, then `assistant:`): replies whole and
//! streamed equal offline `generate` of the rendered conversation; `n` greedy choices are the
//! greedy tokens, seeded ones differ and repeat; `echo`; a prefix served from the cache gives the
//! same tokens and reports `cached_tokens`; every refusal names its field; a model without a
//! template is refused by name.

use serde_json::{json, Value};

use crate::serve::{offline, shipped_model, Server};

fn text_of(ids: &[u32]) -> String {
    String::from_utf8_lossy(&ids.iter().map(|&t| t as u8).collect::<Vec<_>>()).into_owned()
}

fn choice_ids(v: &Value, c: usize) -> Vec<u32> {
    v["choices"][c]["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn chat_replies_equal_generate_of_the_rendered_conversation() {
    let server = Server::start(&[]);
    let messages = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "fn main"}, {"type": "text", "text": "() {"}]},
    ]);
    // The template, written out by hand: a line per message, then the assistant's turn.
    let rendered = "system: Be brief.\nuser: fn main\n() {\nassistant:";
    let want = offline(&shipped_model(), rendered.as_bytes(), 24);
    let body = json!({"messages": messages, "max_tokens": 24, "temperature": 0});
    let whole = server.chat(&body).unwrap();
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(choice_ids(&whole, 0), want);
    let message = &whole["choices"][0]["message"];
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["content"], json!(text_of(&want)));
    assert_eq!(whole["usage"]["prompt_tokens"], json!(rendered.len()));
    // max_completion_tokens takes max_tokens' place.
    let newer = json!({"messages": messages, "max_completion_tokens": 24, "temperature": 0});
    assert_eq!(choice_ids(&server.chat(&newer).unwrap(), 0), want);
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let events = server.stream_from("/v1/chat/completions", &streamed);
    assert!(events
        .iter()
        .all(|e| e["object"] == "chat.completion.chunk"));
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, text_of(&want));
    let usage = &events.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], json!(24));
    assert!(events[events.len() - 2]["choices"][0]["finish_reason"] == "length");
}

#[test]
fn n_choices_echo_and_the_prefix_cache() {
    let server = Server::start(&["--prompt-piece", "16"]);
    let model = shipped_model();
    let prompt = "impl Scheduler {\n    pub fn step(&mut self) -> Result<()> {\n";
    let want = offline(&model, prompt.as_bytes(), 12);
    let greedy = json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "n": 3});
    let reply = server.post(&greedy).unwrap();
    assert_eq!(reply["choices"].as_array().unwrap().len(), 3);
    for c in 0..3 {
        assert_eq!(choice_ids(&reply, c), want, "choice {c}");
        assert_eq!(reply["choices"][c]["index"], json!(c));
    }
    assert_eq!(reply["usage"]["completion_tokens"], json!(36));
    // The same prompt again: its whole 16-token pieces come from the cache.
    let again = server.post(&greedy).unwrap();
    assert_eq!(choice_ids(&again, 0), want);
    let whole_pieces = prompt.len() / 16 * 16;
    let cached = &again["usage"]["prompt_tokens_details"]["cached_tokens"];
    assert_eq!(cached, &json!(whole_pieces));
    // Seeded choices differ from each other and repeat exactly.
    let sampled =
        json!({"prompt": prompt, "max_tokens": 12, "temperature": 1.0, "seed": 9, "n": 4});
    let a = server.post(&sampled).unwrap();
    let b = server.post(&sampled).unwrap();
    let choices = |v: &Value| (0..4).map(|c| choice_ids(v, c)).collect::<Vec<_>>();
    assert_eq!(choices(&a), choices(&b));
    let a = choices(&a);
    assert!(
        a.iter()
            .enumerate()
            .all(|(i, x)| a[i + 1..].iter().all(|y| y != x)),
        "{a:?}"
    );
    // Streamed choices arrive by index; echo puts the prompt first.
    let mut streamed = greedy.clone();
    streamed["stream"] = json!(true);
    streamed["echo"] = json!(true);
    let events = server.stream_from("/v1/completions", &streamed);
    for c in 0..3 {
        let text: String = events
            .iter()
            .filter(|e| e["choices"][0]["index"] == json!(c))
            .map(|e| e["choices"][0]["text"].as_str().unwrap())
            .collect();
        assert_eq!(text, format!("{prompt}{}", text_of(&want)), "choice {c}");
    }
    let mut echoed = greedy;
    echoed["echo"] = json!(true);
    echoed["n"] = json!(1);
    let reply = server.post(&echoed).unwrap();
    let text = format!("{prompt}{}", text_of(&want));
    assert_eq!(reply["choices"][0]["text"], json!(text));
    let metrics = server.get("/metrics", None).unwrap();
    // Six requests: the first missed, the other five hit.
    for line in [
        "stablegraph_prefix_cache_hits_total 5",
        "stablegraph_prefix_cache_misses_total 1",
    ] {
        assert!(metrics.contains(line), "{metrics}");
    }
}

#[test]
fn log_probabilities_in_both_formats() {
    let server = Server::start(&[]);
    let user = json!([{"role": "user", "content": "fn main() {"}]);
    let body = json!({"messages": user, "max_tokens": 6, "temperature": 0, "logprobs": true, "top_logprobs": 3});
    let reply = server.chat(&body).unwrap();
    let content = reply["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    let ids = choice_ids(&reply, 0);
    assert_eq!(content.len(), ids.len());
    for (entry, &id) in content.iter().zip(&ids) {
        assert_eq!(entry["token"], json!(text_of(&[id])));
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely; the list runs most likely first.
        assert_eq!(top[0]["logprob"], entry["logprob"]);
        let values: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(
            values.windows(2).all(|w| w[0] >= w[1]) && values[0] <= 0.0,
            "{values:?}"
        );
    }
    // Streamed chunks carry their tokens' log-probabilities.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = server.stream_from("/v1/chat/completions", &streamed);
    let streamed: Vec<Value> = events
        .iter()
        .filter_map(|e| e["choices"][0]["logprobs"]["content"].as_array())
        .flatten()
        .cloned()
        .collect();
    assert_eq!(&streamed, content);
    // Completions: tokens, token_logprobs, top_logprobs and text_offset.
    let prompt = "fn main() {";
    let body =
        json!({"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 2, "echo": true});
    let reply = server.post(&body).unwrap();
    let lp = &reply["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 6);
    let values = lp["token_logprobs"].as_array().unwrap();
    for (k, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert!(top.len() <= 2 && top.contains_key(tokens[k].as_str().unwrap()));
        assert!(values[k].as_f64().unwrap() <= 0.0);
    }
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(offsets[0], prompt.len() as u64, "after the echoed prompt");
}

#[test]
fn chat_refusals_name_the_field() {
    let server = Server::start(&[]);
    let user = json!([{"role": "user", "content": "hi"}]);
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({}), "messages", "messages is required"),
        (json!({"messages": []}), "messages", "non-empty array"),
        (json!({"messages": "hi"}), "messages", "non-empty array"),
        (
            json!({"messages": [{"role": "tool", "content": "x"}]}),
            "messages[0].role",
            "\"tool\"",
        ),
        (
            json!({"messages": [{"content": "x"}]}),
            "messages[0].role",
            "must be a string",
        ),
        (
            json!({"messages": [{"role": "user"}]}),
            "messages[0].content",
            "must be a string or an array",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages[0].content[0].type",
            "text parts only",
        ),
        (
            json!({"messages": user, "tools": [{"type": "function"}]}),
            "tools",
            "tools is not supported",
        ),
        (
            json!({"messages": user, "response_format": {"type": "json_object"}}),
            "response_format",
            "not supported",
        ),
        (json!({"messages": user, "n": 9}), "n", "n (9)"),
        (
            json!({"messages": user, "top_logprobs": 30, "logprobs": true}),
            "top_logprobs",
            "at most 20",
        ),
        (
            json!({"messages": user, "max_completion_tokens": 5000}),
            "max_tokens",
            "max_tokens (5000)",
        ),
    ];
    for (body, param, want) in cases {
        let (code, err) = server.chat(&body).expect_err(&body.to_string());
        assert_eq!(code, 400, "{body}: {err}");
        assert_eq!(err["error"]["param"], json!(param), "{body}: {err}");
        let message = err["error"]["message"].as_str().unwrap();
        assert!(message.contains(want), "{body}: {message:?} lacks {want:?}");
    }
    // A field outside OpenAI's API is ignored; a known one that does not change the output too.
    let fine = json!({"messages": user, "max_tokens": 2, "user": "u", "store": false, "x": 1});
    assert!(server.chat(&fine).is_ok());
}

#[test]
fn a_model_without_a_chat_template_is_refused_by_name() {
    let server = Server::start(&["--model", "tests/fixtures/mamba1/falcon", "--slots", "2"]);
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let (code, err) = server.chat(&body).unwrap_err();
    assert_eq!(code, 400);
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains("no chat template"), "{message}");
}
