//! Two session managers on one store, as two replicas sharing PostgreSQL
//! are: one turn per session among them, a session's log continuing across
//! them, and the turns of a replica that died closed by another.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::lease::{TurnLeases, lease_name};
use super::tests::Echo;
use super::*;
use crate::model::Message;
use crate::protocol::{EventKind, ResultStatus, SessionKind, SessionStatus};
use crate::store::conformance::{Fixture, PostgresFixture};
use crate::store::{SqliteStore, Store};
use crate::telemetry::Metrics;

fn replica(store: &Arc<dyn Store>, lease: Duration) -> SessionManager {
    SessionManager::new(
        store.clone(),
        Tasks::new().with(Arc::new(Echo)).with(Arc::new(Recall)),
        Limits {
            turn_timeout: Duration::from_secs(60),
            ephemeral_retention: Duration::ZERO,
        },
        Arc::new(Metrics::new()),
        CancellationToken::new(),
    )
    .with_leases(TurnLeases::new(store.clone(), lease))
}

/// Two replicas on `store` with a lease of 15 s, longer than any test.
fn two_replicas(store: &Arc<dyn Store>) -> (SessionManager, SessionManager) {
    let lease = Duration::from_secs(15);
    (replica(store, lease), replica(store, lease))
}

fn shared_store(dir: &tempfile::TempDir) -> Arc<dyn Store> {
    Arc::new(SqliteStore::open(&dir.path().join("c.db")).unwrap())
}

async fn create(manager: &SessionManager) -> Arc<Session> {
    create_of(manager, "echo").await
}

async fn create_of(manager: &SessionManager, kind: &'static str) -> Arc<Session> {
    manager
        .create(NewSession {
            name: None,
            kind: SessionKind::named(kind),
            owner: None,
            options: json!({}),
            ephemeral: false,
            origin: None,
            metadata: Default::default(),
        })
        .await
        .unwrap()
}

/// The turn's events up to its result.
async fn events_of(turn: StartedTurn) -> Vec<Arc<crate::protocol::Event>> {
    turn.session.subscribe(turn.since, true).collect().await
}

async fn settled(manager: &SessionManager, id: uuid::Uuid) {
    loop {
        let session = manager.get(id, None).await.unwrap();
        if !session.is_running() && session.status() != SessionStatus::Running {
            let _turn = session.turn_lock.lock().await;
            return;
        }
        tokio::task::yield_now().await;
    }
}

/// Waits until the turn has stored `running`, as other replicas see it.
async fn stored_as_running(store: &Arc<dyn Store>, id: uuid::Uuid) {
    while store.get_session(id).await.unwrap().unwrap().status != SessionStatus::Running {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn a_session_made_on_one_replica_takes_turns_on_another_with_one_log() {
    let dir = tempfile::tempdir().unwrap();
    let store = shared_store(&dir);
    let (a, b) = two_replicas(&store);
    let session = create(&a).await;
    let first = events_of(
        a.start_turn(session.clone(), "one".into(), false)
            .await
            .unwrap(),
    )
    .await;
    // The lease went in the result's write: whoever read the result can
    // take the next turn at once.
    let probe = store
        .lease_acquire(&lease_name(session.id), "probe", Duration::from_secs(15))
        .await
        .unwrap();
    assert_eq!(probe.holder, "probe");
    assert!(
        store
            .lease_release(&lease_name(session.id), "probe")
            .await
            .unwrap()
    );
    settled(&a, session.id).await;
    // B loads the session after A's turn; then A runs another turn, which
    // B's copy has not seen.
    let on_b = b.get(session.id, None).await.unwrap();
    assert_eq!(on_b.last_seq(), 2);
    events_of(
        a.start_turn(session.clone(), "two".into(), false)
            .await
            .unwrap(),
    )
    .await;
    settled(&a, session.id).await;
    let third = b.start_turn(on_b, "three".into(), false).await.unwrap();
    assert_eq!(third.since, 4, "B's log continues after A's events");
    let third = events_of(third).await;
    settled(&b, session.id).await;
    let seqs: Vec<u64> = store
        .events_since(session.id, 0, 100)
        .await
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5, 6]);
    assert_eq!(first[0].seq, 1);
    assert_eq!(third.last().unwrap().seq, 6);
    // A sees B's turn in the store's status and usage.
    let on_a = a.get(session.id, None).await.unwrap();
    assert_eq!(on_a.status(), SessionStatus::Idle);
    assert_eq!(on_a.usage().turns, 3);
}

#[tokio::test]
async fn one_turn_per_session_among_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let store = shared_store(&dir);
    let (a, b) = two_replicas(&store);
    let session = create(&a).await;
    let running = a
        .start_turn(session.clone(), "wait".into(), false)
        .await
        .unwrap();
    let on_b = b.get(session.id, None).await.unwrap();
    match b.start_turn(on_b.clone(), "now".into(), false).await {
        Err(SessionError::Busy(id)) => assert_eq!(id, session.id),
        other => panic!("expected Busy, got {:?}", other.map(|t| t.since)),
    }
    // Queued on B, it starts once A's turn has ended.
    let queued = tokio::spawn({
        let on_b = on_b.clone();
        async move {
            b.start_turn(on_b, "after".into(), true)
                .await
                .map(|t| t.since)
        }
    });
    tokio::task::yield_now().await;
    assert!(!queued.is_finished());
    running.cancel.cancel();
    let a_events = events_of(running).await;
    assert!(matches!(
        a_events.last().unwrap().kind,
        EventKind::Result {
            status: ResultStatus::Interrupted,
            ..
        }
    ));
    let since = tokio::time::timeout(Duration::from_secs(10), queued)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(since, a_events.last().unwrap().seq);
}

#[tokio::test]
async fn the_turn_of_a_replica_that_died_is_closed_by_another() {
    let dir = tempfile::tempdir().unwrap();
    let store = shared_store(&dir);
    let a = replica(&store, Duration::from_secs(15));
    let session = create(&a).await;
    // A replica that died mid-turn: the session is stored as running with
    // a first event, and its lease was last renewed a lease ago.
    store
        .update_session(session.id, SessionStatus::Running, &Default::default())
        .await
        .unwrap();
    session
        .emit(EventKind::Thinking {
            content: "half way".into(),
            reasoning: false,
        })
        .unwrap();
    session.flush().await.unwrap();
    store
        .lease_acquire(&lease_name(session.id), "dead-replica/1", Duration::ZERO)
        .await
        .unwrap();

    let b = replica(&store, Duration::from_secs(15));
    assert_eq!(b.close_abandoned().await.unwrap(), 1);
    let events = store.events_since(session.id, 0, 100).await.unwrap();
    let types: Vec<_> = events.iter().map(|e| e.kind.type_name()).collect();
    assert_eq!(types, ["thinking", "status", "result"]);
    assert!(matches!(
        events[2].kind,
        EventKind::Result {
            status: ResultStatus::Interrupted,
            ..
        }
    ));
    let on_b = b.get(session.id, None).await.unwrap();
    assert_eq!(on_b.status(), SessionStatus::Interrupted);
    assert!(store.leases_expired("turn:").await.unwrap().is_empty());
    // The session takes its next message on the survivor.
    let next = events_of(b.start_turn(on_b, "again".into(), false).await.unwrap()).await;
    assert_eq!(next.first().unwrap().seq, 4);
}

#[tokio::test]
async fn a_start_up_leaves_turns_other_replicas_run() {
    let dir = tempfile::tempdir().unwrap();
    let store = shared_store(&dir);
    let a = replica(&store, Duration::from_secs(15));
    let session = create(&a).await;
    let running = a
        .start_turn(session.clone(), "wait".into(), false)
        .await
        .unwrap();
    stored_as_running(&store, session.id).await;
    let b = replica(&store, Duration::from_secs(15));
    assert_eq!(b.recover().await.unwrap(), 0);
    assert!(session.is_running());
    running.cancel.cancel();
    events_of(running).await;
}

/// Two replicas on one store and one bus, each taking the other's
/// interrupts.
async fn replicas_with_a_bus(
    store: &Arc<dyn Store>,
) -> (Arc<SessionManager>, Arc<SessionManager>, CancellationToken) {
    let stop = CancellationToken::new();
    let bus: Arc<dyn crate::bus::Bus> = Arc::new(
        crate::bus::EmbeddedBus::start(
            store.clone(),
            &crate::bus::BusConfig::default(),
            Arc::new(Metrics::new()),
            &tokio_util::task::TaskTracker::new(),
            stop.clone(),
        )
        .await
        .unwrap(),
    );
    let [a, b] = [0, 1].map(|_| {
        let manager = Arc::new(replica(store, Duration::from_secs(15)).with_signals(bus.clone()));
        tokio::spawn(manager.clone().listen(stop.clone()));
        manager
    });
    (a, b, stop)
}

#[tokio::test]
async fn an_interrupt_or_a_delete_on_one_replica_stops_the_turn_on_another() {
    let dir = tempfile::tempdir().unwrap();
    let store = shared_store(&dir);
    let (a, b, _stop) = replicas_with_a_bus(&store).await;
    for delete in [false, true] {
        let session = create(&a).await;
        let running = a
            .start_turn(session.clone(), "wait".into(), false)
            .await
            .unwrap();
        let mut events = running.session.subscribe(running.since, true);
        stored_as_running(&store, session.id).await;
        let on_b = b.get(session.id, None).await.unwrap();
        assert_eq!(on_b.status(), SessionStatus::Running);
        let id = session.id;
        let deleted = delete.then(|| {
            let b = b.clone();
            tokio::spawn(async move { b.delete(id, None).await })
        });
        // B's listener may not have subscribed yet when the first goes:
        // the interrupt is sent until the turn ends.
        let result = loop {
            if !delete {
                assert!(on_b.interrupt(), "B knows the turn runs elsewhere");
            }
            match tokio::time::timeout(Duration::from_millis(200), events.next()).await {
                Ok(Some(event)) => break event,
                Ok(None) => panic!("the turn's events ended without a result"),
                Err(_) => continue,
            }
        };
        assert!(matches!(
            result.kind,
            EventKind::Result {
                status: ResultStatus::Interrupted,
                ..
            }
        ));
        if let Some(deleted) = deleted {
            deleted.await.unwrap().unwrap();
            assert!(store.get_session(session.id).await.unwrap().is_none());
            assert!(matches!(
                a.get(session.id, None).await,
                Err(SessionError::NotFound(_))
            ));
        }
    }
}

#[tokio::test]
async fn a_turn_started_from_a_copy_learns_of_a_delete_on_another_replica() {
    let dir = tempfile::tempdir().unwrap();
    let store = shared_store(&dir);
    let (a, b) = two_replicas(&store);
    let session = create(&a).await;
    // B holds a copy, then A deletes the session: B's copy is not read
    // again before a turn, but taking the turn reads the store.
    let held = b.get(session.id, None).await.unwrap();
    a.delete(session.id, None).await.unwrap();
    let copy = b.get_to_start(session.id, None).await.unwrap();
    assert!(Arc::ptr_eq(&copy, &held));
    let refused = b.start_turn(copy, "one".into(), false).await;
    assert!(
        matches!(refused, Err(SessionError::NotFound(id)) if id == session.id),
        "{:?}",
        refused.map(|turn| turn.since)
    );
    assert!(matches!(
        b.get(session.id, None).await,
        Err(SessionError::NotFound(_))
    ));
}

/// Adds its input to the conversation and answers with the whole of it,
/// as the turn found it: which history a turn started from.
struct Recall;

#[async_trait::async_trait]
impl SessionTask for Recall {
    fn kind(&self) -> SessionKind {
        SessionKind::named("recall")
    }

    async fn options(
        &self,
        body: &serde_json::Map<String, serde_json::Value>,
        fields: &[&str],
    ) -> Result<serde_json::Value, SessionError> {
        Echo.options(body, fields).await
    }

    async fn run(
        &self,
        turn: &mut Turn,
        input: String,
    ) -> Result<Outcome, crate::store::StoreError> {
        let mut history = turn.session.take_history().await?;
        let said = Message::User { content: input };
        turn.session.store_messages(std::slice::from_ref(&said))?;
        Arc::make_mut(&mut history).push(said);
        let recalled: Vec<&str> = history
            .iter()
            .map(|m| match m {
                Message::User { content } => content.as_str(),
                _ => "?",
            })
            .collect();
        let text = recalled.join(" ");
        turn.session.keep_history(history);
        turn.history_len = Some(turn.session.history_len() as u64);
        Ok(Outcome::new(ResultStatus::Success, Some(text)))
    }
}

/// The text of the `result` that ends `turn`.
async fn answer(turn: StartedTurn) -> String {
    answer_at(turn).await.0
}

/// The text of the `result` that ends `turn`, and its `seq`.
async fn answer_at(turn: StartedTurn) -> (String, u64) {
    let events = events_of(turn).await;
    let last = events.last().unwrap();
    match &last.kind {
        EventKind::Result { result, .. } => (result.clone().unwrap_or_default(), last.seq),
        other => panic!("the turn ended with {other:?}"),
    }
}

/// On PostgreSQL a replica that takes a turn learns the length of the
/// stored conversation with the session: a turn after its own last one
/// reads no messages, and a turn after another replica's reads what that
/// one added.
#[tokio::test]
async fn a_turn_starts_from_the_whole_conversation_whichever_replica_ran_the_last() {
    let fixture = PostgresFixture::new().await;
    let store = fixture.open().await;
    let (a, b) = two_replicas(&store);
    let session = create_of(&a, "recall").await;
    let mut said = Vec::new();
    for (word, replica) in [
        ("one", &a),
        ("two", &a),
        ("three", &b),
        ("four", &a),
        ("five", &a),
    ] {
        said.push(word);
        // The copy this replica holds: after its own last turn, or loaded
        // before another replica's.
        let copy = replica.get(session.id, None).await.unwrap();
        let turn = replica.start_turn(copy, word.into(), false).await.unwrap();
        assert_eq!(answer(turn).await, said.join(" "), "turn '{word}'");
        settled(replica, session.id).await;
    }
    assert_eq!(store.messages(session.id).await.unwrap().len(), 5);
}

/// A replica whose copy of a session followed another replica's turns
/// over NATS (its log is as long as the store's) still learns of a rewind
/// made there: its next turn starts from the conversation as cut and
/// continued, not from the one it kept.
#[tokio::test]
async fn a_rewind_on_another_replica_reaches_a_copy_that_followed_it() {
    let fixture = PostgresFixture::new().await;
    let store = fixture.open().await;
    let url = std::env::var("CONCLAVE_TEST_NATS")
        .expect("CONCLAVE_TEST_NATS is not set: scripts/test.sh starts nats-server and sets it");
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let logs =
            crate::session::log::NatsLogs::connect(&url, store.clone(), Arc::new(Metrics::new()))
                .await
                .unwrap();
        replicas.push(replica(&store, Duration::from_secs(15)).with_logs(Arc::new(logs)));
    }
    let (a, b) = (&replicas[0], &replicas[1]);
    let session = create_of(a, "recall").await;
    let mut ends = Vec::new();
    for word in ["one", "two", "three"] {
        let copy = a.get(session.id, None).await.unwrap();
        let turn = a.start_turn(copy, word.into(), false).await.unwrap();
        ends.push(answer_at(turn).await.1);
        settled(a, session.id).await;
    }
    let on_a = a.get(session.id, None).await.unwrap();
    // B takes the session back to the end of "one" and goes on.
    let copy = b.get(session.id, None).await.unwrap();
    let options = TurnOptions {
        rewind_to: Some(ends[0]),
        ..TurnOptions::default()
    };
    let turn = b
        .start_turn_with(copy, "four".into(), false, options)
        .await
        .unwrap();
    assert_eq!(answer(turn).await, "one four");
    settled(b, session.id).await;
    // A's copy follows B's events over NATS until its log is the store's.
    let last = store.last_seq(session.id).await.unwrap();
    while on_a.last_seq() < last {
        tokio::task::yield_now().await;
    }
    let turn = a
        .start_turn(on_a.clone(), "five".into(), false)
        .await
        .unwrap();
    assert_eq!(answer(turn).await, "one four five");
}

/// The lease of a run's first turn is taken by the write that stores the
/// session: until then its renewals find nothing and wait, for up to a
/// lease; once it is stored they renew it; never stored, the turn is
/// lost.
#[tokio::test]
async fn a_new_sessions_lease_waits_for_its_first_write_for_up_to_a_lease() {
    let dir = tempfile::tempdir().unwrap();
    let store = shared_store(&dir);
    let ttl = Duration::from_millis(600);
    let leases = TurnLeases::new(store.clone(), ttl);

    let stored = CancellationToken::new();
    let held = leases.for_new_session(uuid::Uuid::new_v4(), stored.clone());
    let lease = held.lease().clone();
    // The first renewal (at a third of the lease) finds nothing; the
    // session's first write then takes the lease.
    tokio::time::sleep(ttl / 2).await;
    let taken = store
        .lease_acquire(&lease.name, &lease.holder, ttl)
        .await
        .unwrap();
    assert_eq!(taken.holder, lease.holder);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = store
            .lease_acquire(&lease.name, "another", Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(now.holder, lease.holder, "the lease stays the turn's");
        if now.expires_at > taken.expires_at {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never renewed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!stored.is_cancelled(), "a stored lease is not lost");
    drop(held);

    let never = CancellationToken::new();
    let _held = leases.for_new_session(uuid::Uuid::new_v4(), never.clone());
    tokio::time::timeout(Duration::from_secs(10), never.cancelled())
        .await
        .expect("a lease never stored is lost after a lease");
}

/// A turn that runs for several leases keeps its lease, renewed in the
/// background; a turn that ends before its first renewal falls due has
/// none started, and neither leaves anything for the replica to renew.
#[tokio::test]
async fn a_long_turns_lease_is_renewed_and_a_short_ones_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store = shared_store(&dir);
    let ttl = Duration::from_millis(1500);
    let leases = TurnLeases::new(store.clone(), ttl);
    let held = |taken| match taken {
        super::lease::Taken::Held(held) => held,
        super::lease::Taken::Busy(lease) => panic!("busy: {lease:?}"),
    };

    let short = held(
        leases
            .take(uuid::Uuid::new_v4(), CancellationToken::new())
            .await
            .unwrap(),
    );
    assert_eq!(leases.registered(), (1, 0));
    short.release().await;
    assert_eq!(leases.registered(), (0, 0), "a short turn leaves nothing");

    let lost = CancellationToken::new();
    let long = held(
        leases
            .take(uuid::Uuid::new_v4(), lost.clone())
            .await
            .unwrap(),
    );
    let lease = long.lease().clone();
    let probe = || store.lease_acquire(&lease.name, "another", Duration::from_secs(60));
    let first = probe().await.unwrap();
    assert_eq!(first.holder, lease.holder);
    // Hold it past two whole leases: without renewals another holder
    // would take it at the first.
    let until = tokio::time::Instant::now() + ttl * 2;
    let mut renewed = 0;
    let mut expires = first.expires_at;
    while tokio::time::Instant::now() < until {
        let now = probe().await.unwrap();
        assert_eq!(now.holder, lease.holder, "the lease stays the turn's");
        if now.expires_at > expires {
            renewed += 1;
            expires = now.expires_at;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(renewed >= 3, "renewed {renewed} times over two leases");
    assert!(!lost.is_cancelled(), "a renewed lease is not lost");
    assert_eq!(leases.registered(), (1, 1));
    long.release().await;
    assert_eq!(leases.registered(), (0, 0));
    assert_ne!(probe().await.unwrap().holder, lease.holder, "released");
}
