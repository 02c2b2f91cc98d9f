//! Reading one streamed reply: each server-sent event's tokens and choice, and what the whole
//! stream amounts to. A reply is completed only when it ends with `[DONE]` and no error came
//! before; its tokens are then the server's `usage.completion_tokens` when it reported them,
//! else those of its token-bearing chunks. Anything else is aborted, with the first error.

use serde_json::Value;

/// What one line of a stream carried.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Chunk {
    /// The choice it belongs to (`choices[0].index`).
    pub(super) choice: usize,
    /// Its tokens; 0 for a role, finish, usage or error event.
    pub(super) tokens: usize,
}

/// How one request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Outcome {
    /// `[DONE]` and no error: the tokens it carried.
    Completed(usize),
    /// An HTTP error status, an error event, a broken connection or no `[DONE]`: the first
    /// error.
    Aborted(String),
    /// Dropped by the client on purpose (`--disconnect-frac`).
    Disconnected,
}

/// A stream read so far.
#[derive(Debug, Default)]
pub(super) struct Stream {
    /// Tokens over the token-bearing chunks of every choice.
    pub(super) counted: usize,
    /// Token-bearing chunks so far.
    pub(super) chunks: usize,
    /// `usage.completion_tokens`, when the server reported it.
    pub(super) usage: Option<usize>,
    /// `usage.prompt_tokens_details.cached_tokens`, when the server reported it.
    pub(super) cached: Option<usize>,
    /// `[DONE]` arrived.
    pub(super) done: bool,
    /// The first error.
    pub(super) error: Option<String>,
    /// Within an `event: error` event: its data is the error.
    in_error_event: bool,
}

/// The value of SSE field `name` on `line` (one space after the colon dropped).
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let rest = line.strip_prefix(name)?.strip_prefix(':')?;
    Some(rest.strip_prefix(' ').unwrap_or(rest))
}

/// An error's message: `message` (or `error.message`) of a JSON error, else the text itself.
pub(super) fn message_of(text: &str) -> String {
    let Ok(v) = serde_json::from_str::<Value>(text) else {
        return text.trim().to_string();
    };
    let e = if v["error"].is_null() {
        &v
    } else {
        &v["error"]
    };
    match e["message"].as_str().or(e.as_str()) {
        Some(m) => m.to_string(),
        None => e.to_string(),
    }
}

/// The tokens a chunk's choice carries: its `token_ids` (our server lists them), else one for
/// a chunk with text and no finish reason (llama-server sends a token a chunk, its text
/// possibly empty: part of a character); a chat chunk's text is `delta.content`.
fn tokens_in(choice: &Value) -> usize {
    if let Some(ids) = choice["token_ids"].as_array() {
        if !ids.is_empty() || !choice["finish_reason"].is_null() {
            return ids.len();
        }
    }
    let text = match choice.get("delta") {
        Some(delta) => &delta["content"],
        None => &choice["text"],
    };
    usize::from(text.is_string() && choice["finish_reason"].is_null())
}

impl Stream {
    /// Reads one line of the stream; returns what it carried.
    pub(super) fn line(&mut self, line: &str) -> Chunk {
        let line = line.trim_end_matches('\r');
        if line.is_empty() {
            self.in_error_event = false;
            return Chunk::default();
        }
        if let Some(kind) = field(line, "event") {
            self.in_error_event = kind.trim() == "error";
            return Chunk::default();
        }
        // llama-server sends a failure as an `error: {...}` line.
        if let Some(e) = field(line, "error") {
            self.fail(message_of(e));
            return Chunk::default();
        }
        let Some(data) = field(line, "data") else {
            return Chunk::default();
        };
        if self.in_error_event {
            self.fail(message_of(data));
            return Chunk::default();
        }
        if data.trim() == "[DONE]" {
            self.done = true;
            return Chunk::default();
        }
        match serde_json::from_str::<Value>(data) {
            Ok(v) => self.event(&v),
            Err(_) => {
                self.fail(format!("an event that is not JSON: {data:.80}"));
                Chunk::default()
            }
        }
    }

    /// Reads one data event's JSON.
    fn event(&mut self, v: &Value) -> Chunk {
        if !v["error"].is_null() {
            self.fail(message_of(&v.to_string()));
            return Chunk::default();
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            self.usage = Some(n as usize);
        }
        if let Some(n) = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() {
            self.cached = Some(n as usize);
        }
        let choice = &v["choices"][0];
        let chunk = Chunk {
            choice: choice["index"].as_u64().unwrap_or(0) as usize,
            tokens: tokens_in(choice),
        };
        if chunk.tokens > 0 {
            self.chunks += 1;
            self.counted += chunk.tokens;
        }
        chunk
    }

    /// Notes an error (the first one is kept).
    pub(super) fn fail(&mut self, message: String) {
        self.error.get_or_insert(message);
    }

    /// Whether nothing more is to be read: `[DONE]`, or an error.
    pub(super) fn over(&self) -> bool {
        self.done || self.error.is_some()
    }

    /// What the stream amounts to, read to its end.
    pub(super) fn outcome(&self) -> Outcome {
        match (&self.error, self.done) {
            (Some(e), _) => Outcome::Aborted(e.clone()),
            (None, false) => Outcome::Aborted("the stream ended without [DONE]".into()),
            (None, true) => Outcome::Completed(self.usage.unwrap_or(self.counted)),
        }
    }
}

/// First-token and inter-token times of one request: the first token of any choice is its
/// TTFT; each later chunk of a choice spreads the gap since that choice's last chunk over its
/// tokens.
#[derive(Debug, Default)]
pub(super) struct Clock {
    /// When the request was sent (seconds).
    sent: f64,
    /// Seconds from sending to the first token.
    pub(super) ttft: Option<f64>,
    /// Each choice's last chunk time, by index.
    last: Vec<(usize, f64)>,
    /// Each token's share of the gap before its chunk.
    pub(super) itl: Vec<f64>,
}

impl Clock {
    pub(super) fn new(sent: f64) -> Clock {
        Clock {
            sent,
            ..Clock::default()
        }
    }

    /// Notes `chunk`, read at `now` (seconds).
    pub(super) fn tick(&mut self, chunk: Chunk, now: f64) {
        if chunk.tokens == 0 {
            return;
        }
        self.ttft.get_or_insert(now - self.sent);
        let n = chunk.tokens;
        match self.last.iter_mut().find(|(c, _)| *c == chunk.choice) {
            Some((_, last)) => {
                let gap = (now - *last) / n as f64;
                self.itl.extend(std::iter::repeat_n(gap, n));
                *last = now;
            }
            None => self.last.push((chunk.choice, now)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads `text` as a whole stream: the stream and its chunks.
    fn read(text: &str) -> (Stream, Vec<Chunk>) {
        let mut s = Stream::default();
        let chunks = text.lines().map(|l| s.line(l)).collect();
        (s, chunks)
    }

    /// One of our server's completion chunks: choice `c`, `ids`, finish reason.
    fn ours(c: usize, ids: &[u32], finish: Option<&str>) -> String {
        let v = serde_json::json!({"object": "text_completion", "choices": [{
            "index": c, "text": "x".repeat(ids.len()), "token_ids": ids,
            "logprobs": null, "finish_reason": finish}]});
        format!("data: {v}\n\n")
    }

    const USAGE: &str = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\
        \"completion_tokens\":5,\"total_tokens\":14,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n";

    #[test]
    fn a_complete_stream_counts_its_usage_and_its_chunks() {
        let text = ours(0, &[1, 2], None)
            + &ours(0, &[3, 4, 5], None)
            + &ours(0, &[], Some("length"))
            + USAGE
            + "data: [DONE]\n\n";
        let (s, chunks) = read(&text);
        assert_eq!(
            (s.counted, s.chunks, s.usage, s.cached),
            (5, 2, Some(5), Some(8))
        );
        assert_eq!(s.outcome(), Outcome::Completed(5));
        let tokens: Vec<usize> = chunks.iter().map(|c| c.tokens).filter(|&t| t > 0).collect();
        assert_eq!(tokens, [2, 3]);
    }

    #[test]
    fn usage_is_preferred_to_the_chunks_and_chunks_count_without_it() {
        // llama-server: a chunk a token (one with empty text), usage in the last chunk.
        let tok = |t: &str| {
            format!("data: {{\"choices\":[{{\"index\":0,\"text\":\"{t}\",\"finish_reason\":null}}]}}\n\n")
        };
        let last = "data: {\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}],\
                    \"usage\":{\"completion_tokens\":4},\"timings\":{}}\n\n";
        let body = tok("a") + &tok("") + &tok("b");
        let (s, _) = read(&(body.clone() + last + "data: [DONE]\n\n"));
        assert_eq!((s.counted, s.cached), (3, None));
        assert_eq!(s.outcome(), Outcome::Completed(4));
        let (s, _) = read(&(body + "data: [DONE]\n\n"));
        assert_eq!(s.outcome(), Outcome::Completed(3));
    }

    #[test]
    fn a_stream_without_done_is_aborted() {
        let (s, _) = read(&(ours(0, &[1, 2, 3], None) + USAGE));
        assert_eq!(s.usage, Some(5));
        assert_eq!(
            s.outcome(),
            Outcome::Aborted("the stream ended without [DONE]".into())
        );
    }

    #[test]
    fn an_error_event_aborts_the_stream_whatever_follows() {
        // Ours: an error object in a data event, then [DONE].
        let ours_err = ours(0, &[1], None)
            + "data: {\"error\":{\"message\":\"generation failed: boom\",\"type\":\"server_error\"}}\n\n"
            + "data: [DONE]\n\n";
        let (s, _) = read(&ours_err);
        assert!(s.over());
        assert_eq!(
            s.outcome(),
            Outcome::Aborted("generation failed: boom".into())
        );
        // llama-server: an `error:` line.
        let llama = ours(0, &[1, 2], None)
            + "error: {\"code\":500,\"message\":\"Invalid diff\",\"type\":\"server_error\"}\n\n";
        assert_eq!(
            read(&llama).0.outcome(),
            Outcome::Aborted("Invalid diff".into())
        );
        // A named SSE error event.
        let named = "event: error\ndata: {\"message\":\"overloaded\"}\n\ndata: [DONE]\n\n";
        assert_eq!(
            read(named).0.outcome(),
            Outcome::Aborted("overloaded".into())
        );
    }

    #[test]
    fn choices_are_counted_together_and_timed_apart() {
        let text = ours(0, &[1, 2], None)
            + &ours(1, &[7], None)
            + &ours(1, &[8, 9], None)
            + &ours(0, &[3], None)
            + &ours(0, &[], Some("length"))
            + &ours(1, &[], Some("length"))
            + "data: [DONE]\n\n";
        let (s, chunks) = read(&text);
        assert_eq!(s.outcome(), Outcome::Completed(6));
        let mut clock = Clock::new(1.0);
        for (i, c) in chunks.iter().filter(|c| c.tokens > 0).enumerate() {
            clock.tick(*c, 2.0 + i as f64);
        }
        // Choice 0 at 2 and 5 (one token: 3 s); choice 1 at 3 and 4 (two tokens: 0.5 s each).
        assert_eq!(clock.ttft, Some(1.0));
        assert_eq!(clock.itl, [0.5, 0.5, 3.0]);
    }

    #[test]
    fn chat_chunks_count_their_content() {
        let role = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null},\"finish_reason\":null}]}";
        let word = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}";
        let end = "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}";
        let text = [role, word, word, end, "data: [DONE]"].join("\n\n");
        let (s, _) = read(&text);
        assert_eq!(s.outcome(), Outcome::Completed(2));
    }
}
