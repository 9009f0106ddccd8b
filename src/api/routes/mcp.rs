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
    match shape_problem(&bytes) {
        Some((code, message)) => refuse(code, &message),
        None => {
            next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
                .await
        }
    }
}

/// What makes `bytes` no JSON-RPC 2.0 message, if anything. Only the
/// envelope is read: the params or result are skipped, never built (rmcp
/// parses the message again).
fn shape_problem(bytes: &[u8]) -> Option<(i64, String)> {
    use serde_json::error::Category;
    let parse = |e: serde_json::Error| Some((-32700, format!("Parse error: {e}")));
    if bytes.trim_ascii_start().starts_with(b"[") {
        return match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
            Err(e) => parse(e),
            Ok(_) => Some((
                -32600,
                "Invalid Request: JSON-RPC batches are not supported (MCP has none since \
                 2025-06-18): send one message per request"
                    .to_string(),
            )),
        };
    }
    let not_a_message = || {
        Some((
            -32600,
            "Invalid Request: not a JSON-RPC 2.0 message (`jsonrpc: \"2.0\"` and a \
             `method`, or a `result` or `error`)"
                .to_string(),
        ))
    };
    match serde_json::from_slice::<Envelope<'_>>(bytes) {
        Ok(m)
            if m.jsonrpc.as_deref() == Some("2.0")
                && (m.method.is_some() || m.result.0 || m.error.0) =>
        {
            None
        }
        Ok(_) => not_a_message(),
        Err(e) if e.classify() == Category::Data => {
            match serde_json::from_slice::<serde_json::Value>(bytes) {
                Ok(serde_json::Value::Object(_)) => not_a_message(),
                _ => Some((
                    -32600,
                    "Invalid Request: a JSON-RPC message is a JSON object".to_string(),
                )),
            }
        }
        Err(e) => parse(e),
    }
}

/// The members of a JSON-RPC message the check reads.
#[derive(serde::Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    jsonrpc: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    method: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    result: Present,
    #[serde(default)]
    error: Present,
}

/// Whether a member is there, whatever its value (`null` included).
#[derive(Default)]
struct Present(bool);

impl<'de> serde::Deserialize<'de> for Present {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Present, D::Error> {
        serde::de::IgnoredAny::deserialize(deserializer).map(|_| Present(true))
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

#[cfg(test)]
mod tests {
    use super::shape_problem;

    fn code(body: &str) -> Option<i64> {
        shape_problem(body.as_bytes()).map(|(code, _)| code)
    }

    #[test]
    fn only_the_envelope_decides() {
        assert_eq!(
            code(
                r#"{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"a": [1, {"b": null}]}}"#
            ),
            None
        );
        assert_eq!(code(r#"{"jsonrpc": "2.0", "id": 1, "result": null}"#), None);
        assert_eq!(
            code(r#"{"jsonrpc": "2.0", "id": 1, "error": {"code": 1, "message": "x"}}"#),
            None
        );
        assert_eq!(
            code(r#"{"jsonrpc": "2.0", "id": 1, "method": 5}"#),
            Some(-32600)
        );
        assert_eq!(code(r#"{"jsonrpc": 2, "method": "ping"}"#), Some(-32600));
        assert_eq!(
            code(r#" [{"jsonrpc": "2.0", "method": "ping"}]"#),
            Some(-32600)
        );
        assert_eq!(code("[{"), Some(-32700));
        assert_eq!(
            code(r#"{"jsonrpc": "2.0", "method": "ping"} x"#),
            Some(-32700)
        );
        assert_eq!(code("\"text\""), Some(-32600));
    }
}
