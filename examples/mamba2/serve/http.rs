//! The HTTP side: routes, the API-key check, bodies and errors, and shutdown on SIGTERM or
//! Ctrl-C (the completion endpoints' handlers are [`super::answer`]).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::body::{Body, Bytes};
use axum::extract::{Request as HttpRequest, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use stablegraph::serving::openai::ApiError;

use super::answer;
use super::Shared;

pub(crate) type App = Arc<Shared>;

/// Serves until SIGTERM or Ctrl-C, then stops admitting and waits for the requests in flight.
pub(crate) async fn listen(app: App, addr: SocketAddr) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    let bound = listener.local_addr()?;
    let guarded = Router::new()
        .route("/v1/completions", post(answer::completions))
        .route("/v1/chat/completions", post(answer::chat))
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

pub(crate) fn json_response(status: u16, body: &Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = (status, body.to_string()).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

pub(crate) fn error_response(e: &ApiError) -> Response {
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
        "no such endpoint; see /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics".into(),
    ))
}

/// The body, refused (413) when its declared or actual length passes the limit.
pub(crate) async fn read_body(
    app: &Shared,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, ApiError> {
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
