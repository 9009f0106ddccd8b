//! The event log in PostgreSQL: a batch is one statement of arrays, so it
//! lands whole or not at all in one round trip.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use uuid::Uuid;

use super::{PostgresStore, bigint, unsigned};
use crate::protocol::Event;
use crate::store::codec::{decode, encode, encode_event, encode_time};
use crate::store::{EventStore, SessionState, StoreError};

/// Inserts the events bound as arrays in `$1`–`$5` (none when empty).
macro_rules! insert_events {
    () => {
        "INSERT INTO events (session_id, seq, type, ts, body)
         SELECT session_id, seq, type, ts, body::json
         FROM UNNEST($1::uuid[], $2::bigint[], $3::text[], $4::timestamptz[], $5::text[])
              AS e(session_id, seq, type, ts, body)"
    };
}

#[async_trait]
impl EventStore for PostgresStore {
    async fn append_batch(
        &self,
        session: Uuid,
        events: &[Event],
        state: Option<&SessionState>,
    ) -> Result<(), StoreError> {
        if events.is_empty() && state.is_none() {
            return Ok(());
        }
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
        // A data-modifying CTE runs once whatever reads it, and the one
        // statement commits or fails whole; with no events it inserts
        // nothing and only saves the state.
        let sql = match state {
            None => insert_events!(),
            Some(_) => concat!(
                "WITH state AS (UPDATE sessions SET status = $7, usage = $8::json, \
                 updated_at = $9 WHERE id = $6) ",
                insert_events!()
            ),
        };
        let mut query = sqlx::query(sql)
            .bind(sessions)
            .bind(seqs)
            .bind(kinds)
            .bind(times)
            .bind(bodies);
        if let Some(state) = state {
            query = query
                .bind(session)
                .bind(state.status.as_str())
                .bind(encode("session usage", &state.usage)?)
                .bind(encode_time(state.updated_at));
        }
        query.execute(&self.pool).await?;
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
