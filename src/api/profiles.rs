//! `GET /agents`: the agents this server offers by name (configured
//! profiles, then the session kinds), which AG-UI and the LangGraph API
//! address.

use axum::Json;
use axum::extract::{Path, State};
use serde::Serialize;
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody};
use super::state::AppState;
use crate::agent::profiles::{self, Agent};

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
    profiles::resolve(&state.config, state.sessions.tasks(), &name)
        .map(Json)
        .ok_or_else(|| {
            ApiError::not_found(format!("no agent named {name:?}; GET /agents lists them"))
        })
}
