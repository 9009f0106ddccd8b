//! The event log for many replicas: stored as the embedded one is, and
//! each committed batch published on its session's NATS subject, so a
//! subscriber on any replica streams any session live.
//!
//! Per session and replica, the log's writer publishes each batch it
//! stored, as NDJSON (the events as the wire has them), on
//! `conclave.events.<session>.batch` with the last `seq` in a header,
//! handing it to the NATS connection without waiting (a batch the
//! connection has no room for is dropped and read from the store
//! elsewhere). And two tasks:
//! - the follower subscribes to `conclave.events.<session>.*`, waits for a
//!   round trip through the server (from then on every publish reaches
//!   it), reads from the store what was stored before, then broadcasts in
//!   process what arrives newer than what it knows. A batch lost on the
//!   way shows as a gap that subscribers fill from the store; a lost tail
//!   is read from the store after 5 s of quiet (no message, and nothing
//!   stored here: a replica takes none of its own messages back) while
//!   someone watches. What this replica stores wakes it for nothing: it
//!   reads when it last stored once the quiet spell ends;
//! - the closer publishes `conclave.events.<session>.closed` once a
//!   session deleted here has left the store, which ends the followers on
//!   every replica.
//!
//! Core NATS keeps nothing: the store is the log, NATS only says "now".

use std::sync::Arc;
use std::time::Duration;

use async_nats::{Client, HeaderMap, Message};
use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{FutureExt, Stream, StreamExt};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use uuid::Uuid;

use super::core::{Announce, Core, REPLAY_PAGE};
use super::{EventLog, EventLogs};
use crate::protocol::{Event, EventKind, ResultStatus};
use crate::store::{SessionState, Store, StoreError};
use crate::telemetry::Metrics;

/// The subjects of a session are `conclave.events.<session>.<leaf>`.
const SUBJECT_PREFIX: &str = "conclave.events";
/// The last `seq` of a batch message: a replica that knows it already (the
/// one that published it) skips the message without parsing it.
const SEQ_HEADER: &str = "Conclave-Seq";
/// Bytes of a message's payload left under the server's limit for headers.
const HEADER_ROOM: usize = 1024;
/// How long a watched log may hear nothing before the follower asks the
/// store whether it missed events or the session went.
pub(super) const RESYNC_QUIET: Duration = Duration::from_secs(5);
/// Wait between two tries to subscribe while NATS refuses.
const SUBSCRIBE_RETRY: Duration = Duration::from_secs(1);
/// How long the closer waits for a deleted session's rows to go before it
/// gives up (the delete failed, or this was a shutdown, not a delete).
const CLOSE_WAIT: Duration = Duration::from_secs(60);

/// Event logs shared by replicas through the store and NATS.
pub struct NatsLogs {
    client: Client,
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
}

impl NatsLogs {
    /// Connects to NATS at `url` for the logs alone. The connection takes
    /// none of its own messages back (`no_echo`): what a replica published
    /// it has already broadcast in process.
    pub async fn connect(
        url: &str,
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
    ) -> Result<NatsLogs, async_nats::ConnectError> {
        let client = async_nats::ConnectOptions::new()
            .name("conclave-events")
            .no_echo()
            .connect(url)
            .await?;
        Ok(NatsLogs::new(client, store, metrics))
    }

    pub fn new(client: Client, store: Arc<dyn Store>, metrics: Arc<Metrics>) -> NatsLogs {
        NatsLogs {
            client,
            store,
            metrics,
        }
    }
}

fn subject(session: Uuid, leaf: &str) -> String {
    format!("{SUBJECT_PREFIX}.{session}.{leaf}")
}

impl EventLogs for NatsLogs {
    fn open(&self, session: Uuid, last_seq: u64, closed: CancellationToken) -> Arc<dyn EventLog> {
        // Ended by a delete here (the manager's token) or elsewhere (the
        // notice on NATS, which only this log's token takes).
        let ended = closed.child_token();
        let core = Arc::new(Core::new(
            session,
            last_seq,
            self.store.clone(),
            self.metrics.clone(),
            ended,
            Some(Box::new(Publisher {
                client: self.client.clone(),
                subject: subject(session, "batch"),
            })),
        ));
        let dropped = CancellationToken::new();
        tokio::spawn(follow_nats(
            self.client.clone(),
            core.clone(),
            dropped.clone(),
        ));
        tokio::spawn(announce_close(
            self.client.clone(),
            self.store.clone(),
            session,
            closed,
            dropped.clone(),
        ));
        Arc::new(NatsLog {
            core,
            _dropped: dropped.drop_guard(),
        })
    }
}

struct NatsLog {
    core: Arc<Core>,
    /// Stops the follower and the closer when the session leaves memory.
    _dropped: DropGuard,
}

#[async_trait]
impl EventLog for NatsLog {
    fn append(&self, kind: EventKind, agent_id: Option<String>) -> Result<u64, StoreError> {
        self.core.append(kind, agent_id)
    }

    fn append_last(
        &self,
        kind: EventKind,
        state: SessionState,
        release: Option<crate::store::Release>,
    ) -> Result<u64, StoreError> {
        self.core.append_last(kind, state, release)
    }

    fn create_with_next_write(
        &self,
        record: crate::protocol::SessionRecord,
        lease: Option<(crate::store::Release, Duration)>,
    ) {
        self.core.create_with_next_write(record, lease);
    }

    fn stage(&self, state: SessionState) -> Result<(), StoreError> {
        self.core.stage(state)
    }

    fn keep(&self, messages: &[crate::model::Message]) -> Result<(), StoreError> {
        self.core.keep(messages)
    }

    fn spend(&self, spent: crate::store::UsageRow) -> Result<(), StoreError> {
        self.core.spend(spent)
    }

    fn write_soon(&self) {
        self.core.write_soon();
    }

    async fn flush(&self) -> Result<(), StoreError> {
        self.core.flush().await
    }

    fn last_seq(&self) -> u64 {
        self.core.stored.borrow().seq
    }

    fn subscribe(&self, since: u64, until_result: bool) -> BoxStream<'static, Arc<Event>> {
        self.core.subscribe(since, until_result).boxed()
    }

    fn replay(&self, since: u64) -> BoxStream<'static, Arc<Event>> {
        let core = self.core.clone();
        futures::stream::once(async move {
            let until = stored_last_seq(&core).await;
            core.replay(since, until)
        })
        .flatten()
        .boxed()
    }

    async fn last_result(&self) -> Result<Option<ResultStatus>, StoreError> {
        let last = self.core.store.last_seq(self.core.id).await?;
        let known = self.core.stored.borrow().seq;
        self.core.result_at(last.max(known)).await
    }
}

/// The highest `seq` in the store, or what this replica knows when the
/// store does not answer.
async fn stored_last_seq(core: &Core) -> u64 {
    let known = core.stored.borrow().seq;
    match core.store.last_seq(core.id).await {
        Ok(last) => last.max(known),
        Err(e) => {
            tracing::error!(session = %core.id, error = %e, "reading the last seq failed");
            known
        }
    }
}

/// Publishes a session's stored batches on its `batch` subject.
struct Publisher {
    client: Client,
    subject: String,
}

impl Announce for Publisher {
    /// Sends the batch in messages that fit the server's payload limit.
    fn stored(&self, events: Vec<Arc<Event>>) {
        let limit = self
            .client
            .server_info()
            .max_payload
            .saturating_sub(HEADER_ROOM)
            .max(HEADER_ROOM);
        let mut payload = Vec::new();
        let mut last = 0;
        for event in &events {
            let line = match serde_json::to_vec(&**event) {
                Ok(mut line) => {
                    line.push(b'\n');
                    line
                }
                Err(e) => {
                    tracing::error!(subject = %self.subject, seq = event.seq, error = %e, "an event did not serialise; other replicas read it from the store");
                    continue;
                }
            };
            if line.len() > limit {
                tracing::warn!(subject = %self.subject, seq = event.seq, bytes = line.len(), "an event over NATS's payload limit; other replicas read it from the store");
                continue;
            }
            if payload.len() + line.len() > limit {
                self.send(std::mem::take(&mut payload), last);
            }
            payload.extend_from_slice(&line);
            last = event.seq;
        }
        if !payload.is_empty() {
            self.send(payload, last);
        }
    }
}

impl Publisher {
    /// Hands one message to the connection if it has room now; the writer
    /// never waits for NATS.
    fn send(&self, payload: Vec<u8>, last: u64) {
        let mut headers = HeaderMap::new();
        headers.insert(SEQ_HEADER, last.to_string().as_str());
        let publish =
            self.client
                .publish_with_headers(self.subject.clone(), headers, Bytes::from(payload));
        // Unconstrained: a task past its scheduling budget would see a
        // channel with room as full.
        match tokio::task::unconstrained(publish).now_or_never() {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                tracing::warn!(subject = %self.subject, error = %e, "publishing events failed; other replicas read them from the store");
            }
            None => {
                tracing::warn!(subject = %self.subject, "the NATS connection is backed up; other replicas read these events from the store");
            }
        }
    }
}

/// Subscribes to the session's subjects, retrying while NATS refuses, and
/// follows them until the log is dropped or the session closed.
async fn follow_nats(client: Client, core: Arc<Core>, dropped: CancellationToken) {
    let subjects = subject(core.id, "*");
    let messages = loop {
        let subscribed = tokio::select! {
            subscribed = client.subscribe(subjects.clone()) => subscribed,
            _ = dropped.cancelled() => return,
            _ = core.closed.cancelled() => return,
        };
        match subscribed {
            Ok(messages) => break messages,
            Err(e) => {
                tracing::warn!(session = %core.id, error = %e, "subscribing to the session's events failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(SUBSCRIBE_RETRY) => {}
                    _ = dropped.cancelled() => return,
                }
            }
        }
    };
    // A request nobody answers comes back from the server as "no
    // responders" after it has taken the subscription sent before it:
    // from then on every publish reaches this replica.
    let _ = client.request(client.new_inbox(), Bytes::new()).await;
    follow(core, messages, dropped).await;
}

/// The follower proper, over any stream of the session's messages: reads
/// from the store what was stored before the subscription took effect,
/// then broadcasts what arrives newer than what this replica knows.
pub(super) async fn follow(
    core: Arc<Core>,
    mut messages: impl Stream<Item = Message> + Unpin,
    dropped: CancellationToken,
) {
    // A session this replica made, whose first turn still holds its
    // lease, has nothing stored elsewhere: any other replica's write comes
    // after the lease goes, and so after this subscription.
    if !core.stored_only_here() {
        resync(&core).await;
    }
    // What this replica stores is activity too: its own batches do not
    // come back over NATS (the connection takes no echo), and a log
    // written here has no tail to lose. The writer does not wake this
    // task; when the quiet spell ends, a batch stored meanwhile starts
    // it again from that batch.
    let mut heard = Instant::now();
    loop {
        let watched = core.watched();
        let quiet_until = heard.max(core.stored.borrow().at) + RESYNC_QUIET;
        let message = tokio::select! {
            biased;
            _ = dropped.cancelled() => return,
            _ = core.closed.cancelled() => return,
            message = messages.next() => message,
            // Someone watches now: look out for quiet from here.
            _ = core.watcher_came.notified(), if !watched => continue,
            _ = tokio::time::sleep_until(quiet_until), if watched => {
                // Watched when the wait began, perhaps not now: a run's
                // stream ends with the result this loop last woke for.
                if !core.watched() || core.stored.borrow().at + RESYNC_QUIET > Instant::now() {
                    continue;
                }
                resync(&core).await;
                match core.store.get_session(core.id).await {
                    Ok(None) => core.closed.cancel(),
                    Ok(Some(_)) => {}
                    Err(e) => tracing::warn!(session = %core.id, error = %e, "checking the session failed"),
                }
                heard = Instant::now();
                continue;
            }
        };
        heard = Instant::now();
        let Some(message) = message else {
            tracing::warn!(session = %core.id, "the NATS subscription ended; live events from other replicas stop");
            return;
        };
        if message.subject.ends_with(".closed") {
            core.closed.cancel();
            continue;
        }
        let last = message
            .headers
            .as_ref()
            .and_then(|headers| headers.get(SEQ_HEADER))
            .and_then(|value| value.as_str().parse::<u64>().ok());
        if last.is_some_and(|last| last <= core.stored.borrow().seq) {
            continue;
        }
        let events = message
            .payload
            .split(|byte| *byte == b'\n')
            .filter(|line| !line.is_empty())
            .filter_map(|line| {
                serde_json::from_slice::<Event>(line)
                    .map_err(|e| tracing::warn!(session = %core.id, error = %e, "an event from NATS did not parse; subscribers read it from the store"))
                    .ok()
            });
        core.deliver_stored_elsewhere(events);
    }
}

/// Broadcasts what the store holds past what this replica knows.
async fn resync(core: &Core) {
    loop {
        let known = core.stored.borrow().seq;
        match core.store.events_since(core.id, known, REPLAY_PAGE).await {
            Ok(page) => {
                let full = page.len() == REPLAY_PAGE;
                core.deliver_stored_elsewhere(page);
                if !full {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!(session = %core.id, error = %e, "reading missed events failed");
                return;
            }
        }
    }
}

/// The closer: once the session is closed here, waits for its rows to
/// leave the store, then tells every replica. A close that is a shutdown
/// leaves the rows, and the wait gives up.
async fn announce_close(
    client: Client,
    store: Arc<dyn Store>,
    session: Uuid,
    closed: CancellationToken,
    dropped: CancellationToken,
) {
    tokio::select! {
        biased;
        _ = closed.cancelled() => {}
        _ = dropped.cancelled() => return,
    }
    let deadline = tokio::time::Instant::now() + CLOSE_WAIT;
    let mut wait = Duration::from_millis(5);
    loop {
        match store.get_session(session).await {
            Ok(None) => break,
            Ok(Some(_)) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(1));
            }
            Ok(Some(_)) => return,
            Err(e) => {
                tracing::debug!(session = %session, error = %e, "the store is gone; no close notice");
                return;
            }
        }
    }
    if let Err(e) = client
        .publish(subject(session, "closed"), Bytes::new())
        .await
    {
        tracing::warn!(session = %session, error = %e, "publishing the close notice failed; followers elsewhere end at their next check");
    }
}
