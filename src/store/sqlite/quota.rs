//! Quota slots and window counters in SQLite. One writer thread runs each
//! job alone, so a count and the insert it allows are one step. Times are
//! this host's clock, the only one a SQLite file has.

use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use rusqlite::params;

use super::{SqliteStore, in_savepoint};
use crate::protocol::SessionStatus;
use crate::store::{QuotaStore, StoreError};

fn micros(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX)
}

#[async_trait]
impl QuotaStore for SqliteStore {
    async fn slot_take(
        &self,
        pool: &str,
        holder: &str,
        replica: &str,
        limit: u64,
        ttl: Duration,
        sessions_of: Option<&str>,
    ) -> Result<bool, StoreError> {
        let (pool, holder, replica) = (pool.to_owned(), holder.to_owned(), replica.to_owned());
        let sessions_of = sessions_of.map(str::to_owned);
        let ttl_us = micros(ttl);
        // In a savepoint: a failure leaves no expired slot half removed.
        self.call(move |conn| in_savepoint(conn, |conn| {
            let now = Utc::now().timestamp_micros();
            let expires = now.saturating_add(ttl_us);
            conn.prepare_cached("DELETE FROM quota_slots WHERE pool = ?1 AND expires_us <= ?2")?
                .execute(params![pool, now])?;
            let renewed = conn
                .prepare_cached(
                    "UPDATE quota_slots SET expires_us = ?3 WHERE pool = ?1 AND holder = ?2",
                )?
                .execute(params![pool, holder, expires])?;
            if renewed > 0 {
                return Ok(true);
            }
            let mut held: u64 = conn
                .prepare_cached("SELECT count(*) FROM quota_slots WHERE pool = ?1")?
                .query_row([&pool], |row| row.get(0))?;
            if let Some(sessions_of) = &sessions_of {
                let open: u64 = conn
                    .prepare_cached(
                        "SELECT count(*) FROM sessions
                         WHERE owner = ?1 AND status <> ?2 AND ephemeral = 0",
                    )?
                    .query_row(params![sessions_of, SessionStatus::Closed.as_str()], |row| {
                        row.get(0)
                    })?;
                held += open;
            }
            if held >= limit {
                return Ok(false);
            }
            conn.prepare_cached(
                "INSERT INTO quota_slots (pool, holder, replica, expires_us) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![pool, holder, replica, expires])?;
            Ok(true)
        }))
        .await
    }

    async fn slot_release(&self, pool: &str, holder: &str) -> Result<(), StoreError> {
        let (pool, holder) = (pool.to_owned(), holder.to_owned());
        self.call(move |conn| {
            conn.prepare_cached("DELETE FROM quota_slots WHERE pool = ?1 AND holder = ?2")?
                .execute(params![pool, holder])?;
            Ok(())
        })
        .await
    }

    async fn slots_renew(&self, replica: &str, ttl: Duration) -> Result<u64, StoreError> {
        let replica = replica.to_owned();
        let ttl_us = micros(ttl);
        self.call(move |conn| {
            let expires = Utc::now().timestamp_micros().saturating_add(ttl_us);
            let renewed = conn
                .prepare_cached("UPDATE quota_slots SET expires_us = ?2 WHERE replica = ?1")?
                .execute(params![replica, expires])?;
            Ok(renewed as u64)
        })
        .await
    }

    async fn slots_held(&self, pool: &str) -> Result<u64, StoreError> {
        let pool = pool.to_owned();
        self.call(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT count(*) FROM quota_slots WHERE pool = ?1 AND expires_us > ?2",
                )?
                .query_row(params![pool, Utc::now().timestamp_micros()], |row| {
                    row.get(0)
                })?)
        })
        .await
    }

    async fn window_count(&self, name: &str, window: i64) -> Result<u64, StoreError> {
        let name = name.to_owned();
        self.call(move |conn| {
            Ok(conn
                .prepare_cached(
                    "INSERT INTO quota_windows (name, started, count) VALUES (?1, ?2, 1)
                     ON CONFLICT (name) DO UPDATE SET
                        count = CASE WHEN started = excluded.started THEN count + 1 ELSE 1 END,
                        started = excluded.started
                     RETURNING count",
                )?
                .query_row(params![name, window], |row| row.get(0))?)
        })
        .await
    }

    async fn stored_bytes(&self, namespace: &str) -> Result<u64, StoreError> {
        let namespace = namespace.to_owned();
        self.call(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT (SELECT coalesce(sum(length(value)), 0) FROM kv WHERE namespace = ?1)
                          + (SELECT coalesce(sum(length(payload)), 0) FROM bus_messages
                             WHERE namespace = ?1)
                          + (SELECT coalesce(sum(event_bytes), 0) FROM sessions WHERE owner = ?1)",
                )?
                .query_row(params![namespace], |row| row.get(0))?)
        })
        .await
    }
}
