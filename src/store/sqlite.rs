//! The embedded store: one SQLite file in the data directory.
//!
//! All database work runs on one writer thread that owns the connection.
//! Callers send it jobs over a bounded channel; it blocks for the first job,
//! takes whatever else is already queued, runs the lot in one transaction
//! and answers each caller only after the commit (group commit). With WAL
//! and `synchronous=NORMAL` a committed transaction survives the death of
//! the process, so an event whose `append_events` returned is never lost to
//! a crash, and one commit per batch instead of one per event is what makes
//! that affordable.
//!
//! A failing job answers its own caller with an error and leaves the rest
//! of its batch untouched: a failed statement undoes itself, and a job of
//! several writes runs inside a savepoint. Rows are encoded before they are
//! sent and decoded after the answer, on the callers' threads, to keep the
//! single writer busy with SQL only.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::Connection;
use rusqlite_migration::{M, Migrations};
use tokio::sync::{mpsc, oneshot};

use super::{Store, StoreError};

/// The most jobs one transaction takes, which bounds how long the first
/// caller of a batch waits behind the others.
const MAX_BATCH: usize = 4096;
/// Jobs that may wait for the writer before senders wait too.
const QUEUE_DEPTH: usize = 2 * MAX_BATCH;
/// How long a statement waits for a lock held by another process, such as
/// a backup or the `sqlite3` shell.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the checkpointer copies the WAL back into the database (more
/// often costs the writer more I/O contention: 1 s gave a p99 of 18 ms). The
/// writer never does the bulk of a checkpoint itself: a checkpoint on its
/// thread (SQLite's default, every 1,000 pages) stalled every caller waiting
/// on a commit for tens of milliseconds, which was the whole p99 of a run's
/// first event.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(10);
/// Room for every distinct statement of this file, so none is re-prepared.
const STATEMENT_CACHE: usize = 64;

/// The schema, one entry per version; a released entry is never edited.
const MIGRATION_STEPS: &[M<'static>] = &[
    M::up(
        "CREATE TABLE sessions (
        id TEXT PRIMARY KEY NOT NULL,
        name TEXT,
        kind TEXT NOT NULL,
        owner TEXT,
        options TEXT NOT NULL,
        status TEXT NOT NULL,
        usage TEXT NOT NULL,
        ephemeral INTEGER NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    ) STRICT;
    CREATE INDEX sessions_by_owner ON sessions (owner, created_at);
    CREATE INDEX sessions_by_status ON sessions (status);
    CREATE TABLE messages (
        session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        idx INTEGER NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (session_id, idx)
    ) STRICT;
    CREATE TABLE events (
        session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        type TEXT NOT NULL,
        ts TEXT NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (session_id, seq)
    ) STRICT;",
    ),
    // Listings of every owner page by creation; the retention finds expired
    // ephemeral sessions without a scan.
    M::up(
        "CREATE INDEX sessions_by_created ON sessions (created_at);
         CREATE INDEX sessions_ephemeral ON sessions (ephemeral, status, updated_at);",
    ),
    // The KV of the bus, with a revision counter per namespace, and the
    // checkpoints of a session's runs.
    M::up(
        "CREATE TABLE kv (
        namespace TEXT NOT NULL,
        key TEXT NOT NULL,
        value BLOB NOT NULL,
        revision INTEGER NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (namespace, key)
    ) STRICT;
    CREATE TABLE kv_revisions (
        namespace TEXT PRIMARY KEY NOT NULL,
        revision INTEGER NOT NULL
    ) STRICT;
    CREATE TABLE checkpoints (
        session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        step INTEGER NOT NULL,
        name TEXT NOT NULL,
        state TEXT NOT NULL,
        created_at TEXT NOT NULL,
        PRIMARY KEY (session_id, step)
    ) STRICT;",
    ),
    // The retained messages of durable bus subjects. AUTOINCREMENT: a
    // position is never reused after a prune, so a reader's cursor holds.
    M::up(
        "CREATE TABLE bus_messages (
        position INTEGER PRIMARY KEY AUTOINCREMENT,
        namespace TEXT NOT NULL,
        stream TEXT NOT NULL,
        subject TEXT NOT NULL,
        seq INTEGER NOT NULL,
        time_us INTEGER NOT NULL,
        payload BLOB NOT NULL,
        UNIQUE (namespace, stream, seq)
    ) STRICT;
    CREATE INDEX bus_by_namespace ON bus_messages (namespace, position);
    CREATE INDEX bus_by_time ON bus_messages (namespace, time_us);
    CREATE TABLE bus_streams (
        namespace TEXT NOT NULL,
        stream TEXT NOT NULL,
        last_seq INTEGER NOT NULL,
        PRIMARY KEY (namespace, stream)
    ) STRICT;",
    ),
    // Leases, one holder at a time per name.
    M::up(
        "CREATE TABLE leases (
        name TEXT PRIMARY KEY NOT NULL,
        holder TEXT NOT NULL,
        expires_us INTEGER NOT NULL,
        fence INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX leases_by_expiry ON leases (expires_us);",
    ),
    // Per-key quotas shared by the processes on this file: a row per
    // sandbox or turn held (renewed by its replica, so a dead one's
    // expire), and a counter per key and minute.
    M::up(
        "CREATE TABLE quota_slots (
        pool TEXT NOT NULL,
        holder TEXT NOT NULL,
        replica TEXT NOT NULL,
        expires_us INTEGER NOT NULL,
        PRIMARY KEY (pool, holder)
    ) STRICT;
    CREATE INDEX quota_slots_by_replica ON quota_slots (replica);
    CREATE TABLE quota_windows (
        name TEXT PRIMARY KEY NOT NULL,
        started INTEGER NOT NULL,
        count INTEGER NOT NULL
    ) STRICT;",
    ),
    // Usage per key, UTC day and model.
    M::up(
        "CREATE TABLE key_usage (
        owner TEXT NOT NULL,
        day TEXT NOT NULL,
        model TEXT NOT NULL,
        input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        cost_usd REAL NOT NULL,
        turns INTEGER NOT NULL,
        tool_calls INTEGER NOT NULL,
        sandbox_cpu_s REAL NOT NULL,
        sandbox_wall_s REAL NOT NULL,
        PRIMARY KEY (owner, day, model)
    ) STRICT;
    CREATE INDEX key_usage_by_day ON key_usage (day);",
    ),
    // The retention's index on a column no write after the first changes:
    // a write of a session's usage and `updated_at` (every batch of a
    // turn) then updates no index at all.
    M::up(
        "DROP INDEX sessions_ephemeral;
    CREATE INDEX sessions_ephemeral ON sessions (created_at) WHERE ephemeral = 1;",
    ),
    // The bytes of a session's events, counted in its key's `storage_mb`
    // without reading its log: added to with each batch, gone with the
    // session.
    M::up(
        "ALTER TABLE sessions ADD COLUMN event_bytes INTEGER NOT NULL DEFAULT 0;
    UPDATE sessions SET event_bytes =
        (SELECT coalesce(sum(length(body)), 0) FROM events WHERE session_id = sessions.id);",
    ),
    // The protocol adapter that made a session (NULL: none) and a
    // client's own labels on it.
    M::up(
        "ALTER TABLE sessions ADD COLUMN origin TEXT;
    ALTER TABLE sessions ADD COLUMN metadata TEXT NOT NULL DEFAULT '{}';",
    ),
];
const MIGRATIONS: Migrations<'static> = Migrations::from_slice(MIGRATION_STEPS);

/// The columns of `sessions` in the order [`SessionRow::read`] expects.
macro_rules! session_columns {
    () => {
        "id, name, kind, owner, options, status, usage, ephemeral, created_at, updated_at, origin, \
         metadata"
    };
}

mod bus;
mod checkpoints;
mod events;
mod kv;
mod leases;
mod listing;
mod quota;
mod rows;
mod sessions;
mod usage;
mod wal;

use wal::Checkpointer;

/// A caller's work, run on the writer thread inside the batch's transaction
/// (or handed the error that kept the transaction from starting). It returns
/// how to answer the caller once the transaction has ended.
type Job = Box<dyn FnOnce(Result<&Connection, &StoreError>) -> Answer + Send>;
/// Answers one caller, given how the transaction of its job ended.
type Answer = Box<dyn FnOnce(Result<(), &StoreError>) + Send>;

enum Request {
    Job(Job),
    /// Stop taking jobs, finish the queued ones, checkpoint the WAL, answer.
    Close(oneshot::Sender<Result<(), StoreError>>),
}

/// The SQLite [`Store`]. Dropping it runs the queued jobs and blocks until
/// the writer thread has closed the database.
pub struct SqliteStore {
    /// Jobs for the writer thread. Declared before `_writer` so that it is
    /// dropped first: the thread stops once every sender is gone, and only
    /// then can dropping `_writer` join it.
    jobs: mpsc::Sender<Request>,
    _writer: Writer,
    /// Stopped after the writer, which checkpoints one last time itself.
    _checkpointer: Checkpointer,
}

/// Joins the writer thread when the store is dropped.
struct Writer(Option<JoinHandle<()>>);

impl Drop for Writer {
    fn drop(&mut self) {
        if let Some(thread) = self.0.take()
            && thread.join().is_err()
        {
            tracing::error!("the store's writer thread panicked");
        }
    }
}

impl SqliteStore {
    /// Opens (or creates) the database at `path`, migrates it to the current
    /// schema and starts the writer thread.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_checkpointing(path, CHECKPOINT_EVERY)
    }

    /// [`SqliteStore::open`] with the checkpointer's period given.
    fn open_checkpointing(path: &Path, every: Duration) -> Result<SqliteStore, StoreError> {
        let failed = |err: &dyn std::fmt::Display| {
            StoreError::Io(format!("cannot open {}: {err}", path.display()))
        };
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|err| failed(&err))?;
        }
        let mut conn = Connection::open(path).map_err(|err| failed(&err))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(|err| failed(&err))?;
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
            .map_err(|err| failed(&err))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(failed(&format!("journal mode is {mode}, not WAL")));
        }
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(|err| failed(&err))?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(|err| failed(&err))?;
        conn.pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(|err| failed(&err))?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        MIGRATIONS
            .to_latest(&mut conn)
            .map_err(|err| failed(&err))?;

        let (jobs, queue) = mpsc::channel(QUEUE_DEPTH);
        let copied = Arc::new(AtomicBool::new(false));
        let checkpointer =
            Checkpointer::start(path, copied.clone(), every).map_err(|err| failed(&err))?;
        let thread = std::thread::Builder::new()
            .name("conclave-store".into())
            .spawn(move || write_loop(conn, queue, &copied))
            .map_err(|err| failed(&err))?;
        Ok(SqliteStore {
            jobs,
            _writer: Writer(Some(thread)),
            _checkpointer: checkpointer,
        })
    }

    /// Runs `work` on the writer thread and returns its result once the
    /// transaction it ran in has committed. A failed statement undoes
    /// itself; `work` that writes with several statements must run them
    /// [`in_savepoint`] so that failing halfway leaves nothing behind.
    async fn call<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let outcome = conn.map_err(StoreError::clone).and_then(work);
            Box::new(move |end| {
                // A job's own error says more than its transaction's; the
                // caller may have stopped waiting, which is no error here.
                let _ = reply
                    .send(outcome.and_then(|value| end.map(|()| value).map_err(StoreError::clone)));
            })
        });
        self.jobs
            .send(Request::Job(job))
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }
}

/// The writer thread: group commit until the channel is closed and empty.
/// After a batch, finishes the checkpointer's pass if `copied` says one
/// was made.
fn write_loop(conn: Connection, mut queue: mpsc::Receiver<Request>, copied: &AtomicBool) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut closers = Vec::new();
    while let Some(first) = queue.blocking_recv() {
        let mut next = Some(first);
        while let Some(request) = next {
            match request {
                Request::Job(job) => batch.push(job),
                Request::Close(reply) => {
                    // Jobs already queued still run; later sends fail.
                    queue.close();
                    closers.push(reply);
                }
            }
            next = if batch.len() < MAX_BATCH {
                queue.try_recv().ok()
            } else {
                None
            };
        }
        run_batch(&conn, &mut batch);
        if copied.swap(false, Ordering::Acquire)
            && let Err(err) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
        {
            tracing::warn!(error = %err, "WAL checkpoint failed; will retry");
        }
    }
    let closed = shut_down(conn);
    for reply in closers {
        let _ = reply.send(closed.as_ref().copied().map_err(StoreError::clone));
    }
}

/// Runs the jobs in one transaction, or in several if SQLite rolls one back
/// on its own, and answers each job once its transaction has ended.
fn run_batch(conn: &Connection, batch: &mut Vec<Job>) {
    let mut waiting: Vec<Answer> = Vec::with_capacity(batch.len());
    for job in batch.drain(..) {
        if conn.is_autocommit()
            && let Err(err) = execute(conn, "BEGIN IMMEDIATE")
        {
            job(Err(&err))(Err(&err));
            continue;
        }
        let answer = job(Ok(conn));
        if conn.is_autocommit() {
            // Some errors (disk full, I/O) make SQLite roll back the whole
            // transaction: none of the jobs before this one happened either.
            let err = StoreError::Io("the transaction was rolled back by a failed write".into());
            for answer in waiting.drain(..).chain([answer]) {
                answer(Err(&err));
            }
        } else {
            waiting.push(answer);
        }
    }
    if waiting.is_empty() {
        return;
    }
    let end = execute(conn, "COMMIT");
    if end.is_err() && !conn.is_autocommit() {
        // Leave no half transaction for the next batch to run inside.
        let _ = execute(conn, "ROLLBACK");
    }
    for answer in waiting {
        answer(end.as_ref().copied());
    }
}

/// Runs `work` so that a failure undoes its writes and nothing else.
fn in_savepoint<T>(
    conn: &Connection,
    work: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    execute(conn, "SAVEPOINT job")?;
    let outcome = work(conn);
    let undone = match outcome {
        Ok(_) => Ok(()),
        Err(_) => execute(conn, "ROLLBACK TO job"),
    };
    let released = undone.and_then(|()| execute(conn, "RELEASE job"));
    outcome.and_then(|value| released.map(|()| value))
}

fn execute(conn: &Connection, sql: &str) -> Result<(), StoreError> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

/// Writes the WAL into the database file and closes the connection.
fn shut_down(conn: Connection) -> Result<(), StoreError> {
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    conn.close().map_err(|(_, err)| StoreError::from(err))
}

impl From<rusqlite::Error> for StoreError {
    fn from(err: rusqlite::Error) -> StoreError {
        StoreError::Io(err.to_string())
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.call(|conn| Ok(conn.query_row("SELECT 1", [], |row| row.get::<_, i64>(0))?))
            .await
            .map(drop)
    }

    /// Runs every job queued before it, checkpoints the WAL and stops the
    /// writer thread; every call after it, `close` included, fails with
    /// [`StoreError::Closed`].
    async fn close(&self) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Request::Close(reply))
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }
}

#[cfg(test)]
#[path = "sqlite_tests.rs"]
mod tests;
