//! The event log, and what closing, dropping and reopening a store keep.

use std::sync::Arc;

use chrono::Utc;
use uuid::Uuid;

use super::{Fixture, conversation, event, session};
use crate::protocol::{Event, SessionRecord, SessionStatus, Usage};
use crate::store::{
    Batch, Creation, Release, SessionFilter, SessionState, StoreError, UsageCounts, UsageRow,
};

pub(crate) async fn events_since_pages_in_order_and_last_seq_tracks_the_end(fixture: &dyn Fixture) {
    let store = fixture.open().await;
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

pub(crate) async fn everything_survives_close_and_reopen(fixture: &dyn Fixture) {
    let created = session(Some("key-hash"), Utc::now());
    let events: Vec<Event> = (1..=5).map(|seq| event(created.id, seq)).collect();
    let store = fixture.open().await;
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

    let store = fixture.open().await;

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

pub(crate) async fn dropping_the_store_keeps_what_was_written(fixture: &dyn Fixture) {
    let created = session(None, Utc::now());
    let store = fixture.open().await;
    store.create_session(&created).await.unwrap();
    store
        .append_events(std::slice::from_ref(&event(created.id, 1)))
        .await
        .unwrap();

    drop(store);

    let store = fixture.open().await;
    assert_eq!(store.last_seq(created.id).await.unwrap(), 1);
    assert_eq!(store.get_session(created.id).await.unwrap(), Some(created));
}

pub(crate) async fn calls_after_close_fail_with_closed(fixture: &dyn Fixture) {
    let store = fixture.open().await;
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

pub(crate) async fn close_lets_the_calls_under_way_finish(fixture: &dyn Fixture) {
    let store = fixture.open().await;
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

    let store = fixture.open().await;
    assert_eq!(
        store.events_since(created.id, 0, 100).await.unwrap().len(),
        landed
    );
}

pub(crate) async fn concurrent_appends_all_land_without_gaps(fixture: &dyn Fixture) {
    const SESSIONS: usize = 64;
    const EVENTS: u64 = 100;
    let store = fixture.open().await;
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

pub(crate) async fn appending_several_events_is_all_or_nothing(fixture: &dyn Fixture) {
    let store = fixture.open().await;
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

pub(crate) async fn a_batch_saves_the_sessions_state_messages_and_lease_with_its_events_or_none(
    fixture: &dyn Fixture,
) {
    let store = fixture.open().await;
    let created = session(None, Utc::now());
    store.create_session(&created).await.unwrap();
    let said = conversation();
    store.append_messages(created.id, &said[..1]).await.unwrap();
    let running = SessionState {
        status: SessionStatus::Running,
        usage: Usage {
            input_tokens: 7,
            ..Usage::default()
        },
        updated_at: created.updated_at + chrono::TimeDelta::seconds(1),
    };
    let first = vec![event(created.id, 1), event(created.id, 2)];
    let batch = |events, messages, state| Batch {
        events,
        messages,
        state,
        ..Batch::default()
    };
    store
        .append_batch(created.id, batch(&first, &said[1..2], Some(&running)))
        .await
        .unwrap();
    let stored = store.get_session(created.id).await.unwrap().unwrap();
    assert_eq!(
        (stored.status, &stored.usage, stored.updated_at),
        (running.status, &running.usage, running.updated_at)
    );
    assert_eq!(store.events_since(created.id, 0, 10).await.unwrap(), first);
    assert_eq!(store.messages(created.id).await.unwrap(), &said[..2]);

    // A batch refused (seq 2 again) leaves the state and the messages as
    // they were.
    let idle = SessionState {
        status: SessionStatus::Idle,
        usage: Usage::default(),
        updated_at: running.updated_at + chrono::TimeDelta::seconds(1),
    };
    let clashing = vec![event(created.id, 3), event(created.id, 2)];
    assert!(
        store
            .append_batch(created.id, batch(&clashing, &said[2..], Some(&idle)))
            .await
            .is_err()
    );
    let stored = store.get_session(created.id).await.unwrap().unwrap();
    assert_eq!(
        (stored.status, &stored.usage),
        (running.status, &running.usage)
    );
    assert_eq!(store.last_seq(created.id).await.unwrap(), 2);
    assert_eq!(store.messages(created.id).await.unwrap(), &said[..2]);

    // Any part may be missing: messages alone go on after those stored,
    // a batch of no events saves the state alone, one with no state
    // leaves it; another session's state is left alone, and messages for
    // an unknown session are refused.
    store
        .append_batch(created.id, batch(&[], &said[2..3], None))
        .await
        .unwrap();
    store
        .append_batch(created.id, batch(&[], &[], Some(&idle)))
        .await
        .unwrap();
    let third = [event(created.id, 3)];
    store
        .append_batch(created.id, batch(&third, &said[3..], None))
        .await
        .unwrap();
    store
        .append_batch(Uuid::new_v4(), batch(&[], &[], Some(&running)))
        .await
        .unwrap();
    assert!(
        store
            .append_batch(Uuid::new_v4(), batch(&[], &said[..1], None))
            .await
            .is_err()
    );
    let stored = store.get_session(created.id).await.unwrap().unwrap();
    assert_eq!(
        (stored.status, &stored.usage, stored.updated_at),
        (idle.status, &idle.usage, idle.updated_at)
    );
    assert_eq!(store.last_seq(created.id).await.unwrap(), 3);
    assert_eq!(store.messages(created.id).await.unwrap(), said);

    // A turn's lease goes with its last batch, only if its holder has it,
    // and what it spent is added to its key's usage (to a row there is,
    // or a new one); a refused batch leaves both.
    let ttl = std::time::Duration::from_secs(60);
    store.lease_acquire("turn:x", "a", ttl).await.unwrap();
    let lease = |holder: &str| Release {
        name: "turn:x".into(),
        holder: holder.into(),
    };
    let (other, mine) = (lease("b"), lease("a"));
    let day = chrono::NaiveDate::from_ymd_opt(2026, 11, 27).unwrap();
    let spent = |model: &str, tokens| UsageRow {
        owner: "key".into(),
        day,
        model: model.into(),
        counts: UsageCounts {
            input_tokens: tokens,
            turns: 1,
            ..UsageCounts::default()
        },
    };
    store
        .usage_add("key", day, "m", &spent("m", 5).counts)
        .await
        .unwrap();
    let usage = [spent("m", 10), spent("n", 100)];
    let releasing = |events, release| Batch {
        events,
        state: Some(&idle),
        release: Some(release),
        usage: &usage,
        ..Batch::default()
    };
    let fourth = [event(created.id, 4)];
    store
        .append_batch(created.id, releasing(&fourth, &other))
        .await
        .unwrap();
    assert!(
        store
            .lease_renew("turn:x", "a", ttl)
            .await
            .unwrap()
            .is_some(),
        "another holder's release leaves the lease"
    );
    assert!(
        store
            .append_batch(created.id, releasing(&fourth, &mine))
            .await
            .is_err()
    );
    assert!(
        store
            .lease_renew("turn:x", "a", ttl)
            .await
            .unwrap()
            .is_some()
    );
    let fifth = [event(created.id, 5)];
    store
        .append_batch(created.id, releasing(&fifth, &mine))
        .await
        .unwrap();
    assert_eq!(store.lease_renew("turn:x", "a", ttl).await.unwrap(), None);
    assert_eq!(store.last_seq(created.id).await.unwrap(), 5);
    // Added once by the stored batch with another holder's release, once
    // by the last; not by the refused one.
    let rows = store.usage_rows(day, day, Some("key")).await.unwrap();
    let tokens: Vec<(&str, u64, u64)> = rows
        .iter()
        .map(|r| (r.model.as_str(), r.counts.input_tokens, r.counts.turns))
        .collect();
    assert_eq!(tokens, [("m", 25, 3), ("n", 200, 2)]);
}

pub(crate) async fn a_batch_that_makes_its_session_stores_it_with_its_lease_or_nothing(
    fixture: &dyn Fixture,
) {
    let store = fixture.open().await;
    let made = SessionRecord {
        origin: Some("langgraph".into()),
        metadata: serde_json::json!({"project": "x"})
            .as_object()
            .unwrap()
            .clone(),
        ..session(None, Utc::now())
    };
    let id = made.id;
    let said = conversation();
    let running = SessionState {
        status: SessionStatus::Running,
        usage: Usage {
            input_tokens: 3,
            ..Usage::default()
        },
        updated_at: made.updated_at + chrono::TimeDelta::seconds(1),
    };
    let ttl = std::time::Duration::from_secs(60);
    let lease = Release {
        name: format!("turn:{id}"),
        holder: "a".into(),
    };
    let creating = |events, lease| Batch {
        create: Some(Creation {
            record: &made,
            lease,
        }),
        events,
        messages: &said[..2],
        state: Some(&running),
        ..Batch::default()
    };
    // A refused batch (seq 1 twice) makes nothing: no session, no lease.
    let clashing = [event(id, 1), event(id, 1)];
    assert!(
        store
            .append_batch(id, creating(&clashing, Some((&lease, ttl))))
            .await
            .is_err()
    );
    assert_eq!(store.get_session(id).await.unwrap(), None);
    let free = store.lease_acquire(&lease.name, "b", ttl).await.unwrap();
    assert_eq!(free.holder, "b", "no lease was left behind");
    store.lease_release(&lease.name, "b").await.unwrap();

    // Stored: the record with the batch's state, its messages from the
    // first index, its events and the lease of its first turn.
    let first = [event(id, 1), event(id, 2)];
    store
        .append_batch(id, creating(&first, Some((&lease, ttl))))
        .await
        .unwrap();
    let stored = store.get_session(id).await.unwrap().unwrap();
    assert_eq!(
        stored,
        SessionRecord {
            status: running.status,
            usage: running.usage.clone(),
            updated_at: running.updated_at,
            ..made.clone()
        }
    );
    assert_eq!(store.events_since(id, 0, 10).await.unwrap(), first);
    assert_eq!(store.messages(id).await.unwrap(), &said[..2]);
    let end = store.session_at_end(id).await.unwrap().unwrap();
    assert_eq!(end.last_seq, 2);
    assert!(end.messages.is_none_or(|n| n == 2), "{end:?}");
    let held = store.lease_acquire(&lease.name, "b", ttl).await.unwrap();
    assert_eq!(held.holder, "a", "the first turn holds its lease");

    // The next batches go on from there, and a second making of the same
    // session is refused whole.
    let next = [event(id, 3)];
    store
        .append_batch(
            id,
            Batch {
                events: &next,
                messages: &said[2..],
                ..Batch::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(store.messages(id).await.unwrap(), said);
    let again = [event(id, 4)];
    assert!(
        store
            .append_batch(id, creating(&again, None))
            .await
            .is_err()
    );
    assert_eq!(store.last_seq(id).await.unwrap(), 3);
    assert_eq!(store.messages(id).await.unwrap(), said);
}
