//! `GET /agents`: the agents this server offers by name (configured
//! profiles, then the session kinds), which AG-UI and the LangGraph API
//! address.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::agent::profiles::{self, Agent};
use crate::api::http::auth::Caller;
use crate::api::http::error::{ApiError, ErrorBody};
use crate::api::http::state::AppState;
use crate::protocol::SessionKind;
use crate::session::{NewSession, Session};

#[derive(Debug, Serialize, ToSchema)]
pub struct Agents {
    pub agents: Vec<Agent>,
}

/// The named agents: each with its description, session kind and model.
#[utoipa::path(get, path = "/agents", responses((status = 200, body = Agents)))]
pub async fn list(State(state): State<AppState>) -> Json<Agents> {
    Json(Agents {
        agents: profiles::list(&state.config, state.sessions.tasks()),
    })
}

/// One named agent.
#[utoipa::path(get, path = "/agents/{name}", params(("name" = String, Path)),
    responses((status = 200, body = Agent), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<Agent>, ApiError> {
    named(&state, &name).map(Json)
}

/// The agent `name`, or a 404 that says where the list is.
pub fn named(state: &AppState, name: &str) -> Result<Agent, ApiError> {
    profiles::resolve(&state.config, state.sessions.tasks(), name).ok_or_else(|| {
        ApiError::not_found(format!("no agent named {name:?}; GET /agents lists them"))
    })
}

/// What a protocol adapter opens a session of a named agent with.
pub struct Opening<'a> {
    /// The session's id when the client chose it (an AG-UI thread, an A2A
    /// context); a new one otherwise.
    pub id: Option<Uuid>,
    /// The caller's options on top of the agent's (a JSON merge patch).
    pub overrides: Option<&'a Map<String, Value>>,
    pub ephemeral: bool,
    /// The adapter opening it: one of [`crate::protocol::ORIGINS`].
    pub origin: &'static str,
    /// The client's labels on it.
    pub metadata: Map<String, Value>,
    /// The field a wrong kind is reported under.
    pub field: &'a str,
}

/// A new session of `agent` for the caller, its options checked by its
/// kind as `POST /agent/session` checks them.
pub async fn open_session(
    state: &AppState,
    caller: &Caller,
    agent: &Agent,
    opening: Opening<'_>,
) -> Result<Arc<Session>, ApiError> {
    let options = agent.options_with(opening.overrides);
    let body = Map::from_iter([("options".to_owned(), Value::Object(options))]);
    let options = state
        .sessions
        .tasks()
        .require(&agent.kind, opening.field)?
        .options(&body, &[])
        .await?;
    crate::api::routes::fork::checked_sandbox(state, caller, &options).await?;
    let new = NewSession {
        name: None,
        kind: SessionKind::new(agent.kind.clone()),
        owner: caller.owner.clone(),
        options,
        ephemeral: opening.ephemeral,
        origin: Some(opening.origin.to_owned()),
        metadata: opening.metadata,
    };
    Ok(match opening.id {
        Some(id) => state.sessions.create_with_id(id, new).await?,
        None => state.sessions.create(new).await?,
    })
}
