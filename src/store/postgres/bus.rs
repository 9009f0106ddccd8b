//! Retained bus messages in PostgreSQL: one row per message, one last
//! `seq` per stream.
//!
//! Appends take one lock for the whole database before they number their
//! rows: an identity is handed out when a row is inserted, not when it is
//! committed, so two appenders running at once could commit positions out
//! of order and a reader past the later one would never see the earlier.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::{PostgresStore, bigint, unsigned};
use crate::store::{BusCursor, BusRecord, BusStore, BusStream, StoreError};

/// The advisory lock that orders bus appends ("bus" in ASCII).
const APPEND_LOCK: i64 = 0x0062_7573;

fn record(namespace: &str, row: &PgRow) -> Result<(u64, BusRecord), StoreError> {
    let position = unsigned("bus position", row.try_get(0)?)?;
    Ok((
        position,
        BusRecord {
            namespace: namespace.to_owned(),
            stream: row.try_get(1)?,
            subject: row.try_get(2)?,
            seq: unsigned(&format!("bus message {position}: seq"), row.try_get(3)?)?,
            time: row.try_get(4)?,
            payload: row.try_get(5)?,
        },
    ))
}

#[async_trait]
impl BusStore for PostgresStore {
    async fn bus_append(&self, messages: &[BusRecord]) -> Result<(), StoreError> {
        if messages.is_empty() {
            return Ok(());
        }
        let mut namespaces = Vec::with_capacity(messages.len());
        let mut streams = Vec::with_capacity(messages.len());
        let mut subjects = Vec::with_capacity(messages.len());
        let mut seqs: Vec<i64> = Vec::with_capacity(messages.len());
        let mut times: Vec<DateTime<Utc>> = Vec::with_capacity(messages.len());
        let mut payloads: Vec<&[u8]> = Vec::with_capacity(messages.len());
        for m in messages {
            namespaces.push(m.namespace.as_str());
            streams.push(m.stream.as_str());
            subjects.push(m.subject.as_str());
            seqs.push(bigint(m.seq));
            times.push(m.time);
            payloads.push(&m.payload);
        }
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(APPEND_LOCK)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "WITH appended AS (
                 INSERT INTO bus_messages (namespace, stream, subject, seq, time, payload)
                 SELECT namespace, stream, subject, seq, time, payload
                 FROM UNNEST($1::text[], $2::text[], $3::text[], $4::bigint[],
                             $5::timestamptz[], $6::bytea[]) WITH ORDINALITY
                      AS m(namespace, stream, subject, seq, time, payload, ord)
                 ORDER BY ord
                 RETURNING namespace, stream, seq)
             INSERT INTO bus_streams (namespace, stream, last_seq)
             SELECT namespace, stream, MAX(seq) FROM appended GROUP BY namespace, stream
             ON CONFLICT (namespace, stream)
             DO UPDATE SET last_seq = GREATEST(bus_streams.last_seq, excluded.last_seq)",
        )
        .bind(namespaces)
        .bind(streams)
        .bind(subjects)
        .bind(seqs)
        .bind(times)
        .bind(payloads)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn bus_read(
        &self,
        namespace: &str,
        cursor: BusCursor,
        limit: usize,
    ) -> Result<Vec<(u64, BusRecord)>, StoreError> {
        let rows = sqlx::query(
            "SELECT position, stream, subject, seq, time, payload FROM bus_messages
             WHERE namespace = $1 AND position > $2 AND ($3::timestamptz IS NULL OR time >= $3)
             ORDER BY position LIMIT $4",
        )
        .bind(namespace)
        .bind(bigint(cursor.after))
        .bind(cursor.from_time)
        .bind(bigint(limit as u64))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| record(namespace, row)).collect()
    }

    async fn bus_streams(&self) -> Result<Vec<BusStream>, StoreError> {
        let rows = sqlx::query(
            "SELECT s.namespace, s.stream, s.last_seq,
                 (SELECT count(*) FROM bus_messages m
                  WHERE m.namespace = s.namespace AND m.stream = s.stream)
             FROM bus_streams s",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(BusStream {
                    namespace: row.try_get(0)?,
                    stream: row.try_get(1)?,
                    last_seq: unsigned("bus stream last seq", row.try_get(2)?)?,
                    retained: unsigned("bus stream count", row.try_get(3)?)?,
                })
            })
            .collect()
    }

    async fn bus_prune(
        &self,
        namespace: &str,
        stream: &str,
        through_seq: u64,
        older_than: Option<DateTime<Utc>>,
    ) -> Result<u64, StoreError> {
        let deleted = sqlx::query(
            "DELETE FROM bus_messages WHERE namespace = $1 AND stream = $2
             AND (seq <= $3 OR time < $4)",
        )
        .bind(namespace)
        .bind(stream)
        .bind(bigint(through_seq))
        .bind(older_than)
        .execute(&self.pool)
        .await?;
        Ok(deleted.rows_affected())
    }
}
