//! The agent routes: runs, sessions, messages, interrupts, status, event
//! replay and deletion.

use axum::Extension;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::agent::AgentOptions;
use crate::api::http::auth::Caller;
use crate::api::http::error::{ApiError, ErrorBody};
use crate::api::http::extract::{ApiQuery, Body, deny_rest, required_text};
use crate::api::http::state::AppState;
use crate::api::http::stream::{cancel_on_hangup, events_response};
use crate::model::Message;
use crate::protocol::{ContextUse, SessionKind, SessionStatus, Usage};
use crate::session::options::as_written;
use crate::session::{NewSession, SessionError, TurnOptions};

/// `POST /agent/run`'s body: one task in a new ephemeral session.
#[derive(Deserialize, ToSchema)]
pub struct RunRequest {
    /// The task; required, not empty.
    #[schema(required = true, value_type = String)]
    pub prompt: Option<String>,
    pub session_name: Option<String>,
    /// Accepted for the shape `message` has; a new session has no turn to
    /// wait for.
    pub queue: Option<bool>,
    /// The agent's options; they may also be given flat, beside the
    /// fields above.
    #[schema(value_type = Option<AgentOptions>)]
    pub options: Option<Value>,
    #[serde(flatten)]
    #[schema(ignore)]
    pub flat: Map<String, Value>,
}

/// `POST /agent/session/{id}/message`'s body: the session's next turn.
#[derive(Deserialize, ToSchema)]
pub struct MessageRequest {
    /// The prompt; required, not empty.
    #[schema(required = true, value_type = String)]
    pub prompt: Option<String>,
    /// Wait for a running turn instead of answering 409.
    pub queue: Option<bool>,
    /// Nothing else: a session's options are set when it is created.
    #[serde(flatten)]
    #[schema(ignore)]
    pub rest: Map<String, Value>,
}

/// `POST /agent/session`'s body.
#[derive(Deserialize, ToSchema)]
pub struct CreateSessionRequest {
    pub session_name: Option<String>,
    /// The session kind (default `agent`); each kind has its own options.
    pub kind: Option<String>,
    /// The kind's options (for `agent`, these); they may also be given
    /// flat, beside the fields above.
    #[schema(value_type = Option<AgentOptions>)]
    pub options: Option<Value>,
    #[serde(flatten)]
    #[schema(ignore)]
    pub flat: Map<String, Value>,
}

/// A body's options as the session kinds read them: the nested `options`
/// object and the flat fields, in one object.
fn options_body(options: Option<Value>, mut flat: Map<String, Value>) -> Map<String, Value> {
    if let Some(options) = options {
        flat.insert("options".into(), options);
    }
    flat
}

#[derive(Serialize, ToSchema)]
pub struct CreatedSession {
    pub session_id: Uuid,
    pub session_name: Option<String>,
    pub status: String,
    /// What a `multipart/form-data` create put into the workspace.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub uploaded: Vec<crate::api::routes::workspace::Uploaded>,
}

/// Gateway calls listed in a session's status.
const STATUS_GATEWAY_CALLS: usize = 50;

#[derive(Serialize, ToSchema)]
pub struct SessionStatusBody {
    pub session_id: Uuid,
    pub session_name: Option<String>,
    pub kind: SessionKind,
    pub status: SessionStatus,
    pub running: bool,
    pub ephemeral: bool,
    /// The protocol adapter that made it (`a2a`, `agui`, `langgraph`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// The options as the session's kind stored them.
    #[schema(value_type = Object)]
    pub options: serde_json::Value,
    /// What the kind adds (an agent session: its `model`).
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub details: serde_json::Map<String, serde_json::Value>,
    pub history: Vec<Message>,
    pub usage: Usage,
    /// The model's context window and how full the last request left it
    /// (agent sessions; `null` until a model call of this server process).
    pub context: Option<ContextUse>,
    /// The highest event `seq`; replay with `?since=` from any point.
    pub last_seq: u64,
    /// The session's sandbox; `null` until it has one.
    pub sandbox: Option<crate::sandbox::SandboxInfo>,
    /// The session's latest model calls through the gateway (when its
    /// model names a pool), newest first: replica, status, latency, time to
    /// first token, retries, usage. Full traces: `GET /gateway/traces`.
    #[schema(value_type = Vec<Object>)]
    pub gateway_calls: Vec<serde_json::Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Serialize, ToSchema)]
pub struct InterruptBody {
    pub session_id: Uuid,
    /// False when no turn was running.
    pub interrupted: bool,
}

#[derive(Serialize, ToSchema)]
pub struct DeletedBody {
    pub session_id: Uuid,
    pub status: String,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Only events with a greater `seq` (default 0: all).
    pub since: Option<u64>,
    /// Keep the stream open and send new events as they happen.
    pub follow: Option<bool>,
}

pub fn parse_id(id: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(id).map_err(|_| ApiError::not_found(format!("session {id} not found")))
}

const RUN_FIELDS: &[&str] = &["prompt", "queue", "session_name"];

/// Runs one agent task in a new ephemeral session and streams its events.
/// The run is cancelled if the client disconnects.
#[utoipa::path(post, path = "/agent/run", request_body = RunRequest,
    responses(
        (status = 200, description = "NDJSON stream of events (SSE with Accept: text/event-stream)", content_type = "application/x-ndjson", body = crate::protocol::Event),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 413, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn run(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Body(body): Body<RunRequest>,
) -> Result<Response, ApiError> {
    let (new, prompt) = prepare_run(&state, &caller, body).await?;
    let turn = state.sessions.run_new(new, prompt).await?;
    answer_run(&headers, turn).await
}

/// A run's session and prompt, once its options, sandbox and budget pass.
pub(crate) async fn prepare_run(
    state: &AppState,
    caller: &Caller,
    body: RunRequest,
) -> Result<(NewSession, String), ApiError> {
    let task = state
        .sessions
        .tasks()
        .require(SessionKind::AGENT.as_str(), "kind")?;
    let body_options = options_body(body.options, body.flat);
    let options = as_written(task.as_ref(), &body_options, RUN_FIELDS).await?;
    // An ephemeral run restores the snapshot at its first call; its one
    // turn needs no pin to keep it.
    crate::api::routes::fork::checked_sandbox(state, caller, &options).await?;
    let prompt = required_text("prompt", body.prompt)?;
    // Before the session is made: a refused run leaves no session behind.
    state.usage.check_budget(caller.owner()).await?;
    let new = NewSession {
        name: body.session_name,
        kind: SessionKind::AGENT,
        owner: caller.owner.clone(),
        options,
        ephemeral: true,
        origin: None,
        metadata: Default::default(),
    };
    Ok((new, prompt))
}

/// Streams a run's turn, once its session is stored.
pub(crate) async fn answer_run(
    headers: &HeaderMap,
    turn: crate::session::StartedTurn,
) -> Result<Response, ApiError> {
    // The session is stored by the turn's first write: answer once it is,
    // with its first event, or with an error when the store refused it.
    let mut events = Box::pin(futures::StreamExt::peekable(
        turn.session.subscribe(turn.since, true),
    ));
    if events.as_mut().peek().await.is_none() {
        turn.cancel.cancel();
        // Why: a store that cannot be reached now is a 503 to retry.
        if let Err(e @ crate::store::StoreError::Unavailable(_)) = turn.session.flush().await {
            return Err(ApiError::store(e));
        }
        return Err(ApiError::internal(format!(
            "session {}: the run's first write was refused by the store",
            turn.session.id
        )));
    }
    Ok(events_response(
        headers,
        cancel_on_hangup(events, turn.cancel),
    ))
}

/// Creates a persistent session for multi-turn conversations.
#[utoipa::path(post, path = "/agent/session", request_body = CreateSessionRequest,
    responses((status = 201, body = CreatedSession), (status = 400, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn create_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Body(body): Body<CreateSessionRequest>,
) -> Result<(StatusCode, Json<CreatedSession>), ApiError> {
    let created = create_session_from(&state, &caller, body).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// Makes the session a create request asks for.
pub(crate) async fn create_session_from(
    state: &AppState,
    caller: &Caller,
    body: CreateSessionRequest,
) -> Result<CreatedSession, ApiError> {
    let kind = body
        .kind
        .unwrap_or_else(|| SessionKind::AGENT.as_str().to_owned());
    let task = state.sessions.tasks().require(&kind, "kind")?;
    let body_options = options_body(body.options, body.flat);
    let options = as_written(task.as_ref(), &body_options, &["session_name"]).await?;
    let seed = crate::api::routes::fork::checked_sandbox(state, caller, &options).await?;
    let name = body.session_name;
    let kind = SessionKind::new(kind);
    let session = state
        .sessions
        .create(NewSession {
            name,
            kind,
            owner: caller.owner.clone(),
            options,
            ephemeral: false,
            origin: None,
            metadata: Default::default(),
        })
        .await?;
    if let Some(snapshot) = seed {
        crate::api::routes::fork::pin(state, &snapshot, session.id).await?;
    }
    Ok(CreatedSession {
        session_id: session.id,
        session_name: session.name.clone(),
        status: "created".into(),
        uploaded: Vec::new(),
    })
}

/// Sends a prompt to a session and streams the turn. The turn goes on if
/// the client disconnects; replay it from `/events`.
#[utoipa::path(post, path = "/agent/session/{session_id}/message", request_body = MessageRequest,
    params(("session_id" = Uuid, Path)),
    responses((status = 200, description = "NDJSON stream of the turn's events", content_type = "application/x-ndjson", body = crate::protocol::Event),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn message(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Body(body): Body<MessageRequest>,
) -> Result<Response, ApiError> {
    let session = state
        .sessions
        .get_to_start(parse_id(&id)?, caller.owner())
        .await?;
    let prompt = required_text("prompt", body.prompt)?;
    let queue = body.queue.unwrap_or(false);
    deny_rest(&body.rest)?;
    let turn = state.sessions.start_turn(session, prompt, queue).await?;
    Ok(events_response(
        &headers,
        turn.session.subscribe(turn.since, true),
    ))
}

/// Compacts an agent session's history now: a turn of its own that
/// summarises the older part of what the model is sent (a `compacted`
/// event, or a `status` when there is nothing to compact), streamed as a
/// message's turn is. Refused while a turn runs (409).
#[utoipa::path(post, path = "/agent/session/{session_id}/compact", params(("session_id" = Uuid, Path)),
    responses((status = 200, description = "NDJSON stream of the compaction's turn", content_type = "application/x-ndjson", body = crate::protocol::Event),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn compact(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let session = state
        .sessions
        .get_to_start(parse_id(&id)?, caller.owner())
        .await?;
    if session.kind != SessionKind::AGENT {
        return Err(ApiError::unprocessable(
            "no_history",
            format!(
                "a {} session has no conversation to compact; only agent sessions do",
                session.kind
            ),
        ));
    }
    if state.sessions.is_draining() {
        return Err(SessionError::ShuttingDown.into());
    }
    let options = TurnOptions {
        compact: true,
        ..TurnOptions::default()
    };
    let turn = state
        .sessions
        .start_turn_with(session, String::new(), false, options)
        .await?;
    Ok(events_response(
        &headers,
        turn.session.subscribe(turn.since, true),
    ))
}

/// Stops the session's running turn; it ends with an `interrupted` result.
/// With replicas, answered once the replica running the turn has it: 503
/// when the bus is down or no replica took it while the turn still runs.
#[utoipa::path(post, path = "/agent/session/{session_id}/interrupt", params(("session_id" = Uuid, Path)),
    responses((status = 200, body = InterruptBody), (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn interrupt(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<InterruptBody>, ApiError> {
    let session = state.sessions.get(parse_id(&id)?, caller.owner()).await?;
    let interrupted = state.sessions.interrupt(&session).await?;
    Ok(Json(InterruptBody {
        session_id: session.id,
        interrupted,
    }))
}

/// Status, history, usage and sandbox of a session.
#[utoipa::path(get, path = "/agent/session/{session_id}/status", params(("session_id" = Uuid, Path)),
    responses((status = 200, body = SessionStatusBody), (status = 404, body = ErrorBody)))]
pub async fn status(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<SessionStatusBody>, ApiError> {
    let session = state.sessions.get(parse_id(&id)?, caller.owner()).await?;
    let history = state.sessions.history(&session).await?;
    let details = state
        .sessions
        .tasks()
        .get(session.kind.as_str())
        .map(|task| task.describe(&session.options))
        .unwrap_or_default();
    Ok(Json(SessionStatusBody {
        session_id: session.id,
        session_name: session.name.clone(),
        kind: session.kind.clone(),
        status: session.status(),
        running: session.is_running(),
        ephemeral: session.ephemeral,
        origin: session.origin.clone(),
        options: (*session.options).clone(),
        details,
        history,
        usage: session.usage(),
        context: state.sessions.context_use(&session).await?,
        last_seq: session.last_seq(),
        sandbox: match &state.sandboxes {
            Some(sandboxes) => sandboxes.info(session.id).await,
            None => None,
        },
        gateway_calls: state
            .gateway
            .traces
            .query(
                crate::gateway::trace::OwnerFilter::Any,
                Some(&session.id.to_string()),
                None,
                STATUS_GATEWAY_CALLS,
            )
            .iter()
            .map(|t| {
                serde_json::json!({"trace_id": t.id, "ts": t.ts, "model": t.model,
                    "replica": t.replica, "status": t.status, "http_status": t.http_status,
                    "latency_ms": t.latency_ms, "ttft_ms": t.ttft_ms, "retries": t.retries,
                    "usage": t.usage})
            })
            .collect(),
        created_at: session.created_at,
        updated_at: session.updated_at(),
    }))
}

/// Replays a session's events after `since`; with `follow=true` the stream
/// stays open for new ones.
#[utoipa::path(get, path = "/agent/session/{session_id}/events", params(("session_id" = Uuid, Path), EventsQuery),
    responses((status = 200, description = "NDJSON stream of events", content_type = "application/x-ndjson", body = crate::protocol::Event),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn events(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let session = state.sessions.get(parse_id(&id)?, caller.owner()).await?;
    let since = query.since.unwrap_or(0);
    Ok(if query.follow.unwrap_or(false) {
        events_response(&headers, session.subscribe(since, false))
    } else {
        events_response(&headers, session.replay(since))
    })
}

/// Deletes a session: its turn is stopped, its sandbox destroyed, its data removed.
#[utoipa::path(delete, path = "/agent/session/{session_id}", params(("session_id" = Uuid, Path)),
    responses((status = 200, body = DeletedBody), (status = 404, body = ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<DeletedBody>, ApiError> {
    let id = parse_id(&id)?;
    state.sessions.delete(id, caller.owner()).await?;
    Ok(Json(DeletedBody {
        session_id: id,
        status: "deleted".into(),
    }))
}
