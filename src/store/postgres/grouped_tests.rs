//! Batches written together: what each writer gets back, and what lands.
//! A store of one connection, held by the test, makes the writers queue
//! until it is given back.

use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use chrono::Utc;
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::super::PostgresStore;
use crate::model::Message;
use crate::protocol::{Event, SessionStatus, Usage};
use crate::store::conformance::{PostgresFixture, event, session};
use crate::store::{
    Batch, EventStore, LeaseStore, Release, SessionState, SessionStore, Store, StoreError,
    TurnLease, UsageCounts, UsageRow, UsageStore,
};

async fn one_connection(fixture: &PostgresFixture) -> Arc<PostgresStore> {
    Arc::new(PostgresStore::connect(fixture.options(), 1).await.unwrap())
}

/// Returns once `count` batches are queued.
async fn queued(store: &PostgresStore, count: usize) {
    while store.batches.len() < count {
        tokio::task::yield_now().await;
    }
}

fn said(n: usize) -> Message {
    Message::User {
        content: format!("message {n}"),
    }
}

/// What one writer saves: all of it is owned, so that it can be written
/// from a task of its own.
#[derive(Clone, Default)]
struct Write {
    events: Vec<Event>,
    messages: Vec<Message>,
    state: Option<SessionState>,
    release: Option<Release>,
    usage: Vec<UsageRow>,
}

fn spawn_write(
    store: &Arc<PostgresStore>,
    session: Uuid,
    write: Write,
) -> JoinHandle<Result<(), StoreError>> {
    let store = store.clone();
    tokio::spawn(async move {
        let batch = Batch {
            create: None,
            events: &write.events,
            messages: &write.messages,
            state: write.state.as_ref(),
            release: write.release.as_ref(),
            usage: &write.usage,
        };
        store.append_batch(session, batch).await
    })
}

/// Batches of six sessions queued behind the one connection are written
/// in one statement, each whole: its events, its messages after those
/// stored, its state, its lease given up if its holder has it, and what it
/// spent added to the same key's row. A second batch of a session waits
/// for the next write, after its first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_waiting_for_a_connection_are_written_together_each_whole() {
    let fixture = PostgresFixture::new().await;
    let store = one_connection(&fixture).await;
    let ttl = Duration::from_secs(60);
    let day = Utc::now().date_naive();
    let mut sessions = Vec::new();
    for _ in 0..6 {
        let record = session(Some("key"), Utc::now());
        store.create_session(&record).await.unwrap();
        store
            .append_messages(record.id, &[said(0), said(1)])
            .await
            .unwrap();
        let lease = format!("turn:{}", record.id);
        store.lease_acquire(&lease, "me", ttl).await.unwrap();
        sessions.push(record.id);
    }
    let writes: Vec<Write> = sessions
        .iter()
        .enumerate()
        .map(|(i, &id)| Write {
            events: (1..=3).map(|seq| event(id, seq)).collect(),
            messages: vec![said(2), said(3)],
            state: Some(SessionState {
                status: SessionStatus::Running,
                usage: Usage {
                    turns: 1,
                    ..Usage::default()
                },
                updated_at: Utc::now(),
            }),
            // The last one names another holder: its lease stays.
            release: Some(Release {
                name: format!("turn:{id}"),
                holder: if i == 5 { "other" } else { "me" }.into(),
            }),
            usage: vec![UsageRow {
                owner: "key".into(),
                day,
                model: "demo".into(),
                counts: UsageCounts {
                    input_tokens: 10,
                    turns: 1,
                    ..UsageCounts::default()
                },
            }],
        })
        .collect();
    let later = Write {
        events: vec![event(sessions[0], 4)],
        messages: vec![said(4)],
        ..Write::default()
    };

    let held = store.pool.get().await.unwrap();
    let mut tasks: Vec<_> = sessions
        .iter()
        .zip(&writes)
        .map(|(&id, write)| spawn_write(&store, id, write.clone()))
        .collect();
    queued(&store, 6).await;
    tasks.push(spawn_write(&store, sessions[0], later.clone()));
    queued(&store, 7).await;
    held.done();
    for task in tasks {
        task.await.unwrap().unwrap();
    }

    assert_eq!(
        (
            store.batches.groups.load(SeqCst),
            store.batches.grouped.load(SeqCst)
        ),
        (1, 6),
        "one statement wrote the six sessions' first batches"
    );
    for (i, (&id, write)) in sessions.iter().zip(&writes).enumerate() {
        let mut events = write.events.clone();
        let mut messages: Vec<Message> = (0..4).map(said).collect();
        if i == 0 {
            events.extend(later.events.clone());
            messages.push(said(4));
        }
        assert_eq!(store.events_since(id, 0, 10).await.unwrap(), events);
        assert_eq!(store.messages(id).await.unwrap(), messages);
        let stored = store.get_session(id).await.unwrap().unwrap();
        let state = write.state.as_ref().unwrap();
        assert_eq!(
            (stored.status, &stored.usage, stored.updated_at),
            (state.status, &state.usage, state.updated_at)
        );
        let kept = store
            .lease_renew(&format!("turn:{id}"), "me", ttl)
            .await
            .unwrap();
        assert_eq!(kept.is_some(), i == 5, "session {i}'s lease");
    }
    let rows = store.usage_rows(day, day, Some("key")).await.unwrap();
    let spent: Vec<(&str, u64, u64)> = rows
        .iter()
        .map(|r| (r.model.as_str(), r.counts.input_tokens, r.counts.turns))
        .collect();
    assert_eq!(spent, [("demo", 60, 6)]);
}

/// A group that PostgreSQL refuses is written again batch by batch: the
/// batches that fail alone fail (a clash with a stored event, messages or
/// events of a session that does not exist), storing nothing, and the
/// rest land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_fails_a_group_fails_alone_and_the_rest_land() {
    let fixture = PostgresFixture::new().await;
    let store = one_connection(&fixture).await;
    let (good, clashing) = (session(None, Utc::now()), session(None, Utc::now()));
    for record in [&good, &clashing] {
        store.create_session(record).await.unwrap();
    }
    let stored = event(clashing.id, 1);
    store
        .append_events(std::slice::from_ref(&stored))
        .await
        .unwrap();
    let (gone, gone_too) = (Uuid::new_v4(), Uuid::new_v4());
    let good_write = Write {
        events: vec![event(good.id, 1), event(good.id, 2)],
        messages: vec![said(0)],
        ..Write::default()
    };
    let writes = [
        (good.id, good_write.clone()),
        (
            clashing.id,
            Write {
                events: vec![event(clashing.id, 2), event(clashing.id, 1)],
                messages: vec![said(0)],
                ..Write::default()
            },
        ),
        (
            gone,
            Write {
                messages: vec![said(0)],
                ..Write::default()
            },
        ),
        (
            gone_too,
            Write {
                events: vec![event(gone_too, 1)],
                ..Write::default()
            },
        ),
    ];

    let held = store.pool.get().await.unwrap();
    let tasks: Vec<_> = writes
        .iter()
        .map(|(id, write)| spawn_write(&store, *id, write.clone()))
        .collect();
    queued(&store, writes.len()).await;
    held.done();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }

    assert_eq!(store.batches.groups.load(SeqCst), 1, "they were grouped");
    assert!(answers[0].is_ok(), "{:?}", answers[0]);
    assert!(answers[1].is_err(), "the clash fails alone");
    let missing = answers[2].as_ref().unwrap_err().to_string();
    assert!(missing.contains(&gone.to_string()), "{missing}");
    assert!(answers[3].is_err(), "events of no session");
    assert_eq!(
        store.events_since(good.id, 0, 10).await.unwrap(),
        good_write.events
    );
    assert_eq!(store.messages(good.id).await.unwrap(), [said(0)]);
    assert_eq!(
        store.events_since(clashing.id, 0, 10).await.unwrap(),
        [stored]
    );
    assert_eq!(store.messages(clashing.id).await.unwrap(), []);
    assert_eq!(store.last_seq(gone_too).await.unwrap(), 0);
}

/// A writer that goes away while its batch waits leaves it unwritten; the
/// batches queued with it are written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_writer_went_away_while_it_waited_is_not_written() {
    let fixture = PostgresFixture::new().await;
    let store = one_connection(&fixture).await;
    let (left, kept) = (session(None, Utc::now()), session(None, Utc::now()));
    for record in [&left, &kept] {
        store.create_session(record).await.unwrap();
    }
    let write = |id| Write {
        events: vec![event(id, 1)],
        ..Write::default()
    };
    let kept_write = write(kept.id);

    let held = store.pool.get().await.unwrap();
    let gone = spawn_write(&store, left.id, write(left.id));
    queued(&store, 1).await;
    let stays = spawn_write(&store, kept.id, kept_write.clone());
    queued(&store, 2).await;
    gone.abort();
    assert!(gone.await.unwrap_err().is_cancelled());
    held.done();
    stays.await.unwrap().unwrap();

    assert_eq!(
        store.events_since(kept.id, 0, 10).await.unwrap(),
        kept_write.events
    );
    assert_eq!(store.last_seq(left.id).await.unwrap(), 0);
    assert!(store.batches.len() == 0);
}

/// Batches are written on at most a quarter of the store's connections:
/// while its one lane of four connections is busy, batches wait (to go
/// together) and the other connections still serve a read and a turn's
/// take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_leave_most_connections_to_turns_and_reads() {
    let fixture = PostgresFixture::new().await;
    let store = Arc::new(PostgresStore::connect(fixture.options(), 4).await.unwrap());
    let mut sessions = Vec::new();
    for _ in 0..3 {
        let record = session(None, Utc::now());
        store.create_session(&record).await.unwrap();
        sessions.push(record);
    }
    let writes: Vec<Write> = sessions
        .iter()
        .map(|record| Write {
            events: vec![event(record.id, 1)],
            ..Write::default()
        })
        .collect();

    let lane = store.batches.lane().await;
    let tasks: Vec<_> = sessions
        .iter()
        .zip(&writes)
        .map(|(record, write)| spawn_write(&store, record.id, write.clone()))
        .collect();
    queued(&store, 3).await;
    assert_eq!(
        store.get_session(sessions[0].id).await.unwrap().as_ref(),
        Some(&sessions[0])
    );
    let taken = store
        .take_turn(sessions[1].id, ("turn:1", "me"), Duration::from_secs(60))
        .await
        .unwrap();
    assert!(matches!(taken, TurnLease::Held(_)), "{taken:?}");
    assert_eq!(store.batches.len(), 3, "still waiting");
    drop(lane);
    for task in tasks {
        task.await.unwrap().unwrap();
    }

    assert_eq!(
        (
            store.batches.groups.load(SeqCst),
            store.batches.grouped.load(SeqCst)
        ),
        (1, 3)
    );
    for (record, write) in sessions.iter().zip(&writes) {
        assert_eq!(
            store.events_since(record.id, 0, 10).await.unwrap(),
            write.events
        );
    }
}

/// Whether another transaction holds a lock on `session`'s row: asks for
/// it without waiting, and gives it back at once.
async fn row_locked(conn: &mut sqlx::PgConnection, session: Uuid) -> bool {
    use sqlx::Connection;
    let mut tx = conn.begin().await.unwrap();
    let asked = sqlx::query("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE NOWAIT")
        .bind(session)
        .execute(&mut *tx)
        .await;
    tx.rollback().await.unwrap();
    match asked {
        Ok(_) => false,
        Err(sqlx::Error::Database(err)) if err.code().as_deref() == Some("55P03") => true,
        Err(err) => panic!("cannot ask for the row's lock: {err}"),
    }
}

/// A group of batches locks its sessions' rows in the order of their ids,
/// as a group of takes does, whatever order its batches came in: with the
/// lower row held by another transaction, the group waits for it before
/// it locks the higher one. Two groups sharing sessions then wait for
/// each other instead of deadlocking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_batches_locks_its_sessions_in_the_order_of_their_ids() {
    use sqlx::Connection;
    let fixture = PostgresFixture::new().await;
    let store = one_connection(&fixture).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let record = session(None, Utc::now());
        store.create_session(&record).await.unwrap();
        ids.push(record.id);
    }
    ids.sort();
    let (low, high) = (ids[0], ids[1]);
    let mut holder = sqlx::PgConnection::connect_with(&fixture.options())
        .await
        .unwrap();
    let mut prober = sqlx::PgConnection::connect_with(&fixture.options())
        .await
        .unwrap();
    let mut held = holder.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE")
        .bind(low)
        .execute(&mut *held)
        .await
        .unwrap();

    // The higher session's batch is queued first, so it leads the group.
    let conn = store.pool.get().await.unwrap();
    let write = |seq| Write {
        events: vec![],
        messages: vec![said(seq)],
        ..Write::default()
    };
    let first = spawn_write(&store, high, write(0));
    queued(&store, 1).await;
    let second = spawn_write(&store, low, write(1));
    queued(&store, 2).await;
    conn.done();
    // Until the group's statement waits for the lower row.
    let waiting = "SELECT count(*) FROM pg_stat_activity \
                   WHERE datname = current_database() AND wait_event_type = 'Lock'";
    let blocked = async {
        while sqlx::query_scalar::<_, i64>(waiting)
            .fetch_one(&mut prober)
            .await
            .unwrap()
            == 0
        {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), blocked)
        .await
        .expect("the group never waited for the lower session's row");

    assert!(
        !row_locked(&mut prober, high).await,
        "the group locked the higher session's row before the lower one's"
    );
    held.rollback().await.unwrap();
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    assert_eq!(
        (
            store.batches.groups.load(SeqCst),
            store.batches.grouped.load(SeqCst)
        ),
        (1, 2)
    );
}
