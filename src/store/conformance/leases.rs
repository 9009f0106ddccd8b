//! Leases: one holder at a time, fences, expiry by the store's clock.

use std::time::Duration;

use chrono::Utc;

use super::{Fixture, conversation, event, session};
use crate::store::TurnLease;

const LONG: Duration = Duration::from_secs(60);

/// One holder at a time; renewals keep the fence; a release removes the
/// lease; an expiry lets another holder in with a higher fence; expired
/// leases are listed by prefix.
pub(crate) async fn one_holder_at_a_time(fixture: &dyn Fixture) {
    let store = fixture.open().await;
    let a = store
        .lease_acquire("turn:1", "replica-a", LONG)
        .await
        .unwrap();
    assert_eq!((a.holder.as_str(), a.fence), ("replica-a", 1));
    let b = store
        .lease_acquire("turn:1", "replica-b", LONG)
        .await
        .unwrap();
    assert_eq!(b, a, "another holder does not get a held lease");

    let renewed = store
        .lease_acquire("turn:1", "replica-a", LONG * 2)
        .await
        .unwrap();
    assert_eq!((renewed.holder.as_str(), renewed.fence), ("replica-a", 1));
    assert!(renewed.expires_at > a.expires_at);

    // A renewal extends only the holder's lease and never takes one.
    let again = store
        .lease_renew("turn:1", "replica-a", LONG * 3)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((again.holder.as_str(), again.fence), ("replica-a", 1));
    assert!(again.expires_at > renewed.expires_at);
    assert_eq!(
        store
            .lease_renew("turn:1", "replica-b", LONG)
            .await
            .unwrap(),
        None
    );

    assert!(!store.lease_release("turn:1", "replica-b").await.unwrap());
    assert!(store.lease_release("turn:1", "replica-a").await.unwrap());
    assert!(!store.lease_release("turn:1", "replica-a").await.unwrap());
    assert_eq!(
        store
            .lease_renew("turn:1", "replica-a", LONG)
            .await
            .unwrap(),
        None,
        "a renewal after the release does not take the lease back"
    );
    let b = store
        .lease_acquire("turn:1", "replica-b", LONG)
        .await
        .unwrap();
    assert_eq!(
        (b.holder.as_str(), b.fence),
        ("replica-b", 1),
        "a released lease is gone"
    );

    // A holder that stops renewing: its lease expires and is listed.
    let dead = store
        .lease_acquire("turn:2", "replica-c", Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(dead.holder, "replica-c");
    store
        .lease_acquire("other:2", "replica-c", Duration::ZERO)
        .await
        .unwrap();
    let expired = store.leases_expired("turn:").await.unwrap();
    let names: Vec<&str> = expired.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(
        names,
        ["turn:2"],
        "held and other-prefix leases are not listed"
    );
    let taken = store
        .lease_acquire("turn:2", "replica-a", LONG)
        .await
        .unwrap();
    assert_eq!((taken.holder.as_str(), taken.fence), ("replica-a", 2));
    assert!(store.leases_expired("turn:").await.unwrap().is_empty());
}

/// Many replicas racing for one free lease: exactly one gets it.
pub(crate) async fn a_race_has_one_winner(fixture: &dyn Fixture) {
    let store = fixture.open().await;
    let tries = (0..16).map(|i| {
        let store = store.clone();
        tokio::spawn(async move {
            let holder = format!("replica-{i}");
            let lease = store
                .lease_acquire("turn:race", &holder, LONG)
                .await
                .unwrap();
            lease.holder == holder
        })
    });
    let won = futures::future::join_all(tries)
        .await
        .into_iter()
        .filter(|granted| *granted.as_ref().unwrap())
        .count();
    assert_eq!(won, 1);
}

/// A holder taking and giving a lease up again and again while another
/// asks for it: every answer is a lease (held by one of them), never an
/// error, even when a release falls between the other's two statements.
pub(crate) async fn acquires_racing_releases_always_answer(fixture: &dyn Fixture) {
    let store = fixture.open().await;
    let churn = {
        let store = store.clone();
        tokio::spawn(async move {
            for _ in 0..200 {
                let lease = store.lease_acquire("turn:churn", "a", LONG).await.unwrap();
                if lease.holder == "a" {
                    store.lease_release("turn:churn", "a").await.unwrap();
                }
            }
        })
    };
    let mut answers = 0;
    while !churn.is_finished() {
        let lease = store.lease_acquire("turn:churn", "b", LONG).await.unwrap();
        if lease.holder == "b" {
            store.lease_release("turn:churn", "b").await.unwrap();
        }
        answers += 1;
    }
    churn.await.unwrap();
    assert!(answers > 0);
}

/// Taking a session's turn lease reads the session with it, takes nothing
/// for a session that does not exist, and finds a held lease busy.
pub(crate) async fn a_turn_lease_is_taken_only_for_a_session_and_reads_it(fixture: &dyn Fixture) {
    let store = fixture.open().await;
    let missing = uuid::Uuid::new_v4();
    assert_eq!(
        store
            .take_turn(missing, ("turn:missing", "a"), LONG)
            .await
            .unwrap(),
        TurnLease::NoSession
    );
    let other = store
        .lease_acquire("turn:missing", "b", LONG)
        .await
        .unwrap();
    assert_eq!(
        (other.holder.as_str(), other.fence),
        ("b", 1),
        "no lease was taken"
    );

    let created = session(None, Utc::now());
    store.create_session(&created).await.unwrap();
    store
        .append_messages(created.id, &conversation())
        .await
        .unwrap();
    store
        .append_events(&[event(created.id, 1), event(created.id, 2)])
        .await
        .unwrap();
    let TurnLease::Held(end) = store
        .take_turn(created.id, ("turn:s", "a"), LONG)
        .await
        .unwrap()
    else {
        panic!("a free lease is taken");
    };
    assert_eq!((&end.record, end.last_seq), (&created, 2));
    assert!(
        end.messages
            .is_none_or(|n| n == conversation().len() as u64)
    );
    assert_eq!(
        store
            .take_turn(created.id, ("turn:s", "b"), LONG)
            .await
            .unwrap(),
        TurnLease::Busy
    );
    assert!(
        matches!(
            store
                .take_turn(created.id, ("turn:s", "a"), LONG)
                .await
                .unwrap(),
            TurnLease::Held(_)
        ),
        "the holder renews it"
    );
}
