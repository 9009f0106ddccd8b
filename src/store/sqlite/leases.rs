//! Leases in SQLite: one row per name, taken over when expired. Times are
//! this host's clock, the only one a SQLite file has.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::{OptionalExtension, params};

use super::SqliteStore;
use crate::store::{Lease, LeaseStore, StoreError};

fn lease(name: String, holder: String, expires_us: i64, fence: u64) -> Result<Lease, StoreError> {
    let expires_at = DateTime::from_timestamp_micros(expires_us)
        .ok_or_else(|| StoreError::Corrupt(format!("lease {name}: expiry {expires_us}")))?;
    Ok(Lease {
        name,
        holder,
        expires_at,
        fence,
    })
}

#[async_trait]
impl LeaseStore for SqliteStore {
    async fn lease_acquire(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Lease, StoreError> {
        let (name, holder) = (name.to_owned(), holder.to_owned());
        let ttl_us = i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX);
        let (name, holder, expires_us, fence) = self
            .call(move |conn| {
                let now = Utc::now().timestamp_micros();
                // Free, expired or ours: take it (a new holder raises the
                // fence); otherwise the row stays as it is.
                conn.prepare_cached(
                    "INSERT INTO leases (name, holder, expires_us, fence) VALUES (?1, ?2, ?3, 1)
                     ON CONFLICT (name) DO UPDATE SET
                        fence = fence + (holder <> excluded.holder),
                        holder = excluded.holder,
                        expires_us = excluded.expires_us
                     WHERE leases.holder = excluded.holder OR leases.expires_us <= ?4",
                )?
                .execute(params![
                    name,
                    holder,
                    now.saturating_add(ttl_us),
                    now
                ])?;
                Ok(conn
                    .prepare_cached(
                        "SELECT name, holder, expires_us, fence FROM leases WHERE name = ?1",
                    )?
                    .query_row(params![name], |row| {
                        Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
                    })?)
            })
            .await?;
        lease(name, holder, expires_us, fence)
    }

    async fn lease_renew(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        let (name, holder) = (name.to_owned(), holder.to_owned());
        let ttl_us = i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX);
        let renewed = self
            .call(move |conn| {
                let expires_us = Utc::now().timestamp_micros().saturating_add(ttl_us);
                let fence = conn
                    .prepare_cached(
                        "UPDATE leases SET expires_us = ?3 WHERE name = ?1 AND holder = ?2
                         RETURNING fence",
                    )?
                    .query_row(params![name, holder, expires_us], |row| row.get(0))
                    .optional()?;
                Ok(fence.map(|fence| (name, holder, expires_us, fence)))
            })
            .await?;
        renewed
            .map(|(name, holder, expires_us, fence)| lease(name, holder, expires_us, fence))
            .transpose()
    }

    async fn lease_release(&self, name: &str, holder: &str) -> Result<bool, StoreError> {
        let (name, holder) = (name.to_owned(), holder.to_owned());
        self.call(move |conn| {
            // Removed, so that only leases whose holders died are left
            // to expire (and to be listed by `leases_expired`).
            let changed = conn
                .prepare_cached(super::events::RELEASE)?
                .execute(params![name, holder])?;
            Ok(changed > 0)
        })
        .await
    }

    async fn leases_expired(&self, prefix: &str) -> Result<Vec<Lease>, StoreError> {
        let prefix = prefix.to_owned();
        let rows = self
            .call(move |conn| {
                let mut statement = conn.prepare_cached(
                    "SELECT name, holder, expires_us, fence FROM leases
                     WHERE expires_us <= ?1 AND substr(name, 1, length(?2)) = ?2
                     ORDER BY expires_us",
                )?;
                let rows = statement
                    .query_map(params![Utc::now().timestamp_micros(), prefix], |row| {
                        Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
                    })?
                    .collect::<rusqlite::Result<Vec<(String, String, i64, u64)>>>()?;
                Ok(rows)
            })
            .await?;
        rows.into_iter()
            .map(|(name, holder, expires_us, fence)| lease(name, holder, expires_us, fence))
            .collect()
    }
}
