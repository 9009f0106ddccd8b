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
use crate::store::{Batch, Creation, EventStore, StoreError, UsageRow};
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

/// A batch, around its `slot` (the session's row, answering `first`, the
/// index of the batch's first message) and its `lease` CTE: the messages
/// in `$7` at the indices from `first`, the usage rows in `$13`–`$22`
/// added, and the events; answers how many sessions it found.
/// Data-modifying CTEs run once whatever reads them, and the statement
/// commits or fails whole.
macro_rules! batch {
    ($slot:expr, $lease:expr) => {
        concat!(
            "WITH slot AS (",
            $slot,
            "), kept AS (
                 INSERT INTO messages (session_id, idx, body)
                 SELECT $6, slot.first + m.ord - 1, m.body::json
                 FROM slot, UNNEST($7::text[]) WITH ORDINALITY AS m(body, ord)
             ), lease AS (",
            $lease,
            "), spent AS (",
            add_usage!(
                "SELECT * FROM UNNEST($13::text[], $14::text[], $15::text[], $16::bigint[],
                     $17::bigint[], $18::float8[], $19::bigint[], $20::bigint[], $21::float8[],
                     $22::float8[])"
            ),
            "), logged AS (",
            insert_events!(),
            ") SELECT count(*) FROM slot"
        )
    };
}

/// A batch of a stored session: one `UPDATE` of its row (raising
/// `next_message` by the messages in `$7` and `last_seq` to the batch's
/// last event, setting status, usage and `updated_at` when `$8`–`$10` are
/// not null), and the lease `$11` deleted if `$12` holds it.
const BATCH: &str = batch!(
    "UPDATE sessions SET next_message = next_message + cardinality($7::text[]),
         last_seq = GREATEST(last_seq, (SELECT COALESCE(MAX(seq), 0) FROM UNNEST($2::bigint[]) AS seq)),
         status = COALESCE($8, status), usage = COALESCE($9::json, usage),
         updated_at = COALESCE($10, updated_at)
     WHERE id = $6
     RETURNING next_message - cardinality($7::text[]) AS first",
    "DELETE FROM leases WHERE name = $11 AND holder = $12"
);

/// The batch that makes its session: the row inserted from `$23`–`$31`
/// (status, usage and `updated_at` from `$8`–`$10` when not null), and
/// the lease `$11` taken for `$12` for `$32` microseconds when `$11` is
/// not null. A session with the same id (or a lease of the same name)
/// fails the statement.
const CREATE_BATCH: &str = batch!(
    "INSERT INTO sessions (id, name, kind, owner, options, status, usage, ephemeral,
         created_at, updated_at, next_message, last_seq)
     VALUES ($6, $23, $24, $25, $26::json, COALESCE($8, $27), COALESCE($9, $28)::json, $29,
         $30, COALESCE($10, $31), cardinality($7::text[]),
         (SELECT COALESCE(MAX(seq), 0) FROM UNNEST($2::bigint[]) AS seq))
     RETURNING 0::bigint AS first",
    "INSERT INTO leases (name, holder, expires_at, fence)
     SELECT $11, $12, now() + $32 * interval '1 microsecond', 1 WHERE $11 IS NOT NULL"
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
        let (sql, lease) = match batch.create {
            Some(create) => (CREATE_BATCH, create.lease.map(|(lease, _)| lease)),
            None => (BATCH, batch.release),
        };
        let query = sqlx::query_scalar(sql)
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
            .bind(lease.map(|lease| lease.name.as_str()))
            .bind(lease.map(|lease| lease.holder.as_str()));
        let query = bind_usage(query, batch.usage);
        let query = match batch.create {
            Some(create) => bind_creation(query, create)?,
            None => query,
        };
        let found: i64 = query.fetch_one(&self.pool).await?;
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

/// Binds a created session's record and its lease's length, `$23`–`$32`.
fn bind_creation<'q>(
    query: QueryScalar<'q, Postgres, i64, PgArguments>,
    create: Creation<'_>,
) -> Result<QueryScalar<'q, Postgres, i64, PgArguments>, StoreError> {
    let record = create.record;
    let ttl = create.lease.map_or(0, |(_, ttl)| {
        i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX)
    });
    Ok(query
        .bind(record.name.clone())
        .bind(record.kind.as_str().to_owned())
        .bind(record.owner.clone())
        .bind(encode("session options", &record.options)?)
        .bind(record.status.as_str())
        .bind(encode("session usage", &record.usage)?)
        .bind(record.ephemeral)
        .bind(encode_time(record.created_at))
        .bind(encode_time(record.updated_at))
        .bind(ttl))
}
