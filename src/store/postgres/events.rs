//! The event log in PostgreSQL: a batch is one statement of arrays, so it
//! lands whole or not at all in one round trip, with the messages and the
//! state of the session that ride with it.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use uuid::Uuid;

use super::{PostgresStore, bigint, unsigned};
use crate::protocol::Event;
use crate::store::codec::{decode, encode, encode_event, encode_time};
use crate::store::usage::{encode_day, signed};
use crate::store::{Batch, EventStore, StoreError, UsageRow};
use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::QueryScalar;

/// Inserts the events bound as arrays in `$1`–`$5` (none when empty).
macro_rules! insert_events {
    () => {
        "INSERT INTO events (session_id, seq, type, ts, body)
         SELECT session_id, seq, type, ts, body::json
         FROM UNNEST($1::uuid[], $2::bigint[], $3::text[], $4::timestamptz[], $5::text[])
              AS e(session_id, seq, type, ts, body)"
    };
}

/// A batch: one `UPDATE` of the session's row (raising `next_message` by
/// the messages in `$7` and `last_seq` to the batch's last event, setting
/// status, usage and `updated_at` when `$8`–`$10` are not null), the
/// messages at the indices it freed, the lease `$11` deleted if `$12`
/// holds it, the usage rows in `$13`–`$22` added, and the events; answers
/// how many sessions it found. Data-modifying CTEs run once whatever
/// reads them, and the statement commits or fails whole.
const BATCH: &str = concat!(
    "WITH slot AS (
         UPDATE sessions SET next_message = next_message + cardinality($7::text[]),
             last_seq = GREATEST(last_seq, (SELECT COALESCE(MAX(seq), 0) FROM UNNEST($2::bigint[]) AS seq)),
             status = COALESCE($8, status), usage = COALESCE($9::json, usage),
             updated_at = COALESCE($10, updated_at)
         WHERE id = $6
         RETURNING next_message - cardinality($7::text[]) AS first
     ), kept AS (
         INSERT INTO messages (session_id, idx, body)
         SELECT $6, slot.first + m.ord - 1, m.body::json
         FROM slot, UNNEST($7::text[]) WITH ORDINALITY AS m(body, ord)
     ), freed AS (
         DELETE FROM leases WHERE name = $11 AND holder = $12
     ), spent AS (",
    add_usage!(
        "SELECT * FROM UNNEST($13::text[], $14::text[], $15::text[], $16::bigint[],
             $17::bigint[], $18::float8[], $19::bigint[], $20::bigint[], $21::float8[],
             $22::float8[])"
    ),
    "), logged AS (",
    insert_events!(),
    ") SELECT count(*) FROM slot"
);

#[async_trait]
impl EventStore for PostgresStore {
    async fn append_batch(&self, session: Uuid, batch: Batch<'_>) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let events = batch.events;
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
        let messages = batch
            .messages
            .iter()
            .map(|message| encode("message", message))
            .collect::<Result<Vec<_>, _>>()?;
        let state = batch.state;
        let query = sqlx::query_scalar(BATCH)
            .bind(sessions)
            .bind(seqs)
            .bind(kinds)
            .bind(times)
            .bind(bodies)
            .bind(session)
            .bind(messages)
            .bind(state.map(|state| state.status.as_str()))
            .bind(
                state
                    .map(|state| encode("session usage", &state.usage))
                    .transpose()?,
            )
            .bind(state.map(|state| encode_time(state.updated_at)))
            .bind(batch.release.map(|release| release.name.as_str()))
            .bind(batch.release.map(|release| release.holder.as_str()));
        let found: i64 = bind_usage(query, batch.usage).fetch_one(&self.pool).await?;
        if found == 0 && !batch.messages.is_empty() {
            return Err(StoreError::Io(format!(
                "no session {session} to append messages to"
            )));
        }
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

/// Binds usage rows as the ten arrays `$13`–`$22`, one per column.
fn bind_usage<'q>(
    query: QueryScalar<'q, Postgres, i64, PgArguments>,
    rows: &[UsageRow],
) -> QueryScalar<'q, Postgres, i64, PgArguments> {
    let column = |f: fn(&UsageRow) -> i64| rows.iter().map(f).collect::<Vec<_>>();
    let real = |f: fn(&UsageRow) -> f64| rows.iter().map(f).collect::<Vec<_>>();
    query
        .bind(rows.iter().map(|r| r.owner.clone()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| encode_day(r.day)).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.model.clone()).collect::<Vec<_>>())
        .bind(column(|r| signed(r.counts.input_tokens)))
        .bind(column(|r| signed(r.counts.output_tokens)))
        .bind(real(|r| r.counts.cost_usd))
        .bind(column(|r| signed(r.counts.turns)))
        .bind(column(|r| signed(r.counts.tool_calls)))
        .bind(real(|r| r.counts.sandbox_cpu_s))
        .bind(real(|r| r.counts.sandbox_wall_s))
}
