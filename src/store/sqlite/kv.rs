//! The KV in SQLite: one row per key, one revision counter per namespace.

use async_trait::async_trait;
use chrono::Utc;
use rusqlite::{Connection, OptionalExtension, params};

use super::rows::{decode_time, encode_time};
use super::{SqliteStore, in_savepoint};
use crate::store::{Expect, KvEntry, KvStore, KvWrite, StoreError};

/// The key's revision, if it exists.
fn revision_of(conn: &Connection, namespace: &str, key: &str) -> Result<Option<u64>, StoreError> {
    Ok(conn
        .prepare_cached("SELECT revision FROM kv WHERE namespace = ?1 AND key = ?2")?
        .query_row(params![namespace, key], |row| row.get(0))
        .optional()?)
}

/// Takes the namespace's next revision.
fn next_revision(conn: &Connection, namespace: &str) -> Result<u64, StoreError> {
    Ok(conn
        .prepare_cached(
            "INSERT INTO kv_revisions (namespace, revision) VALUES (?1, 1)
             ON CONFLICT (namespace) DO UPDATE SET revision = revision + 1
             RETURNING revision",
        )?
        .query_row([namespace], |row| row.get(0))?)
}

fn entry(row: &rusqlite::Row<'_>) -> rusqlite::Result<(String, Vec<u8>, u64, String)> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
}

fn decode_entry(
    (key, value, revision, updated_at): (String, Vec<u8>, u64, String),
) -> Result<KvEntry, StoreError> {
    let updated_at = decode_time(&format!("kv key {key}: updated_at"), &updated_at)?;
    Ok(KvEntry {
        key,
        value,
        revision,
        updated_at,
    })
}

#[async_trait]
impl KvStore for SqliteStore {
    async fn kv_get(&self, namespace: &str, key: &str) -> Result<Option<KvEntry>, StoreError> {
        let (namespace, key) = (namespace.to_owned(), key.to_owned());
        let row = self
            .call(move |conn| {
                Ok(conn
                    .prepare_cached(
                        "SELECT key, value, revision, updated_at FROM kv
                         WHERE namespace = ?1 AND key = ?2",
                    )?
                    .query_row(params![namespace, key], entry)
                    .optional()?)
            })
            .await?;
        row.map(decode_entry).transpose()
    }

    async fn kv_put(
        &self,
        namespace: &str,
        key: &str,
        value: &[u8],
        expect: Expect,
    ) -> Result<KvWrite, StoreError> {
        let (namespace, key, value) = (namespace.to_owned(), key.to_owned(), value.to_vec());
        let now = encode_time(Utc::now());
        self.call(move |conn| {
            in_savepoint(conn, |conn| {
                let current = revision_of(conn, &namespace, &key)?;
                if !expect.allows(current) {
                    return Ok(KvWrite::Conflict { current });
                }
                let revision = next_revision(conn, &namespace)?;
                conn.prepare_cached(
                    "INSERT INTO kv (namespace, key, value, revision, updated_at)
                     VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,
                         revision = excluded.revision, updated_at = excluded.updated_at",
                )?
                .execute(params![namespace, key, value, revision, now])?;
                Ok(KvWrite::Done(revision))
            })
        })
        .await
    }

    async fn kv_delete(
        &self,
        namespace: &str,
        key: &str,
        expect: Expect,
    ) -> Result<KvWrite, StoreError> {
        let (namespace, key) = (namespace.to_owned(), key.to_owned());
        self.call(move |conn| {
            in_savepoint(conn, |conn| {
                let current = revision_of(conn, &namespace, &key)?;
                if !expect.allows(current) || (current.is_none() && expect != Expect::Any) {
                    return Ok(KvWrite::Conflict { current });
                }
                if current.is_none() {
                    let revision: Option<u64> = conn
                        .prepare_cached("SELECT revision FROM kv_revisions WHERE namespace = ?1")?
                        .query_row([&namespace], |row| row.get(0))
                        .optional()?;
                    return Ok(KvWrite::Done(revision.unwrap_or(0)));
                }
                let revision = next_revision(conn, &namespace)?;
                conn.prepare_cached("DELETE FROM kv WHERE namespace = ?1 AND key = ?2")?
                    .execute(params![namespace, key])?;
                Ok(KvWrite::Done(revision))
            })
        })
        .await
    }

    async fn kv_list(
        &self,
        namespace: &str,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<KvEntry>, StoreError> {
        let (namespace, prefix) = (namespace.to_owned(), prefix.to_owned());
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .call(move |conn| {
                let mut statement = conn.prepare_cached(
                    "SELECT key, value, revision, updated_at FROM kv
                     WHERE namespace = ?1 AND substr(key, 1, length(?2)) = ?2
                     ORDER BY key LIMIT ?3",
                )?;
                let rows = statement.query_map(params![namespace, prefix, limit], entry)?;
                Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
            })
            .await?;
        rows.into_iter().map(decode_entry).collect()
    }
}
