//! The completion endpoints, `/v1/completions` and `/v1/chat/completions`: a body read (a
//! chat's messages rendered by the checkpoint's chat template), its `n` choices queued, and
//! the reply, whole or streamed as server-sent events in each endpoint's chunk format.

use std::convert::Infallible;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use stablegraph::serving::openai::{
    parse_chat, parse_completion, ApiError, Choice, Generation, Prompt, ReplyHead, TokenLogprob,
    Usage,
};
use stablegraph::serving::{FinishReason, Request, RequestId, StepLogprobs, SubmitError};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::engine::{Command, Update};
use super::http::{error_response, json_response, read_body, App};
use super::output::Output;
use super::Shared;

/// `POST /v1/completions`.
pub(crate) async fn completions(
    State(app): State<App>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(app, headers, body, false).await
}

/// `POST /v1/chat/completions`.
pub(crate) async fn chat(State(app): State<App>, headers: HeaderMap, body: Body) -> Response {
    answer(app, headers, body, true).await
}

async fn answer(app: App, headers: HeaderMap, body: Body, chat: bool) -> Response {
    let arrived = Instant::now();
    match admit(app, &headers, body, chat, arrived).await {
        Ok(run) if run.stream => stream(run),
        Ok(run) => whole(run).await,
        Err(e) => error_response(&e),
    }
}

/// A request as read: its prompt's tokens, what it asks for, and the text to echo.
struct Asked {
    prompt: Vec<u32>,
    generation: Generation,
    echo: Option<String>,
}

/// Reads a body of either endpoint into its prompt's tokens.
fn read(app: &Shared, bytes: &[u8], chat: bool) -> Result<Asked, ApiError> {
    let no_text = "this model has no tokenizer: send the prompt as an array of token ids to \
                   /v1/completions";
    if chat {
        let c = parse_chat(bytes, &app.model_id, app.next())?;
        let template = app.template.as_ref().ok_or_else(|| {
            let why = "this model has no chat template (no chat_template in its \
                       tokenizer_config.json and no chat_template.jinja); use /v1/completions";
            ApiError::invalid("messages", why.into())
        })?;
        if !app.codec.is_text() {
            return Err(ApiError::invalid("messages", no_text.into()));
        }
        let text = template
            .render(&c.messages, c.add_generation_prompt)
            .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
        let prompt = app
            .codec
            .encode_plain(&text)
            .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
        return Ok(Asked {
            prompt,
            generation: c.generation,
            echo: None,
        });
    }
    let c = parse_completion(bytes, &app.model_id, app.next())?;
    let prompt = match &c.prompt {
        Prompt::Ids(ids) => ids.clone(),
        // The scheduler refuses an empty prompt, naming it.
        Prompt::Text(t) if t.is_empty() => Vec::new(),
        Prompt::Text(_) if !app.codec.is_text() => {
            return Err(ApiError::invalid("prompt", no_text.into()))
        }
        Prompt::Text(t) => app
            .codec
            .encode(t)
            .map_err(|e| ApiError::invalid("prompt", e.to_string()))?,
    };
    let echo = c.echo.then(|| match &c.prompt {
        Prompt::Text(t) => t.clone(),
        Prompt::Ids(ids) => app.codec.decode(ids).ok().flatten().unwrap_or_default(),
    });
    Ok(Asked {
        prompt,
        generation: c.generation,
        echo,
    })
}

/// Reads, checks and queues a request.
async fn admit(
    app: App,
    headers: &HeaderMap,
    body: Body,
    chat: bool,
    arrived: Instant,
) -> Result<Run, ApiError> {
    let refuse = |outcome: &'static str, e: ApiError| {
        app.metrics.request(outcome);
        e
    };
    if app.draining() {
        let e = ApiError::status(503, "server_error", "the server is shutting down".into());
        return Err(refuse("shutting_down", e));
    }
    let bytes = read_body(&app, headers, body)
        .await
        .map_err(|e| refuse("invalid", e))?;
    let asked = read(&app, &bytes, chat).map_err(|e| refuse("invalid", e))?;
    let g = asked.generation;
    // Without max_tokens (chat): what the context leaves, within the server's limit.
    let room = app.context.saturating_sub(asked.prompt.len()).max(1);
    let request = Request {
        max_tokens: g.max_tokens.unwrap_or(room.min(app.max_tokens)),
        prompt: asked.prompt,
        sampling: g.sampling,
        penalties: g.penalties,
        logit_bias: g.logit_bias,
        logprobs: g.logprobs.is_some(),
    };
    let prompt_len = request.prompt.len();
    let (tx, mut rx) = unbounded_channel();
    let gone = || ApiError::status(503, "server_error", "the engine has stopped".into());
    let submit = Command::Submit {
        request,
        n: g.n,
        arrived,
        updates: tx,
    };
    app.commands
        .send(submit)
        .map_err(|_| refuse("failed", gone()))?;
    let ids = match rx.recv().await {
        Some(Update::Accepted(ids)) => ids,
        Some(Update::Refused(SubmitError::QueueFull)) => {
            let e = ApiError::status(429, "rate_limit_error", SubmitError::QueueFull.to_string());
            return Err(refuse("queue_full", e));
        }
        Some(Update::Refused(SubmitError::Invalid { field, message })) => {
            return Err(refuse("invalid", ApiError::invalid(field, message)));
        }
        _ => return Err(refuse("failed", gone())),
    };
    let head = ReplyHead {
        id: format!("{}-{}", if chat { "chatcmpl" } else { "cmpl" }, app.next()),
        created: super::unix_now(),
        model: app.model_id.clone(),
        chat,
    };
    let n = ids.len();
    let outs = (0..n)
        .map(|_| Output::new(g.stop.clone(), app.stop_ids.clone()))
        .collect();
    Ok(Run {
        app,
        ids,
        rx,
        outs,
        head,
        prompt_len,
        cached: 0,
        finished: vec![None; n],
        logprobs: g.logprobs.map(|k| (k, vec![Vec::new(); n])),
        echo: asked.echo,
        stream: g.stream,
        stream_usage: g.stream_usage,
    })
}

/// A request being answered.
struct Run {
    app: App,
    /// Each choice's id.
    ids: Vec<RequestId>,
    rx: UnboundedReceiver<Update>,
    /// Each choice's text.
    outs: Vec<Output>,
    head: ReplyHead,
    prompt_len: usize,
    /// The prompt tokens taken from the prefix cache.
    cached: usize,
    /// Each choice's finish reason, once it has one.
    finished: Vec<Option<&'static str>>,
    /// With `logprobs`: how many most likely tokens to report, and each choice's tokens'
    /// log-probabilities so far.
    logprobs: Option<(usize, Vec<Vec<TokenLogprob>>)>,
    /// The text each choice starts with (`echo`).
    echo: Option<String>,
    stream: bool,
    stream_usage: bool,
}

/// One step of a request: a choice's new text with its tokens (and how many log-probabilities
/// they brought), or its end (its last text, finish reason, and tokens with their count of
/// log-probabilities).
enum Step {
    Text(usize, String, Vec<u32>, usize),
    End(usize, String, &'static str, Vec<u32>, usize),
    Failed(String),
}

impl Run {
    /// Waits for a choice's next tokens or its end.
    async fn next(&mut self) -> Step {
        loop {
            let codec = &self.app.codec;
            let (c, step) = match self.rx.recv().await {
                Some(Update::Started(c, cached)) => {
                    if c == 0 {
                        self.cached = cached;
                    }
                    continue;
                }
                Some(Update::Tokens(c, t, lps)) if c < self.outs.len() => {
                    if self.finished[c].is_some() {
                        continue;
                    }
                    let before = self.outs[c].ids().len();
                    let pushed = self.outs[c].push(codec, &t);
                    let kept = self.outs[c].ids().len() - before;
                    let added = self.keep_logprobs(c, &lps[..lps.len().min(kept)]);
                    match pushed {
                        Ok(text) if self.outs[c].stopped() => {
                            let _ = self.app.commands.send(Command::Cancel(self.ids[c]));
                            let ids = self.outs[c].ids();
                            let kept = ids[ids.len() - kept..].to_vec();
                            (c, Step::End(c, text, "stop", kept, added))
                        }
                        Ok(text) => (c, Step::Text(c, text, t, added)),
                        Err(e) => return Step::Failed(e.to_string()),
                    }
                }
                Some(Update::Finished(c, reason)) if c < self.outs.len() => {
                    let reason = match reason {
                        FinishReason::Length => "length",
                        FinishReason::Eos => "stop",
                    };
                    let text = self.outs[c].finish(codec).unwrap_or_default();
                    (c, Step::End(c, text, reason, Vec::new(), 0))
                }
                Some(Update::Failed(e)) => return Step::Failed(e),
                None => return Step::Failed("the engine stopped".into()),
                Some(_) => continue,
            };
            // A choice ended at a stop sequence ignores what was already on its way.
            if self.finished[c].is_some() {
                continue;
            }
            if let Step::End(_, _, reason, ..) = &step {
                self.finished[c] = Some(reason);
                if self.done() {
                    let stopped = self.finished.contains(&Some("stop"));
                    let outcome = if stopped { "stopped" } else { "completed" };
                    self.app.metrics.request(outcome);
                }
            }
            return step;
        }
    }

    /// Keeps choice `c`'s tokens' log-probabilities (with their texts, the most likely
    /// tokens cut to the count asked for); returns how many.
    fn keep_logprobs(&mut self, c: usize, lps: &[StepLogprobs]) -> usize {
        let Some((k, kept)) = self.logprobs.as_mut() else {
            return 0;
        };
        let codec = &self.app.codec;
        let ids = self.outs[c].ids();
        let offset = ids.len() - lps.len();
        for (j, lp) in lps.iter().enumerate() {
            kept[c].push(TokenLogprob {
                text: token_text(codec, ids[offset + j]),
                logprob: lp.logprob,
                top: lp.top[..(*k).min(lp.top.len())]
                    .iter()
                    .map(|&(t, l)| (token_text(codec, t), l))
                    .collect(),
            });
        }
        lps.len()
    }

    /// Choice `c`'s last `back` log-probabilities (all of them for `usize::MAX`), when asked
    /// for.
    fn logprobs_of(&self, c: usize, back: usize) -> Option<&[TokenLogprob]> {
        let (_, kept) = self.logprobs.as_ref()?;
        let all = &kept[c];
        Some(&all[all.len().saturating_sub(back)..])
    }

    /// Every choice has ended.
    fn done(&self) -> bool {
        self.finished.iter().all(Option::is_some)
    }

    fn usage(&self) -> Usage {
        Usage {
            prompt: self.prompt_len,
            completion: self.outs.iter().map(|o| o.ids().len()).sum(),
            cached: self.cached,
        }
    }
}

fn failed(e: String) -> ApiError {
    ApiError::status(500, "server_error", format!("generation failed: {e}"))
}

async fn whole(mut run: Run) -> Response {
    let echo = run.echo.clone().unwrap_or_default();
    let mut texts = vec![echo; run.ids.len()];
    while !run.done() {
        match run.next().await {
            Step::Text(c, t, ..) | Step::End(c, t, ..) => texts[c].push_str(&t),
            Step::Failed(e) => return error_response(&failed(e)),
        }
    }
    let offset = run.echo.as_ref().map_or(0, String::len);
    let choices: Vec<Choice> = (0..texts.len())
        .map(|c| Choice {
            index: c,
            text: &texts[c],
            ids: run.outs[c].ids(),
            finish: run.finished[c],
            logprobs: run.logprobs_of(c, usize::MAX),
            offset,
        })
        .collect();
    json_response(200, &run.head.reply(&choices, run.usage()))
}

fn event(v: &Value) -> String {
    format!("data: {v}\n\n")
}

/// A stream's next events: a choice's chunk, and after the last choice's end the usage chunk
/// (when asked for) and `[DONE]`.
async fn next_events(run: &mut Run, sent: &mut [bool]) -> (String, bool) {
    let (c, text, ids, finish, added) = match run.next().await {
        Step::Text(c, t, ids, added) => (c, t, ids, None, added),
        Step::End(c, t, reason, ids, added) => (c, t, ids, Some(reason), added),
        Step::Failed(e) => return (event(&failed(e).body()) + "data: [DONE]\n\n", true),
    };
    let first = !sent[c];
    sent[c] = true;
    let text = match (&run.echo, first) {
        (Some(echo), true) => format!("{echo}{text}"),
        _ => text,
    };
    let choice = Choice {
        index: c,
        text: &text,
        ids: &ids,
        finish,
        logprobs: run.logprobs_of(c, added),
        offset: 0,
    };
    let mut s = event(&run.head.chunk(&choice, first));
    if !run.done() {
        return (s, false);
    }
    if run.stream_usage {
        s.push_str(&event(&run.head.usage_chunk(run.usage())));
    }
    (s + "data: [DONE]\n\n", true)
}

/// Streams the reply as server-sent events in the endpoint's chunk format, ending with
/// `[DONE]`.
fn stream(run: Run) -> Response {
    let sent = vec![false; run.ids.len()];
    let events = futures_util::stream::unfold(Some((run, sent)), |state| async move {
        let (mut run, mut sent) = state?;
        let (s, last) = next_events(&mut run, &mut sent).await;
        let next = (!last).then_some((run, sent));
        Some((Ok::<_, Infallible>(s), next))
    });
    let mut r = Body::from_stream(events).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// A token's text for log-probabilities: as the codec decodes it alone, or `token_id:N`
/// without one (vLLM's spelling).
fn token_text(codec: &crate::text::Codec, token: u32) -> String {
    match codec.decode(&[token]) {
        Ok(Some(text)) => text,
        _ => format!("token_id:{token}"),
    }
}
