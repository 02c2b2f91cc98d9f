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
    parse_chat, parse_completion, ApiError, Choice, Generation, Prompt, ReplyHead, Usage,
};
use stablegraph::serving::{FinishReason, Request, RequestId, SubmitError};
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

/// Refuses what the slot programs cannot do yet, naming the field.
fn supported(g: &Generation) -> Result<(), ApiError> {
    let refuse = |name: &str| {
        Err(ApiError::invalid(
            name,
            format!("{name} is not supported by this server yet"),
        ))
    };
    let p = g.penalties;
    if p.presence_penalty != 0.0 {
        return refuse("presence_penalty");
    }
    if p.frequency_penalty != 0.0 {
        return refuse("frequency_penalty");
    }
    if p.repetition_penalty != 1.0 {
        return refuse("repetition_penalty");
    }
    if !g.logit_bias.is_empty() {
        return refuse("logit_bias");
    }
    if g.logprobs.is_some() {
        return refuse("logprobs");
    }
    Ok(())
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
    supported(&g).map_err(|e| refuse("invalid", e))?;
    // Without max_tokens (chat): what the context leaves, within the server's limit.
    let room = app.context.saturating_sub(asked.prompt.len()).max(1);
    let request = Request {
        max_tokens: g.max_tokens.unwrap_or(room.min(app.max_tokens)),
        prompt: asked.prompt,
        sampling: g.sampling,
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
        Some(Update::Refused(SubmitError::Invalid(why))) => {
            let param = if why.starts_with("n (") {
                "n"
            } else {
                "prompt"
            };
            let param = if why.starts_with("max_tokens") {
                "max_tokens"
            } else {
                param
            };
            return Err(refuse("invalid", ApiError::invalid(param, why)));
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
    /// The text each choice starts with (`echo`).
    echo: Option<String>,
    stream: bool,
    stream_usage: bool,
}

/// One step of a request: a choice's new text with its tokens, or its end.
enum Step {
    Text(usize, String, Vec<u32>),
    /// The choice's last text and its finish reason.
    End(usize, String, &'static str),
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
                Some(Update::Tokens(c, t)) if c < self.outs.len() => {
                    match self.outs[c].push(codec, &t) {
                        Ok(text) if self.outs[c].stopped() => {
                            let _ = self.app.commands.send(Command::Cancel(self.ids[c]));
                            (c, Step::End(c, text, "stop"))
                        }
                        Ok(text) => (c, Step::Text(c, text, t)),
                        Err(e) => return Step::Failed(e.to_string()),
                    }
                }
                Some(Update::Finished(c, reason)) if c < self.outs.len() => {
                    let reason = match reason {
                        FinishReason::Length => "length",
                        FinishReason::Eos => "stop",
                    };
                    let text = self.outs[c].finish(codec).unwrap_or_default();
                    (c, Step::End(c, text, reason))
                }
                Some(Update::Failed(e)) => return Step::Failed(e),
                None => return Step::Failed("the engine stopped".into()),
                Some(_) => continue,
            };
            // A choice ended at a stop sequence ignores what was already on its way.
            if self.finished[c].is_some() {
                continue;
            }
            if let Step::End(_, _, reason) = &step {
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
            Step::Text(c, t, _) | Step::End(c, t, _) => texts[c].push_str(&t),
            Step::Failed(e) => return error_response(&failed(e)),
        }
    }
    let choices: Vec<Choice> = (0..texts.len())
        .map(|c| Choice {
            index: c,
            text: &texts[c],
            ids: run.outs[c].ids(),
            finish: run.finished[c],
            ..Choice::default()
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
    let (c, text, ids, finish) = match run.next().await {
        Step::Text(c, t, ids) => (c, t, ids, None),
        Step::End(c, t, reason) => (c, t, Vec::new(), Some(reason)),
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
        ..Choice::default()
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
