//! The Agent Protocol's own routes (agentprotocol.ai), beside the LangGraph
//! Platform API's: agents, and runs with ids of their own
//! (`/runs/{run_id}`). A run's id names no thread, so each run keeps a
//! record in the caller's KV namespace (`langgraph/runs/{run_id}`): the
//! session it runs on and the `seq` its turn started after. Everything
//! else is read from the session, as the thread routes read it.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::runs::{self, Mode, RunRequest};
use super::threads::new_session;
use super::{assistant, prompt_of, thread_id};
use crate::agent::profiles::{self, Agent};
use crate::api::http::auth::Caller;
use crate::api::http::error::ApiError;
use crate::api::http::extract::{ApiQuery, JsonObject};
use crate::api::http::state::AppState;
use crate::api::http::stream::cancel_on_hangup;
use crate::api::routes::bus::namespace as kv_namespace;
use crate::session::{Session, SessionError};
use crate::store::Expect;

/// Where run records are in a caller's KV namespace.
const RUNS: &str = "langgraph/runs/";
/// Records a search reads at most.
const SCAN_MAX: usize = 10_000;
const PAGE_DEFAULT: usize = 10;
const PAGE_MAX: usize = 1000;

/// What a run id stands for.
#[derive(Serialize, Deserialize)]
struct RunRecord {
    /// The session the run's turn is on: its thread's, or a stateless
    /// run's own ephemeral one.
    session: Uuid,
    stateless: bool,
    since: u64,
    agent_id: String,
    created_at: DateTime<Utc>,
    metadata: Map<String, Value>,
    stream_mode: Vec<String>,
}

fn agent_json(agent: &Agent) -> Value {
    json!({
        "agent_id": agent.name,
        "name": agent.name,
        "description": agent.description,
        "metadata": {"graph_id": agent.kind, "model": agent.model},
        "capabilities": {"ap.io.messages": agent.kind != super::PIPELINE, "ap.io.streaming": true},
    })
}

/// `limit` (1 to 1000, default 10) and `offset` of a search body.
pub(super) fn page(body: &mut JsonObject) -> Result<(usize, usize), ApiError> {
    let limit = body.take::<usize>("limit")?.unwrap_or(PAGE_DEFAULT);
    if !(1..=PAGE_MAX).contains(&limit) {
        return Err(ApiError::invalid("limit", "must be 1 to 1000"));
    }
    Ok((limit, body.take::<usize>("offset")?.unwrap_or(0)))
}

/// `POST /agents/search`: the server's agents, filtered by `name` and
/// `metadata` (`graph_id`, `model`).
pub async fn search_agents(
    State(state): State<AppState>,
    mut body: JsonObject,
) -> Result<Json<Vec<Value>>, ApiError> {
    let name = body.take::<String>("name")?;
    let metadata = body
        .take::<Map<String, Value>>("metadata")?
        .unwrap_or_default();
    let (limit, offset) = page(&mut body)?;
    let agents = profiles::list(&state.config, state.sessions.tasks())
        .iter()
        .map(agent_json)
        .filter(|a| name.as_deref().is_none_or(|n| a["name"] == n))
        .filter(|a| {
            metadata
                .iter()
                .all(|(k, v)| a["metadata"].get(k) == Some(v))
        })
        .skip(offset)
        .take(limit)
        .collect();
    Ok(Json(agents))
}

/// `GET /agents/{id}`.
pub async fn get_agent(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(agent_json(&assistant(&state, &id)?)))
}

/// `GET /agents/{id}/schemas`: an agent takes and gives messages; a
/// pipeline gives its run's state.
pub async fn agent_schemas(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let agent = assistant(&state, &id)?;
    let message = json!({"type": "object", "required": ["role", "content"], "properties": {
        "role": {"type": "string"}, "content": {"type": "string"}}});
    let messages = json!({"type": "object", "required": ["messages"], "properties": {
        "messages": {"type": "array", "items": message}}});
    let output = if agent.kind == super::PIPELINE {
        json!({"type": "object"})
    } else {
        messages.clone()
    };
    Ok(Json(json!({
        "agent_id": agent.name,
        "input_schema": messages,
        "output_schema": output,
    })))
}

/// The prompt of a run body: the last of its `messages` (text content or
/// text parts), else its `input` as the LangGraph routes read it.
fn prompt(body: &JsonObject) -> Result<String, ApiError> {
    let Some(messages) = body.0.get("messages").filter(|m| !m.is_null()) else {
        return prompt_of(body.0.get("input"));
    };
    let last = messages.as_array().and_then(|m| m.last());
    let text = match last.and_then(|m| m.get("content")) {
        Some(Value::String(text)) => Some(text.clone()),
        Some(Value::Array(parts)) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        _ => None,
    };
    match text {
        Some(text) if !text.trim().is_empty() => Ok(text),
        _ => Err(ApiError::invalid(
            "messages",
            "must be a list whose last message has a non-empty text content",
        )),
    }
}

/// The thread a run body names, made when `if_not_exists` is `create`.
async fn thread_for(
    state: &AppState,
    caller: &Caller,
    id: &str,
    (run, create): (&RunRequest, bool),
) -> Result<Arc<Session>, ApiError> {
    match runs::thread(state, caller, id, run).await {
        // Made here, unless another key's thread has the id (a 409).
        Err(e) if create && e.status == StatusCode::NOT_FOUND => {
            let agent = assistant(state, &run.assistant_id)?;
            let id = (thread_id(id)?, true);
            super::threads::with_id(state, caller, &agent, id, Map::new()).await
        }
        other => other,
    }
}

/// Starts the run a body asks for and keeps its record.
async fn begin(
    state: &AppState,
    caller: &Caller,
    body: &mut JsonObject,
) -> Result<(Uuid, RunRecord, crate::session::StartedTurn), ApiError> {
    if body.0.get("webhook").is_some_and(|w| !w.is_null()) {
        return Err(ApiError::invalid(
            "webhook",
            "is not served: the server calls no URL a request names; wait for or stream the run",
        ));
    }
    let agent_id = body
        .take::<String>("agent_id")?
        .unwrap_or_else(|| "agent".to_owned());
    let metadata = body
        .take::<Map<String, Value>>("metadata")?
        .unwrap_or_default();
    let thread = body.take::<String>("thread_id")?;
    let create = match body.take::<String>("if_not_exists")?.as_deref() {
        None | Some("reject") => false,
        Some("create") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "if_not_exists",
                format!("{other:?}: must be create or reject"),
            ));
        }
    };
    let modes = match body.0.get("stream_mode") {
        Some(Value::String(mode)) => vec![mode.clone()],
        Some(Value::Array(modes)) => modes
            .iter()
            .filter_map(|m| m.as_str().map(str::to_owned))
            .collect(),
        _ => vec!["values".to_owned()],
    };
    let prompt = prompt(body)?;
    let run = runs::run_options(body, agent_id.clone(), prompt)?;
    let session = match &thread {
        Some(id) => thread_for(state, caller, id, (&run, create)).await?,
        None => {
            let agent = assistant(state, &agent_id)?;
            new_session(state, caller, &agent, true, Map::new()).await?
        }
    };
    let turn = runs::start(state, session, &run).await?;
    let id = Uuid::new_v4();
    let record = RunRecord {
        session: turn.session.id,
        stateless: thread.is_none(),
        since: turn.since,
        agent_id,
        created_at: Utc::now(),
        metadata,
        stream_mode: modes,
    };
    let bytes = Bytes::from(serde_json::to_vec(&record).map_err(ApiError::internal)?);
    let key = format!("{RUNS}{id}");
    state
        .kv
        .put(kv_namespace(caller), &key, bytes, Expect::Any)
        .await?;
    Ok((id, record, turn))
}

/// The record a run id names and its session; another key's run, or one
/// whose session is gone, is a 404.
async fn find(
    state: &AppState,
    caller: &Caller,
    run: &str,
) -> Result<(Uuid, RunRecord, Arc<Session>), ApiError> {
    let missing = || ApiError::not_found(format!("run {run} not found"));
    let id = Uuid::parse_str(run).map_err(|_| missing())?;
    let entry = state
        .kv
        .get(kv_namespace(caller), &format!("{RUNS}{id}"))
        .await?
        .ok_or_else(missing)?;
    let record: RunRecord = serde_json::from_slice(&entry.value).map_err(|_| missing())?;
    match state.sessions.get(record.session, caller.owner()).await {
        Ok(session) => Ok((id, record, session)),
        Err(SessionError::NotFound(_)) => {
            // Its thread was deleted (or its stateless session expired):
            // the record names nothing any more.
            state
                .kv
                .delete(kv_namespace(caller), &format!("{RUNS}{id}"), Expect::Any)
                .await?;
            Err(ApiError::not_found(format!(
                "run {run}: its thread was deleted"
            )))
        }
        Err(e) => Err(e.into()),
    }
}

async fn status(session: &Session, record: &RunRecord) -> &'static str {
    runs::ended(session, record.since)
        .await
        .unwrap_or("pending")
}

fn run_json(id: Uuid, record: &RunRecord, session: &Session, status: &str) -> Value {
    let mut run = json!({
        "run_id": id,
        "agent_id": record.agent_id,
        "created_at": record.created_at,
        "updated_at": session.updated_at(),
        "status": status,
        "metadata": record.metadata,
        "stream_mode": record.stream_mode,
    });
    if !record.stateless {
        run["thread_id"] = json!(session.id);
    }
    run
}

fn location(id: Uuid) -> HeaderValue {
    HeaderValue::from_str(&format!("/langgraph/runs/{id}"))
        .unwrap_or(HeaderValue::from_static("/langgraph/runs"))
}

/// `POST /runs`: a background run, on the body's `thread_id` or stateless.
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    mut body: JsonObject,
) -> Result<Response, ApiError> {
    let (id, record, turn) = begin(&state, &caller, &mut body).await?;
    let mut response = Json(run_json(id, &record, &turn.session, "pending")).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_LOCATION, location(id));
    Ok(response)
}

/// A finished run as the protocol's wait answers it: the run, its
/// thread's values and their messages.
async fn waited(
    state: &AppState,
    (id, record): (Uuid, &RunRecord),
    session: &Session,
) -> Result<Value, ApiError> {
    let values = runs::finish(state, session, record.since).await?;
    let messages: Vec<Value> = values["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            let role = match m["type"].as_str() {
                Some("human") => "user",
                Some("ai") => "assistant",
                other => other.unwrap_or("assistant"),
            };
            json!({"id": m["id"], "role": role, "content": m["content"]})
        })
        .collect();
    let run = run_json(id, record, session, status(session, record).await);
    Ok(json!({"run": run, "values": values, "messages": messages}))
}

/// `POST /runs/wait`: a body with `assistant_id` is the LangGraph SDK's
/// stateless run (answered with the values); otherwise the protocol's run
/// (on `thread_id` or stateless), answered with the run, values and
/// messages.
pub async fn wait(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    mut body: JsonObject,
) -> Result<Response, ApiError> {
    if body.0.contains_key("assistant_id") {
        let values = runs::wait_stateless(State(state), Extension(caller), body).await?;
        return Ok(values.into_response());
    }
    let (id, record, turn) = begin(&state, &caller, &mut body).await?;
    let answer = waited(&state, (id, &record), &turn.session).await?;
    Ok(Json(answer).into_response())
}

/// `POST /runs/stream`: as [`wait`], the LangGraph SDK's stateless run or
/// the protocol's, as SSE. A stateless run is cancelled when the client
/// leaves (unless `on_disconnect` is `continue`); a thread's goes on.
pub async fn stream(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    mut body: JsonObject,
) -> Result<Response, ApiError> {
    if body.0.contains_key("assistant_id") {
        return runs::stream_stateless(State(state), Extension(caller), body).await;
    }
    let keep = body.take::<String>("on_disconnect")?.as_deref() == Some("continue");
    let (id, record, turn) = begin(&state, &caller, &mut body).await?;
    let modes = modes(&record)?;
    let mut events = turn.session.subscribe(turn.since, true);
    if record.stateless && !keep {
        events = cancel_on_hangup(events, turn.cancel.clone()).boxed();
    }
    let target = (turn.session.clone(), turn.since);
    Ok(runs::sse_of(
        &state,
        target,
        (id, location(id)),
        modes,
        events,
    ))
}

fn modes(record: &RunRecord) -> Result<Vec<Mode>, ApiError> {
    record.stream_mode.iter().map(|m| Mode::parse(m)).collect()
}

/// `GET /runs/{run_id}`.
pub async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(run): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let (id, record, session) = find(&state, &caller, &run).await?;
    let status = status(&session, &record).await;
    Ok(Json(run_json(id, &record, &session, status)))
}

/// `GET /runs/{run_id}/wait`: waits for the run to end.
pub async fn join(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(run): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let (id, record, session) = find(&state, &caller, &run).await?;
    Ok(Json(waited(&state, (id, &record), &session).await?))
}

/// `GET /runs/{run_id}/stream`: the run's events from its start (so none
/// is missed), in its stream modes, until it ends.
pub async fn join_stream(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(run): Path<String>,
) -> Result<Response, ApiError> {
    let (id, record, session) = find(&state, &caller, &run).await?;
    let events = session.subscribe(record.since, true);
    let modes = modes(&record)?;
    let target = (session, record.since);
    Ok(runs::sse_of(
        &state,
        target,
        (id, location(id)),
        modes,
        events,
    ))
}

#[derive(Deserialize)]
pub struct CancelQuery {
    wait: Option<bool>,
    action: Option<String>,
}

/// `POST /runs/{run_id}/cancel`: interrupts the run's turn if it has not
/// ended; with `wait=true`, answers once it has.
pub async fn cancel(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(run): Path<String>,
    ApiQuery(query): ApiQuery<CancelQuery>,
) -> Result<StatusCode, ApiError> {
    if query.action.as_deref().is_some_and(|a| a != "interrupt") {
        return Err(ApiError::invalid("action", "only interrupt is served"));
    }
    let (_, record, session) = find(&state, &caller, &run).await?;
    if runs::ended(&session, record.since).await.is_none() {
        session.interrupt();
        if query.wait == Some(true) {
            runs::finish(&state, &session, record.since).await?;
        }
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /runs/{run_id}`: forgets a run that has ended (its turn stays
/// in its thread); one still going is a 409.
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(run): Path<String>,
) -> Result<StatusCode, ApiError> {
    let (id, record, session) = find(&state, &caller, &run).await?;
    if runs::ended(&session, record.since).await.is_none() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "run_running",
            format!("run {id} has not ended: cancel it first"),
        ));
    }
    state
        .kv
        .delete(kv_namespace(&caller), &format!("{RUNS}{id}"), Expect::Any)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /runs/search`: the caller's runs, newest first, filtered by
/// `thread_id`, `agent_id`, `status` and `metadata`.
pub async fn search(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    mut body: JsonObject,
) -> Result<Json<Vec<Value>>, ApiError> {
    let thread = body.take::<Uuid>("thread_id")?;
    let agent = body.take::<String>("agent_id")?;
    let wanted = body.take::<String>("status")?;
    let metadata = body
        .take::<Map<String, Value>>("metadata")?
        .unwrap_or_default();
    let (limit, offset) = page(&mut body)?;
    let entries = state.kv.list(kv_namespace(&caller), RUNS, SCAN_MAX).await?;
    let mut records: Vec<(Uuid, RunRecord)> = entries
        .iter()
        .filter_map(|e| {
            let id = Uuid::parse_str(e.key.strip_prefix(RUNS)?).ok()?;
            Some((id, serde_json::from_slice(&e.value).ok()?))
        })
        .filter(|(_, r): &(Uuid, RunRecord)| {
            thread.is_none_or(|t| !r.stateless && r.session == t)
                && agent.as_deref().is_none_or(|a| r.agent_id == a)
                && metadata.iter().all(|(k, v)| r.metadata.get(k) == Some(v))
        })
        .collect();
    records.sort_by_key(|(_, r)| std::cmp::Reverse(r.created_at));
    let mut runs = Vec::new();
    let mut skipped = 0;
    for (id, record) in records {
        if runs.len() == limit {
            break;
        }
        let Ok(session) = state.sessions.get(record.session, caller.owner()).await else {
            continue;
        };
        let status = status(&session, &record).await;
        if wanted.as_deref().is_some_and(|w| w != status) {
            continue;
        }
        if skipped < offset {
            skipped += 1;
            continue;
        }
        runs.push(run_json(id, &record, &session, status));
    }
    Ok(Json(runs))
}
