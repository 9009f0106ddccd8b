//! The span of each request that may start work (any method but `GET`,
//! `HEAD` and `OPTIONS`): the root of the trace of the turn it starts, or
//! a child of the client's own trace when it sends a `traceparent`.
//! Reads (polls, event streams, probes) make no trace.

use crate::telemetry::{otel, spans};
use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;

pub async fn run(request: Request, next: Next) -> Response {
    if !otel::exporting()
        || matches!(
            *request.method(),
            Method::GET | Method::HEAD | Method::OPTIONS
        )
    {
        return next.run(request).await;
    }
    let route = match request.extensions().get::<MatchedPath>() {
        Some(path) => path.as_str().to_owned(),
        None => request.uri().path().to_owned(),
    };
    let span = spans::request(request.method().as_str(), &route, request.headers());
    let response = span.within(next.run(request)).await;
    let status = response.status().as_u16();
    span.set("http.response.status_code", i64::from(status));
    if status >= 500 {
        span.fail(&status.to_string());
    }
    response
}
