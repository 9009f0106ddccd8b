//! What the approval tests share: a scripted model's replies, a session's
//! turn read as it streams, decisions.

use serde_json::{Value, json};

use crate::common::{Lines, TestServer};
use crate::upstream::{Reply, chunk_usage, content, delta, end, finish};

/// A reply that is one native tool call.
pub fn calls(id: &str, name: &str, arguments: Value) -> Reply {
    Reply::sse(vec![
        delta(
            json!({"tool_calls": [{"index": 0, "id": id, "type": "function",
            "function": {"name": name, "arguments": arguments.to_string()}}]}),
        ),
        finish("tool_calls"),
        chunk_usage(10, 5),
        end(),
    ])
}

pub fn bash(id: &str, command: &str) -> Reply {
    calls(id, "Bash", json!({"command": command}))
}

pub fn says(text: &str) -> Reply {
    Reply::sse(vec![
        content(text),
        finish("stop"),
        chunk_usage(10, 5),
        end(),
    ])
}

/// The scripted model as the `capable` alias.
pub fn capable(config: &mut conclave::config::Config, upstream_url: &str) {
    config.models.insert(
        "capable".into(),
        conclave::config::ModelAlias {
            provider: conclave::config::ProviderKind::Openai,
            model: "capable-model".into(),
            base_url: Some(format!("{upstream_url}/v1")),
            ..Default::default()
        },
    );
}

/// A turn as it streams.
pub async fn start_turn(server: &TestServer, id: &str, prompt: &str) -> Lines {
    let response = server.message(id, json!({"prompt": prompt})).await;
    assert_eq!(response.status(), 200);
    Lines::new(response)
}

/// Reads until the call `call_id` asks for approval; the events read.
pub async fn until_asked(turn: &mut Lines, call_id: &str) -> Vec<Value> {
    let mut seen = Vec::new();
    while let Some(event) = turn.next().await {
        let asked = event["type"] == "approval_requested" && event["call_id"] == call_id;
        seen.push(event);
        if asked {
            return seen;
        }
    }
    panic!("the turn ended before {call_id} asked: {seen:?}");
}

/// `POST /agent/session/{id}/approvals/{call}`: status and body.
pub async fn decide(
    server: &TestServer,
    key: Option<&str>,
    id: &str,
    call: &str,
    decision: Value,
) -> (u16, Value) {
    let path = format!("/agent/session/{id}/approvals/{call}");
    let response = match key {
        Some(key) => {
            server
                .send_as(key, reqwest::Method::POST, &path, Some(decision))
                .await
        }
        None => server.post(&path, decision).await,
    };
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

pub fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

/// The `tool` message the model was sent for a call.
pub fn told(request: &Value, call_id: &str) -> String {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == call_id)
        .and_then(|m| m["content"].as_str())
        .unwrap_or_else(|| panic!("no tool message for {call_id} in {request}"))
        .to_string()
}

/// Allows a waiting call over HTTP, which must answer 200.
pub async fn allow(server: &TestServer, id: &str, call: &str) {
    let (status, body) = decide(server, None, id, call, json!({"decision": "allow"})).await;
    assert_eq!(status, 200, "{body}");
}

/// Whether a `status` event of `events` says `text`.
pub fn status_says(events: &[Value], text: &str) -> bool {
    of_type(events, "status")
        .iter()
        .any(|s| s["message"].as_str().unwrap_or_default().contains(text))
}
