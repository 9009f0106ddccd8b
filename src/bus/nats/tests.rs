//! Two replicas on one NATS and one store: what one publishes or writes,
//! the other's subscribers, watchers and waiters see.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;

use crate::bus::tests::{Home, Running, m, nats, next, publish, start_on, sub};
use crate::bus::{BusConfig, Since};
use crate::store::{Expect, KvWrite, SqliteStore, Store};

/// Two replicas sharing `home`'s store and NATS prefix.
async fn replicas(home: &Home) -> (Running, Running) {
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(&home.dir.path().join("conclave.db")).unwrap());
    let a = start_on(home, BusConfig::default(), store.clone()).await;
    let b = start_on(home, BusConfig::default(), store).await;
    (a, b)
}

async fn stop(a: Running, b: Running, home: Home) {
    a.stop_bus().await;
    b.stop().await;
    home.clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_published_on_one_replica_reaches_the_other_in_order() {
    let home = nats();
    let (a, b) = replicas(&home).await;
    let mut on_b = sub(b.bus.as_ref(), "t", "agent.>,chatter.>", Since::New).await;
    for i in 1..=3 {
        publish(
            a.bus.as_ref(),
            "t",
            "agent.response.completed",
            &i.to_string(),
        )
        .await;
        publish(a.bus.as_ref(), "t", "chatter/x", &format!("c{i}")).await;
    }
    let mut got = Vec::new();
    for _ in 0..6 {
        got.push(next(&mut on_b).await);
    }
    let agent: Vec<_> = got
        .iter()
        .filter(|d| d.0.starts_with("agent"))
        .cloned()
        .collect();
    let chatter: Vec<_> = got
        .iter()
        .filter(|d| d.0.starts_with("chatter"))
        .cloned()
        .collect();
    assert_eq!(
        agent,
        (1..=3)
            .map(|i| m("agent.response.completed", i, &i.to_string()))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        chatter,
        (1..=3)
            .map(|i| m("chatter/x", i, &format!("c{i}")))
            .collect::<Vec<_>>()
    );
    // The numbering goes on from either replica.
    assert_eq!(publish(b.bus.as_ref(), "t", "chatter.x", "c4").await, 4);
    assert_eq!(next(&mut on_b).await, m("chatter.x", 4, "c4"));
    drop(on_b);
    stop(a, b, home).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_publishing_to_one_subject_at_once_get_dense_seqs() {
    let home = nats();
    let (a, b) = replicas(&home).await;
    for subject in ["agent.race", "chatter.race"] {
        let mut on_a = sub(a.bus.as_ref(), "t", subject, Since::New).await;
        let run = |bus: Arc<dyn crate::bus::Bus>, who: &'static str| async move {
            let mut seqs = Vec::new();
            for i in 0..40 {
                seqs.push(publish(bus.as_ref(), "t", subject, &format!("{who}{i}")).await);
            }
            seqs
        };
        let (from_a, from_b) = tokio::join!(
            tokio::spawn(run(a.bus.clone(), "a")),
            tokio::spawn(run(b.bus.clone(), "b"))
        );
        let seqs: BTreeSet<u64> = from_a.unwrap().into_iter().chain(from_b.unwrap()).collect();
        assert_eq!(seqs, (1..=80).collect::<BTreeSet<u64>>(), "{subject}");
        for i in 1..=80 {
            assert_eq!(next(&mut on_a).await.1, i, "{subject}");
        }
    }
    stop(a, b, home).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_replays_what_another_published_from_a_seq_and_a_time() {
    let home = nats();
    let (a, b) = replicas(&home).await;
    for i in 1..=4 {
        publish(a.bus.as_ref(), "t", "sync.weights_ready", &i.to_string()).await;
    }
    // A time between two publishes, as the NATS server's clock sees it:
    // the time of the last message stored.
    let mut all = sub(b.bus.as_ref(), "t", "sync.>", Since::Seq(0)).await;
    let mut times = Vec::new();
    for _ in 1..=4 {
        let delivery = tokio::time::timeout(Duration::from_secs(10), all.next())
            .await
            .unwrap()
            .unwrap();
        let crate::bus::Delivery::Message(message) = delivery else {
            panic!("{delivery:?}")
        };
        times.push(message.time);
    }
    let mut from_seq = sub(b.bus.as_ref(), "t", "sync.>", Since::Seq(2)).await;
    assert_eq!(next(&mut from_seq).await, m("sync.weights_ready", 3, "3"));
    assert_eq!(next(&mut from_seq).await, m("sync.weights_ready", 4, "4"));
    let mut from_time = sub(b.bus.as_ref(), "t", "sync.>", Since::Time(times[3])).await;
    assert_eq!(next(&mut from_time).await, m("sync.weights_ready", 4, "4"));
    assert_eq!(
        publish(a.bus.as_ref(), "t", "sync.weights_ready", "5").await,
        5
    );
    assert_eq!(next(&mut from_seq).await, m("sync.weights_ready", 5, "5"));
    assert_eq!(next(&mut from_time).await, m("sync.weights_ready", 5, "5"));
    drop((all, from_seq, from_time));
    stop(a, b, home).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kv_compares_and_wakes_across_replicas() {
    let home = nats();
    let (a, b) = replicas(&home).await;
    let mut watch_a = Box::pin(a.kv.watch("t", "topic"));
    let mut watch_b = Box::pin(b.kv.watch("t", "topic"));
    let waiter_b = {
        let kv = b.kv.clone();
        tokio::spawn(async move { kv.wait("t", "topic", None, Duration::from_secs(10)).await })
    };
    let put =
        a.kv.put("t", "topic", Bytes::from_static(b"\"r\""), Expect::Absent)
            .await
            .unwrap();
    let KvWrite::Done(first) = put else {
        panic!("{put:?}")
    };
    let found = waiter_b.await.unwrap().unwrap().unwrap();
    assert_eq!(
        (found.value.as_slice(), found.revision),
        (&b"\"r\""[..], first)
    );
    let change = tokio::time::timeout(Duration::from_secs(10), watch_b.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (
            change.key.as_str(),
            change.revision,
            change.value.as_deref()
        ),
        ("topic", first, Some(&b"\"r\""[..]))
    );
    // Both replicas set it from the same revision: one wins.
    let on_b =
        b.kv.put(
            "t",
            "topic",
            Bytes::from_static(b"b"),
            Expect::Revision(first),
        )
        .await
        .unwrap();
    let KvWrite::Done(second) = on_b else {
        panic!("{on_b:?}")
    };
    let on_a =
        a.kv.put(
            "t",
            "topic",
            Bytes::from_static(b"a"),
            Expect::Revision(first),
        )
        .await
        .unwrap();
    assert_eq!(
        on_a,
        KvWrite::Conflict {
            current: Some(second)
        }
    );
    let absent =
        a.kv.put("t", "topic", Bytes::from_static(b"a"), Expect::Absent)
            .await
            .unwrap();
    assert_eq!(
        absent,
        KvWrite::Conflict {
            current: Some(second)
        }
    );
    // A waiter on A for a change after `second` wakes on B's delete and
    // put; A's watcher sees B's writes, B's own watcher them once.
    let waiter_a = {
        let kv = a.kv.clone();
        tokio::spawn(async move {
            kv.wait("t", "topic", Some(second), Duration::from_secs(10))
                .await
        })
    };
    let deleted = b.kv.delete("t", "topic", Expect::Any).await.unwrap();
    let Some(KvWrite::Done(third)) = deleted else {
        panic!("{deleted:?}")
    };
    let put =
        b.kv.put("t", "topic", Bytes::from_static(b"c"), Expect::Absent)
            .await
            .unwrap();
    let KvWrite::Done(fourth) = put else {
        panic!("{put:?}")
    };
    let woken = waiter_a.await.unwrap().unwrap().unwrap();
    assert_eq!(
        (woken.value.as_slice(), woken.revision),
        (&b"c"[..], fourth)
    );
    let mut seen_a = Vec::new();
    while seen_a.last().is_none_or(|(revision, _)| *revision < fourth) {
        let change = tokio::time::timeout(Duration::from_secs(10), watch_a.next())
            .await
            .unwrap()
            .unwrap();
        seen_a.push((change.revision, change.value.clone()));
    }
    // A's own write at once; then B's, each as it was, in order, except
    // those already overwritten when their news came (read back, they are
    // stale and skipped).
    let writes = [
        (first, Some(Bytes::from_static(b"\"r\""))),
        (second, Some(Bytes::from_static(b"b"))),
        (third, None),
        (fourth, Some(Bytes::from_static(b"c"))),
    ];
    assert_eq!(seen_a.first(), Some(&writes[0]), "{seen_a:?}");
    assert!(seen_a.iter().all(|w| writes.contains(w)), "{seen_a:?}");
    assert!(seen_a.windows(2).all(|w| w[0].0 < w[1].0), "{seen_a:?}");
    for revision in [second, third, fourth] {
        let change = watch_b.next().await.unwrap();
        assert_eq!(change.revision, revision);
    }
    drop((watch_a, watch_b));
    stop(a, b, home).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_stay_apart_across_replicas_whatever_their_names() {
    let home = nats();
    let (a, b) = replicas(&home).await;
    // `a.b` + `c` and `a` + `b.c` must not meet, nor `é` and `~C3~A9`.
    let mut dotted = sub(b.bus.as_ref(), "a.b", ">", Since::New).await;
    let mut plain = sub(b.bus.as_ref(), "a", ">", Since::New).await;
    let mut accent = sub(b.bus.as_ref(), "é", ">", Since::New).await;
    assert_eq!(publish(a.bus.as_ref(), "a", "b.c", "plain").await, 1);
    assert_eq!(publish(a.bus.as_ref(), "~C3~A9", "x", "tilde").await, 1);
    assert_eq!(publish(a.bus.as_ref(), "a.b", "c", "dotted").await, 1);
    assert_eq!(publish(a.bus.as_ref(), "é", "x", "accent").await, 1);
    assert_eq!(next(&mut dotted).await, m("c", 1, "dotted"));
    assert_eq!(next(&mut plain).await, m("b.c", 1, "plain"));
    assert_eq!(next(&mut accent).await, m("x", 1, "accent"));
    // Nothing else came: the next message each gets is its own.
    publish(a.bus.as_ref(), "a.b", "end", "").await;
    publish(a.bus.as_ref(), "a", "end", "").await;
    publish(a.bus.as_ref(), "é", "end", "").await;
    assert_eq!(next(&mut dotted).await, m("end", 1, ""));
    assert_eq!(next(&mut plain).await, m("end", 1, ""));
    assert_eq!(next(&mut accent).await, m("end", 1, ""));
    // The KV too.
    a.kv.put("a.b", "k", Bytes::from_static(b"1"), Expect::Absent)
        .await
        .unwrap();
    assert!(b.kv.get("a", "b.k").await.unwrap().is_none());
    assert!(b.kv.get("a.b", "k").await.unwrap().is_some());
    drop((dotted, plain, accent));
    stop(a, b, home).await;
}

#[tokio::test]
async fn an_unreachable_server_is_an_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("nats://127.0.0.1:{port}");
    let err = crate::bus::NatsBus::connect(
        &url,
        "x",
        &BusConfig::default(),
        Arc::new(crate::telemetry::Metrics::new()),
        Default::default(),
    )
    .await
    .err()
    .expect("no server there");
    assert!(matches!(err, crate::bus::BusError::Nats(_)), "{err}");
}

/// Two keys on one durable stream, one keeping large messages and one
/// tiny ones: each is charged its own bytes, whatever the other keeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_key_is_charged_its_own_kept_bytes() {
    let home = nats();
    let (a, b) = replicas(&home).await;
    let large = "x".repeat(10_000);
    for i in 0..20 {
        publish(
            a.bus.as_ref(),
            "big",
            &format!("agent.big{}", i % 3),
            &large,
        )
        .await;
    }
    for i in 0..200 {
        publish(
            b.bus.as_ref(),
            "tiny",
            &format!("agent.tiny{}", i % 7),
            "1234567890",
        )
        .await;
    }
    // Subjects of one key with different sizes.
    for _ in 0..10 {
        publish(a.bus.as_ref(), "mixed", "agent.small", "ab").await;
        publish(a.bus.as_ref(), "mixed", "agent.large", &large).await;
    }
    for (namespace, kept) in [("big", 200_000.0), ("tiny", 2_000.0), ("mixed", 100_020.0)] {
        for running in [&a, &b] {
            let measured = running.bus.kept_bytes(namespace).await.unwrap() as f64;
            assert!(
                (measured - kept).abs() <= kept * 0.05,
                "{namespace}: measured {measured}, kept {kept}"
            );
        }
    }
    assert_eq!(a.bus.kept_bytes("nobody").await.unwrap(), 0);
    stop(a, b, home).await;
}

/// Files in a real object store bucket, through two connections as two
/// replicas have them: one stores, the other reads it whole (past one
/// chunk), a file stored again is replaced, a deleted or absent one is
/// `None`, and deleting one twice is no error.
#[tokio::test]
async fn files_stored_by_one_connection_are_read_whole_by_another() {
    use crate::store::SharedFiles;
    use tokio::io::AsyncReadExt;

    let url = crate::bus::tests::nats_url();
    let bucket = format!("t{}", uuid::Uuid::new_v4().simple());
    let a = super::NatsFiles::connect(&url, &bucket).await.unwrap();
    let b = super::NatsFiles::connect(&url, &bucket).await.unwrap();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let stored = a
        .put("one", Box::new(std::io::Cursor::new(data.clone())))
        .await
        .unwrap();
    assert_eq!(stored, data.len() as u64);
    let read = async |name: &str| {
        let mut reader = b.get(name).await.unwrap()?;
        let mut bytes = Vec::new();
        reader.read_to_end(&mut bytes).await.unwrap();
        Some(bytes)
    };
    assert_eq!(read("one").await.unwrap(), data);
    assert!(read("never").await.is_none());
    a.put("one", Box::new(std::io::Cursor::new(b"short".to_vec())))
        .await
        .unwrap();
    assert_eq!(read("one").await.unwrap(), b"short");
    b.delete("one").await.unwrap();
    assert!(read("one").await.is_none(), "deleted");
    b.delete("one").await.unwrap();
    b.delete("never").await.unwrap();
    assert!(b.place().contains(&bucket));
    let client = async_nats::connect(&url).await.unwrap();
    async_nats::jetstream::new(client)
        .delete_object_store(&bucket)
        .await
        .unwrap();
}
