//! Appended events per second through `SqliteStore`, in rounds that each
//! open a fresh database in a temporary directory:
//!
//! - sequential: one task appends to one session and waits for each event to
//!   be durable before the next, as one agent turn does;
//! - concurrent: 64 tasks, one session each, append at once, as 64 busy
//!   sessions do; group commit puts their events in shared transactions.
//!
//! Every event alternates between a `text_delta` and a `tool_result` with a
//! few hundred bytes of output. The target (≥ 50,000 events/s concurrent) is
//! reported against, not asserted. Run with `cargo bench --bench store_append`.

use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use conclave::agent::events::{Event, EventKind, Usage};
use conclave::store::{SessionKind, SessionRecord, SessionStatus, SqliteStore, Store};
use serde_json::json;
use uuid::Uuid;

const SEQUENTIAL_EVENTS: u64 = 20_000;
const TASKS: usize = 64;
const EVENTS_PER_TASK: u64 = 4_000;
/// Each round runs in a fresh database; the median of the rounds is the
/// figure, so one disturbed round (a neighbour's build) does not make it.
const ROUNDS: usize = 3;
const TARGET_PER_SECOND: f64 = 50_000.0;

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    let cores = std::thread::available_parallelism()?;
    println!("store_append: {cores} cores, {ROUNDS} rounds, each in a fresh database");
    let mut sequential = Vec::with_capacity(ROUNDS);
    let mut concurrent = Vec::with_capacity(ROUNDS);
    for round in 1..=ROUNDS {
        let (one, many) = runtime.block_on(round_of_appends())?;
        println!("round {round}: sequential {one:.0} events/s, concurrent {many:.0} events/s");
        sequential.push(one);
        concurrent.push(many);
    }
    let concurrent = median(concurrent);
    println!(
        "median, sequential (1 task, 1 session): {:.0} events/s",
        median(sequential)
    );
    println!("median, concurrent ({TASKS} tasks over {TASKS} sessions): {concurrent:.0} events/s");
    println!(
        "target ≥ {TARGET_PER_SECOND:.0} events/s concurrent: {}",
        if concurrent >= TARGET_PER_SECOND {
            "met"
        } else {
            "NOT met"
        }
    );
    Ok(())
}

/// Events per second of the sequential and of the concurrent appenders.
async fn round_of_appends() -> anyhow::Result<(f64, f64)> {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(SqliteStore::open(&dir.path().join("conclave.db"))?);
    let mut sessions = Vec::with_capacity(TASKS);
    for _ in 0..TASKS {
        let session = session();
        store.create_session(&session).await?;
        sessions.push(session.id);
    }

    let started = Instant::now();
    for seq in 1..=SEQUENTIAL_EVENTS {
        store.append_event(&event(sessions[0], seq)).await?;
    }
    let sequential = SEQUENTIAL_EVENTS as f64 / started.elapsed().as_secs_f64();

    let started = Instant::now();
    let appenders: Vec<_> = sessions
        .iter()
        .map(|&id| {
            let store = Arc::clone(&store);
            // Continues after the sequential run's events in the first session.
            let first = if id == sessions[0] {
                SEQUENTIAL_EVENTS + 1
            } else {
                1
            };
            tokio::spawn(async move {
                for seq in first..first + EVENTS_PER_TASK {
                    store.append_event(&event(id, seq)).await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for appender in appenders {
        appender.await??;
    }
    let concurrent = (EVENTS_PER_TASK * TASKS as u64) as f64 / started.elapsed().as_secs_f64();

    store.close().await?;
    Ok((sequential, concurrent))
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
        kind: SessionKind::Agent,
        owner: None,
        options: json!({"model": "demo", "max_turns": 8}),
        status: SessionStatus::Running,
        usage: Usage::default(),
        ephemeral: false,
        created_at: now,
        updated_at: now,
    }
}

fn event(session_id: Uuid, seq: u64) -> Event {
    let kind = if seq % 2 == 1 {
        EventKind::TextDelta {
            content: "Let me look at the failing test first. ".into(),
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
    }
}
