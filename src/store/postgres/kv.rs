//! The KV in PostgreSQL: one row per key, one revision counter per
//! namespace. Every write locks its namespace's counter row first, so that
//! writers in several processes compare and set one after the other; a
//! write is one call of a function of the schema (`kv_put`, `kv_delete`:
//! see the migration "KV writes in one round trip"), one round trip.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::{PostgresStore, bigint, unsigned};
use crate::store::{Expect, KvEntry, KvStore, KvWrite, StoreError};

/// The `expected` argument of the `kv_put` and `kv_delete` functions.
fn expected(expect: Expect) -> Option<i64> {
    match expect {
        Expect::Any => None,
        Expect::Absent => Some(0),
        Expect::Revision(revision) => Some(bigint(revision)),
    }
}

/// A function's `(done, rev)` as the write it answers.
fn written((done, revision): (bool, Option<i64>)) -> Result<KvWrite, StoreError> {
    let revision = revision.map(|r| unsigned("kv revision", r)).transpose()?;
    match (done, revision) {
        (true, Some(revision)) => Ok(KvWrite::Done(revision)),
        (true, None) => Err(StoreError::Corrupt(
            "a KV write answered no revision".into(),
        )),
        (false, current) => Ok(KvWrite::Conflict { current }),
    }
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
        let answer = sqlx::query_as("SELECT done, rev FROM kv_put($1, $2, $3, $4, $5)")
            .bind(namespace)
            .bind(key)
            .bind(value)
            .bind(expected(expect))
            .bind(Utc::now())
            .fetch_one(&self.pool)
            .await?;
        written(answer)
    }

    async fn kv_delete(
        &self,
        namespace: &str,
        key: &str,
        expect: Expect,
    ) -> Result<KvWrite, StoreError> {
        let answer = sqlx::query_as("SELECT done, rev FROM kv_delete($1, $2, $3)")
            .bind(namespace)
            .bind(key)
            .bind(expected(expect))
            .fetch_one(&self.pool)
            .await?;
        written(answer)
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
