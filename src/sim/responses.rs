//! The simulator's `/v1/responses` (OpenAI's Responses API), streamed as
//! its typed SSE events or not: the same words as its chat answers (the
//! replica's id first), and the ids of the responses it made, so that a
//! follow-up naming one it did not make is answered 404 as vLLM answers
//! it (a gateway that sends a follow-up to the wrong replica shows).

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{Sim, SimConfig, error, sse, words};
use crate::sync::lock;

/// Response ids kept; past it the set starts over (a simulator need not
/// remember forever).
const KEPT: usize = 100_000;

/// The ids of the responses a sim made.
#[derive(Default)]
pub(super) struct Stored(Mutex<HashSet<String>>);

impl Stored {
    fn add(&self, id: &str) {
        let mut ids = lock(&self.0);
        if ids.len() >= KEPT {
            ids.clear();
        }
        ids.insert(id.to_string());
    }

    fn has(&self, id: &str) -> bool {
        lock(&self.0).contains(id)
    }
}

/// The words of a Responses API `input`: a string, or items whose
/// `content` is a string or parts with `text`.
fn input_words(input: &Value) -> u64 {
    let count = |text: &str| text.split_whitespace().count() as u64;
    match input {
        Value::String(text) => count(text),
        Value::Array(items) => items
            .iter()
            .map(|item| match &item["content"] {
                Value::String(text) => count(text),
                Value::Array(parts) => parts
                    .iter()
                    .map(|p| count(p["text"].as_str().unwrap_or_default()))
                    .sum(),
                _ => 0,
            })
            .sum(),
        _ => 0,
    }
}

pub(super) async fn responses(State(sim): State<Sim>, body: Bytes) -> Response {
    sim.stats.requests.fetch_add(1, Ordering::Relaxed);
    let config = sim.config();
    let Ok(Value::Object(request)) = serde_json::from_slice::<Value>(&body) else {
        return error(StatusCode::BAD_REQUEST, "the body must be a JSON object");
    };
    if config.failure_rate > 0.0 && fastrand::f64() < config.failure_rate {
        sim.stats.failures.fetch_add(1, Ordering::Relaxed);
        let status = StatusCode::from_u16(config.failure_status)
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return error(status, "simulated failure");
    }
    let previous = request.get("previous_response_id").and_then(Value::as_str);
    if let Some(previous) = previous.filter(|id| !sim.responses.has(id)) {
        return error(
            StatusCode::NOT_FOUND,
            &format!("Response with id '{previous}' not found."),
        );
    }
    let answer = ResponseDraft {
        id: format!("resp_sim_{}", uuid::Uuid::new_v4().simple()),
        message_id: format!("msg_sim_{}", uuid::Uuid::new_v4().simple()),
        created: chrono::Utc::now().timestamp(),
        model: request
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or(&config.model)
            .to_string(),
        previous: previous.map(str::to_string),
        input_tokens: input_words(request.get("input").unwrap_or(&Value::Null)),
        words: words(&config),
    };
    if request.get("store").and_then(Value::as_bool) != Some(false) {
        sim.responses.add(&answer.id);
    }
    let ttft = Duration::from_millis(config.ttft_ms);
    if request.get("stream").and_then(Value::as_bool) == Some(true) {
        return stream(config, answer, ttft);
    }
    tokio::time::sleep(Duration::from_millis(config.latency_ms) + ttft).await;
    Json(answer.response("completed", true)).into_response()
}

/// One response being made.
struct ResponseDraft {
    id: String,
    message_id: String,
    created: i64,
    model: String,
    previous: Option<String>,
    input_tokens: u64,
    words: Vec<String>,
}

impl ResponseDraft {
    fn text(&self) -> String {
        self.words.concat()
    }

    fn message(&self, status: &str, text: Option<&str>) -> Value {
        let content = match text {
            Some(text) => json!([self.part(text)]),
            None => json!([]),
        };
        json!({"type": "message", "id": self.message_id, "status": status,
               "role": "assistant", "content": content})
    }

    fn part(&self, text: &str) -> Value {
        json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
    }

    /// The response object, in progress (no output yet) or whole.
    fn response(&self, status: &str, whole: bool) -> Value {
        let output = if whole {
            json!([self.message("completed", Some(&self.text()))])
        } else {
            json!([])
        };
        let usage = whole.then(|| {
            let output_tokens = self.words.len() as u64;
            json!({"input_tokens": self.input_tokens,
                   "input_tokens_details": {"cached_tokens": 0},
                   "output_tokens": output_tokens,
                   "output_tokens_details": {"reasoning_tokens": 0},
                   "total_tokens": self.input_tokens + output_tokens})
        });
        json!({"id": self.id, "object": "response", "created_at": self.created,
               "status": status, "model": self.model, "output": output,
               "previous_response_id": self.previous, "parallel_tool_calls": true,
               "tool_choice": "auto", "tools": [], "error": null,
               "incomplete_details": null, "metadata": {}, "usage": usage})
    }
}

/// The events of a streamed response, as OpenAI sends them: created, in
/// progress, the message and its text part added, a delta per word, the
/// text, part and message done, completed.
fn stream(config: SimConfig, answer: ResponseDraft, ttft: Duration) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(16);
    tokio::spawn(async move {
        let mut sequence = 0u64;
        let mut event = |kind: &str, mut data: Value| {
            data["type"] = json!(kind);
            data["sequence_number"] = json!(sequence);
            sequence += 1;
            Ok(Bytes::from(format!("event: {kind}\ndata: {data}\n\n")))
        };
        let item = |mut data: Value| {
            data["output_index"] = json!(0);
            data
        };
        let text = answer.text();
        let at = json!({"item_id": answer.message_id, "output_index": 0, "content_index": 0});
        let with = |mut data: Value, key: &str, value: Value| {
            data[key] = value;
            data
        };
        let start = [
            event(
                "response.created",
                json!({"response": answer.response("in_progress", false)}),
            ),
            event(
                "response.in_progress",
                json!({"response": answer.response("in_progress", false)}),
            ),
            event(
                "response.output_item.added",
                item(json!({"item": answer.message("in_progress", None)})),
            ),
            event(
                "response.content_part.added",
                with(at.clone(), "part", answer.part("")),
            ),
        ];
        tokio::time::sleep(ttft).await;
        for frame in start {
            if tx.send(frame).await.is_err() {
                return;
            }
        }
        let pause =
            (config.tokens_per_s > 0.0).then(|| Duration::from_secs_f64(1.0 / config.tokens_per_s));
        for (i, word) in answer.words.iter().enumerate() {
            if let (Some(pause), true) = (pause, i > 0) {
                tokio::time::sleep(pause).await;
            }
            let delta = with(
                with(at.clone(), "delta", json!(word)),
                "logprobs",
                json!([]),
            );
            if tx
                .send(event("response.output_text.delta", delta))
                .await
                .is_err()
            {
                return;
            }
        }
        let end = [
            event(
                "response.output_text.done",
                with(with(at.clone(), "text", json!(text)), "logprobs", json!([])),
            ),
            event(
                "response.content_part.done",
                with(at.clone(), "part", answer.part(&text)),
            ),
            event(
                "response.output_item.done",
                item(json!({"item": answer.message("completed", Some(&text))})),
            ),
            event(
                "response.completed",
                json!({"response": answer.response("completed", true)}),
            ),
        ];
        for frame in end {
            if tx.send(frame).await.is_err() {
                return;
            }
        }
    });
    sse(rx)
}
