//! An event's way from `append` to a subscriber: in process (the embedded
//! log, subscriber on the appending log) against another replica through
//! NATS (two `NatsLogs` with a connection each over one store, subscriber
//! on the one that does not append).
//!
//! - latency: one event at a time, the next appended once the last one
//!   arrived; p50, p99 and max of append → delivery (the store's commit is
//!   on the way in both, since an event is sent only once durable);
//! - burst: 10,000 events appended at once; the time until the subscriber
//!   has the last.
//!
//! Needs a running nats-server: CONCLAVE_BENCH_NATS_URL, else
//! CONCLAVE_TEST_NATS (scripts/test.sh starts one). Runs on SQLite in a
//! temporary directory, and on PostgreSQL too when CONCLAVE_BENCH_POSTGRES
//! (else CONCLAVE_TEST_POSTGRES) names a database. Run with
//! `cargo bench --bench event_fanout`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use conclave::protocol::{EventKind, SessionKind, SessionRecord, SessionStatus, Usage};
use conclave::session::log::{EmbeddedLogs, EventLog, EventLogs, NatsLogs};
use conclave::store::{PostgresStore, SqliteStore, Store};
use conclave::telemetry::Metrics;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const WARMUP: usize = 200;
const SAMPLES: usize = 2_000;
const BURST: u64 = 10_000;

fn env_either(first: &str, second: &str) -> Option<String> {
    std::env::var(first).or_else(|_| std::env::var(second)).ok()
}

async fn new_session(store: &Arc<dyn Store>) -> Uuid {
    let now = Utc::now();
    let id = Uuid::new_v4();
    store
        .create_session(&SessionRecord {
            id,
            name: None,
            kind: SessionKind::named("bench"),
            owner: None,
            options: serde_json::json!({}),
            status: SessionStatus::Idle,
            usage: Usage::default(),
            ephemeral: false,
            origin: None,
            metadata: Default::default(),
            created_at: now,
            updated_at: now,
        })
        .await
        .unwrap();
    id
}

fn delta(n: u64) -> EventKind {
    EventKind::TextDelta {
        content: format!("word{n} "),
        reasoning: false,
    }
}

/// A writer's log and a reader's log of session `id`: the same log in
/// process, or two replicas' logs through NATS.
async fn pair(
    store: &Arc<dyn Store>,
    id: Uuid,
    nats: Option<&str>,
) -> (Arc<dyn EventLog>, Arc<dyn EventLog>) {
    let metrics = Arc::new(Metrics::new());
    match nats {
        None => {
            let logs = EmbeddedLogs {
                store: store.clone(),
                metrics,
            };
            let log = logs.open(id, 0, CancellationToken::new());
            (log.clone(), log)
        }
        Some(url) => {
            let replica = |client| NatsLogs::new(client, store.clone(), metrics.clone());
            let a = replica(async_nats::connect(url).await.unwrap());
            let b = replica(async_nats::connect(url).await.unwrap());
            (
                a.open(id, 0, CancellationToken::new()),
                b.open(id, 0, CancellationToken::new()),
            )
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// Append → delivery of one event at a time; then a burst.
async fn measure(store: &Arc<dyn Store>, nats: Option<&str>) -> (Vec<Duration>, Duration) {
    let id = new_session(store).await;
    let (writer, reader) = pair(store, id, nats).await;
    let mut events = reader.subscribe(0, false);
    let mut latencies = Vec::with_capacity(SAMPLES);
    let mut seq = 0;
    for n in 0..WARMUP + SAMPLES {
        let started = Instant::now();
        seq = writer.append(delta(n as u64), None).unwrap();
        let event = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("an event did not arrive in 10 s")
            .unwrap();
        assert_eq!(event.seq, seq);
        if n >= WARMUP {
            latencies.push(started.elapsed());
        }
    }
    let started = Instant::now();
    for n in 0..BURST {
        writer.append(delta(n), None).unwrap();
    }
    let last = seq + BURST;
    while let Some(event) = events.next().await {
        if event.seq == last {
            break;
        }
    }
    let burst = started.elapsed();
    // A shared database keeps no bench sessions.
    store.delete_session(id).await.unwrap();
    latencies.sort();
    (latencies, burst)
}

fn report(label: &str, latencies: &[Duration], burst: Duration) {
    println!(
        "{label:<34} p50 {:>8.3} ms  p99 {:>8.3} ms  max {:>8.3} ms  burst of {BURST}: {:>7.1} ms ({:.0} events/s)",
        percentile(latencies, 0.50).as_secs_f64() * 1e3,
        percentile(latencies, 0.99).as_secs_f64() * 1e3,
        latencies.last().unwrap().as_secs_f64() * 1e3,
        burst.as_secs_f64() * 1e3,
        BURST as f64 / burst.as_secs_f64(),
    );
}

#[tokio::main]
async fn main() -> ExitCode {
    let Some(nats) = env_either("CONCLAVE_BENCH_NATS_URL", "CONCLAVE_TEST_NATS") else {
        eprintln!(
            "event_fanout: set CONCLAVE_BENCH_NATS_URL (or CONCLAVE_TEST_NATS) to a running nats-server"
        );
        return ExitCode::FAILURE;
    };
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "event_fanout: {cores} cores, {SAMPLES} events one at a time after {WARMUP} warm-up, then a burst"
    );
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut stores: Vec<(&str, Arc<dyn Store>)> = vec![(
        "sqlite",
        Arc::new(SqliteStore::open(&dir.path().join("bench.db")).unwrap()),
    )];
    if let Some(url) = env_either("CONCLAVE_BENCH_POSTGRES", "CONCLAVE_TEST_POSTGRES") {
        stores.push((
            "postgres",
            Arc::new(PostgresStore::open(&url).await.unwrap()),
        ));
    }
    for (name, store) in &stores {
        let (latencies, burst) = measure(store, None).await;
        report(&format!("{name}, in process"), &latencies, burst);
        let (latencies, burst) = measure(store, Some(&nats)).await;
        report(
            &format!("{name}, other replica via NATS"),
            &latencies,
            burst,
        );
    }
    ExitCode::SUCCESS
}
