//! Quota slots and window counters in PostgreSQL, by the database's clock.
//! A slot is taken under a transaction lock on its pool, so replicas count
//! and insert one after the other and never both take the last slot.

use std::time::Duration;

use async_trait::async_trait;

use super::{PostgresStore, unsigned};
use crate::protocol::SessionStatus;
use crate::store::{QuotaStore, StoreError};

fn micros(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX)
}

#[async_trait]
impl QuotaStore for PostgresStore {
    async fn slot_take(
        &self,
        pool: &str,
        holder: &str,
        replica: &str,
        limit: u64,
        ttl: Duration,
        sessions_of: Option<&str>,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 41))")
            .bind(pool)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM quota_slots WHERE pool = $1 AND expires_at <= now()")
            .bind(pool)
            .execute(&mut *tx)
            .await?;
        let renewed = sqlx::query(
            "UPDATE quota_slots SET expires_at = now() + $3 * interval '1 microsecond'
             WHERE pool = $1 AND holder = $2",
        )
        .bind(pool)
        .bind(holder)
        .bind(micros(ttl))
        .execute(&mut *tx)
        .await?;
        let granted = if renewed.rows_affected() > 0 {
            true
        } else {
            let mut held: i64 =
                sqlx::query_scalar("SELECT count(*) FROM quota_slots WHERE pool = $1")
                    .bind(pool)
                    .fetch_one(&mut *tx)
                    .await?;
            if let Some(sessions_of) = sessions_of {
                let open: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM sessions WHERE owner = $1 AND status <> $2 AND NOT ephemeral",
                )
                .bind(sessions_of)
                .bind(SessionStatus::Closed.as_str())
                .fetch_one(&mut *tx)
                .await?;
                held += open;
            }
            let room = unsigned("quota slots held", held)? < limit;
            if room {
                sqlx::query(
                    "INSERT INTO quota_slots (pool, holder, replica, expires_at)
                     VALUES ($1, $2, $3, now() + $4 * interval '1 microsecond')",
                )
                .bind(pool)
                .bind(holder)
                .bind(replica)
                .bind(micros(ttl))
                .execute(&mut *tx)
                .await?;
            }
            room
        };
        tx.commit().await?;
        Ok(granted)
    }

    async fn slot_release(&self, pool: &str, holder: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM quota_slots WHERE pool = $1 AND holder = $2")
            .bind(pool)
            .bind(holder)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn slots_renew(&self, replica: &str, ttl: Duration) -> Result<u64, StoreError> {
        let renewed = sqlx::query(
            "UPDATE quota_slots SET expires_at = now() + $2 * interval '1 microsecond'
             WHERE replica = $1",
        )
        .bind(replica)
        .bind(micros(ttl))
        .execute(&self.pool)
        .await?;
        Ok(renewed.rows_affected())
    }

    async fn slots_held(&self, pool: &str) -> Result<u64, StoreError> {
        let held: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM quota_slots WHERE pool = $1 AND expires_at > now()",
        )
        .bind(pool)
        .fetch_one(&self.pool)
        .await?;
        unsigned("quota slots held", held)
    }

    async fn window_count(&self, name: &str, window: i64) -> Result<u64, StoreError> {
        let count: i64 = sqlx::query_scalar(
            "INSERT INTO quota_windows (name, started, count) VALUES ($1, $2, 1)
             ON CONFLICT (name) DO UPDATE SET
                count = CASE WHEN quota_windows.started = excluded.started
                        THEN quota_windows.count + 1 ELSE 1 END,
                started = excluded.started
             RETURNING count",
        )
        .bind(name)
        .bind(window)
        .fetch_one(&self.pool)
        .await?;
        unsigned("quota window count", count)
    }

    async fn stored_bytes(&self, namespace: &str) -> Result<u64, StoreError> {
        let bytes: i64 = sqlx::query_scalar(
            "SELECT (SELECT coalesce(sum(octet_length(value)), 0) FROM kv WHERE namespace = $1)::BIGINT
                  + (SELECT coalesce(sum(octet_length(payload)), 0) FROM bus_messages
                     WHERE namespace = $1)::BIGINT
                  + (SELECT coalesce(sum(event_bytes), 0) FROM sessions WHERE owner = $1)::BIGINT",
        )
        .bind(namespace)
        .fetch_one(&self.pool)
        .await?;
        unsigned("stored bytes", bytes)
    }
}
