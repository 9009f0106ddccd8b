//! A scripted model server on `127.0.0.1:0`: it answers each request with
//! the next scripted reply and records every request it got. A `GET` (the
//! server asking for a listing or for a model's window) is answered `404`,
//! unrecorded, unless the next reply is scripted for one ([`Reply::for_get`]).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use serde_json::{Value, json};

/// One scripted answer.
pub struct Reply {
    status: StatusCode,
    headers: Vec<(&'static str, String)>,
    /// Sent as separate body frames, so SSE events arrive in pieces.
    pieces: Vec<String>,
    /// The answer to a `GET` (a listing), not to a model call.
    for_get: bool,
}

impl Reply {
    /// A 200 SSE response with one event per item of `events`, each
    /// already in wire form (see [`data`] and [`event`]).
    pub fn sse(events: Vec<String>) -> Reply {
        Reply {
            status: StatusCode::OK,
            headers: vec![("content-type", "text/event-stream".into())],
            pieces: events,
            for_get: false,
        }
    }

    pub fn status(status: u16, body: &str) -> Reply {
        Reply {
            status: StatusCode::from_u16(status).expect("a valid status"),
            headers: vec![("content-type", "application/json".into())],
            pieces: vec![body.to_string()],
            for_get: false,
        }
    }

    /// This reply answers the next `GET` rather than a model call (for
    /// the suites that script listings; the providers suite does not).
    #[allow(dead_code)]
    pub fn for_get(mut self) -> Reply {
        self.for_get = true;
        self
    }

    pub fn header(mut self, name: &'static str, value: &str) -> Reply {
        self.headers.push((name, value.to_string()));
        self
    }
}

/// An SSE event carrying `payload` as its data.
pub fn data(payload: &Value) -> String {
    format!("data: {payload}\n\n")
}

/// A named SSE event, as the Anthropic API sends them.
pub fn event(name: &str, payload: &Value) -> String {
    format!("event: {name}\ndata: {payload}\n\n")
}

/// A request as the upstream saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Value,
}

#[derive(Default)]
struct Script {
    replies: Mutex<VecDeque<Reply>>,
    recorded: Mutex<Vec<Recorded>>,
}

pub struct Upstream {
    /// `http://127.0.0.1:{port}`.
    pub url: String,
    script: Arc<Script>,
}

impl Upstream {
    pub async fn start(replies: Vec<Reply>) -> Upstream {
        let script = Arc::new(Script {
            replies: Mutex::new(replies.into()),
            recorded: Mutex::default(),
        });
        let app = Router::new().fallback(answer).with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("local addr"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Upstream { url, script }
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.script.recorded.lock().unwrap().clone()
    }
}

async fn answer(
    State(script): State<Arc<Script>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let scripted_get = {
        let replies = script.replies.lock().unwrap();
        replies.front().is_some_and(|reply| reply.for_get)
    };
    if method == Method::GET && !scripted_get {
        return Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Body::from("not scripted"))
            .unwrap();
    }
    script.recorded.lock().unwrap().push(Recorded {
        path: uri.path().to_string(),
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    });
    let Some(reply) = script.replies.lock().unwrap().pop_front() else {
        return Response::builder()
            .status(StatusCode::INTERNAL_SERVER_ERROR)
            .body(Body::from("no reply scripted"))
            .unwrap();
    };
    let mut response = Response::builder().status(reply.status);
    for (name, value) in reply.headers {
        response = response.header(name, value);
    }
    let frames = reply.pieces.into_iter().map(Ok::<_, Infallible>);
    response
        .body(Body::from_stream(futures::stream::iter(frames)))
        .unwrap()
}

// OpenAI-compatible chat completion chunks.

pub fn delta(delta: Value) -> String {
    data(&json!({
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "small-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": null}]
    }))
}

pub fn content(text: &str) -> String {
    delta(json!({"content": text}))
}

pub fn finish(reason: &str) -> String {
    data(&json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}))
}

pub fn chunk_usage(prompt_tokens: u64, completion_tokens: u64) -> String {
    data(&json!({
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens
        }
    }))
}

pub fn end() -> String {
    "data: [DONE]\n\n".into()
}

/// A streamed reply that calls tool `name` once with `arguments` (for the
/// suites that include this module; the providers suite does not call it).
#[allow(dead_code)]
pub fn tool_call(id: &str, name: &str, arguments: Value) -> Reply {
    let arguments = arguments.to_string();
    Reply::sse(vec![
        delta(
            json!({"tool_calls": [{"index": 0, "id": id, "type": "function",
                                      "function": {"name": name, "arguments": arguments}}]}),
        ),
        finish("tool_calls"),
        chunk_usage(10, 5),
        end(),
    ])
}

/// A streamed reply of `text` alone.
#[allow(dead_code)]
pub fn says(text: &str) -> Reply {
    Reply::sse(vec![
        content(text),
        finish("stop"),
        chunk_usage(10, 5),
        end(),
    ])
}
