//! The bus and the KV against a real SQLite store: one suite, run on the
//! embedded bus and on NATS JetStream.

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

/// Where a test's bus lives: a data directory and, on NATS, subjects and
/// streams of its own.
pub(super) struct Home {
    pub dir: tempfile::TempDir,
    /// The NATS URL and the test's prefix; `None` on the embedded bus.
    pub nats: Option<(String, String)>,
}

fn embedded() -> Home {
    Home {
        dir: tempfile::tempdir().unwrap(),
        nats: None,
    }
}

/// The NATS server of the tests, from `CONCLAVE_TEST_NATS`.
pub(super) fn nats_url() -> String {
    std::env::var("CONCLAVE_TEST_NATS").unwrap_or_else(|_| {
        panic!(
            "CONCLAVE_TEST_NATS is not set: the bus tests need a NATS server with \
             JetStream (scripts/test.sh starts one and sets it)"
        )
    })
}

pub(super) fn nats() -> Home {
    let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
    Home {
        dir: tempfile::tempdir().unwrap(),
        nats: Some((nats_url(), prefix)),
    }
}

impl Home {
    /// Removes the test's streams from the NATS server.
    pub async fn clean(self) {
        let Some((url, prefix)) = &self.nats else {
            return;
        };
        let client = async_nats::connect(url.as_str()).await.unwrap();
        let jetstream = async_nats::jetstream::new(client);
        let names: Vec<String> = jetstream.stream_names().map(|n| n.unwrap()).collect().await;
        for name in names.iter().filter(|n| n.starts_with(prefix.as_str())) {
            jetstream.delete_stream(name).await.unwrap();
        }
    }
}

pub(super) struct Running {
    pub bus: Arc<dyn Bus>,
    pub kv: Arc<Kv>,
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    tasks: TaskTracker,
    stop: CancellationToken,
}

impl Running {
    /// Stops the bus (the embedded one stores what it holds) and closes
    /// the store.
    pub async fn stop(self) {
        self.stop_bus().await;
        self.store.close().await.unwrap();
    }

    /// Stops the bus, leaving the store open (for another replica on it).
    pub async fn stop_bus(&self) {
        self.stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

pub(super) async fn start(home: &Home, config: BusConfig) -> Running {
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(&home.dir.path().join("conclave.db")).unwrap());
    start_on(home, config, store).await
}

/// A bus on `store`: two on one store and one NATS are two replicas.
pub(super) async fn start_on(home: &Home, config: BusConfig, store: Arc<dyn Store>) -> Running {
    let tasks = TaskTracker::new();
    let stop = CancellationToken::new();
    let metrics = Arc::new(Metrics::new());
    let (bus, kv): (Arc<dyn Bus>, Arc<Kv>) = match &home.nats {
        None => {
            let bus = EmbeddedBus::start(
                store.clone(),
                &config,
                metrics.clone(),
                &tasks,
                stop.clone(),
            )
            .await
            .unwrap();
            (Arc::new(bus), Arc::new(Kv::new(store.clone(), 1024)))
        }
        Some((url, prefix)) => {
            let bus = NatsBus::connect(url, prefix, &config, metrics.clone(), stop.clone())
                .await
                .unwrap();
            let kv = bus.kv(store.clone(), 1024, None, &tasks).await.unwrap();
            (Arc::new(bus), kv)
        }
    };
    Running {
        bus,
        kv,
        store,
        metrics,
        tasks,
        stop,
    }
}

fn subject(s: &str) -> Subject {
    Subject::parse(s).unwrap()
}

pub(super) async fn publish(bus: &dyn Bus, ns: &str, s: &str, payload: &str) -> u64 {
    bus.publish(ns, &subject(s), Bytes::from(payload.to_owned()))
        .await
        .unwrap()
}

pub(super) async fn sub(
    bus: &dyn Bus,
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
pub(super) async fn next(stream: &mut BoxStream<'static, Delivery>) -> (String, u64, String) {
    // Generous: the suite shares two cores and one NATS server.
    let delivery = tokio::time::timeout(Duration::from_secs(30), stream.next())
        .await
        .expect("a delivery within 30 s")
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

pub(super) fn m(subject: &str, seq: u64, payload: &str) -> (String, u64, String) {
    (subject.to_owned(), seq, payload.to_owned())
}

macro_rules! suite {
    ($backend:ident: $($test:ident),* $(,)?) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(super::$backend()).await;
                }
            )*
        }
    };
}

suite!(embedded:
    subscribers_get_matching_subjects_in_order_with_a_seq_per_subject,
    durable_subjects_replay_from_a_seq_and_a_time_after_a_restart,
    a_lagging_subscriber_is_told_what_it_missed_and_never_slows_the_publisher,
    retention_keeps_the_last_messages_of_a_subject,
    oversized_payloads_are_refused,
    kv_waits_for_a_key_and_compares_revisions,
);

suite!(nats:
    subscribers_get_matching_subjects_in_order_with_a_seq_per_subject,
    durable_subjects_replay_from_a_seq_and_a_time_after_a_restart,
    a_lagging_subscriber_is_told_what_it_missed_and_never_slows_the_publisher,
    retention_keeps_the_last_messages_of_a_subject,
    oversized_payloads_are_refused,
    kv_waits_for_a_key_and_compares_revisions,
);

async fn subscribers_get_matching_subjects_in_order_with_a_seq_per_subject(home: Home) {
    let running = start(&home, BusConfig::default()).await;
    let bus = running.bus.as_ref();
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
    home.clean().await;
}

async fn durable_subjects_replay_from_a_seq_and_a_time_after_a_restart(home: Home) {
    let running = start(&home, BusConfig::default()).await;
    for i in 1..=5 {
        publish(
            running.bus.as_ref(),
            "t",
            "agent.response.completed",
            &i.to_string(),
        )
        .await;
    }
    publish(running.bus.as_ref(), "t", "chatter.x", "not kept").await;
    let middle = chrono::Utc::now();
    publish(running.bus.as_ref(), "t", "agent/response/failed", "f1").await;
    running.stop().await;

    let running = start(&home, BusConfig::default()).await;
    let bus = running.bus.as_ref();
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
    home.clean().await;
}

async fn a_lagging_subscriber_is_told_what_it_missed_and_never_slows_the_publisher(home: Home) {
    let config = BusConfig {
        subscriber_buffer: 4,
        ..BusConfig::default()
    };
    let running = start(&home, config).await;
    let bus = running.bus.as_ref();
    let mut slow = sub(bus, "t", "chatter.>,agent.>", Since::New).await;
    // Nobody reads meanwhile; every publish answers at once.
    for i in 1..=10 {
        publish(bus, "t", "chatter.x", &i.to_string()).await;
    }
    // On NATS a message reaches the subscription a moment after it is
    // published: under load, read too soon, the queue would still have
    // room for the later ones.
    let lagged = || -> u64 {
        let rendered = running.metrics.render();
        rendered
            .lines()
            .filter(|l| l.starts_with("conclave_bus_lagged_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while lagged() < 6 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "after 30 s, {} of the 6 dropped are counted",
            lagged()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The queue held four; the rest were dropped, and the subscriber learns
    // it before anything later, then goes on. On NATS the exact split can
    // differ: a message that arrives once the subscriber has read may be
    // queued after the notice, and a consumer NATS recreated (a reconnect,
    // a missed heartbeat) starts after what the stream no longer holds, a
    // gap told like the rest. What holds on both: every `seq` arrives in
    // order or is told missed, exactly once, and no more than four come
    // before the first notice.
    let mut told = Vec::new();
    while !told
        .last()
        .is_some_and(|(subject, _, _): &(String, u64, String)| subject.starts_with("lagged:"))
    {
        told.push(next(&mut slow).await);
        assert!(
            told.len() <= 5,
            "more than the queue held came first: {told:?}"
        );
    }
    publish(bus, "t", "chatter.x", "11").await;
    while told.last().unwrap().1 != 11 {
        told.push(next(&mut slow).await);
    }
    let mut last = 0;
    let mut missed = 0;
    for (subject, seq, payload) in &told {
        if subject.starts_with("lagged:") {
            assert_eq!(subject, "lagged:chatter.x", "{told:?}");
            assert_eq!(
                *seq, last,
                "a notice starts where delivery stopped: {told:?}"
            );
            let count = payload.parse::<u64>().unwrap();
            missed += count;
            last += count;
        } else {
            assert_eq!(*seq, last + 1, "{told:?}");
            assert_eq!(*payload, seq.to_string(), "{told:?}");
            last = *seq;
        }
    }
    assert_eq!(last, 11, "{told:?}");
    assert!(missed >= 6, "{told:?}");
    if home.nats.is_none() {
        let queued: Vec<_> = (1..=4).map(|i| m("chatter.x", i, &i.to_string())).collect();
        assert_eq!(told[..4], queued);
        assert_eq!(
            told[4..],
            [m("lagged:chatter.x", 4, "6"), m("chatter.x", 11, "11")]
        );
    }
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
    home.clean().await;
}

async fn retention_keeps_the_last_messages_of_a_subject(home: Home) {
    let config = BusConfig {
        durable: vec![Durable {
            pattern: "kept.>".into(),
            max_messages: 3,
            max_age_s: 0,
        }],
        ..BusConfig::default()
    };
    let running = start(&home, config).await;
    let bus = running.bus.as_ref();
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
    home.clean().await;
}

async fn oversized_payloads_are_refused(home: Home) {
    let config = BusConfig {
        max_payload_bytes: 8,
        ..BusConfig::default()
    };
    let running = start(&home, config).await;
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
    home.clean().await;
}

async fn kv_waits_for_a_key_and_compares_revisions(home: Home) {
    let running = start(&home, BusConfig::default()).await;
    let kv = running.kv.clone();
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
    drop(watch);
    running.stop().await;
    home.clean().await;
}
