//! `GET /sandboxes` and `DELETE /sandboxes/{id}`: the sandboxes of the
//! caller's sessions on this server; with `?all=true` an admin sees every
//! sandbox of this server (the warm pool's and MCP scratch ones too).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, response::IntoResponse};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::api::http::auth::Caller;
use crate::api::http::error::{ApiError, ErrorBody};
use crate::api::http::extract::ApiQuery;
use crate::api::http::state::AppState;
use crate::sandbox::{ManagedSandbox, SandboxManager};

#[derive(Serialize, ToSchema)]
pub struct SandboxView {
    pub id: String,
    /// `session` (a session's), `pool` (ready for a new session) or
    /// `scratch` (an MCP connection's, for calls that name no session).
    pub kind: String,
    pub session_id: Option<Uuid>,
    pub backend: String,
    /// `running`, or `paused` (idle for `sandbox.pause_after_s`; the
    /// session's next tool call resumes it), or `gone` when the backend no
    /// longer has it.
    pub state: String,
    /// When every Conclave instance on the host may remove it.
    pub expires_at: Option<DateTime<Utc>>,
    /// When it was made (its age).
    pub created_at: Option<DateTime<Utc>>,
    /// Percent of one CPU, from a sample at most a second or two old; the
    /// three figures are known for the sandboxes of this server's sessions
    /// where the backend tells them, else null.
    pub cpu_percent: Option<f64>,
    pub memory_bytes: Option<u64>,
    pub pids: Option<u64>,
}

#[derive(Serialize, ToSchema)]
pub struct SandboxList {
    pub sandboxes: Vec<SandboxView>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct SandboxQuery {
    /// Every sandbox of this server (admin keys only).
    all: Option<bool>,
}

fn manager(state: &AppState) -> Result<&SandboxManager, ApiError> {
    state.sandboxes.as_deref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "no_sandboxes",
            "this server runs no sandboxes",
        )
    })
}

/// The sandboxes `caller` may see, with `all` for an admin's whole view.
async fn visible(
    state: &AppState,
    caller: &Caller,
    all: bool,
) -> Result<Vec<SandboxView>, ApiError> {
    let sandboxes = manager(state)?;
    let listed = sandboxes
        .list()
        .await
        .map_err(|e| ApiError::internal(format!("listing sandboxes: {e}")))?;
    let mut views = Vec::new();
    for managed in listed {
        let session = managed
            .session
            .as_deref()
            .and_then(|s| Uuid::parse_str(s).ok());
        let record = match session {
            Some(id) => state
                .sessions
                .record(id)
                .await
                .map_err(|e| ApiError::internal(e.to_string()))?,
            None => None,
        };
        let kind = match (&record, &managed.pool) {
            (Some(_), _) => "session",
            (None, Some(_)) => "pool",
            (None, None) => "scratch",
        };
        let mine = record
            .as_ref()
            .is_some_and(|r| caller.owner().is_none() || r.owner.as_deref() == caller.owner());
        if mine || all {
            views.push(view(&managed, kind, record.map(|r| r.id), sandboxes).await);
        }
    }
    Ok(views)
}

async fn view(
    managed: &ManagedSandbox,
    kind: &str,
    session_id: Option<Uuid>,
    sandboxes: &SandboxManager,
) -> SandboxView {
    let info = match session_id {
        Some(session) => sandboxes
            .info(session)
            .await
            .filter(|info| info.id == managed.id),
        None => None,
    };
    // Only this server pauses its sessions' sandboxes: any other is running.
    let (state, stats) = match info {
        Some(info) => (info.state, info.stats),
        None => ("running".to_string(), Default::default()),
    };
    SandboxView {
        id: managed.id.clone(),
        kind: kind.into(),
        session_id,
        backend: sandboxes.backend_name().into(),
        state,
        expires_at: managed
            .expires
            .and_then(|at| DateTime::from_timestamp(at, 0)),
        created_at: managed
            .created
            .and_then(|at| DateTime::from_timestamp(at, 0)),
        cpu_percent: stats.cpu_percent,
        memory_bytes: stats.memory_bytes,
        pids: stats.pids,
    }
}

/// The caller's sandboxes on this server.
#[utoipa::path(get, path = "/sandboxes", params(SandboxQuery),
    responses((status = 200, body = SandboxList), (status = 403, body = ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(query): ApiQuery<SandboxQuery>,
) -> Result<Json<SandboxList>, ApiError> {
    let all = query.all == Some(true);
    if all {
        caller.require_admin("listing every sandbox")?;
    }
    Ok(Json(SandboxList {
        sandboxes: visible(&state, &caller, all).await?,
    }))
}

/// Destroys one of the caller's sandboxes; its session keeps working and
/// gets a fresh sandbox at its next tool call.
#[utoipa::path(delete, path = "/sandboxes/{id}", params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    let found = visible(&state, &caller, caller.admin)
        .await?
        .into_iter()
        .find(|v| v.id == id);
    let Some(found) = found else {
        return Err(ApiError::not_found(format!("no sandbox '{id}' of yours")));
    };
    let sandboxes = manager(&state)?;
    match found.session_id {
        Some(session) => sandboxes.release_shared(session).await,
        None => sandboxes
            .remove(&found.id)
            .await
            .map_err(|e| ApiError::internal(format!("removing sandbox: {e}")))?,
    }
    Ok(StatusCode::NO_CONTENT)
}
