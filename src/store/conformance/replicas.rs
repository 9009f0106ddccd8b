//! Two replicas on one database: what one writes, the other reads, and
//! leases and compare-and-set hold across both.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;

use super::kv::race_compare_and_set;
use super::{Fixture, conversation, event, session};
use crate::protocol::{Event, SessionStatus, Usage};
use crate::store::{Batch, Release, SessionState, Store, TurnLease};

pub(crate) async fn leases_race_across_replicas(fixture: &dyn Fixture) {
    let replicas: [Arc<dyn Store>; 2] = [fixture.open().await, fixture.open().await];
    let tries = (0..16).map(|i| {
        let store = replicas[i % 2].clone();
        tokio::spawn(async move {
            let holder = format!("replica-{i}");
            let lease = store
                .lease_acquire("turn:race", &holder, Duration::from_secs(60))
                .await
                .unwrap();
            (lease.holder == holder).then_some(lease)
        })
    });
    let winners: Vec<_> = futures::future::join_all(tries)
        .await
        .into_iter()
        .filter_map(Result::unwrap)
        .collect();
    assert_eq!(winners.len(), 1, "{winners:?}");
    let winner = &winners[0];
    // The other replica sees the same lease, and takes it once released.
    let seen = replicas[1]
        .lease_acquire("turn:race", "latecomer", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(&seen, winner);
    assert!(
        replicas[0]
            .lease_release("turn:race", &winner.holder)
            .await
            .unwrap()
    );
    let taken = replicas[1]
        .lease_acquire("turn:race", "latecomer", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!((taken.holder.as_str(), taken.fence), ("latecomer", 1));
}

pub(crate) async fn kv_compare_and_set_across_replicas(fixture: &dyn Fixture) {
    race_compare_and_set(&[fixture.open().await, fixture.open().await]).await;
}

pub(crate) async fn events_of_one_replica_read_by_the_other(fixture: &dyn Fixture) {
    let (a, b) = (fixture.open().await, fixture.open().await);
    let created = session(Some("key-hash"), Utc::now());
    a.create_session(&created).await.unwrap();
    a.append_messages(created.id, &conversation())
        .await
        .unwrap();
    let events: Vec<Event> = (1..=20).map(|seq| event(created.id, seq)).collect();
    a.append_events(&events[..10]).await.unwrap();

    assert_eq!(
        b.get_session(created.id).await.unwrap(),
        Some(created.clone())
    );
    assert_eq!(b.messages(created.id).await.unwrap(), conversation());
    assert_eq!(
        b.events_since(created.id, 0, 100).await.unwrap(),
        events[..10]
    );
    assert_eq!(b.last_seq(created.id).await.unwrap(), 10);
    // What a replica taking a turn reads: the record, the last `seq` and,
    // where the backend knows it, the length of the conversation.
    let end = b.session_at_end(created.id).await.unwrap().unwrap();
    assert_eq!((&end.record, end.last_seq), (&created, 10));
    assert!(
        end.messages
            .is_none_or(|n| n == conversation().len() as u64),
        "{end:?}"
    );

    b.append_events(&events[10..]).await.unwrap();
    b.append_messages(created.id, &conversation())
        .await
        .unwrap();
    assert_eq!(a.events_since(created.id, 0, 100).await.unwrap(), events);
    assert_eq!(a.messages(created.id).await.unwrap().len(), 6);
}

/// A replica that takes a turn as the last one's `result` frees the lease
/// reads the session as that write left it: never the state before it,
/// however the two statements interleave.
pub(crate) async fn a_turn_taken_as_the_last_one_ends_reads_its_end(fixture: &dyn Fixture) {
    let (a, b) = (fixture.open().await, fixture.open().await);
    let created = session(None, Utc::now());
    a.create_session(&created).await.unwrap();
    let id = created.id;
    let (name, ttl) = ("turn:race", Duration::from_secs(60));
    for n in 1..=40u64 {
        let taken = a.take_turn(id, (name, "a"), ttl).await.unwrap();
        assert!(matches!(taken, TurnLease::Held(_)), "{taken:?}");
        let taker = tokio::spawn({
            let b = b.clone();
            async move {
                loop {
                    match b.take_turn(id, (name, "b"), ttl).await.unwrap() {
                        TurnLease::Held(end) => return end,
                        TurnLease::Busy => tokio::task::yield_now().await,
                        TurnLease::NoSession => panic!("the session is there"),
                    }
                }
            }
        });
        let state = SessionState {
            status: SessionStatus::Idle,
            usage: Usage {
                turns: n,
                ..Usage::default()
            },
            updated_at: Utc::now(),
        };
        let release = Release {
            name: name.into(),
            holder: "a".into(),
        };
        let last = [event(id, n)];
        let end = Batch {
            events: &last,
            state: Some(&state),
            release: Some(&release),
            ..Batch::default()
        };
        a.append_batch(id, end).await.unwrap();
        let seen = taker.await.unwrap();
        assert_eq!((seen.last_seq, seen.record.usage.turns), (n, n), "turn {n}");
        assert!(b.lease_release(name, "b").await.unwrap());
    }
}
