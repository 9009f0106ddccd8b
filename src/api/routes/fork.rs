//! Forks and workspace snapshots: `POST /agent/session/{id}/fork`, `GET
//! /agent/session/{id}/snapshots`, and the named snapshots new sessions
//! start from (`POST`/`GET /sandboxes/snapshots`, `DELETE
//! /sandboxes/snapshots/{id}`).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::agent::fork::{ForkError, ForkRequest, Forked, Forks};
use crate::api::http::auth::Caller;
use crate::api::http::error::{ApiError, ErrorBody};
use crate::api::http::extract::JsonObject;
use crate::api::http::state::AppState;
use crate::api::routes::agent::parse_id;
use crate::sandbox::snapshots::{AtTurn, Snapshot, Snapshots};

impl From<ForkError> for ApiError {
    fn from(error: ForkError) -> ApiError {
        match error {
            ForkError::Session(e) => ApiError::from(e),
            ForkError::Kind(_) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "not_forkable",
                error.to_string(),
            ),
            ForkError::MidTurn { .. } => {
                ApiError::new(StatusCode::CONFLICT, "inside_turn", error.to_string())
            }
            ForkError::Dropped { .. } => {
                ApiError::new(StatusCode::CONFLICT, "snapshot_dropped", error.to_string())
            }
            ForkError::HistoryUnknown(_) => {
                ApiError::new(StatusCode::CONFLICT, "history_unknown", error.to_string())
            }
            ForkError::Sandbox(e) => ApiError::internal(e),
        }
    }
}

pub(crate) fn forks(state: &AppState) -> Forks {
    Forks {
        sessions: state.sessions.clone(),
        store: state.store.clone(),
        sandboxes: state.sandboxes.clone(),
        tools: Some(state.tools.clone()),
        max_forks: state.config.agent.max_forks,
    }
}

/// New options' sandbox as the caller may have it: the snapshot it starts
/// from (returned), and the secrets its environment names, each refused
/// with a 422 unless the caller's key may use it.
pub async fn checked_sandbox(
    state: &AppState,
    caller: &Caller,
    options: &serde_json::Value,
) -> Result<Option<String>, ApiError> {
    // An agent session's: its environment's secrets and its clone's
    // credential must be the caller's key's.
    if let (Some(sandboxes), Ok(agent)) = (
        &state.sandboxes,
        crate::agent::AgentOptions::deserialize(options),
    ) {
        crate::tools::place::sandbox_env(sandboxes, &agent, caller.owner())
            .map_err(crate::session::SessionError::from)?;
        let credential = agent
            .workspace
            .and_then(|w| w.git)
            .and_then(|g| g.credential);
        if let Some(name) = credential
            && sandboxes.secrets().get(caller.owner(), &name).is_none()
        {
            return Err(crate::session::SessionError::from(crate::session::OptionError::new(
                "options.workspace.git.credential",
                format!("no secret {name} for this key ([secrets] or [keys.NAME.secrets] of the server's config)"),
            ))
            .into());
        }
    }
    let Some(snapshot) = crate::agent::fork::seed_of(options) else {
        return Ok(None);
    };
    forks(state).check_seed(&snapshot, caller.owner()).await?;
    Ok(Some(snapshot))
}

/// Records that `session` starts from `snapshot`, which then outlives its
/// own session.
pub async fn pin(state: &AppState, snapshot: &str, session: Uuid) -> Result<(), ApiError> {
    snapshots(state)?
        .add_user(snapshot, session)
        .await
        .map_err(sandbox_error)?;
    Ok(())
}

fn snapshots(state: &AppState) -> Result<&Arc<Snapshots>, ApiError> {
    state
        .sandboxes
        .as_deref()
        .and_then(|s| s.snapshots())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "no_sandboxes",
                "this server runs no sandboxes",
            )
        })
}

/// Waits for the snapshot of the session's last turn end, so a request
/// right after a turn sees it.
async fn settled(state: &AppState, session: Uuid) {
    state.tools.snapshots_settled(session).await;
}

fn sandbox_error(e: crate::sandbox::SandboxError) -> ApiError {
    ApiError::internal(format!("snapshots: {e}"))
}

/// Makes `count` new sessions from the session as it was at a turn end:
/// its history up to that turn, its options with `options` on top, and a
/// sandbox that starts from its workspace's snapshot at that turn end.
/// `409` when `at_seq` is inside a turn (the message lists the turn ends)
/// or its workspace is no longer kept.
#[utoipa::path(post, path = "/agent/session/{session_id}/fork", request_body = ForkRequest,
    params(("session_id" = Uuid, Path)),
    responses((status = 201, body = Forked), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn fork(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonObject(body): JsonObject,
) -> Result<(StatusCode, Json<Forked>), ApiError> {
    let source = parse_id(&id)?;
    let request: ForkRequest = serde_json::from_value(serde_json::Value::Object(body))
        .map_err(|e| ApiError::bad_request(format!("fork request: {e}")))?;
    let forked = forks(&state)
        .fork(source, (caller.owner(), caller.owner.as_deref()), request)
        .await?;
    Ok((StatusCode::CREATED, Json(forked)))
}

#[derive(Serialize, ToSchema)]
pub struct SessionSnapshots {
    pub session_id: Uuid,
    /// `sandbox.snapshots.keep_last`: how many turn ends are kept.
    pub keep_last: usize,
    /// Oldest first; `turns` lists the turn ends each stands for.
    pub snapshots: Vec<Snapshot>,
}

/// The kept snapshots of the session's workspace, with their size and the
/// turn ends (`seq`) they were taken at.
#[utoipa::path(get, path = "/agent/session/{session_id}/snapshots", params(("session_id" = Uuid, Path)),
    responses((status = 200, body = SessionSnapshots), (status = 404, body = ErrorBody)))]
pub async fn session_snapshots(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<SessionSnapshots>, ApiError> {
    let session = state.sessions.get(parse_id(&id)?, caller.owner()).await?;
    let snapshots = snapshots(&state)?;
    settled(&state, session.id).await;
    Ok(Json(SessionSnapshots {
        session_id: session.id,
        keep_last: snapshots.keep_last(),
        snapshots: snapshots
            .of_session(session.id)
            .await
            .map_err(sandbox_error)?,
    }))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NameSnapshot {
    pub session_id: Uuid,
    /// A turn end with a kept snapshot; default: the latest.
    pub at_seq: Option<u64>,
}

/// Names a session's snapshot so new sessions can start from it
/// (`options.sandbox.from_snapshot`); a named snapshot is kept past the
/// session's retention and deletion until it is deleted.
#[utoipa::path(post, path = "/sandboxes/snapshots", request_body = NameSnapshot,
    responses((status = 201, body = Snapshot), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn name(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonObject(body): JsonObject,
) -> Result<(StatusCode, Json<Snapshot>), ApiError> {
    let asked: NameSnapshot = serde_json::from_value(serde_json::Value::Object(body))
        .map_err(|e| ApiError::bad_request(format!("snapshot request: {e}")))?;
    let session = state.sessions.get(asked.session_id, caller.owner()).await?;
    let snapshots = snapshots(&state)?;
    settled(&state, session.id).await;
    let chosen = match asked.at_seq {
        Some(seq) => match snapshots
            .at_turn(session.id, seq)
            .await
            .map_err(sandbox_error)?
        {
            AtTurn::Kept(snapshot) => snapshot,
            AtTurn::Before | AtTurn::Dropped(_) => {
                let kept: Vec<String> = snapshots
                    .of_session(session.id)
                    .await
                    .map_err(sandbox_error)?
                    .iter()
                    .flat_map(|s| s.turns.iter().map(u64::to_string))
                    .collect();
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "no_snapshot",
                    format!(
                        "no snapshot of session {} at seq {seq}; kept turn ends: {}",
                        session.id,
                        if kept.is_empty() { "none".into() } else { kept.join(", ") }
                    ),
                ));
            }
        },
        None => snapshots
            .of_session(session.id)
            .await
            .map_err(sandbox_error)?
            .pop()
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::CONFLICT,
                    "no_snapshot",
                    format!(
                        "session {} has no snapshot yet: one is taken at each turn end while its sandbox lives",
                        session.id
                    ),
                )
            })?,
    };
    if let (Some(owner), false) = (caller.owner(), chosen.named) {
        admit_named(&state, snapshots, owner, &chosen).await?;
    }
    let named = snapshots
        .set_named(&chosen.snapshot_id, true)
        .await
        .map_err(sandbox_error)?
        .ok_or_else(|| ApiError::not_found(format!("snapshot {} is gone", chosen.snapshot_id)))?;
    Ok((StatusCode::CREATED, Json(named)))
}

/// Refuses a snapshot past the key's `max_named_snapshots`, or one whose
/// bytes would take the key past its `storage_mb`.
async fn admit_named(
    state: &AppState,
    snapshots: &Snapshots,
    owner: &str,
    chosen: &Snapshot,
) -> Result<(), ApiError> {
    if let Some(limit) = state.quotas.table().quota(Some(owner)).max_named_snapshots {
        let (count, _) = snapshots.named_bytes(owner).await.map_err(sandbox_error)?;
        if count as u64 >= limit {
            return Err(crate::quota::QuotaExceeded {
                key: state.quotas.table().name(Some(owner)),
                quota: "max_named_snapshots",
                limit: limit.to_string(),
                why: format!(
                    "the key keeps {count} named snapshots: delete one (DELETE /sandboxes/snapshots/{{id}}) first"
                ),
                reset: None,
                retry_after: std::time::Duration::from_secs(60),
            }
            .into());
        }
    }
    if let Some(storage) = &state.storage {
        let bytes = usize::try_from(chosen.size_bytes).unwrap_or(usize::MAX);
        storage.admit(owner, bytes).await.map_err(|e| match e {
            crate::bus::StorageError::Exceeded(e) => ApiError::from(e),
            other => ApiError::internal(other),
        })?;
    }
    Ok(())
}

#[derive(Serialize, ToSchema)]
pub struct NamedSnapshots {
    pub snapshots: Vec<Snapshot>,
}

/// The named snapshots of the caller's key.
#[utoipa::path(get, path = "/sandboxes/snapshots", responses((status = 200, body = NamedSnapshots)))]
pub async fn named(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<NamedSnapshots>, ApiError> {
    let snapshots = snapshots(&state)?
        .named(caller.owner())
        .await
        .map_err(sandbox_error)?;
    Ok(Json(NamedSnapshots { snapshots }))
}

/// Un-names a snapshot: it goes once no session keeps it (its session's
/// retention, sessions started from it).
#[utoipa::path(delete, path = "/sandboxes/snapshots/{snapshot_id}", params(("snapshot_id" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let snapshots = snapshots(&state)?;
    let gone = || ApiError::not_found(format!("snapshot {id} not found"));
    let found = snapshots.get(&id).await.map_err(sandbox_error)?;
    if !found.is_some_and(|s| s.named && s.visible_to(caller.owner())) {
        return Err(gone());
    }
    snapshots
        .set_named(&id, false)
        .await
        .map_err(sandbox_error)?;
    Ok(StatusCode::NO_CONTENT)
}
