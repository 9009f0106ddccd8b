//! Rewinds with a task that keeps a history, as an agent does: a turn
//! started with `rewind_to` first takes the session back to the turn end
//! before that seq.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::model::Message;
use crate::protocol::{Event, EventKind, ResultStatus, SessionKind};
use crate::store::{SqliteStore, Store, StoreError};
use crate::telemetry::Metrics;

/// Stores the prompt and an answer; `wait…` stores only the prompt and
/// waits for its cancel. Its workspace goes back at every rewind, to the
/// turn ends it notes.
struct Chat {
    store: Arc<dyn Store>,
    files_at: std::sync::Mutex<Vec<u64>>,
}

#[async_trait]
impl SessionTask for Chat {
    fn kind(&self) -> SessionKind {
        SessionKind::named("chat")
    }

    async fn options(
        &self,
        body: &Map<String, Value>,
        fields: &[&str],
    ) -> Result<Value, SessionError> {
        super::tests::Echo.options(body, fields).await
    }

    async fn run(&self, turn: &mut Turn, input: String) -> Result<Outcome, StoreError> {
        let mut history = turn.session.take_history().await?;
        let mut said = vec![Message::User {
            content: input.clone(),
        }];
        let waits = input.starts_with("wait");
        if !waits {
            said.push(Message::Assistant {
                content: format!("re: {input}"),
                tool_calls: Vec::new(),
            });
        }
        self.store.append_messages(turn.session.id, &said).await?;
        Arc::make_mut(&mut history).extend(said);
        turn.history_len = Some(history.len() as u64);
        turn.session.keep_history(history);
        if waits {
            turn.cancel.cancelled().await;
            return Ok(Outcome::new(ResultStatus::Interrupted, None));
        }
        Ok(Outcome::new(ResultStatus::Success, Some(input)))
    }

    async fn rewind_workspace(&self, _session: &Arc<Session>, seq: u64) -> bool {
        self.files_at.lock().unwrap().push(seq);
        true
    }
}

fn texts(messages: &[Message]) -> Vec<String> {
    messages
        .iter()
        .map(|m| match m {
            Message::User { content } | Message::Assistant { content, .. } => content.clone(),
            Message::Tool { content, .. } => content.clone(),
            Message::Compacted { summary, .. } => summary.clone(),
            Message::Reasoning { text, .. } => text.clone(),
        })
        .collect()
}

/// Runs a turn to its result; answers its events.
async fn turn(
    manager: &SessionManager,
    session: &Arc<Session>,
    input: &str,
    rewind_to: Option<u64>,
) -> Vec<Arc<Event>> {
    let options = TurnOptions {
        rewind_to,
        ..TurnOptions::default()
    };
    let turn = manager
        .start_turn_with(session.clone(), input.into(), true, options)
        .await
        .unwrap();
    turn.session.subscribe(turn.since, true).collect().await
}

#[tokio::test]
async fn a_rewind_cuts_the_history_back_to_the_turn_end_before_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("c.db")).unwrap());
    let chat = Arc::new(Chat {
        store: store.clone(),
        files_at: Default::default(),
    });
    let manager = SessionManager::new(
        store.clone(),
        Tasks::new().with(chat.clone()),
        Limits {
            turn_timeout: Duration::from_secs(60),
            ephemeral_retention: Duration::ZERO,
        },
        Arc::new(Metrics::new()),
        CancellationToken::new(),
    );
    let session = manager
        .create(NewSession {
            name: None,
            kind: SessionKind::named("chat"),
            owner: None,
            options: json!({}),
            ephemeral: false,
            origin: None,
            metadata: Default::default(),
        })
        .await
        .unwrap();

    let first = turn(&manager, &session, "one", None).await;
    let first_end = first.last().unwrap().seq;
    let waiting = manager
        .start_turn(session.clone(), "wait two".into(), false)
        .await
        .unwrap();
    // The rollback's point: the log as it was while the turn ran.
    let before = session.last_seq();
    assert!(session.interrupt());
    let third = turn(&manager, &session, "three", Some(before)).await;
    assert!(matches!(
        third.last().unwrap().kind,
        EventKind::Result {
            status: ResultStatus::Success,
            history_len: Some(4),
            ..
        }
    ));

    let stored = store.messages(session.id).await.unwrap();
    assert_eq!(texts(&stored), ["one", "re: one", "three", "re: three"]);
    let log: Vec<Arc<Event>> = session.replay(0).collect().await;
    let rewound: Vec<&Arc<Event>> = log
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Rewound { .. }))
        .collect();
    assert_eq!(rewound.len(), 1, "{log:?}");
    assert!(matches!(
        &rewound[0].kind,
        EventKind::Rewound { to_seq, history_len: 2, workspace } if *to_seq == first_end && workspace == "restored"
    ));
    // After the interrupted turn's result, before the new turn's events.
    let stopped: Vec<Arc<Event>> = session.subscribe(waiting.since, true).collect().await;
    let stopped = stopped.last().unwrap();
    assert!(matches!(
        stopped.kind,
        EventKind::Result {
            status: ResultStatus::Interrupted,
            ..
        }
    ));
    assert!(rewound[0].seq > stopped.seq && rewound[0].seq < third[0].seq);

    // With nothing after the turn end, a rewind does nothing.
    let fourth = turn(&manager, &session, "four", Some(session.last_seq())).await;
    let log: Vec<Arc<Event>> = session.replay(0).collect().await;
    assert_eq!(
        log.iter()
            .filter(|e| matches!(e.kind, EventKind::Rewound { .. }))
            .count(),
        1
    );
    assert!(matches!(
        fourth.last().unwrap().kind,
        EventKind::Result {
            history_len: Some(6),
            ..
        }
    ));

    // A rewind back to an earlier rewind (its turn was stopped too) takes
    // the files of the turn end that one went back to.
    let fourth_end = fourth.last().unwrap().seq;
    manager
        .start_turn(session.clone(), "wait five".into(), false)
        .await
        .unwrap();
    let during_five = session.last_seq();
    assert!(session.interrupt());
    let options = TurnOptions {
        rewind_to: Some(during_five),
        ..TurnOptions::default()
    };
    manager
        .start_turn_with(session.clone(), "wait six".into(), true, options)
        .await
        .unwrap();
    let during_six = session.last_seq();
    assert!(session.interrupt());
    turn(&manager, &session, "seven", Some(during_six)).await;
    let log: Vec<Arc<Event>> = session.replay(0).collect().await;
    let rewound: Vec<(u64, u64)> = log
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::Rewound { to_seq, .. } => Some((e.seq, to_seq)),
            _ => None,
        })
        .collect();
    assert_eq!(rewound.len(), 3, "{log:?}");
    assert_eq!(rewound[1].1, fourth_end);
    assert_eq!(rewound[2].1, rewound[1].0, "back to the second rewind");
    assert_eq!(
        *chat.files_at.lock().unwrap(),
        [first_end, fourth_end, fourth_end]
    );
}
