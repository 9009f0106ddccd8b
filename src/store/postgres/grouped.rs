//! Writes of several sessions done together: one round trip where each
//! would have taken one. Two kinds go this way: log batches that do not
//! make their session ([`super::batches`]) and the statements that take a
//! session's turn ([`super::takes`]).
//!
//! A write is queued, and its caller waits for one of its kind's lanes
//! (a quarter of the store's connections, at least one) and then a
//! connection. The caller that gets both takes the queued writes of its kind (the
//! oldest first, at most [`MOST`], one of each session) and does them in
//! one statement, or alone, as without grouping, when it took only one.
//! A caller whose write another took stops waiting for a lane or a
//! connection (one it got first it gives back at once) and waits for
//! that one's answer. A caller that got both for its write alone first
//! lets the replica's tasks already woken run once, so writes that come
//! at the same moment (requests that arrived together) join it. So
//! writes group only while their lanes are busy or they come together: a
//! quiet store does each at once and alone, and a busy one does more
//! writes per round trip instead of queueing more round trips. Batches
//! and turns have lanes of their own, so neither waits behind the other.
//!
//! A group that PostgreSQL refuses (one write's clash fails the whole
//! statement, or a deadlock with another group) is done again write by
//! write, each by its own caller, so that a write fails only when it
//! fails alone. A group whose connection failed fails every write in it:
//! whether it committed is unknown, as it is for one write alone.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Mutex;

use tokio::sync::oneshot;
use uuid::Uuid;

use super::conns::{Conn, Conns};
use crate::store::StoreError;
use crate::sync::lock;

/// The most writes one statement does.
const MOST: usize = 64;

/// A kind of write that can be grouped.
pub(super) trait Work: Send + Sized {
    /// What the caller that did a write tells the write's own caller.
    type Answer: Send;

    /// Does `group` (at least one write, at most one of each session, the
    /// oldest first) on `conn` and answers each write's caller.
    fn write(conn: Conn<'_>, group: Vec<Waiting<Self>>) -> impl Future<Output = ()> + Send;

    /// The answer that has the write's own caller do it alone.
    fn alone(self) -> Self::Answer;

    /// The answer of a write that failed with `err`.
    fn failed(err: StoreError) -> Self::Answer;
}

/// Answers every write of a group whose statement failed with `err`: a
/// refusal (nothing of it was done) sends each back to be done alone by
/// its own caller; any other failure (whether it committed is unknown)
/// fails each.
pub(super) fn failed<W: Work>(group: Vec<Waiting<W>>, err: sqlx::Error) {
    // A caller gone away wants no answer.
    match err {
        sqlx::Error::Database(err) => {
            tracing::debug!(writes = group.len(), error = %err, "a group of writes was refused; each is done alone");
            for write in group {
                let _ = write.answer.send(write.work.alone());
            }
        }
        err => {
            let err = StoreError::from(err);
            for write in group {
                let _ = write.answer.send(W::failed(err.clone()));
            }
        }
    }
}

/// The writes of one kind waiting to be done.
pub(super) struct Queue<W: Work> {
    queued: Mutex<Queued<W>>,
    /// Writes of this kind under way at once: at most a quarter of the
    /// store's connections (at least one), so that the rest stay for the
    /// other kind and for reading, and writes that come while these run
    /// wait to go together (a group costs PostgreSQL little more than one
    /// write, so fewer, larger statements are cheaper than more at once).
    lanes: tokio::sync::Semaphore,
    /// Statements that did two writes or more, and the writes they did.
    #[cfg(test)]
    pub(super) groups: std::sync::atomic::AtomicUsize,
    #[cfg(test)]
    pub(super) grouped: std::sync::atomic::AtomicUsize,
}

struct Queued<W: Work> {
    /// The next write's ticket.
    next: u64,
    /// The oldest first.
    writes: VecDeque<Waiting<W>>,
}

/// A queued write and where its answer goes.
pub(super) struct Waiting<W: Work> {
    ticket: u64,
    pub(super) session: Uuid,
    pub(super) work: W,
    pub(super) answer: oneshot::Sender<W::Answer>,
}

impl<W: Work> Queue<W> {
    /// The queue of a store of `connections`: writes of this kind are
    /// done on at most a quarter of them at once.
    pub(super) fn new(connections: u32) -> Queue<W> {
        let lanes = usize::try_from(connections / 4).unwrap_or(1).max(1);
        Queue {
            queued: Mutex::new(Queued {
                next: 0,
                writes: VecDeque::new(),
            }),
            lanes: tokio::sync::Semaphore::new(lanes),
            #[cfg(test)]
            groups: Default::default(),
            #[cfg(test)]
            grouped: Default::default(),
        }
    }

    /// Queues a write; answers its ticket.
    fn push(&self, session: Uuid, work: W, answer: oneshot::Sender<W::Answer>) -> u64 {
        let mut queued = lock(&self.queued);
        let ticket = queued.next;
        queued.next += 1;
        queued.writes.push_back(Waiting {
            ticket,
            session,
            work,
            answer,
        });
        ticket
    }

    /// Takes the write of `ticket` back, if no caller took it.
    fn withdraw(&self, ticket: u64) -> bool {
        let mut queued = lock(&self.queued);
        let at = queued.writes.iter().position(|w| w.ticket == ticket);
        at.and_then(|at| queued.writes.remove(at)).is_some()
    }

    /// The writes to do next: the oldest first, at most [`MOST`], one of
    /// each session (a session's later write waits for the next group,
    /// after its earlier one). Those whose callers went away are dropped
    /// undone.
    fn take(&self) -> Vec<Waiting<W>> {
        let mut queued = lock(&self.queued);
        let mut group: Vec<Waiting<W>> = Vec::new();
        let mut left = VecDeque::new();
        while let Some(write) = queued.writes.pop_front() {
            if write.answer.is_closed() {
                continue;
            }
            if group.len() == MOST {
                left.push_back(write);
                left.append(&mut queued.writes);
                break;
            }
            let session = write.session;
            let same = |other: &Waiting<W>| other.session == session;
            if group.iter().any(same) || left.iter().any(same) {
                left.push_back(write);
            } else {
                group.push(write);
            }
        }
        queued.writes = left;
        group
    }

    /// How many writes wait.
    pub(super) fn len(&self) -> usize {
        lock(&self.queued).writes.len()
    }

    /// One of this kind's lanes, held until dropped.
    #[cfg(test)]
    pub(super) async fn lane(&self) -> tokio::sync::SemaphorePermit<'_> {
        self.lanes
            .acquire()
            .await
            .expect("the lanes are never closed")
    }

    /// Does `work` with the writes of other sessions waiting when it is
    /// done (see the module's docs); answers what its doer answered.
    /// `what` names it in the error of a write whose doer went away.
    pub(super) async fn submit(
        &self,
        pool: &Conns,
        session: Uuid,
        work: W,
        what: &str,
    ) -> Result<W::Answer, StoreError> {
        let (answer, mut answered) = oneshot::channel();
        let ticket = self.push(session, work, answer);
        let answer = loop {
            let lane = tokio::select! {
                biased;
                answer = &mut answered => break answer,
                lane = self.lanes.acquire() => lane.ok(),
            };
            let conn = tokio::select! {
                biased;
                answer = &mut answered => break answer,
                conn = pool.get() => conn,
            };
            let conn = match conn {
                Ok(conn) => conn,
                Err(err) if self.withdraw(ticket) => return Err(err.into()),
                // Another caller has it.
                Err(_) => break answered.await,
            };
            if self.len() < 2 {
                // The tasks already woken run once before the group is
                // taken, so the writes they are about to queue join it:
                // nothing else runs on a quiet replica, and this costs it
                // nothing.
                tokio::task::yield_now().await;
            }
            let group = self.take();
            if group.is_empty() {
                // Ours too was taken by another caller.
                conn.done();
                break answered.await;
            }
            #[cfg(test)]
            if group.len() > 1 {
                use std::sync::atomic::Ordering::SeqCst;
                self.groups.fetch_add(1, SeqCst);
                self.grouped.fetch_add(group.len(), SeqCst);
            }
            // Ours was among them (answered by now) or is still queued.
            W::write(conn, group).await;
            drop(lane);
        };
        answer.map_err(|_| {
            StoreError::Io(format!(
                "{what} of session {session} was interrupted; whether it was done is unknown"
            ))
        })
    }
}
