//! `/mcp`, the streamable HTTP MCP server, with each MCP session bound to
//! the key that opened it: another key presenting its `Mcp-Session-Id`
//! gets `404`, as if there were no such session, and cannot run commands
//! in its scratch sandbox or close it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::api::http::auth::Caller;
use crate::api::http::error::ApiError;
use crate::api::http::state::AppState;
use crate::sync::lock;

const SESSION_HEADER: &str = "mcp-session-id";

/// Open MCP sessions by id → the key hash that opened them (`None` when
/// auth is off).
#[derive(Default)]
struct Owners(Mutex<HashMap<String, Option<String>>>);

impl Owners {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Option<String>>> {
        lock(&self.0)
    }
}

/// The `/mcp` routes, when the server has sandboxes.
pub fn routes(state: &AppState) -> Option<Router<AppState>> {
    let host = state.mcp.as_ref()?;
    let service = crate::mcp::http_service(host.clone(), state.stop.child_token());
    Some(
        Router::new()
            .nest_service("/mcp", service)
            .layer(axum::middleware::from_fn_with_state(
                Arc::new(Owners::default()),
                bind_owner,
            ))
            .layer(axum::middleware::from_fn(jsonrpc_errors)),
    )
}

/// A POST whose body is not one JSON-RPC message gets a JSON-RPC error
/// (`-32700` not JSON, `-32600` a batch or not a JSON-RPC 2.0 message)
/// with `400`, as the transport asks, instead of rmcp's plain-text `415`.
/// The body was read whole before routing (`body::read_whole`), so this
/// reads memory.
async fn jsonrpc_errors(request: Request, next: Next) -> Response {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return refuse(-32700, "Parse error: the body could not be read");
    };
    let problem = match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Err(e) => Some((-32700, format!("Parse error: {e}"))),
        Ok(serde_json::Value::Array(_)) => Some((
            -32600,
            "Invalid Request: JSON-RPC batches are not supported (MCP has none since \
             2025-06-18): send one message per request"
                .to_string(),
        )),
        Ok(serde_json::Value::Object(message)) => {
            let versioned = message.get("jsonrpc").and_then(|v| v.as_str()) == Some("2.0");
            let shaped = message.get("method").is_some_and(|m| m.is_string())
                || message.contains_key("result")
                || message.contains_key("error");
            (!versioned || !shaped).then(|| {
                (
                    -32600,
                    "Invalid Request: not a JSON-RPC 2.0 message (`jsonrpc: \"2.0\"` and a \
                     `method`, or a `result` or `error`)"
                        .to_string(),
                )
            })
        }
        Ok(_) => Some((
            -32600,
            "Invalid Request: a JSON-RPC message is a JSON object".to_string(),
        )),
    };
    match problem {
        Some((code, message)) => refuse(code, &message),
        None => {
            next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
                .await
        }
    }
}

fn refuse(code: i64, message: &str) -> Response {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": null,
        "error": {"code": code, "message": message}});
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}

async fn bind_owner(State(owners): State<Arc<Owners>>, request: Request, next: Next) -> Response {
    let caller = request
        .extensions()
        .get::<Caller>()
        .cloned()
        .unwrap_or_default();
    let presented = request
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if let Some(id) = &presented
        && let Some(owner) = owners.lock().get(id)
        && *owner != caller.owner
    {
        return ApiError::not_found(format!("no MCP session {id}")).into_response();
    }
    let method = request.method().clone();
    let mut response = next.run(request).await;
    // rmcp answers a closed session 202, which the official SDKs log as a
    // failed termination; 204 is what they expect.
    if method == Method::DELETE && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::NO_CONTENT;
        *response.body_mut() = axum::body::Body::empty();
    }
    match presented {
        // An initialize: the session rmcp made is the caller's.
        None => {
            if let Some(id) = response
                .headers()
                .get(SESSION_HEADER)
                .and_then(|v| v.to_str().ok())
            {
                owners.lock().insert(id.to_string(), caller.owner.clone());
            }
        }
        Some(id) => {
            let closed = method == Method::DELETE && response.status().is_success();
            if closed || response.status() == StatusCode::NOT_FOUND {
                owners.lock().remove(&id);
            }
        }
    }
    response
}
