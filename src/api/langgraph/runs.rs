//! Runs: turns of a thread's session. A run streams the turn's events
//! mapped onto the stream modes asked for; its id is the `seq` the turn
//! started after, so joining it reads the session's log from there.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::{Stream, StreamExt, stream};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::threads::new_session;
use super::{assistant, current_values, prompt_of, thread_id};
use crate::api::http::auth::Caller;
use crate::api::http::error::ApiError;
use crate::api::http::extract::{ApiQuery, JsonObject};
use crate::api::http::state::AppState;
use crate::api::http::stream::cancel_on_hangup;
use crate::protocol::{Event, EventKind, ResultStatus};
use crate::session::{Session, SessionError, StartedTurn, TurnOptions};

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Values,
    Updates,
    MessagesTuple,
    Events,
    Custom,
}

impl Mode {
    pub(super) fn parse(name: &str) -> Result<Mode, ApiError> {
        Ok(match name {
            "values" => Mode::Values,
            "updates" => Mode::Updates,
            "messages-tuple" => Mode::MessagesTuple,
            "events" => Mode::Events,
            "custom" => Mode::Custom,
            other => {
                return Err(ApiError::invalid(
                    "stream_mode",
                    format!(
                        "{other:?} is not served: use values, updates, messages-tuple, events or custom"
                    ),
                ));
            }
        })
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Strategy {
    Reject,
    Enqueue,
    Interrupt,
    Rollback,
}

/// A run as the request asks for it.
pub(super) struct RunRequest {
    pub(super) prompt: String,
    pub(super) assistant_id: String,
    pub(super) modes: Vec<Mode>,
    pub(super) strategy: Strategy,
}

fn run_request(body: &mut JsonObject) -> Result<RunRequest, ApiError> {
    let assistant_id = body.take_text("assistant_id")?;
    let prompt = prompt_of(body.0.get("input"))?;
    run_options(body, assistant_id, prompt)
}

/// The rest of a run's request: its stream modes and multitask strategy.
pub(super) fn run_options(
    body: &mut JsonObject,
    assistant_id: String,
    prompt: String,
) -> Result<RunRequest, ApiError> {
    if body.0.get("command").is_some_and(|c| !c.is_null()) {
        return Err(ApiError::invalid(
            "command",
            "is not served: a Conclave turn does not pause for a resume",
        ));
    }
    let modes = match body.take::<Value>("stream_mode")? {
        None | Some(Value::Null) => vec![Mode::Values],
        Some(Value::String(mode)) => vec![Mode::parse(&mode)?],
        Some(Value::Array(modes)) => modes
            .iter()
            .map(|m| Mode::parse(m.as_str().unwrap_or("")))
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::invalid(
                "stream_mode",
                "must be a string or a list",
            ));
        }
    };
    let strategy = match body.take::<String>("multitask_strategy")?.as_deref() {
        None | Some("reject") => Strategy::Reject,
        Some("enqueue") => Strategy::Enqueue,
        Some("interrupt") => Strategy::Interrupt,
        Some("rollback") => Strategy::Rollback,
        Some(other) => {
            return Err(ApiError::invalid(
                "multitask_strategy",
                format!("{other:?}: must be reject, enqueue, interrupt or rollback"),
            ));
        }
    };
    Ok(RunRequest {
        prompt,
        assistant_id,
        modes,
        strategy,
    })
}

/// Marks a run id as one of this adapter's (bytes 0..6 of a version 8
/// UUID, whose bytes 9..16 hold the seq).
const RUN_TAG: [u8; 6] = *b"cl-run";

/// A run id: the `seq` its turn started after, as a version 8 UUID (so a
/// thread's first run is not the nil UUID).
fn run_id(since: u64) -> Uuid {
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&RUN_TAG);
    bytes[9..].copy_from_slice(&since.to_be_bytes()[1..]);
    Uuid::new_v8(bytes)
}

fn run_since(id: &str) -> Result<u64, ApiError> {
    let parsed = Uuid::parse_str(id)
        .ok()
        .filter(|u| u.get_version_num() == 8 && u.as_bytes()[..6] == RUN_TAG);
    match parsed {
        Some(u) => {
            let mut seq = [0u8; 8];
            seq[1..].copy_from_slice(&u.as_bytes()[9..]);
            Ok(u64::from_be_bytes(seq))
        }
        None => Err(ApiError::not_found(format!("run {id} not found"))),
    }
}

/// Starts the turn under the run's multitask strategy: `reject` is the
/// session's own 409, `enqueue` its queue, `interrupt` stops the running
/// turn and then queues behind it, `rollback` does the same and then
/// rewinds the session to the turn end before the stopped turn, so that
/// nothing of it is left in the thread.
pub(super) async fn start(
    state: &AppState,
    session: Arc<Session>,
    run: &RunRequest,
) -> Result<StartedTurn, ApiError> {
    let mut options = TurnOptions::default();
    let queue = match run.strategy {
        Strategy::Reject => false,
        Strategy::Enqueue => true,
        Strategy::Interrupt => {
            session.interrupt();
            true
        }
        Strategy::Rollback => {
            // Read before the interrupt: the stopped turn's result comes
            // after it, so the last turn end up to here is the one before.
            let before = session.last_seq();
            if session.interrupt() {
                options.rewind_to = Some(before);
            }
            true
        }
    };
    if state.sessions.is_draining() {
        return Err(SessionError::ShuttingDown.into());
    }
    Ok(state
        .sessions
        .start_turn_with(session, run.prompt.clone(), queue, options)
        .await?)
}

/// The run a body asks for, started on the thread.
async fn thread_run(
    state: &AppState,
    caller: &Caller,
    id: &str,
    body: &mut JsonObject,
) -> Result<(RunRequest, StartedTurn), ApiError> {
    let run = run_request(body)?;
    let session = thread(state, caller, id, &run).await?;
    let turn = start(state, session, &run).await?;
    Ok((run, turn))
}

/// The run a body asks for, started on a new ephemeral session of its
/// assistant.
async fn stateless_run(
    state: &AppState,
    caller: &Caller,
    body: &mut JsonObject,
) -> Result<(RunRequest, StartedTurn), ApiError> {
    let run = run_request(body)?;
    let agent = assistant(state, &run.assistant_id)?;
    let session = new_session(state, caller, &agent, true, Map::new()).await?;
    let turn = start(state, session, &run).await?;
    Ok((run, turn))
}

/// The thread's session and where a run of it started; another key's
/// thread, or a run past the log's end, is a 404.
async fn run_of(
    state: &AppState,
    caller: &Caller,
    id: &str,
    run: &str,
) -> Result<(Arc<Session>, u64), ApiError> {
    let session = state.sessions.get(thread_id(id)?, caller.owner()).await?;
    let since = run_since(run)?;
    if since > session.last_seq() {
        return Err(ApiError::not_found(format!("run {run} not found")));
    }
    Ok((session, since))
}

/// The thread's session, checked against the run's assistant: a thread
/// runs the session kind it was made with.
pub(super) async fn thread(
    state: &AppState,
    caller: &Caller,
    id: &str,
    run: &RunRequest,
) -> Result<Arc<Session>, ApiError> {
    let agent = assistant(state, &run.assistant_id)?;
    let session = state.sessions.get(thread_id(id)?, caller.owner()).await?;
    if agent.kind != session.kind.as_str() {
        return Err(ApiError::invalid(
            "assistant_id",
            format!(
                "{} runs {} sessions; this thread is a {} session",
                agent.name, agent.kind, session.kind
            ),
        ));
    }
    Ok(session)
}

fn run_json(session: &Session, since: u64, assistant_id: &str, status: &str) -> Value {
    json!({
        "run_id": run_id(since),
        "thread_id": session.id,
        "assistant_id": assistant_id,
        "status": status,
        "created_at": session.updated_at(),
        "updated_at": session.updated_at(),
        "metadata": {},
        "kwargs": {},
        "multitask_strategy": "reject",
    })
}

fn location(session: &Session, since: u64) -> HeaderValue {
    HeaderValue::from_str(&format!(
        "/langgraph/threads/{}/runs/{}",
        session.id,
        run_id(since)
    ))
    .unwrap_or(HeaderValue::from_static("/langgraph/runs"))
}

/// `POST /threads/{id}/runs`: a background run; join it to wait.
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    mut body: JsonObject,
) -> Result<Response, ApiError> {
    let (run, turn) = thread_run(&state, &caller, &id, &mut body).await?;
    let mut response = Json(run_json(
        &turn.session,
        turn.since,
        &run.assistant_id,
        "pending",
    ))
    .into_response();
    response.headers_mut().insert(
        header::CONTENT_LOCATION,
        location(&turn.session, turn.since),
    );
    Ok(response)
}

/// `POST /threads/{id}/runs/stream`: the turn as SSE. The turn goes on if
/// the client leaves; join it later.
pub async fn stream(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    mut body: JsonObject,
) -> Result<Response, ApiError> {
    let (run, turn) = thread_run(&state, &caller, &id, &mut body).await?;
    let events = turn.session.subscribe(turn.since, true);
    Ok(sse(&state, &turn, run.modes, events))
}

/// `POST /runs/stream`: a run on a new ephemeral session of the assistant,
/// cancelled when the client leaves.
pub async fn stream_stateless(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    mut body: JsonObject,
) -> Result<Response, ApiError> {
    let (run, turn) = stateless_run(&state, &caller, &mut body).await?;
    let events = cancel_on_hangup(
        turn.session.subscribe(turn.since, true),
        turn.cancel.clone(),
    );
    Ok(sse(&state, &turn, run.modes, events))
}

/// Waits for the turn after `since` to end; its thread's values then, with
/// `__error__` when it failed (the SDK raises it).
pub(super) async fn finish(
    state: &AppState,
    session: &Session,
    since: u64,
) -> Result<Value, ApiError> {
    let mut events = session.subscribe(since, true);
    let mut failed = None;
    while let Some(event) = events.next().await {
        if let EventKind::Result { status, result, .. } = &event.kind
            && *status == ResultStatus::Error
        {
            failed = Some(result.clone().unwrap_or_default());
        }
    }
    let mut values = current_values(state, session).await?;
    if let Some(message) = failed {
        values["__error__"] = json!({"error": "error", "message": message});
    }
    Ok(values)
}

/// `POST /threads/{id}/runs/wait`: the thread's values after the turn.
pub async fn wait(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    mut body: JsonObject,
) -> Result<Json<Value>, ApiError> {
    let (_, turn) = thread_run(&state, &caller, &id, &mut body).await?;
    Ok(Json(finish(&state, &turn.session, turn.since).await?))
}

/// `POST /runs/wait`: a run on a new ephemeral session.
pub async fn wait_stateless(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    mut body: JsonObject,
) -> Result<Json<Value>, ApiError> {
    let (_, turn) = stateless_run(&state, &caller, &mut body).await?;
    Ok(Json(finish(&state, &turn.session, turn.since).await?))
}

/// How the run after `since` ended, `None` while it has not.
pub(super) async fn ended(session: &Session, since: u64) -> Option<&'static str> {
    let mut events = session.replay(since);
    while let Some(event) = events.next().await {
        if let EventKind::Result { status, .. } = &event.kind {
            return Some(match status {
                ResultStatus::Success => "success",
                ResultStatus::Interrupted => "interrupted",
                ResultStatus::TimedOut => "timeout",
                _ => "error",
            });
        }
    }
    None
}

/// `GET /threads/{id}/runs/{run}`: the run and how it ended, if it has.
pub async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, run)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let (session, since) = run_of(&state, &caller, &id, &run).await?;
    let status = match ended(&session, since).await {
        Some(status) => status,
        None if session.is_running() => "running",
        None => "pending",
    };
    Ok(Json(run_json(
        &session,
        since,
        &session.kind.to_string(),
        status,
    )))
}

/// `GET /threads/{id}/runs/{run}/join`: waits for the run to end.
pub async fn join(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, run)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let (session, since) = run_of(&state, &caller, &id, &run).await?;
    Ok(Json(finish(&state, &session, since).await?))
}

#[derive(Deserialize)]
pub struct CancelQuery {
    wait: Option<u8>,
    action: Option<String>,
}

/// `POST /threads/{id}/runs/{run}/cancel`: interrupts the session's turn;
/// with `wait=1`, answers once it has ended.
pub async fn cancel(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, run)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<CancelQuery>,
) -> Result<Response, ApiError> {
    if query.action.as_deref().is_some_and(|a| a != "interrupt") {
        return Err(ApiError::invalid("action", "only interrupt is served"));
    }
    let (session, since) = run_of(&state, &caller, &id, &run).await?;
    session.interrupt();
    if query.wait == Some(1) {
        finish(&state, &session, since).await?;
    }
    Ok(StatusCode::ACCEPTED.into_response())
}

/// The SSE response of a run: `metadata` first, then each event mapped
/// onto the modes asked for.
fn sse(
    state: &AppState,
    turn: &StartedTurn,
    modes: Vec<Mode>,
    events: impl Stream<Item = Arc<Event>> + Send + 'static,
) -> Response {
    let named = (run_id(turn.since), location(&turn.session, turn.since));
    sse_of(
        state,
        (turn.session.clone(), turn.since),
        named,
        modes,
        events,
    )
}

/// [`sse`] of the run after `since` on `session`, named `run` and found at
/// `location`.
pub(super) fn sse_of(
    state: &AppState,
    (session, since): (Arc<Session>, u64),
    (run, location): (Uuid, HeaderValue),
    modes: Vec<Mode>,
    events: impl Stream<Item = Arc<Event>> + Send + 'static,
) -> Response {
    let meta = json!({"run_id": run, "thread_id": session.id});
    let first = stream::iter([frame("metadata", &meta)]);
    let state = state.clone();
    let texts = Arc::new(Texts {
        run: since,
        streamed: AtomicBool::new(false),
        done: AtomicU64::new(0),
    });
    let mapped = events
        .then(move |event| {
            let (state, session, texts, modes) =
                (state.clone(), session.clone(), texts.clone(), modes.clone());
            async move { frames(&state, &session, &modes, &texts, &event).await }
        })
        .flat_map(stream::iter);
    let mut response = Sse::new(first.chain(mapped))
        .keep_alive(KeepAlive::default())
        .into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_LOCATION, location);
    response
}

/// Where a run's assistant texts are: a text's deltas and its whole
/// `thinking` share one message id, so that a client merges the chunks.
struct Texts {
    run: u64,
    /// Deltas came for the text under way: its whole text is not sent again.
    streamed: AtomicBool,
    /// Texts finished so far.
    done: AtomicU64,
}

impl Texts {
    fn chunk(&self, content: &str) -> Value {
        let id = format!("run-{}-{}", self.run, self.done.load(Ordering::Relaxed));
        json!({"type": "AIMessageChunk", "id": id, "content": content})
    }
}

fn frame(name: &str, data: &Value) -> Result<SseEvent, Infallible> {
    Ok(SseEvent::default().event(name).data(data.to_string()))
}

/// The frames one Conclave event makes in each mode asked for.
async fn frames(
    state: &AppState,
    session: &Session,
    modes: &[Mode],
    texts: &Texts,
    event: &Event,
) -> Vec<Result<SseEvent, Infallible>> {
    let meta = json!({"thread_id": session.id, "langgraph_node": "agent"});
    let mut out = Vec::new();
    for mode in modes {
        match (mode, &event.kind) {
            (Mode::Events, _) => out.push(frame("events", &json!(event))),
            (
                Mode::Custom,
                EventKind::Status { .. }
                | EventKind::ToolOutput { .. }
                | EventKind::Intervention { .. }
                | EventKind::ApprovalRequested { .. }
                | EventKind::ApprovalDecided { .. },
            ) => out.push(frame("custom", &json!(event))),
            // The model's reasoning is in `events` alone: LangGraph's
            // messages carry what the model answered.
            (
                _,
                EventKind::TextDelta {
                    reasoning: true, ..
                }
                | EventKind::Thinking {
                    reasoning: true, ..
                },
            ) => {}
            (Mode::MessagesTuple, EventKind::TextDelta { content, .. }) => {
                texts.streamed.store(true, Ordering::Relaxed);
                out.push(frame("messages", &json!([texts.chunk(content), meta])));
            }
            // A whole text only where no deltas came (a session streams
            // deltas only with `text_deltas`).
            (Mode::MessagesTuple, EventKind::Thinking { content, .. })
                if !texts.streamed.load(Ordering::Relaxed) =>
            {
                out.push(frame("messages", &json!([texts.chunk(content), meta])));
            }
            (Mode::Updates, EventKind::Thinking { content, .. }) => {
                let message = json!({"type": "ai", "content": content});
                out.push(frame("updates", &json!({"agent": {"messages": [message]}})));
            }
            (
                Mode::Updates,
                EventKind::ToolResult {
                    id, tool, output, ..
                },
            ) => {
                let message =
                    json!({"type": "tool", "tool_call_id": id, "name": tool, "content": output});
                out.push(frame("updates", &json!({"tools": {"messages": [message]}})));
            }
            (Mode::Values, EventKind::Result { .. }) => {
                let values = current_values(state, session).await.unwrap_or_default();
                out.push(frame("values", &values));
            }
            _ => {}
        }
    }
    if let EventKind::Thinking {
        reasoning: false, ..
    } = &event.kind
    {
        texts.streamed.store(false, Ordering::Relaxed);
        texts.done.fetch_add(1, Ordering::Relaxed);
    }
    if let EventKind::Error { message, code } = &event.kind {
        out.push(frame("error", &json!({"error": code, "message": message})));
    }
    out
}

#[cfg(test)]
#[path = "runs_tests.rs"]
mod tests;
