//! Turn takes done together: what each caller gets back, and which
//! leases are taken. A store of one connection, held by the test, makes
//! the callers queue until it is given back.

use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use chrono::Utc;
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::super::PostgresStore;
use crate::model::Message;
use crate::store::conformance::{PostgresFixture, event, session};
use crate::store::{
    Batch, EventStore, LeaseStore, SessionEnd, SessionStore, Store, StoreError, TurnLease,
};

const TTL: Duration = Duration::from_secs(60);

async fn one_connection(fixture: &PostgresFixture) -> Arc<PostgresStore> {
    Arc::new(PostgresStore::connect(fixture.options(), 1).await.unwrap())
}

/// Returns once `count` takes are queued.
async fn queued(store: &PostgresStore, count: usize) {
    while store.takes.len() < count {
        tokio::task::yield_now().await;
    }
}

fn spawn_take(
    store: &Arc<PostgresStore>,
    session: Uuid,
    holder: &str,
    ttl: Duration,
) -> JoinHandle<Result<TurnLease, StoreError>> {
    let (store, holder) = (store.clone(), holder.to_owned());
    tokio::spawn(async move {
        let name = format!("turn:{session}");
        store.take_turn(session, (&name, &holder), ttl).await
    })
}

/// Who holds the turn lease of `session` now (taking it for `probe` if
/// nobody does).
async fn holder(store: &PostgresStore, session: Uuid) -> String {
    let name = format!("turn:{session}");
    store
        .lease_acquire(&name, "probe", TTL)
        .await
        .unwrap()
        .holder
}

fn held(taken: TurnLease) -> SessionEnd {
    match taken {
        TurnLease::Held(end) => *end,
        other => panic!("expected the turn, got {other:?}"),
    }
}

/// Takes of four sessions queued behind the one connection are done in
/// one statement, each answered as alone: a free session's turn with its
/// row as its last batch left it, a session another holds busy, a
/// missing session none (and no lease taken for it). A second take of a
/// session waits for the next statement, after its first, and finds the
/// turn taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takes_waiting_for_a_connection_are_done_together_each_as_alone() {
    let fixture = PostgresFixture::new().await;
    let store = one_connection(&fixture).await;
    let (free, busy) = (session(None, Utc::now()), session(None, Utc::now()));
    for record in [&free, &busy] {
        store.create_session(record).await.unwrap();
    }
    let said = [Message::User {
        content: "hello".into(),
    }];
    let events = [event(free.id, 1), event(free.id, 2)];
    let batch = Batch {
        create: None,
        events: &events,
        messages: &said,
        state: None,
        release: None,
        usage: &[],
    };
    store.append_batch(free.id, batch).await.unwrap();
    let other = format!("turn:{}", busy.id);
    store.lease_acquire(&other, "other", TTL).await.unwrap();
    let missing = Uuid::new_v4();

    let conn = store.pool.get().await.unwrap();
    let first: Vec<_> = [free.id, busy.id, missing]
        .into_iter()
        .map(|id| spawn_take(&store, id, "me", TTL))
        .collect();
    queued(&store, 3).await;
    let again = spawn_take(&store, free.id, "you", TTL);
    queued(&store, 4).await;
    conn.done();
    let mut answers = Vec::new();
    for task in first {
        answers.push(task.await.unwrap().unwrap());
    }
    let again = again.await.unwrap().unwrap();

    assert_eq!(
        (
            store.takes.groups.load(SeqCst),
            store.takes.grouped.load(SeqCst)
        ),
        (1, 3)
    );
    let mut answers = answers.into_iter();
    let end = held(answers.next().unwrap());
    assert_eq!(
        end.record,
        store.get_session(free.id).await.unwrap().unwrap()
    );
    assert_eq!((end.last_seq, end.messages), (2, Some(1)));
    assert!(matches!(answers.next(), Some(TurnLease::Busy)));
    assert!(matches!(answers.next(), Some(TurnLease::NoSession)));
    assert!(matches!(again, TurnLease::Busy), "{again:?}");
    assert_eq!(holder(&store, free.id).await, "me");
    assert_eq!(holder(&store, busy.id).await, "other");
    assert_eq!(holder(&store, missing).await, "probe");
}

/// A group PostgreSQL refuses (here a take whose lease would end past
/// the last time it can store) is done again take by take: only the take
/// that fails alone fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_group_of_takes_fails_only_the_take_that_fails_alone() {
    let fixture = PostgresFixture::new().await;
    let store = one_connection(&fixture).await;
    let (good, bad) = (session(None, Utc::now()), session(None, Utc::now()));
    for record in [&good, &bad] {
        store.create_session(record).await.unwrap();
    }

    let conn = store.pool.get().await.unwrap();
    let good_take = spawn_take(&store, good.id, "me", TTL);
    queued(&store, 1).await;
    let bad_take = spawn_take(&store, bad.id, "me", Duration::MAX);
    queued(&store, 2).await;
    conn.done();
    let good_take = good_take.await.unwrap().unwrap();
    let bad_take = bad_take.await.unwrap();

    assert_eq!(store.takes.groups.load(SeqCst), 1, "they were grouped");
    assert_eq!(held(good_take).record.id, good.id);
    assert!(bad_take.is_err(), "{bad_take:?}");
    assert_eq!(holder(&store, good.id).await, "me");
    assert_eq!(holder(&store, bad.id).await, "probe");
}

/// A take whose caller went away while it waited is not done: the lease
/// stays free. The take queued with it is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_whose_caller_went_away_while_it_waited_is_not_done() {
    let fixture = PostgresFixture::new().await;
    let store = one_connection(&fixture).await;
    let (left, kept) = (session(None, Utc::now()), session(None, Utc::now()));
    for record in [&left, &kept] {
        store.create_session(record).await.unwrap();
    }

    let conn = store.pool.get().await.unwrap();
    let gone = spawn_take(&store, left.id, "me", TTL);
    queued(&store, 1).await;
    let stays = spawn_take(&store, kept.id, "me", TTL);
    queued(&store, 2).await;
    gone.abort();
    assert!(gone.await.unwrap_err().is_cancelled());
    conn.done();
    held(stays.await.unwrap().unwrap());

    assert_eq!(holder(&store, kept.id).await, "me");
    assert_eq!(holder(&store, left.id).await, "probe");
    assert_eq!(store.takes.len(), 0);
}

/// Takes that come at the same moment go in one statement even when a
/// lane and a connection are free: the first to get them lets the tasks
/// already woken run before it takes its group. One thread runs every
/// task here, so the second take is queued in time only if the first
/// lets it run.
#[tokio::test(flavor = "current_thread")]
async fn takes_that_come_together_go_together_on_a_quiet_store() {
    let fixture = PostgresFixture::new().await;
    let store = one_connection(&fixture).await;
    let (a, b) = (session(None, Utc::now()), session(None, Utc::now()));
    for record in [&a, &b] {
        store.create_session(record).await.unwrap();
    }

    let takes = [a.id, b.id].map(|id| spawn_take(&store, id, "me", TTL));
    for task in takes {
        held(task.await.unwrap().unwrap());
    }

    assert_eq!(
        (
            store.takes.groups.load(SeqCst),
            store.takes.grouped.load(SeqCst)
        ),
        (1, 2)
    );
    assert_eq!(holder(&store, a.id).await, "me");
    assert_eq!(holder(&store, b.id).await, "me");
}
