//! The session manager: creates, finds, lists and deletes sessions of every
//! kind, runs their turns through their kind's task, and closes turns a
//! crash cut off.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::SessionError;
use super::lease::{HeldTurn, TurnLeases};
use super::live::Session;
use super::log::{EmbeddedLogs, EventLogs};
use super::signal::Signals;
use super::task::{SessionTask, Tasks, TurnOptions};
use crate::model::Message;
use crate::protocol::{SessionKind, SessionRecord, SessionStatus};
use crate::store::{SessionFilter, Store};
use crate::sync::lock;
use crate::telemetry::Metrics;

mod between;
mod context;
mod create;
mod metadata;
mod replicas;
mod rewind;
mod runner;

pub use between::BetweenTurns;
use runner::Runner;

/// How often a queued turn asks whether another replica's turn has let go.
const LEASE_POLL: Duration = Duration::from_millis(200);
/// The status event of a turn closed at start-up.
const CUT_OFF_BY_RESTART: &str = "The server restarted during this turn; it was interrupted.";
/// The status event of a turn closed by a replica that took over its lease.
const CUT_OFF_ELSEWHERE: &str =
    "The replica running this turn stopped answering; the turn was interrupted.";

/// Everything a new session needs.
#[derive(Debug, Clone)]
pub struct NewSession {
    pub name: Option<String>,
    pub kind: SessionKind,
    pub owner: Option<String>,
    /// As the kind's task returned them from [`SessionTask::options`].
    pub options: Value,
    pub ephemeral: bool,
    /// The protocol adapter making it, if one is.
    pub origin: Option<String>,
    /// The client's labels on it.
    pub metadata: serde_json::Map<String, Value>,
}

/// The limits of the machinery, the same for every kind.
#[derive(Debug, Clone)]
pub struct Limits {
    /// A turn's wall-clock limit; past it the turn ends `timed_out`.
    pub turn_timeout: Duration,
    /// How long a closed ephemeral session is kept; zero keeps them.
    pub ephemeral_retention: Duration,
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
    logs: Arc<dyn EventLogs>,
    tasks: Tasks,
    limits: Limits,
    metrics: Arc<Metrics>,
    live: Mutex<HashMap<Uuid, Arc<Session>>>,
    /// With replicas sharing the store: the turn leases that keep one turn
    /// per session among all of them. `None` on a store of its own.
    leases: Option<Arc<TurnLeases>>,
    /// With replicas: interrupts for turns that run on another one.
    signals: Option<Arc<Signals>>,
    /// The keys' `max_concurrent_sessions` and `max_concurrent_turns`.
    quotas: Option<Arc<crate::quota::Quotas>>,
    /// A key past its `storage_mb` (its sessions' event logs count) starts
    /// no turn.
    storage: Option<Arc<crate::bus::StorageMeter>>,
    /// Parent of every turn's token: cancelled at shutdown.
    shutdown: CancellationToken,
    /// Set when the replica is told to stop: it takes no new turns and lets
    /// the running ones finish (see [`SessionManager::drain`]).
    draining: std::sync::atomic::AtomicBool,
    /// Parent of every session's `closed` token: cancelled at shutdown once
    /// the turns have written their results, ending follow streams.
    followers: CancellationToken,
    turns: TaskTracker,
    /// Refuses a turn of a key past its daily budget; `None` in tests
    /// that run no budgets.
    usage: Option<Arc<crate::usage::Recorder>>,
}

impl SessionManager {
    pub fn new(
        store: Arc<dyn Store>,
        tasks: Tasks,
        limits: Limits,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> SessionManager {
        SessionManager {
            logs: Arc::new(EmbeddedLogs {
                store: store.clone(),
                metrics: metrics.clone(),
            }),
            store,
            tasks,
            limits,
            metrics,
            live: Mutex::new(HashMap::new()),
            leases: None,
            signals: None,
            quotas: None,
            storage: None,
            shutdown,
            draining: std::sync::atomic::AtomicBool::new(false),
            followers: CancellationToken::new(),
            turns: TaskTracker::new(),
            usage: None,
        }
    }

    /// Checks each new turn against its key's daily budgets.
    pub fn with_usage(mut self, usage: Arc<crate::usage::Recorder>) -> SessionManager {
        self.usage = Some(usage);
        self
    }

    /// Replaces the embedded event logs (the scale-out's fan out over a
    /// shared bus). Call before the first session is loaded.
    pub fn with_logs(mut self, logs: Arc<dyn EventLogs>) -> SessionManager {
        self.logs = logs;
        self
    }

    /// Runs turns under leases in the store, for replicas sharing it.
    pub fn with_leases(mut self, leases: TurnLeases) -> SessionManager {
        self.leases = Some(Arc::new(leases));
        self
    }

    /// Holds each key to its open sessions and running turns.
    pub fn with_quotas(mut self, quotas: Arc<crate::quota::Quotas>) -> SessionManager {
        self.quotas = Some(quotas);
        self
    }

    /// Measures a turn's start against its key's `storage_mb`.
    pub fn with_storage(
        mut self,
        storage: Option<Arc<crate::bus::StorageMeter>>,
    ) -> SessionManager {
        self.storage = storage;
        self
    }

    /// The kinds this server runs.
    pub fn tasks(&self) -> &Tasks {
        &self.tasks
    }

    /// The task of a session's kind; a session stored by a server that ran
    /// a kind this one does not can be read and deleted, not run.
    fn task_of(&self, session: &Session) -> Result<&Arc<dyn SessionTask>, SessionError> {
        self.tasks
            .get(session.kind.as_str())
            .ok_or_else(|| SessionError::KindNotServed(session.kind.clone()))
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Arc<Session>>> {
        lock(&self.live)
    }

    fn track(&self, session: Arc<Session>) -> Arc<Session> {
        let mut live = self.live();
        let entry = live.entry(session.id).or_insert(session).clone();
        self.metrics.sessions_live.set(live.len() as i64);
        entry
    }

    fn load(&self, record: SessionRecord, last_seq: u64) -> Arc<Session> {
        let closed = self.followers.child_token();
        let log = self.logs.open(record.id, last_seq, closed.clone());
        self.track(Arc::new(Session::from_record(
            record,
            self.store.clone(),
            log,
            closed,
            self.signals.clone(),
        )))
    }

    /// Finds a session the caller may see; another owner's is "not found".
    pub async fn get(&self, id: Uuid, owner: Option<&str>) -> Result<Arc<Session>, SessionError> {
        self.find(id, owner, true).await
    }

    /// The session, when its turn is running on this replica: the turn
    /// holds it, so this copy is what the store has (its options, owner,
    /// and a status that is not closed). `None` otherwise, and the caller
    /// reads the store.
    pub fn running_here(&self, id: Uuid) -> Option<Arc<Session>> {
        self.live()
            .get(&id)
            .filter(|session| session.is_running())
            .cloned()
    }

    /// [`SessionManager::get`] for a caller about to start a turn: with
    /// replicas a copy held here is not read again, since taking the
    /// turn's lease reads the session as stored (a session deleted
    /// elsewhere is "not found" then).
    pub async fn get_to_start(
        &self,
        id: Uuid,
        owner: Option<&str>,
    ) -> Result<Arc<Session>, SessionError> {
        self.find(id, owner, false).await
    }

    async fn find(
        &self,
        id: Uuid,
        owner: Option<&str>,
        refresh: bool,
    ) -> Result<Arc<Session>, SessionError> {
        let cached = self.live().get(&id).cloned();
        let session = match cached {
            Some(session) if refresh && self.leases.is_some() => self.refreshed(session).await?,
            Some(session) => session,
            None => {
                let record = self
                    .store
                    .get_session(id)
                    .await?
                    .ok_or(SessionError::NotFound(id))?;
                let last_seq = self.store.last_seq(id).await?;
                self.load(record, last_seq)
            }
        };
        if owner.is_some() && session.owner.as_deref() != owner {
            return Err(SessionError::NotFound(id));
        }
        Ok(session)
    }

    fn forget(&self, id: Uuid) {
        let mut live = self.live();
        live.remove(&id);
        self.metrics.sessions_live.set(live.len() as i64);
    }

    /// Forgets sessions nobody holds (no turn, stream or socket); they load
    /// again from the store when asked for. Returns how many went.
    pub fn evict_unused(&self) -> usize {
        let mut live = self.live();
        let before = live.len();
        // The map's own reference is the only one left: nobody can be using
        // it, and nobody can take it while the map is locked.
        live.retain(|_, session| Arc::strong_count(session) > 1);
        self.metrics.sessions_live.set(live.len() as i64);
        before - live.len()
    }

    pub async fn list(&self, filter: &SessionFilter) -> Result<Vec<SessionRecord>, SessionError> {
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
    pub async fn record(&self, id: Uuid) -> Result<Option<SessionRecord>, SessionError> {
        Ok(self.store.get_session(id).await?)
    }

    /// Deletes the closed ephemeral sessions last updated more than the
    /// retention ago. Returns how many went.
    pub async fn expire_ephemeral(&self) -> Result<usize, SessionError> {
        let retention = self.limits.ephemeral_retention;
        if retention.is_zero() {
            return Ok(0);
        }
        // A retention longer than the calendar reaches keeps everything.
        let Some(cutoff) = chrono::TimeDelta::from_std(retention)
            .ok()
            .and_then(|kept| Utc::now().checked_sub_signed(kept))
        else {
            return Ok(0);
        };
        let mut removed = 0;
        loop {
            let expired = self.store.expired_ephemeral(cutoff, 256).await?;
            if expired.is_empty() {
                return Ok(removed);
            }
            for id in expired {
                match self.delete(id, None).await {
                    Ok(()) | Err(SessionError::NotFound(_)) => removed += 1,
                    Err(e) => return Err(e),
                }
            }
        }
    }

    pub async fn history(&self, session: &Session) -> Result<Vec<Message>, SessionError> {
        Ok(self.store.messages(session.id).await?)
    }

    /// Stops the session's turn, frees its task's resources and forgets it.
    pub async fn delete(&self, id: Uuid, owner: Option<&str>) -> Result<(), SessionError> {
        let session = self.get(id, owner).await?;
        session.interrupt();
        // Wait for the turn to close before the rows go, on whichever
        // replica it runs.
        let _turn = session.turn_lock.lock().await;
        let held = match &self.leases {
            Some(leases) => Some(
                self.take_turn(leases, session.clone(), true, &CancellationToken::new())
                    .await?
                    .0,
            ),
            None => None,
        };
        session.closed.cancel();
        if let Ok(task) = self.task_of(&session) {
            task.delete(id).await;
        }
        let deleted = self.store.delete_session(id).await;
        if let Some(held) = held {
            held.release().await;
        }
        deleted?;
        self.forget(id);
        Ok(())
    }

    /// Starts a turn. Without `queue` a running session answers `Busy`
    /// (a turn that has already sent its result is waited for); with it
    /// the call waits for the running turn to end. A draining replica
    /// refuses it: the client sends it to another replica.
    pub async fn start_turn(
        &self,
        session: Arc<Session>,
        input: String,
        queue: bool,
    ) -> Result<StartedTurn, SessionError> {
        if self.is_draining() {
            return Err(SessionError::ShuttingDown);
        }
        self.start_turn_with(session, input, queue, TurnOptions::default())
            .await
    }

    /// The last `seq` of the session's log as the store has it (another
    /// replica may have written past what this one has seen).
    pub async fn stored_last_seq(&self, id: Uuid) -> Result<u64, SessionError> {
        Ok(self.store.last_seq(id).await?)
    }

    /// [`SessionManager::start_turn`] with options for this turn only. It
    /// runs while the replica drains: a running turn starts these for its
    /// child sessions (a deliberation's agents) and must be able to finish.
    pub async fn start_turn_with(
        &self,
        session: Arc<Session>,
        input: String,
        queue: bool,
        options: TurnOptions,
    ) -> Result<StartedTurn, SessionError> {
        self.start(session, input, queue, options, None).await
    }

    /// Starts a turn; `made` is the lease and token of the first turn of
    /// a session that its first write makes (see
    /// [`SessionManager::run_new`]), which takes no lease now.
    async fn start(
        &self,
        session: Arc<Session>,
        input: String,
        queue: bool,
        options: TurnOptions,
        made: Option<(
            Option<HeldTurn>,
            CancellationToken,
            Option<crate::quota::HeldSlot>,
        )>,
    ) -> Result<StartedTurn, SessionError> {
        if self.shutdown.is_cancelled() {
            return Err(SessionError::ShuttingDown);
        }
        let task = self.task_of(&session)?.clone();
        if let Some(usage) = &self.usage {
            usage.check_budget(session.owner.as_deref()).await?;
        }
        if let (Some(storage), Some(owner)) = (&self.storage, session.owner.as_deref())
            && options.on_behalf_of.is_none()
        {
            storage
                .admit_turn(owner, input.len())
                .await
                .map_err(|e| match e {
                    crate::bus::StorageError::Exceeded(e) => SessionError::Quota(e),
                    other => SessionError::Internal(other.to_string()),
                })?;
        }
        let guard = if queue {
            tokio::select! {
                guard = session.turn_lock.clone().lock_owned() => guard,
                _ = self.shutdown.cancelled() => return Err(SessionError::ShuttingDown),
                _ = session.closed.cancelled() => return Err(SessionError::NotFound(session.id)),
            }
        } else {
            match session.turn_lock.clone().try_lock_owned() {
                Ok(guard) => guard,
                // A turn that holds the lock but no longer runs has sent its
                // result and is only writing it out: wait for it, briefly.
                Err(_) if !session.is_running() => session.turn_lock.clone().lock_owned().await,
                Err(_) => return Err(SessionError::Busy(session.id)),
            }
        };
        if session.closed.is_cancelled() {
            return Err(SessionError::NotFound(session.id));
        }
        // A turn run for another session's (a deliberation's agent, a
        // pipeline's node) is part of that turn and counts as none.
        let quota = match &self.quotas {
            Some(quotas) if options.on_behalf_of.is_none() => {
                quotas.take_turn(session.owner.as_deref()).await?
            }
            _ => None,
        };
        let (made, admitted) = match made {
            Some((held, cancel, admitted)) => (Some((held, cancel)), admitted),
            None => (None, None),
        };
        let (held, session, cancel) = match (made, &self.leases) {
            (Some((held, cancel)), _) => (held, session, cancel),
            (None, Some(leases)) => {
                let cancel = self.shutdown.child_token();
                let (held, session) = self.take_turn(leases, session, queue, &cancel).await?;
                (Some(held), session, cancel)
            }
            (None, None) => (None, session, self.shutdown.child_token()),
        };
        if session.status() == SessionStatus::Closed {
            if let Some(held) = held {
                held.release().await;
            }
            return Err(SessionError::Closed(session.id));
        }
        if let Some(at_seq) = options.rewind_to
            && let Err(e) = self.rewind(task.as_ref(), &session, at_seq).await
        {
            if let Some(held) = held {
                held.release().await;
            }
            return Err(e);
        }
        *lock(&session.running) = Some(cancel.clone());
        let since = session.last_seq();
        let runner = Runner {
            task,
            metrics: self.metrics.clone(),
            turn_timeout: self.limits.turn_timeout,
            turn_slot: std::sync::Mutex::new(quota),
            lease: held,
            storage: self.storage.clone(),
        };
        let turn_session = session.clone();
        let turn_cancel = cancel.clone();
        // The turn's span: a child of the request that started it (if any
        // is being traced), a trace of its own otherwise.
        let span = runner::turn_span(&session);
        self.turns.spawn(span.within(async move {
            let mut runner = runner;
            runner.run(&turn_session, input, options, turn_cancel).await;
            // An ephemeral run's session counts in its key's
            // `max_concurrent_sessions` until its run is over.
            if let Some(admitted) = admitted {
                admitted.release().await;
            }
            *lock(&turn_session.running) = None;
            if let Some(held) = runner.lease.take() {
                held.release().await;
            }
            drop(guard);
        }));
        Ok(StartedTurn {
            session,
            since,
            cancel,
        })
    }

    /// Closes the turns a crash cut off: each gets an `interrupted` result
    /// (its task first leaves its own state consistent for the next turn).
    /// A session whose kind this server does not run keeps its status.
    pub async fn recover(&self) -> Result<usize, SessionError> {
        let cut_off = self
            .store
            .sessions_with_status(SessionStatus::Running)
            .await?;
        let mut closed = 0;
        for record in &cut_off {
            // Closing one turn may delete another's session (a deliberation
            // deletes its agents' sessions).
            let session = match self.get(record.id, None).await {
                Ok(session) => session,
                Err(SessionError::NotFound(_)) => continue,
                Err(e) => return Err(e),
            };
            if let Some(leases) = &self.leases {
                // Another replica may be running it: only a turn whose
                // lease is free or expired was cut off.
                if self
                    .close_if_cut_off(leases, session, CUT_OFF_BY_RESTART)
                    .await?
                {
                    closed += 1;
                }
                continue;
            }
            let Ok(task) = self.task_of(&session) else {
                tracing::warn!(session = %session.id, kind = %session.kind,
                    "a turn was cut off in a session of a kind this server does not run");
                continue;
            };
            let runner = Runner {
                task: task.clone(),
                metrics: self.metrics.clone(),
                turn_timeout: self.limits.turn_timeout,
                turn_slot: Default::default(),
                lease: None,
                storage: self.storage.clone(),
            };
            runner.close_cut_off(&session, CUT_OFF_BY_RESTART).await?;
            closed += 1;
        }
        Ok(closed)
    }

    /// Stops taking turns ([`SessionManager::start_turn`] refuses them) and
    /// waits until the running ones have ended; the caller bounds the wait
    /// and then calls [`SessionManager::shutdown`].
    pub async fn drain(&self) {
        self.draining
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // A closed tracker's `wait` ends once it is empty; turns a running
        // turn starts meanwhile are still tracked and waited for.
        self.turns.close();
        self.turns.wait().await;
    }

    /// Whether the replica was told to stop (readiness answers no).
    pub fn is_draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Cancels every running turn and waits until each has written its result.
    pub async fn shutdown(&self) {
        self.draining
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.shutdown.cancel();
        self.turns.close();
        self.turns.wait().await;
        self.followers.cancel();
    }
}
