//! The WAL checkpointer: a thread of its own that copies the log back into
//! the database without ever blocking the writer.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;

use super::BUSY_TIMEOUT;

/// Checkpoints the WAL from its own connection and thread, passively: it
/// never blocks the writer. A passive checkpoint leaves behind the frames
/// committed while it ran, and SQLite starts the log over only once every
/// frame is in the database, so under a steady load the WAL would grow
/// without end (measured: 50 MB/s of commits gave a 550 MB WAL in 11 s).
/// After each pass the checkpointer raises a flag, and the writer copies
/// that small remainder itself after its next batch, between two
/// transactions (a few ms here, against tens for the whole copy), which
/// lets its next transaction start the log over: the WAL holds about one
/// period of writes at most. A flag, not a message on the jobs queue: a
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
                    match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
                        row.get::<_, i64>(1)
                    }) {
                        Ok(frames) if frames > 0 => copied.store(true, Ordering::Release),
                        Ok(_) => {}
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
