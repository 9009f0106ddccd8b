//! A live session of any kind: its state, its event log (behind the
//! [`EventLog`] seam), its turn lock and its running turn.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use futures::stream::BoxStream;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::log::EventLog;
use super::signal::Signals;
use crate::model::Message;
use crate::protocol::{
    ContextUse, Event, EventKind, ResultStatus, SessionKind, SessionRecord, SessionStatus, Usage,
};
use crate::store::{Release, SessionState, Store, StoreError, UsageRow};
use crate::sync::lock;

pub struct Session {
    pub id: Uuid,
    pub name: Option<String>,
    pub kind: SessionKind,
    /// Hash of the creating API key; `None` when auth is off.
    pub owner: Option<String>,
    pub ephemeral: bool,
    /// The protocol adapter that made it, if one did.
    pub origin: Option<String>,
    pub created_at: DateTime<Utc>,
    /// The options as its kind's task validated and stored them.
    pub options: Arc<serde_json::Value>,
    pub(super) state: Mutex<SessionState>,
    store: Arc<dyn Store>,
    log: Arc<dyn EventLog>,
    /// One turn at a time; `queue: true` waits on it.
    pub(super) turn_lock: Arc<tokio::sync::Mutex<()>>,
    /// Cancels the running turn (interrupt).
    pub(super) running: Mutex<Option<CancellationToken>>,
    /// Cancelled when the session is deleted, ending its followers.
    pub(super) closed: CancellationToken,
    /// With replicas: where an interrupt goes when the turn runs on
    /// another one.
    signals: Option<Arc<Signals>>,
    /// The conversation as the last turn here left it, a prefix of the
    /// stored one once that turn's writes are stored (a turn that a store
    /// failure ended leaves none): the next turn reads only what came
    /// after, so a turn's cost does not grow with the session.
    history: Mutex<Arc<Vec<Message>>>,
    /// How many messages the store held when a replica taking this turn
    /// last read the session under its lease: the next turn reads none
    /// when its kept history is that long. Used once.
    stored_len: Mutex<Option<u64>>,
    /// How many cuts (rewinds) the stored conversation had had when the
    /// kept one was read, where the store counts them.
    kept_cuts: Mutex<Option<u64>>,
    /// The size of the last request a turn here sent the model, as its
    /// provider counted it: the next one estimates only what was added.
    measured: Mutex<Option<Measured>>,
}

/// A request's size as the provider counted it.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// The model it was sent to (another one counts differently).
    pub model: String,
    /// How many messages of the history the request was built on.
    pub history_len: usize,
    /// As the provider counted them; 0 when it did not say.
    pub input_tokens: u64,
    /// The window, and how full the request left it.
    pub context: ContextUse,
}

impl Session {
    pub(super) fn from_record(
        record: SessionRecord,
        store: Arc<dyn Store>,
        log: Arc<dyn EventLog>,
        closed: CancellationToken,
        signals: Option<Arc<Signals>>,
    ) -> Session {
        Session {
            id: record.id,
            name: record.name,
            kind: record.kind,
            owner: record.owner,
            ephemeral: record.ephemeral,
            origin: record.origin,
            created_at: record.created_at,
            options: Arc::new(record.options),
            state: Mutex::new(SessionState {
                status: record.status,
                usage: record.usage,
                updated_at: record.updated_at,
            }),
            store,
            log,
            turn_lock: Arc::new(tokio::sync::Mutex::new(())),
            running: Mutex::new(None),
            closed,
            signals,
            history: Mutex::default(),
            stored_len: Mutex::default(),
            kept_cuts: Mutex::default(),
            measured: Mutex::default(),
        }
    }

    /// This session as another replica left it in the store: the same
    /// turn lock and `closed` token (whoever holds this copy still waits
    /// on them), the record's state and a log that continues from `log`'s
    /// position.
    pub(super) fn reloaded(&self, record: SessionRecord, log: Arc<dyn EventLog>) -> Session {
        Session {
            turn_lock: self.turn_lock.clone(),
            closed: self.closed.clone(),
            ..Session::from_record(
                record,
                self.store.clone(),
                log,
                self.closed.clone(),
                self.signals.clone(),
            )
        }
    }

    /// Takes status and usage from the stored record (another replica ran
    /// the last turn).
    pub(super) fn update_from(&self, record: &SessionRecord) {
        let mut state = self.lock_state();
        state.status = record.status;
        state.usage = record.usage.clone();
        state.updated_at = record.updated_at;
    }

    pub fn status(&self) -> SessionStatus {
        self.lock_state().status
    }

    pub fn usage(&self) -> Usage {
        self.lock_state().usage.clone()
    }

    pub fn updated_at(&self) -> DateTime<Utc> {
        self.lock_state().updated_at
    }

    /// The highest `seq` stored, and so visible to clients.
    pub fn last_seq(&self) -> u64 {
        self.log.last_seq()
    }

    pub(super) fn lock_state(&self) -> std::sync::MutexGuard<'_, SessionState> {
        lock(&self.state)
    }

    /// Sets status and usage (unchanged when `None`) in memory and answers
    /// the state to store.
    fn change_state(&self, status: SessionStatus, usage: Option<&Usage>) -> SessionState {
        let mut state = self.lock_state();
        state.status = status;
        if let Some(usage) = usage {
            state.usage = usage.clone();
        }
        state.updated_at = Utc::now();
        state.clone()
    }

    /// Saves status and usage, in memory and in the store, and waits until
    /// they are stored. They go through the log, so they land in order
    /// with the states staged before; when the log has stopped, straight
    /// to the store.
    pub(super) async fn set_state(
        &self,
        status: SessionStatus,
        usage: Option<&Usage>,
    ) -> Result<(), StoreError> {
        let state = self.change_state(status, usage);
        match self.log.stage(state.clone()) {
            Ok(()) => self.log.flush().await,
            Err(_) => {
                self.store
                    .update_session(self.id, state.status, &state.usage)
                    .await
            }
        }
    }

    /// Sets status and usage in memory; they are stored with the next
    /// events, in the same write, never after them, or by
    /// [`Session::write_soon`] or [`Session::flush`] when none come first.
    pub(super) fn stage_state(
        &self,
        status: SessionStatus,
        usage: Option<&Usage>,
    ) -> Result<(), StoreError> {
        self.log.stage(self.change_state(status, usage))
    }

    /// Stores messages the conversation grew by, after those stored: with
    /// the next events, in the same write, or by [`Session::write_soon`]
    /// or [`Session::flush`] when none come first. A turn that keeps them
    /// in its history may go on at once: a batch that fails stops the log,
    /// and so the turn, before anything after them is stored.
    pub fn store_messages(&self, messages: &[Message]) -> Result<(), StoreError> {
        self.log.keep(messages)
    }

    /// Adds what the session's key spent to the stored usage with the
    /// next events, in the same write, or by [`Session::flush`].
    pub fn store_usage(&self, spent: UsageRow) -> Result<(), StoreError> {
        self.log.spend(spent)
    }

    /// Has the log's next write store this session, stored nowhere yet,
    /// with the lease of its first turn.
    pub(super) fn create_with_next_write(
        &self,
        record: SessionRecord,
        lease: Option<(crate::store::Release, std::time::Duration)>,
    ) {
        self.log.create_with_next_write(record, lease);
    }

    /// Starts storing a staged state or messages now, without waiting.
    pub(super) fn write_soon(&self) {
        self.log.write_soon();
    }

    /// Gives the event its `seq` and appends it to the log; it reaches
    /// subscribers once stored. Fails once the store has refused this log.
    pub fn emit(&self, kind: EventKind) -> Result<u64, StoreError> {
        self.log.append(kind, None)
    }

    /// A turn's last event (its `result`), stored in one write with the
    /// session's new status and usage and the turn's lease given up. The
    /// write starts at the next [`Session::flush`]: what must happen
    /// before another replica can take the next turn happens first.
    pub(super) fn emit_last(
        &self,
        kind: EventKind,
        (status, usage): (SessionStatus, &Usage),
        release: Option<Release>,
    ) -> Result<u64, StoreError> {
        let state = self.change_state(status, Some(usage));
        self.log.append_last(kind, state, release)
    }

    /// [`Session::emit`] for the work of one agent of a deliberation: the
    /// event carries its `agent_id`.
    pub fn emit_as(&self, agent_id: &str, kind: EventKind) -> Result<u64, StoreError> {
        self.log.append(kind, Some(agent_id.to_owned()))
    }

    /// The whole stored conversation, for a turn to extend; the session
    /// holds none of it until [`Session::keep_history`].
    pub async fn take_history(&self) -> Result<Arc<Vec<Message>>, StoreError> {
        let mut history = std::mem::take(&mut *lock(&self.history));
        let stored_len = lock(&self.stored_len).take();
        if stored_len == Some(history.len() as u64) {
            return Ok(history);
        }
        let newer = self.store.messages_from(self.id, history.len()).await?;
        if !newer.is_empty() {
            Arc::make_mut(&mut history).extend(newer);
        }
        Ok(history)
    }

    /// Keeps a turn's history for the next turn. It must be a prefix of
    /// the stored conversation once what the session queued is stored.
    pub fn keep_history(&self, history: Arc<Vec<Message>>) {
        *lock(&self.history) = history;
    }

    /// Tells the next turn what the store holds of the conversation, as
    /// read under the turn's lease: its length (the turn reads no message
    /// when the kept history is as long) and its cuts. A kept history
    /// from before a cut made since, here or on another replica, may
    /// differ from the stored one anywhere: it is dropped, and the turn
    /// reads the conversation whole.
    pub(super) fn history_stored(&self, messages: Option<u64>, cuts: Option<u64>) {
        let mut kept_cuts = lock(&self.kept_cuts);
        if *kept_cuts != cuts {
            self.forget_history();
            *kept_cuts = cuts;
        }
        *lock(&self.stored_len) = messages;
    }

    /// Drops the kept conversation, so the next turn reads the stored one
    /// whole: after a store failure, what the turn kept may not all be
    /// stored.
    pub(super) fn forget_history(&self) {
        *lock(&self.history) = Arc::default();
        *lock(&self.measured) = None;
    }

    /// The last request's size, as its provider counted it.
    pub fn measured(&self) -> Option<Measured> {
        lock(&self.measured).clone()
    }

    /// Keeps a request's size for the next one's estimate and the status;
    /// `None` forgets it (the history it was measured on changed).
    pub fn set_measured(&self, measured: Option<Measured>) {
        *lock(&self.measured) = measured;
    }

    /// Cuts the conversation back to its first `len` messages, the kept
    /// one before the stored one, so that the kept one stays a prefix of
    /// the stored one even when the store fails.
    pub(super) async fn rewind_history(&self, len: usize) -> Result<(), StoreError> {
        {
            let mut history = lock(&self.history);
            if history.len() > len {
                Arc::make_mut(&mut history).truncate(len);
            }
        }
        *lock(&self.measured) = None;
        self.store.truncate_messages(self.id, len).await
    }

    /// How many messages the history the session keeps holds.
    pub fn history_len(&self) -> usize {
        lock(&self.history).len()
    }

    /// Waits until every event emitted so far is stored.
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.log.flush().await
    }

    /// Every event with `seq > since`, then live ones as they come, until
    /// the session is closed or the consumer goes away. With `until_result`
    /// the stream also ends after the first `result` event.
    pub fn subscribe(&self, since: u64, until_result: bool) -> BoxStream<'static, Arc<Event>> {
        self.log.subscribe(since, until_result)
    }

    /// The events with `seq > since` that exist now, then the end.
    pub fn replay(&self, since: u64) -> BoxStream<'static, Arc<Event>> {
        self.log.replay(since)
    }

    /// The status of the log's last event when it is a `result`: whether
    /// the last turn was closed before a crash.
    pub async fn last_result(&self) -> Result<Option<ResultStatus>, StoreError> {
        self.log.last_result().await
    }

    /// Asks the running turn, if any, to stop, on whichever replica it
    /// runs. True if one was running.
    pub fn interrupt(&self) -> bool {
        if self.interrupt_here() {
            return true;
        }
        match &self.signals {
            Some(signals) if self.status() == SessionStatus::Running => {
                signals.interrupt(self.id);
                true
            }
            _ => false,
        }
    }

    /// Stops the turn if it runs on this replica.
    pub(super) fn interrupt_here(&self) -> bool {
        match &*lock(&self.running) {
            Some(token) => {
                token.cancel();
                true
            }
            None => false,
        }
    }

    pub fn is_running(&self) -> bool {
        lock(&self.running).is_some()
    }
}
