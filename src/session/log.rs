//! A session's event log behind one seam: [`EventLog`] (append returns the
//! `seq`; subscribe from a `seq`), opened per session by [`EventLogs`].
//! The embedded implementation is this file's; the scale-out puts the log
//! on a shared bus behind the same seam.
//!
//! Embedded: an event takes its `seq` at once and joins the session's
//! queue; one writer task per session stores the queue in batches and
//! broadcasts each batch only after the store has committed it. So
//! subscribers see events in `seq` order, nothing a client received can be
//! missing after a crash, and a streaming turn never waits for the disk
//! between two tokens: the events it makes while one batch commits go
//! together in the next.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::Utc;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::protocol::{Event, EventKind, ResultStatus};
use crate::store::{Store, StoreError};
use crate::sync::lock;
use crate::telemetry::{EventLabel, Metrics};

/// Slots of the live broadcast; a subscriber that falls further behind
/// catches up from the store instead.
const HUB_CAPACITY: usize = 64;
/// Events read from the store per page when replaying.
const REPLAY_PAGE: usize = 512;
/// Events buffered per subscriber between its producer task and the client.
const SUBSCRIBER_BUFFER: usize = 64;

/// One session's event log.
#[async_trait]
pub trait EventLog: Send + Sync {
    /// Gives the event the next `seq` and appends it; it reaches
    /// subscribers once durable. Fails once the log has stopped (its store
    /// refused a write). `agent_id` tags the work of one agent of a
    /// deliberation.
    fn append(&self, kind: EventKind, agent_id: Option<String>) -> Result<u64, StoreError>;

    /// Waits until every event appended so far is durable.
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
        let (hub, _) = broadcast::channel(HUB_CAPACITY);
        Arc::new(EmbeddedLog(Arc::new(Embedded {
            id: session,
            store: self.store.clone(),
            metrics: self.metrics.clone(),
            log: Mutex::new(Log {
                next_seq: last_seq + 1,
                pending: Vec::new(),
                writing: false,
            }),
            stored: watch::Sender::new(Stored {
                seq: last_seq,
                failure: None,
            }),
            hub,
            closed,
        })))
    }
}

struct EmbeddedLog(Arc<Embedded>);

#[async_trait]
impl EventLog for EmbeddedLog {
    fn append(&self, kind: EventKind, agent_id: Option<String>) -> Result<u64, StoreError> {
        self.0.append(kind, agent_id)
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
        self.0.replay(since).boxed()
    }

    async fn last_result(&self) -> Result<Option<ResultStatus>, StoreError> {
        self.0.last_result().await
    }
}

struct Embedded {
    id: Uuid,
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    /// Events given a `seq` and not yet stored.
    log: Mutex<Log>,
    /// How far the log is stored (and so may be sent), or why it stopped.
    stored: watch::Sender<Stored>,
    hub: broadcast::Sender<Arc<Event>>,
    /// Cancelled when the session is deleted, ending its followers.
    closed: CancellationToken,
}

/// The write side of the event log.
struct Log {
    /// The `seq` of the next event.
    next_seq: u64,
    pending: Vec<Event>,
    /// Whether a writer task is running; at most one is.
    writing: bool,
}

#[derive(Debug, Clone, PartialEq)]
struct Stored {
    /// The highest `seq` committed to the store.
    seq: u64,
    /// Set when the store refused a batch: the log takes no more events.
    failure: Option<Arc<str>>,
}

impl Embedded {
    /// Gives the event its `seq` and queues it for the store; it reaches
    /// subscribers once stored. Fails once the store has refused this log.
    fn append(
        self: &Arc<Self>,
        kind: EventKind,
        agent_id: Option<String>,
    ) -> Result<u64, StoreError> {
        if let Some(failure) = &self.stored.borrow().failure {
            return Err(StoreError::Io(failure.to_string()));
        }
        let mut log = lock(&self.log);
        let seq = log.next_seq;
        log.next_seq += 1;
        log.pending.push(Event {
            kind,
            session_id: self.id,
            seq,
            ts: Utc::now(),
            agent_id,
        });
        if !log.writing {
            log.writing = true;
            tokio::spawn(self.clone().write_pending());
        }
        Ok(seq)
    }

    /// The writer task: stores what is queued, batch by batch, and
    /// broadcasts each batch once committed.
    async fn write_pending(self: Arc<Self>) {
        loop {
            let batch = {
                let mut log = lock(&self.log);
                if log.pending.is_empty() {
                    log.writing = false;
                    return;
                }
                std::mem::take(&mut log.pending)
            };
            if let Err(e) = self.store.append_events(&batch).await {
                tracing::error!(session = %self.id, error = %e, "storing events failed; the log stops");
                let mut log = lock(&self.log);
                log.pending.clear();
                log.writing = false;
                self.stored
                    .send_modify(|stored| stored.failure = Some(e.to_string().into()));
                return;
            }
            let last = batch.last().map_or(0, |event| event.seq);
            self.stored.send_modify(|stored| stored.seq = last);
            for event in batch {
                self.metrics
                    .events
                    .get_or_create(&EventLabel {
                        r#type: event.kind.type_name().to_string(),
                    })
                    .inc();
                // No receiver is fine: nobody is watching.
                let _ = self.hub.send(Arc::new(event));
            }
        }
    }

    /// Waits until every event emitted so far is stored.
    async fn flush(&self) -> Result<(), StoreError> {
        let target = lock(&self.log).next_seq - 1;
        let mut stored = self.stored.subscribe();
        let stored = stored
            .wait_for(|stored| stored.seq >= target || stored.failure.is_some())
            .await
            .map_err(|_| StoreError::Closed)?;
        match &stored.failure {
            Some(failure) => Err(StoreError::Io(failure.to_string())),
            None => Ok(()),
        }
    }

    /// Every event with `seq > since`, then live ones as they come, until
    /// the session is closed or the consumer goes away. With `until_result`
    /// the stream also ends after the first `result` event.
    fn subscribe(
        self: &Arc<Self>,
        since: u64,
        until_result: bool,
    ) -> impl Stream<Item = Arc<Event>> + Send + 'static {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        // Subscribe before replaying, so nothing falls between the two.
        let live = self.hub.subscribe();
        let session = self.clone();
        tokio::spawn(async move { session.feed(since, until_result, live, tx).await });
        tokio_stream::wrappers::ReceiverStream::new(rx)
    }

    async fn feed(
        self: Arc<Self>,
        since: u64,
        until_result: bool,
        mut live: broadcast::Receiver<Arc<Event>>,
        tx: mpsc::Sender<Arc<Event>>,
    ) {
        let mut last = since;
        // Replays from the store whatever is newer than `last`; returns
        // false once the subscriber is done (left, or its turn ended).
        let catch_up = |last: u64| {
            let session = self.clone();
            let tx = tx.clone();
            async move {
                let mut last = last;
                loop {
                    let page = match session
                        .store
                        .events_since(session.id, last, REPLAY_PAGE)
                        .await
                    {
                        Ok(page) => page,
                        Err(e) => {
                            tracing::error!(session = %session.id, error = %e, "replay failed");
                            return (last, false);
                        }
                    };
                    let full = page.len() == REPLAY_PAGE;
                    for event in page {
                        last = event.seq;
                        let ends = until_result && event.ends_turn();
                        if tx.send(Arc::new(event)).await.is_err() || ends {
                            return (last, false);
                        }
                    }
                    if !full {
                        return (last, true);
                    }
                }
            }
        };
        // Nothing to replay when the log ends at `since`: any later event
        // is stored before its broadcast, which this receiver will get.
        if self.stored.borrow().seq > last {
            let (caught, go_on) = catch_up(last).await;
            last = caught;
            if !go_on {
                return;
            }
        }
        loop {
            // Biased: events already broadcast are delivered before a
            // close is noticed, so a turn's last events reach its streams.
            let event = tokio::select! {
                biased;
                received = live.recv() => received,
                _ = self.closed.cancelled() => return,
                _ = tx.closed() => return,
            };
            match event {
                Ok(event) if event.seq <= last => continue,
                Ok(event) if event.seq == last + 1 => {
                    last = event.seq;
                    let ends = until_result && event.ends_turn();
                    if tx.send(event).await.is_err() || ends {
                        return;
                    }
                }
                // A gap (after lagging) or lagging itself: read the store.
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    let (caught, go_on) = catch_up(last).await;
                    last = caught;
                    if !go_on {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// The events with `seq > since` that exist now, then the end.
    fn replay(self: &Arc<Self>, since: u64) -> impl Stream<Item = Arc<Event>> + Send + 'static {
        let until = self.stored.borrow().seq;
        let session = self.clone();
        futures::stream::unfold(since, move |last| {
            let session = session.clone();
            async move {
                if last >= until {
                    return None;
                }
                let page = session
                    .store
                    .events_since(session.id, last, REPLAY_PAGE)
                    .await
                    .map_err(
                        |e| tracing::error!(session = %session.id, error = %e, "replay failed"),
                    )
                    .ok()?;
                let next = page.last().map(|e| e.seq)?;
                let events: Vec<Arc<Event>> = page
                    .into_iter()
                    .filter(|e| e.seq <= until)
                    .map(Arc::new)
                    .collect();
                Some((futures::stream::iter(events), next))
            }
        })
        .flatten()
    }

    /// The status of the log's last event when it is a `result`: whether
    /// the last turn was closed before a crash.
    async fn last_result(&self) -> Result<Option<ResultStatus>, StoreError> {
        let last = self.stored.borrow().seq;
        let tail = self
            .store
            .events_since(self.id, last.saturating_sub(1), 1)
            .await?;
        Ok(match tail.last() {
            Some(Event {
                kind: EventKind::Result { status, .. },
                ..
            }) => Some(*status),
            _ => None,
        })
    }
}
