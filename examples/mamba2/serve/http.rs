//! The HTTP side: routes, the API-key check, the completions handler (whole or streamed as
//! server-sent events), and shutdown on SIGTERM or Ctrl-C.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use axum::body::{Body, Bytes};
use axum::extract::{Request as HttpRequest, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use stablegraph::serving::openai::{
    parse_completion, ApiError, Completion, Prompt, ReplyHead, Usage,
};
use stablegraph::serving::{FinishReason, Request, RequestId, SubmitError};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::engine::{Command, Update};
use super::output::Output;
use super::Shared;

type App = Arc<Shared>;

/// Serves until SIGTERM or Ctrl-C, then stops admitting and waits for the requests in flight.
pub(crate) async fn listen(app: App, addr: SocketAddr) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    let bound = listener.local_addr()?;
    let guarded = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(app.clone(), authorize));
    let router = Router::new()
        .route("/health", get(health))
        .merge(guarded)
        .fallback(not_found)
        .with_state(app.clone());
    println!("listening on http://{bound}");
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let draining = app.clone();
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            stop_signal().await;
            draining.draining.store(true, Ordering::SeqCst);
            eprintln!(
                "{}: serve: stopping; finishing the requests in flight",
                crate::speaker()
            );
        })
        .await
        .context("serving")
}

async fn stop_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

fn json_response(status: u16, body: &Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = (status, body.to_string()).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn error_response(e: &ApiError) -> Response {
    let mut r = json_response(e.status, &e.body());
    if matches!(e.status, 429 | 503) {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

/// Whether two byte strings are equal, in time that depends on their lengths only.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn authorize(State(app): State<App>, req: HttpRequest, next: Next) -> Response {
    if let Some(key) = &app.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|g| same_secret(g.as_bytes(), key.as_bytes())) {
            app.metrics.request("unauthorized");
            let e = ApiError::status(
                401,
                "authentication_error",
                "a valid API key is required: Authorization: Bearer KEY".into(),
            );
            return error_response(&e);
        }
    }
    next.run(req).await
}

async fn health(State(app): State<App>) -> Response {
    if app.draining() {
        return json_response(503, &json!({"status": "stopping"}));
    }
    json_response(200, &json!({"status": "ok"}))
}

async fn models(State(app): State<App>) -> Response {
    json_response(
        200,
        &json!({"object": "list", "data": [{
            "id": app.model_id,
            "object": "model",
            "created": app.started,
            "owned_by": "stablegraph",
        }]}),
    )
}

async fn metrics(State(app): State<App>) -> Response {
    let mut r = app.metrics.render().into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    r
}

async fn not_found() -> Response {
    error_response(&ApiError::status(
        404,
        "invalid_request_error",
        "no such endpoint; see /v1/completions, /v1/models, /health, /metrics".into(),
    ))
}

/// The body, refused (413) when its declared or actual length passes the limit.
async fn read_body(app: &Shared, headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    let too_big = || {
        ApiError::status(
            413,
            "invalid_request_error",
            format!("the request body is larger than {} bytes", app.max_body),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > app.max_body as u64) {
        return Err(too_big());
    }
    axum::body::to_bytes(body, app.max_body)
        .await
        .map_err(|_| too_big())
}

async fn completions(State(app): State<App>, headers: HeaderMap, body: Body) -> Response {
    let arrived = Instant::now();
    match admit(&app, &headers, body, arrived).await {
        Ok((c, id, prompt_len, rx)) => {
            let head = ReplyHead {
                id: format!("cmpl-{}", app.next()),
                created: super::unix_now(),
                model: app.model_id.clone(),
            };
            let run = Run {
                app,
                id,
                rx,
                out: Output::new(c.stop.clone()),
                head,
                prompt_len,
            };
            if c.stream {
                stream(run, c.stream_usage)
            } else {
                whole(run).await
            }
        }
        Err(e) => error_response(&e),
    }
}

/// Reads, checks and queues a request; returns it with its id, prompt length and updates.
async fn admit(
    app: &App,
    headers: &HeaderMap,
    body: Body,
    arrived: Instant,
) -> Result<(Completion, RequestId, usize, UnboundedReceiver<Update>), ApiError> {
    let refuse = |outcome: &'static str, e: ApiError| {
        app.metrics.request(outcome);
        e
    };
    if app.draining() {
        let e = ApiError::status(503, "server_error", "the server is shutting down".into());
        return Err(refuse("shutting_down", e));
    }
    let bytes = read_body(app, headers, body)
        .await
        .map_err(|e| refuse("invalid", e))?;
    let c =
        parse_completion(&bytes, &app.model_id, app.next()).map_err(|e| refuse("invalid", e))?;
    let prompt = match &c.prompt {
        Prompt::Ids(ids) => ids.clone(),
        // The scheduler refuses an empty prompt, naming it.
        Prompt::Text(t) if t.is_empty() => Vec::new(),
        Prompt::Text(_) if !app.codec.is_text() => {
            let why = "this model has no tokenizer: send the prompt as an array of token ids";
            return Err(refuse("invalid", ApiError::invalid("prompt", why.into())));
        }
        Prompt::Text(t) => app
            .codec
            .encode(t)
            .map_err(|e| refuse("invalid", ApiError::invalid("prompt", e.to_string())))?,
    };
    let request = Request {
        prompt,
        max_tokens: c.max_tokens,
        sampling: c.sampling,
    };
    let prompt_len = request.prompt.len();
    let (tx, mut rx) = unbounded_channel();
    let gone = || ApiError::status(503, "server_error", "the engine has stopped".into());
    let submit = Command::Submit {
        request,
        arrived,
        updates: tx,
    };
    app.commands
        .send(submit)
        .map_err(|_| refuse("failed", gone()))?;
    match rx.recv().await {
        Some(Update::Accepted(id)) => Ok((c, id, prompt_len, rx)),
        Some(Update::Refused(SubmitError::QueueFull)) => {
            let e = ApiError::status(429, "rate_limit_error", SubmitError::QueueFull.to_string());
            Err(refuse("queue_full", e))
        }
        Some(Update::Refused(SubmitError::Invalid(why))) => Err(refuse(
            "invalid",
            ApiError::status(400, "invalid_request_error", why),
        )),
        _ => Err(refuse("failed", gone())),
    }
}

/// A request being answered.
struct Run {
    app: App,
    id: RequestId,
    rx: UnboundedReceiver<Update>,
    out: Output,
    head: ReplyHead,
    prompt_len: usize,
}

/// One step of a request: new text with its tokens, or the end.
enum Step {
    Text(String, Vec<u32>),
    /// The last text and the finish reason.
    End(String, &'static str),
    Failed(String),
}

impl Run {
    /// Waits for the next tokens or the end.
    async fn next(&mut self) -> Step {
        let codec = &self.app.codec;
        match self.rx.recv().await {
            Some(Update::Tokens(t)) => match self.out.push(codec, &t) {
                Ok(text) if self.out.stopped() => {
                    let _ = self.app.commands.send(Command::Cancel(self.id));
                    self.finish("stop");
                    Step::End(text, "stop")
                }
                Ok(text) => Step::Text(text, t),
                Err(e) => Step::Failed(e.to_string()),
            },
            Some(Update::Finished(reason)) => {
                let reason = match reason {
                    FinishReason::Length => "length",
                    FinishReason::Eos => "stop",
                };
                let text = self.out.finish(codec).unwrap_or_default();
                self.finish(reason);
                Step::End(text, reason)
            }
            Some(Update::Failed(e)) => Step::Failed(e),
            _ => Step::Failed("the engine stopped".into()),
        }
    }

    fn finish(&self, reason: &str) {
        let outcome = if reason == "length" {
            "completed"
        } else {
            "stopped"
        };
        self.app.metrics.request(outcome);
    }

    fn usage(&self) -> Usage {
        Usage {
            prompt: self.prompt_len,
            completion: self.out.ids().len(),
        }
    }
}

fn failed(e: String) -> ApiError {
    ApiError::status(500, "server_error", format!("generation failed: {e}"))
}

async fn whole(mut run: Run) -> Response {
    let mut text = String::new();
    loop {
        match run.next().await {
            Step::Text(t, _) => text.push_str(&t),
            Step::End(t, reason) => {
                text.push_str(&t);
                let reply = run.head.reply(&text, run.out.ids(), reason, run.usage());
                return json_response(200, &reply);
            }
            Step::Failed(e) => return error_response(&failed(e)),
        }
    }
}

fn event(v: &Value) -> String {
    format!("data: {v}\n\n")
}

/// Streams the reply as server-sent events in OpenAI's chunk format, ending with `[DONE]`.
fn stream(run: Run, usage: bool) -> Response {
    let events = futures_util::stream::unfold(Some(run), move |run| async move {
        let mut run = run?;
        let piece = match run.next().await {
            Step::Text(t, ids) => {
                return Some((
                    Ok::<_, Infallible>(event(&run.head.chunk(&t, &ids, None))),
                    Some(run),
                ))
            }
            Step::End(t, reason) => {
                let mut s = event(&run.head.chunk(&t, &[], Some(reason)));
                if usage {
                    s.push_str(&event(&run.head.usage_chunk(run.usage())));
                }
                s
            }
            Step::Failed(e) => event(&failed(e).body()),
        };
        Some((Ok(piece + "data: [DONE]\n\n"), None))
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
