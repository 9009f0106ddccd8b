//! Turns a stream of events into a response: NDJSON by default, Server-Sent
//! Events when the client sends `Accept: text/event-stream`.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;

use crate::protocol::Event;

pub fn wants_sse(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"))
}

pub fn events_response(
    headers: &HeaderMap,
    events: impl Stream<Item = Arc<Event>> + Send + 'static,
) -> Response {
    if wants_sse(headers) {
        let stream = events.map(|event| {
            let data = serde_json::to_string(&*event).unwrap_or_default();
            Ok::<_, Infallible>(
                SseEvent::default()
                    .event(event.kind.type_name())
                    .id(event.seq.to_string())
                    .data(data),
            )
        });
        return Sse::new(stream)
            .keep_alive(KeepAlive::default())
            .into_response();
    }
    let stream = events.map(|event| {
        let mut line = serde_json::to_vec(&*event).unwrap_or_default();
        line.push(b'\n');
        Ok::<_, Infallible>(Bytes::from(line))
    });
    let mut response = Body::from_stream(stream).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Reverse proxies must not buffer a live stream.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// Cancels a turn when dropped before its `result` passed: the client of an
/// ephemeral run went away, so the run stops.
struct CancelOnDrop(Option<CancellationToken>);

impl CancelOnDrop {
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(token) = self.0.take() {
            token.cancel();
        }
    }
}

/// The turn's events; dropping the stream before the end cancels the turn.
pub fn cancel_on_hangup(
    events: impl Stream<Item = Arc<Event>> + Send + 'static,
    cancel: CancellationToken,
) -> impl Stream<Item = Arc<Event>> + Send + 'static {
    let mut guard = CancelOnDrop(Some(cancel));
    events.map(move |event| {
        if event.ends_turn() {
            guard.disarm();
        }
        event
    })
}
