//! Appended events per second through `SqliteStore`, in rounds that each
//! open a fresh database in a temporary directory, and through
//! `PostgresStore` too when `CONCLAVE_BENCH_POSTGRES` names a server (a
//! fresh database there per round, dropped after it):
//!
//! - sequential: one task appends to one session and waits for each event to
//!   be durable before the next, as one agent turn does;
//! - concurrent: 64 tasks, one session each, append at once, each waiting
//!   for its event to be durable before the next; group commit puts their
//!   events in shared transactions;
//! - session log: the way the server appends. 64 sessions of a real
//!   `SessionManager` each emit events as fast as a streaming turn can
//!   (yielding between two), and each session's writer task stores what
//!   has queued while its previous batch committed; the time runs until
//!   every event is stored (`flush`). Every event is still durable before
//!   any subscriber is sent it.
//!
//! Every event alternates between a `text_delta` and a `tool_result` with a
//! few hundred bytes of output. The target (≥ 50,000 events/s) is
//! reported against the session log, not asserted. Run with `cargo bench --bench store_append`.
//! PostgreSQL's figures come with their ratio to SQLite's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

/// The integration tests' fresh PostgreSQL databases, one per round here.
#[path = "../tests/common/postgres.rs"]
#[allow(dead_code)]
mod postgres_db;

use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use conclave::agent::TurnDeps;
use conclave::agent::{AgentTask, NoTools};
use conclave::config::Config;
use conclave::model::ModelRegistry;
use conclave::protocol::{Event, EventKind, SessionKind, SessionRecord, SessionStatus, Usage};
use conclave::session::{Limits, NewSession, SessionManager, Tasks};
use conclave::store::{PostgresStore, SqliteStore, Store};
use conclave::telemetry::Metrics;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use postgres_db::TestDatabase;

const SEQUENTIAL_EVENTS: u64 = 20_000;
const TASKS: usize = 64;
const EVENTS_PER_TASK: u64 = 4_000;
/// Each round runs in a fresh database; the median of the rounds is the
/// figure, so one disturbed round (a neighbour's build) does not make it.
const ROUNDS: usize = 3;
const TARGET_PER_SECOND: f64 = 50_000.0;

/// Where a round's fresh database lives.
enum Backend {
    Sqlite,
    /// The server's URL; each round makes a database of its own there.
    Postgres(String),
}

/// A fresh, empty store of `backend`, and what to drop after the round.
struct Fresh {
    store: Arc<dyn Store>,
    _dir: Option<tempfile::TempDir>,
    _database: Option<TestDatabase>,
}

impl Backend {
    fn name(&self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }

    async fn open(&self) -> anyhow::Result<Fresh> {
        match self {
            Backend::Sqlite => {
                let dir = tempfile::tempdir()?;
                let store = Arc::new(SqliteStore::open(&dir.path().join("conclave.db"))?);
                Ok(Fresh {
                    store,
                    _dir: Some(dir),
                    _database: None,
                })
            }
            Backend::Postgres(url) => {
                let database = TestDatabase::create(url).await;
                let store = PostgresStore::open_with(database.options()).await?;
                Ok(Fresh {
                    store: Arc::new(store),
                    _dir: None,
                    _database: Some(database),
                })
            }
        }
    }
}

impl Fresh {
    /// Closes the store, then drops its database or directory.
    async fn close(self) -> anyhow::Result<()> {
        self.store.close().await?;
        Ok(())
    }
}

/// The medians of one backend: sequential, concurrent, session log.
type Medians = (f64, f64, f64);

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    let cores = std::thread::available_parallelism()?;
    let mut backends = vec![Backend::Sqlite];
    if let Ok(url) = std::env::var("CONCLAVE_BENCH_POSTGRES") {
        backends.push(Backend::Postgres(url));
    }
    println!("store_append: {cores} cores, {ROUNDS} rounds, each in a fresh database");
    let mut medians = Vec::with_capacity(backends.len());
    for backend in &backends {
        medians.push(runtime.block_on(measure(backend))?);
    }
    let (_, _, logged) = medians[0];
    println!(
        "target ≥ {TARGET_PER_SECOND:.0} events/s through the session log on SQLite: {}",
        if logged >= TARGET_PER_SECOND {
            "met"
        } else {
            "NOT met"
        }
    );
    if let [(one, many, log), (pg_one, pg_many, pg_log)] = medians[..] {
        println!(
            "postgres / sqlite: sequential {:.2}, concurrent {:.2}, session log {:.2}",
            pg_one / one,
            pg_many / many,
            pg_log / log
        );
    }
    Ok(())
}

/// Runs the rounds on `backend` and prints each and their medians.
async fn measure(backend: &Backend) -> anyhow::Result<Medians> {
    let name = backend.name();
    let mut sequential = Vec::with_capacity(ROUNDS);
    let mut concurrent = Vec::with_capacity(ROUNDS);
    let mut logged = Vec::with_capacity(ROUNDS);
    for round in 1..=ROUNDS {
        let fresh = backend.open().await?;
        let (one, many) = round_of_appends(&fresh.store).await?;
        fresh.close().await?;
        let fresh = backend.open().await?;
        let log = round_through_session_logs(&fresh.store).await?;
        fresh.close().await?;
        println!(
            "{name} round {round}: sequential {one:.0} events/s, concurrent {many:.0} events/s, session log {log:.0} events/s"
        );
        sequential.push(one);
        concurrent.push(many);
        logged.push(log);
    }
    let medians = (median(sequential), median(concurrent), median(logged));
    println!(
        "{name} median, sequential (1 task, 1 session): {:.0} events/s",
        medians.0
    );
    println!(
        "{name} median, concurrent ({TASKS} tasks over {TASKS} sessions): {:.0} events/s",
        medians.1
    );
    println!(
        "{name} median, session log ({TASKS} sessions, as the server appends): {:.0} events/s",
        medians.2
    );
    Ok(medians)
}

/// Events per second of the sequential and of the concurrent appenders.
async fn round_of_appends(store: &Arc<dyn Store>) -> anyhow::Result<(f64, f64)> {
    let mut sessions = Vec::with_capacity(TASKS);
    for _ in 0..TASKS {
        let session = session();
        store.create_session(&session).await?;
        sessions.push(session.id);
    }

    let started = Instant::now();
    for seq in 1..=SEQUENTIAL_EVENTS {
        store.append_events(&[event(sessions[0], seq)]).await?;
    }
    let sequential = SEQUENTIAL_EVENTS as f64 / started.elapsed().as_secs_f64();

    let started = Instant::now();
    let appenders: Vec<_> = sessions
        .iter()
        .map(|&id| {
            let store = Arc::clone(store);
            // Continues after the sequential run's events in the first session.
            let first = if id == sessions[0] {
                SEQUENTIAL_EVENTS + 1
            } else {
                1
            };
            tokio::spawn(async move {
                for seq in first..first + EVENTS_PER_TASK {
                    store.append_events(&[event(id, seq)]).await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for appender in appenders {
        appender.await??;
    }
    let concurrent = (EVENTS_PER_TASK * TASKS as u64) as f64 / started.elapsed().as_secs_f64();
    Ok((sequential, concurrent))
}

/// Events per second through the sessions' own logs, as the server appends.
async fn round_through_session_logs(store: &Arc<dyn Store>) -> anyhow::Result<f64> {
    let config = Config::default();
    let metrics = Arc::new(Metrics::new());
    let agent = AgentTask::new(
        TurnDeps {
            store: store.clone(),
            models: Arc::new(ModelRegistry::from_config(&config)?),
            tools: Arc::new(NoTools),
            config: config.agent.clone(),
            metrics: metrics.clone(),
            approvals: Arc::new(conclave::session::approvals::Approvals::new(
                store.clone(),
                None,
            )),
            hooks: Arc::new(conclave::agent::hook::Hooks::new(&[])),
            usage: Arc::new(conclave::usage::Recorder::new(
                store.clone(),
                Arc::new(conclave::quota::KeyTable::new(&config)),
                &metrics,
            )),
        },
        config.mcp.clone(),
    );
    let manager = SessionManager::new(
        store.clone(),
        Tasks::new().with(Arc::new(agent)),
        Limits {
            turn_timeout: std::time::Duration::from_secs(config.agent.turn_timeout_s),
            ephemeral_retention: std::time::Duration::ZERO,
        },
        metrics,
        CancellationToken::new(),
    );
    let mut sessions = Vec::with_capacity(TASKS);
    for _ in 0..TASKS {
        sessions.push(
            manager
                .create(NewSession {
                    name: None,
                    kind: SessionKind::AGENT,
                    owner: None,
                    options: serde_json::json!({}),
                    ephemeral: false,
                    origin: None,
                    metadata: Default::default(),
                })
                .await?,
        );
    }
    let started = Instant::now();
    let emitters: Vec<_> = sessions
        .into_iter()
        .map(|session| {
            tokio::spawn(async move {
                for seq in 1..=EVENTS_PER_TASK {
                    session.emit(event(session.id, seq).kind)?;
                    tokio::task::yield_now().await;
                }
                session.flush().await?;
                anyhow::Ok(())
            })
        })
        .collect();
    for emitter in emitters {
        emitter.await??;
    }
    Ok((EVENTS_PER_TASK * TASKS as u64) as f64 / started.elapsed().as_secs_f64())
}

fn median(mut rates: Vec<f64>) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

fn session() -> SessionRecord {
    let now = Utc::now();
    SessionRecord {
        id: Uuid::new_v4(),
        name: None,
        kind: SessionKind::AGENT,
        owner: None,
        options: json!({"model": "demo", "max_turns": 8}),
        status: SessionStatus::Running,
        usage: Usage::default(),
        ephemeral: false,
        origin: None,
        metadata: Default::default(),
        created_at: now,
        updated_at: now,
    }
}

fn event(session_id: Uuid, seq: u64) -> Event {
    let kind = if seq % 2 == 1 {
        EventKind::TextDelta {
            content: "Let me look at the failing test first. ".into(),
            reasoning: false,
        }
    } else {
        EventKind::ToolResult {
            id: format!("call_{seq}"),
            tool: "bash".into(),
            output: json!({
                "stdout": "running 12 tests\n".to_owned()
                    + &"test store::sqlite::tests::some_case ... ok\n".repeat(7),
                "stderr": "",
                "exit_code": 0,
            }),
            is_error: false,
        }
    };
    Event {
        kind,
        session_id,
        seq,
        ts: Utc::now(),
        agent_id: None,
    }
}
