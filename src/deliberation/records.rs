//! The durable result of every deliberation, kept in the store's KV (a
//! namespace of its own that no API key's bus can name), its listing per
//! owner, and [`Deliberations`]: submit, poll and list, as the HTTP, gRPC
//! and MCP surfaces share them.
//!
//! A record is written `PENDING` when the deliberation starts and once
//! more when it ends; while it runs, a read folds the results that have
//! arrived from the session's event log, so nothing is written per agent.

use std::sync::Arc;

use chrono::Utc;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::{DeliberationOptions, KIND};
use crate::bus::StorageError;
use crate::model::ModelRegistry;
use crate::protocol::deliberation::{AgentResult, DeliberationResult, DeliberationStatus};
use crate::protocol::{Event, EventKind};
use crate::session::{NewSession, OptionError, Session, SessionError, SessionManager};
use crate::store::{Expect, KvStore, Store, StoreError, kv_json};

const NAMESPACE: &str = "_deliberations";

/// What deliberation calls refuse.
#[derive(Debug, thiserror::Error)]
pub enum DeliberationError {
    #[error("deliberation {0} not found")]
    NotFound(Uuid),
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<OptionError> for DeliberationError {
    fn from(error: OptionError) -> Self {
        DeliberationError::Session(error.into())
    }
}

/// A deliberation as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Stored {
    #[serde(flatten)]
    pub result: DeliberationResult,
    pub owner: Option<String>,
    /// The session log's last `seq` before the deliberation began.
    pub since: u64,
    /// The sessions of its tool-using agents, deleted once it is over.
    #[serde(default)]
    pub children: Vec<Uuid>,
}

impl Stored {
    /// A deliberation that starts now, every agent pending.
    pub fn pending(
        task_id: Uuid,
        session_id: Uuid,
        owner: Option<String>,
        since: u64,
        task_description: &str,
        options: &DeliberationOptions,
        default_model: &str,
    ) -> Stored {
        let results = (0..options.num_agents as usize)
            .map(|i| AgentResult {
                agent_id: options.agent_id(i),
                role: options.role.clone(),
                proposal: None,
                status: "pending".into(),
                error: None,
                duration_ms: 0,
                model: options.model_of(i, default_model),
            })
            .collect();
        Stored {
            result: DeliberationResult {
                task_id,
                status: DeliberationStatus::Pending,
                session_id,
                task_description: task_description.to_owned(),
                role: options.role.clone(),
                results,
                total_agents: options.num_agents,
                successful_responses: 0,
                decision: None,
                reason: None,
                duration_ms: None,
                created_at: Utc::now(),
            },
            owner,
            since,
            children: Vec::new(),
        }
    }

    /// Applies the events of the deliberation's log that say what its
    /// agents answered, as they are read back after `since`.
    pub fn fold(&mut self, events: &[Event]) {
        let result = &mut self.result;
        for event in events {
            let agent = |result: &mut DeliberationResult| {
                let id = event.agent_id.as_deref()?;
                result.results.iter().position(|a| a.agent_id == id)
            };
            match &event.kind {
                EventKind::AgentCompleted {
                    proposal,
                    duration_ms,
                    ..
                } => {
                    if let Some(i) = agent(result) {
                        let agent = &mut result.results[i];
                        agent.proposal = Some(proposal.clone());
                        agent.status = "completed".into();
                        agent.error = None;
                        agent.duration_ms = *duration_ms;
                    }
                }
                EventKind::AgentFailed {
                    error, duration_ms, ..
                } => {
                    if let Some(i) = agent(result)
                        && result.results[i].proposal.is_none()
                    {
                        let agent = &mut result.results[i];
                        agent.status = "failed".into();
                        agent.error = Some(error.clone());
                        agent.duration_ms = *duration_ms;
                    }
                }
                EventKind::Decision { decision } => result.decision = Some(decision.clone()),
                _ => {}
            }
        }
        result.successful_responses = result
            .results
            .iter()
            .filter(|a| a.proposal.is_some())
            .count() as u32;
    }

    /// Ends it with what has arrived: agents still pending failed with
    /// `reason`, COMPLETED when one succeeded, else FAILED.
    pub fn finish(&mut self, reason: Option<&str>) {
        let result = &mut self.result;
        for agent in &mut result.results {
            if agent.status == "pending" {
                agent.status = "failed".into();
                agent.error = Some(reason.unwrap_or("no answer").to_owned());
            }
        }
        result.successful_responses = result
            .results
            .iter()
            .filter(|a| a.proposal.is_some())
            .count() as u32;
        result.status = if result.successful_responses > 0 {
            DeliberationStatus::Completed
        } else {
            DeliberationStatus::Failed
        };
        result.reason = reason.map(str::to_owned);
        let elapsed = Utc::now() - result.created_at;
        result.duration_ms = Some(elapsed.num_milliseconds().max(0) as u64);
    }
}

fn owner_part(owner: Option<&str>) -> &str {
    owner.unwrap_or("local")
}

fn record_key(owner: Option<&str>, task_id: Uuid) -> String {
    format!("r/{}/{task_id}", owner_part(owner))
}

fn index_key(session_id: Uuid, task_id: Uuid) -> String {
    format!("s/{session_id}/{task_id}")
}

/// The bytes of a key's deliberation records, counted in its
/// `storage_mb`.
struct RecordBytes(Arc<dyn Store>);

#[async_trait::async_trait]
impl crate::store::KeptBytes for RecordBytes {
    async fn kept_bytes(&self, owner: &str) -> Result<u64, StoreError> {
        let prefix = format!("r/{}/", owner_part(Some(owner)));
        let records = self.0.kv_list(NAMESPACE, &prefix, usize::MAX).await?;
        Ok(records.iter().map(|r| r.value.len() as u64).sum())
    }
}

/// Writes a record, and its entry in its session's index.
pub async fn put(store: &dyn KvStore, stored: &Stored) -> Result<(), StoreError> {
    let result = &stored.result;
    let value = serde_json::to_vec(stored)
        .map_err(|e| StoreError::Corrupt(format!("encoding a deliberation: {e}")))?;
    store
        .kv_put(
            NAMESPACE,
            &record_key(stored.owner.as_deref(), result.task_id),
            &value,
            Expect::Any,
        )
        .await?;
    let index = serde_json::json!({"owner": stored.owner, "pending": result.status == DeliberationStatus::Pending});
    store
        .kv_put(
            NAMESPACE,
            &index_key(result.session_id, result.task_id),
            index.to_string().as_bytes(),
            Expect::Any,
        )
        .await?;
    Ok(())
}

pub async fn get(
    store: &dyn KvStore,
    owner: Option<&str>,
    task_id: Uuid,
) -> Result<Option<Stored>, StoreError> {
    let key = record_key(owner, task_id);
    kv_json(store, NAMESPACE, &key, &format!("deliberation {task_id}")).await
}

/// The deliberations a session ran: `(task_id, owner, pending)`.
pub async fn of_session(
    store: &dyn KvStore,
    session_id: Uuid,
) -> Result<Vec<(Uuid, Option<String>, bool)>, StoreError> {
    let prefix = format!("s/{session_id}/");
    let entries = store.kv_list(NAMESPACE, &prefix, usize::MAX).await?;
    Ok(entries
        .iter()
        .filter_map(|entry| {
            let task_id = entry.key.strip_prefix(&prefix)?.parse().ok()?;
            let index: Value = serde_json::from_slice(&entry.value).ok()?;
            let owner = index["owner"].as_str().map(str::to_owned);
            Some((task_id, owner, index["pending"].as_bool().unwrap_or(false)))
        })
        .collect())
}

/// Forgets a deliberation.
pub async fn remove(
    store: &dyn KvStore,
    owner: Option<&str>,
    task_id: Uuid,
    session_id: Uuid,
) -> Result<(), StoreError> {
    store
        .kv_delete(NAMESPACE, &record_key(owner, task_id), Expect::Any)
        .await?;
    store
        .kv_delete(NAMESPACE, &index_key(session_id, task_id), Expect::Any)
        .await?;
    Ok(())
}

/// Submit, poll and list: what every surface of deliberations calls.
pub struct Deliberations {
    sessions: Arc<SessionManager>,
    /// A deliberation's place is taken when it is submitted, so one past
    /// its key's bound is refused with a `429`.
    running: Arc<super::running::Running>,
    /// A key past its `storage_mb` (records count in it) submits none.
    storage: Option<Arc<crate::bus::StorageMeter>>,
    store: Arc<dyn Store>,
    /// For the models of a pending record's agents.
    models: Arc<ModelRegistry>,
}

/// The most a listing returns.
pub const MAX_LISTED: usize = 500;

impl Deliberations {
    pub fn new(
        sessions: Arc<SessionManager>,
        running: Arc<super::running::Running>,
        storage: Option<Arc<crate::bus::StorageMeter>>,
        store: Arc<dyn Store>,
        models: Arc<ModelRegistry>,
    ) -> Deliberations {
        // Its records count in a key's `storage_mb`.
        if let Some(meter) = &storage {
            meter.count_also(Arc::new(RecordBytes(store.clone())));
        }
        Deliberations {
            sessions,
            running,
            storage,
            store,
            models,
        }
    }

    /// Starts a deliberation on `task_description` with the options in
    /// `body` (nested or flat) and answers at once, `PENDING`. It runs as
    /// the one turn of an ephemeral session whose id is the `task_id`.
    pub async fn submit(
        &self,
        owner: Option<String>,
        body: &Map<String, Value>,
    ) -> Result<DeliberationResult, DeliberationError> {
        let task_description = match body.get("task_description") {
            Some(Value::String(text)) if !text.trim().is_empty() => text.clone(),
            Some(Value::String(_)) | None => {
                return Err(OptionError::new("task_description", "is required").into());
            }
            Some(_) => return Err(OptionError::new("task_description", "must be a string").into()),
        };
        let task = self.sessions.tasks().require(KIND.as_str(), "kind")?;
        let options_json =
            crate::session::options::as_written(task.as_ref(), body, &["task_description"]).await?;
        let options: DeliberationOptions = serde_json::from_value(options_json.clone())
            .map_err(|e| SessionError::Internal(format!("reading stored options: {e}")))?;
        options.check_prompt_bytes("task_description", task_description.len())?;
        if let (Some(storage), Some(owner)) = (&self.storage, owner.as_deref()) {
            storage
                .admit(owner, task_description.len())
                .await
                .map_err(|e| match e {
                    StorageError::Exceeded(e) => SessionError::Quota(e),
                    other => SessionError::Internal(other.to_string()),
                })?;
        }
        let place = self
            .running
            .take(owner.as_deref(), options.calls())
            .map_err(SessionError::Quota)?;
        let session = self
            .sessions
            .create(NewSession {
                name: None,
                kind: KIND,
                owner: owner.clone(),
                options: options_json,
                ephemeral: true,
                origin: None,
                metadata: Default::default(),
            })
            .await?;
        let stored = Stored::pending(
            session.id,
            session.id,
            owner,
            0,
            &task_description,
            &options,
            // Known whenever an agent uses it: the options were checked.
            self.models.default_model().unwrap_or_default(),
        );
        put(self.store.as_ref(), &stored).await?;
        let id = session.id;
        self.running.keep(id, place);
        if let Err(e) = self
            .sessions
            .start_turn(session, task_description, false)
            .await
        {
            self.running.claim(id);
            return Err(e.into());
        }
        Ok(stored.result)
    }

    /// The session a deliberation runs in.
    pub async fn session(&self, id: Uuid) -> Result<Arc<Session>, DeliberationError> {
        Ok(self.sessions.get(id, None).await?)
    }

    /// A deliberation of `owner`; another owner's is not found. A running
    /// one shows the results that have arrived.
    pub async fn get(
        &self,
        owner: Option<&str>,
        task_id: Uuid,
    ) -> Result<DeliberationResult, DeliberationError> {
        let mut stored = get(self.store.as_ref(), owner, task_id)
            .await?
            .ok_or(DeliberationError::NotFound(task_id))?;
        if stored.result.status == DeliberationStatus::Pending {
            let events = self
                .store
                .events_since(stored.result.session_id, stored.since, usize::MAX)
                .await?;
            stored.fold(&events);
        }
        Ok(stored.result)
    }

    /// The owner's deliberations, newest first, without their agents'
    /// proposals (read one for those).
    pub async fn list(
        &self,
        owner: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeliberationResult>, DeliberationError> {
        let prefix = format!("r/{}/", owner_part(owner));
        let entries = self.store.kv_list(NAMESPACE, &prefix, usize::MAX).await?;
        let mut listed: Vec<DeliberationResult> = entries
            .iter()
            .filter_map(|entry| serde_json::from_slice::<Stored>(&entry.value).ok())
            .map(|stored| {
                let mut result = stored.result;
                result.results.clear();
                result
            })
            .collect();
        listed.sort_by_key(|b| std::cmp::Reverse(b.created_at));
        listed.truncate(limit.min(MAX_LISTED));
        Ok(listed)
    }
}
