//! The task methods: send (blocking, returning at once, or streamed),
//! get, list, cancel and subscribe.

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::{self, BoxStream};
use serde_json::{Value, json};
use uuid::Uuid;

use super::rpc::{self, RpcError};
use super::task::{self, State, TASKS, Task, TaskRecord};
use crate::agent::profiles::Agent;
use crate::api::http::auth::Caller;
use crate::api::http::error::ApiError;
use crate::api::http::state::AppState;
use crate::api::routes::agents::{Opening, open_session};
use crate::session::{Session, SessionError, TurnOptions};
use crate::store::Expect;

/// One call: who makes it, to which agent.
pub struct RpcCall<'a> {
    pub state: &'a AppState,
    pub caller: &'a Caller,
    pub agent: &'a Agent,
}

/// A task of the caller's: its session, where its turn started, and its
/// record.
#[derive(Clone)]
pub struct Found {
    pub session: Arc<Session>,
    pub since: u64,
    pub record: TaskRecord,
}

impl Found {
    pub fn id(&self) -> String {
        task::task_id(self.session.id, self.since)
    }

    /// The task as its events so far make it.
    pub async fn now(&self) -> Task {
        caught_up(self).await.0
    }
}

fn internal(e: impl std::fmt::Display) -> RpcError {
    ApiError::internal(e).into()
}

/// The caller's task `id`; another key's is not found, like one that
/// never was.
pub async fn find(call: &RpcCall<'_>, id: &str) -> Result<Found, RpcError> {
    let (session_id, since) =
        task::parse_task_id(id).ok_or_else(|| RpcError::task_not_found(id))?;
    let session = match call
        .state
        .sessions
        .get(session_id, call.caller.owner())
        .await
    {
        Ok(session) => session,
        Err(SessionError::NotFound(_)) => return Err(RpcError::task_not_found(id)),
        Err(e) => return Err(e.into()),
    };
    let key = task::record_key(call.caller.owner(), session_id, since);
    let entry = call.state.kv.get(TASKS, &key).await.map_err(internal)?;
    let entry = entry.ok_or_else(|| RpcError::task_not_found(id))?;
    let record = serde_json::from_slice(&entry.value).map_err(internal)?;
    Ok(Found {
        session,
        since,
        record,
    })
}

/// The task as its events up to now make it, and the last `seq` read.
pub(super) async fn caught_up(found: &Found) -> (Task, u64) {
    let mark = found.session.last_seq();
    let mut task = Task::new(found.session.id, found.since, &found.record);
    if mark > found.since {
        // A subscription, not a replay of the store: the last events may be
        // emitted and not stored yet, and it hands them over all the same.
        let mut past = found.session.subscribe(found.since, true);
        while let Some(event) = past.next().await {
            task.apply(&event);
            if event.seq >= mark || task.state.is_terminal() {
                break;
            }
        }
    }
    (task, mark)
}

/// The task's events from now on as stream responses, after a `task`
/// snapshot, until it ends or waits for input on a call not in `known`.
async fn follow(found: Found, known: BTreeSet<String>) -> BoxStream<'static, Value> {
    let (task, mark) = caught_up(&found).await;
    let first = json!({"task": task.to_json(&found.record, None)});
    if stops(&task, &known) {
        return stream::iter([first]).boxed();
    }
    let live = found.session.subscribe(mark, true);
    let rest = stream::unfold(
        (live, task, known, false),
        |(mut live, mut task, known, done)| async move {
            if done {
                return None;
            }
            let event = live.next().await?;
            let out = task.apply(&event);
            let done = stops(&task, &known);
            Some((stream::iter(out), (live, task, known, done)))
        },
    )
    .flatten();
    stream::iter([first]).chain(rest).boxed()
}

/// Whether a stream of the task ends here: it is over, or it waits on a
/// call the client has not seen decided.
fn stops(task: &Task, known: &BTreeSet<String>) -> bool {
    task.state.is_terminal()
        || (task.state == State::InputRequired && !task.waiting().is_subset(known))
}

/// Waits as a stream would, and answers the task then.
async fn settle(found: &Found, known: &BTreeSet<String>) -> Task {
    let (mut task, mark) = caught_up(found).await;
    if stops(&task, known) {
        return task;
    }
    let mut live = found.session.subscribe(mark, true);
    while let Some(event) = live.next().await {
        task.apply(&event);
        if stops(&task, known) {
            break;
        }
    }
    task
}

/// Starts or goes on with the task a message asks for; answers it and the
/// calls it decided.
async fn begin(call: &RpcCall<'_>, params: &Value) -> Result<(Found, BTreeSet<String>), RpcError> {
    let message = params
        .get("message")
        .filter(|m| m.is_object())
        .ok_or_else(|| RpcError::params("`message` must be an object"))?;
    if let Some(role) = message.get("role").and_then(Value::as_str)
        && role != "ROLE_USER"
    {
        return Err(RpcError::params(format!(
            "message.role {role:?}: a client sends ROLE_USER messages"
        )));
    }
    let parts = message
        .get("parts")
        .and_then(Value::as_array)
        .filter(|p| !p.is_empty())
        .ok_or_else(|| RpcError::params("message.parts must be a non-empty list"))?;
    if let Some(task_id) = message
        .get("taskId")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        let found = find(call, task_id).await?;
        let decided = answer(call, &found, parts).await?;
        return Ok((found, decided));
    }
    let prompt = prompt_of(parts)?;
    let session = context(call, message, params).await?;
    if call.state.sessions.is_draining() {
        return Err(SessionError::ShuttingDown.into());
    }
    let turn = call
        .state
        .sessions
        .start_turn_with(session, prompt, true, TurnOptions::default())
        .await?;
    let id = task::task_id(turn.session.id, turn.since);
    let context = message
        .get("contextId")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty() && *c != turn.session.id.to_string())
        .map(str::to_owned);
    let mut kept = message.clone();
    kept["contextId"] = json!(
        context
            .clone()
            .unwrap_or_else(|| turn.session.id.to_string())
    );
    kept["taskId"] = json!(id);
    let record = TaskRecord {
        agent: call.agent.name.clone(),
        message: kept,
        context,
        created_at: chrono::Utc::now(),
    };
    let key = task::record_key(call.caller.owner(), turn.session.id, turn.since);
    let value = serde_json::to_vec(&record).map_err(internal)?;
    call.state
        .kv
        .put(TASKS, &key, Bytes::from(value), Expect::Any)
        .await
        .map_err(internal)?;
    let found = Found {
        session: turn.session,
        since: turn.since,
        record,
    };
    if let Some(config) = params.pointer("/configuration/taskPushNotificationConfig")
        && config.is_object()
    {
        let mut config = config.clone();
        config["taskId"] = json!(id);
        super::push::register(call, &found, &config).await?;
    }
    Ok((found, BTreeSet::new()))
}

/// The prompt a new task's parts make: its texts, and its data parts as
/// JSON; files are not read.
fn prompt_of(parts: &[Value]) -> Result<String, RpcError> {
    let mut texts = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        if let Some(text) = part.get("text").and_then(Value::as_str) {
            texts.push(text.to_owned());
        } else if let Some(data) = part.get("data") {
            texts.push(data.to_string());
        } else {
            return Err(RpcError::new(
                rpc::CONTENT_TYPE,
                format!("message.parts[{i}]: only text and data parts are read, not files"),
            ));
        }
    }
    let prompt = texts.join("\n\n");
    if prompt.trim().is_empty() {
        return Err(RpcError::params("message.parts hold no text"));
    }
    Ok(prompt)
}

/// The message's context: the caller's session of that id, a new one with
/// that id, or a new one. `metadata.options` sets a new one's options on
/// top of the agent's.
async fn context(
    call: &RpcCall<'_>,
    message: &Value,
    params: &Value,
) -> Result<Arc<Session>, RpcError> {
    let wanted = message
        .get("contextId")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty());
    let id = match wanted {
        Some(text) if text.len() > task::MAX_CONTEXT => {
            return Err(RpcError::params(format!(
                "message.contextId is longer than {} bytes",
                task::MAX_CONTEXT
            )));
        }
        Some(text) => Some(task::context_session(call.caller.owner(), text)),
        None => None,
    };
    if let Some(id) = id {
        match call.state.sessions.get(id, call.caller.owner()).await {
            Ok(session) if session.kind.as_str() == call.agent.kind => return Ok(session),
            Ok(session) => {
                return Err(RpcError::params(format!(
                    "context {id} is a {} session; agent {} runs {} sessions",
                    session.kind, call.agent.name, call.agent.kind
                )));
            }
            // Another key's context must not be made again under this key,
            // nor told apart from one that does not exist.
            Err(SessionError::NotFound(_)) => {
                if call.state.sessions.record(id).await?.is_some() {
                    return Err(RpcError::new(
                        rpc::TASK_NOT_FOUND,
                        format!("context {id} not found"),
                    ));
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    let overrides = match params.pointer("/metadata/options") {
        None | Some(Value::Null) => None,
        Some(Value::Object(options)) => Some(options),
        Some(_) => {
            return Err(RpcError::params(
                "metadata.options must be an object of session options",
            ));
        }
    };
    let opening = Opening {
        id,
        overrides,
        ephemeral: false,
        origin: "a2a",
        metadata: Default::default(),
        field: "agent",
    };
    let opened = open_session(call.state, call.caller, call.agent, opening).await;
    match (opened, id) {
        (Ok(session), _) => Ok(session),
        // Made by another request meanwhile: the caller's own is taken
        // as if it had been there; another key's is not found.
        (Err(e), Some(id)) => match call.state.sessions.get(id, call.caller.owner()).await {
            Ok(session) if session.kind.as_str() == call.agent.kind => Ok(session),
            Err(SessionError::NotFound(_)) if call.state.sessions.record(id).await?.is_some() => {
                Err(RpcError::new(
                    rpc::TASK_NOT_FOUND,
                    format!("context {id} not found"),
                ))
            }
            _ => Err(e.into()),
        },
        (Err(e), None) => Err(e.into()),
    }
}

/// Decides the calls a task waits on with the message's data part
/// (`{decision, callId?, message?, input?, remember?}`: every waiting call
/// when it names none); answers the calls decided.
async fn answer(
    call: &RpcCall<'_>,
    found: &Found,
    parts: &[Value],
) -> Result<BTreeSet<String>, RpcError> {
    let task = found.now().await;
    if task.state != State::InputRequired {
        return Err(RpcError::new(
            rpc::UNSUPPORTED,
            format!(
                "task {} is {}: only a task in TASK_STATE_INPUT_REQUIRED takes a message; \
                 send one without taskId to go on in its context",
                found.id(),
                task.state.name()
            ),
        ));
    }
    let Some(mut body) = parts
        .iter()
        .find_map(|p| p.get("data").and_then(Value::as_object).cloned())
    else {
        return Err(RpcError::params(
            "the task waits for a decision: send a data part {\"decision\": \"allow\" | \"deny\"}",
        ));
    };
    let calls: BTreeSet<String> = match body.remove("callId") {
        Some(Value::String(id)) => BTreeSet::from([id]),
        None => task.waiting(),
        Some(_) => return Err(RpcError::params("callId must be a string")),
    };
    for call_id in &calls {
        let decision = crate::api::routes::approvals::parse_decision(Value::Object(body.clone()))?;
        crate::api::routes::approvals::decide(
            call.state,
            call.caller,
            &found.session,
            call_id,
            decision,
        )
        .await?;
    }
    Ok(calls)
}

/// `SendMessage`: the task once it ends or waits for input, or at once
/// with `configuration.returnImmediately`.
pub async fn send_message(call: &RpcCall<'_>, params: &Value) -> Result<Value, RpcError> {
    let history = rpc::count(
        params.get("configuration").unwrap_or(&Value::Null),
        "historyLength",
    )?;
    let at_once = params
        .pointer("/configuration/returnImmediately")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let (found, decided) = begin(call, params).await?;
    let task = if at_once {
        found.now().await
    } else {
        settle(&found, &decided).await
    };
    Ok(json!({"task": task.to_json(&found.record, history)}))
}

/// `SendStreamingMessage`: the task, then its updates.
pub async fn send_streaming(
    call: &RpcCall<'_>,
    params: &Value,
) -> Result<BoxStream<'static, Value>, RpcError> {
    let (found, decided) = begin(call, params).await?;
    Ok(follow(found, decided).await)
}

/// `GetTask`.
pub async fn get_task(call: &RpcCall<'_>, params: &Value) -> Result<Value, RpcError> {
    let found = find(call, rpc::text(params, "id")?).await?;
    let history = rpc::count(params, "historyLength")?;
    Ok(found.now().await.to_json(&found.record, history))
}

/// `SubscribeToTask`: a task under way, then its updates; a finished
/// task has none to give.
pub async fn subscribe(
    call: &RpcCall<'_>,
    params: &Value,
) -> Result<BoxStream<'static, Value>, RpcError> {
    let found = find(call, rpc::text(params, "id")?).await?;
    let task = found.now().await;
    if task.state.is_terminal() {
        return Err(RpcError::new(
            rpc::UNSUPPORTED,
            format!(
                "task {} has ended ({}): GetTask reads it",
                found.id(),
                task.state.name()
            ),
        ));
    }
    Ok(follow(found, task.waiting()).await)
}

/// `CancelTask`: interrupts the task's turn and answers it once it has
/// ended.
pub async fn cancel_task(call: &RpcCall<'_>, params: &Value) -> Result<Value, RpcError> {
    let found = find(call, rpc::text(params, "id")?).await?;
    let task = found.now().await;
    if task.state.is_terminal() {
        return Err(RpcError::new(
            rpc::TASK_NOT_CANCELABLE,
            format!("task {} has ended ({})", found.id(), task.state.name()),
        ));
    }
    found.session.interrupt();
    let task = settle(&found, &task.waiting()).await;
    Ok(task.to_json(&found.record, None))
}

/// Tasks listed at most per page, and read at most per call.
const PAGE_DEFAULT: usize = 50;
const PAGE_MAX: usize = 100;
const READ_MAX: usize = 1000;

/// `ListTasks`: the caller's tasks, newest first; `contextId` and
/// `status` filter, `pageToken` is where the page starts.
pub async fn list_tasks(call: &RpcCall<'_>, params: &Value) -> Result<Value, RpcError> {
    let page = rpc::count(params, "pageSize")?.unwrap_or(PAGE_DEFAULT);
    if !(1..=PAGE_MAX).contains(&page) {
        return Err(RpcError::params(format!(
            "pageSize must be 1 to {PAGE_MAX}"
        )));
    }
    let start: usize = match params.get("pageToken").and_then(Value::as_str) {
        None | Some("") => 0,
        Some(token) => token
            .parse()
            .map_err(|_| RpcError::params("pageToken is not one this server gave"))?,
    };
    let status = match params.get("status").and_then(Value::as_str) {
        None | Some("") | Some("TASK_STATE_UNSPECIFIED") => None,
        Some(name) => Some(
            State::parse(name)
                .ok_or_else(|| RpcError::params(format!("status {name:?} is no task state")))?,
        ),
    };
    let history = rpc::count(params, "historyLength")?;
    let artifacts = params
        .get("includeArtifacts")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut prefix = format!("{}/", task::owner_part(call.caller.owner()));
    if let Some(context) = params
        .get("contextId")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty())
    {
        let session = task::context_session(call.caller.owner(), context);
        prefix.push_str(&format!("{session}/"));
    }
    let after = match params.get("statusTimestampAfter").and_then(Value::as_str) {
        None | Some("") => None,
        Some(at) => Some(
            chrono::DateTime::parse_from_rfc3339(at)
                .map_err(|_| {
                    RpcError::params(format!(
                        "statusTimestampAfter {at:?} is not an RFC 3339 time"
                    ))
                })?
                .with_timezone(&chrono::Utc),
        ),
    };
    let entries = call
        .state
        .kv
        .list(TASKS, &prefix, READ_MAX)
        .await
        .map_err(internal)?;
    let mut records: Vec<(Uuid, u64, TaskRecord)> = entries
        .iter()
        .filter_map(|entry| {
            let mut parts = entry.key.rsplit('/');
            let since = parts.next()?.parse().ok()?;
            let session = Uuid::parse_str(parts.next()?).ok()?;
            Some((session, since, serde_json::from_slice(&entry.value).ok()?))
        })
        .collect();
    records.sort_by_key(|r| std::cmp::Reverse(r.2.created_at));
    let mut tasks = Vec::new();
    for (session, since, record) in records {
        let Ok(session) = call.state.sessions.get(session, call.caller.owner()).await else {
            continue;
        };
        let found = Found {
            session,
            since,
            record,
        };
        let task = found.now().await;
        if status.is_some_and(|s| s != task.state) || after.is_some_and(|at| task.timestamp <= at) {
            continue;
        }
        let mut json = task.to_json(&found.record, history);
        if !artifacts && let Some(task) = json.as_object_mut() {
            task.remove("artifacts");
        }
        tasks.push(json);
    }
    let total = tasks.len();
    let next = if start + page < total {
        (start + page).to_string()
    } else {
        String::new()
    };
    let tasks: Vec<Value> = tasks.into_iter().skip(start).take(page).collect();
    // `pageSize` says how many this page holds, as the TCK reads it.
    Ok(json!({"tasks": tasks, "nextPageToken": next, "pageSize": tasks.len(), "totalSize": total}))
}
