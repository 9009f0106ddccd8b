//! AG-UI (spec 1.0): `POST /ag-ui/{agent}` runs an agent on a thread and
//! answers the run as a Server-Sent Events stream of AG-UI events.
//!
//! A thread is a Conclave session: made on the thread's first run, with
//! the thread id as its id and the caller's key as its owner, so another
//! key's thread is "not found" like its session. Each run sends the last
//! user message as the session's next turn and maps the turn's events
//! ([`events`]); a run on a thread that has turns starts with a
//! `MESSAGES_SNAPSHOT` of its history. A tool call waiting for approval
//! ends the run with an `interrupt` outcome; the next run's `resume`
//! decides it and streams the rest of the same turn. The front-end's
//! `tools` are offered to the model for the run; a call of one ends the
//! run with the call pending, and the next run's tool messages answer it. `docs/ag-ui.md` has
//! the table of what maps to what.

mod events;
mod reasoning;

use std::convert::Infallible;
use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, State};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::stream::{self, BoxStream};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::api::http::auth::Caller;
use crate::api::http::error::{ApiError, ErrorBody};
use crate::api::http::extract::JsonObject;
use crate::api::http::state::AppState;
use crate::model::ToolSpec;
use crate::protocol::{Event, EventKind, SessionKind};
use crate::session::{Session, SessionError, ToolAnswer, TurnOptions};
use events::{Mapper, messages_snapshot};

/// The fields of AG-UI's `RunAgentInput` that Conclave reads; `context`,
/// `parentRunId` and `protocolVersion` are accepted and not used.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RunAgentInput {
    thread_id: String,
    run_id: String,
    #[serde(default)]
    messages: Vec<Value>,
    #[serde(default)]
    tools: Vec<Value>,
    #[serde(default)]
    forwarded_props: Option<Value>,
    #[serde(default)]
    resume: Vec<ResumeEntry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResumeEntry {
    interrupt_id: String,
    status: String,
    #[serde(default)]
    payload: Option<Value>,
}

/// Runs `agent` (a configured profile or a session kind) on the input's
/// thread and streams the run as AG-UI events.
#[utoipa::path(post, path = "/ag-ui/{agent}", params(("agent" = String, Path)),
    request_body(content = Object, description = "AG-UI RunAgentInput"),
    responses((status = 200, description = "SSE stream of AG-UI events", content_type = "text/event-stream"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub async fn run(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(agent): Path<String>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let input: RunAgentInput = serde_json::from_value(Value::Object(body))
        .map_err(|e| ApiError::invalid("body", format!("not an AG-UI RunAgentInput: {e}")))?;
    let thread = Uuid::parse_str(&input.thread_id).map_err(|_| {
        ApiError::invalid(
            "threadId",
            "must be a UUID: a thread is a Conclave session, and its id names it",
        )
    })?;
    let profile = crate::agent::profiles::resolve(&state.config, state.sessions.tasks(), &agent)
        .ok_or_else(|| ApiError::not_found(format!("agent {agent} not found")))?;
    let existing = match state.sessions.get(thread, caller.owner()).await {
        Ok(session) => Some(session),
        Err(SessionError::NotFound(_)) => {
            // Another key's thread must not be made again under this key,
            // nor told apart from one that does not exist.
            if state.sessions.record(thread).await?.is_some() {
                return Err(SessionError::NotFound(thread).into());
            }
            None
        }
        Err(e) => return Err(e.into()),
    };
    let mut mapper = Mapper::new(input.thread_id.clone(), input.run_id.clone());
    let started = mapper.run_started();
    let opening = stream::iter([started]);
    let rest = match begin(
        &state,
        &caller,
        &profile,
        thread,
        existing,
        &input,
        &mut mapper,
    )
    .await
    {
        Ok(run) => run,
        Err(e) => {
            let error = mapper.run_error(&e.message(), e.code());
            return Ok(sse(opening.chain(stream::iter([error]))));
        }
    };
    Ok(sse(opening
        .chain(stream::iter(rest.opening))
        .chain(mapped(rest.events, mapper))))
}

/// A run under way: what it opens with, and the session events to map.
struct Begun {
    opening: Vec<Value>,
    events: BoxStream<'static, Arc<Event>>,
}

/// Why a run could not begin; it goes out as `RUN_ERROR`.
enum Refusal {
    Api(ApiError),
    Input(String),
}

impl Refusal {
    fn message(&self) -> String {
        match self {
            Refusal::Api(e) => e.message.clone(),
            Refusal::Input(message) => message.clone(),
        }
    }

    fn code(&self) -> &'static str {
        match self {
            Refusal::Api(e) => e.code,
            Refusal::Input(_) => "invalid_input",
        }
    }
}

impl From<ApiError> for Refusal {
    fn from(e: ApiError) -> Refusal {
        Refusal::Api(e)
    }
}

impl From<SessionError> for Refusal {
    fn from(e: SessionError) -> Refusal {
        Refusal::Api(e.into())
    }
}

async fn begin(
    state: &AppState,
    caller: &Caller,
    profile: &crate::agent::profiles::Agent,
    thread: Uuid,
    existing: Option<Arc<Session>>,
    input: &RunAgentInput,
    mapper: &mut Mapper,
) -> Result<Begun, Refusal> {
    let turn_options = TurnOptions {
        client_tools: client_tools(&input.tools)?,
        tool_answers: tool_answers(&input.messages),
        ..TurnOptions::default()
    };
    let mut opening = Vec::new();
    let kind = profile.kind.as_str();
    if let Some(session) = &existing
        && session.kind.as_str() != kind
    {
        return Err(Refusal::Input(format!(
            "this thread is a {} session: run it with an agent of that kind, not {} ({kind})",
            session.kind.as_str(),
            profile.name
        )));
    }
    if kind != SessionKind::AGENT.as_str() {
        opening.push(mapper.state_snapshot(kind));
    }
    if !input.resume.is_empty() {
        let Some(session) = existing else {
            return Err(Refusal::Input(
                "`resume` answers an interrupt of this thread, which has none".into(),
            ));
        };
        let since = resume(state, caller, &session, &input.resume).await?;
        return Ok(Begun {
            opening,
            events: session.subscribe(since, true),
        });
    }
    let answers = turn_options.tool_answers.len();
    let prompt = last_user_text(&input.messages).or_else(|| (answers > 0).then(String::new));
    let session = match (existing, prompt.as_deref()) {
        (Some(session), prompt) => {
            let history = state.sessions.history(&session).await?;
            // A client that holds fewer messages than the thread (a page
            // opened again) gets them all first; one that sent them all
            // (HttpAgent keeps its messages) needs none.
            let sent = if answers > 0 {
                answers
            } else {
                usize::from(prompt.is_some())
            };
            let prior = input.messages.len() - sent;
            if prior < history.len() {
                let mut snapshot = messages_snapshot(&session.id.to_string(), &history);
                let id = input.messages.last().and_then(|m| m.get("id")).cloned();
                let prompt = prompt.filter(|p| !p.is_empty());
                if let (Some(prompt), Some(messages)) =
                    (prompt, snapshot["messages"].as_array_mut())
                {
                    // The snapshot replaces the client's messages: it ends
                    // with the one this run sends, under the client's id.
                    messages.push(json!({"id": id, "role": "user", "content": prompt}));
                }
                opening.push(snapshot);
            }
            if prompt.is_none() {
                // A run with no new user message only reconnects.
                opening.push(mapper.run_finished());
                return Ok(Begun {
                    opening,
                    events: stream::empty().boxed(),
                });
            }
            session
        }
        (None, Some(prompt)) if !prompt.is_empty() => {
            create(state, caller, profile, thread, input).await?
        }
        (None, _) => {
            return Err(Refusal::Input(
                "`messages` must end with a user message with text content".into(),
            ));
        }
    };
    let prompt = prompt.unwrap_or_default();
    if state.sessions.is_draining() {
        return Err(SessionError::ShuttingDown.into());
    }
    let turn = state
        .sessions
        .start_turn_with(session, prompt, false, turn_options)
        .await?;
    Ok(Begun {
        opening,
        events: turn.session.subscribe(turn.since, true),
    })
}

/// A new thread: a session of the agent's kind with its options and the
/// input's `forwardedProps` merged on top.
async fn create(
    state: &AppState,
    caller: &Caller,
    profile: &crate::agent::profiles::Agent,
    thread: Uuid,
    input: &RunAgentInput,
) -> Result<Arc<Session>, Refusal> {
    let overrides = match &input.forwarded_props {
        None | Some(Value::Null) => None,
        Some(Value::Object(props)) => Some(props),
        Some(_) => {
            return Err(Refusal::Input(
                "`forwardedProps` must be an object of session options".into(),
            ));
        }
    };
    let opening = crate::api::routes::agents::Opening {
        id: Some(thread),
        overrides,
        ephemeral: false,
        origin: "agui",
        metadata: Default::default(),
        field: "kind",
    };
    Ok(crate::api::routes::agents::open_session(state, caller, profile, opening).await?)
}

/// Decides the interrupts the entries answer (`resolved` with the
/// decision body as `payload`, `allow` when it has none; `cancelled` is a
/// deny) and answers the `seq` the rest of the turn streams after: the
/// first answered call's `approval_requested`.
async fn resume(
    state: &AppState,
    caller: &Caller,
    session: &Arc<Session>,
    entries: &[ResumeEntry],
) -> Result<u64, Refusal> {
    let mut since = None;
    for entry in entries {
        let body = match (entry.status.as_str(), &entry.payload) {
            ("cancelled", _) => json!({"decision": "deny", "message": "cancelled by the user"}),
            ("resolved", Some(payload)) => payload.clone(),
            ("resolved", None) => json!({"decision": "allow"}),
            (other, _) => {
                return Err(Refusal::Input(format!(
                    "resume status {other:?}: must be resolved or cancelled"
                )));
            }
        };
        let decision = crate::api::routes::approvals::parse_decision(body)?;
        let asked = asked_at(session, &entry.interrupt_id).await;
        crate::api::routes::approvals::decide(
            state,
            caller,
            session,
            &entry.interrupt_id,
            decision,
        )
        .await?;
        since = since.or(asked);
    }
    since.ok_or_else(|| Refusal::Input("no interrupt of this thread has these ids".into()))
}

/// The `seq` just before the call's `approval_requested`, so that the
/// stream goes on from it (the request itself is not sent again).
async fn asked_at(session: &Session, call_id: &str) -> Option<u64> {
    let events: Vec<Arc<Event>> = session.replay(0).collect().await;
    events.iter().rev().find_map(|e| match &e.kind {
        EventKind::ApprovalRequested { call_id: id, .. } if id == call_id => Some(e.seq),
        _ => None,
    })
}

/// The front-end's tools, offered to the model for this run.
fn client_tools(tools: &[Value]) -> Result<Vec<ToolSpec>, Refusal> {
    tools
        .iter()
        .map(|tool| {
            let name = tool.get("name").and_then(Value::as_str);
            let Some(name) = name.filter(|n| !n.is_empty()) else {
                return Err(Refusal::Input("each of `tools` needs a `name`".into()));
            };
            Ok(ToolSpec {
                name: name.to_owned(),
                description: text(tool.get("description")).unwrap_or_default(),
                input_schema: Arc::new(
                    tool.get("parameters")
                        .filter(|p| p.is_object())
                        .cloned()
                        .unwrap_or_else(|| json!({"type": "object"})),
                ),
                read_only: false,
            })
        })
        .collect()
}

/// The tool messages the input ends with: the front-end's answers to the
/// calls of its tools that ended the last run.
fn tool_answers(messages: &[Value]) -> Vec<ToolAnswer> {
    let mut answers: Vec<ToolAnswer> = messages
        .iter()
        .rev()
        .take_while(|m| m.get("role").and_then(Value::as_str) == Some("tool"))
        .filter_map(|m| {
            Some(ToolAnswer {
                call_id: m.get("toolCallId")?.as_str()?.to_owned(),
                content: text(m.get("content")).unwrap_or_default(),
                is_error: m.get("error").is_some_and(|e| !e.is_null()),
            })
        })
        .collect();
    answers.reverse();
    answers
}

/// A message's content as text: a string, or its text parts joined.
fn text(content: Option<&Value>) -> Option<String> {
    match content? {
        Value::String(text) => Some(text.clone()),
        Value::Array(parts) => Some(
            parts
                .iter()
                .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        _ => None,
    }
}

/// The text of the last message when it is the user's.
fn last_user_text(messages: &[Value]) -> Option<String> {
    let last = messages.last()?;
    if last.get("role")?.as_str()? != "user" {
        return None;
    }
    let text = text(last.get("content"))?;
    (!text.trim().is_empty()).then_some(text)
}

/// The session's events as AG-UI events, up to the one that ends the run.
fn mapped(
    events: BoxStream<'static, Arc<Event>>,
    mapper: Mapper,
) -> impl Stream<Item = Value> + Send + 'static {
    stream::unfold(
        (events, mapper, false),
        |(mut events, mut mapper, done)| async move {
            if done {
                return None;
            }
            let event = events.next().await?;
            let mapped = mapper.map(&event);
            Some((stream::iter(mapped.events), (events, mapper, mapped.done)))
        },
    )
    .flatten()
}

/// AG-UI's SSE encoding: each event one `data:` line of JSON.
fn sse(events: impl Stream<Item = Value> + Send + 'static) -> Response {
    let events =
        events.map(|event| Ok::<_, Infallible>(SseEvent::default().data(event.to_string())));
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}
