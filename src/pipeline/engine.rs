//! One pipeline run, as the turns of its session: node after node, each
//! answer merged into the state by the reducers, routed on its decision
//! within the retry limits, and checkpointed in the store before the next
//! node starts. A run cut off (a crash, a cancel, the timeout) resumes
//! after its last checkpoint and never runs a completed node again.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use chrono::Utc;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::agents::{self, NodeAnswer};
use super::definition::{Definition, Route};
use super::runs::{self, RunRecord};
use super::{PipelineConfig, PipelineOptions};
use crate::jobs::{self, Jobs};
use crate::protocol::{EventKind, ResultStatus, SessionKind};
use crate::session::{NewSession, Outcome, Session, SessionManager, Turn};
use crate::store::{Checkpoint, Store, StoreError};
use crate::sync::{KeyedSlots, SlotsFull, lock};
use crate::telemetry::spans;

/// What every run uses.
pub struct Deps {
    pub store: Arc<dyn Store>,
    pub config: PipelineConfig,
    pub definitions: Arc<BTreeMap<String, Arc<Definition>>>,
    pub sessions: Weak<SessionManager>,
    /// Runs at once (`max_concurrent_pipelines`), of which one key's
    /// take at most `max_concurrent_per_key`.
    pub slots: Arc<KeyedSlots>,
    /// The sessions whose run waits for a permit.
    pub queued: Arc<Mutex<HashSet<Uuid>>>,
    /// Where mock nodes are answered (any replica's).
    pub jobs: Arc<dyn Jobs>,
    /// Where a run's permission hook may be reached
    /// (`mcp.allowed_http_servers`), checked when it is submitted.
    pub hook_rules: Arc<crate::egress::Rules>,
}

/// A step as its checkpoint stores it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub thread_id: String,
    /// The node that ran (`(end)` for a run stopped between nodes).
    pub node: String,
    pub decision: Option<String>,
    /// The node to run next; none once the run is over.
    pub next: Option<String>,
    /// `running`, `completed`, `failed` or `cancelled`.
    pub status: String,
    pub reason: Option<String>,
    pub state: Map<String, Value>,
    pub counters: BTreeMap<String, u32>,
    pub duration_ms: u64,
}

/// The node name of a checkpoint that only records how a run stopped.
pub const END: &str = "(end)";

/// Runs (or resumes) the session's pipeline.
pub async fn run(deps: &Deps, turn: &mut Turn, input: String) -> Result<Outcome, StoreError> {
    let session = turn.session.clone();
    let options: PipelineOptions = serde_json::from_value((*session.options).clone())
        .map_err(|e| StoreError::Corrupt(format!("pipeline options: {e}")))?;
    let Some(definition) = deps.definitions.get(&options.pipeline).cloned() else {
        session.emit(EventKind::Error {
            message: format!("this server has no pipeline {:?}", options.pipeline),
            code: "unknown_pipeline".into(),
        })?;
        return Ok(Outcome::new(ResultStatus::Error, None));
    };
    let record = runs::record_of(deps.store.as_ref(), &session, &options).await?;
    let checkpoints = deps.store.checkpoints(session.id).await?;
    let resumed = checkpoints.last().map(step_of).transpose()?;
    // A node's earlier visits in this run (a mock's script goes by them),
    // and the checkpoints stored so far.
    let mut visits: BTreeMap<String, usize> = BTreeMap::new();
    for checkpoint in &checkpoints {
        *visits.entry(checkpoint.name.clone()).or_default() += 1;
    }
    let mut saved = checkpoints.len() as u64;
    let (mut state, mut counters, mut node, mut step) = match resumed {
        None => (
            initial(&definition, &options, &input),
            BTreeMap::new(),
            definition.start.clone(),
            0,
        ),
        Some(last) => {
            let Some(next) = last.next.clone() else {
                session.emit(EventKind::Error {
                    message: format!(
                        "run {} is over ({}); start another",
                        record.thread_id, last.status
                    ),
                    code: "run_over".into(),
                })?;
                return Ok(Outcome::new(ResultStatus::Error, None));
            };
            session.emit(EventKind::Status {
                message: format!(
                    "Resuming {} after step {} ({}): {next} runs next.",
                    record.thread_id,
                    checkpoints.len(),
                    last.node
                ),
            })?;
            (last.state, last.counters, next, checkpoints.len() as u64)
        }
    };
    // Wait for a place among the runs at once; the status says queued.
    let owner = session.owner.as_deref();
    let permit = match deps.slots.try_take(owner) {
        Ok(permit) => permit,
        Err(full) => {
            lock(&deps.queued).insert(session.id);
            let message = match full {
                SlotsFull::Key => format!(
                    "Queued: one API key runs {} pipelines at once (pipelines.max_concurrent_per_key).",
                    deps.config.max_concurrent_per_key()
                ),
                SlotsFull::All => format!(
                    "Queued: {} pipelines run at once (pipelines.max_concurrent_pipelines).",
                    deps.config.max_concurrent_pipelines
                ),
            };
            session.emit(EventKind::Status { message })?;
            let acquired = tokio::select! {
                permit = deps.slots.take(owner) => permit,
                _ = turn.cancel.cancelled() => None,
            };
            lock(&deps.queued).remove(&session.id);
            match acquired {
                Some(permit) => permit,
                None => return Ok(Outcome::new(ResultStatus::Interrupted, None)),
            }
        }
    };
    let limit = Duration::from_secs(deps.config.pipeline_timeout_s);
    let cancel = turn.cancel.clone();
    let mut worker = None;
    let steps = async {
        loop {
            step += 1;
            let started = Instant::now();
            session.emit(EventKind::NodeStarted {
                node: node.clone(),
                step,
                mock: mocked(deps, &options),
            })?;
            let visit = visits.get(&node).copied().unwrap_or(0);
            // Each node a child span of the run's turn.
            let span = spans::agent(&node, &session.id.to_string());
            let answer = span
                .within(answer(
                    deps,
                    &session,
                    &definition,
                    &options,
                    &node,
                    &mut state,
                    visit,
                    &mut worker,
                    turn,
                ))
                .await?;
            if answer.is_err() {
                span.fail("node_failed");
            }
            let Ok(answer) = answer else {
                if cancel.is_cancelled() {
                    return Ok(Ending::Stopped(node.clone()));
                }
                let reason = answer.err().unwrap_or_default();
                return Ok::<_, StoreError>(Ending::Failed(reason, node.clone()));
            };
            turn.usage.add(&answer.usage);
            super::state::apply(&mut state, &definition.state, answer.writes);
            let route = definition.route(&node, &answer.decision, &counters, &state);
            let (next, status, reason) = match &route {
                Route::Next { to, counter, .. } => {
                    if let Some(counter) = counter {
                        *counters.entry(counter.clone()).or_default() += 1;
                    }
                    (Some(to.clone()), "running", None)
                }
                Route::Done => (None, "completed", None),
                Route::Fail(reason) => (None, "failed", Some(reason.clone())),
            };
            let duration_ms = started.elapsed().as_millis() as u64;
            save(
                deps,
                &session,
                step,
                &Step {
                    thread_id: record.thread_id.clone(),
                    node: node.clone(),
                    decision: Some(answer.decision.clone()),
                    next: next.clone(),
                    status: status.into(),
                    reason: reason.clone(),
                    state: state.clone(),
                    counters: counters.clone(),
                    duration_ms,
                },
            )
            .await?;
            saved += 1;
            *visits.entry(node.clone()).or_default() += 1;
            session.emit(EventKind::NodeCompleted {
                node: node.clone(),
                decision: answer.decision.clone(),
                step,
                duration_ms,
            })?;
            if let Route::Next { to, reason, .. } = &route {
                session.emit(EventKind::Route {
                    from: node.clone(),
                    to: to.clone(),
                    reason: reason.clone(),
                })?;
            }
            session.emit(EventKind::Checkpoint {
                step,
                node: node.clone(),
            })?;
            match (next, reason) {
                (Some(next), _) => node = next,
                (None, None) => return Ok(Ending::Completed),
                (None, Some(reason)) => return Ok(Ending::Failed(reason, String::new())),
            }
            if cancel.is_cancelled() {
                return Ok(Ending::Stopped(node.clone()));
            }
        }
    };
    let ending = tokio::time::timeout(limit, steps).await;
    drop(permit);
    let ending = match ending {
        Ok(ending) => ending?,
        Err(_) => Ending::TimedOut(node.clone()),
    };
    finish(deps, &session, &record, (&state, &counters, saved), ending).await
}

enum Ending {
    Completed,
    /// Failed with a reason; a node name when it failed inside that node
    /// (the run can resume there), empty when the routing ended it.
    Failed(String, String),
    /// Cancelled or interrupted before `node`.
    Stopped(String),
    TimedOut(String),
}

async fn finish(
    deps: &Deps,
    session: &Arc<Session>,
    record: &RunRecord,
    (state, counters, steps): (&Map<String, Value>, &BTreeMap<String, u32>, u64),
    ending: Ending,
) -> Result<Outcome, StoreError> {
    // (status, reason, the turn's outcome, the node a resume starts at when
    // the run stopped inside or before it).
    let (status, reason, outcome, resume_at) = match ending {
        Ending::Completed => ("completed", None, ResultStatus::Success, None),
        Ending::Failed(reason, node) => {
            let at = (!node.is_empty()).then_some(node);
            ("failed", Some(reason), ResultStatus::Error, at)
        }
        Ending::Stopped(node) => {
            let status = if runs::is_cancelled(deps.store.as_ref(), record).await? {
                "cancelled"
            } else {
                "interrupted"
            };
            (
                status,
                Some(status.to_owned()),
                ResultStatus::Interrupted,
                Some(node),
            )
        }
        Ending::TimedOut(node) => {
            let reason = format!(
                "timeout: the run passed pipelines.pipeline_timeout_s ({} s)",
                deps.config.pipeline_timeout_s
            );
            ("failed", Some(reason), ResultStatus::Error, Some(node))
        }
    };
    let mut ended = steps;
    if let Some(node) = resume_at {
        ended += 1;
        let end = Step {
            thread_id: record.thread_id.clone(),
            node: END.into(),
            decision: None,
            next: Some(node),
            status: status.into(),
            reason: reason.clone(),
            state: state.clone(),
            counters: counters.clone(),
            duration_ms: 0,
        };
        save(deps, session, ended, &end).await?;
    }
    session.emit(EventKind::PipelineCompleted {
        thread_id: record.thread_id.clone(),
        status: status.into(),
        reason: reason.clone(),
        steps: ended,
    })?;
    Ok(Outcome::new(
        outcome,
        reason.or_else(|| Some(format!("{} {status}", record.thread_id))),
    ))
}

async fn save(deps: &Deps, session: &Session, step: u64, data: &Step) -> Result<(), StoreError> {
    deps.store
        .put_checkpoint(&Checkpoint {
            session_id: session.id,
            step,
            name: data.node.clone(),
            state: serde_json::to_value(data).unwrap_or(Value::Null),
            created_at: Utc::now(),
        })
        .await
}

pub fn step_of(checkpoint: &Checkpoint) -> Result<Step, StoreError> {
    serde_json::from_value(checkpoint.state.clone())
        .map_err(|e| StoreError::Corrupt(format!("checkpoint {}: {e}", checkpoint.step)))
}

/// The state a run starts with: each field's default, then the options.
fn initial(definition: &Definition, options: &PipelineOptions, input: &str) -> Map<String, Value> {
    let mut state: Map<String, Value> = definition
        .state
        .iter()
        .map(|(name, spec)| (name.clone(), spec.initial()))
        .collect();
    let mut set = |field: &str, value: Value| {
        if definition.state.contains_key(field) {
            state.insert(field.to_owned(), value);
        }
    };
    if let Some(name) = &options.connector_name {
        set("connector_name", json!(name));
    }
    if let Some(kind) = &options.connector_type {
        set("connector_type", json!(kind));
    }
    if !input.trim().is_empty() {
        set("original_request", json!(input));
    }
    for (field, value) in &options.input {
        set(field, value.clone());
    }
    state
}

/// Whether a run's nodes are answered by mock agents: every run in test
/// mode, and a run started with `mock` on any server (no model is called,
/// and each `node_started` says so).
fn mocked(deps: &Deps, options: &PipelineOptions) -> bool {
    deps.config.test_mode || options.mock.is_some()
}

/// Runs a node until it answers usably or its retries are spent (each
/// unusable answer goes into `errors`). `Err` only for the store.
#[allow(clippy::too_many_arguments)]
async fn answer(
    deps: &Deps,
    session: &Arc<Session>,
    definition: &Definition,
    options: &PipelineOptions,
    node: &str,
    state: &mut Map<String, Value>,
    visit: usize,
    worker: &mut Option<(Arc<SessionManager>, Arc<Session>)>,
    turn: &Turn,
) -> Result<Result<NodeAnswer, String>, StoreError> {
    let spec = &definition.nodes[node];
    let mut attempt = 0;
    loop {
        if turn.cancel.is_cancelled() {
            return Ok(Err("cancelled".into()));
        }
        let result = if mocked(deps, options) {
            let job = agents::MockNode {
                pipeline: definition.name.clone(),
                node: node.to_owned(),
                script: options.mock.clone().unwrap_or_default(),
                visit,
                attempt,
            };
            tokio::select! {
                answer = jobs::run_json(deps.jobs.as_ref(), agents::MOCK_NODE, &job) => {
                    answer.map_err(|e| e.to_string())
                }
                _ = turn.cancel.cancelled() => Err("cancelled".into()),
            }
        } else {
            match worker_of(deps, session, options, worker).await {
                Ok((manager, child)) => {
                    let prompt = agents::node_prompt(&definition.name, node, spec, state);
                    agents::agent(
                        &manager,
                        deps.jobs.as_ref(),
                        &child,
                        session,
                        node,
                        spec,
                        prompt,
                    )
                    .await
                }
                Err(e) => Err(e),
            }
        };
        match result {
            Ok(answer) => return Ok(Ok(answer)),
            Err(_) if turn.cancel.is_cancelled() => return Ok(Err("cancelled".into())),
            Err(error) => {
                attempt += 1;
                // The reason goes into `errors` (when the pipeline keeps it),
                // where the node's next attempt can read it.
                let noted =
                    Map::from_iter([("errors".to_owned(), json!([format!("{node}: {error}")]))]);
                super::state::apply(state, &definition.state, noted);
                session.emit(EventKind::NodeFailed {
                    node: node.to_owned(),
                    error: error.clone(),
                    attempt,
                })?;
                if attempt > deps.config.node_retries {
                    return Ok(Err(format!(
                        "{node} failed {attempt} times (pipelines.node_retries = {}): {error}",
                        deps.config.node_retries
                    )));
                }
            }
        }
    }
}

/// The run's agent session, made at its first real node: every node of
/// the run works in its sandbox.
async fn worker_of(
    deps: &Deps,
    session: &Arc<Session>,
    options: &PipelineOptions,
    worker: &mut Option<(Arc<SessionManager>, Arc<Session>)>,
) -> Result<(Arc<SessionManager>, Arc<Session>), String> {
    if let Some(found) = worker {
        return Ok(found.clone());
    }
    let manager = deps
        .sessions
        .upgrade()
        .ok_or("the server is shutting down")?;
    let child = match runs::worker_id(deps.store.as_ref(), session.id)
        .await
        .map_err(|e| e.to_string())?
    {
        Some(id) => manager.get(id, None).await.ok(),
        None => None,
    };
    let child = match child {
        Some(child) => child,
        None => {
            let mut agent = json!({});
            if let Some(model) = &options.model {
                agent["model"] = json!(model);
            }
            // The nodes' calls follow the run's policy; the worker has the
            // run's owner, so that owner's key policy applies as well.
            if let Some(permissions) = &options.permissions {
                agent["permissions"] = json!(permissions);
            }
            let child = manager
                .create(NewSession {
                    name: Some(format!("nodes of pipeline session {}", session.id)),
                    kind: SessionKind::AGENT,
                    owner: session.owner.clone(),
                    options: agent,
                    ephemeral: false,
                    origin: None,
                    metadata: Default::default(),
                })
                .await
                .map_err(|e| e.to_string())?;
            runs::set_worker(deps.store.as_ref(), session.id, child.id)
                .await
                .map_err(|e| e.to_string())?;
            child
        }
    };
    let found = (manager, child);
    *worker = Some(found.clone());
    Ok(found)
}
