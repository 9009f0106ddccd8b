//! A session's event log behind one seam: [`EventLog`] (append returns the
//! `seq`; subscribe from a `seq`), opened per session by [`EventLogs`].
//!
//! Both implementations store the same way: an event takes its `seq` at
//! once and joins the session's queue; one writer task per session stores
//! the queue in batches and broadcasts each batch only after the store has
//! committed it. So subscribers see events in `seq` order, nothing a client
//! received can be missing after a crash, and a streaming turn never waits
//! for the disk between two tokens: the events it makes while one batch
//! commits go together in the next.
//!
//! - [`EmbeddedLogs`] (this file): the broadcast is in process.
//! - [`NatsLogs`] ([`nats`]): each committed batch is also published on a
//!   NATS subject of its session, so a subscriber on any replica streams
//!   the session live.
//! - `core`: what both share: the write side, and the read side (replay
//!   from the store, then live, a gap or a lag filled from the store).

mod core;
pub mod nats;
#[cfg(test)]
mod nats_tests;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use self::core::Core;
pub use self::nats::NatsLogs;
use crate::model::Message;
use crate::protocol::{Event, EventKind, ResultStatus, SessionRecord};
use crate::store::{Release, SessionState, Store, StoreError, UsageRow};
use crate::telemetry::Metrics;

/// One session's event log.
#[async_trait]
pub trait EventLog: Send + Sync {
    /// Gives the event the next `seq` and appends it; it reaches
    /// subscribers once durable. Fails once the log has stopped (its store
    /// refused a write). `agent_id` tags the work of one agent of a
    /// deliberation.
    fn append(&self, kind: EventKind, agent_id: Option<String>) -> Result<u64, StoreError>;

    /// Appends a turn's last event, stored in one write with `state` (the
    /// session's new status and usage) and the turn's lease given up; the
    /// write waits for the next [`EventLog::flush`], so that what must
    /// happen before another turn can start happens first.
    fn append_last(
        &self,
        kind: EventKind,
        state: SessionState,
        release: Option<Release>,
    ) -> Result<u64, StoreError>;

    /// Has the next write store the session, which is stored nowhere
    /// yet, with `lease` taken for its first turn unless that write also
    /// gives it up: the session and its lease in one write.
    fn create_with_next_write(&self, record: SessionRecord, lease: Option<(Release, Duration)>);

    /// Queues the session's new status and usage, to be stored with the
    /// next events, or alone by [`EventLog::write_soon`] or a flush when
    /// none come first. Fails once the log has stopped.
    fn stage(&self, state: SessionState) -> Result<(), StoreError>;

    /// Queues messages the session's conversation grew by, to be stored
    /// with the next events (after the messages queued before), or alone
    /// by [`EventLog::write_soon`] or a flush when none come first. Fails
    /// once the log has stopped.
    fn keep(&self, messages: &[Message]) -> Result<(), StoreError>;

    /// Queues what the session's key spent, added to the stored usage
    /// with the next events or by a flush. Fails once the log has
    /// stopped.
    fn spend(&self, spent: UsageRow) -> Result<(), StoreError>;

    /// Starts writing a staged state or messages now if no write is under
    /// way; events appended before it starts join it.
    fn write_soon(&self);

    /// Waits until every event appended and state and message staged so
    /// far is durable.
    async fn flush(&self) -> Result<(), StoreError>;

    /// The highest durable `seq`, and so the highest visible to clients.
    fn last_seq(&self) -> u64;

    /// Every event with `seq > since`, then live ones as they come, until
    /// the log's session is closed or the consumer goes away. With
    /// `until_result` the stream also ends after the first `result` event.
    fn subscribe(&self, since: u64, until_result: bool) -> BoxStream<'static, Arc<Event>>;

    /// The events with `seq > since` that exist now, then the end.
    fn replay(&self, since: u64) -> BoxStream<'static, Arc<Event>>;

    /// The status of the last event when it is a `result`.
    async fn last_result(&self) -> Result<Option<ResultStatus>, StoreError>;
}

/// Opens the logs of sessions.
pub trait EventLogs: Send + Sync {
    /// The log of `session`, whose durable events end at `last_seq`;
    /// `closed` ends its followers when the session goes.
    fn open(&self, session: Uuid, last_seq: u64, closed: CancellationToken) -> Arc<dyn EventLog>;
}

/// The embedded logs: the store's event table, batched by one writer task
/// per session, fanned out in process.
pub struct EmbeddedLogs {
    pub store: Arc<dyn Store>,
    pub metrics: Arc<Metrics>,
}

impl EventLogs for EmbeddedLogs {
    fn open(&self, session: Uuid, last_seq: u64, closed: CancellationToken) -> Arc<dyn EventLog> {
        Arc::new(EmbeddedLog(Arc::new(Core::new(
            session,
            last_seq,
            self.store.clone(),
            self.metrics.clone(),
            closed,
            None,
        ))))
    }
}

struct EmbeddedLog(Arc<Core>);

#[async_trait]
impl EventLog for EmbeddedLog {
    fn append(&self, kind: EventKind, agent_id: Option<String>) -> Result<u64, StoreError> {
        self.0.append(kind, agent_id)
    }

    fn append_last(
        &self,
        kind: EventKind,
        state: SessionState,
        release: Option<Release>,
    ) -> Result<u64, StoreError> {
        self.0.append_last(kind, state, release)
    }

    fn create_with_next_write(&self, record: SessionRecord, lease: Option<(Release, Duration)>) {
        self.0.create_with_next_write(record, lease);
    }

    fn stage(&self, state: SessionState) -> Result<(), StoreError> {
        self.0.stage(state)
    }

    fn keep(&self, messages: &[Message]) -> Result<(), StoreError> {
        self.0.keep(messages)
    }

    fn spend(&self, spent: UsageRow) -> Result<(), StoreError> {
        self.0.spend(spent)
    }

    fn write_soon(&self) {
        self.0.write_soon();
    }

    async fn flush(&self) -> Result<(), StoreError> {
        self.0.flush().await
    }

    fn last_seq(&self) -> u64 {
        self.0.stored.borrow().seq
    }

    fn subscribe(&self, since: u64, until_result: bool) -> BoxStream<'static, Arc<Event>> {
        self.0.subscribe(since, until_result).boxed()
    }

    fn replay(&self, since: u64) -> BoxStream<'static, Arc<Event>> {
        let until = self.0.stored.borrow().seq;
        self.0.replay(since, until).boxed()
    }

    async fn last_result(&self) -> Result<Option<ResultStatus>, StoreError> {
        let last = self.0.stored.borrow().seq;
        self.0.result_at(last).await
    }
}
