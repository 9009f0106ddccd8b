//! The event log in SQLite.

use async_trait::async_trait;
use chrono::Utc;
use rusqlite::{Connection, params};
use uuid::Uuid;

use super::rows::{SessionRow, decode, encode, encode_time};
use super::{SqliteStore, in_savepoint};
use crate::protocol::Event;
use crate::store::codec::encode_event;
use crate::store::{Batch, EventStore, StoreError};

/// Saves a session's status, usage and `updated_at`.
const UPDATE_STATE: &str =
    "UPDATE sessions SET status = ?2, usage = ?3, updated_at = ?4 WHERE id = ?1";

/// Adds a batch's event bytes to its session's count (`storage_mb`).
const ADD_EVENT_BYTES: &str = "UPDATE sessions SET event_bytes = event_bytes + ?2 WHERE id = ?1";

/// Appends `bodies` to the session's messages, after those stored.
pub(super) fn insert_messages(
    conn: &Connection,
    id: &str,
    bodies: &[String],
) -> Result<(), StoreError> {
    if bodies.is_empty() {
        return Ok(());
    }
    let next: i64 = conn
        .prepare_cached("SELECT COALESCE(MAX(idx) + 1, 0) FROM messages WHERE session_id = ?1")?
        .query_row([id], |row| row.get(0))?;
    let mut insert =
        conn.prepare_cached("INSERT INTO messages (session_id, idx, body) VALUES (?1, ?2, ?3)")?;
    for (idx, body) in (next..).zip(bodies) {
        insert.execute(params![id, idx, body])?;
    }
    Ok(())
}

/// Gives a lease up if its holder has it.
pub(super) const RELEASE: &str = "DELETE FROM leases WHERE name = ?1 AND holder = ?2";

#[async_trait]
impl EventStore for SqliteStore {
    async fn append_batch(&self, session: Uuid, batch: Batch<'_>) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let rows = batch
            .events
            .iter()
            .map(|event| {
                let (kind, body) = encode_event(event)?;
                Ok((
                    event.session_id.to_string(),
                    event.seq,
                    kind,
                    encode_time(event.ts),
                    body,
                ))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let messages = batch
            .messages
            .iter()
            .map(|message| encode("message", message))
            .collect::<Result<Vec<_>, _>>()?;
        let state = match batch.state {
            Some(state) => Some((
                state.status.as_str(),
                encode("session usage", &state.usage)?,
                encode_time(state.updated_at),
            )),
            None => None,
        };
        let id = session.to_string();
        let event_bytes: i64 = rows.iter().map(|row| row.4.len() as i64).sum();
        let release = batch.release.cloned();
        let usage = batch.usage.to_vec();
        let create = match batch.create {
            Some(create) => Some((
                SessionRow::encode(create.record)?,
                create.lease.map(|(lease, ttl)| {
                    let ttl_us = i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX);
                    (lease.clone(), ttl_us)
                }),
            )),
            None => None,
        };
        self.call(move |conn| {
            let write = |conn: &Connection| -> Result<(), StoreError> {
                if let Some((row, lease)) = &create {
                    super::sessions::insert_session(conn, row)?;
                    if let Some((lease, ttl_us)) = lease {
                        let expires_us = Utc::now().timestamp_micros().saturating_add(*ttl_us);
                        conn.prepare_cached(
                            "INSERT INTO leases (name, holder, expires_us, fence) VALUES (?1, ?2, ?3, 1)",
                        )?
                        .execute(params![lease.name, lease.holder, expires_us])?;
                    }
                }
                let mut statement = conn.prepare_cached(
                    "INSERT INTO events (session_id, seq, type, ts, body) VALUES (?1, ?2, ?3, ?4, ?5)",
                )?;
                for (id, seq, kind, ts, body) in &rows {
                    statement.execute(params![id, seq, kind, ts, body])?;
                }
                if event_bytes > 0 {
                    conn.prepare_cached(ADD_EVENT_BYTES)?
                        .execute(params![id, event_bytes])?;
                }
                insert_messages(conn, &id, &messages)?;
                if let Some((status, usage, updated_at)) = &state {
                    conn.prepare_cached(UPDATE_STATE)?
                        .execute(params![id, status, usage, updated_at])?;
                }
                if let Some(release) = &release {
                    conn.prepare_cached(RELEASE)?
                        .execute(params![release.name, release.holder])?;
                }
                for row in &usage {
                    super::usage::add_usage(conn, row)?;
                }
                Ok(())
            };
            // One statement undoes itself when it fails; several need a
            // savepoint.
            let statements = rows.len()
                + usize::from(event_bytes > 0)
                + 2 * usize::from(create.is_some())
                + usize::from(state.is_some())
                + usize::from(release.is_some())
                + usage.len();
            if statements == 1 && messages.is_empty() {
                write(conn)
            } else {
                in_savepoint(conn, write)
            }
        })
        .await
    }

    async fn events_since(
        &self,
        id: Uuid,
        since: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        let id = id.to_string();
        // Bounds past what SQLite counts in mean "everything after".
        let since = i64::try_from(since).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let bodies = self
            .call(move |conn| {
                let mut statement = conn.prepare_cached(
                    "SELECT body FROM events WHERE session_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
                )?;
                let rows =
                    statement.query_map(params![id, since, limit], |row| row.get::<_, String>(0))?;
                Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
            })
            .await?;
        bodies.iter().map(|body| decode("event", body)).collect()
    }

    async fn last_seq(&self, id: Uuid) -> Result<u64, StoreError> {
        let id = id.to_string();
        self.call(move |conn| {
            Ok(conn
                .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM events WHERE session_id = ?1")?
                .query_row([id], |row| row.get(0))?)
        })
        .await
    }
}
