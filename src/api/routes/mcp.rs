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
            )),
    )
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
