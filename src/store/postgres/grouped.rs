//! Batches of several sessions written together: one round trip where
//! each would have taken one.
//!
//! A batch that does not make its session is queued, and its writer waits
//! for one of the store's lanes (half its connections, at least one) and
//! then a connection. The writer that gets both takes the queued batches
//! (the oldest first, at most [`MOST`], one of each session) and writes
//! them in one statement ([`GROUP`]), or alone, as without grouping, when
//! it took only one ([`BATCH`]). A writer whose batch another took stops
//! waiting for a lane or a connection (one it got first it gives back at
//! once) and waits for that one's answer. So batches group only while
//! the lanes are busy: a quiet store writes each batch at once and alone,
//! and a busy one writes more batches per round trip instead of queueing
//! more round trips, with half its connections left for taking turns and
//! reading.
//!
//! A group that PostgreSQL refuses (one batch's clash fails the whole
//! statement) is written again batch by batch, each by its own writer, so
//! that a batch fails only when it fails alone. A group whose connection
//! failed fails every batch in it: whether it committed is unknown, as it
//! is for one batch alone.
//!
//! [`GROUP`]: super::events::GROUP
//! [`BATCH`]: super::events

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::oneshot;
use uuid::Uuid;

use super::PostgresStore;
use super::conns::Conn;
use super::events::{Encoded, group, no_session, write_one};
use crate::store::StoreError;
use crate::sync::lock;

/// The most batches one statement writes.
const MOST: usize = 64;

/// The batches waiting to be written.
pub(super) struct Queue {
    queued: Mutex<Queued>,
    /// Writes of batches under way at once: at most half the store's
    /// connections (at least one), so that the rest stay for taking turns
    /// and reading, and batches that come while they run wait to go
    /// together.
    lanes: tokio::sync::Semaphore,
    /// Statements that wrote two batches or more, and the batches they
    /// wrote.
    #[cfg(test)]
    groups: std::sync::atomic::AtomicUsize,
    #[cfg(test)]
    grouped: std::sync::atomic::AtomicUsize,
}

#[derive(Default)]
struct Queued {
    /// The next batch's ticket.
    next: u64,
    /// The oldest first.
    batches: VecDeque<Waiting>,
}

struct Waiting {
    ticket: u64,
    session: Uuid,
    encoded: Encoded,
    answer: oneshot::Sender<Answer>,
}

/// What the writer that took a batch tells the batch's own writer.
enum Answer {
    /// Committed; whether the batch's session was found.
    Stored {
        found: bool,
    },
    Failed(StoreError),
    /// The group was refused: the batch is to be written alone.
    Alone(Box<Encoded>),
}

impl Queue {
    /// The queue of a store of `connections`: batches are written on at
    /// most half of them at once.
    pub(super) fn new(connections: u32) -> Queue {
        let lanes = usize::try_from(connections / 2).unwrap_or(1).max(1);
        Queue {
            queued: Mutex::default(),
            lanes: tokio::sync::Semaphore::new(lanes),
            #[cfg(test)]
            groups: Default::default(),
            #[cfg(test)]
            grouped: Default::default(),
        }
    }

    /// Queues a batch; answers its ticket.
    fn push(&self, session: Uuid, encoded: Encoded, answer: oneshot::Sender<Answer>) -> u64 {
        let mut queued = lock(&self.queued);
        let ticket = queued.next;
        queued.next += 1;
        queued.batches.push_back(Waiting {
            ticket,
            session,
            encoded,
            answer,
        });
        ticket
    }

    /// Takes the batch of `ticket` back, if no writer took it.
    fn withdraw(&self, ticket: u64) -> bool {
        let mut queued = lock(&self.queued);
        let at = queued.batches.iter().position(|b| b.ticket == ticket);
        at.and_then(|at| queued.batches.remove(at)).is_some()
    }

    /// The batches to write next: the oldest first, at most [`MOST`], one
    /// of each session (a session's later batch waits for the next
    /// group, after its earlier one). Those whose writers went away are
    /// dropped unwritten.
    fn take(&self) -> Vec<Waiting> {
        let mut queued = lock(&self.queued);
        let mut group: Vec<Waiting> = Vec::new();
        let mut left = VecDeque::new();
        while let Some(batch) = queued.batches.pop_front() {
            if batch.answer.is_closed() {
                continue;
            }
            if group.len() == MOST {
                left.push_back(batch);
                left.append(&mut queued.batches);
                break;
            }
            let session = batch.session;
            let same = |other: &Waiting| other.session == session;
            if group.iter().any(same) || left.iter().any(same) {
                left.push_back(batch);
            } else {
                group.push(batch);
            }
        }
        queued.batches = left;
        group
    }
}

impl PostgresStore {
    /// Writes a batch that does not make its session, with the batches of
    /// other sessions waiting when it is written (see the module's docs).
    pub(super) async fn append_grouped(
        &self,
        session: Uuid,
        encoded: Encoded,
    ) -> Result<(), StoreError> {
        let needs_its_session = encoded.needs_its_session();
        let (answer, mut answered) = oneshot::channel();
        let ticket = self.queue.push(session, encoded, answer);
        let answer = loop {
            let lane = tokio::select! {
                biased;
                answer = &mut answered => break answer,
                lane = self.queue.lanes.acquire() => lane.ok(),
            };
            let conn = tokio::select! {
                biased;
                answer = &mut answered => break answer,
                conn = self.pool.get() => conn,
            };
            let conn = match conn {
                Ok(conn) => conn,
                Err(err) if self.queue.withdraw(ticket) => return Err(err.into()),
                // Another writer has it.
                Err(_) => break answered.await,
            };
            let batches = self.queue.take();
            if batches.is_empty() {
                // Ours too was taken by another writer.
                conn.done();
                break answered.await;
            }
            #[cfg(test)]
            if batches.len() > 1 {
                use std::sync::atomic::Ordering::SeqCst;
                self.queue.groups.fetch_add(1, SeqCst);
                self.queue.grouped.fetch_add(batches.len(), SeqCst);
            }
            // Ours was among them (answered by now) or is still queued.
            write(conn, batches).await;
            drop(lane);
        };
        let found = match answer {
            Ok(Answer::Stored { found }) => found,
            Ok(Answer::Failed(err)) => return Err(err),
            Ok(Answer::Alone(encoded)) => {
                let mut conn = self.pool.get().await?;
                let found = write_one(&mut conn, session, &encoded).await?;
                conn.done();
                found
            }
            Err(_) => {
                return Err(StoreError::Io(format!(
                    "the write of a batch of session {session} was interrupted; \
                     whether it was stored is unknown"
                )));
            }
        };
        if !found && needs_its_session {
            return Err(no_session(session));
        }
        Ok(())
    }
}

/// Writes `batches` on `conn` and answers each one's writer.
async fn write(mut conn: Conn<'_>, batches: Vec<Waiting>) {
    if batches.len() == 1 {
        let Some(one) = batches.into_iter().next() else {
            return;
        };
        let answer = match write_one(&mut conn, one.session, &one.encoded).await {
            Ok(found) => {
                conn.done();
                Answer::Stored { found }
            }
            Err(err) => Answer::Failed(err),
        };
        // A writer gone away wants no answer.
        let _ = one.answer.send(answer);
        return;
    }
    let result = group(batches.iter().map(|b| (b.session, &b.encoded)))
        .fetch_all(&mut *conn)
        .await;
    match result {
        Ok(found) => {
            conn.done();
            for batch in batches {
                let found = found.contains(&batch.session);
                let _ = batch.answer.send(Answer::Stored { found });
            }
        }
        // Refused: nothing of it was stored.
        Err(sqlx::Error::Database(err)) => {
            tracing::debug!(batches = batches.len(), error = %err, "a group of batches was refused; each is written alone");
            for batch in batches {
                let _ = batch.answer.send(Answer::Alone(Box::new(batch.encoded)));
            }
        }
        Err(err) => {
            let err = StoreError::from(err);
            for batch in batches {
                let _ = batch.answer.send(Answer::Failed(err.clone()));
            }
        }
    }
}

#[cfg(test)]
#[path = "grouped_tests.rs"]
mod tests;
