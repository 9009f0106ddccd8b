//! What every event log implementation shares: the write side (a `seq` at
//! once, one writer task storing the queue in batches, all or none) and
//! the read side (replay from the store, then a live broadcast, with a gap
//! or a lag filled from the store).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use futures::{Stream, StreamExt};
use tokio::sync::{Notify, broadcast, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::model::Message;
use crate::protocol::{Event, EventKind, ResultStatus};
use crate::protocol::{SessionRecord, SessionStatus};
use crate::store::{Batch, Creation, Release, SessionState, Store, StoreError, UsageRow};
use crate::sync::lock;
use crate::telemetry::{EventLabel, Metrics};

/// Slots of the live broadcast; a subscriber that falls further behind
/// catches up from the store instead.
const HUB_CAPACITY: usize = 64;
/// Events read from the store per page when replaying.
pub(super) const REPLAY_PAGE: usize = 512;
/// Events buffered per subscriber between its producer task and the client.
const SUBSCRIBER_BUFFER: usize = 64;

/// One session's log on this process.
pub(super) struct Core {
    pub id: Uuid,
    pub store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    /// Events given a `seq` and not yet stored, and what waits to be saved
    /// with them (messages, the session's state, usage, the lease given
    /// up).
    log: Mutex<Log>,
    /// How far the log is known stored (and so may be sent), or why it
    /// stopped.
    pub stored: watch::Sender<Stored>,
    hub: broadcast::Sender<Arc<Event>>,
    /// Cancelled when the session is deleted, ending its followers.
    pub closed: CancellationToken,
    /// Where each stored batch goes besides `hub` (the NATS log publishes
    /// it), told by the writer itself.
    announce: Option<Box<dyn Announce>>,
    /// Told when the live broadcast gets a subscriber where it had none
    /// (the NATS log's follower looks out for quiet only while one
    /// watches).
    pub watcher_came: Notify,
}

/// Told each batch once it is stored and broadcast here, in `seq` order,
/// by the writer between two writes: it must not wait. One it cannot pass
/// on at once it drops; readers elsewhere then take it from the store.
pub(super) trait Announce: Send + Sync {
    fn stored(&self, batch: Vec<Arc<Event>>);
}

/// The write side of the event log.
struct Log {
    /// A session not yet stored: made by the next write, with the turn
    /// lease its first turn holds.
    create: Option<(SessionRecord, Option<(Release, Duration)>)>,
    /// The `seq` of the next event.
    next_seq: u64,
    pending: Vec<Event>,
    /// Messages the conversation grew by, not yet stored: saved with the
    /// next batch, in the same write.
    messages: Vec<Message>,
    /// The session's latest state not yet stored: saved with the next
    /// batch, in the same write.
    state: Option<SessionState>,
    /// How many states, runs of messages and usage rows were staged,
    /// those pending included.
    staged: u64,
    /// Whether what is staged (state, messages, usage) is to be written
    /// even with no events (asked by `write_soon` or a flush); otherwise
    /// it waits for some. Never true with nothing staged.
    due: bool,
    /// The lease the turn gives up with its last write.
    release: Option<Release>,
    /// What the session's key spent, not yet stored: one row per key,
    /// day and model, added to the store's with the next batch.
    usage: Vec<UsageRow>,
    /// Set by [`Core::append_last`]: the writer takes nothing until the
    /// next [`Core::flush`] (or `write_soon`).
    held: bool,
    /// Whether a writer task is running; at most one is.
    writing: bool,
    /// Set for a session made here with its first turn's lease: until
    /// that lease goes (the turn's last write starts, unless that write
    /// closes the session: then no turn follows) or could have expired
    /// (this instant), no other replica can store anything for the
    /// session.
    sole_until: Option<Instant>,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Stored {
    /// The highest `seq` known committed to the store.
    pub seq: u64,
    /// How many stagings (states, messages, usage) are known stored, or
    /// for a state, replaced by a later one that is.
    pub staged: u64,
    /// Set when the store refused a batch: the log takes no more events.
    pub failure: Option<Arc<str>>,
    /// Whether that refusal was the store being unreachable (worth a
    /// retry elsewhere or later).
    pub unavailable: bool,
    /// When this process last stored a batch (or opened the log).
    pub at: Instant,
}

impl Core {
    pub fn new(
        id: Uuid,
        last_seq: u64,
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        closed: CancellationToken,
        announce: Option<Box<dyn Announce>>,
    ) -> Core {
        let (hub, _) = broadcast::channel(HUB_CAPACITY);
        Core {
            id,
            store,
            metrics,
            log: Mutex::new(Log {
                create: None,
                next_seq: last_seq + 1,
                pending: Vec::new(),
                messages: Vec::new(),
                state: None,
                staged: 0,
                due: false,
                release: None,
                usage: Vec::new(),
                held: false,
                writing: false,
                sole_until: None,
            }),
            stored: watch::Sender::new(Stored {
                seq: last_seq,
                staged: 0,
                failure: None,
                unavailable: false,
                at: Instant::now(),
            }),
            hub,
            closed,
            announce,
            watcher_came: Notify::new(),
        }
    }

    /// Gives the event its `seq` and queues it for the store; it reaches
    /// subscribers once stored. Fails once the store has refused this log.
    pub fn append(
        self: &Arc<Self>,
        kind: EventKind,
        agent_id: Option<String>,
    ) -> Result<u64, StoreError> {
        self.refused()?;
        let mut log = lock(&self.log);
        let seq = Self::push(&mut log, self.id, kind, agent_id);
        self.start_writer(&mut log);
        Ok(seq)
    }

    /// Queues a turn's last event with the session's new state and the
    /// lease the turn gives up, all for one write, and holds the writer
    /// until [`Core::flush`]: what must happen before another replica can
    /// take the session's next turn happens in between.
    pub fn append_last(
        &self,
        kind: EventKind,
        state: SessionState,
        release: Option<Release>,
    ) -> Result<u64, StoreError> {
        self.refused()?;
        let mut log = lock(&self.log);
        let seq = Self::push(&mut log, self.id, kind, None);
        log.state = Some(state);
        log.staged += 1;
        log.release = release;
        log.held = true;
        Ok(seq)
    }

    fn push(log: &mut Log, session_id: Uuid, kind: EventKind, agent_id: Option<String>) -> u64 {
        let seq = log.next_seq;
        log.next_seq += 1;
        log.pending.push(Event {
            kind,
            session_id,
            seq,
            ts: Utc::now(),
            agent_id,
        });
        seq
    }

    /// Has the next write make the session (stored nowhere yet), taking
    /// `lease` for its first turn unless that write also gives it up.
    pub fn create_with_next_write(
        &self,
        record: SessionRecord,
        lease: Option<(Release, Duration)>,
    ) {
        let mut log = lock(&self.log);
        log.sole_until = lease.as_ref().map(|(_, ttl)| Instant::now() + *ttl);
        log.create = Some((record, lease));
        log.staged += 1;
    }

    /// Whether everything stored for the session so far was stored by
    /// this replica: it made the session, and its first turn still holds
    /// the lease it took in that write (see `sole_until`).
    pub fn stored_only_here(&self) -> bool {
        lock(&self.log)
            .sole_until
            .is_some_and(|until| Instant::now() < until)
    }

    /// Queues the session's new state: it is saved with the next batch of
    /// events, or by [`Core::write_soon`] or [`Core::flush`] when none
    /// comes first. It starts no write of its own, so a state staged just
    /// before an event always goes in the event's write.
    pub fn stage(&self, state: SessionState) -> Result<(), StoreError> {
        self.refused()?;
        let mut log = lock(&self.log);
        log.state = Some(state);
        log.staged += 1;
        Ok(())
    }

    /// Queues messages the conversation grew by, to be stored after those
    /// staged before, with the next batch of events (or by
    /// [`Core::write_soon`] or [`Core::flush`] when none comes first).
    pub fn keep(&self, messages: &[Message]) -> Result<(), StoreError> {
        self.refused()?;
        if messages.is_empty() {
            return Ok(());
        }
        let mut log = lock(&self.log);
        log.messages.extend_from_slice(messages);
        log.staged += 1;
        Ok(())
    }

    /// Queues what the session's key spent, to be added to the store's
    /// usage with the next batch of events (or by [`Core::flush`]).
    pub fn spend(&self, spent: UsageRow) -> Result<(), StoreError> {
        self.refused()?;
        let mut log = lock(&self.log);
        let same = |row: &&mut UsageRow| {
            (&row.owner, row.day, &row.model) == (&spent.owner, spent.day, &spent.model)
        };
        match log.usage.iter_mut().find(same) {
            Some(row) => row.counts.add(&spent.counts),
            None => log.usage.push(spent),
        }
        log.staged += 1;
        Ok(())
    }

    /// Starts writing what is queued or staged now, unless a write is
    /// under way (which takes it next); events appended before the write
    /// starts join it. Ends a hold.
    pub fn write_soon(self: &Arc<Self>) {
        let mut log = lock(&self.log);
        log.held = false;
        if log.create.is_some()
            || log.state.is_some()
            || !log.messages.is_empty()
            || !log.usage.is_empty()
        {
            log.due = true;
        }
        if log.due || !log.pending.is_empty() {
            self.start_writer(&mut log);
        }
    }

    fn refused(&self) -> Result<(), StoreError> {
        refusal(&self.stored.borrow())
    }

    fn start_writer(self: &Arc<Self>, log: &mut Log) {
        if !log.writing {
            log.writing = true;
            tokio::spawn(self.clone().write_pending());
        }
    }

    /// The writer task: stores what is queued, batch by batch, and
    /// broadcasts each batch once committed.
    async fn write_pending(self: Arc<Self>) {
        loop {
            let (create, batch, messages, state, release, usage, staged) = {
                let mut log = lock(&self.log);
                // A state or messages alone wait for events unless due
                // (only what is staged is made due): the writer busy with
                // one batch does not write them alone.
                if log.held || (log.pending.is_empty() && !log.due) {
                    log.writing = false;
                    return;
                }
                log.due = false;
                // From the write that gives the lease up, another replica
                // may take the next turn, unless that write also closes
                // the session to turns (an ephemeral session's one turn).
                let closes =
                    (log.state.as_ref()).is_some_and(|s| s.status == SessionStatus::Closed);
                if log.release.is_some() && !closes {
                    log.sole_until = None;
                }
                (
                    log.create.take(),
                    std::mem::take(&mut log.pending),
                    std::mem::take(&mut log.messages),
                    log.state.take(),
                    log.release.take(),
                    std::mem::take(&mut log.usage),
                    log.staged,
                )
            };
            // A turn that ends in the write that makes its session never
            // holds its lease in the store.
            let create = create.as_ref().map(|(record, lease)| Creation {
                record,
                lease: lease
                    .as_ref()
                    .filter(|(lease, _)| release.as_ref() != Some(lease))
                    .map(|(lease, ttl)| (lease, *ttl)),
            });
            let write = Batch {
                create,
                events: &batch,
                messages: &messages,
                state: state.as_ref(),
                release: release.as_ref(),
                usage: &usage,
            };
            if let Err(e) = self.store.append_batch(self.id, write).await {
                tracing::error!(session = %self.id, error = %e, "storing events failed; the log stops");
                let mut log = lock(&self.log);
                log.create = None;
                log.pending.clear();
                log.messages.clear();
                log.state = None;
                log.release = None;
                log.usage.clear();
                log.due = false;
                log.writing = false;
                self.stored.send_modify(|stored| {
                    stored.failure = Some(e.to_string().into());
                    stored.unavailable = matches!(e, StoreError::Unavailable(_));
                });
                return;
            }
            let last = batch.last().map_or(0, |event| event.seq);
            self.stored.send_modify(|stored| {
                stored.seq = stored.seq.max(last);
                stored.staged = staged;
                stored.at = Instant::now();
            });
            if batch.is_empty() {
                continue;
            }
            let mut sent = Vec::new();
            for event in batch {
                self.metrics
                    .events
                    .get_or_create(&EventLabel {
                        r#type: event.kind.type_name(),
                    })
                    .inc();
                let event = Arc::new(event);
                if self.announce.is_some() {
                    sent.push(event.clone());
                }
                // No receiver is fine: nobody is watching.
                let _ = self.hub.send(event);
            }
            if let Some(announce) = &self.announce {
                announce.stored(sent);
            }
        }
    }

    /// Broadcasts events stored by another process, those newer than what
    /// this one knows, and moves this log's next `seq` past them.
    pub fn deliver_stored_elsewhere(&self, events: impl IntoIterator<Item = Event>) {
        for event in events {
            if event.seq <= self.stored.borrow().seq {
                continue;
            }
            let seq = event.seq;
            self.stored.send_modify(|stored| stored.seq = seq);
            {
                let mut log = lock(&self.log);
                log.next_seq = log.next_seq.max(seq + 1);
            }
            let _ = self.hub.send(Arc::new(event));
        }
    }

    /// Waits until every event emitted and state and message staged so far
    /// is stored.
    pub async fn flush(self: &Arc<Self>) -> Result<(), StoreError> {
        let (target, staged) = {
            self.write_soon();
            let log = lock(&self.log);
            (log.next_seq - 1, log.staged)
        };
        let mut stored = self.stored.subscribe();
        let stored = stored
            .wait_for(|stored| {
                (stored.seq >= target && stored.staged >= staged) || stored.failure.is_some()
            })
            .await
            .map_err(|_| StoreError::Closed)?;
        refusal(&stored)
    }

    /// Whether a subscriber is listening to the live events.
    pub fn watched(&self) -> bool {
        self.hub.receiver_count() > 0
    }

    /// Every event with `seq > since`, then live ones as they come, until
    /// the session is closed or the consumer goes away. With `until_result`
    /// the stream also ends after the first `result` event.
    pub fn subscribe(
        self: &Arc<Self>,
        since: u64,
        until_result: bool,
    ) -> impl Stream<Item = Arc<Event>> + Send + use<> {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        // Subscribe before replaying, so nothing falls between the two.
        let live = self.hub.subscribe();
        if self.hub.receiver_count() == 1 {
            self.watcher_came.notify_one();
        }
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
        // Nothing to replay when the log ends at `since`: any later event
        // is stored before its broadcast, which this receiver will get.
        if self.stored.borrow().seq > last {
            let (caught, go_on) = self.catch_up(last, until_result, &tx).await;
            last = caught;
            if !go_on {
                return;
            }
        }
        let mut stored = self.stored.subscribe();
        loop {
            // Biased: events already broadcast are delivered before a
            // close is noticed, so a turn's last events reach its streams.
            // A log the store refused takes no more events: its streams
            // end.
            let event = tokio::select! {
                biased;
                received = live.recv() => received,
                _ = self.closed.cancelled() => return,
                _ = tx.closed() => return,
                _ = stored.wait_for(|stored| stored.failure.is_some()) => return,
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
                // A gap (after lagging, or a batch lost on the way) or
                // lagging itself: read the store.
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    let (caught, go_on) = self.catch_up(last, until_result, &tx).await;
                    last = caught;
                    if !go_on {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// Replays from the store whatever is newer than `last`; returns the
    /// last `seq` sent and false once the subscriber is done (left, or its
    /// turn ended).
    async fn catch_up(
        &self,
        mut last: u64,
        until_result: bool,
        tx: &mpsc::Sender<Arc<Event>>,
    ) -> (u64, bool) {
        loop {
            let page = match self.store.events_since(self.id, last, REPLAY_PAGE).await {
                Ok(page) => page,
                Err(e) => {
                    tracing::error!(session = %self.id, error = %e, "replay failed");
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

    /// The events with `since < seq <= until` in the store, then the end.
    pub fn replay(
        self: &Arc<Self>,
        since: u64,
        until: u64,
    ) -> impl Stream<Item = Arc<Event>> + Send + use<> {
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

    /// The status of the event at `last` when it is a `result`: whether
    /// the last turn was closed before a crash.
    pub async fn result_at(&self, last: u64) -> Result<Option<ResultStatus>, StoreError> {
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

/// The store's refusal of a batch, if it refused one: the log takes no
/// more events.
fn refusal(stored: &Stored) -> Result<(), StoreError> {
    match &stored.failure {
        Some(failure) if stored.unavailable => Err(StoreError::Unavailable(failure.to_string())),
        Some(failure) => Err(StoreError::Io(failure.to_string())),
        None => Ok(()),
    }
}
