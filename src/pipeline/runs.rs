//! Runs as the REST paths under `/orchestrator/` see them: a `thread_id`
//! per run (`pipeline-{name}-{8 hex}`), kept in the store's KV (namespace
//! `_pipelines`, which no API key's bus can name) with the run's session,
//! and start, status, history, resume, cancel, the active runs.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::engine::{END, Step, step_of};
use super::{KIND, PipelineOptions};
use crate::protocol::{SessionRecord, SessionStatus};
use crate::session::approvals::Approvals;
use crate::session::{NewSession, OptionError, Session, SessionError, SessionManager};
use crate::store::{Expect, KvStore, SessionFilter, Store, StoreError, kv_json};

const NAMESPACE: &str = "_pipelines";
/// How long a cancel waits for the run to stop before it answers.
const CANCEL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A run as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub thread_id: String,
    pub session_id: Uuid,
    pub pipeline: String,
    pub owner: Option<String>,
    pub created_at: DateTime<Utc>,
    /// Set by a cancel, so a stop between nodes reads as cancelled.
    #[serde(default)]
    pub cancelled: bool,
    /// The agent session the run's nodes work in.
    #[serde(default)]
    pub worker: Option<Uuid>,
}

/// A run that has started.
#[derive(Debug, Clone, Serialize)]
pub struct Started {
    pub thread_id: String,
    pub session_id: Uuid,
    pub pipeline: String,
    pub status: &'static str,
}

/// What the run routes refuse.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("pipeline run {0:?} not found")]
    NotFound(String),
    #[error("pipeline run {0:?} is {1}")]
    Conflict(String, String),
    /// A fork at a step the run has no checkpoint of.
    #[error("pipeline run {thread_id:?} has no step {step}; its steps: {steps}")]
    UnknownStep {
        thread_id: String,
        step: u64,
        steps: String,
    },
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn owner_part(owner: Option<&str>) -> &str {
    owner.unwrap_or("local")
}

fn record_key(owner: Option<&str>, thread_id: &str) -> String {
    format!("r/{}/{thread_id}", owner_part(owner))
}

fn session_key(session: Uuid) -> String {
    format!("s/{session}")
}

/// `pipeline-{name}-{8 hex}`, the name made safe for a path.
pub fn thread_id(name: &str) -> String {
    let slug: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(48)
        .collect();
    let hex = Uuid::new_v4().simple().to_string();
    format!("pipeline-{slug}-{}", &hex[..8])
}

async fn put(store: &dyn KvStore, record: &RunRecord) -> Result<(), StoreError> {
    let value = serde_json::to_vec(record)
        .map_err(|e| StoreError::Corrupt(format!("encoding a run: {e}")))?;
    store
        .kv_put(
            NAMESPACE,
            &record_key(record.owner.as_deref(), &record.thread_id),
            &value,
            Expect::Any,
        )
        .await?;
    store
        .kv_put(
            NAMESPACE,
            &session_key(record.session_id),
            record_key(record.owner.as_deref(), &record.thread_id).as_bytes(),
            Expect::Any,
        )
        .await?;
    Ok(())
}

async fn get(
    store: &dyn KvStore,
    owner: Option<&str>,
    thread_id: &str,
) -> Result<Option<RunRecord>, StoreError> {
    let key = record_key(owner, thread_id);
    kv_json(store, NAMESPACE, &key, &format!("run {thread_id}")).await
}

/// The run of a session, through the session's index entry.
async fn by_session(store: &dyn KvStore, session: Uuid) -> Result<Option<RunRecord>, StoreError> {
    let Some(index) = store.kv_get(NAMESPACE, &session_key(session)).await? else {
        return Ok(None);
    };
    let key = String::from_utf8_lossy(&index.value).into_owned();
    kv_json(store, NAMESPACE, &key, &format!("run of session {session}")).await
}

/// The session's run, made at its first turn when the session was created
/// as a session of the kind.
pub async fn record_of(
    store: &dyn KvStore,
    session: &Session,
    options: &PipelineOptions,
) -> Result<RunRecord, StoreError> {
    if let Some(record) = by_session(store, session.id).await? {
        return Ok(record);
    }
    let record = RunRecord {
        thread_id: thread_id(
            options
                .connector_name
                .as_deref()
                .unwrap_or(&options.pipeline),
        ),
        session_id: session.id,
        pipeline: options.pipeline.clone(),
        owner: session.owner.clone(),
        created_at: Utc::now(),
        cancelled: false,
        worker: None,
    };
    put(store, &record).await?;
    Ok(record)
}

pub async fn is_cancelled(store: &dyn KvStore, record: &RunRecord) -> Result<bool, StoreError> {
    Ok(get(store, record.owner.as_deref(), &record.thread_id)
        .await?
        .is_some_and(|r| r.cancelled))
}

pub async fn worker_id(store: &dyn KvStore, session: Uuid) -> Result<Option<Uuid>, StoreError> {
    Ok(by_session(store, session).await?.and_then(|r| r.worker))
}

pub async fn set_worker(
    store: &dyn KvStore,
    session: Uuid,
    worker: Uuid,
) -> Result<(), StoreError> {
    if let Some(mut record) = by_session(store, session).await? {
        record.worker = Some(worker);
        put(store, &record).await?;
    }
    Ok(())
}

/// Forgets the session's run; answers its worker session to delete.
pub async fn remove(store: &dyn KvStore, session: Uuid) -> Result<Option<Uuid>, StoreError> {
    let Some(record) = by_session(store, session).await? else {
        return Ok(None);
    };
    store
        .kv_delete(
            NAMESPACE,
            &record_key(record.owner.as_deref(), &record.thread_id),
            Expect::Any,
        )
        .await?;
    store
        .kv_delete(NAMESPACE, &session_key(session), Expect::Any)
        .await?;
    Ok(record.worker)
}

/// The runs service of the REST routes.
pub struct Runs {
    pub(super) sessions: Arc<SessionManager>,
    pub(super) store: Arc<dyn Store>,
    queued: Arc<std::sync::Mutex<std::collections::HashSet<Uuid>>>,
    pub(super) definitions: Arc<std::collections::BTreeMap<String, Arc<super::Definition>>>,
    config: super::PipelineConfig,
    approvals: Arc<Approvals>,
}

impl Runs {
    pub fn new(
        sessions: Arc<SessionManager>,
        store: Arc<dyn Store>,
        queued: Arc<std::sync::Mutex<std::collections::HashSet<Uuid>>>,
        definitions: Arc<std::collections::BTreeMap<String, Arc<super::Definition>>>,
        config: super::PipelineConfig,
        approvals: Arc<Approvals>,
    ) -> Runs {
        Runs {
            sessions,
            store,
            queued,
            definitions,
            config,
            approvals,
        }
    }

    /// The definitions, for `GET /orchestrator/pipelines`.
    pub fn definitions(&self) -> Vec<Value> {
        self.definitions
            .values()
            .map(|d| {
                json!({"name": d.name, "description": d.description, "start": d.start,
                       "terminal": d.terminal, "counters": d.counters,
                       "nodes": d.nodes.keys().collect::<Vec<_>>(), "edges": d.edges,
                       "state": d.state})
            })
            .collect()
    }

    /// `GET /orchestrator/health`.
    pub fn health(&self) -> Value {
        json!({"status": "ok", "test_mode": self.config.test_mode,
               "max_concurrent_pipelines": self.config.max_concurrent_pipelines,
               "max_concurrent_per_key": self.config.max_concurrent_per_key(),
               "pipeline_timeout_s": self.config.pipeline_timeout_s,
               "queued": self.queued(),
               "pipelines": self.definitions.keys().collect::<Vec<_>>()})
    }

    /// `{pipeline, connector_name, connector_type, input, …}` → the run's
    /// `thread_id`, at once.
    pub async fn start(
        &self,
        owner: Option<String>,
        body: &Map<String, Value>,
    ) -> Result<Started, RunError> {
        let task = self.sessions.tasks().require(KIND.as_str(), "kind")?;
        let options_json = crate::session::options::as_written(task.as_ref(), body, &[]).await?;
        let options: PipelineOptions = serde_json::from_value(options_json.clone())
            .map_err(|e| SessionError::Internal(format!("reading stored options: {e}")))?;
        let session = self
            .sessions
            .create(NewSession {
                name: None,
                kind: KIND,
                owner: owner.clone(),
                options: options_json,
                ephemeral: false,
                origin: None,
                metadata: Default::default(),
            })
            .await?;
        let record = record_of(self.store.as_ref(), &session, &options).await?;
        let request = options
            .input
            .get("original_request")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        self.sessions.start_turn(session, request, false).await?;
        Ok(Started {
            thread_id: record.thread_id,
            session_id: record.session_id,
            pipeline: record.pipeline,
            status: "started",
        })
    }

    /// The session a run runs in.
    pub async fn session(&self, id: Uuid) -> Result<Arc<Session>, RunError> {
        Ok(self.sessions.get(id, None).await?)
    }

    pub(super) async fn find(
        &self,
        owner: Option<&str>,
        thread_id: &str,
    ) -> Result<(RunRecord, Arc<Session>), RunError> {
        let record = get(self.store.as_ref(), owner, thread_id)
            .await?
            .ok_or_else(|| RunError::NotFound(thread_id.to_owned()))?;
        let session = self
            .sessions
            .get(record.session_id, owner)
            .await
            .map_err(|_| RunError::NotFound(thread_id.to_owned()))?;
        Ok((record, session))
    }

    async fn steps(&self, session: Uuid) -> Result<Vec<(u64, DateTime<Utc>, Step)>, RunError> {
        let mut steps = Vec::new();
        for checkpoint in self.store.checkpoints(session).await? {
            steps.push((
                checkpoint.step,
                checkpoint.created_at,
                step_of(&checkpoint)?,
            ));
        }
        Ok(steps)
    }

    /// Where a run stands: queued, running, completed, failed, cancelled
    /// or interrupted; its node (`node_status` says whether it runs or
    /// waits for a decision on the `waiting` tool calls), state, counters
    /// and timing.
    /// The `thread_id` of a session's run, once its first turn made one.
    pub async fn thread_of(&self, session: Uuid) -> Result<Option<String>, RunError> {
        Ok(by_session(self.store.as_ref(), session)
            .await?
            .map(|record| record.thread_id))
    }

    pub async fn status(&self, owner: Option<&str>, thread_id: &str) -> Result<Value, RunError> {
        let (record, session) = self.find(owner, thread_id).await?;
        let steps = self.steps(session.id).await?;
        let last = steps.last();
        let queued = crate::sync::lock(&self.queued).contains(&session.id);
        let status = if queued {
            "queued".to_owned()
        } else if session.is_running() || session.status() == SessionStatus::Running {
            // Here, or on another replica as the store says (a run resumed
            // on a survivor is running before its next checkpoint).
            "running".to_owned()
        } else {
            match last {
                Some((_, _, step)) if step.status != "running" => step.status.clone(),
                // A turn cut off with nodes still to run.
                _ if session.status() == SessionStatus::Interrupted => "interrupted".to_owned(),
                None => "pending".to_owned(),
                Some(_) => "interrupted".to_owned(),
            }
        };
        let (node, state, counters, reason) = match last {
            Some((_, _, step)) => (
                if status == "running" {
                    step.next.clone()
                } else {
                    Some(step.node.clone())
                },
                json!(step.state),
                json!(step.counters),
                step.reason.clone(),
            ),
            None => (None, json!({}), json!({}), None),
        };
        // A node whose agent waits for a decision on a tool call says so,
        // with the calls (decided through this run's session).
        let waiting = if status == "running" {
            self.approvals
                .of_agents(record.owner.as_deref(), session.id, None, None)
                .await?
        } else {
            Vec::new()
        };
        let node = node.or_else(|| waiting.first().and_then(|p| p.agent_id.clone()));
        let node_status = match (status.as_str(), waiting.is_empty()) {
            ("running", true) => Some("running"),
            ("running", false) => Some("waiting_approval"),
            _ => None,
        };
        let waiting: Vec<Value> = waiting
            .iter()
            .map(|p| {
                json!({"call_id": p.call_id, "tool": p.tool, "input": p.input,
                       "reason": p.reason, "node": p.agent_id, "session_id": p.session_id,
                       "requested_at": p.requested_at, "expires_at": p.expires_at})
            })
            .collect();
        let updated = last.map_or(record.created_at, |(_, at, _)| *at);
        Ok(json!({
            "thread_id": record.thread_id,
            "session_id": record.session_id,
            "pipeline": record.pipeline,
            "status": status,
            "node": node,
            "node_status": node_status,
            "waiting": waiting,
            "state": state,
            "counters": counters,
            "reason": reason,
            "steps": steps.iter().filter(|(_, _, s)| s.node != END).count(),
            "started_at": record.created_at,
            "updated_at": updated,
            "duration_ms": (updated - record.created_at).num_milliseconds().max(0),
        }))
    }

    /// Every checkpoint: node, decision, state, timing.
    pub async fn history(&self, owner: Option<&str>, thread_id: &str) -> Result<Value, RunError> {
        let (record, session) = self.find(owner, thread_id).await?;
        let steps: Vec<Value> = self
            .steps(session.id)
            .await?
            .into_iter()
            .map(|(step, at, data)| {
                json!({"step": step, "node": data.node, "decision": data.decision, "next": data.next,
                       "status": data.status, "reason": data.reason, "state": data.state,
                       "counters": data.counters, "duration_ms": data.duration_ms, "at": at})
            })
            .collect();
        Ok(json!({"thread_id": record.thread_id, "history": steps}))
    }

    /// Continues a stopped run after its last checkpoint.
    pub async fn resume(&self, owner: Option<&str>, thread_id: &str) -> Result<Value, RunError> {
        let (mut record, session) = self.find(owner, thread_id).await?;
        if session.is_running() {
            return Err(RunError::Conflict(thread_id.to_owned(), "running".into()));
        }
        let steps = self.steps(session.id).await?;
        if let Some((_, _, last)) = steps.last()
            && last.next.is_none()
        {
            return Err(RunError::Conflict(
                thread_id.to_owned(),
                format!("{} and cannot resume", last.status),
            ));
        }
        record.cancelled = false;
        put(self.store.as_ref(), &record).await?;
        self.sessions
            .start_turn(session, String::new(), false)
            .await?;
        Ok(json!({"thread_id": record.thread_id, "status": "resumed",
                  "from_step": steps.iter().filter(|(_, _, s)| s.node != END).count()}))
    }

    /// Stops a running run: the node's turn and its sandbox processes;
    /// answers once it stopped (`cancelled`), or after [`CANCEL_WAIT`]
    /// with `cancelling`.
    pub async fn cancel(&self, owner: Option<&str>, thread_id: &str) -> Result<Value, RunError> {
        let (mut record, session) = self.find(owner, thread_id).await?;
        if !session.is_running() {
            return Err(RunError::Conflict(
                thread_id.to_owned(),
                "not running".into(),
            ));
        }
        record.cancelled = true;
        put(self.store.as_ref(), &record).await?;
        // Followed from before the interrupt, so its `result` is not missed.
        let ended = session.subscribe(session.last_seq(), true);
        if let Some(worker) = record.worker
            && let Ok(worker) = self.sessions.get(worker, None).await
        {
            worker.interrupt();
        }
        session.interrupt();
        // A run stops at once but for a node's tool call: answered once it
        // stopped (a status read next says `cancelled`), or `cancelling`.
        let drained = ended.for_each(|_| async {});
        let stopped = tokio::time::timeout(CANCEL_WAIT, drained).await.is_ok();
        let status = if stopped { "cancelled" } else { "cancelling" };
        Ok(json!({"thread_id": record.thread_id, "status": status}))
    }

    /// The owner's latest `limit` runs, newest first, each as its status.
    pub async fn recent(&self, owner: Option<&str>, limit: usize) -> Result<Vec<Value>, RunError> {
        let filter = SessionFilter {
            owner: owner.map(str::to_owned),
            kind: Some(KIND),
            limit: Some(limit),
            ..SessionFilter::default()
        };
        let mut runs = Vec::new();
        for record in self.sessions.list(&filter).await? {
            if let Some(run) = by_session(self.store.as_ref(), record.id).await? {
                runs.push(self.status(owner, &run.thread_id).await?);
            }
        }
        Ok(runs)
    }

    /// The owner's runs that are running or queued (as their sessions
    /// know it at once, not as the store has it yet).
    pub async fn active(&self, owner: Option<&str>) -> Result<Vec<Value>, RunError> {
        let filter = SessionFilter {
            owner: owner.map(str::to_owned),
            kind: Some(KIND),
            limit: Some(10_000),
            ..SessionFilter::default()
        };
        let sessions: Vec<SessionRecord> = self.sessions.list(&filter).await?;
        let mut active = Vec::new();
        for record in sessions {
            if record.status == SessionStatus::Closed {
                continue;
            }
            let Ok(session) = self.sessions.get(record.id, owner).await else {
                continue;
            };
            if !session.is_running() {
                continue;
            }
            if let Some(run) = by_session(self.store.as_ref(), session.id).await? {
                active.push(self.status(owner, &run.thread_id).await?);
            }
        }
        Ok(active)
    }

    pub fn queued(&self) -> usize {
        crate::sync::lock(&self.queued).len()
    }
}

impl From<OptionError> for RunError {
    fn from(error: OptionError) -> Self {
        RunError::Session(error.into())
    }
}
