//! Checkpoints of a session's runs in SQLite, deleted with the session.

use async_trait::async_trait;
use rusqlite::{ErrorCode, OptionalExtension, params};
use uuid::Uuid;

use super::SqliteStore;
use super::rows::{decode, decode_time, encode, encode_time};
use crate::store::{Checkpoint, CheckpointStore, StoreError};

type Row = (u64, String, String, String);

fn read(row: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
}

fn decode_row(
    session_id: Uuid,
    (step, name, state, created_at): Row,
) -> Result<Checkpoint, StoreError> {
    let what = |field: &str| format!("checkpoint {step} of session {session_id}: {field}");
    Ok(Checkpoint {
        session_id,
        step,
        name,
        state: decode(&what("state"), &state)?,
        created_at: decode_time(&what("created_at"), &created_at)?,
    })
}

#[async_trait]
impl CheckpointStore for SqliteStore {
    async fn put_checkpoint(&self, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        let id = checkpoint.session_id.to_string();
        let (step, name) = (checkpoint.step, checkpoint.name.clone());
        let state = encode("checkpoint state", &checkpoint.state)?;
        let created_at = encode_time(checkpoint.created_at);
        self.call(move |conn| {
            let inserted = conn
                .prepare_cached(
                    "INSERT INTO checkpoints (session_id, step, name, state, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )?
                .execute(params![id, step, name, state, created_at]);
            match inserted {
                Ok(_) => Ok(()),
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if e.code == ErrorCode::ConstraintViolation =>
                {
                    Err(StoreError::Conflict(format!(
                        "session {id} has no checkpoint slot {step}: the step exists, or the session does not"
                    )))
                }
                Err(e) => Err(e.into()),
            }
        })
        .await
    }

    async fn checkpoints(&self, session_id: Uuid) -> Result<Vec<Checkpoint>, StoreError> {
        let id = session_id.to_string();
        let rows = self
            .call(move |conn| {
                let mut statement = conn.prepare_cached(
                    "SELECT step, name, state, created_at FROM checkpoints
                     WHERE session_id = ?1 ORDER BY step",
                )?;
                let rows = statement.query_map([id], read)?;
                Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
            })
            .await?;
        rows.into_iter()
            .map(|row| decode_row(session_id, row))
            .collect()
    }

    async fn last_checkpoint(&self, session_id: Uuid) -> Result<Option<Checkpoint>, StoreError> {
        let id = session_id.to_string();
        let row = self
            .call(move |conn| {
                Ok(conn
                    .prepare_cached(
                        "SELECT step, name, state, created_at FROM checkpoints
                         WHERE session_id = ?1 ORDER BY step DESC LIMIT 1",
                    )?
                    .query_row([id], read)
                    .optional()?)
            })
            .await?;
        row.map(|row| decode_row(session_id, row)).transpose()
    }
}
