//! A2A 1.0 over Conclave's named agents: an agent card per agent and the
//! JSON-RPC binding (docs/a2a.md has the mapping).
//!
//! - `GET /a2a/{agent}/.well-known/agent-card.json`: the agent's card;
//!   `GET /.well-known/agent-card.json` is the `agent` kind's.
//! - `POST /a2a/{agent}`: JSON-RPC 2.0, every method of A2A 1.0 but the
//!   extended card; `SendStreamingMessage` and `SubscribeToTask` answer
//!   SSE, each event a JSON-RPC response.
//!
//! A context is a session and a task one turn of it ([`task`]), both owned
//! by the caller's key like every session.

mod push;
mod rpc;
mod send;
mod task;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::agent::profiles::Agent;
use crate::api::http::error::ApiError;
use crate::api::http::state::AppState;
use crate::api::routes::agents::named as agent;
use crate::protocol::SessionKind;

/// The protocol version served; requests must say it in `A2A-Version`.
pub const VERSION: &str = "1.0";

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/.well-known/agent-card.json", get(default_card))
        .route("/a2a/{agent}/.well-known/agent-card.json", get(card))
        .route("/a2a/{agent}", post(rpc::handle))
}

async fn default_card(State(state): State<AppState>, headers: HeaderMap) -> Response {
    match agent(&state, SessionKind::AGENT.as_str()) {
        Ok(agent) => axum::Json(card_json(&state, &agent, &headers)).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn card(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<axum::Json<Value>, ApiError> {
    let agent = agent(&state, &name)?;
    Ok(axum::Json(card_json(&state, &agent, &headers)))
}

/// The URL the client reached this server at: its `Host` (which the
/// host check has let through) and the scheme a proxy says it used.
fn base_url(headers: &HeaderMap) -> String {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let host = header("host").unwrap_or("127.0.0.1");
    let scheme = match header("x-forwarded-proto") {
        Some("https") => "https",
        _ => "http",
    };
    format!("{scheme}://{host}")
}

/// An agent's card: its one JSON-RPC interface, its skills (the agent
/// itself, then its tools) and the bearer scheme when keys are on.
fn card_json(state: &AppState, agent: &Agent, headers: &HeaderMap) -> Value {
    let base = base_url(headers);
    let description = agent
        .description
        .clone()
        .unwrap_or_else(|| format!("a Conclave {} agent", agent.kind));
    let mut skills = vec![json!({
        "id": agent.name, "name": agent.name, "description": description,
        "tags": [agent.kind], "inputModes": ["text/plain", "application/json"],
        "outputModes": ["text/plain"],
    })];
    skills.extend(tools_of(agent).into_iter().map(|(name, about)| {
        json!({"id": format!("tool:{name}"), "name": name, "description": about,
            "tags": ["tool"]})
    }));
    let mut card = json!({
        "name": agent.name,
        "description": description,
        "supportedInterfaces": [{
            "url": format!("{base}/a2a/{}", agent.name),
            "protocolBinding": "JSONRPC",
            "protocolVersion": VERSION,
        }],
        "provider": {"organization": "Conclave", "url": base},
        "version": env!("CARGO_PKG_VERSION"),
        "capabilities": {"streaming": true, "pushNotifications": true, "extendedAgentCard": false},
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain"],
        "skills": skills,
    });
    if state.keys.enabled() {
        card["securitySchemes"] = json!({"bearer": {"httpAuthSecurityScheme": {
            "scheme": "Bearer", "description": "a Conclave API key"}}});
        card["securityRequirements"] = json!([{"schemes": {"bearer": {"list": []}}}]);
    }
    card
}

/// The built-in tools an agent session of this profile is offered: those
/// its `allowed_tools` name, none when its sandbox is off; other kinds
/// list none (their agents are configured per run).
fn tools_of(agent: &Agent) -> Vec<(String, String)> {
    if agent.kind != SessionKind::AGENT.as_str()
        || agent.options.get("sandbox_enabled") == Some(&Value::Bool(false))
    {
        return Vec::new();
    }
    let allowed: Option<Vec<&str>> = agent
        .options
        .get("allowed_tools")
        .and_then(Value::as_array)
        .map(|tools| tools.iter().filter_map(Value::as_str).collect());
    crate::tools::agent::builtin_tools()
        .into_iter()
        .filter(|(name, _)| allowed.as_ref().is_none_or(|a| a.contains(&name.as_str())))
        .collect()
}
