//! The WAL checkpointer: a thread of its own that copies the log back into
//! the database without ever blocking the writer.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;

use super::BUSY_TIMEOUT;

/// The most WAL frames (pages) a checkpointer's catch-up leaves for the
/// writer to copy: a few hundred microseconds of its time.
const LEFT_FOR_THE_WRITER: i64 = 64;
/// The most passive passes one catch-up makes: each copies what came in
/// during the one before, so under a steady load they shrink fast.
const MAX_PASSES: usize = 8;

/// Checkpoints the WAL from its own connection and thread, passively: it
/// never blocks the writer. A passive checkpoint leaves behind the frames
/// committed while it ran, and SQLite starts the log over only once every
/// frame is in the database, so under a steady load the WAL would grow
/// without end (measured: 50 MB/s of commits gave a 550 MB WAL in 11 s).
/// Each period the checkpointer makes passes until one finds little new
/// ([`catch_up`]), then raises a flag, and the writer copies that small
/// remainder itself after its next batch, between two transactions (1-7 ms
/// in one measured run, against 14-20 ms after a single pass), which lets its next
/// transaction start the log over: the WAL holds about one period of
/// writes at most. A flag, not a message on the jobs queue: a
/// full queue cannot turn it away, and an idle writer is not woken for it
/// (the log starts over at the next write, which is when it matters).
///
/// The file keeps its largest size and is written over in place; it is
/// not cut back (`journal_size_limit`), because freeing and then growing
/// it again stalled commits: with a 64 MiB limit the p99 of a run's first
/// event under load went from 3 ms to 9–16 ms, with stalls over 100 ms.
/// Closing the store truncates it.
pub(super) struct Checkpointer {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Errors are messages for [`super::SqliteStore::open`] to wrap. `copied` is
    /// the flag the writer finishes a pass on.
    pub(super) fn start(
        path: &Path,
        copied: Arc<AtomicBool>,
        every: Duration,
    ) -> Result<Checkpointer, String> {
        let conn = Connection::open(path).map_err(|err| err.to_string())?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(|err| err.to_string())?;
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("conclave-checkpoint".into())
            .spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(every)
                {
                    match catch_up(&conn) {
                        Ok(true) => copied.store(true, Ordering::Release),
                        Ok(false) => {}
                        Err(err) => {
                            tracing::warn!(error = %err, "WAL checkpoint failed; will retry");
                        }
                    }
                }
            })
            .map_err(|err| format!("cannot start the checkpoint thread: {err}"))?;
        Ok(Checkpointer {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

/// Passive passes until the last one found at most [`LEFT_FOR_THE_WRITER`]
/// frames committed since the one before (or [`MAX_PASSES`] were made):
/// the writer copies what came in during the last pass itself, and while
/// it does no commit can end. A single pass over ten seconds' writes left
/// the writer about 3,000 frames, 14-20 ms of copying under the first
/// event benchmark's load with every caller of the store waiting; each
/// further pass copies what came in during the one before, so they shrink
/// fast. Whether there was anything to copy.
fn catch_up(conn: &Connection) -> rusqlite::Result<bool> {
    let mut copied = false;
    let mut before: Option<i64> = None;
    for _ in 0..MAX_PASSES {
        let log = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
            row.get::<_, i64>(1)
        })?;
        copied |= log > 0;
        // A log shorter than before was started over in between: all of
        // it is new.
        let new = match before {
            Some(before) if log >= before => log - before,
            _ => log,
        };
        if log == 0 || (before.is_some() && new <= LEFT_FOR_THE_WRITER) {
            break;
        }
        before = Some(log);
    }
    Ok(copied)
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        // Dropping the sender wakes the thread, which then ends.
        self.stop.take();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the store's checkpoint thread panicked");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::atomic::AtomicBool;

    use super::*;

    fn open(path: &Path) -> Connection {
        let conn = Connection::open(path).unwrap();
        conn.busy_timeout(BUSY_TIMEOUT).unwrap();
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        conn.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        conn
    }

    fn create(conn: &Connection) {
        conn.execute_batch("CREATE TABLE t (body BLOB NOT NULL)")
            .unwrap();
    }

    /// One commit of a page or more.
    fn insert(conn: &Connection) {
        conn.execute("INSERT INTO t (body) VALUES (zeroblob(4096))", [])
            .unwrap();
    }

    /// `(frames in the log, frames copied into the database)`.
    fn passive(conn: &Connection) -> (i64, i64) {
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
            Ok((row.get(1)?, row.get(2)?))
        })
        .unwrap()
    }

    #[test]
    fn a_catch_up_copies_the_log_and_lets_the_next_write_start_it_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let writer = open(&path);
        let checkpointer = open(&path);
        assert!(
            !catch_up(&checkpointer).unwrap(),
            "an empty log: nothing to copy"
        );
        create(&writer);
        for _ in 0..200 {
            insert(&writer);
        }
        assert!(catch_up(&checkpointer).unwrap());
        let (log, copied) = passive(&checkpointer);
        assert!(log > 200, "each insert wrote a frame or more: {log}");
        assert_eq!(copied, log, "every frame is in the database");
        insert(&writer);
        let (after, _) = passive(&checkpointer);
        assert!(
            after < log,
            "the next write started the log over: {after} of {log}"
        );
    }

    #[test]
    fn a_catch_up_ends_while_a_writer_goes_on_committing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let writer = open(&path);
        create(&writer);
        for _ in 0..2000 {
            insert(&writer);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let committing = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let mut commits = 0u64;
                while !stop.load(Ordering::Acquire) {
                    insert(&writer);
                    commits += 1;
                }
                commits
            }
        });
        let checkpointer = open(&path);
        let copied = catch_up(&checkpointer).unwrap();
        stop.store(true, Ordering::Release);
        let commits = committing.join().unwrap();
        assert!(copied);
        let (log, done) = passive(&checkpointer);
        assert_eq!(done, log, "{commits} commits meanwhile, all copied now");
    }
}
