//! Sessions and their messages in PostgreSQL.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Row};
use uuid::Uuid;

use super::{PostgresStore, bigint, unsigned};
use crate::model::Message;
use crate::protocol::{SessionKind, SessionRecord, SessionStatus};
use crate::store::codec::{decode, decode_time, encode, encode_time};
use crate::store::{SessionEnd, SessionFilter, SessionStore, StoreError};

/// The columns of `sessions` in the order [`session`] reads them.
pub(super) const COLUMNS: &str = "id, name, kind, owner, options::text, status, usage::text, ephemeral, \
                       created_at, updated_at, origin, metadata::text";
/// Newest first; `ord` breaks ties between sessions created at one time.
const NEWEST_FIRST: &str = " ORDER BY created_at DESC, ord DESC";

fn session(row: &PgRow) -> Result<SessionRecord, StoreError> {
    let id: Uuid = row.try_get(0)?;
    let what = |field: &str| format!("session {id}: {field}");
    let status: String = row.try_get(5)?;
    Ok(SessionRecord {
        id,
        name: row.try_get(1)?,
        kind: SessionKind::new(row.try_get::<String, _>(2)?),
        owner: row.try_get(3)?,
        options: decode(&what("options"), row.try_get(4)?)?,
        status: SessionStatus::parse(&status)
            .ok_or_else(|| StoreError::Corrupt(what(&format!("unknown status '{status}'"))))?,
        usage: decode(&what("usage"), row.try_get(6)?)?,
        ephemeral: row.try_get(7)?,
        created_at: decode_time(&what("created_at"), row.try_get(8)?)?,
        updated_at: decode_time(&what("updated_at"), row.try_get(9)?)?,
        origin: row.try_get(10)?,
        metadata: decode(&what("metadata"), row.try_get(11)?)?,
    })
}

/// The `SELECT` for `filter` and the text of its parameters, numbered in
/// order (the limit, if any, is last and bound as a number).
fn list_query(filter: &SessionFilter) -> (String, Vec<String>) {
    let mut conditions = Vec::new();
    let mut params = Vec::new();
    let mut condition = |column: &str, value: String| {
        params.push(value);
        conditions.push(format!("{column} = ${}", params.len()));
    };
    if let Some(owner) = &filter.owner {
        condition("owner", owner.clone());
    }
    if let Some(status) = filter.status {
        condition("status", status.as_str().to_owned());
    }
    if let Some(kind) = &filter.kind {
        condition("kind", kind.as_str().to_owned());
    }
    if let Some(ephemeral) = filter.ephemeral {
        params.push(ephemeral.to_string());
        conditions.push(format!("ephemeral = ${}::boolean", params.len()));
    }
    match &filter.origin {
        None => {}
        Some(None) => conditions.push("origin IS NULL".to_owned()),
        Some(Some(origin)) => {
            params.push(origin.clone());
            conditions.push(format!("origin = ${}", params.len()));
        }
    }
    for (key, value) in &filter.metadata {
        params.push(key.clone());
        params.push(value.to_string());
        let n = params.len();
        conditions.push(format!(
            "(metadata::jsonb -> ${}::text) = ${n}::jsonb",
            n - 1
        ));
    }
    if let Some(before) = filter.before {
        params.push(before.to_string());
        conditions.push(format!(
            "(created_at, ord) < (SELECT created_at, ord FROM sessions WHERE id = ${}::uuid)",
            params.len()
        ));
    }
    let mut sql = format!("SELECT {COLUMNS} FROM sessions");
    if !conditions.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&conditions.join(" AND "));
    }
    sql.push_str(NEWEST_FIRST);
    if filter.limit.is_some() {
        sql.push_str(&format!(" LIMIT ${}", params.len() + 1));
    }
    (sql, params)
}

/// [`crate::store::Store::session_at_end`]: the record, the last `seq`
/// and the length of the conversation, all kept on the session's row.
pub(super) async fn session_at_end(
    store: &PostgresStore,
    id: Uuid,
) -> Result<Option<SessionEnd>, StoreError> {
    let sql = format!("SELECT {COLUMNS}, {AT_END} FROM sessions WHERE id = $1");
    let row = sqlx::query(AssertSqlSafe(sql))
        .bind(id)
        .fetch_optional(&store.pool)
        .await?;
    row.as_ref().map(session_end).transpose()
}

/// The columns of `sessions` that [`session_end`] reads after [`COLUMNS`].
pub(super) const AT_END: &str = "last_seq, next_message, history_cuts";

/// A row of [`COLUMNS`] followed by [`AT_END`].
pub(super) fn session_end(row: &PgRow) -> Result<SessionEnd, StoreError> {
    Ok(SessionEnd {
        record: session(row)?,
        last_seq: unsigned("last seq", row.try_get(12)?)?,
        messages: Some(unsigned("next message", row.try_get(13)?)?),
        cuts: Some(unsigned("history cuts", row.try_get(14)?)?),
    })
}

#[async_trait]
impl SessionStore for PostgresStore {
    async fn create_session(&self, session: &SessionRecord) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO sessions (id, name, kind, owner, options, status, usage, ephemeral,
                 created_at, updated_at, origin, metadata)
             VALUES ($1, $2, $3, $4, $5::json, $6, $7::json, $8, $9, $10, $11, $12::json)",
        )
        .bind(session.id)
        .bind(&session.name)
        .bind(session.kind.as_str())
        .bind(&session.owner)
        .bind(encode("session options", &session.options)?)
        .bind(session.status.as_str())
        .bind(encode("session usage", &session.usage)?)
        .bind(session.ephemeral)
        .bind(encode_time(session.created_at))
        .bind(encode_time(session.updated_at))
        .bind(&session.origin)
        .bind(encode("session metadata", &session.metadata)?)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn get_session(&self, id: Uuid) -> Result<Option<SessionRecord>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM sessions WHERE id = $1");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(session).transpose()
    }

    async fn list_sessions(
        &self,
        filter: &SessionFilter,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        let (sql, params) = list_query(filter);
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for param in params {
            query = query.bind(param);
        }
        if let Some(limit) = filter.limit {
            query = query.bind(bigint(limit as u64));
        }
        let rows = query.fetch_all(&self.pool).await?;
        rows.iter().map(session).collect()
    }

    async fn expired_ephemeral(
        &self,
        cutoff: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Uuid>, StoreError> {
        let rows = sqlx::query(
            "SELECT id FROM sessions WHERE ephemeral AND created_at < $2 AND status = $1
                 AND updated_at < $2
             ORDER BY updated_at LIMIT $3",
        )
        .bind(SessionStatus::Closed.as_str())
        .bind(encode_time(cutoff))
        .bind(bigint(limit as u64))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|row| row.try_get(0))
            .collect::<Result<_, _>>()?)
    }

    async fn sessions_with_status(
        &self,
        status: SessionStatus,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM sessions WHERE status = $1{NEWEST_FIRST}");
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(status.as_str())
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(session).collect()
    }

    async fn merge_metadata(
        &self,
        id: Uuid,
        patch: &Map<String, Value>,
    ) -> Result<Option<Map<String, Value>>, StoreError> {
        // `||` of two objects is the keys of both, the right one's value
        // where both have a key: the merge, under the row's lock.
        let row = sqlx::query(
            "UPDATE sessions SET metadata = (metadata::jsonb || $2::jsonb)::json
             WHERE id = $1 RETURNING metadata::text",
        )
        .bind(id)
        .bind(encode("session metadata", patch)?)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| decode(&format!("session {id}: metadata"), row.try_get(0)?))
            .transpose()
    }

    async fn delete_session(&self, id: Uuid) -> Result<bool, StoreError> {
        let deleted = sqlx::query("DELETE FROM sessions WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(deleted.rows_affected() > 0)
    }

    async fn messages_from(&self, id: Uuid, from: usize) -> Result<Vec<Message>, StoreError> {
        let rows = sqlx::query(
            "SELECT body::text FROM messages WHERE session_id = $1 AND idx >= $2 ORDER BY idx",
        )
        .bind(id)
        .bind(i64::try_from(from).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| decode("message", row.try_get(0)?))
            .collect()
    }

    /// The session's row is taken first (as appends take it), then the
    /// messages cut, in one transaction.
    async fn truncate_messages(&self, id: Uuid, len: usize) -> Result<(), StoreError> {
        let len = i64::try_from(len).unwrap_or(i64::MAX);
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "UPDATE sessions SET next_message = LEAST(next_message, $2),
                 history_cuts = history_cuts + 1
             WHERE id = $1",
        )
        .bind(id)
        .bind(len)
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM messages WHERE session_id = $1 AND idx >= $2")
            .bind(id)
            .bind(len)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_number_their_parameters_in_order() {
        let (sql, params) = list_query(&SessionFilter {
            owner: Some("o".into()),
            status: None,
            kind: Some(SessionKind::AGENT),
            ephemeral: Some(false),
            before: Some(Uuid::nil()),
            limit: Some(5),
            ..SessionFilter::default()
        });
        assert!(
            sql.contains(
                "owner = $1 AND kind = $2 AND ephemeral = $3::boolean AND (created_at, ord) <"
            ),
            "{sql}"
        );
        assert!(sql.contains("WHERE id = $4::uuid"), "{sql}");
        assert!(sql.ends_with("LIMIT $5"), "{sql}");
        assert_eq!(params, ["o", "agent", "false", &Uuid::nil().to_string()]);
        let (sql, params) = list_query(&SessionFilter::default());
        assert!(!sql.contains("WHERE"), "{sql}");
        assert!(params.is_empty());
    }
}
