//! Retained bus messages in SQLite: one row per message, one last `seq`
//! per stream.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::{Connection, params};

use super::{SqliteStore, in_savepoint};
use crate::store::{BusCursor, BusRecord, BusStore, BusStream, StoreError};

fn micros(time: DateTime<Utc>) -> i64 {
    time.timestamp_micros()
}

/// Appends `messages` and raises each stream's last `seq`; run in a
/// savepoint, so that a batch lands whole or not at all.
fn append(conn: &Connection, messages: &[BusRecord]) -> Result<(), StoreError> {
    let mut insert = conn.prepare_cached(
        "INSERT INTO bus_messages (namespace, stream, subject, seq, time_us, payload)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    let mut last = conn.prepare_cached(
        "INSERT INTO bus_streams (namespace, stream, last_seq) VALUES (?1, ?2, ?3)
         ON CONFLICT (namespace, stream)
         DO UPDATE SET last_seq = max(last_seq, excluded.last_seq)",
    )?;
    for m in messages {
        insert.execute(params![
            m.namespace,
            m.stream,
            m.subject,
            m.seq,
            micros(m.time),
            m.payload
        ])?;
        last.execute(params![m.namespace, m.stream, m.seq])?;
    }
    Ok(())
}

#[async_trait]
impl BusStore for SqliteStore {
    async fn bus_append(&self, messages: &[BusRecord]) -> Result<(), StoreError> {
        let messages = messages.to_vec();
        self.call(move |conn| in_savepoint(conn, |conn| append(conn, &messages)))
            .await
    }

    async fn bus_read(
        &self,
        namespace: &str,
        cursor: BusCursor,
        limit: usize,
    ) -> Result<Vec<(u64, BusRecord)>, StoreError> {
        let owned = namespace.to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let from_time = cursor.from_time.map_or(i64::MIN, micros);
        let after = i64::try_from(cursor.after).unwrap_or(i64::MAX);
        let rows = self
            .call(move |conn| {
                let mut statement = conn.prepare_cached(
                    "SELECT position, stream, subject, seq, time_us, payload FROM bus_messages
                     WHERE namespace = ?1 AND position > ?2 AND time_us >= ?3
                     ORDER BY position LIMIT ?4",
                )?;
                let rows = statement.query_map(params![owned, after, from_time, limit], |row| {
                    Ok((
                        row.get::<_, u64>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?,
                        row.get::<_, u64>(3)?,
                        row.get::<_, i64>(4)?,
                        row.get::<_, Vec<u8>>(5)?,
                    ))
                })?;
                Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
            })
            .await?;
        rows.into_iter()
            .map(|(position, stream, subject, seq, time_us, payload)| {
                let time = DateTime::from_timestamp_micros(time_us).ok_or_else(|| {
                    StoreError::Corrupt(format!("bus message {position}: time {time_us}"))
                })?;
                Ok((
                    position,
                    BusRecord {
                        namespace: namespace.to_owned(),
                        stream,
                        subject,
                        seq,
                        time,
                        payload,
                    },
                ))
            })
            .collect()
    }

    async fn bus_streams(&self) -> Result<Vec<BusStream>, StoreError> {
        self.call(|conn| {
            let mut statement = conn.prepare_cached(
                "SELECT s.namespace, s.stream, s.last_seq,
                     (SELECT count(*) FROM bus_messages m
                      WHERE m.namespace = s.namespace AND m.stream = s.stream)
                 FROM bus_streams s",
            )?;
            let rows = statement.query_map([], |row| {
                Ok(BusStream {
                    namespace: row.get(0)?,
                    stream: row.get(1)?,
                    last_seq: row.get(2)?,
                    retained: row.get(3)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    async fn bus_prune(
        &self,
        namespace: &str,
        stream: &str,
        through_seq: u64,
        older_than: Option<DateTime<Utc>>,
    ) -> Result<u64, StoreError> {
        let (namespace, stream) = (namespace.to_owned(), stream.to_owned());
        let older_than = older_than.map_or(i64::MIN, micros);
        self.call(move |conn| {
            let deleted = conn
                .prepare_cached(
                    "DELETE FROM bus_messages WHERE namespace = ?1 AND stream = ?2
                     AND (seq <= ?3 OR time_us < ?4)",
                )?
                .execute(params![namespace, stream, through_seq, older_than])?;
            Ok(deleted as u64)
        })
        .await
    }
}
