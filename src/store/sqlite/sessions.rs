//! Sessions and their messages in SQLite.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::{Connection, params};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::rows::{SessionRow, decode, decode_sessions, encode, select_sessions};
use super::{SqliteStore, listing};
use crate::model::Message;
use crate::protocol::{SessionRecord, SessionStatus};
use crate::store::{SessionFilter, SessionStore, StoreError};

/// Inserts a session's row; a session with its id fails it.
pub(super) fn insert_session(conn: &Connection, row: &SessionRow) -> Result<(), StoreError> {
    conn.prepare_cached(concat!(
        "INSERT INTO sessions (",
        session_columns!(),
        ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
    ))?
    .execute(params![
        row.id,
        row.name,
        row.kind,
        row.owner,
        row.options,
        row.status,
        row.usage,
        row.ephemeral,
        row.created_at,
        row.updated_at,
        row.origin,
        row.metadata,
    ])?;
    Ok(())
}

#[async_trait]
impl SessionStore for SqliteStore {
    async fn create_session(&self, session: &SessionRecord) -> Result<(), StoreError> {
        let row = SessionRow::encode(session)?;
        self.call(move |conn| insert_session(conn, &row)).await
    }

    async fn get_session(&self, id: Uuid) -> Result<Option<SessionRecord>, StoreError> {
        let id = id.to_string();
        let rows = self
            .call(move |conn| {
                select_sessions(
                    conn,
                    concat!(
                        "SELECT ",
                        session_columns!(),
                        " FROM sessions WHERE id = ?1"
                    ),
                    [id],
                )
            })
            .await?;
        rows.into_iter().next().map(SessionRow::decode).transpose()
    }

    async fn list_sessions(
        &self,
        filter: &SessionFilter,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        let filter = filter.clone();
        let rows = self.call(move |conn| listing::list(conn, &filter)).await?;
        decode_sessions(rows)
    }

    async fn expired_ephemeral(
        &self,
        cutoff: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Uuid>, StoreError> {
        let ids = self
            .call(move |conn| listing::expired_ephemeral(conn, cutoff, limit))
            .await?;
        ids.iter()
            .map(|id| {
                Uuid::parse_str(id)
                    .map_err(|e| StoreError::Corrupt(format!("session id '{id}': {e}")))
            })
            .collect()
    }

    async fn sessions_with_status(
        &self,
        status: SessionStatus,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        let rows = self
            .call(move |conn| {
                select_sessions(
                    conn,
                    concat!(
                        "SELECT ",
                        session_columns!(),
                        " FROM sessions WHERE status = ?1 ORDER BY created_at DESC, rowid DESC"
                    ),
                    [status.as_str()],
                )
            })
            .await?;
        decode_sessions(rows)
    }

    async fn merge_metadata(
        &self,
        id: Uuid,
        patch: &Map<String, Value>,
    ) -> Result<Option<Map<String, Value>>, StoreError> {
        let id = id.to_string();
        let patch = patch.clone();
        // One closure on the one writer: no other write comes between the
        // read and the write.
        self.call(move |conn| {
            let mut read = conn.prepare_cached("SELECT metadata FROM sessions WHERE id = ?1")?;
            let Some(text) = read
                .query_map([&id], |row| row.get::<_, String>(0))?
                .next()
                .transpose()?
            else {
                return Ok(None);
            };
            let mut metadata: Map<String, Value> = decode("session metadata", &text)?;
            metadata.extend(patch);
            conn.prepare_cached("UPDATE sessions SET metadata = ?2 WHERE id = ?1")?
                .execute(params![id, encode("session metadata", &metadata)?])?;
            Ok(Some(metadata))
        })
        .await
    }

    async fn delete_session(&self, id: Uuid) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.call(move |conn| {
            let deleted = conn
                .prepare_cached("DELETE FROM sessions WHERE id = ?1")?
                .execute([id])?;
            Ok(deleted > 0)
        })
        .await
    }

    async fn messages_from(&self, id: Uuid, from: usize) -> Result<Vec<Message>, StoreError> {
        let id = id.to_string();
        let from = i64::try_from(from).unwrap_or(i64::MAX);
        let bodies = self
            .call(move |conn| {
                let mut statement = conn.prepare_cached(
                    "SELECT body FROM messages WHERE session_id = ?1 AND idx >= ?2 ORDER BY idx",
                )?;
                let rows = statement.query_map(params![id, from], |row| row.get::<_, String>(0))?;
                Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
            })
            .await?;
        bodies.iter().map(|body| decode("message", body)).collect()
    }

    async fn truncate_messages(&self, id: Uuid, len: usize) -> Result<(), StoreError> {
        let id = id.to_string();
        let len = i64::try_from(len).unwrap_or(i64::MAX);
        self.call(move |conn| {
            conn.prepare_cached("DELETE FROM messages WHERE session_id = ?1 AND idx >= ?2")?
                .execute(params![id, len])?;
            Ok(())
        })
        .await
    }
}
