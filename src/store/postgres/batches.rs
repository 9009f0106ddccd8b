//! Log batches that do not make their session, written together with
//! other sessions' batches waiting at the same time ([`super::grouped`]):
//! in one statement ([`GROUP`]), or alone ([`BATCH`]) when no other
//! waits.
//!
//! [`GROUP`]: super::events::GROUP
//! [`BATCH`]: super::events

use std::future::Future;

use uuid::Uuid;

use super::PostgresStore;
use super::conns::Conn;
use super::events::{Encoded, group, no_session, write_one};
use super::grouped::{Waiting, Work, failed};
use crate::store::StoreError;

/// What the writer that took a batch tells the batch's own writer.
pub(super) enum Answer {
    /// Committed; whether the batch's session was found.
    Stored {
        found: bool,
    },
    Failed(StoreError),
    /// The group was refused: the batch is to be written alone.
    Alone(Box<Encoded>),
}

impl Work for Encoded {
    type Answer = Answer;

    fn write(conn: Conn<'_>, batches: Vec<Waiting<Self>>) -> impl Future<Output = ()> + Send {
        write(conn, batches)
    }

    fn alone(self) -> Answer {
        Answer::Alone(Box::new(self))
    }

    fn failed(err: StoreError) -> Answer {
        Answer::Failed(err)
    }
}

impl PostgresStore {
    /// Writes a batch that does not make its session, with the batches of
    /// other sessions waiting when it is written.
    pub(super) async fn append_grouped(
        &self,
        session: Uuid,
        encoded: Encoded,
    ) -> Result<(), StoreError> {
        let needs_its_session = encoded.needs_its_session();
        let answer = self
            .batches
            .submit(&self.pool, session, encoded, "the write of a batch")
            .await?;
        let found = match answer {
            Answer::Stored { found } => found,
            Answer::Failed(err) => return Err(err),
            Answer::Alone(encoded) => {
                let mut conn = self.pool.get().await?;
                let found = write_one(&mut conn, session, &encoded).await?;
                conn.done();
                found
            }
        };
        if !found && needs_its_session {
            return Err(no_session(session));
        }
        Ok(())
    }
}

/// Writes `batches` on `conn` and answers each one's writer.
async fn write(mut conn: Conn<'_>, batches: Vec<Waiting<Encoded>>) {
    if batches.len() == 1 {
        let Some(one) = batches.into_iter().next() else {
            return;
        };
        let answer = match write_one(&mut conn, one.session, &one.work).await {
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
    let result = group(batches.iter().map(|b| (b.session, &b.work)))
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
        Err(err) => failed(batches, err),
    }
}

#[cfg(test)]
#[path = "grouped_tests.rs"]
mod tests;
