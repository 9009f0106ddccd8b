//! The event log in PostgreSQL: a batch is one statement of arrays, so it
//! lands whole or not at all in one round trip.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use uuid::Uuid;

use super::{PostgresStore, bigint, unsigned};
use crate::protocol::Event;
use crate::store::codec::{decode, encode_event};
use crate::store::{EventStore, StoreError};

#[async_trait]
impl EventStore for PostgresStore {
    async fn append_events(&self, events: &[Event]) -> Result<(), StoreError> {
        let mut sessions: Vec<Uuid> = Vec::with_capacity(events.len());
        let mut seqs: Vec<i64> = Vec::with_capacity(events.len());
        let mut kinds = Vec::with_capacity(events.len());
        let mut times: Vec<DateTime<Utc>> = Vec::with_capacity(events.len());
        let mut bodies = Vec::with_capacity(events.len());
        for event in events {
            let (kind, body) = encode_event(event)?;
            sessions.push(event.session_id);
            seqs.push(bigint(event.seq));
            kinds.push(kind);
            times.push(event.ts);
            bodies.push(body);
        }
        sqlx::query(
            "INSERT INTO events (session_id, seq, type, ts, body)
             SELECT session_id, seq, type, ts, body::json
             FROM UNNEST($1::uuid[], $2::bigint[], $3::text[], $4::timestamptz[], $5::text[])
                  AS e(session_id, seq, type, ts, body)",
        )
        .bind(sessions)
        .bind(seqs)
        .bind(kinds)
        .bind(times)
        .bind(bodies)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn events_since(
        &self,
        id: Uuid,
        since: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        let rows = sqlx::query(
            "SELECT body::text FROM events WHERE session_id = $1 AND seq > $2
             ORDER BY seq LIMIT $3",
        )
        .bind(id)
        .bind(bigint(since))
        .bind(bigint(limit as u64))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| decode("event", row.try_get(0)?))
            .collect()
    }

    async fn last_seq(&self, id: Uuid) -> Result<u64, StoreError> {
        let last: i64 =
            sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) FROM events WHERE session_id = $1")
                .bind(id)
                .fetch_one(&self.pool)
                .await?;
        unsigned("last seq", last)
    }
}
