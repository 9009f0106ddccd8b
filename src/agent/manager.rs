//! The session manager: creates, finds, lists and deletes sessions, starts
//! turns, and closes turns a crash cut off.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::Utc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::events::{ResultStatus, Usage};
use super::options::{AgentOptions, OptionError};
use super::session::Session;
use super::tools::ToolRouter;
use super::turn::{self, TurnDeps};
use crate::config::AgentConfig;
use crate::model::{Message, ModelRegistry};
use crate::store::{SessionFilter, SessionKind, SessionRecord, SessionStatus, Store, StoreError};
use crate::telemetry::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("session {0} not found")]
    NotFound(Uuid),
    #[error(
        "session {0} is running a turn; interrupt it, wait for its result, or send with \"queue\": true"
    )]
    Busy(Uuid),
    #[error("session {0} is closed")]
    Closed(Uuid),
    #[error("invalid option {0}")]
    Option(#[from] OptionError),
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Everything a new session needs.
#[derive(Debug, Clone)]
pub struct NewSession {
    pub name: Option<String>,
    pub kind: SessionKind,
    pub owner: Option<String>,
    pub options: AgentOptions,
    pub ephemeral: bool,
}

/// A turn that has started: stream its events from `since`.
pub struct StartedTurn {
    pub session: Arc<Session>,
    /// The last `seq` before the turn's first event.
    pub since: u64,
    /// Cancels the turn; `/agent/run` fires it when its client leaves.
    pub cancel: CancellationToken,
}

pub struct SessionManager {
    store: Arc<dyn Store>,
    deps: Arc<TurnDeps>,
    live: Mutex<HashMap<Uuid, Arc<Session>>>,
    /// Parent of every turn's token: cancelled at shutdown.
    shutdown: CancellationToken,
    /// Parent of every session's `closed` token: cancelled at shutdown once
    /// the turns have written their results, ending follow streams.
    followers: CancellationToken,
    turns: TaskTracker,
}

impl SessionManager {
    pub fn new(
        store: Arc<dyn Store>,
        models: Arc<ModelRegistry>,
        tools: Arc<dyn ToolRouter>,
        config: AgentConfig,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> SessionManager {
        SessionManager {
            store: store.clone(),
            deps: Arc::new(TurnDeps {
                store,
                models,
                tools,
                config,
                metrics,
            }),
            live: Mutex::new(HashMap::new()),
            shutdown,
            followers: CancellationToken::new(),
            turns: TaskTracker::new(),
        }
    }

    pub fn models(&self) -> &ModelRegistry {
        &self.deps.models
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Arc<Session>>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn track(&self, session: Arc<Session>) -> Arc<Session> {
        let mut live = self.live();
        let entry = live.entry(session.id).or_insert(session).clone();
        self.deps.metrics.sessions_live.set(live.len() as i64);
        entry
    }

    pub async fn create(&self, new: NewSession) -> Result<Arc<Session>, AgentError> {
        if let Some(model) = &new.options.model {
            self.deps
                .models
                .resolve(model)
                .map_err(|e| OptionError::new("options.model", e.to_string()))?;
        }
        let now = Utc::now();
        let record = SessionRecord {
            id: Uuid::new_v4(),
            name: new.name,
            kind: new.kind,
            owner: new.owner,
            options: serde_json::to_value(&new.options)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?,
            // An ephemeral session exists to run its one turn: stored as
            // running from the start, it saves the turn a commit before
            // its first event.
            status: if new.ephemeral {
                SessionStatus::Running
            } else {
                SessionStatus::Idle
            },
            usage: Usage::default(),
            ephemeral: new.ephemeral,
            created_at: now,
            updated_at: now,
        };
        self.store.create_session(&record).await?;
        self.deps.metrics.sessions_created.inc();
        let session = Session::from_record(
            record,
            new.options,
            0,
            self.store.clone(),
            self.deps.metrics.clone(),
            self.followers.child_token(),
        );
        Ok(self.track(Arc::new(session)))
    }

    /// Finds a session the caller may see; another owner's is "not found".
    pub async fn get(&self, id: Uuid, owner: Option<&str>) -> Result<Arc<Session>, AgentError> {
        let cached = self.live().get(&id).cloned();
        let session = match cached {
            Some(session) => session,
            None => {
                let record = self
                    .store
                    .get_session(id)
                    .await?
                    .ok_or(AgentError::NotFound(id))?;
                let options: AgentOptions = serde_json::from_value(record.options.clone())
                    .map_err(|e| StoreError::Corrupt(format!("options of session {id}: {e}")))?;
                let last_seq = self.store.last_seq(id).await?;
                self.track(Arc::new(Session::from_record(
                    record,
                    options,
                    last_seq,
                    self.store.clone(),
                    self.deps.metrics.clone(),
                    self.followers.child_token(),
                )))
            }
        };
        if owner.is_some() && session.owner.as_deref() != owner {
            return Err(AgentError::NotFound(id));
        }
        Ok(session)
    }

    /// Forgets sessions nobody holds (no turn, stream or socket); they load
    /// again from the store when asked for. Returns how many went.
    pub fn evict_unused(&self) -> usize {
        let mut live = self.live();
        let before = live.len();
        // The map's own reference is the only one left: nobody can be using
        // it, and nobody can take it while the map is locked.
        live.retain(|_, session| Arc::strong_count(session) > 1);
        self.deps.metrics.sessions_live.set(live.len() as i64);
        before - live.len()
    }

    pub async fn list(&self, filter: &SessionFilter) -> Result<Vec<SessionRecord>, AgentError> {
        let mut records = self.store.list_sessions(filter).await?;
        // Live sessions know their latest status and usage.
        let live = self.live();
        for record in &mut records {
            if let Some(session) = live.get(&record.id) {
                let state = session.lock_state();
                record.status = state.status;
                record.usage = state.usage.clone();
                record.updated_at = state.updated_at;
            }
        }
        Ok(records)
    }

    /// A session's stored record, whoever owns it.
    pub async fn record(&self, id: Uuid) -> Result<Option<SessionRecord>, AgentError> {
        Ok(self.store.get_session(id).await?)
    }

    /// Deletes the closed ephemeral sessions last updated more than
    /// `agent.ephemeral_retention_s` ago. Returns how many went.
    pub async fn expire_ephemeral(&self) -> Result<usize, AgentError> {
        let retention = self.deps.config.ephemeral_retention_s;
        if retention == 0 {
            return Ok(0);
        }
        let cutoff = Utc::now() - chrono::TimeDelta::seconds(retention as i64);
        let mut removed = 0;
        loop {
            let expired = self.store.expired_ephemeral(cutoff, 256).await?;
            if expired.is_empty() {
                return Ok(removed);
            }
            for id in expired {
                match self.delete(id, None).await {
                    Ok(()) | Err(AgentError::NotFound(_)) => removed += 1,
                    Err(e) => return Err(e),
                }
            }
        }
    }

    pub async fn history(&self, session: &Session) -> Result<Vec<Message>, AgentError> {
        Ok(self.store.messages(session.id).await?)
    }

    /// Stops the session's turn, frees its tools' resources and forgets it.
    pub async fn delete(&self, id: Uuid, owner: Option<&str>) -> Result<(), AgentError> {
        let session = self.get(id, owner).await?;
        session.interrupt();
        // Wait for the turn to close before the rows go.
        let _turn = session.turn_lock.lock().await;
        session.closed.cancel();
        self.deps.tools.delete(id).await;
        self.store.delete_session(id).await?;
        let mut live = self.live();
        live.remove(&id);
        self.deps.metrics.sessions_live.set(live.len() as i64);
        Ok(())
    }

    /// Starts a turn. Without `queue` a running session answers `Busy`
    /// (a turn that has already sent its result is waited for); with it
    /// the call waits for the running turn to end.
    pub async fn start_turn(
        &self,
        session: Arc<Session>,
        prompt: String,
        queue: bool,
    ) -> Result<StartedTurn, AgentError> {
        if self.shutdown.is_cancelled() {
            return Err(AgentError::ShuttingDown);
        }
        let guard = if queue {
            tokio::select! {
                guard = session.turn_lock.clone().lock_owned() => guard,
                _ = self.shutdown.cancelled() => return Err(AgentError::ShuttingDown),
                _ = session.closed.cancelled() => return Err(AgentError::NotFound(session.id)),
            }
        } else {
            match session.turn_lock.clone().try_lock_owned() {
                Ok(guard) => guard,
                // A turn that holds the lock but no longer runs has sent its
                // result and is only writing it out: wait for it, briefly.
                Err(_) if !session.is_running() => session.turn_lock.clone().lock_owned().await,
                Err(_) => return Err(AgentError::Busy(session.id)),
            }
        };
        if session.closed.is_cancelled() {
            return Err(AgentError::NotFound(session.id));
        }
        if session.status() == SessionStatus::Closed {
            return Err(AgentError::Closed(session.id));
        }
        let cancel = self.shutdown.child_token();
        *session.running.lock().unwrap_or_else(|e| e.into_inner()) = Some(cancel.clone());
        let since = session.last_seq();
        let deps = self.deps.clone();
        let turn_session = session.clone();
        let turn_cancel = cancel.clone();
        self.turns.spawn(async move {
            turn::run(&deps, &turn_session, prompt, turn_cancel).await;
            *turn_session
                .running
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = None;
            drop(guard);
        });
        Ok(StartedTurn {
            session,
            since,
            cancel,
        })
    }

    /// Closes the turns a crash cut off: each gets an `interrupted` result
    /// and its history is left consistent for the next turn.
    pub async fn recover(&self) -> Result<usize, AgentError> {
        let cut_off = self
            .store
            .sessions_with_status(SessionStatus::Running)
            .await?;
        for record in &cut_off {
            let session = self.get(record.id, None).await?;
            turn::close_cut_off(&self.deps, &session).await?;
        }
        Ok(cut_off.len())
    }

    /// Cancels every running turn and waits until each has written its result.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        self.turns.close();
        self.turns.wait().await;
        self.followers.cancel();
    }
}

/// Result status → session status once a turn is over.
pub(super) fn status_after(session: &Session, result: ResultStatus) -> SessionStatus {
    if session.ephemeral {
        SessionStatus::Closed
    } else if result == ResultStatus::Interrupted {
        SessionStatus::Interrupted
    } else {
        SessionStatus::Idle
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;
    use crate::agent::NoTools;
    use crate::config::Config;
    use crate::store::SqliteStore;

    fn manager(dir: &tempfile::TempDir) -> SessionManager {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("c.db")).unwrap());
        let config = Config::default();
        SessionManager::new(
            store,
            Arc::new(ModelRegistry::from_config(&config).unwrap()),
            Arc::new(NoTools),
            config.agent.clone(),
            Arc::new(Metrics::new()),
            CancellationToken::new(),
        )
    }

    async fn new_session(manager: &SessionManager) -> Arc<Session> {
        manager
            .create(NewSession {
                name: Some("kept".into()),
                kind: SessionKind::Agent,
                owner: None,
                options: AgentOptions::default(),
                ephemeral: false,
            })
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_cut_off_turn_whose_result_was_stored_only_gets_its_status() {
        let dir = tempfile::tempdir().unwrap();
        let manager = manager(&dir);
        let session = new_session(&manager).await;
        session
            .set_state(SessionStatus::Running, None)
            .await
            .unwrap();
        session
            .emit(crate::agent::events::EventKind::Result {
                status: crate::agent::events::ResultStatus::Success,
                result: Some("done".into()),
                cost_usd: 0.0,
                cost_known: true,
                turns: 1,
                usage: Usage::default(),
                duration_ms: 1,
            })
            .unwrap();
        session.flush().await.unwrap();
        assert_eq!(manager.recover().await.unwrap(), 1);
        assert_eq!(
            (session.status(), session.last_seq()),
            (SessionStatus::Idle, 1)
        );
        assert_eq!(manager.recover().await.unwrap(), 0);
    }

    #[tokio::test]
    async fn unused_sessions_are_evicted_and_load_again_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let manager = manager(&dir);
        let session = new_session(&manager).await;
        let id = session.id;
        let turn = manager
            .start_turn(session, "hi".into(), false)
            .await
            .unwrap();
        let events: Vec<_> = turn.session.subscribe(turn.since, true).collect().await;
        assert_eq!(events.len(), 3);
        assert_eq!(manager.evict_unused(), 0, "the turn still holds it");
        drop(turn);
        // The turn task lets go of its reference once it has finished.
        while manager.evict_unused() == 0 {
            tokio::task::yield_now().await;
        }
        let again = manager.get(id, None).await.unwrap();
        assert_eq!(
            (
                again.name.as_deref(),
                again.status(),
                again.last_seq(),
                again.usage().turns
            ),
            (Some("kept"), SessionStatus::Idle, 3, 1)
        );
    }
}
