//! One INFO line per request: its id, method, path, status and the time to
//! its response head (a stream's body goes on after that; its session's
//! turn has a line of its own). The guard (`guard.rs`) has by then taken the
//! client's `x-request-id` or made one, and sends it back.

use std::time::Instant;

use axum::extract::Request;
use axum::http::Method;
use axum::response::Response;

/// Paths polled by monitors log at DEBUG so they do not drown the rest.
fn is_probe(path: &str) -> bool {
    matches!(path, "/health" | "/ready" | "/metrics")
}

/// A request's line, begun before it is handled and written once its
/// response head is ready; none when no one keeps INFO lines
/// (`RUST_LOG=warn`), so that nothing is built for them.
pub struct Line {
    started: Instant,
    id: String,
    method: Method,
    path: String,
}

impl Line {
    pub fn start(request: &Request) -> Option<Line> {
        if !tracing::enabled!(tracing::Level::INFO) {
            return None;
        }
        Some(Line {
            started: Instant::now(),
            id: request
                .headers()
                .get("x-request-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_string(),
            method: request.method().clone(),
            path: request.uri().path().to_string(),
        })
    }

    pub fn finish(self, response: &Response) {
        let Line {
            started,
            id,
            method,
            path,
        } = self;
        let status = response.status().as_u16();
        let ms = format!("{:.1}", started.elapsed().as_secs_f64() * 1000.0);
        if is_probe(&path) {
            tracing::debug!(request = %id, %method, %path, status, %ms, "request");
        } else {
            tracing::info!(request = %id, %method, %path, status, %ms, "request");
        }
    }
}
