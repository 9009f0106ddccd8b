//! The NATS event log: two `NatsLogs` over one store (SQLite, and the
//! PostgreSQL of `CONCLAVE_TEST_POSTGRES` for the 10,000 events) stand for
//! two replicas (each with its own NATS connection, against the
//! nats-server of `CONCLAVE_TEST_NATS`), and the follower alone over a channel of
//! messages with a paused clock.

use std::sync::Arc;
use std::time::Duration;

use async_nats::{HeaderMap, Message, Subject};
use bytes::Bytes;
use chrono::Utc;
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::core::Core;
use super::nats::{RESYNC_QUIET, follow};
use super::{EventLogs, NatsLogs};
use crate::protocol::{
    Event, EventKind, ResultStatus, SessionKind, SessionRecord, SessionStatus, Usage,
};
use crate::store::{PostgresStore, SqliteStore, Store};
use crate::telemetry::Metrics;

/// What a stream may take to deliver everything it is owed.
const DEADLINE: Duration = Duration::from_secs(60);

fn nats_url() -> String {
    std::env::var("CONCLAVE_TEST_NATS").unwrap_or_else(|_| {
        panic!("CONCLAVE_TEST_NATS is not set: scripts/test.sh starts nats-server and sets it")
    })
}

async fn store_with_session(dir: &tempfile::TempDir) -> (Arc<dyn Store>, Uuid) {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("c.db")).unwrap());
    let id = new_session(&store).await;
    (store, id)
}

/// An idle session, so a server starting on a shared database has no turn
/// of it to close.
async fn new_session(store: &Arc<dyn Store>) -> Uuid {
    let now = Utc::now();
    let id = Uuid::new_v4();
    store
        .create_session(&SessionRecord {
            id,
            name: None,
            kind: SessionKind::named("echo"),
            owner: None,
            options: serde_json::json!({}),
            status: SessionStatus::Idle,
            usage: Usage::default(),
            ephemeral: false,
            origin: None,
            metadata: Default::default(),
            created_at: now,
            updated_at: now,
        })
        .await
        .unwrap();
    id
}

/// A replica: its own NATS connection, the shared store.
async fn replica(store: &Arc<dyn Store>) -> NatsLogs {
    NatsLogs::connect(&nats_url(), store.clone(), Arc::new(Metrics::new()))
        .await
        .unwrap()
}

fn thinking(n: usize) -> EventKind {
    EventKind::Thinking {
        content: format!("event {n}"),
        reasoning: false,
    }
}

fn success() -> EventKind {
    EventKind::Result {
        status: ResultStatus::Success,
        result: None,
        cost_usd: 0.0,
        cost_known: true,
        turns: 1,
        usage: Usage::default(),
        duration_ms: 0,
        history_len: None,
        files_changed: None,
        context: None,
    }
}

/// Every `seq` a stream yields until it ends.
async fn seqs(stream: BoxStream<'static, Arc<Event>>) -> Vec<u64> {
    timeout(DEADLINE, stream.map(|event| event.seq).collect())
        .await
        .expect("the stream did not end in time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_events_reach_another_replica_once_each_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("c.db")).unwrap());
    ten_thousand_events_to_another_replica(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_events_reach_another_replica_on_postgres() {
    let url = std::env::var("CONCLAVE_TEST_POSTGRES").unwrap_or_else(|_| {
        panic!("CONCLAVE_TEST_POSTGRES is not set: scripts/test.sh starts PostgreSQL and sets it")
    });
    let store: Arc<dyn Store> = Arc::new(PostgresStore::open(&url).await.unwrap());
    ten_thousand_events_to_another_replica(store).await;
}

async fn ten_thousand_events_to_another_replica(store: Arc<dyn Store>) {
    const EVENTS: u64 = 10_000;
    const BURST: u64 = 250;
    let id = new_session(&store).await;
    let (a, b) = (replica(&store).await, replica(&store).await);
    let writer = a.open(id, 0, CancellationToken::new());
    let reader = b.open(id, 0, CancellationToken::new());

    // Live from the start, before A has appended anything.
    let live = tokio::spawn(seqs(reader.subscribe(0, true)));
    // Slow: reads nothing until A is done, far behind the live broadcast.
    let slow = reader.subscribe(0, true);
    let mut joined = None;
    for burst in 0..EVENTS / BURST {
        for n in 0..BURST {
            let seq = burst * BURST + n + 1;
            let kind = if seq == EVENTS {
                success()
            } else {
                thinking(seq as usize)
            };
            writer.append(kind, None).unwrap();
        }
        // Between bursts the writer stores what queued; midway a
        // subscriber joins from a `seq` while events still come.
        writer.flush().await.unwrap();
        if burst == EVENTS / BURST / 2 {
            joined = Some(tokio::spawn(seqs(reader.subscribe(EVENTS / 4, true))));
        }
    }
    let all: Vec<u64> = (1..=EVENTS).collect();
    assert_eq!(live.await.unwrap(), all);
    // The live stream ended on the last event: B's follower learns the
    // log's end too (it may still be reading behind the subscriber, which
    // filled from the store, when the machine is busy).
    tokio::time::timeout(Duration::from_secs(30), async {
        while reader.last_seq() < EVENTS {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("B's last_seq stayed at {}", reader.last_seq()));
    assert_eq!(reader.last_seq(), EVENTS);
    assert_eq!(
        reader.last_result().await.unwrap(),
        Some(ResultStatus::Success)
    );
    assert_eq!(
        joined.unwrap().await.unwrap(),
        (EVENTS / 4 + 1..=EVENTS).collect::<Vec<_>>()
    );
    assert_eq!(seqs(slow).await, all);
    assert_eq!(
        seqs(reader.replay(EVENTS - 3)).await,
        vec![EVENTS - 2, EVENTS - 1, EVENTS]
    );
    // A shared database keeps no test sessions.
    store.delete_session(id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_on_one_replica_ends_the_followers_on_another() {
    let dir = tempfile::tempdir().unwrap();
    let (store, id) = store_with_session(&dir).await;
    let (a, b) = (replica(&store).await, replica(&store).await);
    let closed_on_a = CancellationToken::new();
    let writer = a.open(id, 0, closed_on_a.clone());
    let reader = b.open(id, 0, CancellationToken::new());
    let mut follower = reader.subscribe(0, false);
    for n in 1..=3 {
        writer.append(thinking(n), None).unwrap();
    }
    for seq in 1..=3 {
        let event = timeout(DEADLINE, follower.next()).await.unwrap().unwrap();
        assert_eq!(event.seq, seq);
    }
    // As the manager deletes: close the session here, then its rows go.
    let deleted = Instant::now();
    closed_on_a.cancel();
    store.delete_session(id).await.unwrap();
    assert!(
        timeout(DEADLINE, follower.next()).await.unwrap().is_none(),
        "the follower on B went on after the delete"
    );
    // The notice, not B's own check after a quiet spell, ended it.
    assert!(deleted.elapsed() < RESYNC_QUIET, "{:?}", deleted.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_followed_appends_after_the_last_stored_event() {
    let dir = tempfile::tempdir().unwrap();
    let (store, id) = store_with_session(&dir).await;
    let (a, b) = (replica(&store).await, replica(&store).await);
    let first = a.open(id, 0, CancellationToken::new());
    let second = b.open(id, 0, CancellationToken::new());
    let mut follower = second.subscribe(0, true);
    for n in 1..=5 {
        first.append(thinking(n), None).unwrap();
    }
    first.flush().await.unwrap();
    for seq in 1..=5 {
        let event = timeout(DEADLINE, follower.next()).await.unwrap().unwrap();
        assert_eq!(event.seq, seq);
    }
    assert_eq!(second.last_seq(), 5);
    // The turn moves to B: its events continue the log, and A's
    // subscribers see them.
    let on_a = first.subscribe(5, true);
    assert_eq!(second.append(success(), None).unwrap(), 6);
    second.flush().await.unwrap();
    assert_eq!(seqs(on_a).await, vec![6]);
    assert_eq!(
        timeout(DEADLINE, follower.next())
            .await
            .unwrap()
            .unwrap()
            .seq,
        6
    );
    assert_eq!(store.last_seq(id).await.unwrap(), 6);
    assert_eq!(
        first.last_result().await.unwrap(),
        Some(ResultStatus::Success)
    );
}

/// The next item of `stream` within a deadline that a paused clock keeps:
/// a paused runtime waiting on the store's thread jumps to its next timer,
/// so the deadline is many short ones, each a jump at most.
async fn within_ticks<S: futures::Stream + Unpin>(stream: &mut S) -> Option<S::Item> {
    const TICK: Duration = Duration::from_millis(500);
    const TICKS: usize = 1000;
    let mut next = stream.next();
    for _ in 0..TICKS {
        if let Ok(item) = timeout(TICK, &mut next).await {
            return item;
        }
    }
    panic!("nothing from the stream within {TICKS} ticks");
}

async fn next_seq(events: &mut BoxStream<'static, Arc<Event>>) -> u64 {
    within_ticks(events).await.expect("the stream ended").seq
}

/// A batch message as the publisher sends it.
fn message(id: Uuid, events: &[Event]) -> Message {
    let mut payload = Vec::new();
    for event in events {
        payload.extend(serde_json::to_vec(event).unwrap());
        payload.push(b'\n');
    }
    let mut headers = HeaderMap::new();
    let last = events.last().unwrap().seq.to_string();
    headers.insert("Conclave-Seq", last.as_str());
    Message {
        subject: Subject::from(format!("conclave.events.{id}.batch")),
        reply: None,
        payload: Bytes::from(payload),
        headers: Some(headers),
        status: None,
        description: None,
        length: 0,
    }
}

fn event(id: Uuid, seq: u64) -> Event {
    Event {
        kind: thinking(seq as usize),
        session_id: id,
        seq,
        ts: Utc::now(),
        agent_id: None,
    }
}

#[tokio::test(start_paused = true)]
async fn the_follower_fills_gaps_and_a_lost_tail_from_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let (store, id) = store_with_session(&dir).await;
    let core = unshared_core(&store, id);
    let (nats, dropped) = spawn_follower(&core);
    let mut events = core.subscribe(0, false).boxed();

    store.append_events(&[event(id, 1)]).await.unwrap();
    nats.send(message(id, &[event(id, 1)])).await.unwrap();
    assert_eq!(next_seq(&mut events).await, 1);
    // The message of 2 is lost; 3 shows the gap, filled from the store.
    store
        .append_events(&[event(id, 2), event(id, 3)])
        .await
        .unwrap();
    let sent = Instant::now();
    nats.send(message(id, &[event(id, 3)])).await.unwrap();
    assert_eq!(next_seq(&mut events).await, 2);
    assert_eq!(next_seq(&mut events).await, 3);
    // The message of 4 is lost and nothing follows: the follower reads it
    // from the store once the subscription has been quiet long enough.
    store.append_events(&[event(id, 4)]).await.unwrap();
    assert_eq!(next_seq(&mut events).await, 4);
    assert!(sent.elapsed() >= RESYNC_QUIET, "{:?}", sent.elapsed());
    // A message for what is known already changes nothing.
    nats.send(message(id, &[event(id, 4)])).await.unwrap();
    // The session is deleted and its notice lost: the next quiet check
    // ends the stream.
    store.delete_session(id).await.unwrap();
    assert!(within_ticks(&mut events).await.is_none());
    assert_eq!(core.stored.borrow().seq, 4);
    dropped.cancel();
}

/// A record of `id` as a run makes it, and its first turn's lease.
fn made_here(id: Uuid) -> (SessionRecord, crate::store::Release) {
    let now = Utc::now();
    let record = SessionRecord {
        id,
        name: None,
        kind: SessionKind::named("echo"),
        owner: None,
        options: serde_json::json!({}),
        status: SessionStatus::Running,
        usage: Usage::default(),
        ephemeral: true,
        origin: None,
        metadata: Default::default(),
        created_at: now,
        updated_at: now,
    };
    let lease = crate::store::Release {
        name: format!("turn:{id}"),
        holder: "here".into(),
    };
    (record, lease)
}

/// Starts `core`'s follower on a channel standing for its subscription:
/// the sender, and the token that stops the follower.
fn spawn_follower(core: &Arc<Core>) -> (mpsc::Sender<Message>, CancellationToken) {
    let (nats, messages) = mpsc::channel(8);
    let dropped = CancellationToken::new();
    tokio::spawn(follow(
        core.clone(),
        tokio_stream::wrappers::ReceiverStream::new(messages),
        dropped.clone(),
    ));
    (nats, dropped)
}

/// A log of `id` that publishes nowhere, from its start.
fn unshared_core(store: &Arc<dyn Store>, id: Uuid) -> Arc<Core> {
    Arc::new(Core::new(
        id,
        0,
        store.clone(),
        Arc::new(Metrics::new()),
        CancellationToken::new(),
        None,
    ))
}

/// The log of `id` made here: its next write stores the session with
/// its first turn's lease, an hour long.
fn made_here_holding_its_turn(store: &Arc<dyn Store>, id: Uuid) -> Arc<Core> {
    let (record, lease) = made_here(id);
    let core = unshared_core(store, id);
    core.create_with_next_write(record, Some((lease, Duration::from_secs(3600))));
    core
}

/// What `core` knows stored once its follower has started and then met
/// the session's close notice (so it ends).
async fn known_after_following(core: &Arc<Core>) -> u64 {
    let (nats, messages) = mpsc::channel::<Message>(1);
    nats.send(Message {
        subject: Subject::from(format!("conclave.events.{}.closed", core.id)),
        reply: None,
        payload: Bytes::new(),
        headers: None,
        status: None,
        description: None,
        length: 0,
    })
    .await
    .unwrap();
    let follower = tokio::spawn(follow(
        core.clone(),
        tokio_stream::wrappers::ReceiverStream::new(messages),
        CancellationToken::new(),
    ));
    timeout(DEADLINE, follower).await.unwrap().unwrap();
    core.stored.borrow().seq
}

#[tokio::test]
async fn a_follower_reads_the_store_at_its_start_unless_its_replica_made_the_session_and_holds_its_turn()
 {
    let dir = tempfile::tempdir().unwrap();
    let (store, id) = store_with_session(&dir).await;
    store.append_events(&[event(id, 1)]).await.unwrap();
    // A session made elsewhere: what was stored before it was followed
    // is read at once.
    let elsewhere = unshared_core(&store, id);
    assert!(!elsewhere.stored_only_here());
    assert_eq!(known_after_following(&elsewhere).await, 1);
    // Made here, its first turn holding the lease it took in that write:
    // nothing can have been stored elsewhere, and the store is not read.
    // (This store holds an event only to show that it is not read.)
    let made = made_here_holding_its_turn(&store, id);
    assert!(made.stored_only_here());
    assert_eq!(known_after_following(&made).await, 0);
}

#[tokio::test(start_paused = true)]
async fn a_session_made_here_is_stored_only_here_until_its_lease_goes_or_could_have_expired() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("c.db")).unwrap());
    // Made without a lease: another replica may take a turn at once.
    let id = Uuid::new_v4();
    let (record, _) = made_here(id);
    let unleased = unshared_core(&store, id);
    unleased.create_with_next_write(record, None);
    assert!(!unleased.stored_only_here());
    // The lease could have expired a lease after the creation.
    let id = Uuid::new_v4();
    let (record, lease) = made_here(id);
    let ttl = Duration::from_secs(60);
    let lapsing = unshared_core(&store, id);
    lapsing.create_with_next_write(record, Some((lease, ttl)));
    assert!(lapsing.stored_only_here());
    tokio::time::advance(ttl).await;
    assert!(!lapsing.stored_only_here());
    // Once the write giving the lease up starts, other replicas may write.
    let id = Uuid::new_v4();
    let (record, lease) = made_here(id);
    let made = unshared_core(&store, id);
    made.create_with_next_write(record, Some((lease.clone(), Duration::from_secs(3600))));
    made.append(thinking(1), None).unwrap();
    made.flush().await.unwrap();
    assert!(made.stored_only_here());
    let state = crate::store::SessionState {
        status: SessionStatus::Idle,
        usage: Usage::default(),
        updated_at: Utc::now(),
    };
    made.append_last(success(), state, Some(lease)).unwrap();
    made.flush().await.unwrap();
    assert!(!made.stored_only_here());
    // A run's session closes with its one turn: no turn follows, so the
    // write that gives the lease up leaves it stored here alone, until
    // the lease could have expired.
    let id = Uuid::new_v4();
    let (record, lease) = made_here(id);
    let run = unshared_core(&store, id);
    let ttl = Duration::from_secs(3600);
    run.create_with_next_write(record, Some((lease.clone(), ttl)));
    let closed = crate::store::SessionState {
        status: SessionStatus::Closed,
        usage: Usage::default(),
        updated_at: Utc::now(),
    };
    run.append(thinking(1), None).unwrap();
    run.append_last(success(), closed, Some(lease)).unwrap();
    run.flush().await.unwrap();
    assert_eq!(run.stored.borrow().seq, 2);
    assert!(run.stored_only_here());
    tokio::time::advance(ttl).await;
    assert!(!run.stored_only_here());
}

/// A watcher that leaves after the follower last looked (a run's stream
/// ends with its result, just after the write the follower woke for)
/// leaves no quiet check behind: the follower reads the store only while
/// someone watches. (The clock is real: a paused one would jump past a
/// read of the store while the store's thread works.)
#[tokio::test]
async fn a_follower_nobody_watches_any_more_reads_nothing_when_quiet() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("c.db")).unwrap());
    let id = Uuid::new_v4();
    let core = made_here_holding_its_turn(&store, id);
    core.append(thinking(1), None).unwrap();
    core.flush().await.unwrap();
    // Stored elsewhere, its message lost: only a read of the store finds
    // it.
    store.append_events(&[event(id, 2)]).await.unwrap();
    // Watched when the follower starts, so it looks out for quiet.
    let events = core.subscribe(1, true);
    let (_nats, dropped) = spawn_follower(&core);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    drop(events);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!core.watched());
    // Past the quiet check that was due, with time for its read.
    tokio::time::sleep(RESYNC_QUIET + Duration::from_secs(2)).await;
    assert_eq!(core.stored.borrow().seq, 1, "the store was read");
    dropped.cancel();
}

/// A follower that began while nobody watched looks out for quiet once
/// someone does, with no message to wake it: the watcher gets a tail whose
/// message was lost.
#[tokio::test(start_paused = true)]
async fn a_watcher_who_comes_later_gets_a_lost_tail_after_a_quiet_spell() {
    let dir = tempfile::tempdir().unwrap();
    let (store, id) = store_with_session(&dir).await;
    let core = unshared_core(&store, id);
    let (_nats, dropped) = spawn_follower(&core);
    tokio::time::sleep(Duration::from_secs(1)).await;
    store.append_events(&[event(id, 1)]).await.unwrap();
    // Nothing else wakes the follower: without being told of the watcher
    // it would wait for a message forever.
    let mut events = core.subscribe(0, false).boxed();
    assert_eq!(next_seq(&mut events).await, 1);
    dropped.cancel();
}

/// What this replica stores is activity: the quiet spell that ends in a
/// read of the store counts from its last batch, which does not wake the
/// follower. (The clock is real, as above.)
#[tokio::test]
async fn a_batch_stored_here_puts_the_quiet_check_off() {
    let dir = tempfile::tempdir().unwrap();
    let (store, id) = store_with_session(&dir).await;
    let core = unshared_core(&store, id);
    let mut events = core.subscribe(0, false).boxed();
    let (_nats, dropped) = spawn_follower(&core);
    // Past the middle of the first quiet spell.
    tokio::time::sleep(RESYNC_QUIET - Duration::from_secs(2)).await;
    let storing = Instant::now();
    core.append(thinking(1), None).unwrap();
    core.flush().await.unwrap();
    assert_eq!(next_seq(&mut events).await, 1);
    // Stored elsewhere, its message lost: read when the spell that began
    // with the batch stored here ends, not the first one.
    store.append_events(&[event(id, 2)]).await.unwrap();
    assert_eq!(next_seq(&mut events).await, 2);
    assert!(storing.elapsed() >= RESYNC_QUIET, "{:?}", storing.elapsed());
    dropped.cancel();
}
