//! Quota slots and window counters: a limit holds across two stores on one
//! database (two replicas), racing takers never pass it, expired slots
//! free themselves, a replica's renewal keeps its own.

use std::time::Duration;

use super::Fixture;

const LONG: Duration = Duration::from_secs(60);

/// Two replicas share a pool's limit; a holder taking again renews its
/// slot; a release frees room; a replica's renewal covers only its slots.
pub(crate) async fn slots_hold_a_limit_across_replicas(fixture: &dyn Fixture) {
    let (a, b) = (fixture.open().await, fixture.open().await);
    assert!(
        a.slot_take("turns:k", "a/1", "a", 2, LONG, None)
            .await
            .unwrap()
    );
    assert!(
        b.slot_take("turns:k", "b/1", "b", 2, LONG, None)
            .await
            .unwrap()
    );
    assert!(
        !a.slot_take("turns:k", "a/2", "a", 2, LONG, None)
            .await
            .unwrap()
    );
    assert!(
        a.slot_take("turns:k", "a/1", "a", 2, LONG, None)
            .await
            .unwrap(),
        "a holder's own slot renews"
    );
    assert!(
        b.slot_take("turns:other", "b/2", "b", 1, LONG, None)
            .await
            .unwrap(),
        "pools count apart"
    );
    assert_eq!(a.slots_held("turns:k").await.unwrap(), 2);
    assert_eq!(a.slots_renew("a", LONG).await.unwrap(), 1);
    b.slot_release("turns:k", "b/1").await.unwrap();
    b.slot_release("turns:k", "b/1").await.unwrap();
    assert!(
        a.slot_take("turns:k", "a/2", "a", 2, LONG, None)
            .await
            .unwrap()
    );
    assert_eq!(b.slots_held("turns:k").await.unwrap(), 2);
}

/// A dead replica's slot stops counting once it has expired.
pub(crate) async fn expired_slots_free_themselves(fixture: &dyn Fixture) {
    let store = fixture.open().await;
    let short = Duration::from_millis(300);
    assert!(
        store
            .slot_take("sandboxes:k", "dead/1", "dead", 1, short, None)
            .await
            .unwrap()
    );
    assert!(
        !store
            .slot_take("sandboxes:k", "live/1", "live", 1, LONG, None)
            .await
            .unwrap()
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    // The expiry is the store's clock: ask until it has passed.
    while store.slots_held("sandboxes:k").await.unwrap() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        store
            .slot_take("sandboxes:k", "live/1", "live", 1, LONG, None)
            .await
            .unwrap()
    );
}

/// Sixteen takers racing for three slots: exactly three win.
pub(crate) async fn racing_takers_never_pass_the_limit(fixture: &dyn Fixture) {
    let (a, b) = (fixture.open().await, fixture.open().await);
    let takers = (0..16).map(|i| {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        tokio::spawn(async move {
            store
                .slot_take("turns:race", &format!("r/{i}"), "r", 3, LONG, None)
                .await
                .unwrap()
        })
    });
    let mut granted = 0;
    for taker in takers {
        granted += usize::from(taker.await.unwrap());
    }
    assert_eq!(granted, 3);
}

/// A window counts up, and a new window starts again at one.
pub(crate) async fn window_counts_restart_each_window(fixture: &dyn Fixture) {
    let (a, b) = (fixture.open().await, fixture.open().await);
    assert_eq!(a.window_count("rpm:k", 60).await.unwrap(), 1);
    assert_eq!(b.window_count("rpm:k", 60).await.unwrap(), 2);
    assert_eq!(a.window_count("rpm:other", 60).await.unwrap(), 1);
    assert_eq!(b.window_count("rpm:k", 120).await.unwrap(), 1);
}

/// A key's stored bytes count its sessions' events, whichever way their
/// batches were written (one, several at once, one that makes its
/// session), and go with a deleted session.
pub(crate) async fn a_keys_stored_bytes_count_its_sessions_events(fixture: &dyn Fixture) {
    use super::{event, session};
    use crate::store::{Batch, Creation};
    let store = fixture.open().await;
    let now = chrono::Utc::now();
    let encoded = |events: &[crate::protocol::Event]| -> u64 {
        events
            .iter()
            .map(|e| crate::store::codec::encode_event(e).unwrap().1.len() as u64)
            .sum()
    };
    let others = session(Some("other-key"), now);
    store.create_session(&others).await.unwrap();
    let theirs = [event(others.id, 1)];
    let batch = |events| Batch {
        events,
        ..Batch::default()
    };
    store.append_batch(others.id, batch(&theirs)).await.unwrap();
    let base = store.stored_bytes("the-key").await.unwrap();
    assert_eq!(base, 0);

    // Eight sessions' batches at once (PostgreSQL writes them grouped).
    let sessions: Vec<_> = (0..8).map(|_| session(Some("the-key"), now)).collect();
    for made in &sessions {
        store.create_session(made).await.unwrap();
    }
    let logs: Vec<Vec<_>> = sessions
        .iter()
        .map(|s| (1..=3).map(|seq| event(s.id, seq)).collect())
        .collect();
    let writes = sessions
        .iter()
        .zip(&logs)
        .map(|(s, log)| store.append_batch(s.id, batch(log)));
    for written in futures::future::join_all(writes).await {
        written.unwrap();
    }
    let mut expected: u64 = logs.iter().map(|log| encoded(log)).sum();
    // A batch that makes its session.
    let made = session(Some("the-key"), now);
    let first = [event(made.id, 1), event(made.id, 2)];
    let creating = Batch {
        create: Some(Creation {
            record: &made,
            lease: None,
        }),
        events: &first,
        ..Batch::default()
    };
    store.append_batch(made.id, creating).await.unwrap();
    expected += encoded(&first);
    // JSON may be stored a little differently than it was sent (PostgreSQL
    // keeps `json` as given); the count is within a byte an event.
    let counted = store.stored_bytes("the-key").await.unwrap();
    let events = (8 * 3 + 2) as u64;
    assert!(
        counted.abs_diff(expected) <= events,
        "{counted} vs {expected}"
    );
    // A deleted session's events no longer count.
    store.delete_session(made.id).await.unwrap();
    let after = store.stored_bytes("the-key").await.unwrap();
    assert!(
        after.abs_diff(expected - encoded(&first)) <= events,
        "{after}"
    );
}

/// A session slot counts the owner's open sessions that are not
/// ephemeral as held, in the same step: closed and ephemeral ones and
/// other owners' do not count.
pub(crate) async fn session_slots_count_the_owners_open_sessions(fixture: &dyn Fixture) {
    use super::session;
    use crate::protocol::SessionStatus;
    let (a, b) = (fixture.open().await, fixture.open().await);
    let now = chrono::Utc::now();
    let open = session(Some("k"), now);
    a.create_session(&open).await.unwrap();
    let closed = crate::protocol::SessionRecord {
        status: SessionStatus::Closed,
        ..session(Some("k"), now)
    };
    a.create_session(&closed).await.unwrap();
    let ephemeral = crate::protocol::SessionRecord {
        ephemeral: true,
        status: SessionStatus::Running,
        ..session(Some("k"), now)
    };
    a.create_session(&ephemeral).await.unwrap();
    a.create_session(&session(Some("other"), now))
        .await
        .unwrap();

    let pool = "max_concurrent_sessions:k";
    assert!(
        a.slot_take(pool, "a/1", "a", 3, LONG, Some("k"))
            .await
            .unwrap()
    );
    assert!(
        b.slot_take(pool, "b/1", "b", 3, LONG, Some("k"))
            .await
            .unwrap()
    );
    // One open session and two slots: the limit of 3 is reached.
    assert!(
        !a.slot_take(pool, "a/2", "a", 3, LONG, Some("k"))
            .await
            .unwrap()
    );
    // A slot given back after its session was stored leaves the count
    // where it was.
    b.create_session(&session(Some("k"), now)).await.unwrap();
    b.slot_release(pool, "b/1").await.unwrap();
    assert!(
        !a.slot_take(pool, "a/2", "a", 3, LONG, Some("k"))
            .await
            .unwrap()
    );
    a.slot_release(pool, "a/1").await.unwrap();
    assert!(
        a.slot_take(pool, "a/2", "a", 3, LONG, Some("k"))
            .await
            .unwrap()
    );
}
