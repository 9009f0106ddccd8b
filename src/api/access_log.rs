//! One INFO line per request: its id, method, path, status and the time to
//! its response head (a stream's body goes on after that; its session's
//! turn has a line of its own). tower-http's request-id layers, outside this
//! one, take the client's `x-request-id` or make one and send it back.

use std::time::Instant;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;

/// Paths polled by monitors log at DEBUG so they do not drown the rest.
fn is_probe(path: &str) -> bool {
    matches!(path, "/health" | "/ready" | "/metrics")
}

pub async fn log(request: Request, next: Next) -> Response {
    // Nothing to build for a line no one keeps (`RUST_LOG=warn`).
    if !tracing::enabled!(tracing::Level::INFO) {
        return next.run(request).await;
    }
    let started = Instant::now();
    let id = request
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_string();
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    let status = response.status().as_u16();
    let ms = format!("{:.1}", started.elapsed().as_secs_f64() * 1000.0);
    if is_probe(&path) {
        tracing::debug!(request = %id, %method, %path, status, %ms, "request");
    } else {
        tracing::info!(request = %id, %method, %path, status, %ms, "request");
    }
    response
}
