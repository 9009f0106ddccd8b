//! Checkpoints of a session's runs in PostgreSQL, deleted with the session.

use async_trait::async_trait;
use sqlx::Row;
use sqlx::postgres::PgRow;
use uuid::Uuid;

use super::{PostgresStore, bigint, sql_state, unsigned};
use crate::store::codec::{decode, decode_time, encode, encode_time};
use crate::store::{Checkpoint, CheckpointStore, StoreError};

/// SQLSTATEs of a unique key (the step exists) and of a foreign key (the
/// session does not).
const UNIQUE_VIOLATION: &str = "23505";
const FOREIGN_KEY_VIOLATION: &str = "23503";

fn checkpoint(session_id: Uuid, row: &PgRow) -> Result<Checkpoint, StoreError> {
    let step = unsigned("checkpoint step", row.try_get(0)?)?;
    let what = |field: &str| format!("checkpoint {step} of session {session_id}: {field}");
    Ok(Checkpoint {
        session_id,
        step,
        name: row.try_get(1)?,
        state: decode(&what("state"), row.try_get(2)?)?,
        created_at: decode_time(&what("created_at"), row.try_get(3)?)?,
    })
}

#[async_trait]
impl CheckpointStore for PostgresStore {
    async fn put_checkpoint(&self, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        let inserted = sqlx::query(
            "INSERT INTO checkpoints (session_id, step, name, state, created_at)
             VALUES ($1, $2, $3, $4::json, $5)",
        )
        .bind(checkpoint.session_id)
        .bind(bigint(checkpoint.step))
        .bind(&checkpoint.name)
        .bind(encode("checkpoint state", &checkpoint.state)?)
        .bind(encode_time(checkpoint.created_at))
        .execute(&self.pool)
        .await;
        match inserted {
            Ok(_) => Ok(()),
            Err(err)
                if matches!(
                    sql_state(&err).as_deref(),
                    Some(UNIQUE_VIOLATION | FOREIGN_KEY_VIOLATION)
                ) =>
            {
                Err(StoreError::Conflict(format!(
                    "session {} has no checkpoint slot {}: the step exists, or the session does not",
                    checkpoint.session_id, checkpoint.step
                )))
            }
            Err(err) => Err(err.into()),
        }
    }

    async fn checkpoints(&self, session_id: Uuid) -> Result<Vec<Checkpoint>, StoreError> {
        let rows = sqlx::query(
            "SELECT step, name, state::text, created_at FROM checkpoints
             WHERE session_id = $1 ORDER BY step",
        )
        .bind(session_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| checkpoint(session_id, row)).collect()
    }

    async fn last_checkpoint(&self, session_id: Uuid) -> Result<Option<Checkpoint>, StoreError> {
        let row = sqlx::query(
            "SELECT step, name, state::text, created_at FROM checkpoints
             WHERE session_id = $1 ORDER BY step DESC LIMIT 1",
        )
        .bind(session_id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| checkpoint(session_id, &row)).transpose()
    }
}
