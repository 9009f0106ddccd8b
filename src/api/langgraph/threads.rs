//! Assistants and threads: agents and sessions as LangGraph names them.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde_json::{Map, Value, json};
use std::sync::Arc;

use super::{PIPELINE, assistant, assistant_json, current_values, thread_id, values};
use crate::agent::fork::ForkRequest;
use crate::agent::profiles::{self, Agent};
use crate::api::http::auth::Caller;
use crate::api::http::error::ApiError;
use crate::api::http::extract::{ApiQuery, JsonObject};
use crate::api::http::state::AppState;
use crate::api::routes::agents::{Opening, open_session};
use crate::protocol::{EventKind, SessionKind, SessionStatus};
use crate::session::Session;
use crate::store::SessionFilter;

/// History states returned by default.
const SEARCH_DEFAULT: usize = 10;

/// `POST /assistants/search`: every agent (profiles, then session kinds).
pub async fn search_assistants(State(state): State<AppState>) -> Json<Vec<Value>> {
    Json(
        profiles::list(&state.config, state.sessions.tasks())
            .iter()
            .map(assistant_json)
            .collect(),
    )
}

/// `GET /assistants/{id}`.
pub async fn get_assistant(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(assistant_json(&assistant(&state, &id)?)))
}

/// A new session of `agent` for the caller.
pub(super) async fn new_session(
    state: &AppState,
    caller: &Caller,
    agent: &Agent,
    ephemeral: bool,
    metadata: Map<String, Value>,
) -> Result<Arc<Session>, ApiError> {
    let opening = Opening {
        id: None,
        overrides: None,
        ephemeral,
        origin: "langgraph",
        metadata,
        field: "assistant",
    };
    open_session(state, caller, agent, opening).await
}

fn status_name(status: SessionStatus) -> &'static str {
    match status {
        SessionStatus::Running => "busy",
        SessionStatus::Interrupted => "interrupted",
        SessionStatus::Idle | SessionStatus::Closed => "idle",
    }
}

/// A thread: its metadata is the session's, with `graph_id` (its kind)
/// where the client set none.
fn thread_json(
    id: uuid::Uuid,
    kind: &SessionKind,
    status: SessionStatus,
    (created_at, updated_at): (DateTime<Utc>, DateTime<Utc>),
    mut metadata: Map<String, Value>,
) -> Value {
    metadata
        .entry("graph_id")
        .or_insert_with(|| kind.as_str().into());
    json!({
        "thread_id": id,
        "created_at": created_at,
        "updated_at": updated_at,
        "metadata": metadata,
        "status": status_name(status),
        "values": {},
        "interrupts": {},
    })
}

/// The session as a thread, with its values now.
async fn session_json(state: &AppState, session: &Session) -> Result<Value, ApiError> {
    let metadata = state.sessions.metadata(session.id).await?;
    let mut thread = thread_json(
        session.id,
        &session.kind,
        session.status(),
        (session.created_at, session.updated_at()),
        metadata,
    );
    thread["values"] = current_values(state, session).await?;
    Ok(thread)
}

/// `POST /threads`: a new persistent session. `metadata.graph_id` (or
/// `metadata.assistant_id`) names its assistant; the default is `agent`.
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    mut body: JsonObject,
) -> Result<Json<Value>, ApiError> {
    let metadata = body
        .take::<Map<String, Value>>("metadata")?
        .unwrap_or_default();
    let id = match body.take::<String>("thread_id")? {
        None => None,
        Some(id) => Some(
            uuid::Uuid::parse_str(&id)
                .map_err(|_| ApiError::invalid("thread_id", "must be a UUID"))?,
        ),
    };
    let keep = match body.take::<String>("if_exists")?.as_deref() {
        None | Some("raise") => false,
        Some("do_nothing") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "if_exists",
                format!("{other:?}: must be raise or do_nothing"),
            ));
        }
    };
    let default = SessionKind::AGENT;
    let name = ["assistant_id", "graph_id"]
        .iter()
        .find_map(|field| metadata.get(*field).and_then(Value::as_str))
        .unwrap_or(default.as_str());
    let agent = assistant(&state, name)?;
    let session = match id {
        None => new_session(&state, &caller, &agent, false, metadata).await?,
        Some(id) => with_id(&state, &caller, &agent, (id, keep), metadata).await?,
    };
    Ok(Json(session_json(&state, &session).await?))
}

/// A thread of the id the client chose: the caller's own when it exists
/// and `if_exists` is `do_nothing`; `409` when it exists otherwise (or is
/// another key's: an id names one session).
pub(super) async fn with_id(
    state: &AppState,
    caller: &Caller,
    agent: &Agent,
    (id, keep): (uuid::Uuid, bool),
    metadata: Map<String, Value>,
) -> Result<Arc<Session>, ApiError> {
    let taken = || {
        ApiError::new(
            StatusCode::CONFLICT,
            "thread_exists",
            format!("thread {id} exists; if_exists: do_nothing answers it instead"),
        )
    };
    match state.sessions.get(id, caller.owner()).await {
        Ok(session) if keep => return Ok(session),
        Ok(_) => return Err(taken()),
        Err(crate::session::SessionError::NotFound(_)) => {}
        Err(e) => return Err(e.into()),
    }
    let opening = Opening {
        id: Some(id),
        overrides: None,
        ephemeral: false,
        origin: "langgraph",
        metadata,
        field: "assistant",
    };
    match open_session(state, caller, agent, opening).await {
        Ok(session) => Ok(session),
        // Made meanwhile, or another key's: the id is taken.
        Err(e) if matches!(state.store.get_session(id).await, Ok(Some(_))) => {
            tracing::debug!(%id, error = %e.message, "thread id taken");
            Err(taken())
        }
        Err(e) => Err(e),
    }
}

/// `GET /threads/{id}`, with its values.
pub async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let session = state.sessions.get(thread_id(&id)?, caller.owner()).await?;
    Ok(Json(session_json(&state, &session).await?))
}

/// `PATCH /threads/{id}`: sets each key of `metadata` in the thread's
/// metadata, keeping the others.
pub async fn patch(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    mut body: JsonObject,
) -> Result<Json<Value>, ApiError> {
    let id = thread_id(&id)?;
    let Some(metadata) = body.take::<Map<String, Value>>("metadata")? else {
        return Err(ApiError::invalid(
            "metadata",
            "is required: an object of the keys to set",
        ));
    };
    state
        .sessions
        .merge_metadata(id, caller.owner(), &metadata)
        .await?;
    let session = state.sessions.get(id, caller.owner()).await?;
    Ok(Json(session_json(&state, &session).await?))
}

/// `DELETE /threads/{id}`: deletes the session.
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    state
        .sessions
        .delete(thread_id(&id)?, caller.owner())
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /threads/{id}/copy`: a new thread of the caller's with the
/// thread's history and workspace as they were at its last turn end (a
/// fork of its session: a turn running now is not copied).
pub async fn copy(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let source = thread_id(&id)?;
    let forked = crate::api::routes::fork::forks(&state)
        .fork(
            source,
            (caller.owner(), caller.owner.as_deref()),
            ForkRequest::default(),
        )
        .await?;
    let copy = forked
        .sessions
        .first()
        .ok_or_else(|| ApiError::internal("the fork made no session"))?;
    let session = state.sessions.get(copy.session_id, caller.owner()).await?;
    Ok(Json(session_json(&state, &session).await?))
}

/// `POST /threads/search`: the caller's threads, newest first. `limit`,
/// `offset` and `status` filter; each `metadata` key must have an equal
/// value in a thread's metadata, except a `graph_id` naming a session
/// kind, which is the thread's kind.
pub async fn search(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    mut body: JsonObject,
) -> Result<Json<Vec<Value>>, ApiError> {
    let (limit, offset) = super::protocol::page(&mut body)?;
    let status = body.take::<String>("status")?;
    let mut metadata = body
        .take::<Map<String, Value>>("metadata")?
        .unwrap_or_default();
    // A kind's name is the thread's kind; another graph id (an assistant
    // of a kind) is matched in the metadata the thread was made with.
    let kind = match metadata.get("graph_id") {
        Some(Value::String(id)) if state.sessions.tasks().get(id).is_some() => {
            let kind = SessionKind::new(id.clone());
            metadata.remove("graph_id");
            Some(kind)
        }
        _ => None,
    };
    let filter = SessionFilter {
        owner: caller.owner().map(str::to_owned),
        kind,
        // Not a stateless run's: the store leaves them out before the
        // page is cut.
        ephemeral: Some(false),
        metadata,
        limit: Some(offset + limit),
        ..SessionFilter::default()
    };
    let threads = state
        .sessions
        .list(&filter)
        .await?
        .into_iter()
        .map(|r| {
            let times = (r.created_at, r.updated_at);
            thread_json(r.id, &r.kind, r.status, times, r.metadata)
        })
        .filter(|t| status.as_deref().is_none_or(|s| t["status"] == s))
        .skip(offset)
        .take(limit)
        .collect();
    Ok(Json(threads))
}

/// A thread state: values and the checkpoint they are at (the `seq` of the
/// turn's `result`, 0 before any turn).
fn state_json(id: uuid::Uuid, values: Value, seq: u64, ts: Option<DateTime<Utc>>) -> Value {
    json!({
        "values": values,
        "next": [],
        "tasks": [],
        "metadata": {"step": seq},
        "created_at": ts,
        "checkpoint": {"thread_id": id, "checkpoint_ns": "", "checkpoint_id": seq.to_string()},
        "parent_checkpoint": null,
        "interrupts": [],
    })
}

/// `GET /threads/{id}/state`: the conversation now.
pub async fn state(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let session = state.sessions.get(thread_id(&id)?, caller.owner()).await?;
    let values = current_values(&state, &session).await?;
    Ok(Json(state_json(
        session.id,
        values,
        session.last_seq(),
        Some(session.updated_at()),
    )))
}

/// `POST /threads/{id}/history`: one state per finished turn, newest
/// first: the conversation as it stood at that turn's `result`
/// (`history_len` messages of it). `limit` (default 10) caps them.
pub async fn history(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    mut body: JsonObject,
) -> Result<Json<Vec<Value>>, ApiError> {
    let limit = body.take::<usize>("limit")?.unwrap_or(SEARCH_DEFAULT);
    states(&state, &caller, &id, limit).await.map(Json)
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryQuery {
    limit: Option<usize>,
}

/// `GET /threads/{id}/history?limit=`: the same states, for the clients
/// that read a thread's history with a GET.
pub async fn history_get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<HistoryQuery>,
) -> Result<Json<Vec<Value>>, ApiError> {
    let limit = query.limit.unwrap_or(SEARCH_DEFAULT);
    states(&state, &caller, &id, limit).await.map(Json)
}

/// The thread's states, newest first, at most `limit` of them.
async fn states(
    state: &AppState,
    caller: &Caller,
    id: &str,
    limit: usize,
) -> Result<Vec<Value>, ApiError> {
    let session = state.sessions.get(thread_id(id)?, caller.owner()).await?;
    if session.kind.as_str() == PIPELINE {
        return pipeline_history(state, &session, limit).await;
    }
    let history = state.sessions.history(&session).await?;
    let mut ends: Vec<(u64, DateTime<Utc>, usize)> = Vec::new();
    let mut events = session.replay(0);
    while let Some(event) = events.next().await {
        match &event.kind {
            EventKind::Result {
                history_len: Some(len),
                ..
            } => ends.push((event.seq, event.ts, *len as usize)),
            // A rewind undid the turns after the end it went back to.
            EventKind::Rewound { to_seq, .. } => ends.retain(|(seq, ..)| seq <= to_seq),
            _ => {}
        }
    }
    let states = ends
        .iter()
        .rev()
        .take(limit)
        .map(|(seq, ts, len)| {
            let kept = &history[..(*len).min(history.len())];
            state_json(session.id, values(kept), *seq, Some(*ts))
        })
        .collect();
    Ok(states)
}

/// A pipeline thread's history: its run's checkpoints, newest first, each
/// step's state as the values and the step as the checkpoint id.
async fn pipeline_history(
    state: &AppState,
    session: &Session,
    limit: usize,
) -> Result<Vec<Value>, ApiError> {
    let Some(thread) = state.pipelines.thread_of(session.id).await? else {
        return Ok(Vec::new());
    };
    let history = state
        .pipelines
        .history(session.owner.as_deref(), &thread)
        .await?;
    let steps = history["history"].as_array().cloned().unwrap_or_default();
    Ok(steps
        .iter()
        .rev()
        .take(limit)
        .map(|step| {
            let mut checkpoint = state_json(
                session.id,
                step["state"].clone(),
                step["step"].as_u64().unwrap_or(0),
                step["at"].as_str().and_then(|at| at.parse().ok()),
            );
            checkpoint["metadata"] = json!({"step": step["step"], "node": step["node"],
                "decision": step["decision"], "status": step["status"]});
            checkpoint["next"] = json!(step["next"].as_str().into_iter().collect::<Vec<_>>());
            checkpoint
        })
        .collect())
}
