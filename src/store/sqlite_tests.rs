//! Tests of what only the SQLite store has: one writer thread with group
//! commit, savepoints, the WAL and its checkpointer. What every backend
//! does is tested in [`crate::store::conformance`].

use std::sync::Arc;

use chrono::Utc;
use rusqlite::params;
use uuid::Uuid;

use super::rows::SessionRow;
use super::*;
use crate::protocol::Event;
use crate::store::conformance::{conversation, event, session};
use crate::store::{EventStore, SessionFilter, SessionStore};

fn open(dir: &tempfile::TempDir) -> SqliteStore {
    SqliteStore::open(&dir.path().join("nested/dir/conclave.db")).unwrap()
}

#[tokio::test]
async fn a_failing_job_leaves_the_rest_of_its_batch_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open(&dir));
    let created = session(None, Utc::now());
    store.create_session(&created).await.unwrap();
    // Hold the writer so the next jobs queue up and run as one batch.
    let (started, running) = oneshot::channel();
    let (release, gate) = std::sync::mpsc::channel::<()>();
    let held = {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            store
                .call(move |_| {
                    let _ = started.send(());
                    Ok(gate.recv().is_ok())
                })
                .await
        })
    };
    running.await.unwrap();
    let good = [event(created.id, 1), event(created.id, 2)];
    // The foreign key makes an event of an unknown session fail.
    let orphan = event(Uuid::new_v4(), 1);
    let mut appends = Vec::new();
    for appended in [good[0].clone(), orphan, good[1].clone()] {
        let appender = Arc::clone(&store);
        appends.push(tokio::spawn(async move {
            appender
                .append_events(std::slice::from_ref(&appended))
                .await
        }));
        wait_for_queued(&store, appends.len()).await;
    }
    release.send(()).unwrap();

    assert!(held.await.unwrap().unwrap());
    let mut results = Vec::new();
    for append in appends {
        results.push(append.await.unwrap());
    }
    assert!(
        matches!(results[..], [Ok(()), Err(StoreError::Io(_)), Ok(())]),
        "{results:?}"
    );
    assert_eq!(store.events_since(created.id, 0, 10).await.unwrap(), good);
}

/// Waits until `count` jobs wait in the queue behind the one running.
async fn wait_for_queued(store: &SqliteStore, count: usize) {
    let queued = async {
        while store.jobs.max_capacity() - store.jobs.capacity() != count {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), queued)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_job_that_fails_halfway_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let first = SessionRow::encode(&session(None, Utc::now())).unwrap();

    let outcome = store
        .call(move |conn| {
            in_savepoint(conn, |conn| {
                let insert = concat!(
                    "INSERT INTO sessions (",
                    session_columns!(),
                    ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
                );
                let values = params![
                    first.id,
                    first.name,
                    first.kind,
                    first.owner,
                    first.options,
                    first.status,
                    first.usage,
                    first.ephemeral,
                    first.created_at,
                    first.updated_at,
                ];
                conn.execute(insert, values)?;
                conn.execute(insert, values)?;
                Ok(())
            })
        })
        .await;

    assert!(matches!(outcome, Err(StoreError::Io(_))), "{outcome:?}");
    assert_eq!(
        store
            .list_sessions(&SessionFilter::default())
            .await
            .unwrap(),
        vec![]
    );
}

#[tokio::test]
async fn undecodable_rows_read_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("conclave.db");
    let store = SqliteStore::open(&path).unwrap();
    let created = session(None, Utc::now());
    store.create_session(&created).await.unwrap();
    store
        .append_events(std::slice::from_ref(&event(created.id, 1)))
        .await
        .unwrap();
    store
        .append_messages(created.id, &conversation())
        .await
        .unwrap();
    let vandal = Connection::open(&path).unwrap();
    vandal
        .execute_batch(
            "UPDATE sessions SET usage = 'not json';
             UPDATE events SET body = '{\"type\": \"nonsense\"}';
             UPDATE messages SET body = '[]';",
        )
        .unwrap();

    let session = store.get_session(created.id).await;
    let events = store.events_since(created.id, 0, 10).await;
    let messages = store.messages(created.id).await;

    assert!(
        matches!(session, Err(StoreError::Corrupt(_))),
        "{session:?}"
    );
    assert!(matches!(events, Err(StoreError::Corrupt(_))), "{events:?}");
    assert!(
        matches!(messages, Err(StoreError::Corrupt(_))),
        "{messages:?}"
    );
}

/// How many times the WAL has started over: the checkpoint sequence number
/// in its header (bytes 12..16, big-endian).
fn wal_restarts(wal: &std::path::Path) -> u32 {
    let header = std::fs::read(wal).unwrap();
    u32::from_be_bytes(header[12..16].try_into().unwrap())
}

/// A passive checkpoint racing a steady stream of commits never copies the
/// last frames, and SQLite starts the log over only once it has them all:
/// without the writer finishing each pass, this WAL grows for as long as
/// the appenders run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_wal_starts_over_under_a_steady_stream_of_commits() {
    const APPENDERS: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("conclave.db");
    let store =
        Arc::new(SqliteStore::open_checkpointing(&path, Duration::from_millis(100)).unwrap());
    let wal = dir.path().join("conclave.db-wal");
    let stop = tokio_util::sync::CancellationToken::new();
    let mut appenders = Vec::new();
    for _ in 0..APPENDERS {
        let record = session(None, Utc::now());
        store.create_session(&record).await.unwrap();
        let (store, stop) = (Arc::clone(&store), stop.clone());
        appenders.push(tokio::spawn(async move {
            let mut seq = 0;
            while !stop.is_cancelled() {
                let batch: Vec<Event> = (seq + 1..=seq + 10).map(|n| event(record.id, n)).collect();
                store.append_events(&batch).await.unwrap();
                seq += 10;
            }
            (record.id, seq)
        }));
    }
    let before = wal_restarts(&wal);

    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while wal_restarts(&wal) < before + 3 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let restarts = wal_restarts(&wal) - before;
    stop.cancel();
    for appender in appenders {
        let (id, seq) = appender.await.unwrap();
        assert_eq!(store.last_seq(id).await.unwrap(), seq);
    }
    assert!(
        restarts >= 3,
        "the WAL started over {restarts} times in 20 s of commits"
    );
}

/// A batch writes its session's usage and `updated_at`: no index of the
/// table covers either, so the write updates no index; the retention
/// finds expired sessions through its own index.
#[tokio::test]
async fn no_index_covers_what_every_batch_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    drop(store);
    let connection = Connection::open(dir.path().join("nested/dir/conclave.db")).unwrap();
    let covering: Vec<String> = connection
        .prepare(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'sessions' \
             AND (sql LIKE '%updated_at%' OR sql LIKE '%usage%')",
        )
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(covering, Vec::<String>::new());
    let plan: Vec<String> = connection
        .prepare(&format!(
            "EXPLAIN QUERY PLAN {}",
            super::listing::EXPIRED_EPHEMERAL
        ))
        .unwrap()
        .query_map(params!["closed", "2026-01-01", 10], |row| row.get(3))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert!(
        plan.iter()
            .any(|step| step.contains("USING INDEX sessions_ephemeral")),
        "{plan:?}"
    );
}
