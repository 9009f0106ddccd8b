//! Tests of the SQLite store.

use std::sync::Arc;

use chrono::{DateTime, TimeDelta, Utc};
use rusqlite::params;
use serde_json::json;

use uuid::Uuid;

use super::rows::SessionRow;
use super::*;
use crate::model::{Message, ToolCall};
use crate::protocol::{Event, EventKind, ResultStatus, SessionRecord, SessionStatus, Usage};
use crate::store::{EventStore, SessionFilter, SessionKind, SessionStore};

fn open(dir: &tempfile::TempDir) -> SqliteStore {
    SqliteStore::open(&dir.path().join("nested/dir/conclave.db")).unwrap()
}

fn session(owner: Option<&str>, created_at: DateTime<Utc>) -> SessionRecord {
    SessionRecord {
        id: Uuid::new_v4(),
        name: Some("review".into()),
        kind: SessionKind::AGENT,
        owner: owner.map(str::to_owned),
        options: json!({"model": "demo", "max_turns": 4, "tools": ["bash"]}),
        status: SessionStatus::Idle,
        usage: Usage::default(),
        ephemeral: false,
        created_at,
        updated_at: created_at,
    }
}

fn event(session_id: Uuid, seq: u64) -> Event {
    let kind = match seq % 3 {
        0 => EventKind::TextDelta {
            content: format!("token {seq} "),
        },
        1 => EventKind::ToolResult {
            id: format!("call_{seq}"),
            tool: "bash".into(),
            output: json!({"stdout": "x".repeat(300), "exit_code": 0}),
            is_error: false,
        },
        _ => EventKind::Result {
            status: ResultStatus::Success,
            result: Some("done".into()),
            cost_usd: 0.25,
            cost_known: true,
            turns: 2,
            usage: Usage {
                input_tokens: 120,
                output_tokens: 40,
                cost_usd: 0.25,
                turns: 2,
                tool_calls: 1,
            },
            duration_ms: 1500,
        },
    };
    Event {
        kind,
        session_id,
        seq,
        ts: Utc::now(),
        agent_id: None,
    }
}

fn conversation() -> Vec<Message> {
    vec![
        Message::User {
            content: "list the files".into(),
        },
        Message::Assistant {
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: "call_1".into(),
                name: "bash".into(),
                arguments: json!({"command": "ls"}),
            }],
        },
        Message::Tool {
            tool_call_id: "call_1".into(),
            name: "bash".into(),
            content: "README.md\nsrc\n".into(),
            is_error: false,
        },
    ]
}

#[tokio::test]
async fn created_session_reads_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let created = session(Some("key-hash"), Utc::now());

    store.create_session(&created).await.unwrap();

    assert_eq!(store.get_session(created.id).await.unwrap(), Some(created));
    assert_eq!(store.get_session(Uuid::new_v4()).await.unwrap(), None);
}

#[tokio::test]
async fn creating_a_session_twice_fails() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let created = session(None, Utc::now());
    store.create_session(&created).await.unwrap();

    let again = store.create_session(&created).await;

    assert!(matches!(again, Err(StoreError::Io(_))), "{again:?}");
}

#[tokio::test]
async fn update_saves_status_usage_and_updated_at() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let created = session(None, Utc::now() - TimeDelta::minutes(5));
    store.create_session(&created).await.unwrap();
    let usage = Usage {
        input_tokens: 1000,
        output_tokens: 250,
        cost_usd: 0.5,
        turns: 3,
        tool_calls: 2,
    };
    let before = Utc::now();

    store
        .update_session(created.id, SessionStatus::Running, &usage)
        .await
        .unwrap();

    let updated = store.get_session(created.id).await.unwrap().unwrap();
    assert!(updated.updated_at >= before);
    assert_eq!(
        updated,
        SessionRecord {
            status: SessionStatus::Running,
            usage,
            updated_at: updated.updated_at,
            ..created
        }
    );
}

#[tokio::test]
async fn updating_an_unknown_session_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);

    store
        .update_session(Uuid::new_v4(), SessionStatus::Closed, &Usage::default())
        .await
        .unwrap();

    assert_eq!(
        store
            .list_sessions(&SessionFilter::default())
            .await
            .unwrap(),
        vec![]
    );
}

#[tokio::test]
async fn list_sessions_filters_by_owner_newest_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let now = Utc::now();
    let oldest = session(Some("alice"), now - TimeDelta::hours(2));
    let middle = session(Some("bob"), now - TimeDelta::hours(1));
    let newest = session(Some("alice"), now);
    let anonymous = session(None, now - TimeDelta::hours(3));
    for record in [&middle, &newest, &anonymous, &oldest] {
        store.create_session(record).await.unwrap();
    }

    assert_eq!(
        store
            .list_sessions(&SessionFilter::owner(Some("alice")))
            .await
            .unwrap(),
        vec![newest.clone(), oldest.clone()]
    );
    assert_eq!(
        store
            .list_sessions(&SessionFilter::owner(Some("bob")))
            .await
            .unwrap(),
        vec![middle.clone()]
    );
    assert_eq!(
        store
            .list_sessions(&SessionFilter::owner(Some("carol")))
            .await
            .unwrap(),
        vec![]
    );
    assert_eq!(
        store
            .list_sessions(&SessionFilter::default())
            .await
            .unwrap(),
        vec![
            newest.clone(),
            middle.clone(),
            oldest.clone(),
            anonymous.clone()
        ]
    );
    // Pages: two at a time, each after the last of the one before.
    let page = |before: Option<Uuid>| SessionFilter {
        before,
        limit: Some(2),
        ..SessionFilter::default()
    };
    assert_eq!(
        store.list_sessions(&page(None)).await.unwrap(),
        vec![newest.clone(), middle.clone()]
    );
    assert_eq!(
        store.list_sessions(&page(Some(middle.id))).await.unwrap(),
        vec![oldest.clone(), anonymous.clone()]
    );
    assert_eq!(
        store
            .list_sessions(&page(Some(anonymous.id)))
            .await
            .unwrap(),
        vec![]
    );
    // Filters combine.
    store
        .update_session(oldest.id, SessionStatus::Closed, &Usage::default())
        .await
        .unwrap();
    let closed = store
        .list_sessions(&SessionFilter {
            owner: Some("alice".into()),
            status: Some(SessionStatus::Closed),
            kind: Some(SessionKind::AGENT),
            ..SessionFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        closed.iter().map(|s| s.id).collect::<Vec<_>>(),
        vec![oldest.id]
    );
    let pipelines = store
        .list_sessions(&SessionFilter {
            kind: Some(SessionKind::named("pipeline")),
            ..SessionFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(pipelines, vec![]);
}

#[tokio::test]
async fn expired_ephemeral_sessions_are_found_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let now = Utc::now();
    let mut ids = Vec::new();
    for (ephemeral, status) in [
        (true, SessionStatus::Closed),
        (true, SessionStatus::Running),
        (false, SessionStatus::Closed),
        (true, SessionStatus::Closed),
    ] {
        let mut record = session(None, now);
        record.ephemeral = ephemeral;
        store.create_session(&record).await.unwrap();
        store
            .update_session(record.id, status, &Usage::default())
            .await
            .unwrap();
        ids.push(record.id);
    }
    let later = Utc::now() + TimeDelta::seconds(1);
    assert_eq!(
        store.expired_ephemeral(later, 10).await.unwrap(),
        vec![ids[0], ids[3]]
    );
    assert_eq!(
        store.expired_ephemeral(later, 1).await.unwrap(),
        vec![ids[0]]
    );
    assert_eq!(
        store.expired_ephemeral(now, 10).await.unwrap(),
        Vec::<Uuid>::new()
    );
}

#[tokio::test]
async fn sessions_with_status_finds_only_that_status() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let now = Utc::now();
    let idle = session(None, now - TimeDelta::seconds(2));
    let running = session(None, now - TimeDelta::seconds(1));
    let also_running = session(None, now);
    for record in [&idle, &running, &also_running] {
        store.create_session(record).await.unwrap();
    }
    for record in [&running, &also_running] {
        store
            .update_session(record.id, SessionStatus::Running, &record.usage)
            .await
            .unwrap();
    }

    let found = store
        .sessions_with_status(SessionStatus::Running)
        .await
        .unwrap();

    let ids: Vec<Uuid> = found.iter().map(|record| record.id).collect();
    assert_eq!(ids, vec![also_running.id, running.id]);
    assert!(
        found
            .iter()
            .all(|record| record.status == SessionStatus::Running)
    );
    assert_eq!(
        store
            .sessions_with_status(SessionStatus::Idle)
            .await
            .unwrap(),
        vec![idle]
    );
    assert_eq!(
        store
            .sessions_with_status(SessionStatus::Interrupted)
            .await
            .unwrap(),
        vec![]
    );
}

#[tokio::test]
async fn append_messages_continues_after_the_highest_index() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let created = session(None, Utc::now());
    store.create_session(&created).await.unwrap();
    let conversation = conversation();
    let follow_up = Message::User {
        content: "and the tests?".into(),
    };

    store
        .append_messages(created.id, &conversation)
        .await
        .unwrap();
    store
        .append_messages(created.id, std::slice::from_ref(&follow_up))
        .await
        .unwrap();
    store.append_messages(created.id, &[]).await.unwrap();

    let mut expected = conversation;
    expected.push(follow_up);
    assert_eq!(store.messages(created.id).await.unwrap(), expected);
    assert_eq!(store.messages(Uuid::new_v4()).await.unwrap(), vec![]);
}

#[tokio::test]
async fn messages_of_an_unknown_session_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);

    let appended = store.append_messages(Uuid::new_v4(), &conversation()).await;

    assert!(matches!(appended, Err(StoreError::Io(_))), "{appended:?}");
}

#[tokio::test]
async fn events_since_pages_in_order_and_last_seq_tracks_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let created = session(None, Utc::now());
    store.create_session(&created).await.unwrap();
    assert_eq!(store.last_seq(created.id).await.unwrap(), 0);
    let events: Vec<Event> = (1..=10).map(|seq| event(created.id, seq)).collect();
    // Appended out of order: reads still come back by seq.
    for appended in events.iter().rev() {
        store
            .append_events(std::slice::from_ref(appended))
            .await
            .unwrap();
    }

    assert_eq!(
        store.events_since(created.id, 0, 100).await.unwrap(),
        events
    );
    assert_eq!(
        store.events_since(created.id, 3, 4).await.unwrap(),
        events[3..7]
    );
    assert_eq!(
        store.events_since(created.id, 10, 100).await.unwrap(),
        vec![]
    );
    assert_eq!(
        store
            .events_since(created.id, u64::MAX, usize::MAX)
            .await
            .unwrap(),
        vec![]
    );
    assert_eq!(store.events_since(created.id, 0, 0).await.unwrap(), vec![]);
    assert_eq!(store.last_seq(created.id).await.unwrap(), 10);
    assert_eq!(store.last_seq(Uuid::new_v4()).await.unwrap(), 0);
}

#[tokio::test]
async fn delete_session_cascades_to_messages_and_events() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let doomed = session(None, Utc::now());
    let kept = session(None, Utc::now());
    for record in [&doomed, &kept] {
        store.create_session(record).await.unwrap();
        store
            .append_messages(record.id, &conversation())
            .await
            .unwrap();
        store
            .append_events(std::slice::from_ref(&event(record.id, 1)))
            .await
            .unwrap();
    }

    assert!(store.delete_session(doomed.id).await.unwrap());
    assert!(!store.delete_session(doomed.id).await.unwrap());

    assert_eq!(store.get_session(doomed.id).await.unwrap(), None);
    assert_eq!(store.messages(doomed.id).await.unwrap(), vec![]);
    assert_eq!(store.events_since(doomed.id, 0, 100).await.unwrap(), vec![]);
    assert_eq!(store.last_seq(doomed.id).await.unwrap(), 0);
    assert_eq!(
        store
            .list_sessions(&SessionFilter::default())
            .await
            .unwrap(),
        vec![kept.clone()]
    );
    assert_eq!(store.messages(kept.id).await.unwrap(), conversation());
    // A new session with the old id starts from nothing.
    store.create_session(&doomed).await.unwrap();
    assert_eq!(
        store
            .append_events(std::slice::from_ref(&event(doomed.id, 1)))
            .await
            .unwrap(),
        ()
    );
}

#[tokio::test]
async fn everything_survives_close_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let created = session(Some("key-hash"), Utc::now());
    let events: Vec<Event> = (1..=5).map(|seq| event(created.id, seq)).collect();
    let store = open(&dir);
    store.create_session(&created).await.unwrap();
    store
        .append_messages(created.id, &conversation())
        .await
        .unwrap();
    for appended in &events {
        store
            .append_events(std::slice::from_ref(appended))
            .await
            .unwrap();
    }
    store.close().await.unwrap();
    drop(store);

    let store = open(&dir);

    assert_eq!(
        store.get_session(created.id).await.unwrap(),
        Some(created.clone())
    );
    assert_eq!(store.messages(created.id).await.unwrap(), conversation());
    assert_eq!(
        store.events_since(created.id, 0, 100).await.unwrap(),
        events
    );
    assert_eq!(store.last_seq(created.id).await.unwrap(), 5);
}

#[tokio::test]
async fn dropping_the_store_keeps_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let created = session(None, Utc::now());
    let store = open(&dir);
    store.create_session(&created).await.unwrap();
    store
        .append_events(std::slice::from_ref(&event(created.id, 1)))
        .await
        .unwrap();

    drop(store);

    let store = open(&dir);
    assert_eq!(store.last_seq(created.id).await.unwrap(), 1);
    assert_eq!(store.get_session(created.id).await.unwrap(), Some(created));
}

#[tokio::test]
async fn calls_after_close_fail_with_closed() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let created = session(None, Utc::now());
    store.create_session(&created).await.unwrap();

    store.close().await.unwrap();

    let results = [
        store.create_session(&session(None, Utc::now())).await,
        store
            .update_session(created.id, SessionStatus::Closed, &Usage::default())
            .await,
        store.get_session(created.id).await.map(drop),
        store
            .list_sessions(&SessionFilter::default())
            .await
            .map(drop),
        store
            .sessions_with_status(SessionStatus::Idle)
            .await
            .map(drop),
        store.delete_session(created.id).await.map(drop),
        store.append_messages(created.id, &conversation()).await,
        store.messages(created.id).await.map(drop),
        store
            .append_events(std::slice::from_ref(&event(created.id, 1)))
            .await,
        store.events_since(created.id, 0, 10).await.map(drop),
        store.last_seq(created.id).await.map(drop),
        store.close().await,
    ];
    for result in results {
        assert!(matches!(result, Err(StoreError::Closed)), "{result:?}");
    }
}

#[tokio::test]
async fn close_runs_the_jobs_queued_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open(&dir));
    let created = session(None, Utc::now());
    store.create_session(&created).await.unwrap();
    let events: Vec<Event> = (1..=50).map(|seq| event(created.id, seq)).collect();
    let appends: Vec<_> = events
        .iter()
        .cloned()
        .map(|appended| {
            let store = Arc::clone(&store);
            tokio::spawn(async move { store.append_events(std::slice::from_ref(&appended)).await })
        })
        .collect();
    let closing = {
        let store = Arc::clone(&store);
        tokio::spawn(async move { store.close().await })
    };

    let mut landed = 0;
    for append in appends {
        match append.await.unwrap() {
            Ok(()) => landed += 1,
            Err(StoreError::Closed) => {}
            Err(err) => panic!("append failed: {err}"),
        }
    }
    closing.await.unwrap().unwrap();
    drop(store);

    let store = open(&dir);
    assert_eq!(
        store.events_since(created.id, 0, 100).await.unwrap().len(),
        landed
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_all_land_without_gaps() {
    const SESSIONS: usize = 64;
    const EVENTS: u64 = 100;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open(&dir));
    let sessions: Vec<SessionRecord> = (0..SESSIONS).map(|_| session(None, Utc::now())).collect();
    for record in &sessions {
        store.create_session(record).await.unwrap();
    }

    let appenders: Vec<_> = sessions
        .iter()
        .map(|record| {
            let store = Arc::clone(&store);
            let events: Vec<Event> = (1..=EVENTS).map(|seq| event(record.id, seq)).collect();
            tokio::spawn(async move {
                for appended in &events {
                    store.append_events(std::slice::from_ref(appended)).await?;
                }
                Ok::<_, StoreError>(events)
            })
        })
        .collect();
    let mut expected = Vec::new();
    for appender in appenders {
        expected.push(appender.await.unwrap().unwrap());
    }

    for (record, events) in sessions.iter().zip(expected) {
        assert_eq!(store.last_seq(record.id).await.unwrap(), EVENTS);
        assert_eq!(
            store.events_since(record.id, 0, usize::MAX).await.unwrap(),
            events
        );
    }
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

/// The session and events that `append_then_wait_to_be_killed` writes.
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

#[tokio::test]
async fn appending_several_events_is_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let created = session(None, Utc::now());
    store.create_session(&created).await.unwrap();
    let batch = vec![event(created.id, 1), event(created.id, 2)];
    store.append_events(&batch).await.unwrap();
    // The second row repeats seq 2: the whole batch is refused.
    let clashing = vec![event(created.id, 3), event(created.id, 2)];
    assert!(store.append_events(&clashing).await.is_err());
    assert_eq!(store.events_since(created.id, 0, 10).await.unwrap(), batch);
    assert_eq!(store.last_seq(created.id).await.unwrap(), 2);
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
