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
use crate::store::{Batch, Creation, EventStore, Release, StoreError, UsageRow};
use sqlx::postgres::PgArguments;
use sqlx::query::QueryScalar;
use sqlx::{PgConnection, Postgres};

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
         event_bytes = event_bytes + (SELECT COALESCE(sum(octet_length(b)), 0) FROM UNNEST($5::text[]) AS b),
         status = COALESCE($8, status), usage = COALESCE($9::json, usage),
         updated_at = COALESCE($10, updated_at)
     WHERE id = $6
     RETURNING next_message - cardinality($7::text[]) AS first",
    "DELETE FROM leases WHERE name = $11 AND holder = $12"
);

/// The batch that makes its session: the row inserted from `$23`–`$31`
/// and `$33`–`$34`
/// (status, usage and `updated_at` from `$8`–`$10` when not null), and
/// the lease `$11` taken for `$12` for `$32` microseconds when `$11` is
/// not null. A session with the same id (or a lease of the same name)
/// fails the statement.
const CREATE_BATCH: &str = batch!(
    "INSERT INTO sessions (id, name, kind, owner, options, status, usage, ephemeral,
         created_at, updated_at, origin, metadata, next_message, last_seq, event_bytes)
     VALUES ($6, $23, $24, $25, $26::json, COALESCE($8, $27), COALESCE($9, $28)::json, $29,
         $30, COALESCE($10, $31), $33, $34::json, cardinality($7::text[]),
         (SELECT COALESCE(MAX(seq), 0) FROM UNNEST($2::bigint[]) AS seq),
         (SELECT COALESCE(sum(octet_length(b)), 0) FROM UNNEST($5::text[]) AS b))
     RETURNING 0::bigint AS first",
    "INSERT INTO leases (name, holder, expires_at, fence)
     SELECT $11, $12, now() + $32 * interval '1 microsecond', 1 WHERE $11 IS NOT NULL"
);

/// Several sessions' batches in one statement, none of them making its
/// session: their rows (`$6`–`$13`, a row per batch: id, messages added,
/// last event's `seq`, status, usage, `updated_at`, the lease given up and
/// its holder), their messages (`$14`–`$16`: session, index in its batch,
/// body), their usage rows summed by key, day and model (`$17`–`$26`) and
/// their events; answers the ids of the sessions it found. Each batch does
/// what [`BATCH`] does for it. The sessions' rows are locked in the
/// order of their ids first (as a group of takes locks them), and usage
/// keys are added in one order, so two groups sharing sessions or keys
/// wait for each other instead of deadlocking.
pub(super) const GROUP: &str = concat!(
    "WITH b AS (
         SELECT * FROM UNNEST($6::uuid[], $7::bigint[], $8::bigint[], $9::text[], $10::text[],
             $11::text[], $12::text[], $13::text[])
             AS b(id, added, last, status, usage, updated_at, lease, holder)
     ), locked AS (
         SELECT s.id FROM sessions s JOIN b ON s.id = b.id ORDER BY s.id FOR NO KEY UPDATE OF s
     ), slot AS (
         UPDATE sessions s SET next_message = s.next_message + b.added,
             last_seq = GREATEST(s.last_seq, b.last),
             event_bytes = s.event_bytes + COALESCE((SELECT sum(octet_length(e.body))
                 FROM UNNEST($1::uuid[], $5::text[]) AS e(session_id, body)
                 WHERE e.session_id = s.id), 0),
             status = COALESCE(b.status, s.status), usage = COALESCE(b.usage::json, s.usage),
             updated_at = COALESCE(b.updated_at, s.updated_at)
         FROM b JOIN locked ON locked.id = b.id WHERE s.id = b.id
         RETURNING s.id, s.next_message - b.added AS first
     ), kept AS (
         INSERT INTO messages (session_id, idx, body)
         SELECT m.session_id, slot.first + m.at, m.body::json
         FROM UNNEST($14::uuid[], $15::bigint[], $16::text[]) AS m(session_id, at, body)
         JOIN slot ON slot.id = m.session_id
     ), lease AS (
         DELETE FROM leases l USING b WHERE l.name = b.lease AND l.holder = b.holder
     ), spent AS (",
    add_usage!(
        "SELECT owner, day, model, sum(i), sum(o), sum(c), sum(t), sum(tc), sum(cpu), sum(wall)
         FROM UNNEST($17::text[], $18::text[], $19::text[], $20::bigint[], $21::bigint[],
             $22::float8[], $23::bigint[], $24::bigint[], $25::float8[], $26::float8[])
             AS u(owner, day, model, i, o, c, t, tc, cpu, wall)
         GROUP BY owner, day, model"
    ),
    "), logged AS (",
    insert_events!(),
    ") SELECT id FROM slot"
);

/// A batch encoded for PostgreSQL, owning what it binds: it can wait in
/// the queue of batches to group ([`super::grouped`]) without borrowing
/// its caller's.
pub(super) struct Encoded {
    /// The events' columns, one array each.
    sessions: Vec<Uuid>,
    seqs: Vec<i64>,
    kinds: Vec<&'static str>,
    times: Vec<DateTime<Utc>>,
    bodies: Vec<String>,
    messages: Vec<String>,
    status: Option<&'static str>,
    usage: Option<String>,
    updated_at: Option<String>,
    release: Option<Release>,
    spent: Vec<UsageRow>,
}

impl Encoded {
    fn new(batch: &Batch<'_>) -> Result<Encoded, StoreError> {
        let events = batch.events;
        let mut encoded = Encoded {
            sessions: Vec::with_capacity(events.len()),
            seqs: Vec::with_capacity(events.len()),
            kinds: Vec::with_capacity(events.len()),
            times: Vec::with_capacity(events.len()),
            bodies: Vec::with_capacity(events.len()),
            messages: batch
                .messages
                .iter()
                .map(|message| encode("message", message))
                .collect::<Result<_, _>>()?,
            status: batch.state.map(|state| state.status.as_str()),
            usage: batch
                .state
                .map(|state| encode("session usage", &state.usage))
                .transpose()?,
            updated_at: batch.state.map(|state| encode_time(state.updated_at)),
            release: batch.release.cloned(),
            spent: batch.usage.to_vec(),
        };
        for event in events {
            let (kind, body) = encode_event(event)?;
            encoded.sessions.push(event.session_id);
            encoded.seqs.push(bigint(event.seq));
            encoded.kinds.push(kind);
            encoded.times.push(event.ts);
            encoded.bodies.push(body);
        }
        Ok(encoded)
    }

    /// Whether a session missing from the store fails this batch: it
    /// brings messages to append.
    pub(super) fn needs_its_session(&self) -> bool {
        !self.messages.is_empty()
    }

    /// The `seq` of the batch's last event; 0 without events.
    fn last_seq(&self) -> i64 {
        self.seqs.iter().copied().max().unwrap_or(0)
    }
}

/// The error of a batch with messages whose session was not found.
pub(super) fn no_session(session: Uuid) -> StoreError {
    StoreError::Io(format!("no session {session} to append messages to"))
}

/// [`BATCH`] or [`CREATE_BATCH`] for one batch, bound: `$1`–`$22`, and
/// the created session's `$23`–`$32`.
fn single<'q>(
    session: Uuid,
    encoded: &'q Encoded,
    create: Option<Creation<'_>>,
) -> Result<QueryScalar<'q, Postgres, i64, PgArguments>, StoreError> {
    let (sql, lease) = match create {
        Some(create) => (CREATE_BATCH, create.lease.map(|(lease, _)| lease)),
        None => (BATCH, encoded.release.as_ref()),
    };
    let query = sqlx::query_scalar(sql)
        .bind(&encoded.sessions)
        .bind(&encoded.seqs)
        .bind(&encoded.kinds)
        .bind(&encoded.times)
        .bind(&encoded.bodies)
        .bind(session)
        .bind(&encoded.messages)
        .bind(encoded.status)
        .bind(encoded.usage.as_deref())
        .bind(encoded.updated_at.as_deref())
        .bind(lease.map(|lease| lease.name.clone()))
        .bind(lease.map(|lease| lease.holder.clone()));
    let query = bind_usage(query, &encoded.spent);
    match create {
        Some(create) => bind_creation(query, create),
        None => Ok(query),
    }
}

/// Writes one batch not making its session, alone, on `conn`: whether its
/// session was found.
pub(super) async fn write_one(
    conn: &mut PgConnection,
    session: Uuid,
    encoded: &Encoded,
) -> Result<bool, StoreError> {
    let found: i64 = single(session, encoded, None)?.fetch_one(conn).await?;
    Ok(found > 0)
}

/// [`GROUP`] for `batches` (at most one of each session), bound.
pub(super) fn group<'q>(
    batches: impl Iterator<Item = (Uuid, &'q Encoded)> + Clone,
) -> QueryScalar<'q, Postgres, Uuid, PgArguments> {
    let all = || batches.clone().map(|(_, encoded)| encoded);
    let mut message_sessions = Vec::new();
    let mut message_at = Vec::new();
    let mut messages = Vec::new();
    for (session, encoded) in batches.clone() {
        for (at, message) in encoded.messages.iter().enumerate() {
            message_sessions.push(session);
            message_at.push(bigint(at as u64));
            messages.push(message.as_str());
        }
    }
    let spent: Vec<UsageRow> = all()
        .flat_map(|encoded| encoded.spent.iter().cloned())
        .collect();
    let query = sqlx::query_scalar(GROUP)
        .bind(
            all()
                .flat_map(|e| e.sessions.iter().copied())
                .collect::<Vec<_>>(),
        )
        .bind(
            all()
                .flat_map(|e| e.seqs.iter().copied())
                .collect::<Vec<_>>(),
        )
        .bind(
            all()
                .flat_map(|e| e.kinds.iter().copied())
                .collect::<Vec<_>>(),
        )
        .bind(
            all()
                .flat_map(|e| e.times.iter().copied())
                .collect::<Vec<_>>(),
        )
        .bind(
            all()
                .flat_map(|e| e.bodies.iter().map(String::as_str))
                .collect::<Vec<_>>(),
        )
        .bind(
            batches
                .clone()
                .map(|(session, _)| session)
                .collect::<Vec<_>>(),
        )
        .bind(
            all()
                .map(|e| bigint(e.messages.len() as u64))
                .collect::<Vec<_>>(),
        )
        .bind(all().map(Encoded::last_seq).collect::<Vec<_>>())
        .bind(all().map(|e| e.status).collect::<Vec<_>>())
        .bind(all().map(|e| e.usage.as_deref()).collect::<Vec<_>>())
        .bind(all().map(|e| e.updated_at.as_deref()).collect::<Vec<_>>())
        .bind(
            all()
                .map(|e| e.release.as_ref().map(|r| r.name.as_str()))
                .collect::<Vec<_>>(),
        )
        .bind(
            all()
                .map(|e| e.release.as_ref().map(|r| r.holder.as_str()))
                .collect::<Vec<_>>(),
        )
        .bind(message_sessions)
        .bind(message_at)
        .bind(messages);
    bind_usage(query, &spent)
}

#[async_trait]
impl EventStore for PostgresStore {
    /// A batch that makes its session is written alone; any other waits
    /// to be written with the batches of other sessions that wait with it
    /// ([`super::grouped`]).
    async fn append_batch(&self, session: Uuid, batch: Batch<'_>) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let encoded = Encoded::new(&batch)?;
        let Some(create) = batch.create else {
            return self.append_grouped(session, encoded).await;
        };
        let found: i64 = single(session, &encoded, Some(create))?
            .fetch_one(&self.pool)
            .await?;
        if found == 0 && encoded.needs_its_session() {
            return Err(no_session(session));
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
fn bind_usage<'q, O>(
    query: QueryScalar<'q, Postgres, O, PgArguments>,
    rows: &[UsageRow],
) -> QueryScalar<'q, Postgres, O, PgArguments> {
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

/// Binds a created session's record and its lease's length, `$23`–`$34`.
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
        .bind(ttl)
        .bind(record.origin.clone())
        .bind(encode("session metadata", &record.metadata)?))
}

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
