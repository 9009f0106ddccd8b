//! Sessions and their messages.

use std::sync::Arc;

use chrono::{TimeDelta, Utc};
use serde_json::json;
use uuid::Uuid;

use super::{Fixture, conversation, event, session};
use crate::model::Message;
use crate::protocol::{SessionRecord, SessionStatus, Usage};
use crate::store::{SessionFilter, SessionKind, Store, StoreError};

pub(crate) async fn created_session_reads_back_whole(fixture: &dyn Fixture) {
    let store = fixture.open().await;
    let created = session(Some("key-hash"), Utc::now());

    store.create_session(&created).await.unwrap();

    assert_eq!(store.get_session(created.id).await.unwrap(), Some(created));
    assert_eq!(store.get_session(Uuid::new_v4()).await.unwrap(), None);
}

pub(crate) async fn origin_and_metadata_read_back_filter_and_merge(fixture: &dyn Fixture) {
    let store = fixture.open().await;
    let now = Utc::now();
    let labels = |value: serde_json::Value| value.as_object().unwrap().clone();
    let own = session(Some("k"), now - TimeDelta::minutes(3));
    let thread = SessionRecord {
        origin: Some("langgraph".into()),
        metadata: labels(json!({"project": "x", "n": 1, "on": true, "deep": {"a": [1, 2]}})),
        ..session(Some("k"), now - TimeDelta::minutes(2))
    };
    let task = SessionRecord {
        origin: Some("a2a".into()),
        metadata: labels(json!({"project": "y", "n": "1"})),
        ..session(Some("k"), now - TimeDelta::minutes(1))
    };
    for record in [&own, &thread, &task] {
        store.create_session(record).await.unwrap();
    }
    assert_eq!(
        store.get_session(thread.id).await.unwrap().as_ref(),
        Some(&thread)
    );

    let listed = |origin: Option<Option<&str>>, metadata: serde_json::Value| {
        let filter = SessionFilter {
            origin: origin.map(|o| o.map(str::to_owned)),
            metadata: labels(metadata),
            ..SessionFilter::default()
        };
        let store = store.clone();
        async move {
            let found = store.list_sessions(&filter).await.unwrap();
            found.into_iter().map(|r| r.id).collect::<Vec<_>>()
        }
    };
    assert_eq!(listed(Some(None), json!({})).await, [own.id]);
    assert_eq!(
        listed(Some(Some("langgraph")), json!({})).await,
        [thread.id]
    );
    assert_eq!(
        listed(Some(Some("agui")), json!({})).await,
        Vec::<Uuid>::new()
    );
    assert_eq!(listed(None, json!({"project": "x"})).await, [thread.id]);
    // Values compare with their type: 1 is not "1", true is not 1.
    assert_eq!(listed(None, json!({"n": 1})).await, [thread.id]);
    assert_eq!(listed(None, json!({"n": "1"})).await, [task.id]);
    assert_eq!(listed(None, json!({"on": true})).await, [thread.id]);
    assert_eq!(listed(None, json!({"on": 1})).await, Vec::<Uuid>::new());
    assert_eq!(
        listed(None, json!({"deep": {"a": [1, 2]}})).await,
        [thread.id]
    );
    assert_eq!(
        listed(None, json!({"deep": {"a": [2]}})).await,
        Vec::<Uuid>::new()
    );
    assert_eq!(
        listed(None, json!({"project": "x", "n": 2})).await,
        Vec::<Uuid>::new()
    );
    assert_eq!(
        listed(None, json!({"absent": null})).await,
        Vec::<Uuid>::new()
    );

    // A merge sets its keys and keeps the others.
    let merged = store
        .merge_metadata(thread.id, &labels(json!({"project": "z", "new": [1]})))
        .await
        .unwrap()
        .unwrap();
    let expected = labels(json!({"project": "z", "n": 1, "on": true,
        "deep": {"a": [1, 2]}, "new": [1]}));
    assert_eq!(merged, expected);
    let stored = store.get_session(thread.id).await.unwrap().unwrap();
    assert_eq!(stored.metadata, expected);
    assert_eq!(stored.origin, thread.origin);
    assert_eq!(listed(None, json!({"project": "z"})).await, [thread.id]);
    assert_eq!(
        store
            .merge_metadata(Uuid::new_v4(), &labels(json!({"a": 1})))
            .await
            .unwrap(),
        None
    );
}

pub(crate) async fn creating_a_session_twice_fails(fixture: &dyn Fixture) {
    let store = fixture.open().await;
    let created = session(None, Utc::now());
    store.create_session(&created).await.unwrap();

    let again = store.create_session(&created).await;

    assert!(matches!(again, Err(StoreError::Io(_))), "{again:?}");
}

pub(crate) async fn update_saves_status_usage_and_updated_at(fixture: &dyn Fixture) {
    let store = fixture.open().await;
    let created = session(None, Utc::now() - TimeDelta::minutes(5));
    store.create_session(&created).await.unwrap();
    let usage = Usage {
        input_tokens: 1000,
        output_tokens: 250,
        cache_read_tokens: 600,
        cache_write_tokens: 100,
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

pub(crate) async fn updating_an_unknown_session_changes_nothing(fixture: &dyn Fixture) {
    let store = fixture.open().await;

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

pub(crate) async fn list_sessions_filters_by_owner_newest_first(fixture: &dyn Fixture) {
    let store = fixture.open().await;
    let now = Utc::now();
    let oldest = session(Some("alice"), now - TimeDelta::hours(2));
    let middle = SessionRecord {
        ephemeral: true,
        ..session(Some("bob"), now - TimeDelta::hours(1))
    };
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
    // One-shot runs alone, or none of them.
    let ephemeral = |ephemeral| SessionFilter {
        ephemeral: Some(ephemeral),
        ..SessionFilter::default()
    };
    let ids = |records: Vec<SessionRecord>| records.iter().map(|s| s.id).collect::<Vec<_>>();
    assert_eq!(
        ids(store.list_sessions(&ephemeral(true)).await.unwrap()),
        vec![middle.id]
    );
    assert_eq!(
        ids(store.list_sessions(&ephemeral(false)).await.unwrap()),
        vec![newest.id, oldest.id, anonymous.id]
    );
}

pub(crate) async fn expired_ephemeral_sessions_are_found_oldest_first(fixture: &dyn Fixture) {
    let store = fixture.open().await;
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

pub(crate) async fn sessions_with_status_finds_only_that_status(fixture: &dyn Fixture) {
    let store = fixture.open().await;
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

pub(crate) async fn append_messages_continues_after_the_highest_index(fixture: &dyn Fixture) {
    let store = fixture.open().await;
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
    // A turn that holds the first messages reads only the rest.
    for from in [0, 1, expected.len() - 1, expected.len(), expected.len() + 5] {
        let tail = store.messages_from(created.id, from).await.unwrap();
        assert_eq!(tail, expected[from.min(expected.len())..], "from {from}");
    }
}

/// Appends racing from two stores on one database (two replicas, for
/// PostgreSQL) to one session all land, each writer's in its order, with
/// no index taken twice and none skipped.
pub(crate) async fn racing_message_appends_all_land_in_order(fixture: &dyn Fixture) {
    const WRITERS: usize = 16;
    const EACH: usize = 10;
    let stores: [Arc<dyn Store>; 2] = [fixture.open().await, fixture.open().await];
    let created = session(None, Utc::now());
    stores[0].create_session(&created).await.unwrap();
    let writers = (0..WRITERS).map(|writer| {
        let store = stores[writer % 2].clone();
        tokio::spawn(async move {
            for n in 0..EACH {
                let message = Message::User {
                    content: format!("{writer}:{n}"),
                };
                store
                    .append_messages(created.id, std::slice::from_ref(&message))
                    .await
                    .unwrap();
            }
        })
    });
    for writer in futures::future::join_all(writers).await {
        writer.unwrap();
    }
    let messages = stores[1].messages(created.id).await.unwrap();
    assert_eq!(messages.len(), WRITERS * EACH);
    let mut next = [0; WRITERS];
    for message in &messages {
        let Message::User { content } = message else {
            panic!("{message:?}");
        };
        let (writer, n) = content.split_once(':').unwrap();
        let writer: usize = writer.parse().unwrap();
        assert_eq!(n.parse::<usize>().unwrap(), next[writer], "{content}");
        next[writer] += 1;
    }
    // After a truncation the next append takes the first index cut.
    stores[0].truncate_messages(created.id, 3).await.unwrap();
    let retry = Message::User {
        content: "again".into(),
    };
    stores[1]
        .append_messages(created.id, std::slice::from_ref(&retry))
        .await
        .unwrap();
    let messages = stores[0].messages(created.id).await.unwrap();
    assert_eq!(messages.len(), 4);
    assert_eq!(messages[3], retry);
}

pub(crate) async fn truncate_messages_cuts_the_history_and_appends_continue(fixture: &dyn Fixture) {
    let store = fixture.open().await;
    let created = session(None, Utc::now());
    store.create_session(&created).await.unwrap();
    let conversation = conversation();
    assert!(conversation.len() >= 2);
    store
        .append_messages(created.id, &conversation)
        .await
        .unwrap();

    // Longer than the history: nothing goes.
    store
        .truncate_messages(created.id, conversation.len() + 3)
        .await
        .unwrap();
    assert_eq!(store.messages(created.id).await.unwrap(), conversation);

    store.truncate_messages(created.id, 1).await.unwrap();
    assert_eq!(store.messages(created.id).await.unwrap(), conversation[..1]);

    // The next message takes the place of the first one cut.
    let retry = Message::User {
        content: "start over".into(),
    };
    store
        .append_messages(created.id, std::slice::from_ref(&retry))
        .await
        .unwrap();
    assert_eq!(
        store.messages(created.id).await.unwrap(),
        vec![conversation[0].clone(), retry.clone()]
    );
    assert_eq!(
        store.messages_from(created.id, 1).await.unwrap(),
        vec![retry]
    );

    store.truncate_messages(created.id, 0).await.unwrap();
    assert_eq!(store.messages(created.id).await.unwrap(), vec![]);
}

pub(crate) async fn messages_of_an_unknown_session_are_refused(fixture: &dyn Fixture) {
    let store = fixture.open().await;

    let appended = store.append_messages(Uuid::new_v4(), &conversation()).await;

    assert!(matches!(appended, Err(StoreError::Io(_))), "{appended:?}");
}

pub(crate) async fn delete_session_cascades_to_messages_and_events(fixture: &dyn Fixture) {
    let store = fixture.open().await;
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
