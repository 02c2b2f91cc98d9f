//! Replies: a whole completion or chat completion with its choices and `usage`, the chunks
//! of a streamed one, and log-probabilities in each endpoint's format.

use serde_json::{json, Map, Value};

/// What every reply and chunk of one request shares.
#[derive(Debug, Clone)]
pub struct ReplyHead {
    /// The completion's id (`cmpl-...` or `chatcmpl-...`).
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The model's id.
    pub model: String,
    /// A chat completion (else a text completion).
    pub chat: bool,
}

/// Token counts for `usage`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt: usize,
    /// Generated tokens, over every choice.
    pub completion: usize,
    /// Prompt tokens whose state came from the prefix cache.
    pub cached: usize,
}

impl Usage {
    fn json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        })
    }
}

/// One token's log-probability and the most likely tokens at its position, each with its
/// text.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token's text.
    pub text: String,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely tokens' texts and log-probabilities, most likely first.
    pub top: Vec<(String, f32)>,
}

/// A choice, whole or the part of it a chunk carries.
#[derive(Debug, Clone, Default)]
pub struct Choice<'a> {
    /// Its index among the request's choices.
    pub index: usize,
    /// Its text.
    pub text: &'a str,
    /// Its tokens (`token_ids`, an extension some servers have: a client of a model without a
    /// tokenizer reads the tokens there).
    pub ids: &'a [u32],
    /// Why it ended, on its last chunk or in a whole reply.
    pub finish: Option<&'a str>,
    /// Its tokens' log-probabilities, when asked for.
    pub logprobs: Option<&'a [TokenLogprob]>,
    /// The text's offset in the completion (for a completion's `text_offset`).
    pub offset: usize,
}

impl ReplyHead {
    fn object(&self, kind: &str, choices: Value, usage: Option<Usage>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u.json();
        }
        v
    }

    fn logprobs(&self, c: &Choice) -> Value {
        let Some(lps) = c.logprobs else {
            return Value::Null;
        };
        if self.chat {
            let entry = |text: &str, lp: f32| json!({"token": text, "logprob": lp, "bytes": text.as_bytes()});
            let content: Vec<Value> = lps
                .iter()
                .map(|t| {
                    let mut e = entry(&t.text, t.logprob);
                    e["top_logprobs"] = t.top.iter().map(|(s, lp)| entry(s, *lp)).collect();
                    e
                })
                .collect();
            return json!({"content": content});
        }
        let mut offset = c.offset;
        let offsets: Vec<usize> = lps
            .iter()
            .map(|t| {
                let at = offset;
                offset += t.text.len();
                at
            })
            .collect();
        let top: Vec<Value> = lps
            .iter()
            .map(|t| {
                let m: Map<String, Value> =
                    t.top.iter().map(|(s, lp)| (s.clone(), json!(lp))).collect();
                Value::Object(m)
            })
            .collect();
        json!({
            "tokens": lps.iter().map(|t| t.text.as_str()).collect::<Vec<_>>(),
            "token_logprobs": lps.iter().map(|t| t.logprob).collect::<Vec<_>>(),
            "top_logprobs": top,
            "text_offset": offsets,
        })
    }

    fn choice(&self, c: &Choice, chunk: Option<bool>) -> Value {
        let mut v = json!({
            "index": c.index,
            "logprobs": self.logprobs(c),
            "finish_reason": c.finish,
            "token_ids": c.ids,
        });
        match (self.chat, chunk) {
            (false, _) => v["text"] = json!(c.text),
            (true, None) => v["message"] = json!({"role": "assistant", "content": c.text}),
            (true, Some(first)) => {
                v["delta"] = match first {
                    true => json!({"role": "assistant", "content": c.text}),
                    false => json!({"content": c.text}),
                }
            }
        }
        v
    }

    /// A whole (non-streamed) reply.
    pub fn reply(&self, choices: &[Choice], usage: Usage) -> Value {
        let kind = if self.chat {
            "chat.completion"
        } else {
            "text_completion"
        };
        let choices = choices.iter().map(|c| self.choice(c, None)).collect();
        self.object(kind, choices, Some(usage))
    }

    /// A stream chunk of one choice: new text (and its tokens), and the finish reason on the
    /// last. A chat choice's `first` chunk carries the assistant's role.
    pub fn chunk(&self, choice: &Choice, first: bool) -> Value {
        self.object(
            self.chunk_kind(),
            json!([self.choice(choice, Some(first))]),
            None,
        )
    }

    /// The usage chunk after the last (`stream_options.include_usage`).
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        self.object(self.chunk_kind(), json!([]), Some(usage))
    }

    fn chunk_kind(&self) -> &'static str {
        if self.chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        }
    }
}
