//! A scripted OpenAI-compatible upstream that enforces a context window:
//! it counts a request's tokens (its JSON, four bytes a token), answers
//! 400 `context_length_exceeded` past the window as OpenAI does, and
//! reports the window in its `/v1/models` listing as vLLM does
//! (`max_model_len`). Each prompt `step N` has the model run a command
//! that prints 4 KB, then answer `done N`; a compaction's request is
//! answered with a one-line summary. Shared by `tests/long_tasks.rs` and
//! `benches/long_tasks.rs`.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

/// What the upstream saw: each request's body, its token count, and
/// whether it was refused.
pub struct Seen {
    /// The window it enforces, in its tokens.
    pub window: u64,
    pub requests: Mutex<Vec<(Value, u64, bool)>>,
}

/// A request's tokens as this upstream counts them.
pub fn tokens(body: &Value) -> u64 {
    let messages = body["messages"].to_string().len();
    let tools = body.get("tools").map_or(0, |t| t.to_string().len());
    ((messages + tools) / 4) as u64
}

pub fn is_summary(body: &Value) -> bool {
    body["messages"][0]["content"]
        .as_str()
        .is_some_and(|s| s.starts_with("You compact the history"))
}

fn sse(chunks: Vec<Value>, prompt_tokens: u64) -> Response {
    let mut text = String::new();
    for chunk in chunks {
        text.push_str(&format!("data: {chunk}\n\n"));
    }
    let usage = json!({"choices": [], "usage": {"prompt_tokens": prompt_tokens,
        "completion_tokens": 5, "total_tokens": prompt_tokens + 5}});
    text.push_str(&format!("data: {usage}\n\ndata: [DONE]\n\n"));
    ([("content-type", "text/event-stream")], text).into_response()
}

fn says(text: &str, prompt_tokens: u64) -> Response {
    sse(
        vec![
            json!({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]}),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        ],
        prompt_tokens,
    )
}

async fn chat(State(seen): State<Arc<Seen>>, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap();
    let counted = tokens(&body);
    let refused = counted > seen.window;
    seen.requests
        .lock()
        .unwrap()
        .push((body.clone(), counted, refused));
    if refused {
        let error = json!({"error": {"message": format!(
            "This model's maximum context length is {} tokens. However, your messages \
             resulted in {counted} tokens. Please reduce the length of the messages.", seen.window),
            "type": "invalid_request_error", "param": "messages",
            "code": "context_length_exceeded"}});
        return (StatusCode::BAD_REQUEST, axum::Json(error)).into_response();
    }
    if is_summary(&body) {
        let asked = body["messages"].as_array().unwrap().last().unwrap()["content"]
            .as_str()
            .unwrap()
            .to_owned();
        let steps = asked.matches("[user]\nstep").count();
        return says(&format!("SUMMARY: {steps} more steps were run."), counted);
    }
    let messages = body["messages"].as_array().unwrap();
    let last = messages.last().unwrap();
    if last["role"] == "tool" {
        let prompt = messages
            .iter()
            .rev()
            .find_map(|m| {
                let text = m["content"].as_str()?;
                (m["role"] == "user" && text.starts_with("step")).then_some(text)
            })
            .unwrap_or("step ?");
        return says(&prompt.replace("step", "done"), counted);
    }
    let id = format!("call-{}", seen.requests.lock().unwrap().len());
    let command = "python3 -c \"print('x' * 4096)\"";
    let arguments = json!({ "command": command }).to_string();
    sse(
        vec![
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": id,
                "type": "function", "function": {"name": "Bash", "arguments": arguments}}]},
                "finish_reason": null}]}),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        ],
        counted,
    )
}

async fn models(State(seen): State<Arc<Seen>>) -> axum::Json<Value> {
    axum::Json(json!({"object": "list", "data": [
        {"id": "windowed", "object": "model", "max_model_len": seen.window}]}))
}

/// The upstream on `127.0.0.1:0`, enforcing `window`: its URL and what it
/// sees.
pub async fn upstream(window: u64) -> (String, Arc<Seen>) {
    let seen = Arc::new(Seen {
        window,
        requests: Mutex::default(),
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}
