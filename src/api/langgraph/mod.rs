//! The LangGraph Platform API under `/langgraph`: the part of the
//! LangGraph Platform API that the official `langgraph-sdk` client uses,
//! mapped onto Conclave's own machinery (docs/langgraph.md has the table).
//!
//! - assistants: the named agents of [`crate::agent::profiles`].
//! - threads: Conclave sessions, owned like them (another key's is a 404).
//! - runs: turns of a session; a run's id is the `seq` its turn started
//!   after, so nothing is kept beside the session's event log.
//! - store: the caller's KV namespace, under one key prefix.

mod protocol;
mod runs;
mod store;
mod threads;

use axum::Router;
use axum::routing::{get, post};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::agent::profiles::{self, Agent};
use crate::api::http::error::ApiError;
use crate::api::http::state::AppState;
use crate::protocol::Message;
use crate::session::Session;

/// The routes, nested under `/langgraph` by [`super::router`].
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/agents/search", post(protocol::search_agents))
        .route("/agents/{id}", get(protocol::get_agent))
        .route("/agents/{id}/schemas", get(protocol::agent_schemas))
        .route("/runs", post(protocol::create))
        .route("/runs/search", post(protocol::search))
        .route("/runs/{run}", get(protocol::get).delete(protocol::delete))
        .route("/runs/{run}/wait", get(protocol::join))
        .route("/runs/{run}/stream", get(protocol::join_stream))
        .route("/runs/{run}/cancel", post(protocol::cancel))
        .route("/assistants/search", post(threads::search_assistants))
        .route("/assistants/{id}", get(threads::get_assistant))
        .route("/threads", post(threads::create))
        .route("/threads/search", post(threads::search))
        .route(
            "/threads/{id}",
            get(threads::get)
                .patch(threads::patch)
                .delete(threads::delete),
        )
        .route("/threads/{id}/state", get(threads::state))
        .route("/threads/{id}/copy", post(threads::copy))
        .route(
            "/threads/{id}/history",
            get(threads::history_get).post(threads::history),
        )
        .route("/threads/{id}/runs", post(runs::create))
        .route("/threads/{id}/runs/stream", post(runs::stream))
        .route("/threads/{id}/runs/wait", post(runs::wait))
        .route("/threads/{id}/runs/{run}", get(runs::get))
        .route("/threads/{id}/runs/{run}/join", get(runs::join))
        .route("/threads/{id}/runs/{run}/cancel", post(runs::cancel))
        .route("/runs/stream", post(protocol::stream))
        .route("/runs/wait", post(protocol::wait))
        .route(
            "/store/items",
            get(store::get_item)
                .put(store::put_item)
                .delete(store::delete_item),
        )
        .route("/store/items/search", post(store::search))
        .route("/store/namespaces", post(store::namespaces))
}

/// The agent an assistant id names, or a 404 that says where the list is.
fn assistant(state: &AppState, id: &str) -> Result<Agent, ApiError> {
    profiles::resolve(&state.config, state.sessions.tasks(), id).ok_or_else(|| {
        ApiError::not_found(format!(
            "no assistant {id:?}; POST /langgraph/assistants/search lists them"
        ))
    })
}

/// An agent as a LangGraph assistant: its name is its id, its session kind
/// its graph.
fn assistant_json(agent: &Agent) -> Value {
    json!({
        "assistant_id": agent.name,
        "graph_id": agent.kind,
        "name": agent.name,
        "description": agent.description,
        "config": {},
        "context": {},
        "metadata": {"model": agent.model},
        "version": 1,
        "created_at": "1970-01-01T00:00:00Z",
        "updated_at": "1970-01-01T00:00:00Z",
    })
}

/// A thread id: a session id; anything else is no thread at all.
fn thread_id(id: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(id).map_err(|_| ApiError::not_found(format!("thread {id} not found")))
}

/// A session message as a LangChain message (`type` human, ai or tool);
/// none for a compaction's mark, which is no message of the conversation.
fn message_json(index: usize, message: &Message) -> Option<Value> {
    let id = format!("msg-{index}");
    Some(match message {
        Message::Compacted { .. } | Message::Reasoning { .. } => return None,
        Message::User { content } => json!({"type": "human", "id": id, "content": content}),
        Message::Assistant {
            content,
            tool_calls,
        } => json!({
            "type": "ai", "id": id, "content": content,
            "tool_calls": tool_calls.iter().map(|c| json!({
                "id": c.id, "name": c.name, "args": c.arguments, "type": "tool_call"
            })).collect::<Vec<_>>(),
        }),
        Message::Tool {
            tool_call_id,
            name,
            content,
            is_error,
        } => json!({
            "type": "tool", "id": id, "content": content, "tool_call_id": tool_call_id,
            "name": name, "status": if *is_error { "error" } else { "success" },
        }),
    })
}

/// A thread's values: its conversation as LangChain messages.
fn values(history: &[Message]) -> Value {
    json!({"messages": history.iter().enumerate().filter_map(|(i, m)| message_json(i, m)).collect::<Vec<_>>()})
}

/// The session's values now: an agent's conversation, a pipeline's state
/// at its last checkpoint (`{}` before its first turn).
async fn current_values(state: &AppState, session: &Session) -> Result<Value, ApiError> {
    if session.kind.as_str() != PIPELINE {
        return Ok(values(&state.sessions.history(session).await?));
    }
    let Some(thread) = state.pipelines.thread_of(session.id).await? else {
        return Ok(json!({}));
    };
    let status = state
        .pipelines
        .status(session.owner.as_deref(), &thread)
        .await?;
    Ok(status.get("state").cloned().unwrap_or_else(|| json!({})))
}

/// The session kind whose state and history are a pipeline run's.
const PIPELINE: &str = "pipeline";

/// The text of the last message of a run's `input` (`{"messages": [...]}`,
/// each a string, `{content}` or `{role|type, content}`), or a string input.
fn prompt_of(input: Option<&Value>) -> Result<String, ApiError> {
    let text = match input {
        Some(Value::String(text)) => Some(text.clone()),
        Some(Value::Object(input)) => match input.get("messages") {
            Some(Value::Array(messages)) => messages.last().and_then(|last| match last {
                Value::String(text) => Some(text.clone()),
                Value::Object(m) => m.get("content").and_then(Value::as_str).map(str::to_owned),
                _ => None,
            }),
            _ => None,
        },
        _ => None,
    };
    match text {
        Some(text) if !text.trim().is_empty() => Ok(text),
        _ => Err(ApiError::invalid(
            "input",
            "must be {\"messages\": [...]} whose last message has a non-empty text content",
        )),
    }
}
