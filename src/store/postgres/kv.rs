//! The KV in PostgreSQL: one row per key, one revision counter per
//! namespace. Every write locks its namespace's counter row first, so that
//! writers in several processes compare and set one after the other.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};

use super::{PostgresStore, bigint, unsigned};
use crate::store::{Expect, KvEntry, KvStore, KvWrite, StoreError};

/// Locks the namespace's counter (creating it at 0) until the transaction
/// ends, and answers the key's revision as the last committed write left it.
/// Two statements: the second reads after the lock is held, so it sees
/// what the writer before committed.
async fn lock_and_read(
    conn: &mut PgConnection,
    namespace: &str,
    key: &str,
) -> Result<(u64, Option<u64>), StoreError> {
    let namespace_revision: i64 = sqlx::query_scalar(
        "INSERT INTO kv_revisions (namespace, revision) VALUES ($1, 0)
         ON CONFLICT (namespace) DO UPDATE SET revision = kv_revisions.revision
         RETURNING revision",
    )
    .bind(namespace)
    .fetch_one(&mut *conn)
    .await?;
    let current: Option<i64> =
        sqlx::query_scalar("SELECT revision FROM kv WHERE namespace = $1 AND key = $2")
            .bind(namespace)
            .bind(key)
            .fetch_optional(&mut *conn)
            .await?;
    Ok((
        unsigned("kv namespace revision", namespace_revision)?,
        current.map(|r| unsigned("kv revision", r)).transpose()?,
    ))
}

fn entry(row: &PgRow) -> Result<KvEntry, StoreError> {
    let key: String = row.try_get(0)?;
    let revision = unsigned(&format!("kv key {key}: revision"), row.try_get(2)?)?;
    Ok(KvEntry {
        value: row.try_get(1)?,
        revision,
        updated_at: row.try_get::<DateTime<Utc>, _>(3)?,
        key,
    })
}

#[async_trait]
impl KvStore for PostgresStore {
    async fn kv_get(&self, namespace: &str, key: &str) -> Result<Option<KvEntry>, StoreError> {
        let row = sqlx::query(
            "SELECT key, value, revision, updated_at FROM kv WHERE namespace = $1 AND key = $2",
        )
        .bind(namespace)
        .bind(key)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(entry).transpose()
    }

    async fn kv_put(
        &self,
        namespace: &str,
        key: &str,
        value: &[u8],
        expect: Expect,
    ) -> Result<KvWrite, StoreError> {
        let mut tx = self.pool.begin().await?;
        let (_, current) = lock_and_read(&mut tx, namespace, key).await?;
        if !expect.allows(current) {
            return Ok(KvWrite::Conflict { current });
        }
        let revision: i64 = sqlx::query_scalar(
            "WITH next AS (
                 UPDATE kv_revisions SET revision = revision + 1 WHERE namespace = $1
                 RETURNING revision)
             INSERT INTO kv (namespace, key, value, revision, updated_at)
             SELECT $1, $2, $3, next.revision, $4 FROM next
             ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,
                 revision = excluded.revision, updated_at = excluded.updated_at
             RETURNING revision",
        )
        .bind(namespace)
        .bind(key)
        .bind(value)
        .bind(Utc::now())
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(KvWrite::Done(unsigned("kv revision", revision)?))
    }

    async fn kv_delete(
        &self,
        namespace: &str,
        key: &str,
        expect: Expect,
    ) -> Result<KvWrite, StoreError> {
        let mut tx = self.pool.begin().await?;
        let (namespace_revision, current) = lock_and_read(&mut tx, namespace, key).await?;
        if !expect.allows(current) || (current.is_none() && expect != Expect::Any) {
            return Ok(KvWrite::Conflict { current });
        }
        if current.is_none() {
            return Ok(KvWrite::Done(namespace_revision));
        }
        let revision: i64 = sqlx::query_scalar(
            "WITH next AS (
                 UPDATE kv_revisions SET revision = revision + 1 WHERE namespace = $1
                 RETURNING revision),
             gone AS (DELETE FROM kv WHERE namespace = $1 AND key = $2)
             SELECT revision FROM next",
        )
        .bind(namespace)
        .bind(key)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(KvWrite::Done(unsigned("kv revision", revision)?))
    }

    /// `starts_with` takes the prefix literally: `%` and `_` are no
    /// wildcards.
    async fn kv_list(
        &self,
        namespace: &str,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<KvEntry>, StoreError> {
        let rows = sqlx::query(
            "SELECT key, value, revision, updated_at FROM kv
             WHERE namespace = $1 AND starts_with(key, $2)
             ORDER BY key LIMIT $3",
        )
        .bind(namespace)
        .bind(prefix)
        .bind(bigint(limit as u64))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(entry).collect()
    }
}
