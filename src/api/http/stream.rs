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
    let items = events.map(|event| {
        let json = Bytes::from(serde_json::to_vec(&*event).unwrap_or_default());
        (event.kind.type_name(), Some(event.seq), json)
    });
    json_stream(headers, items)
}

/// JSON objects `(type, id, json)` as NDJSON, or as SSE with the type as
/// the event name and the id as its id when the client asks for it. The
/// NDJSON lines ready together go out in one chunk.
pub fn json_stream(
    headers: &HeaderMap,
    items: impl Stream<Item = (&'static str, Option<u64>, Bytes)> + Send + 'static,
) -> Response {
    if wants_sse(headers) {
        let events = items.map(|(kind, id, json)| {
            let event = SseEvent::default()
                .event(kind)
                .data(String::from_utf8_lossy(&json));
            Ok::<_, Infallible>(match id {
                Some(id) => event.id(id.to_string()),
                None => event,
            })
        });
        return Sse::new(events)
            .keep_alive(KeepAlive::default())
            .into_response();
    }
    let lines = items.ready_chunks(64).map(|ready| {
        let size = ready.iter().map(|(_, _, json)| json.len() + 1).sum();
        let mut chunk = Vec::with_capacity(size);
        for (_, _, json) in ready {
            chunk.extend_from_slice(&json);
            chunk.push(b'\n');
        }
        Ok::<_, Infallible>(Bytes::from(chunk))
    });
    let mut response = Body::from_stream(lines).into_response();
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
