//! Tests of the embedded bus and the KV against a real SQLite store.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::*;
use crate::store::{Expect, KvWrite, SqliteStore, Store};
use crate::telemetry::Metrics;

struct Running {
    bus: EmbeddedBus,
    store: Arc<dyn Store>,
    tasks: TaskTracker,
    stop: CancellationToken,
}

impl Running {
    /// Stops the writer (it stores what it holds) and closes the store.
    async fn stop(self) {
        self.stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        self.store.close().await.unwrap();
    }
}

async fn start(dir: &tempfile::TempDir, config: BusConfig) -> Running {
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(&dir.path().join("conclave.db")).unwrap());
    let tasks = TaskTracker::new();
    let stop = CancellationToken::new();
    let bus = EmbeddedBus::start(
        store.clone(),
        &config,
        Arc::new(Metrics::new()),
        &tasks,
        stop.clone(),
    )
    .await
    .unwrap();
    Running {
        bus,
        store,
        tasks,
        stop,
    }
}

fn subject(s: &str) -> Subject {
    Subject::parse(s).unwrap()
}

async fn publish(bus: &EmbeddedBus, ns: &str, s: &str, payload: &str) -> u64 {
    bus.publish(ns, &subject(s), Bytes::from(payload.to_owned()))
        .await
        .unwrap()
}

async fn sub(
    bus: &EmbeddedBus,
    ns: &str,
    patterns: &str,
    since: Since,
) -> BoxStream<'static, Delivery> {
    bus.subscribe(ns, Pattern::parse_list(patterns).unwrap(), since)
        .await
        .unwrap()
}

/// The next delivery as `(subject, seq, payload)`, or the lag as
/// `("lagged:SUBJECT", since, missed)`.
async fn next(stream: &mut BoxStream<'static, Delivery>) -> (String, u64, String) {
    let delivery = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("a delivery within 10 s")
        .expect("the stream goes on");
    match delivery {
        Delivery::Message(m) => (
            m.subject.as_str().to_owned(),
            m.seq,
            String::from_utf8(m.payload.to_vec()).unwrap(),
        ),
        Delivery::Lagged {
            subject,
            since,
            missed,
        } => (format!("lagged:{subject}"), since, missed.to_string()),
    }
}

fn m(subject: &str, seq: u64, payload: &str) -> (String, u64, String) {
    (subject.to_owned(), seq, payload.to_owned())
}

#[tokio::test]
async fn subscribers_get_matching_subjects_in_order_with_a_seq_per_subject() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(&dir, BusConfig::default()).await;
    let bus = &running.bus;
    let mut results = sub(bus, "t", "inference.results.*", Since::New).await;
    let mut sync = sub(bus, "t", "sync/>", Since::New).await;
    assert_eq!(publish(bus, "t", "inference/results/shared", "1").await, 1);
    assert_eq!(publish(bus, "t", "sync/weights_ready", "v1").await, 1);
    assert_eq!(publish(bus, "t", "inference.results.shared", "2").await, 2);
    assert_eq!(publish(bus, "t", "inference.results.other", "x").await, 1);
    assert_eq!(
        publish(bus, "t", "inference.results.shared.deep", "no").await,
        1
    );
    assert_eq!(
        next(&mut results).await,
        m("inference/results/shared", 1, "1")
    );
    assert_eq!(
        next(&mut results).await,
        m("inference.results.shared", 2, "2")
    );
    assert_eq!(
        next(&mut results).await,
        m("inference.results.other", 1, "x")
    );
    assert_eq!(next(&mut sync).await, m("sync/weights_ready", 1, "v1"));
    // Another tenant's subjects are its own, seq included.
    let mut other = sub(bus, "u", ">", Since::Seq(0)).await;
    assert_eq!(publish(bus, "u", "sync.weights_ready", "u1").await, 1);
    assert_eq!(next(&mut other).await, m("sync.weights_ready", 1, "u1"));
    assert_eq!(publish(bus, "t", "sync.weights_ready", "v2").await, 2);
    assert_eq!(next(&mut sync).await, m("sync.weights_ready", 2, "v2"));
    assert!(
        tokio::time::timeout(Duration::from_millis(50), other.next())
            .await
            .is_err(),
        "tenant u saw tenant t's message"
    );
    drop((results, sync, other));
    running.stop().await;
}

#[tokio::test]
async fn durable_subjects_replay_from_a_seq_and_a_time_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(&dir, BusConfig::default()).await;
    for i in 1..=5 {
        publish(
            &running.bus,
            "t",
            "agent.response.completed",
            &i.to_string(),
        )
        .await;
    }
    publish(&running.bus, "t", "chatter.x", "not kept").await;
    let middle = chrono::Utc::now();
    publish(&running.bus, "t", "agent/response/failed", "f1").await;
    running.stop().await;

    let running = start(&dir, BusConfig::default()).await;
    let bus = &running.bus;
    let mut from_seq = sub(bus, "t", "agent.>,chatter.>", Since::Seq(3)).await;
    assert_eq!(
        next(&mut from_seq).await,
        m("agent.response.completed", 4, "4")
    );
    assert_eq!(
        next(&mut from_seq).await,
        m("agent.response.completed", 5, "5")
    );
    // Numbering goes on after the restart; the replay hands over to live
    // messages without a gap or a repeat.
    assert_eq!(publish(bus, "t", "agent.response.completed", "6").await, 6);
    assert_eq!(
        next(&mut from_seq).await,
        m("agent.response.completed", 6, "6")
    );
    let mut from_time = sub(bus, "t", "agent.response.*", Since::Time(middle)).await;
    assert_eq!(
        next(&mut from_time).await,
        m("agent/response/failed", 1, "f1")
    );
    assert_eq!(
        next(&mut from_time).await,
        m("agent.response.completed", 6, "6")
    );
    let mut everything = sub(bus, "t", "agent.response.completed", Since::Seq(0)).await;
    for i in 1..=6 {
        assert_eq!(next(&mut everything).await.1, i);
    }
    drop((from_seq, from_time, everything));
    running.stop().await;
}

#[tokio::test]
async fn a_lagging_subscriber_is_told_what_it_missed_and_never_slows_the_publisher() {
    let dir = tempfile::tempdir().unwrap();
    let config = BusConfig {
        subscriber_buffer: 4,
        ..BusConfig::default()
    };
    let running = start(&dir, config).await;
    let bus = &running.bus;
    let mut slow = sub(bus, "t", "chatter.>,agent.>", Since::New).await;
    // Nobody reads meanwhile; every publish answers at once.
    for i in 1..=10 {
        publish(bus, "t", "chatter.x", &i.to_string()).await;
    }
    for i in 1..=4 {
        assert_eq!(next(&mut slow).await, m("chatter.x", i, &i.to_string()));
    }
    // Six were dropped after seq 4: the subscriber learns it, then goes on.
    assert_eq!(next(&mut slow).await, m("lagged:chatter.x", 4, "6"));
    publish(bus, "t", "chatter.x", "11").await;
    assert_eq!(next(&mut slow).await, m("chatter.x", 11, "11"));
    // On a durable subject it catches up from the store, in order.
    for i in 1..=50 {
        publish(bus, "t", "agent.response.completed", &i.to_string()).await;
    }
    for i in 1..=50 {
        assert_eq!(next(&mut slow).await.1, i);
    }
    publish(bus, "t", "agent.response.completed", "51").await;
    assert_eq!(next(&mut slow).await.1, 51);
    drop(slow);
    running.stop().await;
}

#[tokio::test]
async fn retention_keeps_the_last_messages_of_a_subject() {
    let dir = tempfile::tempdir().unwrap();
    let config = BusConfig {
        durable: vec![Durable {
            pattern: "kept.>".into(),
            max_messages: 3,
            max_age_s: 0,
        }],
        ..BusConfig::default()
    };
    let running = start(&dir, config).await;
    let bus = &running.bus;
    for i in 1..=8 {
        publish(bus, "t", "kept.a", &i.to_string()).await;
    }
    bus.flush().await.unwrap();
    let mut all = sub(bus, "t", "kept.a", Since::Seq(0)).await;
    for i in 6..=8 {
        assert_eq!(next(&mut all).await.1, i);
    }
    drop(all);
    running.stop().await;
}

#[tokio::test]
async fn oversized_payloads_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = BusConfig {
        max_payload_bytes: 8,
        ..BusConfig::default()
    };
    let running = start(&dir, config).await;
    let err = running
        .bus
        .publish("t", &subject("a"), Bytes::from_static(b"123456789"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, BusError::TooLarge { size: 9, max: 8 }),
        "{err}"
    );
    running.stop().await;
}

#[tokio::test]
async fn kv_waits_for_a_key_and_compares_revisions() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(&dir.path().join("conclave.db")).unwrap());
    let kv = Arc::new(Kv::new(store, 1024));
    // A missing key, waited for in vain.
    let none = kv
        .wait(
            "t",
            "inference_response_topic",
            None,
            Duration::from_millis(50),
        )
        .await
        .unwrap();
    assert!(none.is_none());
    // Waited for while another task writes it.
    let waiter = {
        let kv = kv.clone();
        tokio::spawn(async move {
            kv.wait(
                "t",
                "inference_response_topic",
                None,
                Duration::from_secs(10),
            )
            .await
        })
    };
    let mut watch = Box::pin(kv.watch("t", "inference_"));
    tokio::task::yield_now().await;
    let put = kv
        .put(
            "t",
            "inference_response_topic",
            Bytes::from_static(b"\"r\""),
            Expect::Absent,
        )
        .await
        .unwrap();
    let KvWrite::Done(revision) = put else {
        panic!("{put:?}")
    };
    let found = waiter.await.unwrap().unwrap().unwrap();
    assert_eq!(
        (found.value.as_slice(), found.revision),
        (&b"\"r\""[..], revision)
    );
    let change = watch.next().await.unwrap();
    assert_eq!(
        (change.key.as_str(), change.revision),
        ("inference_response_topic", revision)
    );
    // Compare-and-set: a stale revision is refused with the current one.
    let stale = kv
        .put(
            "t",
            "inference_response_topic",
            Bytes::from_static(b"1"),
            Expect::Revision(revision + 7),
        )
        .await
        .unwrap();
    assert_eq!(
        stale,
        KvWrite::Conflict {
            current: Some(revision)
        }
    );
    // A wait for a change after `revision` ends with the next write.
    let changed = {
        let kv = kv.clone();
        tokio::spawn(async move {
            kv.wait(
                "t",
                "inference_response_topic",
                Some(revision),
                Duration::from_secs(10),
            )
            .await
        })
    };
    tokio::task::yield_now().await;
    kv.put(
        "u",
        "inference_response_topic",
        Bytes::from_static(b"2"),
        Expect::Any,
    )
    .await
    .unwrap();
    kv.put(
        "t",
        "inference_response_topic",
        Bytes::from_static(b"3"),
        Expect::Revision(revision),
    )
    .await
    .unwrap();
    let changed = changed.await.unwrap().unwrap().unwrap();
    assert_eq!(changed.value, b"3");
    // Unchanged until the timeout: the current value comes back.
    let same = kv
        .wait(
            "t",
            "inference_response_topic",
            Some(changed.revision),
            Duration::from_millis(50),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(same.revision, changed.revision);
    // The watcher saw t's writes only.
    assert_eq!(
        watch.next().await.unwrap().value.as_deref(),
        Some(&b"3"[..])
    );
    assert!(kv.delete("t", "nope", Expect::Any).await.unwrap().is_none());
    assert!(matches!(
        kv.get("t", "").await,
        Err(kv::KvError::BadKey { .. })
    ));
}
