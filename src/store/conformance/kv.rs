//! The KV (revisions per namespace, compare-and-set, literal prefixes) and
//! checkpoints.

use std::sync::Arc;

use chrono::Utc;
use serde_json::json;
use uuid::Uuid;

use super::Fixture;
use crate::protocol::{SessionKind, SessionRecord, SessionStatus, Usage};
use crate::store::{Checkpoint, Expect, KvWrite, Store, StoreError};

pub(crate) async fn kv_writes_compare_and_set_on_revisions_per_namespace(fixture: &dyn Fixture) {
    let store = fixture.open().await;
    let put = |ns: &'static str, value: &'static str, expect| {
        let store = &store;
        async move {
            store
                .kv_put(ns, "topic", value.as_bytes(), expect)
                .await
                .unwrap()
        }
    };
    assert_eq!(put("a", "one", Expect::Absent).await, KvWrite::Done(1));
    assert_eq!(
        put("a", "two", Expect::Absent).await,
        KvWrite::Conflict { current: Some(1) }
    );
    assert_eq!(put("a", "two", Expect::Revision(1)).await, KvWrite::Done(2));
    assert_eq!(
        put("a", "three", Expect::Revision(1)).await,
        KvWrite::Conflict { current: Some(2) }
    );
    assert_eq!(put("a", "three", Expect::Any).await, KvWrite::Done(3));
    // Another namespace has its own keys and its own revisions.
    assert_eq!(store.kv_get("b", "topic").await.unwrap(), None);
    assert_eq!(put("b", "mine", Expect::Absent).await, KvWrite::Done(1));
    let entry = store.kv_get("a", "topic").await.unwrap().unwrap();
    assert_eq!(
        (entry.key.as_str(), entry.value.as_slice(), entry.revision),
        ("topic", b"three".as_slice(), 3)
    );
    assert_eq!(
        store.kv_get("b", "topic").await.unwrap().unwrap().value,
        b"mine"
    );
}

pub(crate) async fn kv_deletes_are_conditional_and_take_a_revision(fixture: &dyn Fixture) {
    let store = fixture.open().await;
    store.kv_put("a", "k", b"v", Expect::Any).await.unwrap();
    store.kv_put("a", "other", b"v", Expect::Any).await.unwrap();
    assert_eq!(
        store
            .kv_delete("a", "k", Expect::Revision(2))
            .await
            .unwrap(),
        KvWrite::Conflict { current: Some(1) }
    );
    assert_eq!(
        store
            .kv_delete("a", "k", Expect::Revision(1))
            .await
            .unwrap(),
        KvWrite::Done(3)
    );
    assert_eq!(store.kv_get("a", "k").await.unwrap(), None);
    // A missing key: nothing to do unconditionally, a conflict otherwise.
    assert_eq!(
        store.kv_delete("a", "k", Expect::Any).await.unwrap(),
        KvWrite::Done(3)
    );
    assert_eq!(
        store
            .kv_delete("a", "k", Expect::Revision(3))
            .await
            .unwrap(),
        KvWrite::Conflict { current: None }
    );
    // A write after a delete gets a higher revision than the delete's.
    assert_eq!(
        store
            .kv_put("a", "k", b"again", Expect::Absent)
            .await
            .unwrap(),
        KvWrite::Done(4)
    );
}

pub(crate) async fn kv_lists_by_literal_prefix_in_key_order_and_survives_a_reopen(
    fixture: &dyn Fixture,
) {
    {
        let store = fixture.open().await;
        for key in ["sync/b", "sync/a", "sync%x", "other", "sync_"] {
            store
                .kv_put("a", key, key.as_bytes(), Expect::Any)
                .await
                .unwrap();
        }
        store
            .kv_put("b", "sync/z", b"z", Expect::Any)
            .await
            .unwrap();
        store.close().await.unwrap();
    }
    let store = fixture.open().await;
    let keys = |entries: Vec<crate::store::KvEntry>| {
        entries.into_iter().map(|e| e.key).collect::<Vec<_>>()
    };
    assert_eq!(
        keys(store.kv_list("a", "sync/", 100).await.unwrap()),
        ["sync/a", "sync/b"]
    );
    assert_eq!(
        keys(store.kv_list("a", "sync%", 100).await.unwrap()),
        ["sync%x"]
    );
    assert_eq!(keys(store.kv_list("a", "sync", 2).await.unwrap()).len(), 2);
    assert_eq!(keys(store.kv_list("a", "", 100).await.unwrap()).len(), 5);
    assert_eq!(
        store.kv_put("a", "other", b"v", Expect::Any).await.unwrap(),
        KvWrite::Done(6),
        "the revision counter survives a reopen"
    );
}

fn checkpoint(session_id: Uuid, step: u64, name: &str) -> Checkpoint {
    Checkpoint {
        session_id,
        step,
        name: name.into(),
        state: json!({"step": step, "node": name}),
        created_at: Utc::now(),
    }
}

pub(crate) async fn checkpoints_are_kept_per_step_never_overwritten_and_go_with_their_session(
    fixture: &dyn Fixture,
) {
    let store = fixture.open().await;
    let now = Utc::now();
    let session = SessionRecord {
        id: Uuid::new_v4(),
        name: None,
        kind: SessionKind::named("pipeline"),
        owner: None,
        options: json!({}),
        status: SessionStatus::Idle,
        usage: Usage::default(),
        ephemeral: false,
        origin: None,
        metadata: Default::default(),
        created_at: now,
        updated_at: now,
    };
    store.create_session(&session).await.unwrap();
    let id = session.id;
    assert_eq!(store.last_checkpoint(id).await.unwrap(), None);
    for (step, name) in [(1, "research"), (2, "generate")] {
        store
            .put_checkpoint(&checkpoint(id, step, name))
            .await
            .unwrap();
    }
    let again = store.put_checkpoint(&checkpoint(id, 2, "tester")).await;
    assert!(matches!(again, Err(StoreError::Conflict(_))), "{again:?}");
    let unknown = store
        .put_checkpoint(&checkpoint(Uuid::new_v4(), 1, "research"))
        .await;
    assert!(
        matches!(unknown, Err(StoreError::Conflict(_))),
        "{unknown:?}"
    );
    let all = store.checkpoints(id).await.unwrap();
    assert_eq!(
        all.iter()
            .map(|c| (c.step, c.name.as_str()))
            .collect::<Vec<_>>(),
        [(1, "research"), (2, "generate")]
    );
    assert_eq!(all[1].state, json!({"step": 2, "node": "generate"}));
    assert_eq!(store.last_checkpoint(id).await.unwrap().unwrap().step, 2);
    assert!(store.delete_session(id).await.unwrap());
    assert_eq!(store.checkpoints(id).await.unwrap(), []);
}

/// Writers racing on one key, each expecting the revision it read: one
/// write per revision gets through, and no revision is handed out twice.
pub(crate) async fn concurrent_compare_and_set_has_one_winner_per_revision(fixture: &dyn Fixture) {
    race_compare_and_set(&[fixture.open().await]).await;
}

/// Rounds of writers spread over `stores` (replicas of one database), each
/// expecting the revision the round started from: exactly one wins a round.
pub(crate) async fn race_compare_and_set(stores: &[Arc<dyn Store>]) {
    const WRITERS: usize = 8;
    const ROUNDS: u64 = 5;
    let KvWrite::Done(mut revision) = stores[0]
        .kv_put("a", "counter", b"0", Expect::Absent)
        .await
        .unwrap()
    else {
        panic!("the first write conflicts");
    };
    for round in 1..=ROUNDS {
        let writes = (0..WRITERS).map(|writer| {
            let store = stores[writer % stores.len()].clone();
            tokio::spawn(async move {
                let value = format!("{round}/{writer}");
                store
                    .kv_put("a", "counter", value.as_bytes(), Expect::Revision(revision))
                    .await
                    .unwrap()
            })
        });
        let outcomes: Vec<KvWrite> = futures::future::join_all(writes)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let done: Vec<u64> = outcomes
            .iter()
            .filter_map(|outcome| match outcome {
                KvWrite::Done(revision) => Some(*revision),
                KvWrite::Conflict { .. } => None,
            })
            .collect();
        assert_eq!(done, [revision + 1], "round {round}: {outcomes:?}");
        revision += 1;
    }
    for store in stores {
        assert_eq!(
            store
                .kv_get("a", "counter")
                .await
                .unwrap()
                .unwrap()
                .revision,
            revision
        );
    }
}
