//! The machinery with a task of the test's own: what every kind gets
//! without writing it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::protocol::{EventKind, ResultStatus, SessionKind, SessionStatus, Usage};
use crate::store::{SqliteStore, Store, StoreError};
use crate::telemetry::Metrics;

/// Echoes its input as `thinking`; `wait` makes it wait for its cancel.
pub(super) struct Echo;

#[async_trait]
impl SessionTask for Echo {
    fn kind(&self) -> SessionKind {
        SessionKind::named("echo")
    }

    async fn options(
        &self,
        body: &Map<String, Value>,
        fields: &[&str],
    ) -> Result<Value, SessionError> {
        let options: Map<String, Value> = options::from_body(body, fields)?;
        Ok(Value::Object(options))
    }

    async fn run(&self, turn: &mut Turn, input: String) -> Result<Outcome, StoreError> {
        if input == "wait" {
            turn.cancel.cancelled().await;
            return Ok(Outcome::new(ResultStatus::Interrupted, None));
        }
        turn.session.emit(EventKind::Thinking {
            content: input.clone(),
            reasoning: false,
        })?;
        turn.usage.turns += 1;
        Ok(Outcome::new(ResultStatus::Success, Some(input)))
    }
}

fn manager(dir: &tempfile::TempDir, turn_timeout: Duration) -> SessionManager {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("c.db")).unwrap());
    SessionManager::new(
        store,
        Tasks::new().with(Arc::new(Echo)),
        Limits {
            turn_timeout,
            ephemeral_retention: Duration::ZERO,
        },
        Arc::new(Metrics::new()),
        CancellationToken::new(),
    )
}

async fn new_session(manager: &SessionManager) -> Arc<Session> {
    manager
        .create(NewSession {
            name: Some("kept".into()),
            kind: SessionKind::named("echo"),
            owner: None,
            options: json!({}),
            ephemeral: false,
            origin: None,
            metadata: Default::default(),
        })
        .await
        .unwrap()
}

#[tokio::test]
async fn a_kind_the_server_does_not_run_is_refused_naming_kind() {
    let dir = tempfile::tempdir().unwrap();
    let manager = manager(&dir, Duration::from_secs(60));
    let refused = manager
        .create(NewSession {
            name: None,
            kind: SessionKind::AGENT,
            owner: None,
            options: json!({}),
            ephemeral: false,
            origin: None,
            metadata: Default::default(),
        })
        .await;
    match refused {
        Err(SessionError::Option(e)) => {
            assert_eq!(e.field, "kind");
            assert!(e.message.contains("this server runs echo"), "{e}");
        }
        other => panic!("{:?}", other.map(|s| s.id)),
    }
}

#[tokio::test]
async fn the_machinery_closes_each_turn_with_one_result_and_sums_usage() {
    let dir = tempfile::tempdir().unwrap();
    let manager = manager(&dir, Duration::from_secs(60));
    let session = new_session(&manager).await;
    for n in 1..=2u64 {
        let turn = manager
            .start_turn(session.clone(), format!("hello {n}"), true)
            .await
            .unwrap();
        let events: Vec<_> = turn.session.subscribe(turn.since, true).collect().await;
        let types: Vec<_> = events.iter().map(|e| e.kind.type_name()).collect();
        assert_eq!(types, ["thinking", "result"]);
        assert!(matches!(
            &events[1].kind,
            EventKind::Result { status: ResultStatus::Success, result: Some(text), turns: 1, .. }
                if *text == format!("hello {n}")
        ));
        // The status is settled once the stream ends with the result.
        while session.is_running() {
            tokio::task::yield_now().await;
        }
        let _turn = session.turn_lock.lock().await;
        assert_eq!(session.usage().turns, n);
        assert_eq!(session.status(), SessionStatus::Idle);
    }
}

#[tokio::test]
async fn a_turn_past_its_time_limit_ends_timed_out() {
    let dir = tempfile::tempdir().unwrap();
    let manager = manager(&dir, Duration::from_millis(50));
    let session = new_session(&manager).await;
    let turn = manager
        .start_turn(session, "wait".into(), false)
        .await
        .unwrap();
    let events: Vec<_> = turn.session.subscribe(turn.since, true).collect().await;
    let last = events.last().unwrap();
    assert!(
        matches!(
            last.kind,
            EventKind::Result {
                status: ResultStatus::TimedOut,
                ..
            }
        ),
        "{last:?}"
    );
}

#[tokio::test]
async fn an_interrupt_ends_the_turn_interrupted_and_a_busy_session_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let manager = manager(&dir, Duration::from_secs(60));
    let session = new_session(&manager).await;
    let turn = manager
        .start_turn(session.clone(), "wait".into(), false)
        .await
        .unwrap();
    assert!(matches!(
        manager
            .start_turn(session.clone(), "again".into(), false)
            .await,
        Err(SessionError::Busy(_))
    ));
    assert!(session.interrupt());
    let events: Vec<_> = turn.session.subscribe(turn.since, true).collect().await;
    assert!(matches!(
        events.last().unwrap().kind,
        EventKind::Result {
            status: ResultStatus::Interrupted,
            ..
        }
    ));
}

/// A session as a crash leaves it: `running`, its last event `last`.
async fn left_running(session: &Arc<Session>, last: EventKind) {
    session
        .set_state(SessionStatus::Running, None)
        .await
        .unwrap();
    session.emit(last).unwrap();
    session.flush().await.unwrap();
}

#[tokio::test]
async fn a_cut_off_turn_whose_result_was_stored_only_gets_its_status() {
    let dir = tempfile::tempdir().unwrap();
    let manager = manager(&dir, Duration::from_secs(60));
    let session = new_session(&manager).await;
    left_running(
        &session,
        EventKind::Result {
            status: ResultStatus::Success,
            result: Some("done".into()),
            cost_usd: 0.0,
            cost_known: true,
            turns: 1,
            usage: Usage::default(),
            duration_ms: 1,
            history_len: None,
            files_changed: None,
            context: None,
        },
    )
    .await;
    assert_eq!(manager.recover().await.unwrap(), 1);
    assert_eq!(
        (session.status(), session.last_seq()),
        (SessionStatus::Idle, 1)
    );
    assert_eq!(manager.recover().await.unwrap(), 0);
}

#[tokio::test]
async fn a_cut_off_turn_without_a_result_is_closed_interrupted() {
    let dir = tempfile::tempdir().unwrap();
    let manager = manager(&dir, Duration::from_secs(60));
    let session = new_session(&manager).await;
    left_running(
        &session,
        EventKind::Thinking {
            content: "half way".into(),
            reasoning: false,
        },
    )
    .await;
    assert_eq!(manager.recover().await.unwrap(), 1);
    let events: Vec<_> = session.replay(0).collect().await;
    let types: Vec<_> = events.iter().map(|e| e.kind.type_name()).collect();
    assert_eq!(types, ["thinking", "status", "result"]);
    assert_eq!(session.status(), SessionStatus::Interrupted);
}

#[tokio::test]
async fn unused_sessions_are_evicted_and_load_again_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let manager = manager(&dir, Duration::from_secs(60));
    let session = new_session(&manager).await;
    let id = session.id;
    let turn = manager
        .start_turn(session, "hi".into(), false)
        .await
        .unwrap();
    let events: Vec<_> = turn.session.subscribe(turn.since, true).collect().await;
    assert_eq!(events.len(), 2);
    assert_eq!(manager.evict_unused(), 0, "the turn still holds it");
    drop(turn);
    // The turn task lets go of its reference once it has finished.
    while manager.evict_unused() == 0 {
        tokio::task::yield_now().await;
    }
    let again = manager.get(id, None).await.unwrap();
    assert_eq!(
        (
            again.name.as_deref(),
            again.status(),
            again.last_seq(),
            again.usage().turns
        ),
        (Some("kept"), SessionStatus::Idle, 2, 1)
    );
}
